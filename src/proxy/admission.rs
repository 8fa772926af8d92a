//! admission: what to do with one request, decided from its head, the catalog and the store's
//! verdict. No I/O and no clock: `Proxy::respond` does the waiting around it.
//!
//! Order of checks (each refusal is a small JSON problem, see `docs/semantics.md`):
//! 0. HTTP/1.1 without exactly one `Host`: 400;
//! 1. body larger than allowed (by `Content-Length`): 413;
//! 2. API key header missing or empty: 401; sent more than once: 400;
//! 3. path that cannot be normalised (bad escape, encoded slash): 400;
//! 4. no catalog yet: 503; no catalog endpoint: 404, or forwarded unlimited when configured;
//! 5. no limit for this key here (unknown keys included): 403, or forwarded unlimited when configured;
//!    neither creates a counter;
//! 6. the sliding window (the store's verdict): 429 with `Retry-After`, or forward.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST};
use http::request::Parts;
use http::{Method, Response, StatusCode, Version};
use http_body_util::Full;

use super::Policy;
use super::headers;
use super::problem::{QUOTA_EXCEEDED, problem};
use super::upstream::UpstreamError;
use crate::catalog::{Endpoint, LimitLookup, Snapshot};
use crate::config::{HeaderSet, Uncovered};
use crate::limiter::Quota;
use crate::path;
use crate::store::{CounterKey, Verdict};

/// What happened to a request: the `decision` label of `quotagate_requests` and the access log.
/// (`as usize` indexes the metrics' per-endpoint handles: fewer than `metrics::DECISIONS`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Within its limit: forwarded and counted.
    Allowed,
    /// Over its limit: 429.
    Limited,
    /// Forwarded with limits turned off (`limits.enabled = false`).
    Unlimited,
    MissingKey,
    BadRequest,
    TooLarge,
    /// No catalog loaded yet: 503.
    NotReady,
    /// No endpoint matched (404, or forwarded unlimited when configured).
    UnknownEndpoint,
    /// The key has no limit here (403, or forwarded unlimited when configured).
    NoLimit,
    /// The store is down and the failure policy is `open`: forwarded uncounted.
    StoreOpen,
    /// The store is down and the failure policy is `closed`: 503.
    StoreUnavailable,
    /// The upstream failed or timed out: 502 or 504.
    UpstreamError,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Limited => "limited",
            Decision::Unlimited => "unlimited",
            Decision::MissingKey => "missing_key",
            Decision::BadRequest => "bad_request",
            Decision::TooLarge => "too_large",
            Decision::NotReady => "not_ready",
            Decision::UnknownEndpoint => "unknown_endpoint",
            Decision::NoLimit => "no_limit",
            Decision::StoreOpen => "store_open",
            Decision::StoreUnavailable => "store_unavailable",
            Decision::UpstreamError => "upstream_error",
        }
    }
}

/// Where an admitted request goes upstream, and the rate-limit fields its answer gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'s> {
    /// The path to forward: the endpoint's canonical path, or the client's own when unlimited.
    pub path: String,
    /// The endpoint's canonical method, replacing the client's spelling.
    pub method: Option<Method>,
    /// The endpoint's name and its quota, for the rate-limit fields.
    pub limit: Option<(&'s str, Quota)>,
}

impl Target<'_> {
    fn plain(path: String) -> Self {
        Target {
            path,
            method: None,
            limit: None,
        }
    }
}

/// An answer quotagate gives itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection<'s> {
    pub status: StatusCode,
    pub detail: String,
    /// Set on 429: the endpoint's name and its quota, for the problem type and rate-limit fields.
    pub limit: Option<(&'s str, Quota)>,
}

impl Rejection<'_> {
    fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Rejection {
            status,
            detail: detail.into(),
            limit: None,
        }
    }

    /// The response, with the rate-limit fields of `fields` on a 429.
    pub fn response(&self, fields: HeaderSet) -> Response<Full<Bytes>> {
        let Some((name, quota)) = &self.limit else {
            return problem(self.status, None, &self.detail, None);
        };
        let mut resp = problem(self.status, Some(QUOTA_EXCEEDED), &self.detail, Some(name));
        headers::set_rate_limit(resp.headers_mut(), fields, name, quota);
        resp
    }
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<'s> {
    Forward(Target<'s>),
    Reject(Rejection<'s>),
}

/// The admission of one request: its decision, the endpoint it matched, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission<'s> {
    pub decision: Decision,
    pub endpoint: Option<&'s Endpoint>,
    pub action: Action<'s>,
}

impl<'s> Admission<'s> {
    fn reject(decision: Decision, status: StatusCode, detail: impl Into<String>) -> Self {
        Admission {
            decision,
            endpoint: None,
            action: Action::Reject(Rejection::new(status, detail)),
        }
    }

    fn forward(decision: Decision, endpoint: Option<&'s Endpoint>, target: Target<'s>) -> Self {
        Admission {
            decision,
            endpoint,
            action: Action::Forward(target),
        }
    }
}

/// The first half of the decision: either done, or waiting for the store to count.
#[derive(Debug)]
pub enum Step<'s, 'r> {
    Done(Admission<'s>),
    Count(Pending<'s, 'r>),
}

/// A request that has a limit: the store decides.
#[derive(Debug)]
pub struct Pending<'s, 'r> {
    /// The API key, as sent.
    pub key: &'r [u8],
    pub endpoint: &'s Endpoint,
    /// Requests per 60 s.
    pub limit: u64,
    /// The endpoint's canonical path for this request.
    path: String,
}

impl<'s> Pending<'s, '_> {
    /// The counter this request is counted in.
    pub fn counter(&self) -> CounterKey {
        CounterKey::new(self.key, &self.endpoint.name)
    }

    /// The second half: the store's verdict turned into the admission.
    pub fn conclude(self, verdict: Verdict<Quota>) -> Admission<'s> {
        let endpoint = self.endpoint;
        let target = |limit| Target {
            path: self.path,
            method: Some(endpoint.method.clone()),
            limit,
        };
        let quota = match verdict {
            Verdict::Decided(q) | Verdict::Local(q) => q,
            Verdict::Open => {
                return Admission::forward(Decision::StoreOpen, Some(endpoint), target(None));
            }
            Verdict::Closed => {
                return Admission {
                    endpoint: Some(endpoint),
                    ..Admission::reject(
                        Decision::StoreUnavailable,
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the rate-limit store is unavailable; try again shortly",
                    )
                };
            }
        };
        if quota.allowed {
            return Admission::forward(
                Decision::Allowed,
                Some(endpoint),
                target(Some((endpoint.name.as_str(), quota))),
            );
        }
        let detail = match quota.retry_after {
            Some(s) => format!(
                "{} allows {} per 60 s; retry after {s} s",
                endpoint.name,
                crate::text::plural(quota.limit, "request", "requests")
            ),
            None => format!("{} allows no requests for this API key", endpoint.name),
        };
        Admission {
            decision: Decision::Limited,
            endpoint: Some(endpoint),
            action: Action::Reject(Rejection {
                status: StatusCode::TOO_MANY_REQUESTS,
                detail,
                limit: Some((endpoint.name.as_str(), quota)),
            }),
        }
    }
}

enum ApiKey<'a> {
    Present(&'a [u8]),
    Missing,
    Repeated,
}

fn api_key<'a>(head: &'a Parts, policy: &Policy) -> ApiKey<'a> {
    let mut values = head.headers.get_all(&policy.api_key_header).iter();
    match (values.next(), values.next()) {
        (Some(_), Some(_)) => ApiKey::Repeated,
        (Some(v), None) if !v.as_bytes().is_empty() => ApiKey::Present(v.as_bytes()),
        _ => ApiKey::Missing,
    }
}

/// Decides what it can from the request head and the catalog (`None`: none loaded yet).
pub fn admit<'s, 'r>(
    head: &'r Parts,
    policy: &Policy,
    catalog: Option<&'s Snapshot>,
) -> Step<'s, 'r> {
    use Step::Done;
    // RFC 9112 §3.2: an HTTP/1.1 request with no Host, or more than one, is answered 400 (the
    // upstream would otherwise get a Host of our choosing, or X-Forwarded-Host the first of two).
    // HTTP/1.0 may omit it; HTTP/2 carries the authority in the request target.
    if head.version == Version::HTTP_11 && head.headers.get_all(HOST).iter().count() != 1 {
        return Done(Admission::reject(
            Decision::BadRequest,
            StatusCode::BAD_REQUEST,
            "an HTTP/1.1 request needs exactly one Host header",
        ));
    }
    let declared = head
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > policy.max_body_bytes) {
        return Done(Admission::reject(
            Decision::TooLarge,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than {} bytes",
                policy.max_body_bytes
            ),
        ));
    }
    if !policy.enabled {
        let target = Target::plain(head.uri.path().to_owned());
        return Done(Admission::forward(Decision::Unlimited, None, target));
    }
    let key = match api_key(head, policy) {
        ApiKey::Present(k) => k,
        ApiKey::Missing => {
            return Done(Admission::reject(
                Decision::MissingKey,
                StatusCode::UNAUTHORIZED,
                format!("send your API key in the {} header", policy.api_key_label),
            ));
        }
        ApiKey::Repeated => {
            return Done(Admission::reject(
                Decision::BadRequest,
                StatusCode::BAD_REQUEST,
                format!("send the {} header once", policy.api_key_label),
            ));
        }
    };
    let path = match path::normalize(head.uri.path(), policy.escaped_slashes) {
        Ok(p) => p,
        Err(e) => {
            return Done(Admission::reject(
                Decision::BadRequest,
                StatusCode::BAD_REQUEST,
                e.to_string(),
            ));
        }
    };
    let Some(catalog) = catalog else {
        return Done(Admission::reject(
            Decision::NotReady,
            StatusCode::SERVICE_UNAVAILABLE,
            "no catalog is loaded yet; try again shortly",
        ));
    };
    let Some(route) = catalog.route(head.method.as_str(), &path) else {
        return Done(match policy.unknown_endpoint {
            Uncovered::Reject => Admission::reject(
                Decision::UnknownEndpoint,
                StatusCode::NOT_FOUND,
                format!("no endpoint matches {} {}", head.method, path.to_path()),
            ),
            Uncovered::Forward => Admission::forward(
                Decision::UnknownEndpoint,
                None,
                Target::plain(path.to_path()),
            ),
        });
    };
    let endpoint = &catalog.endpoints()[route.endpoint];
    let limit = match catalog.limit(key, route.endpoint) {
        LimitLookup::Limit(rl) => rl,
        LimitLookup::UnknownKey | LimitLookup::NoLimit => {
            return Done(match policy.no_limit {
                Uncovered::Reject => Admission {
                    endpoint: Some(endpoint),
                    ..Admission::reject(
                        Decision::NoLimit,
                        StatusCode::FORBIDDEN,
                        format!("this API key has no limit for {}", endpoint.name),
                    )
                },
                Uncovered::Forward => Admission::forward(
                    Decision::NoLimit,
                    Some(endpoint),
                    Target {
                        path: route.path,
                        method: Some(endpoint.method.clone()),
                        limit: None,
                    },
                ),
            });
        }
    };
    Step::Count(Pending {
        key,
        endpoint,
        limit,
        path: route.path,
    })
}

/// The answer when forwarding failed, and the decision it is counted as.
pub fn upstream_failure(e: UpstreamError) -> (Decision, Rejection<'static>) {
    let (decision, status, detail) = match e {
        UpstreamError::Unreachable => (
            Decision::UpstreamError,
            StatusCode::BAD_GATEWAY,
            "the upstream cannot be reached",
        ),
        UpstreamError::Broken => (
            Decision::UpstreamError,
            StatusCode::BAD_GATEWAY,
            "the upstream connection failed",
        ),
        UpstreamError::Timeout => (
            Decision::UpstreamError,
            StatusCode::GATEWAY_TIMEOUT,
            "the upstream did not answer in time",
        ),
        UpstreamError::BodyTooLarge => (
            Decision::TooLarge,
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is too large",
        ),
        // The client's fault: not an upstream failure.
        UpstreamError::BadRequestBody => (
            Decision::BadRequest,
            StatusCode::BAD_REQUEST,
            "the request body could not be read (malformed or cut short)",
        ),
    };
    (decision, Rejection::new(status, detail))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const CATALOG: &str = r#"{
        "version": {"semver": "v1", "hash": "h1"},
        "methods": ["GET", "POST"],
        "paths": ["/users/{id}", "/open"],
        "endpoints": [{"p": 0, "m": 0}, {"p": 1, "m": 1, "default_rl": 5}],
        "apilimits": [{"key": "k1", "limits": [{"ep": 0, "rl": 2}]}]
    }"#;

    fn policy(sets: &[(&str, &str)]) -> Policy {
        let mut c = Config::default();
        for (k, v) in sets {
            match *k {
                "enabled" => c.limits.enabled = v.parse().unwrap(),
                "unknown_endpoint" => c.limits.unknown_endpoint = serde_json::from_str(v).unwrap(),
                "no_limit" => c.limits.no_limit = serde_json::from_str(v).unwrap(),
                _ => unreachable!(),
            }
        }
        Policy::try_from(&c).unwrap()
    }

    fn head(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "gw");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn snapshot() -> Snapshot {
        Snapshot::from_json("test", CATALOG.as_bytes()).unwrap()
    }

    /// The decision and status of a request that does not reach the store.
    fn done(step: Step) -> (Decision, Option<u16>) {
        match step {
            Step::Done(a) => (
                a.decision,
                match a.action {
                    Action::Reject(r) => Some(r.status.as_u16()),
                    Action::Forward(_) => None,
                },
            ),
            Step::Count(p) => panic!("wanted a decision, got a count for {}", p.endpoint.name),
        }
    }

    #[test]
    fn refusals_before_the_store_in_order() {
        let (p, s) = (policy(&[]), snapshot());
        let cases = [
            (
                head("GET", "/users/1", &[]),
                (Decision::MissingKey, Some(401)),
            ),
            (
                head("GET", "/users/1", &[("x-api-key", "a"), ("x-api-key", "b")]),
                (Decision::BadRequest, Some(400)),
            ),
            (
                head("GET", "/users%2F1", &[("x-api-key", "k1")]),
                (Decision::BadRequest, Some(400)),
            ),
            (
                head("GET", "/nope", &[("x-api-key", "k1")]),
                (Decision::UnknownEndpoint, Some(404)),
            ),
            (
                head("GET", "/users/1", &[("x-api-key", "stranger")]),
                (Decision::NoLimit, Some(403)),
            ),
            (
                head(
                    "GET",
                    "/users/1",
                    &[("x-api-key", "k1"), ("content-length", "99999999999")],
                ),
                (Decision::TooLarge, Some(413)),
            ),
        ];
        for (h, want) in cases {
            assert_eq!(
                done(admit(&h, &p, Some(&s))),
                want,
                "{} {}",
                h.method,
                h.uri
            );
        }
        let h = head("GET", "/users/1", &[("x-api-key", "k1")]);
        assert_eq!(done(admit(&h, &p, None)), (Decision::NotReady, Some(503)));
        let mut h = head("GET", "/users/1", &[("x-api-key", "k1")]);
        h.headers.remove(HOST);
        assert_eq!(
            done(admit(&h, &p, Some(&s))),
            (Decision::BadRequest, Some(400))
        );
    }

    #[test]
    fn uncovered_requests_can_be_forwarded_unlimited() {
        let p = policy(&[
            ("unknown_endpoint", "\"forward\""),
            ("no_limit", "\"forward\""),
        ]);
        let s = snapshot();
        let h = head("GET", "/nope/../x", &[("x-api-key", "k1")]);
        assert_eq!(
            done(admit(&h, &p, Some(&s))),
            (Decision::UnknownEndpoint, None)
        );
        let h = head("get", "/users/7", &[("x-api-key", "stranger")]);
        let Step::Done(a) = admit(&h, &p, Some(&s)) else {
            panic!()
        };
        assert_eq!(
            a.action,
            Action::Forward(Target {
                path: "/users/7".into(),
                method: Some(Method::GET),
                limit: None
            })
        );
        let off = policy(&[("enabled", "false")]);
        let h = head("GET", "/anything", &[]);
        assert_eq!(done(admit(&h, &off, None)), (Decision::Unlimited, None));
    }

    #[test]
    fn the_store_verdict_decides_the_rest() {
        let (p, s) = (policy(&[]), snapshot());
        let h = head("GET", "/users/1", &[("x-api-key", "k1")]);
        let pending = || match admit(&h, &p, Some(&s)) {
            Step::Count(p) => p,
            Step::Done(a) => panic!("{a:?}"),
        };
        assert_eq!(
            (pending().limit, pending().endpoint.name.as_str()),
            (2, "GET /users/{id}")
        );
        let quota = Quota {
            allowed: true,
            limit: 2,
            remaining: 1,
            reset: 60,
            retry_after: None,
        };
        let a = pending().conclude(Verdict::Decided(quota));
        assert_eq!(a.decision, Decision::Allowed);
        assert!(
            matches!(a.action, Action::Forward(Target { limit: Some(("GET /users/{id}", q)), .. }) if q == quota)
        );
        let refused = Quota {
            allowed: false,
            remaining: 0,
            retry_after: Some(7),
            ..quota
        };
        let a = pending().conclude(Verdict::Local(refused));
        let Action::Reject(r) = &a.action else {
            panic!()
        };
        assert_eq!((a.decision, r.status.as_u16()), (Decision::Limited, 429));
        assert_eq!(
            r.detail,
            "GET /users/{id} allows 2 requests per 60 s; retry after 7 s"
        );
        assert_eq!(r.response(HeaderSet::Both).headers()["retry-after"], "7");
        assert_eq!(
            pending().conclude(Verdict::Open).decision,
            Decision::StoreOpen
        );
        assert_eq!(
            pending().conclude(Verdict::Closed).decision,
            Decision::StoreUnavailable
        );
        // A default limit applies to a known key without its own.
        let h = head("POST", "/open", &[("x-api-key", "k1")]);
        assert!(matches!(
            admit(&h, &p, Some(&s)),
            Step::Count(Pending { limit: 5, .. })
        ));
    }
}
