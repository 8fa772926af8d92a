//! settings: the request path's settings (`[limits]`, the refresh header), checked.

use http::HeaderName;
use quotagate_engine::path::EscapedSlashes;

use super::caller::Sources;
use super::client;
use crate::config::{
    CatalogConfig, Config, ConfigError, HeaderSet, Uncovered, header_name, positive_ms,
};

/// Request-path settings taken from the configuration.
#[derive(Debug, Clone)]
pub struct Policy {
    pub enabled: bool,
    /// Where a request's API key is found (`limits.api_key_from`, else `limits.api_key_header`).
    pub key_sources: Sources,
    pub unknown_endpoint: Uncovered,
    pub no_limit: Uncovered,
    pub headers: HeaderSet,
    pub escaped_slashes: EscapedSlashes,
    pub max_body_bytes: u64,
    /// An upgraded connection (WebSocket) with no byte either way for this long is closed
    /// (`server.upgrade_idle_timeout_ms`).
    pub upgrade_idle: std::time::Duration,
    /// One log line per request (`log.access`).
    pub access_log: bool,
    /// Every limit is a shadow limit (`limits.shadow`).
    pub shadow: bool,
    /// A request header that overrides an endpoint's cost (`limits.cost_header`).
    pub cost_header: Option<HeaderName>,
    /// Requests without an API key get the catalog's anonymous limits per client address.
    pub anonymous: bool,
    /// Peers whose `X-Forwarded-For` is believed (`limits.trusted_proxies`).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// IPv6 clients are counted per network of this prefix length (`limits.ipv6_prefix`).
    pub ipv6_prefix: u8,
    /// Bytes of a body read for its `cost_from` report at most (`limits.cost_body_max_bytes`).
    pub cost_body_max_bytes: usize,
    /// Requests waiting for room at once at most (`limits.wait_queue_max`).
    pub wait_queue_max: usize,
}

/// `limits.api_key_from`, or `limits.api_key_header` alone (both set is ambiguous: refused).
fn key_sources(limits: &crate::config::LimitsConfig) -> Result<Sources, ConfigError> {
    let header = header_name("limits.api_key_header", &limits.api_key_header)?;
    if limits.api_key_from.trim().is_empty() {
        return Ok(Sources::header(header, &limits.api_key_header));
    }
    if limits.api_key_header != crate::config::LimitsConfig::default().api_key_header {
        return Err(ConfigError::option(
            "limits.api_key_from",
            "set it or limits.api_key_header, not both (header:NAME in limits.api_key_from)",
        ));
    }
    Sources::parse(&limits.api_key_from).map_err(|e| ConfigError::option("limits.api_key_from", e))
}

impl TryFrom<&Config> for Policy {
    type Error = ConfigError;

    /// `[limits]`, with `server.max_body_bytes` and `log.access`.
    fn try_from(c: &Config) -> Result<Self, ConfigError> {
        let limits = &c.limits;
        Ok(Policy {
            enabled: limits.enabled,
            key_sources: key_sources(limits)?,
            unknown_endpoint: limits.unknown_endpoint,
            no_limit: limits.no_limit,
            headers: limits.headers,
            escaped_slashes: limits.escaped_slashes,
            max_body_bytes: c.server.max_body_bytes,
            upgrade_idle: crate::config::positive_ms(
                "server.upgrade_idle_timeout_ms",
                c.server.upgrade_idle_timeout_ms,
            )?,
            access_log: c.log.access,
            shadow: limits.shadow,
            cost_header: match limits.cost_header.as_str() {
                "" => None,
                h => Some(header_name("limits.cost_header", h)?),
            },
            anonymous: limits.anonymous == crate::config::Anonymous::ByAddress,
            trusted_proxies: client::parse_trusted(&limits.trusted_proxies)?,
            cost_body_max_bytes: usize::try_from(limits.cost_body_max_bytes).unwrap_or(usize::MAX),
            wait_queue_max: usize::try_from(limits.wait_queue_max).unwrap_or(usize::MAX),
            ipv6_prefix: match limits.ipv6_prefix {
                p @ 1..=128 => p,
                p => {
                    return Err(ConfigError::option(
                        "limits.ipv6_prefix",
                        format!("{p} is not a prefix length from 1 to 128"),
                    ));
                }
            },
        })
    }
}

/// The forced-refresh header.
#[derive(Debug, Clone)]
pub struct Refresh {
    pub header: HeaderName,
    /// `None`: the feature is off (the header is still removed).
    pub secret: Option<Vec<u8>>,
    /// How long the request waits for its fetch.
    pub wait: std::time::Duration,
}

impl TryFrom<&CatalogConfig> for Refresh {
    type Error = ConfigError;

    /// The header's settings. Without a catalog server there is nothing to fetch: the secret is
    /// not kept (the header is only removed).
    fn try_from(c: &CatalogConfig) -> Result<Self, ConfigError> {
        let on = !c.refresh_secret.is_empty() && !c.server_url.is_empty();
        Ok(Refresh {
            header: header_name("catalog.refresh_header", &c.refresh_header)?,
            secret: on.then(|| c.refresh_secret.clone().into_bytes()),
            wait: positive_ms("catalog.refresh_wait_ms", c.refresh_wait_ms)?,
        })
    }
}

/// The request path's settings.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    pub policy: Policy,
    pub refresh: Refresh,
    /// OpenTelemetry traces (`[telemetry]`); `None`: off.
    pub trace: Option<crate::observe::otel::TraceSettings>,
}
