//! config: every option, its default, and where it can be set.
//!
//! Sources, later ones winning: built-in defaults, a TOML file (`--config`), `QUOTAGATE_<SECTION>_<KEY>`
//! environment variables (e.g. `QUOTAGATE_UPSTREAM_URL`), and command-line flags (`--set
//! section.key=value`, plus a few named shortcuts). Every option is listed with its default in
//! `docs/configuration.md`; the file is parsed strictly, so a misspelt key is an error.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::path::EscapedSlashes;
use crate::store::{FailurePolicy, TimeSource};

/// A configuration problem, said in one line that names the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub catalog: CatalogConfig,
    pub limits: LimitsConfig,
    pub store: StoreConfig,
    pub divvy: DivvyConfig,
    pub admin: AdminConfig,
    pub log: LogConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Serve `/metrics`, `/healthz` and `/readyz`. Default: `true`.
    pub enabled: bool,
    /// Address of the admin listener. Default: `127.0.0.1:8081` (loopback only).
    pub listen: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            enabled: true,
            listen: "127.0.0.1:8081".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DivvyConfig {
    /// Divvy rule file (`.ini` or `.json`); the Divvy port runs when one is set. Default: none.
    pub rules: String,
    /// Address of the Divvy port. Default: `127.0.0.1:8321`.
    pub listen: String,
    /// Longest request line. Default: 1048576 bytes (1 MiB).
    pub max_line_bytes: usize,
    /// Open connections at most. Default: 10000.
    pub max_connections: usize,
    /// Requests per connection waiting for their reply, at most. Default: 1024.
    pub max_in_flight: usize,
}

impl Default for DivvyConfig {
    fn default() -> Self {
        DivvyConfig {
            rules: String::new(),
            listen: "127.0.0.1:8321".into(),
            max_line_bytes: 1024 * 1024,
            max_connections: 10_000,
            max_in_flight: 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the proxy listener. Default: `127.0.0.1:8080`.
    pub listen: String,
    /// On SIGTERM/SIGINT, how long in-flight requests may take to finish. Default: 10000 ms.
    pub drain_timeout_ms: u64,
    /// Time a client has to send a request's headers. Default: 10000 ms.
    pub header_read_timeout_ms: u64,
    /// Largest request header section. Default: 65536 bytes (at least 8192).
    pub max_header_bytes: usize,
    /// Largest request body; larger ones get 413. Default: 10485760 bytes (10 MiB).
    pub max_body_bytes: u64,
    /// Open client connections at most; more wait in the accept queue. Default: 10000.
    pub max_connections: usize,
    /// Threads that serve proxy and Divvy connections, each with its own event loop, upstream pool
    /// and Redis connection. Default: 0, one per core.
    pub workers: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".into(),
            drain_timeout_ms: 10_000,
            header_read_timeout_ms: 10_000,
            max_header_bytes: 64 * 1024,
            max_body_bytes: 10 * 1024 * 1024,
            max_connections: 10_000,
            workers: 0,
        }
    }
}

impl ServerConfig {
    /// The number of proxy workers: `workers`, or one per core when 0.
    pub fn worker_count(&self) -> usize {
        match self.workers {
            0 => crate::workers::default_count(),
            n => n,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Base URL of the upstream API (`http://host:port[/base/path]`). Default: `http://127.0.0.1:9000`.
    pub url: String,
    /// Connecting to the upstream; then 502. Default: 2000 ms.
    pub connect_timeout_ms: u64,
    /// Waiting for the upstream's response headers; then 504. Default: 30000 ms.
    pub response_timeout_ms: u64,
    /// Idle upstream connections are closed after this. Default: 30000 ms.
    pub pool_idle_timeout_ms: u64,
    /// Idle upstream connections kept open. Default: 256.
    pub pool_max_idle: usize,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            url: "http://127.0.0.1:9000".into(),
            connect_timeout_ms: 2_000,
            response_timeout_ms: 30_000,
            pool_idle_timeout_ms: 30_000,
            pool_max_idle: 256,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CatalogConfig {
    /// Catalog file loaded at start-up (DynLimits JSON), used until the catalog server answers.
    /// Default: none.
    pub file: String,
    /// Base URL of the catalog server to poll. Default: none (no polling).
    pub server_url: String,
    /// Header carrying `server_secret` to the catalog server. Default: `X-Api-Key` (DynLimits).
    pub server_auth_header: String,
    /// Secret sent to (and, for `quotagate catalog-server`, required by) the catalog server.
    /// Default: none.
    pub server_secret: String,
    /// Time between polls. Default: 10000 ms (DynLimits).
    pub poll_interval_ms: u64,
    /// Each wait varies by up to this share of the interval, so instances do not poll in step.
    /// Default: 10 (%), at most 50.
    pub poll_jitter_percent: u64,
    /// Connecting to the catalog server. Default: 2000 ms.
    pub connect_timeout_ms: u64,
    /// One request to the catalog server, body included. Default: 10000 ms.
    pub request_timeout_ms: u64,
    /// Longest wait between polls while the server fails (the interval doubles per failure).
    /// Default: 60000 ms.
    pub backoff_max_ms: u64,
    /// Request header that forces a catalog fetch when it carries `refresh_secret`.
    /// Default: `X-Quotagate-Refresh`.
    pub refresh_header: String,
    /// Secret of the refresh header. Default: none, which turns the feature off.
    pub refresh_secret: String,
    /// Forced fetches start at least this long after the previous fetch. Default: 1000 ms.
    pub refresh_min_interval_ms: u64,
    /// How long a request with a valid refresh header waits for the fetch. Default: 2000 ms.
    pub refresh_wait_ms: u64,
    /// Redis channel on which instances announce new catalog versions (with `store.kind = "redis"`).
    /// Default: `quotagate:catalog`.
    pub announce_channel: String,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        CatalogConfig {
            file: String::new(),
            server_url: String::new(),
            server_auth_header: "X-Api-Key".into(),
            server_secret: String::new(),
            poll_interval_ms: 10_000,
            poll_jitter_percent: 10,
            connect_timeout_ms: 2_000,
            request_timeout_ms: 10_000,
            backoff_max_ms: 60_000,
            refresh_header: "X-Quotagate-Refresh".into(),
            refresh_secret: String::new(),
            refresh_min_interval_ms: 1_000,
            refresh_wait_ms: 2_000,
            announce_channel: "quotagate:catalog".into(),
        }
    }
}

/// What to do with a request the catalog does not cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Uncovered {
    /// Answer with an error (404 for unknown endpoints, 403 for keys without a limit).
    Reject,
    /// Forward it without limiting or counting.
    Forward,
}

/// Which rate-limit header fields to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeaderSet {
    /// `RateLimit-Policy`/`RateLimit` and `RateLimit-Limit`/`-Remaining`/`-Reset`.
    Both,
    /// The current IETF draft fields only: `RateLimit-Policy` and `RateLimit`.
    Ietf,
    /// The DynLimits-compatible `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` only.
    Legacy,
    /// None (`Retry-After` is still sent on 429).
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// `false` turns quotagate into a plain proxy: no key, route or limit checks. Default: `true`.
    pub enabled: bool,
    /// Header carrying the API key. Default: `X-Api-Key`.
    pub api_key_header: String,
    /// Requests to endpoints not in the catalog: `reject` (404) or `forward` unlimited. Default: `reject`.
    pub unknown_endpoint: Uncovered,
    /// Keys with no limit for the endpoint, unknown keys included: `reject` (403) or `forward`
    /// unlimited. Default: `reject`.
    pub no_limit: Uncovered,
    /// Rate-limit header fields sent: `both`, `ietf`, `legacy` or `none`. Default: `both`.
    pub headers: HeaderSet,
    /// `%2F`, `%5C` and `\` in paths: `reject` (400) or `keep` as data. Default: `reject`.
    pub escaped_slashes: EscapedSlashes,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            enabled: true,
            api_key_header: "X-Api-Key".into(),
            unknown_endpoint: Uncovered::Reject,
            no_limit: Uncovered::Reject,
            headers: HeaderSet::Both,
            escaped_slashes: EscapedSlashes::Reject,
        }
    }
}

/// Where counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Memory,
    Redis,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `memory` (embedded, one instance) or `redis` (shared). Default: `memory`.
    pub kind: StoreKind,
    /// Redis URL, `redis://host:port/db` or `redis+unix:///path`. Default: `redis://127.0.0.1:6379`.
    pub redis_url: String,
    /// Bound on every Redis call, connecting included. Default: 250 ms.
    pub timeout_ms: u64,
    /// When Redis fails: `local` (limits enforced per instance in memory), `open` (unlimited) or
    /// `closed` (503). Default: `local`.
    pub failure_policy: FailurePolicy,
    /// How often a failed Redis is pinged to detect recovery. Default: 1000 ms.
    pub probe_interval_ms: u64,
    /// Redis connections at most. Default: 16.
    pub pool_size: usize,
    /// Prefix of every Redis key. Default: `quotagate`.
    pub key_prefix: String,
    /// Whose clock places requests in seconds: `redis` (one clock for all instances) or `local`.
    /// Default: `redis`.
    pub time_source: TimeSource,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Memory,
            redis_url: "redis://127.0.0.1:6379".into(),
            timeout_ms: 250,
            failure_policy: FailurePolicy::Local,
            probe_interval_ms: 1_000,
            pool_size: 16,
            key_prefix: crate::store::keys::DEFAULT_PREFIX.into(),
            time_source: TimeSource::Redis,
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`. Default: `text`.
    pub format: LogFormat,
    /// Level filter in `RUST_LOG` syntax; `RUST_LOG` itself wins when set. Default: `info`.
    pub level: String,
    /// One line per request (target `quotagate::access`). Default: `false`.
    pub access: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".into(),
            access: false,
        }
    }
}

/// Largest configuration file accepted. Default: 1 MiB.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// Reads a text file of at most `max` bytes.
pub fn read_capped(path: &Path, max: u64) -> std::io::Result<String> {
    let len = std::fs::metadata(path)?.len();
    if len > max {
        return Err(std::io::Error::other(format!(
            "it is {len} bytes; at most {max} are accepted"
        )));
    }
    std::fs::read_to_string(path)
}

/// Prefix of the environment variables that override options.
pub const ENV_PREFIX: &str = "QUOTAGATE_";

/// A duration from an option's milliseconds.
pub(crate) fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl Config {
    /// Loads the configuration: defaults, then `file`, then the environment, then `overrides`
    /// (`section.key=value` strings, as given to `--set`).
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        overrides: &[String],
    ) -> Result<Config, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = read_capped(path, MAX_CONFIG_BYTES).map_err(|e| {
                    ConfigError(format!("cannot read config file {}: {e}", path.display()))
                })?;
                // Parse into the typed struct first: that gives line and column for mistakes.
                let typed: Config = toml::from_str(&text)
                    .map_err(|e| ConfigError(format!("config file {}: {e}", path.display())))?;
                toml::Table::try_from(typed).map_err(|e| ConfigError(e.to_string()))?
            }
            None => {
                toml::Table::try_from(Config::default()).map_err(|e| ConfigError(e.to_string()))?
            }
        };
        let known =
            toml::Table::try_from(Config::default()).map_err(|e| ConfigError(e.to_string()))?;
        for (section, keys) in &known {
            let Some(keys) = keys.as_table() else {
                continue;
            };
            for (key, default) in keys {
                let var = format!(
                    "{ENV_PREFIX}{}_{}",
                    section.to_uppercase(),
                    key.to_uppercase()
                );
                if let Some(raw) = env(&var) {
                    let value =
                        coerce(default, &raw).map_err(|e| ConfigError(format!("{var}: {e}")))?;
                    set(&mut table, section, key, value);
                }
            }
        }
        for o in overrides {
            let (name, raw) = o
                .split_once('=')
                .ok_or_else(|| ConfigError(format!("--set {o:?}: expected section.key=value")))?;
            let (section, key) = name
                .split_once('.')
                .ok_or_else(|| ConfigError(format!("--set {o:?}: expected section.key=value")))?;
            let default = known
                .get(section)
                .and_then(|s| s.get(key))
                .ok_or_else(|| ConfigError(format!("--set {o:?}: there is no option {name}")))?;
            let value =
                coerce(default, raw).map_err(|e| ConfigError(format!("--set {name}: {e}")))?;
            set(&mut table, section, key, value);
        }
        let config: Config =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    ConfigError(format!("invalid configuration: {}", e.message()))
                })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError(m));
        if self.server.listen.parse::<SocketAddr>().is_err() {
            return err(format!(
                "server.listen: {:?} is not an address like 127.0.0.1:8080",
                self.server.listen
            ));
        }
        if self.admin.listen.parse::<SocketAddr>().is_err() {
            return err(format!(
                "admin.listen: {:?} is not an address like 127.0.0.1:8081",
                self.admin.listen
            ));
        }
        if self.divvy.listen.parse::<SocketAddr>().is_err() {
            return err(format!(
                "divvy.listen: {:?} is not an address like 127.0.0.1:8321",
                self.divvy.listen
            ));
        }
        if self.divvy.max_line_bytes < 1024
            || self.divvy.max_connections == 0
            || self.divvy.max_in_flight == 0
        {
            return err("divvy.max_line_bytes must be at least 1024, and divvy.max_connections and divvy.max_in_flight at least 1".into());
        }
        if self.server.max_header_bytes < 8192 {
            return err("server.max_header_bytes must be at least 8192".into());
        }
        if self.server.workers > 1024 {
            return err("server.workers must be at most 1024 (0: one per core)".into());
        }
        if self.server.max_connections == 0 {
            return err("server.max_connections must be at least 1".into());
        }
        UpstreamTarget::parse(&self.upstream.url)?;
        for (name, value) in [
            ("limits.api_key_header", &self.limits.api_key_header),
            (
                "catalog.server_auth_header",
                &self.catalog.server_auth_header,
            ),
            ("catalog.refresh_header", &self.catalog.refresh_header),
        ] {
            if http::HeaderName::from_bytes(value.as_bytes()).is_err() {
                return err(format!("{name}: {value:?} is not a header name"));
            }
        }
        if !self.catalog.server_url.is_empty()
            && reqwest::Url::parse(&self.catalog.server_url).is_err()
        {
            return err(format!(
                "catalog.server_url: {:?} is not a URL",
                self.catalog.server_url
            ));
        }
        crate::store::keys::check_prefix(&self.store.key_prefix)
            .map_err(|m| ConfigError(format!("store.key_prefix: {m}")))?;
        for (name, v) in [
            ("server.drain_timeout_ms", self.server.drain_timeout_ms),
            (
                "server.header_read_timeout_ms",
                self.server.header_read_timeout_ms,
            ),
            (
                "upstream.connect_timeout_ms",
                self.upstream.connect_timeout_ms,
            ),
            (
                "upstream.response_timeout_ms",
                self.upstream.response_timeout_ms,
            ),
            ("store.timeout_ms", self.store.timeout_ms),
            ("store.probe_interval_ms", self.store.probe_interval_ms),
            ("catalog.poll_interval_ms", self.catalog.poll_interval_ms),
            (
                "catalog.connect_timeout_ms",
                self.catalog.connect_timeout_ms,
            ),
            (
                "catalog.request_timeout_ms",
                self.catalog.request_timeout_ms,
            ),
            ("catalog.backoff_max_ms", self.catalog.backoff_max_ms),
            ("catalog.refresh_wait_ms", self.catalog.refresh_wait_ms),
        ] {
            if v == 0 {
                return err(format!("{name} must be above 0"));
            }
        }
        Ok(())
    }

    /// The configuration as one line of JSON, secrets and Redis passwords replaced by `***`.
    pub fn redacted_json(&self) -> String {
        let mut c = self.clone();
        for secret in [&mut c.catalog.server_secret, &mut c.catalog.refresh_secret] {
            if !secret.is_empty() {
                *secret = "***".into();
            }
        }
        // redis://user:password@host -> redis://user:***@host
        if let Some((scheme, rest)) = c.store.redis_url.split_once("://")
            && let Some((auth, host)) = rest.rsplit_once('@')
        {
            let user = auth.split_once(':').map_or("", |(u, _)| u);
            c.store.redis_url = format!("{scheme}://{user}:***@{host}");
        }
        serde_json::to_string(&c).unwrap_or_default()
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.server.listen.parse().expect("validated")
    }

    pub fn drain_timeout(&self) -> Duration {
        ms(self.server.drain_timeout_ms)
    }

    pub fn header_read_timeout(&self) -> Duration {
        ms(self.server.header_read_timeout_ms)
    }
}

impl UpstreamConfig {
    pub fn connect_timeout(&self) -> Duration {
        ms(self.connect_timeout_ms)
    }
    pub fn response_timeout(&self) -> Duration {
        ms(self.response_timeout_ms)
    }
    pub fn pool_idle_timeout(&self) -> Duration {
        ms(self.pool_idle_timeout_ms)
    }
}

impl StoreConfig {
    pub fn timeout(&self) -> Duration {
        ms(self.timeout_ms)
    }
    pub fn probe_interval(&self) -> Duration {
        ms(self.probe_interval_ms)
    }
}

/// The parsed `upstream.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTarget {
    /// `host:port`.
    pub authority: http::uri::Authority,
    /// Prepended to every forwarded path; empty or starting with `/`, never ending with `/`.
    pub base_path: String,
}

impl UpstreamTarget {
    pub fn parse(url: &str) -> Result<UpstreamTarget, ConfigError> {
        let bad = |why: &str| ConfigError(format!("upstream.url: {url:?} {why}"));
        let uri: http::Uri = url.parse().map_err(|_| bad("is not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "must start with http:// (TLS to the upstream is not supported yet)",
            ));
        }
        let authority = uri.authority().cloned().ok_or_else(|| bad("has no host"))?;
        if uri.query().is_some() {
            return Err(bad("must not have a query"));
        }
        Ok(UpstreamTarget {
            authority,
            base_path: uri.path().trim_end_matches('/').to_owned(),
        })
    }
}

/// Turns a raw override into a value of the same type as the option's default.
fn coerce(default: &toml::Value, raw: &str) -> Result<toml::Value, String> {
    Ok(match default {
        toml::Value::String(_) => toml::Value::String(raw.to_owned()),
        toml::Value::Integer(_) => toml::Value::Integer(
            raw.trim()
                .parse()
                .map_err(|_| format!("{raw:?} is not a whole number"))?,
        ),
        toml::Value::Boolean(_) => toml::Value::Boolean(
            raw.trim()
                .parse()
                .map_err(|_| format!("{raw:?} is not true or false"))?,
        ),
        other => {
            return Err(format!(
                "cannot be set from text (it is a {})",
                other.type_str()
            ));
        }
    })
}

fn set(table: &mut toml::Table, section: &str, key: &str, value: toml::Value) {
    let entry = table
        .entry(section.to_owned())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let Some(t) = entry.as_table_mut() {
        t.insert(key.to_owned(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn load(
        toml_text: Option<&str>,
        env: &[(&str, &str)],
        sets: &[&str],
    ) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.toml");
        if let Some(t) = toml_text {
            std::fs::write(&path, t).unwrap();
        }
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Config::load(
            toml_text.map(|_| path.as_path()),
            |k| env.get(k).cloned(),
            &sets,
        )
    }

    #[test]
    fn defaults_then_file_then_env_then_flags() {
        assert_eq!(load(None, &[], &[]).unwrap(), Config::default());
        let file = "[upstream]\nurl = \"http://10.0.0.1:81\"\n[store]\ntimeout_ms = 100\n";
        let c = load(Some(file), &[], &[]).unwrap();
        assert_eq!(
            (c.upstream.url.as_str(), c.store.timeout_ms),
            ("http://10.0.0.1:81", 100)
        );
        let c = load(
            Some(file),
            &[
                ("QUOTAGATE_STORE_TIMEOUT_MS", "50"),
                ("QUOTAGATE_STORE_KIND", "redis"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!((c.store.timeout_ms, c.store.kind), (50, StoreKind::Redis));
        let c = load(
            Some(file),
            &[("QUOTAGATE_STORE_TIMEOUT_MS", "50")],
            &["store.timeout_ms=7"],
        )
        .unwrap();
        assert_eq!(c.store.timeout_ms, 7);
        let c = load(None, &[("QUOTAGATE_LIMITS_ENABLED", "false")], &[]).unwrap();
        assert!(!c.limits.enabled);
    }

    #[test]
    fn mistakes_name_the_option() {
        let e = load(Some("[server]\nlisten_addr = \"x\"\n"), &[], &[]).unwrap_err();
        assert!(
            e.0.contains("unknown field `listen_addr`") && e.0.contains("line 2"),
            "{e}"
        );
        let e = load(None, &[("QUOTAGATE_STORE_TIMEOUT_MS", "soon")], &[]).unwrap_err();
        assert_eq!(
            e.0,
            "QUOTAGATE_STORE_TIMEOUT_MS: \"soon\" is not a whole number"
        );
        let e = load(None, &[], &["store.kind=postgres"]).unwrap_err();
        assert!(e.0.contains("postgres"), "{e}");
        let e = load(None, &[], &["store.nope=1"]).unwrap_err();
        assert_eq!(e.0, "--set \"store.nope=1\": there is no option store.nope");
        let e = load(None, &[], &["server.listen=localhost"]).unwrap_err();
        assert!(e.0.starts_with("server.listen:"), "{e}");
        let e = load(None, &[], &["upstream.url=https://x"]).unwrap_err();
        assert!(e.0.contains("http://"), "{e}");
        let e = load(None, &[], &["store.timeout_ms=0"]).unwrap_err();
        assert_eq!(e.0, "store.timeout_ms must be above 0");
    }

    #[test]
    fn upstream_base_path() {
        let t = UpstreamTarget::parse("http://api:9000/v1/").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.base_path.as_str()),
            ("api:9000", "/v1")
        );
        assert_eq!(
            UpstreamTarget::parse("http://api:9000").unwrap().base_path,
            ""
        );
    }
}

#[cfg(test)]
mod docs_tests {
    use super::*;

    /// docs/configuration.md lists every option with its environment variable.
    #[test]
    fn every_option_is_documented() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/configuration.md"
        ))
        .unwrap();
        let known = toml::Table::try_from(Config::default()).unwrap();
        for (section, keys) in &known {
            for key in keys.as_table().unwrap().keys() {
                let var = format!(
                    "{ENV_PREFIX}{}_{}",
                    section.to_uppercase(),
                    key.to_uppercase()
                );
                assert!(
                    doc.contains(&format!("| `{section}.{key}` | `{var}` |")),
                    "{section}.{key} missing from docs/configuration.md"
                );
            }
        }
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;

    #[test]
    fn the_demo_configs_load_natively_and_with_the_compose_overrides() {
        let compose = [
            ("QUOTAGATE_SERVER_LISTEN", "0.0.0.0:8080"),
            ("QUOTAGATE_ADMIN_LISTEN", "0.0.0.0:8081"),
            ("QUOTAGATE_DIVVY_LISTEN", "0.0.0.0:8321"),
            ("QUOTAGATE_UPSTREAM_URL", "http://upstream:9000"),
            ("QUOTAGATE_CATALOG_SERVER_URL", "http://catalog:9100"),
            ("QUOTAGATE_STORE_REDIS_URL", "redis://redis:6379"),
        ];
        for name in ["gateway-a.toml", "gateway-b.toml", "catalog-server.toml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/demo")
                .join(name);
            Config::load(Some(&path), |_| None, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
            let c = Config::load(
                Some(&path),
                |k| {
                    compose
                        .iter()
                        .find(|(v, _)| *v == k)
                        .map(|(_, x)| x.to_string())
                },
                &[],
            )
            .unwrap();
            assert_eq!(c.upstream.url, "http://upstream:9000", "{name}");
        }
    }

    #[test]
    fn the_example_file_is_exactly_the_defaults() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/quotagate.toml"
        ));
        assert_eq!(
            Config::load(Some(path), |_| None, &[]).unwrap(),
            Config::default()
        );
    }
}
