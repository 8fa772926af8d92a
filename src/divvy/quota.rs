//! quota: the quota service behind the Divvy port: a `HIT`'s matching rules, each counted in its
//! fixed window in the shared store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use quotagate_engine::clock::Clock;
use quotagate_engine::limiter::Limit;
use quotagate_store::{CounterKey, Store, Verdict};

use super::metrics::{DivvyMetrics, Statsd};
use super::protocol::{ProtoError, Reply};
use super::rules::{MatchPolicy, Rule, RuleSet};

/// The quota service behind the port.
pub struct Divvy {
    pub rules: RuleSet,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    pub metrics: DivvyMetrics,
}

impl Divvy {
    /// The service; with `statsd`, metrics also go there.
    pub fn new(
        rules: RuleSet,
        store: Arc<Store>,
        clock: Arc<dyn Clock>,
        statsd: Option<Statsd>,
    ) -> Divvy {
        let labels = rules
            .rules()
            .iter()
            .map(|r| r.label.clone().unwrap_or_default())
            .collect();
        Divvy {
            rules,
            store,
            clock,
            metrics: DivvyMetrics::new(labels, statsd),
        }
    }

    /// Answers one `HIT`: every matching canary consumes its own quota, then the deciding rule
    /// answers.
    pub async fn hit(&self, operation: &HashMap<String, String>) -> Reply {
        let started = Instant::now();
        let now_ms = self.clock.now_ms();
        let mut reply = Reply::Err(ProtoError::Unknown("no rule matched".into()));
        for rule in self.rules.matching(operation) {
            reply = self.evaluate(rule, operation, now_ms).await;
            if let Reply::Ok { allowed, .. } = reply {
                self.metrics.hit(
                    rule.index,
                    rule.match_policy == MatchPolicy::Canary,
                    allowed,
                );
            }
        }
        if matches!(reply, Reply::Ok { .. }) {
            self.metrics.duration(started.elapsed());
        }
        reply
    }

    /// One rule's answer, from its fixed window. A refusal that no wait cures (a rule of 0
    /// credit) says `-1` for its reset, as the original Divvy does (`OK false 0 -1`); a rule of
    /// 0 seconds always allows (`OK true <credit> 0`), without a window.
    async fn evaluate(
        &self,
        rule: &Rule,
        operation: &HashMap<String, String>,
        now_ms: u64,
    ) -> Reply {
        let counter = CounterKey::divvy(&rule.bucket(), rule.actor(operation));
        let limit = Limit::fixed(rule.credit_limit, rule.reset_seconds);
        match self.store.hit(&counter, &[limit], 1, now_ms).await {
            Verdict::Decided(o) | Verdict::Local(o) => {
                let q = o.quotas()[0];
                let never = !o.allowed && q.retry_after.is_none();
                Reply::Ok {
                    allowed: o.allowed,
                    credit: q.remaining,
                    reset: match never {
                        true => -1,
                        false => i64::try_from(q.reset).unwrap_or(i64::MAX),
                    },
                }
            }
            Verdict::Open => Reply::Ok {
                allowed: true,
                credit: rule.credit_limit,
                reset: -1,
            },
            Verdict::Closed => Reply::Err(ProtoError::Unknown("quota store unavailable".into())),
        }
    }
}
