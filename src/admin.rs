//! admin: the operator's listener (loopback by default): `/metrics`, `/healthz`, `/readyz`.
//!
//! - `/healthz`: 200 while the process serves HTTP at all.
//! - `/readyz`: 200 when a catalog is loaded (the listeners are bound before this one starts), 503
//!   otherwise; the body says why, and says so when the shared store is down and the failure policy
//!   is being applied (still 200: the gateway answers, degraded).
//! - `/metrics`: Prometheus (OpenMetrics) text, see `docs/operations.md`. The `quotagate divvy`
//!   drop-in serves it on Divvy's `PROMETHEUS_METRICS_PATH` instead.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;

use crate::catalog::live::Live;
use crate::config::{AdminConfig, ConfigError, address};
use crate::metrics::{CatalogLabels, Metrics, PolicyLabels, State};
use crate::store::{FailurePolicy, Store};

/// The admin listener's settings (`[admin]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminSettings {
    pub listen: SocketAddr,
    /// Where the metrics are served. Default: `/metrics`.
    pub metrics_path: String,
}

impl TryFrom<&AdminConfig> for AdminSettings {
    type Error = ConfigError;

    fn try_from(c: &AdminConfig) -> Result<Self, ConfigError> {
        Ok(AdminSettings {
            listen: address("admin.listen", &c.listen, "127.0.0.1:8081")?,
            metrics_path: "/metrics".into(),
        })
    }
}

/// What the admin endpoints look at.
pub struct Admin {
    metrics: Arc<Metrics>,
    /// The gateway's catalog; `None` when only the Divvy port runs.
    catalog: Option<Arc<Live>>,
    store: Arc<Store>,
    metrics_path: String,
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
        catalog: Option<Arc<Live>>,
        store: Arc<Store>,
        metrics_path: String,
    ) -> Admin {
        Admin {
            metrics,
            catalog,
            store,
            metrics_path,
        }
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
            body.push_str(&format!(
                "degraded: the {} store is unreachable; failure policy {} applies ({meaning})\n",
                self.store.kind(),
                self.store.policy().as_str()
            ));
        }
        (StatusCode::OK, body)
    }

    pub async fn handle(
        self: Arc<Self>,
        _peer: SocketAddr,
        req: Request<Incoming>,
    ) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "GET only\n".into(),
            );
        }
        match req.uri().path() {
            p if p == self.metrics_path => text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.metrics.render(&self.state()),
            ),
            "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
            "/readyz" => {
                let (status, body) = self.readiness();
                text(status, "text/plain", body)
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "text/plain",
                "try /metrics, /healthz or /readyz\n".into(),
            ),
        }
    }
}

impl Admin {
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
