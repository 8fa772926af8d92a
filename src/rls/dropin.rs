//! dropin: `quotagate ratelimit`, a drop-in for envoyproxy/ratelimit's container, configured by
//! its environment variables where they mean something here (docs/ratelimit.md lists each one:
//! honoured, ignored and why, or refused). Everything else comes from quotagate's configuration.
//!
//! It serves the gRPC port (`GRPC_HOST`:`GRPC_PORT`, default 0.0.0.0:8081) and one HTTP port
//! (`HOST`:`PORT`, default 0.0.0.0:8080) with `/healthcheck` and `/metrics`; no gateway, no debug
//! port.

use std::net::{IpAddr, SocketAddr};

use crate::admin::AdminSettings;
use crate::config::{Config, ConfigError, LogFormat, StoreKind};
use quotagate_store::RedisMode;

/// envoyproxy/ratelimit's defaults (`src/settings/settings.go`).
const RUNTIME_ROOT: &str = "/srv/runtime_data/current";
const RUNTIME_APPDIRECTORY: &str = "config";

/// The variables envoyproxy/ratelimit reads that change nothing here, and why (logged once at
/// start-up when set).
pub const IGNORED: &[(&str, &str)] = &[
    (
        "RUNTIME_WATCH_ROOT",
        "the rules directory is always watched, whatever it says",
    ),
    ("RUNTIME_IGNOREDOTFILES", "hidden files are never read"),
    (
        "USE_STATSD",
        "metrics are on the HTTP port's /metrics (Prometheus)",
    ),
    ("DEBUG_HOST", "no debug port is opened"),
    ("DEBUG_PORT", "no debug port is opened"),
    (
        "REDIS_POOL_SIZE",
        "connections are one per worker (store.pool_size)",
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "window hashes expire with their window",
    ),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "no over-limit cache is needed: refusals cost one call",
    ),
    ("NEAR_LIMIT_RATIO", "near_limit is counted at 0.8"),
    (
        "CACHE_KEY_PREFIX",
        "keys have quotagate's layout; set QUOTAGATE_STORE_KEY_PREFIX",
    ),
    ("REDIS_PERSECOND", PER_SECOND),
    ("REDIS_PERSECOND_URL", PER_SECOND),
    ("REDIS_PERSECOND_SOCKET_TYPE", PER_SECOND),
    ("REDIS_PERSECOND_TYPE", PER_SECOND),
    ("REDIS_PERSECOND_AUTH", PER_SECOND),
    ("REDIS_PERSECOND_SENTINEL_AUTH", PER_SECOND),
    ("REDIS_PERSECOND_TLS", PER_SECOND),
    ("REDIS_PERSECOND_POOL_SIZE", PER_SECOND),
    ("REDIS_PERSECOND_TIMEOUT", PER_SECOND),
    ("REDIS_PERSECOND_PIPELINE_WINDOW", PER_SECOND),
    ("REDIS_PERSECOND_PIPELINE_LIMIT", PER_SECOND),
    ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", PER_SECOND),
    ("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", PER_SECOND),
    (
        "REDIS_TIMEOUT",
        "every Redis call is bounded by QUOTAGATE_STORE_TIMEOUT_MS (250 ms), then store.failure_policy answers",
    ),
    ("REDIS_PIPELINE_WINDOW", PIPELINE),
    ("REDIS_PIPELINE_LIMIT", PIPELINE),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", PIPELINE),
    ("REDIS_CLUSTER_PIPELINE_PARALLELISM", PIPELINE),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "/healthcheck says the process serves; while Redis is away store.failure_policy answers",
    ),
    ("REDIS_STARTUP_INITIAL_INTERVAL", STARTUP),
    ("REDIS_STARTUP_MAX_INTERVAL", STARTUP),
    ("REDIS_STARTUP_MAX_ELAPSED_TIME", STARTUP),
    (
        "GRPC_MAX_CONNECTION_AGE",
        "gRPC connections are kept until the client closes them",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "gRPC connections are kept until the client closes them",
    ),
    (
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "/healthcheck answers 200 once the ports are open, with rules or without (a missing rules directory stops the start)",
    ),
    (
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "it is for xDS, and CONFIG_TYPE is FILE",
    ),
    ("LIMIT_LIMIT_HEADER", HEADERS),
    ("LIMIT_REMAINING_HEADER", HEADERS),
    ("LIMIT_RESET_HEADER", HEADERS),
    ("DISABLE_STATS", STATS),
    ("EXTRA_TAGS", STATS),
    ("STATSD_HOST", STATS),
    ("STATSD_PORT", STATS),
    ("STATS_FLUSH_INTERVAL", STATS),
    ("USE_DOG_STATSD", STATS),
    ("USE_DOG_STATSD_MOGRIFIERS", STATS),
    ("USE_PROMETHEUS", STATS),
    ("PROMETHEUS_ADDR", STATS),
    ("PROMETHEUS_PATH", STATS),
    ("PROMETHEUS_MAPPER_YAML", STATS),
    ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", STATS),
    ("TRACING_ENABLED", TRACING),
    ("TRACING_EXPORTER_PROTOCOL", TRACING),
    ("TRACING_SAMPLING_RATE", TRACING),
    ("TRACING_SERVICE_NAME", TRACING),
    ("TRACING_SERVICE_NAMESPACE", TRACING),
    ("TRACING_SERVICE_INSTANCE_ID", TRACING),
];

const PER_SECOND: &str =
    "per-second limits are counted in REDIS_URL's store with the others; no second Redis is used";
const PIPELINE: &str = "Redis calls share one multiplexed connection per worker, sent as they come (no window, no pool to run out)";
const STARTUP: &str =
    "Redis is tried every 200 ms for 5 s at start, then the start stops naming REDIS_URL";
const HEADERS: &str = "the header fields are the gateway's (RateLimit-Policy, RateLimit, and RateLimit-Limit/-Remaining/-Reset)";
const STATS: &str = "metrics are Prometheus, on the HTTP port's /metrics";
const TRACING: &str = "the rate-limit service exports no traces";

/// The variables that ask for what this service cannot do, and why: set (to anything but
/// `false` for a flag), they stop the start, naming the variable. A setting that asks for
/// security is honoured or refused, never quietly dropped.
pub const REFUSED: &[(&str, &str)] = &[
    (
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "Redis servers' certificates are checked whole or not at all (QUOTAGATE_STORE_TLS_INSECURE_SKIP_VERIFY); the name alone cannot be skipped",
    ),
    (
        "REDIS_SENTINEL_AUTH",
        "sentinels are reached without a password here (REDIS_AUTH is the master's)",
    ),
    (
        "GRPC_UDS",
        "gRPC is served on GRPC_HOST:GRPC_PORT only, not on a unix socket",
    ),
    (
        "QUOTA_MODE",
        "quota mode is not implemented (a rule's quota_mode is refused too)",
    ),
];

/// The first refused variable set, as an error naming it: a flag (`QUOTA_MODE`, `..._VERIFICATION`)
/// when true, another when not empty.
fn refused(env: &impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    for (var, why) in REFUSED {
        let set = match env(var) {
            None => false,
            Some(_) if *var == "QUOTA_MODE" || var.ends_with("_VERIFICATION") => flag(var, env)?,
            Some(v) => !v.trim().is_empty(),
        };
        if set {
            return Err(ConfigError::option(*var, *why));
        }
    }
    Ok(())
}

/// `GRPC_SERVER_USE_TLS` and its files: TLS on the gRPC port (`rls.tls_*`), with client
/// certificates required when `GRPC_CLIENT_TLS_CACERT` names their CA, and valid for
/// `GRPC_CLIENT_TLS_SAN` when set. These without the flag are refused: envoyproxy/ratelimit then
/// serves cleartext, which a certificate set for the port does not ask for.
fn grpc_tls(config: &mut Config, env: &impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    let files = [
        "GRPC_SERVER_TLS_CERT",
        "GRPC_SERVER_TLS_KEY",
        "GRPC_CLIENT_TLS_CACERT",
        "GRPC_CLIENT_TLS_SAN",
    ];
    if !flag("GRPC_SERVER_USE_TLS", env)? {
        return match files.iter().find(|v| env(v).is_some()) {
            Some(var) => Err(ConfigError::option(
                *var,
                "set GRPC_SERVER_USE_TLS=true for TLS on the gRPC port (without it the port would answer in cleartext)",
            )),
            None => Ok(()),
        };
    }
    let need = |var: &str| {
        env(var).ok_or_else(|| ConfigError::option(var, "GRPC_SERVER_USE_TLS=true needs it"))
    };
    config.rls.tls_cert_file = need("GRPC_SERVER_TLS_CERT")?;
    config.rls.tls_key_file = need("GRPC_SERVER_TLS_KEY")?;
    config.rls.tls_client_ca_file = env("GRPC_CLIENT_TLS_CACERT").unwrap_or_default();
    config.rls.tls_client_san = env("GRPC_CLIENT_TLS_SAN").unwrap_or_default();
    Ok(())
}

fn port(var: &str, raw: &str) -> Result<u16, ConfigError> {
    raw.parse()
        .map_err(|_| ConfigError::option(var, format!("{raw:?} is not a port number")))
}

fn addr(
    host_var: &str,
    port_var: &str,
    env: &impl Fn(&str) -> Option<String>,
    default_port: u16,
) -> Result<SocketAddr, ConfigError> {
    let host = env(host_var).unwrap_or_else(|| "0.0.0.0".into());
    let ip: IpAddr = host
        .parse()
        .map_err(|_| ConfigError::option(host_var, format!("{host:?} is not an IP address")))?;
    let port = match env(port_var) {
        Some(p) => port(port_var, &p)?,
        None => default_port,
    };
    Ok(SocketAddr::new(ip, port))
}

fn flag(var: &str, env: &impl Fn(&str) -> Option<String>) -> Result<bool, ConfigError> {
    match env(var).map(|v| v.to_ascii_lowercase()) {
        None => Ok(false),
        Some(v) if ["true", "1", "t", "yes"].contains(&v.as_str()) => Ok(true),
        Some(v) if ["false", "0", "f", "no"].contains(&v.as_str()) => Ok(false),
        Some(v) => Err(ConfigError::option(
            var,
            format!("{v:?} is not true or false"),
        )),
    }
}

/// Percent-encodes a URL's user or password.
fn userinfo(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One Redis address as envoyproxy/ratelimit takes it (`host:port` over TCP, a path over a unix
/// socket), or a `redis://` URL as it is, as quotagate's URL.
fn redis_url(raw: &str, unix: bool, tls: bool, auth: Option<&str>) -> String {
    if raw.contains("://") {
        return raw.to_owned();
    }
    let creds = match auth {
        None => String::new(),
        Some(a) => match a.split_once(':') {
            Some((user, pass)) => format!("{}:{}@", userinfo(user), userinfo(pass)),
            None => format!(":{}@", userinfo(a)),
        },
    };
    match (unix, tls) {
        (true, _) => format!("redis+unix://{raw}"),
        (false, true) => format!("rediss://{creds}{raw}"),
        (false, false) => format!("redis://{creds}{raw}"),
    }
}

/// The configuration of the rate-limit service alone (quotagate's, with envoyproxy/ratelimit's
/// variables applied as one more layer), and its admin listener (`HOST`:`PORT`, `/metrics`).
pub fn configure(
    mut config: Config,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(Config, AdminSettings), ConfigError> {
    let env = |k: &str| env(k).filter(|v| !v.is_empty());
    refused(&env)?;
    let rules = [
        env("RUNTIME_ROOT").unwrap_or_else(|| RUNTIME_ROOT.into()),
        env("RUNTIME_SUBDIRECTORY").unwrap_or_default(),
        env("RUNTIME_APPDIRECTORY").unwrap_or_else(|| RUNTIME_APPDIRECTORY.into()),
    ]
    .iter()
    .filter(|p| !p.is_empty())
    .collect::<std::path::PathBuf>();
    config.rls.config = rules.to_string_lossy().into_owned();
    config.rls.listen = addr("GRPC_HOST", "GRPC_PORT", &env, 8081)?.to_string();
    grpc_tls(&mut config, &env)?;
    // Rules from an xDS server would be replaced, quietly, by whatever RUNTIME_ROOT holds.
    match env("CONFIG_TYPE").as_deref() {
        None | Some("FILE") => {}
        Some(other) => {
            return Err(ConfigError::option(
                "CONFIG_TYPE",
                format!(
                    "{other:?} is not supported: rules come from files (FILE, under RUNTIME_ROOT)"
                ),
            ));
        }
    }
    config.rls.response_headers = flag("LIMIT_RESPONSE_HEADERS_ENABLED", &env)?;
    config.rls.shadow_mode = flag("SHADOW_MODE", &env)?;
    config.rls.stop_counting_when_over_limit =
        flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", &env)?;
    config.rls.merge_domains = flag("MERGE_DOMAIN_CONFIG", &env)?;
    config.rls.response_dynamic_metadata = flag("RESPONSE_DYNAMIC_METADATA", &env)?;
    match env("BACKEND_TYPE").as_deref().unwrap_or("redis") {
        "redis" => {
            let unix = match env("REDIS_SOCKET_TYPE").as_deref().unwrap_or("unix") {
                "unix" => true,
                "tcp" => false,
                other => {
                    return Err(ConfigError::option(
                        "REDIS_SOCKET_TYPE",
                        format!("{other:?} is not tcp or unix"),
                    ));
                }
            };
            let tls = flag("REDIS_TLS", &env)?;
            // Read whatever REDIS_TLS says, as ratelimit does with REDIS_TLS=true: they matter
            // for a `rediss://` URL alone.
            for (var, file) in [
                ("REDIS_TLS_CLIENT_CERT", &mut config.store.tls_cert_file),
                ("REDIS_TLS_CLIENT_KEY", &mut config.store.tls_key_file),
                ("REDIS_TLS_CACERT", &mut config.store.tls_ca_file),
            ] {
                if let Some(path) = env(var) {
                    *file = path;
                }
            }
            let auth = env("REDIS_AUTH");
            let raw =
                env("REDIS_URL").unwrap_or_else(|| "/var/run/nutcracker/ratelimit.sock".into());
            let mut parts: Vec<&str> = raw.split(',').map(str::trim).collect();
            config.store.kind = StoreKind::Redis;
            config.store.redis_mode = match env("REDIS_TYPE").as_deref().unwrap_or("SINGLE") {
                t if t.eq_ignore_ascii_case("single") => RedisMode::Single,
                t if t.eq_ignore_ascii_case("cluster") => RedisMode::Cluster,
                t if t.eq_ignore_ascii_case("sentinel") => {
                    // envoyproxy/ratelimit's form: `master,sentinel1:port,sentinel2:port`.
                    config.store.sentinel_master = parts.remove(0).to_owned();
                    RedisMode::Sentinel
                }
                other => {
                    return Err(ConfigError::option(
                        "REDIS_TYPE",
                        format!("{other:?} is not SINGLE, SENTINEL or CLUSTER"),
                    ));
                }
            };
            config.store.redis_url = parts
                .iter()
                .map(|p| redis_url(p, unix, tls, auth.as_deref()))
                .collect::<Vec<_>>()
                .join(",");
        }
        "memory" => config.store.kind = StoreKind::Memory,
        other => {
            return Err(ConfigError::option(
                "BACKEND_TYPE",
                format!("{other:?} is not supported (redis or memory)"),
            ));
        }
    }
    if let Some(level) = env("LOG_LEVEL") {
        config.log.level = match level.to_ascii_lowercase().as_str() {
            "warning" => "warn".into(),
            "panic" | "fatal" => "error".into(),
            l => l.to_owned(),
        };
    }
    if let Some(format) = env("LOG_FORMAT") {
        config.log.format = match format.to_ascii_lowercase().as_str() {
            "json" => LogFormat::Json,
            "text" => LogFormat::Text,
            other => {
                return Err(ConfigError::option(
                    "LOG_FORMAT",
                    format!("{other:?} is not json or text"),
                ));
            }
        };
    }
    let http = addr("HOST", "PORT", &env, 8080)?;
    let admin = AdminSettings {
        listen: http,
        metrics_path: "/metrics".into(),
        secret: None,
    };
    Ok((config, admin))
}

/// The ignored variables that are set, each with why.
pub fn ignored(env: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, &'static str)> {
    IGNORED
        .iter()
        .filter(|(k, _)| env(k).is_some_and(|v| !v.is_empty()))
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::settings::{Serve, Settings};
    use quotagate_store::StoreSettings;

    /// The drop-in's settings, built as `quotagate ratelimit` builds them.
    fn dropin(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let (config, admin) = configure(Config::default(), env)?;
        Settings::new(config, env, Serve::ratelimit(admin))
    }

    fn redis(s: &Settings) -> (String, RedisMode, String) {
        assert!(matches!(s.store, StoreSettings::Redis { .. }));
        let c = &s.config.store;
        (c.redis_url.clone(), c.redis_mode, c.sentinel_master.clone())
    }

    #[test]
    fn envoyproxy_ratelimits_defaults() {
        let s = dropin(&[]).unwrap();
        let rls = s.rls.as_ref().unwrap();
        assert_eq!(
            rls.rules,
            std::path::Path::new("/srv/runtime_data/current/config")
        );
        assert_eq!(rls.listen.to_string(), "0.0.0.0:8081");
        assert_eq!(s.admin.as_ref().unwrap().listen.to_string(), "0.0.0.0:8080");
        assert!(s.gateway.is_none() && s.divvy.is_none());
        let (url, mode, _) = redis(&s);
        assert_eq!(
            (url.as_str(), mode),
            (
                "redis+unix:///var/run/nutcracker/ratelimit.sock",
                RedisMode::Single
            )
        );
    }

    #[test]
    fn its_variables_choose_rules_ports_store_and_logs() {
        let s = dropin(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("GRPC_PORT", "9081"),
            ("PORT", "9080"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis-a:6379,redis-b:6379"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_AUTH", "user:p@ss"),
            ("LOG_LEVEL", "WARNING"),
            ("LOG_FORMAT", "json"),
            ("SHADOW_MODE", "true"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
            ("MERGE_DOMAIN_CONFIG", "true"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
        ])
        .unwrap();
        let rls = s.rls.as_ref().unwrap();
        assert!(rls.policy.stop_counting_when_over_limit && rls.policy.merge_domains);
        assert!(rls.policy.response_dynamic_metadata);
        assert_eq!(rls.rules, std::path::Path::new("/data/ratelimit/config"));
        assert_eq!(rls.listen.to_string(), "0.0.0.0:9081");
        assert!(rls.policy.shadow_mode);
        assert_eq!(s.admin.as_ref().unwrap().listen.to_string(), "0.0.0.0:9080");
        let (url, mode, _) = redis(&s);
        assert_eq!(
            url,
            "redis://user:p%40ss@redis-a:6379,redis://user:p%40ss@redis-b:6379"
        );
        assert_eq!(mode, RedisMode::Cluster);
        assert_eq!(
            (s.log.level.as_str(), s.log.format),
            ("warn", LogFormat::Json)
        );

        let s = dropin(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ])
        .unwrap();
        assert_eq!(
            redis(&s),
            (
                "redis://s1:26379,redis://s2:26379".into(),
                RedisMode::Sentinel,
                "mymaster".into()
            )
        );
        let s = dropin(&[("BACKEND_TYPE", "memory")]).unwrap();
        assert!(matches!(s.store, StoreSettings::Memory { .. }));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        for (var, value) in [
            ("BACKEND_TYPE", "memcache"),
            ("REDIS_TYPE", "ring"),
            ("REDIS_SOCKET_TYPE", "udp"),
            ("GRPC_PORT", "x"),
            ("SHADOW_MODE", "maybe"),
            ("LOG_FORMAT", "xml"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ] {
            let e = dropin(&[(var, value)]).unwrap_err();
            assert_eq!(e.option_name(), Some(var), "{e}");
        }
        let set = |k: &str| (k == "USE_STATSD").then(|| "true".to_string());
        assert_eq!(ignored(set).len(), 1);
    }

    #[test]
    fn tls_on_the_grpc_port_is_asked_with_its_files_or_refused() {
        let conf = |vars: &[(&str, &str)]| {
            configure(Config::default(), |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            })
        };
        let c = conf(&[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/rls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/rls.key"),
            ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
            ("GRPC_CLIENT_TLS_SAN", "envoy.internal"),
        ])
        .unwrap()
        .0;
        assert_eq!(
            (
                c.rls.tls_cert_file.as_str(),
                c.rls.tls_key_file.as_str(),
                c.rls.tls_client_ca_file.as_str(),
                c.rls.tls_client_san.as_str()
            ),
            (
                "/certs/rls.crt",
                "/certs/rls.key",
                "/certs/ca.crt",
                "envoy.internal"
            )
        );
        for (vars, named) in [
            (
                &[("GRPC_SERVER_USE_TLS", "true")][..],
                "GRPC_SERVER_TLS_CERT",
            ),
            (
                &[
                    ("GRPC_SERVER_USE_TLS", "true"),
                    ("GRPC_SERVER_TLS_CERT", "/certs/rls.crt"),
                ],
                "GRPC_SERVER_TLS_KEY",
            ),
            // The files alone would be cleartext at envoyproxy/ratelimit.
            (
                &[("GRPC_SERVER_TLS_CERT", "/certs/rls.crt")],
                "GRPC_SERVER_TLS_CERT",
            ),
            (
                &[("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt")],
                "GRPC_CLIENT_TLS_CACERT",
            ),
            (&[("GRPC_SERVER_USE_TLS", "maybe")], "GRPC_SERVER_USE_TLS"),
            (&[("GRPC_CLIENT_TLS_SAN", "envoy")], "GRPC_CLIENT_TLS_SAN"),
            (&[("REDIS_SENTINEL_AUTH", "pw")], "REDIS_SENTINEL_AUTH"),
            (&[("GRPC_UDS", "/run/rl.sock")], "GRPC_UDS"),
            (&[("QUOTA_MODE", "true")], "QUOTA_MODE"),
            (
                &[("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true")],
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            ),
        ] {
            let e = conf(vars).unwrap_err();
            assert_eq!(e.option_name(), Some(named), "{e}");
        }
        for vars in [
            &[("GRPC_SERVER_USE_TLS", "false")][..],
            &[("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false")],
            &[("QUOTA_MODE", "false")],
            &[("GRPC_UDS", "")],
            &[("GRPC_SERVER_TLS_CERT", "")],
        ] {
            let c = conf(vars).unwrap().0;
            assert!(c.rls.tls_cert_file.is_empty());
        }
    }

    /// docs/ratelimit.md's table names every variable envoyproxy/ratelimit reads, and every one
    /// this module ignores or refuses.
    #[test]
    fn the_docs_name_every_variable_ratelimit_reads() {
        let docs = include_str!("../../docs/ratelimit.md");
        let table: Vec<&str> = docs.lines().filter(|l| l.starts_with("| `")).collect();
        let named = |var: &str| {
            table.iter().any(|row| {
                row.split(" | ")
                    .next()
                    .unwrap()
                    .contains(&format!("`{var}`"))
            })
        };
        let theirs = include_str!("../../tests/ratelimit/settings-variables.txt");
        let ours = IGNORED.iter().chain(REFUSED).map(|(v, _)| *v);
        let vars = theirs.lines().filter(|l| !l.starts_with('#')).chain(ours);
        let missing: Vec<&str> = vars.filter(|v| !named(v)).collect();
        assert!(
            missing.is_empty(),
            "not in docs/ratelimit.md's table: {missing:?}"
        );
    }

    #[test]
    fn stop_counting_needs_sliding_windows() {
        let env = |k: &str| (k == "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT").then(|| "1".into());
        let (mut config, _) = configure(Config::default(), env).unwrap();
        assert!(config.rls.stop_counting_when_over_limit);
        config.rls.window = crate::config::WindowKind::Fixed;
        let e = crate::rls::RlsSettings::try_from(&config.rls).unwrap_err();
        assert_eq!(e.option_name(), Some("rls.stop_counting_when_over_limit"));
    }

    #[test]
    fn redis_tls_files_are_the_stores_and_checked_at_start() {
        let vars = [
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.internal:6380"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", "/certs/client.crt"),
            ("REDIS_TLS_CLIENT_KEY", "/certs/client.key"),
            ("REDIS_TLS_CACERT", "/certs/ca.crt"),
        ];
        let env = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        let (config, _) = configure(Config::default(), env).unwrap();
        assert_eq!(config.store.redis_url, "rediss://redis.internal:6380");
        assert_eq!(config.store.tls_cert_file, "/certs/client.crt");
        assert_eq!(config.store.tls_key_file, "/certs/client.key");
        assert_eq!(config.store.tls_ca_file, "/certs/ca.crt");
        // Files that cannot be read stop the start.
        let e = dropin(&vars).unwrap_err();
        assert!(
            e.option_name().is_some_and(|o| o.starts_with("store.tls_")),
            "{e}"
        );
    }
}
