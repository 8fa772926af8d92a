//! admin: the operator's listener (loopback by default): `/metrics`, `/healthz`, `/readyz`.
//!
//! - `/healthz`: 200 while the process serves HTTP at all.
//! - `/readyz`: 200 when a catalog is loaded (the listeners are bound before this one starts), 503
//!   otherwise; the body says why, and says so when the shared store is down and the failure policy
//!   is being applied (still 200: the gateway answers, degraded).
//! - `/metrics`: Prometheus (OpenMetrics) text, see `docs/operations.md`.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;

use crate::catalog::live::Live;
use crate::metrics::Metrics;
use crate::store::{FailurePolicy, Store};

/// What the admin endpoints look at.
pub struct Admin {
    pub metrics: Arc<Metrics>,
    pub catalog: Arc<Live>,
    pub store: Arc<Store>,
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

impl Admin {
    /// The body and status of `/readyz`.
    pub fn readiness(&self) -> (StatusCode, String) {
        if !self.catalog.is_ready() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: no catalog loaded yet\n".into(),
            );
        }
        let version = self.catalog.snapshot().version.clone();
        let mut body = format!("ready: catalog {} {}\n", version.semver, version.hash);
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
            "/metrics" => text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.metrics.render(),
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
