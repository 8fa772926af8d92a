//! proxy: the request path. API key, route, limit, decision, then forward or answer.
//!
//! Order of checks (each answer is a small JSON problem, see `docs/semantics.md`):
//! 0. HTTP/1.1 without exactly one `Host`: 400;
//! 1. body larger than allowed (by `Content-Length`): 413;
//! 2. API key header missing or empty: 401; sent more than once: 400;
//! 3. path that cannot be normalised (bad escape, encoded slash): 400;
//! 4. no catalog endpoint: 404, or forwarded unlimited when configured;
//! 5. no limit for this key here (unknown keys included): 403, or forwarded unlimited when configured;
//!    neither creates a counter;
//! 6. the sliding window: 429 with `Retry-After`, or forward.
//!
//! Allowed requests are forwarded with the endpoint's canonical path (see `router`), so the upstream
//! receives exactly the endpoint that was counted.

pub mod headers;
pub mod problem;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST};
use http::request::Parts;
use http::{HeaderName, Method, Request, Response, StatusCode, Version};
use http_body_util::{Either, Full, Limited};
use hyper::body::Incoming;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::metrics::{ClassLabels, Metrics, RequestLabels, status_class};

use crate::catalog::LimitLookup;
use crate::catalog::live::Live;
use crate::clock::Clock;
use crate::config::{
    CatalogConfig, Config, ConfigError, HeaderSet, Uncovered, header_name, positive_ms,
};
use crate::limiter::Decision;
use crate::path::{self, EscapedSlashes};
use crate::store::{CounterKey, Store, Verdict};
use problem::{QUOTA_EXCEEDED, problem};
use upstream::{Upstream, UpstreamError};

/// Response body: the upstream's, streamed, or one of our own small ones.
pub type Body = Either<Incoming, Full<Bytes>>;

/// Request-path settings taken from the configuration.
#[derive(Debug, Clone)]
pub struct Policy {
    pub enabled: bool,
    pub api_key_header: HeaderName,
    /// The header name as configured, for messages (`HeaderName` is always lower case).
    pub api_key_label: String,
    pub unknown_endpoint: Uncovered,
    pub no_limit: Uncovered,
    pub headers: HeaderSet,
    pub escaped_slashes: EscapedSlashes,
    pub max_body_bytes: u64,
    /// One log line per request (`log.access`).
    pub access_log: bool,
}

impl TryFrom<&Config> for Policy {
    type Error = ConfigError;

    /// `[limits]`, with `server.max_body_bytes` and `log.access`.
    fn try_from(c: &Config) -> Result<Self, ConfigError> {
        let limits = &c.limits;
        Ok(Policy {
            enabled: limits.enabled,
            api_key_header: header_name("limits.api_key_header", &limits.api_key_header)?,
            api_key_label: limits.api_key_header.clone(),
            unknown_endpoint: limits.unknown_endpoint,
            no_limit: limits.no_limit,
            headers: limits.headers,
            escaped_slashes: limits.escaped_slashes,
            max_body_bytes: c.server.max_body_bytes,
            access_log: c.log.access,
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

    /// The header's settings; the secret is dropped by whoever knows there is no catalog server.
    fn try_from(c: &CatalogConfig) -> Result<Self, ConfigError> {
        Ok(Refresh {
            header: header_name("catalog.refresh_header", &c.refresh_header)?,
            secret: (!c.refresh_secret.is_empty()).then(|| c.refresh_secret.clone().into_bytes()),
            wait: positive_ms("catalog.refresh_wait_ms", c.refresh_wait_ms)?,
        })
    }
}

/// Where a request goes upstream, and the rate-limit fields its answer gets.
struct Target<'a> {
    path: &'a str,
    /// The endpoint's canonical method, replacing the client's spelling.
    method: Option<Method>,
    /// The endpoint's name and the decision, for the rate-limit fields.
    limit: Option<(&'a str, &'a Decision)>,
}

impl<'a> Target<'a> {
    fn plain(path: &'a str) -> Self {
        Target {
            path,
            method: None,
            limit: None,
        }
    }

    fn endpoint(path: &'a str, method: Method, limit: Option<(&'a str, &'a Decision)>) -> Self {
        Target {
            path,
            method: Some(method),
            limit,
        }
    }
}

/// What happened to one request, for metrics and the access log.
#[derive(Debug)]
struct Outcome {
    decision: &'static str,
    /// The endpoint's name, empty when none matched.
    endpoint: String,
    /// The API key's fingerprint (access log only).
    key: Option<String>,
}

impl Default for Outcome {
    fn default() -> Self {
        Outcome {
            decision: "bad_request",
            endpoint: String::new(),
            key: None,
        }
    }
}

/// Everything a request needs, shared by all connections.
pub struct Proxy {
    /// The current catalog: read once per request without locking; a new catalog is swapped in
    /// whole, so a request never sees routes of one version and limits of another.
    catalog: Arc<Live>,
    refresh: Refresh,
    store: Arc<Store>,
    clock: Arc<dyn Clock>,
    upstream: Upstream,
    policy: Policy,
    metrics: Arc<Metrics>,
    /// Set while upstream requests fail, so the failure is logged once per episode.
    upstream_failing: AtomicBool,
}

fn own(resp: Response<Full<Bytes>>) -> Response<Body> {
    resp.map(Either::Right)
}

enum ApiKey<'a> {
    Present(&'a [u8]),
    Missing,
    Repeated,
}

fn api_key<'a>(parts: &'a Parts, name: &HeaderName) -> ApiKey<'a> {
    let mut values = parts.headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(_), Some(_)) => ApiKey::Repeated,
        (Some(v), None) if !v.as_bytes().is_empty() => ApiKey::Present(v.as_bytes()),
        _ => ApiKey::Missing,
    }
}

impl Proxy {
    pub fn new(
        catalog: Arc<Live>,
        refresh: Refresh,
        store: Arc<Store>,
        clock: Arc<dyn Clock>,
        upstream: Upstream,
        policy: Policy,
        metrics: Arc<Metrics>,
    ) -> Proxy {
        Proxy {
            catalog,
            refresh,
            store,
            clock,
            upstream,
            policy,
            metrics,
            upstream_failing: AtomicBool::new(false),
        }
    }

    pub fn catalog(&self) -> &Arc<Live> {
        &self.catalog
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Handles one request from `peer`. Never fails: every outcome is a response.
    pub async fn handle(
        self: Arc<Self>,
        peer: SocketAddr,
        req: Request<Incoming>,
    ) -> Response<Body> {
        let started = Instant::now();
        let access = self
            .policy
            .access_log
            .then(|| (req.method().clone(), req.uri().path().to_owned()));
        let mut out = Outcome::default();
        let resp = self.respond(peer, req, &mut out).await;
        let elapsed = started.elapsed();
        self.metrics.request_seconds.observe(elapsed.as_secs_f64());
        if let Some((method, path)) = access {
            tracing::info!(
                target: "quotagate::access",
                %method,
                path,
                status = resp.status().as_u16(),
                decision = out.decision,
                endpoint = out.endpoint,
                key = out.key.as_deref().unwrap_or(""),
                ms = elapsed.as_secs_f64() * 1000.0,
                "request"
            );
        }
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                decision: out.decision,
                endpoint: out.endpoint,
            })
            .inc();
        resp
    }

    async fn respond(
        &self,
        peer: SocketAddr,
        req: Request<Incoming>,
        out: &mut Outcome,
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        self.forced_refresh(&mut parts).await;
        // RFC 9112 §3.2: an HTTP/1.1 request with no Host, or more than one, is answered 400 (the
        // upstream would otherwise get a Host of our choosing, or X-Forwarded-Host the first of
        // two). HTTP/1.0 may omit it; HTTP/2 carries the authority in the request target.
        if parts.version == Version::HTTP_11 && parts.headers.get_all(HOST).iter().count() != 1 {
            out.decision = "bad_request";
            return own(problem(
                StatusCode::BAD_REQUEST,
                None,
                "an HTTP/1.1 request needs exactly one Host header",
                None,
            ));
        }
        let declared = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.policy.max_body_bytes) {
            out.decision = "too_large";
            return own(problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                &format!(
                    "the request body is larger than {} bytes",
                    self.policy.max_body_bytes
                ),
                None,
            ));
        }
        if !self.policy.enabled {
            out.decision = "unlimited";
            let path = parts.uri.path().to_owned();
            return self
                .forward(parts, body, peer, Target::plain(&path), out)
                .await;
        }

        let key = match api_key(&parts, &self.policy.api_key_header) {
            ApiKey::Present(k) => k,
            ApiKey::Missing => {
                out.decision = "missing_key";
                let detail = format!(
                    "send your API key in the {} header",
                    self.policy.api_key_label
                );
                return own(problem(StatusCode::UNAUTHORIZED, None, &detail, None));
            }
            ApiKey::Repeated => {
                out.decision = "bad_request";
                let detail = format!("send the {} header once", self.policy.api_key_label);
                return own(problem(StatusCode::BAD_REQUEST, None, &detail, None));
            }
        };
        let path = match path::normalize(parts.uri.path(), self.policy.escaped_slashes) {
            Ok(p) => p,
            Err(e) => {
                out.decision = "bad_request";
                return own(problem(StatusCode::BAD_REQUEST, None, &e.to_string(), None));
            }
        };

        if !self.catalog.is_ready() {
            out.decision = "not_ready";
            return own(problem(
                StatusCode::SERVICE_UNAVAILABLE,
                None,
                "no catalog is loaded yet; try again shortly",
                None,
            ));
        }
        let catalog = self.catalog.snapshot();
        let Some(route) = catalog.route(parts.method.as_str(), &path) else {
            out.decision = "unknown_endpoint";
            return match self.policy.unknown_endpoint {
                Uncovered::Reject => own(problem(
                    StatusCode::NOT_FOUND,
                    None,
                    &format!("no endpoint matches {} {}", parts.method, path.to_path()),
                    None,
                )),
                Uncovered::Forward => {
                    let p = path.to_path();
                    self.forward(parts, body, peer, Target::plain(&p), out)
                        .await
                }
            };
        };
        let endpoint = &catalog.endpoints()[route.endpoint];
        out.endpoint.clone_from(&endpoint.name);
        if self.policy.access_log {
            out.key = Some(crate::telemetry::fingerprint(key));
        }
        let method = endpoint.method.clone();
        let limit = match catalog.limit(key, route.endpoint) {
            LimitLookup::Limit(rl) => rl,
            LimitLookup::UnknownKey | LimitLookup::NoLimit => {
                out.decision = "no_limit";
                return match self.policy.no_limit {
                    Uncovered::Reject => own(problem(
                        StatusCode::FORBIDDEN,
                        None,
                        &format!("this API key has no limit for {}", endpoint.name),
                        None,
                    )),
                    Uncovered::Forward => {
                        self.forward(
                            parts,
                            body,
                            peer,
                            Target::endpoint(&route.path, method, None),
                            out,
                        )
                        .await
                    }
                };
            }
        };

        let counter = CounterKey::new(key, &endpoint.name);
        let asked = Instant::now();
        let verdict = self.store.check(&counter, limit, self.clock.now()).await;
        self.metrics
            .decision_seconds
            .observe(asked.elapsed().as_secs_f64());
        let decision = match verdict {
            Verdict::Decided(d) | Verdict::Local(d) => d,
            Verdict::Open => {
                out.decision = "store_open";
                return self
                    .forward(
                        parts,
                        body,
                        peer,
                        Target::endpoint(&route.path, method, None),
                        out,
                    )
                    .await;
            }
            Verdict::Closed => {
                out.decision = "store_unavailable";
                return own(problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    None,
                    "the rate-limit store is unavailable; try again shortly",
                    None,
                ));
            }
        };
        if !decision.allowed {
            out.decision = "limited";
            let detail = match decision.retry_after {
                Some(s) => format!(
                    "{} allows {} requests per 60 s; retry after {s} s",
                    endpoint.name, decision.limit
                ),
                None => format!("{} allows no requests for this API key", endpoint.name),
            };
            let mut resp = problem(
                StatusCode::TOO_MANY_REQUESTS,
                Some(QUOTA_EXCEEDED),
                &detail,
                Some(&endpoint.name),
            );
            headers::set_rate_limit(
                resp.headers_mut(),
                self.policy.headers,
                &endpoint.name,
                &decision,
            );
            return own(resp);
        }
        out.decision = "allowed";
        let target = Target::endpoint(&route.path, method, Some((&endpoint.name, &decision)));
        self.forward(parts, body, peer, target, out).await
    }

    /// Handles the forced-refresh header: always removed, so it never reaches the upstream; with
    /// the right secret, fetches the catalog (shared with concurrent triggers) and waits for it, so
    /// this very request sees a key provisioned a moment ago.
    async fn forced_refresh(&self, parts: &mut Parts) {
        let values: Vec<http::HeaderValue> = match parts.headers.entry(&self.refresh.header) {
            http::header::Entry::Occupied(e) => e.remove_entry_mult().1.collect(),
            http::header::Entry::Vacant(_) => return,
        };
        let valid = match (&self.refresh.secret, values.as_slice()) {
            (Some(secret), [v]) => bool::from(subtle::ConstantTimeEq::ct_eq(
                v.as_bytes(),
                secret.as_slice(),
            )),
            _ => false,
        };
        let outcome = if !valid {
            tracing::debug!("refresh header without the right secret: ignored");
            "invalid"
        } else if self.catalog.refresh(self.refresh.wait).await {
            "fetched"
        } else {
            tracing::debug!(
                "forced catalog refresh did not finish in time; using the current catalog"
            );
            "timed_out"
        };
        self.metrics
            .catalog_refreshes
            .get_or_create(&crate::metrics::OutcomeLabels { outcome })
            .inc();
    }

    /// Forwards the request to `path` on the upstream and relays the answer, adding the rate-limit
    /// fields of `limit` when given.
    async fn forward(
        &self,
        mut parts: Parts,
        body: Incoming,
        peer: SocketAddr,
        target: Target<'_>,
        out: &mut Outcome,
    ) -> Response<Body> {
        let Target {
            path,
            method,
            limit,
        } = target;
        let Some(uri) = self.upstream.uri(path, parts.uri.query()) else {
            return own(problem(
                StatusCode::BAD_REQUEST,
                None,
                "the request target cannot be forwarded",
                None,
            ));
        };
        let host = parts
            .headers
            .get(HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| parts.uri.authority().map(|a| a.to_string()));
        headers::strip_hop_by_hop(&mut parts.headers, Some(&self.policy.api_key_header));
        // hyper's client sets Host from the URI only when none is present.
        parts.headers.remove(HOST);
        headers::set_forwarded(&mut parts.headers, peer.ip(), host.as_deref());
        parts.uri = uri;
        // Whatever the client spoke (HTTP/2 included), the upstream pool speaks HTTP/1.1.
        parts.version = Version::HTTP_11;
        if let Some(m) = method {
            parts.method = m;
        }
        let req = Request::from_parts(
            parts,
            Limited::new(body, self.policy.max_body_bytes as usize),
        );
        match self.upstream.send(req).await {
            Ok(resp) => {
                if self.upstream_failing.load(Ordering::Relaxed)
                    && self.upstream_failing.swap(false, Ordering::Relaxed)
                {
                    tracing::info!("upstream answers again");
                }
                self.metrics
                    .upstream_responses
                    .get_or_create(&ClassLabels {
                        class: status_class(resp.status().as_u16()),
                    })
                    .inc();
                let (mut head, body) = resp.into_parts();
                headers::strip_hop_by_hop(&mut head.headers, None);
                if let Some((name, d)) = limit {
                    headers::set_rate_limit(&mut head.headers, self.policy.headers, name, d);
                }
                Response::from_parts(head, Either::Left(body))
            }
            Err(e) => {
                let (status, detail) = match e {
                    UpstreamError::Unreachable => {
                        (StatusCode::BAD_GATEWAY, "the upstream cannot be reached")
                    }
                    UpstreamError::Broken => {
                        (StatusCode::BAD_GATEWAY, "the upstream connection failed")
                    }
                    UpstreamError::Timeout => (
                        StatusCode::GATEWAY_TIMEOUT,
                        "the upstream did not answer in time",
                    ),
                    UpstreamError::BodyTooLarge => (
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "the request body is too large",
                    ),
                    UpstreamError::BadRequestBody => (
                        StatusCode::BAD_REQUEST,
                        "the request body could not be read (malformed or cut short)",
                    ),
                };
                if e == UpstreamError::BadRequestBody {
                    // The client's fault: not an upstream failure, nothing to warn about.
                    out.decision = "bad_request";
                } else if e != UpstreamError::BodyTooLarge {
                    out.decision = "upstream_error";
                    if !self.upstream_failing.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            error = detail,
                            "upstream failing; answering 502/504 until it answers again"
                        );
                    }
                } else {
                    out.decision = "too_large";
                }
                own(problem(status, None, detail, None))
            }
        }
    }
}
