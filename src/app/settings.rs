//! settings: the configuration turned into typed, checked values, once, before anything starts.
//!
//! Each module owns its settings type and checks its values in its `TryFrom` (the gateway's
//! [`GatewaySettings`], the store's [`StoreSettings`], the Divvy port's [`DivvySettings`], the
//! admin listener's [`AdminSettings`]); this file only gathers them, for the parts a command runs
//! ([`Serve`]). Nothing after this point parses a configuration string again or changes a value.

use std::path::Path;

use crate::admin::AdminSettings;
use crate::config::{Config, ConfigError, LogConfig, StoreConfig, StoreKind, positive_ms};
use crate::divvy::DivvySettings;
use crate::gateway::GatewaySettings;
use crate::rls::RlsSettings;
use quotagate_store::{RedisOptions, RedisTarget, StoreSettings};

/// Workers at most (`server.workers`).
pub const MAX_WORKERS: usize = 1024;

/// Everything quotagate runs, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The configuration as written, for the start-up log line (see [`Config::redacted_json`]).
    pub config: Config,
    /// Threads serving the proxy and the Divvy port (`server.workers`, 0: one per core).
    pub workers: usize,
    pub store: StoreSettings,
    /// The HTTP gateway; `None` for the drop-ins and the tools.
    pub gateway: Option<GatewaySettings>,
    /// The Divvy port, when a rule file is configured.
    pub divvy: Option<DivvySettings>,
    /// The Envoy rate-limit service, when rule files are configured.
    pub rls: Option<RlsSettings>,
    /// The admin listener, unless turned off.
    pub admin: Option<AdminSettings>,
    pub log: LogConfig,
}

/// The parts a command runs: each is built (and its options checked) only when run.
#[derive(Debug, Clone)]
pub struct Serve {
    /// The HTTP gateway.
    pub gateway: bool,
    /// The Divvy port, when `divvy.rules` names a rule file.
    pub divvy: bool,
    /// The Envoy rate-limit service, when `rls.config` names rule files.
    pub rls: bool,
    pub admin: AdminChoice,
}

/// Where the admin listener's settings come from.
#[derive(Debug, Clone)]
pub enum AdminChoice {
    /// `[admin]` (`admin.enabled` turns it off).
    Configured,
    /// A drop-in's own, from its environment variables (`None`: no admin listener).
    Given(Option<AdminSettings>),
}

impl Serve {
    /// `quotagate run`: the gateway, and every other part the configuration turns on.
    pub fn all() -> Serve {
        Serve {
            gateway: true,
            divvy: true,
            rls: true,
            admin: AdminChoice::Configured,
        }
    }

    /// `quotagate divvy`: the Divvy port, and the metrics page its variables ask for.
    pub fn divvy(admin: Option<AdminSettings>) -> Serve {
        Serve {
            divvy: true,
            admin: AdminChoice::Given(admin),
            ..Serve::nothing()
        }
    }

    /// `quotagate ratelimit`: the rate-limit service and its admin listener.
    pub fn ratelimit(admin: AdminSettings) -> Serve {
        Serve {
            rls: true,
            admin: AdminChoice::Given(Some(admin)),
            ..Serve::nothing()
        }
    }

    /// The store and the log only (the catalog server, the example upstream).
    pub fn nothing() -> Serve {
        Serve {
            gateway: false,
            divvy: false,
            rls: false,
            admin: AdminChoice::Given(None),
        }
    }
}

impl Settings {
    /// Loads the configuration's layers (see [`Config::load`]) and checks what `serve` runs.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        overrides: &[String],
        serve: Serve,
    ) -> Result<Settings, ConfigError> {
        let config = Config::load(file, &env, overrides)?;
        Settings::new(config, env, serve)
    }

    /// Checks what `serve` runs of `config`; `env` gives the variables Divvy's statsd support
    /// reads (`STATSD_*`).
    pub fn new(
        config: Config,
        env: impl Fn(&str) -> Option<String>,
        serve: Serve,
    ) -> Result<Settings, ConfigError> {
        let workers = match config.server.workers {
            0 => crate::server::workers::default_count(),
            n if n > MAX_WORKERS => {
                return Err(ConfigError::option(
                    "server.workers",
                    format!("must be at most {MAX_WORKERS} (0: one per core)"),
                ));
            }
            n => n,
        };
        let store = store_settings(&config.store, workers)?;
        let divvy = match serve.divvy && !config.divvy.rules.is_empty() {
            true => Some(DivvySettings::new(&config.divvy, &env)?),
            false => None,
        };
        let rls = match serve.rls && !config.rls.config.is_empty() {
            true => Some(RlsSettings::try_from(&config.rls)?),
            false => None,
        };
        let gateway = match serve.gateway {
            true => Some(GatewaySettings::try_from(&config)?),
            false => None,
        };
        let admin = match serve.admin {
            AdminChoice::Configured if config.admin.enabled => {
                Some(AdminSettings::try_from(&config.admin)?)
            }
            AdminChoice::Configured => None,
            AdminChoice::Given(admin) => admin,
        };
        Ok(Settings {
            workers,
            store,
            gateway,
            divvy,
            rls,
            admin,
            log: config.log.clone(),
            config,
        })
    }
}

/// The store's settings (`[store]`), with a hot-path Redis connection per worker. The Redis
/// options are checked (and their files read) whichever kind is chosen, so a mistake shows before
/// the day someone switches to Redis.
fn store_settings(c: &StoreConfig, workers: usize) -> Result<StoreSettings, ConfigError> {
    quotagate_store::keys::check_prefix(&c.key_prefix)
        .map_err(|e| ConfigError::option(e.option(), e.reason()))?;
    let tls = quotagate_store::connect::TlsFiles {
        ca: &c.tls_ca_file,
        cert: &c.tls_cert_file,
        key: &c.tls_key_file,
        insecure: c.tls_insecure_skip_verify,
    };
    let target = RedisTarget::new(
        &c.redis_url,
        c.redis_mode,
        &c.sentinel_master,
        &c.redis_password_file,
        &tls,
    )
    .map_err(|e| ConfigError::option(e.option(), e.reason()))?;
    let timeout = positive_ms("store.timeout_ms", c.timeout_ms)?;
    // A slot is renewed every third of its hold time, by calls that take up to the timeout.
    if c.concurrency_hold_ms < 1000.max(c.timeout_ms.saturating_mul(4)) {
        return Err(ConfigError::option(
            "store.concurrency_hold_ms",
            format!(
                "{} ms is too short: at least 1000 ms and 4 x store.timeout_ms ({} ms)",
                c.concurrency_hold_ms,
                c.timeout_ms.saturating_mul(4)
            ),
        ));
    }
    let redis = RedisOptions {
        target,
        timeout,
        pool_size: c.pool_size,
        prefix: c.key_prefix.clone(),
        time_source: c.time_source,
        connections: workers,
        lease: c.lease,
        lease_max_units: positive_units("store.lease_max_units", c.lease_max_units)?,
        concurrency_hold: std::time::Duration::from_millis(c.concurrency_hold_ms),
    };
    let probe_interval = positive_ms("store.probe_interval_ms", c.probe_interval_ms)?;
    Ok(match c.kind {
        StoreKind::Memory => StoreSettings::Memory {
            path: (!c.path.is_empty()).then(|| c.path.clone().into()),
            policy: c.failure_policy,
        },
        StoreKind::Redis if !c.path.is_empty() => {
            return Err(ConfigError::option(
                "store.path",
                "is for the embedded store (store.kind = \"memory\"); with Redis the counters are kept by Redis",
            ));
        }
        StoreKind::Redis => StoreSettings::Redis {
            redis,
            policy: c.failure_policy,
            probe_interval,
        },
    })
}

/// A count option that must be above 0.
fn positive_units(name: &str, v: u64) -> Result<u64, ConfigError> {
    if v == 0 {
        return Err(ConfigError::option(name, "must be above 0"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(sets: &[&str]) -> Result<Settings, ConfigError> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Settings::load(None, |_| None, &sets, Serve::all())
    }

    #[test]
    fn the_defaults_are_valid() {
        let s = with(&[]).unwrap();
        let g = s.gateway.unwrap();
        assert_eq!(g.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.admin.unwrap().listen.to_string(), "127.0.0.1:8081");
        assert!(s.divvy.is_none());
        assert!(matches!(s.store, StoreSettings::Memory { path: None, .. }));
    }

    #[test]
    fn a_bad_value_names_its_option() {
        for (set, expect) in [
            ("server.listen=localhost", "server.listen: \"localhost\""),
            ("admin.listen=x", "admin.listen: \"x\""),
            (
                "upstream.url=ftp://x",
                "must start with http:// or https://",
            ),
            ("upstream.balance=random", "upstream.balance"),
            ("upstream.health_path=health", "upstream.health_path"),
            (
                "upstream.health_interval_ms=0",
                "upstream.health_interval_ms",
            ),
            ("store.timeout_ms=0", "store.timeout_ms: must be above 0"),
            (
                "limits.api_key_header=a b",
                "limits.api_key_header: \"a b\"",
            ),
            ("catalog.server_url=nope", "catalog.server_url: \"nope\""),
            (
                "server.workers=2000",
                "server.workers: must be at most 1024",
            ),
            ("server.max_header_bytes=10", "server.max_header_bytes"),
            ("store.key_prefix=a{b}", "store.key_prefix"),
        ] {
            let e = with(&[set]).unwrap_err();
            assert!(e.to_string().contains(expect), "{set}: {e}");
            let option = set.split_once('=').unwrap().0;
            assert_eq!(e.option_name(), Some(option), "{set}: {e}");
        }
    }

    #[test]
    fn the_refresh_secret_needs_a_catalog_server() {
        let s = with(&["catalog.refresh_secret=s"]).unwrap();
        assert!(s.gateway.unwrap().proxy.refresh.secret.is_none());
        let s = with(&[
            "catalog.refresh_secret=s",
            "catalog.server_url=http://127.0.0.1:9100",
        ])
        .unwrap();
        assert_eq!(
            s.gateway.unwrap().proxy.refresh.secret.as_deref(),
            Some(&b"s"[..])
        );
    }
}
