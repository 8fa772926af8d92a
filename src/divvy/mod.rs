//! divvy: the Divvy-compatible quota port. Services that do not sit behind the proxy ask for quota
//! with `HIT key=value ...` lines over TCP and get `OK <allowed> <credit> <resetSeconds>`.
//!
//! - [`protocol`]: parsing and formatting lines (pure).
//! - [`rules`]: rule files and which rules a request matches (pure).
//! - [`server`]: the TCP server: framing, ordering, limits.
//!
//! Counting is Divvy's fixed window from the first hit, in the shared [`Store`] (memory or Redis,
//! with Divvy's own Redis keys), under the same failure policy as the gateway.

pub mod dropin;
pub mod load;
pub mod metrics;
pub mod protocol;
pub mod rules;
pub mod server;

use std::collections::HashMap;
use std::sync::Arc;

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::{ConfigError, DivvyConfig, address};
use crate::store::{Store, Verdict};
use metrics::{DivvyMetrics, Statsd, StatsdSettings};
use protocol::{ProtoError, Reply};
use quotagate_engine::clock::Clock;
use rules::{MatchPolicy, Rule, RuleSet};
use server::DivvySettings;
use std::time::Instant;

/// The Divvy port's settings, checked.
#[derive(Debug, Clone)]
pub struct DivvyPortSettings {
    /// `divvy.listen`.
    pub listen: SocketAddr,
    /// The rule file (`divvy.rules`), read when the application is built.
    pub rules: PathBuf,
    pub limits: DivvySettings,
    /// Divvy's statsd metrics, from its `STATSD_*` variables.
    pub statsd: Option<StatsdSettings>,
}

impl DivvyPortSettings {
    /// `[divvy]`; `env` gives the `STATSD_*` variables.
    pub fn new(c: &DivvyConfig, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Ok(DivvyPortSettings {
            listen: address("divvy.listen", &c.listen, "127.0.0.1:8321")?,
            rules: PathBuf::from(&c.rules),
            limits: DivvySettings::try_from(c)?,
            statsd: StatsdSettings::from_env(env),
        })
    }
}

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
        let now = self.clock.now();
        let mut reply = Reply::Err(ProtoError::Unknown("no rule matched".into()));
        for rule in self.rules.matching(operation) {
            reply = self.evaluate(rule, operation, now).await;
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

    async fn evaluate(&self, rule: &Rule, operation: &HashMap<String, String>, now: u64) -> Reply {
        if rule.credit_limit == 0 {
            return Reply::Ok {
                allowed: false,
                credit: 0,
                reset: -1,
            };
        }
        if rule.reset_seconds == 0 {
            return Reply::Ok {
                allowed: true,
                credit: rule.credit_limit,
                reset: 0,
            };
        }
        let key = format!(
            "divvy:{}:{}:{}:{}",
            rule.bucket(),
            rule.actor(operation),
            rule.credit_limit,
            rule.reset_seconds
        );
        match self
            .store
            .check_fixed(&key, rule.credit_limit, rule.reset_seconds, now)
            .await
        {
            Verdict::Decided(d) | Verdict::Local(d) => Reply::Ok {
                allowed: d.allowed,
                credit: d.credit,
                reset: d.reset,
            },
            Verdict::Open => Reply::Ok {
                allowed: true,
                credit: rule.credit_limit,
                reset: -1,
            },
            Verdict::Closed => Reply::Err(ProtoError::Unknown("quota store unavailable".into())),
        }
    }
}
