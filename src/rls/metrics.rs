//! metrics: what the rate-limit service counts, per rule, with envoyproxy/ratelimit's names.
//!
//! `quotagate_rls_<stat>_total{domain, rule}` for stat in `total_hits`, `over_limit`,
//! `near_limit`, `within_limit`, `shadow_mode`, counted in hits (a call's `hits_addend`), as
//! envoyproxy/ratelimit counts them: `over_limit` for refused hits (a shadow rule's too, which also
//! count in `shadow_mode`), `within_limit` for the others, of which `near_limit` those that leave at
//! least 80% of the limit used. `rule` is the rule's path in its file (`edge.client`,
//! `edge.path_/api/*`): bounded by the rule files, whatever callers send. Only `detailed_metric`
//! (and `value_to_metric`) rules name the caller's values (`edge.client_a`), and those labels are
//! capped ([`MAX_DETAILED_LABELS`] in all; later values count under the rule's own path).
//! `quotagate_rls_rule_loads_total{outcome="applied"|"refused"}` counts rule-file reloads.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Distinct `rule` labels made from callers' values, at most. Default: 10,000.
pub const MAX_DETAILED_LABELS: usize = 10_000;
/// Share of the limit used from which a hit counts as near the limit (envoyproxy/ratelimit's
/// `NEAR_LIMIT_RATIO` default).
pub const NEAR_LIMIT_RATIO: f64 = 0.8;

const STATS: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub domain: String,
    pub rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoadLabels {
    outcome: &'static str,
}

/// The service's metrics.
#[derive(Debug, Default)]
pub struct RlsMetrics {
    stats: [Family<RuleLabels, Counter>; 5],
    loads: Family<LoadLabels, Counter>,
    detailed: Mutex<HashSet<RuleLabels>>,
}

/// One rule's counters (cheap to clone: they share their values).
#[derive(Debug, Clone, Default)]
pub struct RuleCounters([Counter; 5]);

/// What one descriptor's decision was, for its counters.
#[derive(Debug, Clone, Copy)]
pub struct Hit {
    /// Units the call asked for (0: a check).
    pub hits: u64,
    pub limit: u64,
    /// Units used in the window after this call.
    pub used: u64,
    /// The limit refused it (or would have, for a shadow rule).
    pub over: bool,
    pub shadow: bool,
}

impl RuleCounters {
    pub fn record(&self, h: Hit) {
        let [total, over, near, within, shadow] = &self.0;
        total.inc_by(h.hits);
        if h.over {
            over.inc_by(h.hits);
            if h.shadow {
                shadow.inc_by(h.hits);
            }
        } else {
            within.inc_by(h.hits);
            if h.limit > 0 && h.used as f64 >= NEAR_LIMIT_RATIO * h.limit as f64 {
                near.inc_by(h.hits);
            }
        }
    }
}

impl RlsMetrics {
    pub fn register(&self, registry: &mut Registry) {
        for (name, family) in STATS.iter().zip(&self.stats) {
            registry.register(
                format!("quotagate_rls_{name}"),
                format!("Hits of the rate-limit service's rules: {name}"),
                family.clone(),
            );
        }
        registry.register(
            "quotagate_rls_rule_loads",
            "Rule-file reloads of the rate-limit service, applied or refused",
            self.loads.clone(),
        );
    }

    /// The counters of rule `rule` (its path) in `domain`.
    pub fn rule(&self, domain: &str, rule: &str) -> RuleCounters {
        let labels = RuleLabels {
            domain: domain.to_owned(),
            rule: rule.to_owned(),
        };
        RuleCounters(std::array::from_fn(|i| {
            self.stats[i].get_or_create(&labels).clone()
        }))
    }

    /// The counters of a label made from a caller's values (`detailed_metric`), or `fallback`
    /// once [`MAX_DETAILED_LABELS`] such labels exist.
    pub fn detailed(&self, domain: &str, rule: String, fallback: &RuleCounters) -> RuleCounters {
        let labels = RuleLabels {
            domain: domain.to_owned(),
            rule,
        };
        let mut seen = self.detailed.lock().unwrap_or_else(|e| e.into_inner());
        if !seen.contains(&labels) {
            if seen.len() >= MAX_DETAILED_LABELS {
                return fallback.clone();
            }
            seen.insert(labels.clone());
        }
        drop(seen);
        RuleCounters(std::array::from_fn(|i| {
            self.stats[i].get_or_create(&labels).clone()
        }))
    }

    /// A rule set was read: applied or refused.
    pub fn loaded(&self, applied: bool) {
        let outcome = if applied { "applied" } else { "refused" };
        self.loads.get_or_create(&LoadLabels { outcome }).inc();
    }

    /// Reloads so far: (applied, refused).
    pub fn loads(&self) -> (u64, u64) {
        let get = |outcome| self.loads.get_or_create(&LoadLabels { outcome }).get();
        (get("applied"), get("refused"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_count_as_envoyproxy_ratelimit_counts_them() {
        let m = RlsMetrics::default();
        let c = m.rule("d", "d.k");
        let hit = |hits, used, over, shadow| Hit {
            hits,
            limit: 10,
            used,
            over,
            shadow,
        };
        c.record(hit(2, 2, false, false));
        c.record(hit(1, 8, false, false)); // near: 80% used
        c.record(hit(3, 8, true, false));
        c.record(hit(1, 11, true, true));
        let got: Vec<u64> = c.0.iter().map(Counter::get).collect();
        assert_eq!(got, [7, 4, 1, 3, 1]);
    }

    #[test]
    fn labels_from_callers_values_are_capped() {
        let m = RlsMetrics::default();
        let own = m.rule("d", "d.k");
        for i in 0..MAX_DETAILED_LABELS + 5 {
            m.detailed("d", format!("d.k_{i}"), &own).0[0].inc();
        }
        assert_eq!(own.0[0].get(), 5);
        assert_eq!(m.detailed.lock().unwrap().len(), MAX_DETAILED_LABELS);
    }
}
