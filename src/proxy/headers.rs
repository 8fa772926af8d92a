//! headers: the header rules of the proxy, as pure functions.
//!
//! - Hop-by-hop fields (RFC 9110 §7.6.1) are removed in both directions: the fixed list plus every
//!   name listed in `Connection`.
//! - The upstream gets `X-Forwarded-For` (the client address appended to any list it sent),
//!   `X-Forwarded-Proto` and `X-Forwarded-Host`; the latter two are replaced, never trusted from
//!   the client.
//! - Rate-limit fields: the current IETF draft (`RateLimit-Policy`, `RateLimit`) and/or the
//!   DynLimits-compatible trio (`RateLimit-Limit`, `-Remaining`, `-Reset`), plus `Retry-After` on
//!   rejections. They replace any fields of the same names from the upstream.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::config::HeaderSet;
use crate::limiter::{Decision, WINDOW_SECONDS};

/// Hop-by-hop fields that never cross the proxy.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
pub const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
pub const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// Removes hop-by-hop fields, including those named in `Connection`. `Transfer-Encoding` is left
/// to hyper, which frames bodies itself on each side.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    headers.remove(header::TRANSFER_ENCODING);
}

/// Sets the `X-Forwarded-*` fields for a request from `client` that was sent to `host`.
pub fn set_forwarded(headers: &mut HeaderMap, client: IpAddr, host: Option<&str>) {
    let ip = client.to_string();
    let xff = match headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
    {
        prior if prior.is_empty() => ip,
        prior => format!("{}, {ip}", prior.join(", ")),
    };
    headers.remove(&X_FORWARDED_FOR);
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert(X_FORWARDED_FOR, v);
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    headers.remove(&X_FORWARDED_HOST);
    if let Some(v) = host.and_then(|h| HeaderValue::from_str(h).ok()) {
        headers.insert(X_FORWARDED_HOST, v);
    }
}

/// A Structured Fields string (RFC 9651 §3.3.3): quoted, with `"` and `\` escaped. Endpoint names
/// are printable ASCII (the catalog checks templates), so nothing else needs care.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn num(n: u64) -> HeaderValue {
    HeaderValue::from(n)
}

/// Writes the rate-limit fields of `decision` for the policy `name` (the endpoint's name).
pub fn set_rate_limit(headers: &mut HeaderMap, set: HeaderSet, name: &str, d: &Decision) {
    if matches!(set, HeaderSet::Both | HeaderSet::Ietf) {
        let policy = format!("{};q={};w={WINDOW_SECONDS}", sf_string(name), d.limit);
        let state = format!("{};r={};t={}", sf_string(name), d.remaining, d.reset);
        for (field, value) in [(RATELIMIT_POLICY, policy), (RATELIMIT, state)] {
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(field, v);
            }
        }
    }
    if matches!(set, HeaderSet::Both | HeaderSet::Legacy) {
        headers.insert(RATELIMIT_LIMIT, num(d.limit));
        headers.insert(RATELIMIT_REMAINING, num(d.remaining));
        headers.insert(RATELIMIT_RESET, num(d.reset));
    }
    match d.retry_after {
        Some(s) if !d.allowed => {
            headers.insert(header::RETRY_AFTER, num(s));
        }
        _ => {
            headers.remove(header::RETRY_AFTER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_and_connection_listed_fields_are_removed() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Secret"),
            ("connection", "x-other"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("x-other", "1"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("transfer-encoding", "chunked"),
            ("x-api-key", "k"),
            ("content-type", "text/plain"),
        ]);
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "x-api-key"]);
    }

    #[test]
    fn forwarded_fields_append_the_client_and_replace_the_rest() {
        let mut h = map(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-host", "evil"),
            ("x-forwarded-proto", "https"),
        ]);
        set_forwarded(
            &mut h,
            "10.0.0.9".parse().unwrap(),
            Some("api.example:8080"),
        );
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 10.0.0.9");
        assert_eq!(h["x-forwarded-host"], "api.example:8080");
        assert_eq!(h["x-forwarded-proto"], "http");
        let mut h = HeaderMap::new();
        set_forwarded(&mut h, "::1".parse().unwrap(), None);
        assert_eq!(h["x-forwarded-for"], "::1");
        assert!(!h.contains_key("x-forwarded-host"));
    }

    #[test]
    fn rate_limit_fields_on_allowed_and_rejected() {
        let ok = Decision {
            allowed: true,
            limit: 20,
            remaining: 7,
            reset: 42,
            retry_after: None,
        };
        let mut h = map(&[("ratelimit-limit", "999"), ("retry-after", "5")]);
        set_rate_limit(&mut h, HeaderSet::Both, "GET /users/{id}", &ok);
        assert_eq!(h["ratelimit-policy"], r#""GET /users/{id}";q=20;w=60"#);
        assert_eq!(h["ratelimit"], r#""GET /users/{id}";r=7;t=42"#);
        assert_eq!(
            (
                &h["ratelimit-limit"],
                &h["ratelimit-remaining"],
                &h["ratelimit-reset"]
            ),
            (&num(20), &num(7), &num(42))
        );
        assert!(
            !h.contains_key("retry-after"),
            "the upstream's Retry-After does not survive an allowed decision"
        );

        let no = Decision {
            allowed: false,
            limit: 20,
            remaining: 0,
            reset: 13,
            retry_after: Some(13),
        };
        let mut h = HeaderMap::new();
        set_rate_limit(&mut h, HeaderSet::Ietf, "GET /a", &no);
        assert_eq!(h["ratelimit"], r#""GET /a";r=0;t=13"#);
        assert_eq!(h["retry-after"], "13");
        assert!(!h.contains_key("ratelimit-limit"));

        let mut h = HeaderMap::new();
        set_rate_limit(&mut h, HeaderSet::Legacy, "GET /a", &no);
        assert!(!h.contains_key("ratelimit-policy"));
        assert_eq!(h["ratelimit-remaining"], "0");

        let mut h = HeaderMap::new();
        set_rate_limit(&mut h, HeaderSet::None, "GET /a", &no);
        assert_eq!(h.len(), 1, "only Retry-After");
    }

    #[test]
    fn policy_names_are_escaped() {
        assert_eq!(sf_string(r#"GET /a"b\c"#), r#""GET /a\"b\\c""#);
    }
}
