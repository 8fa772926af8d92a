//! settings: the request path's settings (`[limits]`, the refresh header), checked.

use http::HeaderName;
use quotagate_engine::path::EscapedSlashes;

use super::caller::Sources;
use super::client;
use super::jwt::source::{Fetching, JwtSettings};
use super::jwt::{Keys, Rules};
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
    /// The `jwt:` source's keys and rules, when one is listed.
    pub jwt: Option<JwtSettings>,
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

/// A key set or secret file's size at most.
const MAX_JWT_FILE_BYTES: u64 = 1024 * 1024;

/// The `jwt:` source's settings (`limits.jwt_*`), its files read and checked; `None` without a
/// `jwt:` source (then no `limits.jwt_*` option may be set: it would not be honoured).
fn jwt_settings(c: &Config, sources: &Sources) -> Result<Option<JwtSettings>, ConfigError> {
    let l = &c.limits;
    let given = [
        ("limits.jwt_jwks_url", &l.jwt_jwks_url),
        ("limits.jwt_jwks_file", &l.jwt_jwks_file),
        ("limits.jwt_secret_file", &l.jwt_secret_file),
        ("limits.jwt_issuer", &l.jwt_issuer),
        ("limits.jwt_audience", &l.jwt_audience),
    ];
    let Some(claim) = sources.jwt_claim() else {
        return match given.iter().find(|(_, v)| !v.is_empty()) {
            Some((name, _)) => Err(ConfigError::option(
                *name,
                "it is for a jwt:CLAIM source, and limits.api_key_from lists none",
            )),
            None => Ok(None),
        };
    };
    let (url, file, secret) = (&l.jwt_jwks_url, &l.jwt_jwks_file, &l.jwt_secret_file);
    if url.is_empty() && file.is_empty() && secret.is_empty() {
        return Err(ConfigError::option(
            "limits.api_key_from",
            format!(
                "jwt:{claim} needs limits.jwt_jwks_url, limits.jwt_jwks_file or limits.jwt_secret_file"
            ),
        ));
    }
    if !url.is_empty() && !file.is_empty() {
        return Err(ConfigError::option(
            "limits.jwt_jwks_file",
            "set it or limits.jwt_jwks_url, not both",
        ));
    }
    let read = |name: &str, path: &str| {
        crate::config::files::read_capped(path.as_ref(), MAX_JWT_FILE_BYTES)
            .map_err(|e| ConfigError::option(name, format!("cannot read {path}: {e}")))
    };
    let mut keys = Keys::default();
    if !file.is_empty() {
        let text = read("limits.jwt_jwks_file", file)?;
        keys = Keys::from_jwks(text.as_bytes())
            .map_err(|e| ConfigError::option("limits.jwt_jwks_file", format!("{file}: {e}")))?
            .0;
    }
    let mut kept = None;
    if !secret.is_empty() {
        let text = read("limits.jwt_secret_file", secret)?;
        let bytes = text.strip_suffix('\n').unwrap_or(&text);
        let bytes = bytes.strip_suffix('\r').unwrap_or(bytes).as_bytes();
        keys = keys
            .with_secret(bytes)
            .map_err(|e| ConfigError::option("limits.jwt_secret_file", format!("{secret}: {e}")))?;
        kept = Some(std::sync::Arc::from(bytes));
    }
    let fetching = match url.as_str() {
        "" => None,
        url => {
            let parsed = reqwest::Url::parse(url)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https"))
                .ok_or_else(|| {
                    ConfigError::option(
                        "limits.jwt_jwks_url",
                        format!("{url:?} is not an http(s) URL"),
                    )
                })?;
            // The catalog's HTTP client settings: the same timeouts.
            let client = reqwest::Client::builder()
                .connect_timeout(positive_ms(
                    "catalog.connect_timeout_ms",
                    c.catalog.connect_timeout_ms,
                )?)
                .timeout(positive_ms(
                    "catalog.request_timeout_ms",
                    c.catalog.request_timeout_ms,
                )?)
                .build()
                .map_err(|e| {
                    ConfigError::option(
                        "limits.jwt_jwks_url",
                        format!("cannot build its client: {}", crate::start::with_causes(&e)),
                    )
                })?;
            Some(Fetching {
                url: parsed,
                refresh: positive_ms("limits.jwt_jwks_refresh_ms", l.jwt_jwks_refresh_ms)?,
                client,
            })
        }
    };
    let nonempty = |s: &String| (!s.is_empty()).then(|| s.clone());
    Ok(Some(JwtSettings {
        rules: Rules {
            claim: claim.split('.').map(str::to_owned).collect(),
            leeway_s: l.jwt_leeway_ms / 1000,
            issuer: nonempty(&l.jwt_issuer),
            audience: nonempty(&l.jwt_audience),
        },
        keys: std::sync::Arc::new(keys),
        secret: kept,
        url: fetching,
        memo_max: usize::try_from(l.jwt_memo_max).unwrap_or(usize::MAX),
    }))
}

impl TryFrom<&Config> for Policy {
    type Error = ConfigError;

    /// `[limits]`, with `server.max_body_bytes` and `log.access`.
    fn try_from(c: &Config) -> Result<Self, ConfigError> {
        let limits = &c.limits;
        let key_sources = key_sources(limits)?;
        Ok(Policy {
            enabled: limits.enabled,
            jwt: jwt_settings(c, &key_sources)?,
            key_sources,
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
