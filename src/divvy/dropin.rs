//! dropin: `quotagate divvy RULES`, configured the way Divvy is, by its environment variables:
//! `PORT` (default 8321, on all interfaces), `REDIS_HOST` and `REDIS_PORT` (the memory store when
//! neither is set), `STATSD_*`, and `HTTP_SERVICE_PORT` with `PROMETHEUS_METRICS_PATH` for the
//! metrics page. Everything else comes from quotagate's own configuration.

use std::net::SocketAddr;
use std::path::Path;

use crate::admin::AdminSettings;
use crate::config::{Config, ConfigError, StoreKind};

/// The drop-in's configuration (quotagate's, with Divvy's variables applied as one more layer),
/// its own admin listener, and the Redis `host:port` for Divvy's start-up line.
#[derive(Debug)]
pub struct DropIn {
    pub config: Config,
    /// From `HTTP_SERVICE_PORT` and `PROMETHEUS_METRICS_PATH` (`None`: no metrics page).
    pub admin: Option<AdminSettings>,
    pub redis: Option<String>,
}

fn port(var: &str, raw: &str) -> Result<u16, ConfigError> {
    raw.parse()
        .map_err(|_| ConfigError::option(var, format!("{raw:?} is not a port number")))
}

/// The configuration of the Divvy port alone, `rules` its rule file.
pub fn configure(
    mut config: Config,
    rules: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<DropIn, ConfigError> {
    let env = |k: &str| env(k).filter(|v| !v.is_empty());
    let listen = match env("PORT") {
        Some(p) => port("PORT", &p)?,
        None => 8321,
    };
    let redis = (env("REDIS_HOST").is_some() || env("REDIS_PORT").is_some()).then(|| {
        format!(
            "{}:{}",
            env("REDIS_HOST").unwrap_or_else(|| "localhost".into()),
            env("REDIS_PORT").unwrap_or_else(|| "6379".into())
        )
    });
    if let Some(host_port) = &redis {
        config.store.kind = StoreKind::Redis;
        config.store.redis_url = format!("redis://{host_port}");
    }
    config.divvy.rules = rules.to_string_lossy().into_owned();
    config.divvy.listen = SocketAddr::from(([0, 0, 0, 0], listen)).to_string();
    let admin = match (env("HTTP_SERVICE_PORT"), env("PROMETHEUS_METRICS_PATH")) {
        (Some(p), Some(path)) => Some(AdminSettings {
            listen: SocketAddr::from(([0, 0, 0, 0], port("HTTP_SERVICE_PORT", &p)?)),
            metrics_path: match path.starts_with('/') {
                true => path,
                false => format!("/{path}"),
            },
            secret: None,
        }),
        (None, None) => None,
        _ => {
            tracing::warn!(
                "set both HTTP_SERVICE_PORT and PROMETHEUS_METRICS_PATH to serve metrics"
            );
            None
        }
    };
    Ok(DropIn {
        config,
        admin,
        redis,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dropin(vars: &[(&str, &str)]) -> Result<DropIn, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        configure(Config::default(), Path::new("rules.ini"), |k| {
            vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn divvys_variables_choose_port_store_and_metrics() {
        let d = dropin(&[]).unwrap();
        assert_eq!(d.config.divvy.listen, "0.0.0.0:8321");
        assert!(d.admin.is_none() && d.redis.is_none());
        let d = dropin(&[
            ("PORT", "9000"),
            ("REDIS_PORT", "7000"),
            ("HTTP_SERVICE_PORT", "9090"),
            ("PROMETHEUS_METRICS_PATH", "metrics"),
        ])
        .unwrap();
        assert_eq!(d.redis.as_deref(), Some("localhost:7000"));
        assert_eq!(d.config.store.redis_url, "redis://localhost:7000");
        let admin = d.admin.unwrap();
        assert_eq!(
            (
                admin.listen.to_string().as_str(),
                admin.metrics_path.as_str()
            ),
            ("0.0.0.0:9090", "/metrics")
        );
        let e = dropin(&[("PORT", "http")]).unwrap_err();
        assert_eq!(e.to_string(), "PORT: \"http\" is not a port number");
        assert_eq!(e.option_name(), Some("PORT"));
    }
}
