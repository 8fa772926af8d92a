//! settings: `[upstream]`, checked: the targets, how they are balanced and health-checked, and
//! the TLS spoken to them.

use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderValue, Uri};

use crate::config::{Balance, Config, ConfigError, UpstreamProtocol, positive_ms};

/// Most targets in `upstream.url`.
pub const MAX_TARGETS: usize = 64;
/// Longest time a target stays out after failing (the doubling stops here). 5 minutes.
pub const MAX_EJECT: Duration = Duration::from_secs(300);

/// The upstream's settings (`[upstream]`), checked.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    /// At least one; all share one base path.
    pub targets: Vec<TargetUrl>,
    /// Prepended to every forwarded path; empty or starting with `/`, never ending with `/`.
    pub base_path: String,
    pub balance: Balance,
    pub protocol: UpstreamProtocol,
    /// Consecutive connect failures or timeouts that take a target out (0: never).
    pub eject_after: u32,
    /// First time out; doubles per further ejection, up to [`MAX_EJECT`].
    pub eject: Duration,
    /// GET this path on every target every `health_interval` (`None`: no active checks).
    pub health_path: Option<String>,
    pub health_interval: Duration,
    /// Other targets tried after a connection failed before any byte was sent.
    pub retries: u32,
    /// TLS towards `https://` targets.
    pub tls: ClientTlsSettings,
    /// Connecting (TCP and TLS handshake) to a target; then 502.
    pub connect_timeout: Duration,
    /// Waiting for the upstream's response headers; then 504.
    pub response_timeout: Duration,
    /// Idle upstream connections are closed after this.
    pub pool_idle_timeout: Duration,
    /// Idle upstream connections kept open, per worker and target.
    pub pool_max_idle: usize,
    /// Largest response header section read from the upstream (`server.max_header_bytes`).
    pub max_header_bytes: usize,
}

/// `upstream.tls_*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsSettings {
    /// Verify against these CAs instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// (chain, key) presented to upstreams that ask for a client certificate.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Verified and sent as SNI instead of each target's host.
    pub server_name: Option<String>,
    pub insecure_skip_verify: bool,
}

impl TryFrom<&Config> for UpstreamSettings {
    type Error = ConfigError;

    fn try_from(c: &Config) -> Result<Self, ConfigError> {
        let u = &c.upstream;
        let (targets, base_path) = parse_targets(&u.url)?;
        let file = |s: &str| (!s.trim().is_empty()).then(|| PathBuf::from(s.trim()));
        let client_cert = match (file(&u.tls_cert_file), file(&u.tls_key_file)) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::option(
                    "upstream.tls_key_file",
                    "is needed with upstream.tls_cert_file",
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::option(
                    "upstream.tls_cert_file",
                    "is needed with upstream.tls_key_file",
                ));
            }
        };
        let server_name = match u.tls_server_name.trim() {
            "" => None,
            n => {
                rustls::pki_types::ServerName::try_from(n).map_err(|_| {
                    ConfigError::option(
                        "upstream.tls_server_name",
                        format!("{n:?} is not a DNS name or an IP address"),
                    )
                })?;
                Some(n.to_owned())
            }
        };
        let health_path = match u.health_path.trim() {
            "" => None,
            p if p.starts_with('/') && p.parse::<http::uri::PathAndQuery>().is_ok() => {
                Some(p.to_owned())
            }
            p => {
                return Err(ConfigError::option(
                    "upstream.health_path",
                    format!("{p:?} is not a path starting with /"),
                ));
            }
        };
        if u.eject_after > 0 && u.eject_ms == 0 {
            return Err(ConfigError::option(
                "upstream.eject_ms",
                "must be positive (set upstream.eject_after = 0 to never take a target out)",
            ));
        }
        Ok(UpstreamSettings {
            targets,
            base_path,
            balance: u.balance,
            protocol: u.protocol,
            eject_after: u.eject_after,
            eject: Duration::from_millis(u.eject_ms).min(MAX_EJECT),
            health_path,
            health_interval: positive_ms("upstream.health_interval_ms", u.health_interval_ms)?,
            retries: u.retries.min(MAX_TARGETS as u32),
            tls: ClientTlsSettings {
                ca: file(&u.tls_ca_file),
                client_cert,
                server_name,
                insecure_skip_verify: u.tls_insecure_skip_verify,
            },
            connect_timeout: positive_ms("upstream.connect_timeout_ms", u.connect_timeout_ms)?,
            response_timeout: positive_ms("upstream.response_timeout_ms", u.response_timeout_ms)?,
            pool_idle_timeout: Duration::from_millis(u.pool_idle_timeout_ms),
            pool_max_idle: u.pool_max_idle,
            max_header_bytes: c.server.max_header_bytes,
        })
    }
}

impl UpstreamSettings {
    /// Does any target speak TLS?
    pub fn any_tls(&self) -> bool {
        self.targets.iter().any(|t| t.tls)
    }
}

/// One target of `upstream.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetUrl {
    /// `https://`.
    pub tls: bool,
    /// `host:port` (the scheme's port when the URL has none).
    pub authority: http::uri::Authority,
    /// `Host` of requests forwarded to it: the URL's authority as written.
    pub host: HeaderValue,
    /// The URL as written, for logs, metrics and `/status`.
    pub url: String,
}

impl TargetUrl {
    /// The host without its port (and without brackets for IPv6), for TLS names.
    pub fn hostname(&self) -> &str {
        self.authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
    }
}

/// `upstream.url`: comma-separated `http[s]://host[:port][/base/path]`, one base path for all.
pub fn parse_targets(list: &str) -> Result<(Vec<TargetUrl>, String), ConfigError> {
    let mut targets = Vec::new();
    let mut base: Option<String> = None;
    for url in list.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let bad = |why: &str| ConfigError::option("upstream.url", format!("{url:?} {why}"));
        let uri: Uri = url.parse().map_err(|_| bad("is not a URL"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(bad("must start with http:// or https://")),
        };
        let written = uri.authority().cloned().ok_or_else(|| bad("has no host"))?;
        if written.as_str().contains('@') {
            return Err(bad("must not carry credentials"));
        }
        if uri.query().is_some() {
            return Err(bad("must not have a query"));
        }
        let path = uri.path().trim_end_matches('/').to_owned();
        match &base {
            Some(b) if *b != path => {
                return Err(bad(&format!(
                    "has the base path {path:?}, another target {b:?}; all targets share one"
                )));
            }
            _ => base = Some(path),
        }
        let authority = match written.port_u16() {
            Some(_) => written.clone(),
            None => format!("{}:{}", written.host(), if tls { 443 } else { 80 })
                .parse()
                .map_err(|_| bad("has no valid host"))?,
        };
        if targets.iter().any(|t: &TargetUrl| t.authority == authority) {
            return Err(bad("is listed twice"));
        }
        targets.push(TargetUrl {
            tls,
            host: HeaderValue::from_str(written.as_str())
                .expect("an authority is a valid header value"),
            authority,
            url: url.trim_end_matches('/').to_owned(),
        });
    }
    if targets.is_empty() {
        return Err(ConfigError::option("upstream.url", "names no target"));
    }
    if targets.len() > MAX_TARGETS {
        return Err(ConfigError::option(
            "upstream.url",
            format!("lists {} targets; at most {MAX_TARGETS}", targets.len()),
        ));
    }
    Ok((targets, base.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_target_with_a_base_path() {
        let (t, base) = parse_targets("http://api:9000/v1/").unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(
            (t[0].authority.as_str(), base.as_str()),
            ("api:9000", "/v1")
        );
        assert!(!t[0].tls);
        assert_eq!(parse_targets("http://api:9000").unwrap().1, "");
    }

    #[test]
    fn several_targets_default_ports_and_hosts() {
        let (t, base) =
            parse_targets("https://a.test/v1, http://b.test:8080/v1/ ,https://[::1]:8443/v1")
                .unwrap();
        let got: Vec<(&str, bool, &str)> = t
            .iter()
            .map(|t| (t.authority.as_str(), t.tls, t.host.to_str().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("a.test:443", true, "a.test"),
                ("b.test:8080", false, "b.test:8080"),
                ("[::1]:8443", true, "[::1]:8443"),
            ]
        );
        assert_eq!(base, "/v1");
        assert_eq!(t[2].hostname(), "::1");
        assert_eq!(t[0].url, "https://a.test/v1");
    }

    #[test]
    fn bad_lists_are_refused_with_the_target_named() {
        for (list, says) in [
            ("ftp://x", "must start with http:// or https://"),
            ("http://a/v1,http://b/v2", "share one"),
            ("http://a:1,http://a:1", "listed twice"),
            ("http://a?x=1", "must not have a query"),
            ("http://u:p@a", "credentials"),
            (" , ", "names no target"),
        ] {
            let e = parse_targets(list).unwrap_err();
            assert_eq!(e.option_name(), Some("upstream.url"));
            assert!(e.reason().contains(says), "{list}: {e}");
        }
    }
}
