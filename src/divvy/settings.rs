//! settings: the Divvy port's settings (`[divvy]`), checked.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::metrics::StatsdSettings;
use super::server::ConnectionLimits;
use crate::config::{ConfigError, DivvyConfig, address};

/// The Divvy port's settings, checked.
#[derive(Debug, Clone)]
pub struct DivvySettings {
    /// `divvy.listen`.
    pub listen: SocketAddr,
    /// The rule file (`divvy.rules`), read when the application is built.
    pub rules: PathBuf,
    pub limits: ConnectionLimits,
    /// Divvy's statsd metrics, from its `STATSD_*` variables.
    pub statsd: Option<StatsdSettings>,
}

impl DivvySettings {
    /// `[divvy]`; `env` gives the `STATSD_*` variables.
    pub fn new(c: &DivvyConfig, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Ok(DivvySettings {
            listen: address("divvy.listen", &c.listen, "127.0.0.1:8321")?,
            rules: PathBuf::from(&c.rules),
            limits: ConnectionLimits::try_from(c)?,
            statsd: StatsdSettings::from_env(env),
        })
    }
}
