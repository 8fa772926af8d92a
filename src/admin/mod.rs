//! admin: the operator's listener (loopback by default): `/metrics`, `/healthz`, `/readyz`, the
//! dashboard (`/`), `/status` and `/status/history` (its plots' points).
//!
//! - `/healthz`: 200 while the process serves HTTP at all.
//! - `/readyz`: 200 when a catalog is loaded (the listeners are bound before this one starts), 503
//!   otherwise; the body says why, and says so when the shared store is down and the failure policy
//!   is being applied (still 200: the gateway answers, degraded).
//! - `/metrics`: Prometheus (OpenMetrics) text, see `docs/operations.md`. The `quotagate divvy`
//!   drop-in serves it on Divvy's `PROMETHEUS_METRICS_PATH` instead.
//! - `GET /limits?method=M&path=P`, the API key in its usual header (or its digest as
//!   `&key_digest=sha256:...`): what the gateway would decide for that request now and the state
//!   of its limit, counting nothing ("why was I limited?").
//! - `POST /limits/reset`, the API key in its usual header (or `?key_digest=`): forgets that key's
//!   counters. Allowed
//!   without more on a loopback listener; on any other, only with `admin.secret` in
//!   `X-Quotagate-Admin-Secret`.

pub mod status;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::server::RequestBody;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;

use crate::catalog::live::Live;
use crate::config::{AdminConfig, ConfigError, address};
use crate::observe::metrics::{CatalogLabels, Metrics, PolicyLabels, State};
use crate::proxy::Proxy;
use crate::proxy::admission::Caller;
use crate::proxy::caller::{Found, Given, QueryKey};
use crate::proxy::explain::ExplainError;
use quotagate_store::{FailurePolicy, Store};

/// The admin listener's settings (`[admin]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminSettings {
    pub listen: SocketAddr,
    /// Where the metrics are served. Default: `/metrics`.
    pub metrics_path: String,
    /// Needed (in `X-Quotagate-Admin-Secret`) to reset counters through a non-loopback listener.
    pub secret: Option<Vec<u8>>,
}

/// The header that carries `admin.secret`.
pub const SECRET_HEADER: &str = "x-quotagate-admin-secret";

impl TryFrom<&AdminConfig> for AdminSettings {
    type Error = ConfigError;

    fn try_from(c: &AdminConfig) -> Result<Self, ConfigError> {
        Ok(AdminSettings {
            listen: address("admin.listen", &c.listen, "127.0.0.1:8081")?,
            metrics_path: "/metrics".into(),
            secret: (!c.secret.is_empty()).then(|| c.secret.clone().into_bytes()),
        })
    }
}

/// What the admin endpoints look at.
pub struct Admin {
    metrics: Arc<Metrics>,
    /// The gateway's catalog; `None` when only the Divvy port runs.
    catalog: Option<Arc<Live>>,
    store: Arc<Store>,
    /// The gateway's request path, for `/limits`; `None` when only the Divvy port runs.
    proxy: Option<Arc<Proxy>>,
    settings: AdminSettings,
    /// The effective configuration, secrets shown as `***` (`/status`).
    config: serde_json::Value,
    /// The parts this process runs (`/status`: the dashboard shows those).
    parts: Parts,
    /// The dashboard's plots (`/status/history`), sampled by [`Admin::sample`].
    history: std::sync::Mutex<crate::observe::history::History>,
}

/// The parts a process runs, as `/status` tells them.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Parts {
    /// The HTTP gateway (catalog, endpoints, upstream).
    pub gateway: bool,
    /// The Divvy port.
    pub divvy: bool,
    /// The Envoy rate-limit service.
    pub rls: bool,
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

impl Admin {
    pub fn new(
        metrics: Arc<Metrics>,
        store: Arc<Store>,
        proxy: Option<Arc<Proxy>>,
        settings: AdminSettings,
        config: serde_json::Value,
        parts: Parts,
    ) -> Admin {
        Admin {
            metrics,
            catalog: proxy.as_ref().map(|p| p.catalog().clone()),
            store,
            proxy,
            settings,
            config,
            parts,
            history: Default::default(),
        }
    }

    /// Adds a point to the dashboard's history: call every [`crate::observe::history::INTERVAL_MS`].
    pub fn sample(&self) {
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let samples = crate::admin::status::parse_samples(&self.metrics.render(&self.state()));
        let mut r = crate::admin::status::reading(&samples, at_ms);
        if let Some(s) = self.store.stats() {
            let local = (s.decided_by_lease.get() + s.decided_by_block.get()) as f64;
            r.decisions = (local, local + s.decided_by_redis.get() as f64);
        }
        if let Some(p) = &self.proxy {
            r.targets = p.upstream().targets_up();
        }
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(r);
    }

    /// `GET /status/history[?since=MS]`.
    fn history(&self, req: &Request<RequestBody>) -> serde_json::Value {
        let since = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .find(|(k, _)| k == "since")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .to_json(since)
    }

    /// The body and status of `/readyz`.
    pub fn readiness(&self) -> (StatusCode, String) {
        let mut body = match &self.catalog {
            Some(c) if !c.is_ready() => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: no catalog loaded yet\n".into(),
                );
            }
            Some(c) => {
                let version = c.snapshot().version.clone();
                format!("ready: catalog {} {}\n", version.semver, version.hash)
            }
            None => "ready\n".to_owned(),
        };
        if self.store.is_degraded() {
            let meaning = policy_meaning(self.store.policy());
            let what = match self.store.shared() {
                Some(_) => format!("the {} store is unreachable", self.store.kind()),
                None => "store.path cannot be written".to_owned(),
            };
            body.push_str(&format!(
                "degraded: {what}; failure policy {} applies ({meaning})\n",
                self.store.policy().as_str()
            ));
        }
        (StatusCode::OK, body)
    }

    pub async fn handle(
        self: Arc<Self>,
        _peer: SocketAddr,
        req: Request<RequestBody>,
    ) -> Response<Full<Bytes>> {
        if req.uri().path().starts_with("/limits") {
            return self.limits(&req).await;
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "GET only\n".into(),
            );
        }
        match req.uri().path() {
            "/" if self.proxy.is_some() => text(
                StatusCode::OK,
                "text/html; charset=utf-8",
                DASHBOARD.to_owned(),
            ),
            "/status" => json(StatusCode::OK, self.status()),
            "/status/history" if self.proxy.is_some() => json(StatusCode::OK, self.history(&req)),
            p if p == self.settings.metrics_path => text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.metrics.render(&self.state()),
            ),
            // `/healthcheck`: envoyproxy/ratelimit's path, for `quotagate ratelimit`'s probes.
            "/healthz" | "/healthcheck" => text(StatusCode::OK, "text/plain", "ok\n".into()),
            "/readyz" => {
                let (status, body) = self.readiness();
                text(status, "text/plain", body)
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "text/plain",
                "try /, /status, /status/history, /metrics, /healthz, /readyz or /limits\n".into(),
            ),
        }
    }
}

/// The dashboard: one self-contained page (no external scripts, fonts or styles) that reads
/// `/status` every two seconds.
const DASHBOARD: &str = include_str!("dashboard.html");

fn json(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    text(status, "application/json", body.to_string())
}

fn refusal(status: StatusCode, error: &str) -> Response<Full<Bytes>> {
    json(status, serde_json::json!({ "error": error }))
}

impl Admin {
    /// `GET /limits` and `POST /limits/reset`.
    async fn limits(&self, req: &Request<RequestBody>) -> Response<Full<Bytes>> {
        let Some(proxy) = &self.proxy else {
            return refusal(StatusCode::NOT_FOUND, "no gateway runs here");
        };
        let sources = proxy.key_sources();
        let query = req.uri().query().unwrap_or("");
        let mut method = None;
        let mut path = None;
        let mut digest = None;
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match &*k {
                "method" => method = Some(v.into_owned()),
                "path" => path = Some(v.into_owned()),
                "key_digest" => digest = Some(v.into_owned()),
                _ => {}
            }
        }
        // The caller is found as the proxy finds it (`limits.api_key_from`).
        let said = sources.said();
        let in_query = sources
            .query()
            .and_then(|name| QueryKey::in_query(query, name));
        let token = proxy.check_token(req.headers(), in_query.as_ref()).await;
        let given = Given {
            query: in_query.as_ref(),
            token: token.as_ref(),
        };
        let claim = sources.jwt_claim().unwrap_or_default();
        let caller = match (sources.find_in(req.headers(), given), digest) {
            (Found::Refused(why), _) => {
                let status = match why {
                    crate::proxy::jwt::Refusal::NoKeys => StatusCode::SERVICE_UNAVAILABLE,
                    _ => StatusCode::UNAUTHORIZED,
                };
                return refusal(status, &why.why(&claim));
            }
            (Found::Key(k), None) => Caller::Key(k),
            (Found::Absent | Found::Empty, Some(d)) => match crate::catalog::KeyDigest::parse(&d) {
                Ok((_, d)) => Caller::Digest(d),
                Err(e) => return refusal(StatusCode::BAD_REQUEST, &format!("key_digest: {e}")),
            },
            (Found::Key(_), Some(_)) => {
                return refusal(
                    StatusCode::BAD_REQUEST,
                    &format!("send the API key in {said} or its ?key_digest=, not both"),
                );
            }
            (Found::Twice, _) => {
                return refusal(
                    StatusCode::BAD_REQUEST,
                    &format!("send the API key once, in {said}"),
                );
            }
            (Found::Absent | Found::Empty, None) => {
                return refusal(
                    StatusCode::BAD_REQUEST,
                    &format!("send the API key in {said}, or its digest as ?key_digest="),
                );
            }
        };
        match (req.method(), req.uri().path()) {
            (&Method::GET, "/limits") => {
                let (Some(method), Some(path)) = (method, path) else {
                    return refusal(
                        StatusCode::BAD_REQUEST,
                        "give the request as ?method=GET&path=/users/42",
                    );
                };
                match proxy.explain(&method, &path, caller).await {
                    Ok(v) => json(StatusCode::OK, v),
                    Err(e @ ExplainError::NotARequest { .. }) => {
                        refusal(StatusCode::BAD_REQUEST, &e.to_string())
                    }
                    Err(e @ ExplainError::Store(_)) => {
                        refusal(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
                    }
                }
            }
            (&Method::POST, "/limits/reset") => {
                if let Some(refused) = self.may_change_state(req) {
                    return refused;
                }
                match proxy.reset_key(caller).await {
                    Ok(n) => json(
                        StatusCode::OK,
                        serde_json::json!({
                            "key": crate::proxy::explain::shown(caller),
                            "removed": n,
                        }),
                    ),
                    Err(e) => refusal(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &format!("the store could not reset the counters: {e}"),
                    ),
                }
            }
            _ => refusal(
                StatusCode::METHOD_NOT_ALLOWED,
                "GET /limits?method=..&path=.. or POST /limits/reset",
            ),
        }
    }

    /// `None` when this request may change state: the listener is on loopback, or it carries the
    /// configured secret.
    fn may_change_state(&self, req: &Request<RequestBody>) -> Option<Response<Full<Bytes>>> {
        if self.settings.listen.ip().is_loopback() {
            return None;
        }
        let Some(secret) = &self.settings.secret else {
            return Some(refusal(
                StatusCode::FORBIDDEN,
                "this admin listener is not on loopback: set admin.secret to allow counter resets",
            ));
        };
        let given = req
            .headers()
            .get(SECRET_HEADER)
            .map_or(&b""[..], |v| v.as_bytes());
        match bool::from(subtle::ConstantTimeEq::ct_eq(given, secret.as_slice())) {
            true => None,
            false => Some(refusal(
                StatusCode::FORBIDDEN,
                &format!("send admin.secret in the {SECRET_HEADER} header"),
            )),
        }
    }

    /// `GET /status`: see `docs/operations.md`.
    fn status(&self) -> serde_json::Value {
        let state = self.state();
        let samples = crate::admin::status::parse_samples(&self.metrics.render(&state));
        let mut out = crate::admin::status::traffic(&samples);
        out["version"] = env!("CARGO_PKG_VERSION").into();
        out["config"] = self.config.clone();
        out["parts"] = serde_json::to_value(self.parts).unwrap_or_default();
        out["store"] = serde_json::json!({
            "kind": self.store.kind(),
            "policy": self.store.policy().as_str(),
            "degraded": self.store.is_degraded(),
            "errors": self.store.errors.get(),
        });
        if let Some(s) = self.store.stats() {
            let (lease, block, redis) = (
                s.decided_by_lease.get(),
                s.decided_by_block.get(),
                s.decided_by_redis.get(),
            );
            let all = lease + block + redis;
            out["store"]["decisions"] = serde_json::json!({
                "lease": lease,
                "block": block,
                "redis": redis,
                "local_share": if all == 0 { 0.0 } else { (lease + block) as f64 / all as f64 },
            });
            out["store"]["leases"] = serde_json::json!({
                "taken": s.leases.get(),
                "units_leased": s.units_leased.get(),
                "units_used": s.units_used.get(),
                "units_given_back": s.units_given_back.get(),
            });
        }
        out["catalog"] = match &self.catalog {
            None => serde_json::Value::Null,
            Some(live) => {
                let snapshot = live.snapshot();
                let poll = live
                    .status
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                serde_json::json!({
                    "ready": live.is_ready(),
                    "semver": snapshot.version.semver,
                    "hash": snapshot.version.hash,
                    "age_seconds": state.catalog_age_seconds,
                    "endpoints": snapshot.endpoints().len(),
                    "keys": snapshot.key_count(),
                    "poller": {
                        "polls": poll.polls,
                        "failures": poll.failures,
                        "last_outcome": poll.last_outcome,
                        "last_poll_seconds_ago": poll.last_poll.map(|t| t.elapsed().as_secs_f64()),
                    },
                })
            }
        };
        if let Some(p) = &self.proxy {
            out["upstream"]["failing"] = p.upstream_failing().into();
            out["upstream"]["targets"] = p.upstream().status();
            out["top_limited"] = p
                .most_limited(crate::observe::top::SHOWN)
                .into_iter()
                .map(|l| {
                    serde_json::json!({
                        "key": crate::observe::telemetry::fingerprint_of(l.key),
                        "limited": l.limited,
                        "over_by_at_most": l.over_by_at_most,
                        "endpoint": l.endpoint,
                    })
                })
                .collect();
        }
        out
    }

    /// The states `/metrics` reports.
    fn state(&self) -> State {
        let mut state = State {
            store: Some(PolicyLabels {
                kind: self.store.kind(),
                policy: self.store.policy().as_str(),
            }),
            store_degraded: self.store.is_degraded(),
            ..State::default()
        };
        if let Some(live) = self.catalog.as_ref().filter(|l| l.is_ready()) {
            let version = live.snapshot().version.clone();
            state.catalog = Some(CatalogLabels {
                hash: version.hash,
                semver: version.semver,
            });
            let applied = live
                .status
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .applied_at;
            state.catalog_age_seconds = applied.map_or(0.0, |t| t.elapsed().as_secs_f64());
        }
        state
    }
}

/// What a failure policy does, for people reading `/readyz`.
fn policy_meaning(policy: FailurePolicy) -> &'static str {
    match policy {
        FailurePolicy::Local => "limits enforced per instance",
        FailurePolicy::Open => "requests pass unlimited",
        FailurePolicy::Closed => "limited requests are refused with 503",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_is_described_as_itself() {
        assert_eq!(
            policy_meaning(FailurePolicy::Closed),
            "limited requests are refused with 503"
        );
        assert_eq!(
            policy_meaning(FailurePolicy::Open),
            "requests pass unlimited"
        );
        assert_eq!(
            policy_meaning(FailurePolicy::Local),
            "limits enforced per instance"
        );
    }
}
