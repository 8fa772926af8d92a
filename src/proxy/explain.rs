//! explain: "why was I limited?" for the admin listener: what the gateway would decide for an API
//! key and a request, with the state of every limit that applies, counting nothing. And the reset
//! of one key's counters.

use http::header::HOST;
use serde_json::{Value, json};

use quotagate_store::StoreError;

use super::Proxy;
use super::admission::{self, Action, Step};

/// Why "why was I limited?" could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The method or path cannot be a request's (the asker's mistake).
    #[error("{method} {path} is not a request: {source}")]
    NotARequest {
        method: String,
        path: String,
        source: http::Error,
    },
    /// The store could not be read.
    #[error("the store cannot tell: {0}")]
    Store(#[from] StoreError),
}

impl Proxy {
    /// What a request `method path` with `api_key` would get now, without counting it.
    pub async fn explain(
        &self,
        method: &str,
        path: &str,
        api_key: &[u8],
    ) -> Result<Value, ExplainError> {
        let head = http::Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, "admin")
            .header(&self.policy.api_key_header, api_key)
            .body(())
            .map_err(|source| ExplainError::NotARequest {
                method: method.to_owned(),
                path: path.to_owned(),
                source,
            })?
            .into_parts()
            .0;
        let catalog = self.catalog.is_ready().then(|| self.catalog.snapshot());
        let mut out = json!({
            "key": crate::observe::telemetry::fingerprint(api_key),
            "method": method,
            "path": path,
        });
        match admission::admit(
            &head,
            &self.policy,
            catalog.as_deref(),
            std::net::Ipv4Addr::LOCALHOST.into(),
        ) {
            Step::Done(a) => {
                out["decision"] = a.decision.as_str().into();
                out["endpoint"] = a.endpoint.map(|e| e.name.clone()).into();
                out["limits"] = json!([]);
                if let Action::Reject(r) = a.action {
                    out["status"] = r.status.as_u16().into();
                    out["detail"] = r.detail.into();
                }
            }
            Step::Count(pending) => {
                let now_ms = self.clock.now_ms();
                let counter = pending.counter();
                let pools = pending.held.pool_counters(&pending.limits);
                let parts = quotagate_store::Part::split(&counter, &pending.limits, &pools);
                let o = self.store.peek_parts(&parts, pending.cost, now_ms).await?;
                let decision = if o.allowed { "allowed" } else { "limited" };
                out["decision"] = decision.into();
                out["endpoint"] = pending.held.endpoint.name.clone().into();
                out["cost"] = pending.cost.into();
                out["limits"] = pending
                    .limits
                    .iter()
                    .zip(o.quotas())
                    .enumerate()
                    .map(|(i, (l, q))| {
                        let mut about = json!({
                            "window_seconds": l.seconds_at(now_ms),
                            "shadow": l.shadow,
                            "limit": q.limit,
                            "remaining": q.remaining,
                            "reset_seconds": q.reset,
                            "retry_after_seconds": q.retry_after,
                            "next_request": if q.allowed { "allowed" } else { "limited" },
                        });
                        if let Some(p) = l.period() {
                            about["period"] = p.as_str().into();
                            about["tz"] = l.zone.name().into();
                        }
                        if l.is_concurrent() {
                            // Requests in flight at once, not per window.
                            about["concurrent"] = true.into();
                        }
                        if let Some(group) = pending.limits.pool_of(i) {
                            about["pool"] = group.into();
                        }
                        about
                    })
                    .collect::<Vec<_>>()
                    .into();
            }
        }
        Ok(out)
    }

    /// Forgets every counter of `api_key`; how many counters (memory) or minute hashes (Redis).
    pub async fn reset_key(&self, api_key: &[u8]) -> Result<u64, StoreError> {
        self.store.reset(api_key).await
    }
}
