//! explain: "why was I limited?" for the admin listener: what the gateway would decide for an API
//! key and a request, with the state of every limit that applies, counting nothing. And the reset
//! of one key's counters.

use http::header::HOST;
use serde_json::{Value, json};

use quotagate_store::StoreError;

use super::Proxy;
use super::admission::{self, Action, Caller, Step};
use super::caller::{QueryKey, Source, Taken};
use super::jwt::{Checked, Verified};
use crate::catalog::{KeyDigest, KeyId};

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
    /// What a request `method path` of `caller` (its API key, or the digest the catalog knows
    /// it by) would get now, without counting it.
    pub async fn explain(
        &self,
        method: &str,
        path: &str,
        caller: Caller<'_>,
    ) -> Result<Value, ExplainError> {
        let mut head = http::Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, "admin");
        let mut taken = Taken::default();
        if let Caller::Key(key) = caller {
            // Sent as the first source takes it: admission finds it as it finds a request's.
            head = match &self.policy.key_sources.list()[0] {
                Source::Query(_) => {
                    taken.query = Some(QueryKey::Key(key.into()));
                    head
                }
                // A token stands for the key it was verified to give.
                Source::Jwt(_) => {
                    taken.token = Some(Checked(Ok(Verified {
                        key: key.into(),
                        until_s: u64::MAX,
                    })));
                    head.header(http::header::AUTHORIZATION, "Bearer checked")
                }
                Source::Header(name) => head.header(name, key),
                Source::Bearer => {
                    let mut value = b"Bearer ".to_vec();
                    value.extend_from_slice(key);
                    head.header(http::header::AUTHORIZATION, value)
                }
            };
        }
        let head = (head.body(()))
            .map_err(|source| ExplainError::NotARequest {
                method: method.to_owned(),
                path: path.to_owned(),
                source,
            })?
            .into_parts()
            .0;
        let catalog = self.catalog.is_ready().then(|| self.catalog.snapshot());
        let mut out = json!({
            "key": shown(caller),
            "method": method,
            "path": path,
        });
        let step = match caller {
            Caller::Key(_) => admission::admit(
                &head,
                taken.given(),
                &self.policy,
                catalog.as_deref(),
                std::net::Ipv4Addr::LOCALHOST.into(),
            ),
            Caller::Digest(_) => match admission::hold_as(
                &self.policy,
                catalog.as_deref(),
                method,
                head.uri.path(),
                Some(caller),
                || std::net::Ipv4Addr::LOCALHOST.into(),
            ) {
                Ok(held) => admission::counted_headless(&self.policy, held),
                Err(decided) => Step::Done(decided),
            },
        };
        match step {
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

    /// Forgets every counter of `caller`'s key; how many counters (memory) or minute hashes
    /// (Redis). A key the catalog does not know (any more) is named as its plain `key` would be.
    pub async fn reset_key(&self, caller: Caller<'_>) -> Result<u64, StoreError> {
        let id = self.key_id(caller);
        self.store.reset(&id.hex()).await
    }

    /// What `caller`'s counters are named by.
    fn key_id(&self, caller: Caller<'_>) -> KeyId {
        match caller {
            Caller::Digest(d) => d.id(),
            Caller::Key(key) => {
                let catalog = self.catalog.is_ready().then(|| self.catalog.snapshot());
                let found = catalog.and_then(|c| c.find(key));
                found.unwrap_or_else(|| KeyDigest::sha256(key).id())
            }
        }
    }
}

/// How an answer shows `caller`: its key's fingerprint (the first 48 bits of its SHA-256, as
/// the logs show it); asked by a digest, the digest's first 48 bits (for a `sha256:` digest, the
/// same fingerprint).
pub fn shown(caller: Caller<'_>) -> String {
    match caller {
        Caller::Key(key) => crate::observe::telemetry::fingerprint(key),
        Caller::Digest(d) => {
            let bits = d.0[..6].iter().fold(0, |n, b| n << 8 | u64::from(*b));
            crate::observe::telemetry::fingerprint_of(bits)
        }
    }
}
