//! service: one `ShouldRateLimit` call, decided on quotagate's counters. No gRPC here: the
//! server hands a decoded request in and sends back what comes out.
//!
//! Per descriptor: a domain's rule (or the descriptor's own `limit` override, which wins) gives a
//! limit of `requests_per_unit` per unit, enforced as a sliding window of the unit's length in the
//! shared store, on a counter named by the domain and the descriptor's entries. In the catalog
//! domain, a descriptor with `api_key`, `method` and `path` entries is decided by the gateway's
//! catalog on the gateway's own counter for that key and endpoint. Each descriptor is decided on
//! its own counter (several counters are not one atomic step): a descriptor with room is counted
//! even when another one of the same request is over its limit, unless
//! `rls.stop_counting_when_over_limit` gives its hits back then.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures_util::future::join_all;
use http::HeaderMap;

use super::metrics::{Hit, RlsMetrics, RuleCounters};
use super::proto::{self, Code, DescriptorStatus, RateLimitRequest, RateLimitResponse};
use super::rules::{RuleSet, Unit};
use crate::catalog::live::Live;
use crate::config::{HeaderSet, WindowKind};
use crate::proxy::admission;
use crate::proxy::headers::set_rate_limit;
use crate::proxy::settings::Policy;
use quotagate_engine::clock::Clock;
use quotagate_engine::limiter::{Limit, Limits, Outcome, Quota, Rate};
use quotagate_store::{CounterKey, Store, Verdict};

/// The service's settings (`[rls]`), checked.
#[derive(Debug, Clone)]
pub struct RlsPolicy {
    /// `rls.catalog_domain`: the domain decided by the gateway's catalog.
    pub catalog_domain: String,
    /// `rls.response_headers`: send the RateLimit header fields for Envoy to add.
    pub response_headers: bool,
    /// `rls.shadow_mode`: the overall code is always OK.
    pub shadow_mode: bool,
    /// `rls.window`: rules' limits as sliding windows, or fixed windows aligned to the clock.
    pub window: WindowKind,
    /// `rls.stop_counting_when_over_limit`: a request with a descriptor over its limit is not
    /// counted in its other descriptors (envoyproxy/ratelimit's
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`). Sliding windows only.
    pub stop_counting_when_over_limit: bool,
    /// `rls.merge_domains`: a domain's descriptors may be spread over several files
    /// (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
    /// `rls.response_dynamic_metadata`: answers carry `dynamic_metadata`
    /// ([`dynamic_metadata`]).
    pub response_dynamic_metadata: bool,
}

/// What the catalog domain decides by: the gateway's live catalog and its admission policy.
#[derive(Clone)]
pub struct CatalogDomain {
    pub live: Arc<Live>,
    pub policy: Policy,
}

/// The rate-limit service behind the gRPC port.
pub struct Rls {
    rules: ArcSwap<Loaded>,
    pub metrics: RlsMetrics,
    store: Arc<Store>,
    clock: Arc<dyn Clock>,
    /// The gateway's live catalog and policy, for the catalog domain (`None`: no gateway in this
    /// process).
    catalog: Option<CatalogDomain>,
    policy: RlsPolicy,
}

impl Loaded {
    fn new(rules: RuleSet, metrics: &RlsMetrics) -> Loaded {
        let mut counters = HashMap::new();
        let mut overrides = HashMap::new();
        for (domain, rule) in rules.rules() {
            counters.insert(rule.path.clone(), metrics.rule(domain, &rule.path));
            overrides
                .entry(domain.to_owned())
                .or_insert_with(|| metrics.rule(domain, &format!("{domain}._override")));
        }
        Loaded {
            rules,
            counters,
            overrides,
        }
    }
}

/// A request the service cannot decide: INVALID_ARGUMENT, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

/// What one descriptor asks, checked.
struct Ask<'r> {
    entries: Vec<(&'r str, &'r str)>,
    /// Units to count; 0: check without counting.
    cost: u64,
    override_limit: Option<(u32, Unit)>,
}

/// How one descriptor is decided.
enum Plan {
    /// No limit applies (unknown domain, no rule, replaced): OK, no `current_limit`.
    Free,
    /// `unlimited`: OK with all the room there is.
    Unlimited,
    /// Counted against `limits` on `counter`, the last ones in `pools` (each pool's counter and
    /// number of limits: the catalog domain's pools).
    Count {
        counter: CounterKey,
        pools: Vec<(CounterKey, usize)>,
        limits: Vec<Limit>,
        /// For `current_limit`: the rule's name, its number and unit (the first limit's).
        name: String,
        shown: (u32, proto::Unit),
        /// Named by a rule (`replaces` can remove it).
        rule_name: Option<String>,
        replaces: Vec<String>,
        stats: RuleCounters,
        /// The rule's `metadata` (`rls.response_dynamic_metadata`).
        metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    },
}

/// The rules in service, with each rule's counters (by its path).
pub struct Loaded {
    pub rules: RuleSet,
    counters: HashMap<String, RuleCounters>,
    /// For descriptors decided by their own `limit` override, per domain.
    overrides: HashMap<String, RuleCounters>,
}

impl Rls {
    pub fn new(
        rules: RuleSet,
        store: Arc<Store>,
        clock: Arc<dyn Clock>,
        catalog: Option<CatalogDomain>,
        policy: RlsPolicy,
        metrics: RlsMetrics,
    ) -> Rls {
        Rls {
            rules: ArcSwap::from_pointee(Loaded::new(rules, &metrics)),
            metrics,
            store,
            clock,
            catalog,
            policy,
        }
    }

    /// Whether a domain's rules may be spread over several files (`rls.merge_domains`).
    pub fn merges_domains(&self) -> bool {
        self.policy.merge_domains
    }

    /// Puts `rules` in service.
    pub fn apply(&self, rules: RuleSet) {
        self.rules
            .store(Arc::new(Loaded::new(rules, &self.metrics)));
    }

    /// Decides one request. `Err`: it is malformed (INVALID_ARGUMENT).
    pub async fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Invalid> {
        let (domain, asks) = check_request(req)?;
        let loaded = self.rules.load();
        let mut plans: Vec<Plan> = asks.iter().map(|a| self.plan(&loaded, domain, a)).collect();
        replace(&mut plans);
        let now_ms = self.clock.now_ms();
        let mut decided = join_all(plans.iter().zip(&asks).map(|(plan, ask)| async move {
            match plan {
                Plan::Count {
                    counter,
                    limits,
                    pools,
                    ..
                } => Some(
                    (self.store)
                        .hit_pooled(counter, limits, pools, ask.cost, now_ms)
                        .await,
                ),
                _ => None,
            }
        }))
        .await;
        if self.policy.stop_counting_when_over_limit {
            // Boxed: held inline, its state would enlarge every call's future, moved (copied)
            // as the call is polled, option on or off (~1% of a call's instructions).
            Box::pin(self.give_back_when_over(&plans, &asks, &mut decided, now_ms)).await;
        }
        let mut response = self.respond(&plans, &asks, decided, now_ms);
        if self.policy.response_dynamic_metadata {
            response.dynamic_metadata = Some(dynamic_metadata(req, &plans, &response.statuses));
        }
        Ok(response)
    }

    /// `rls.stop_counting_when_over_limit`: when a descriptor of the request is over its limit
    /// (or a shadow limit of its rule would refuse it), the hits the others were counted are
    /// given back, and their statuses say what remains without them. Counted and given back
    /// (the descriptors are counted at once, on counters apart), so another call in between
    /// may see them; envoyproxy/ratelimit reads the counters first, with the same window.
    async fn give_back_when_over(
        &self,
        plans: &[Plan],
        asks: &[Ask<'_>],
        decided: &mut [Option<Verdict>],
        now_ms: u64,
    ) {
        let over = |v: &Option<Verdict>| match v {
            Some(Verdict::Decided(o) | Verdict::Local(o)) => !o.allowed || o.shadow_limited,
            Some(Verdict::Closed) => true,
            _ => false,
        };
        if !decided.iter().any(over) {
            return;
        }
        for ((plan, ask), verdict) in plans.iter().zip(asks).zip(decided.iter_mut()) {
            let (
                Plan::Count {
                    counter,
                    limits,
                    pools,
                    ..
                },
                Some(Verdict::Decided(o) | Verdict::Local(o)),
            ) = (plan, verdict.as_mut())
            else {
                continue;
            };
            if !o.allowed || o.shadow_limited || ask.cost == 0 {
                continue;
            }
            let parts = quotagate_store::Part::split(counter, limits, pools);
            let cost = i64::try_from(ask.cost).unwrap_or(i64::MAX);
            self.store.adjust(&parts, -cost, now_ms, now_ms).await;
            let quotas: Vec<Quota> = o
                .quotas()
                .iter()
                .map(|q| Quota {
                    remaining: (q.remaining + ask.cost).min(q.limit),
                    ..*q
                })
                .collect();
            *o = Outcome::new(true, false, &quotas);
        }
    }

    /// Which limit one descriptor is held to.
    fn plan(&self, loaded: &Loaded, domain: &str, ask: &Ask<'_>) -> Plan {
        let rules = &loaded.rules;
        if domain == self.policy.catalog_domain
            && let Some(plan) = self.catalog_plan(ask)
        {
            return plan;
        }
        let known = rules.domain(domain);
        if known.is_none() && domain != self.policy.catalog_domain {
            return Plan::Free;
        }
        let counter = CounterKey::descriptor(domain, ask.entries.iter().copied());
        if let Some((n, unit)) = ask.override_limit {
            return Plan::Count {
                counter,
                pools: Vec::new(),
                limits: vec![self.limit(n, unit, false)],
                name: String::new(),
                shown: (n, unit.proto()),
                rule_name: None,
                replaces: Vec::new(),
                metadata: None,
                stats: loaded
                    .overrides
                    .get(domain)
                    .cloned()
                    .unwrap_or_else(|| self.metrics.rule(domain, &format!("{domain}._override"))),
            };
        }
        let Some(found) = known.and_then(|d| d.find(&ask.entries)) else {
            return Plan::Free;
        };
        let rule = found.rule;
        let Some((n, unit)) = rule.limit else {
            return Plan::Unlimited;
        };
        let counter = if ask
            .entries
            .iter()
            .enumerate()
            .any(|(i, (_, v))| found.counted_value(i, v) != *v)
        {
            CounterKey::descriptor(
                domain,
                ask.entries
                    .iter()
                    .enumerate()
                    .map(|(i, (k, v))| (*k, found.counted_value(i, v))),
            )
        } else {
            counter
        };
        let own = loaded.counters.get(&rule.path).cloned().unwrap_or_default();
        let stats = if rule.detailed_metric || rule.value_to_metric {
            let mut label = domain.to_owned();
            for (i, (k, v)) in ask.entries.iter().enumerate() {
                label.push('.');
                label.push_str(k);
                let v = found.counted_value(i, v);
                if !v.is_empty() {
                    label.push('_');
                    label.push_str(v);
                }
            }
            self.metrics.detailed(domain, label, &own)
        } else {
            own
        };
        Plan::Count {
            counter,
            pools: Vec::new(),
            limits: vec![self.limit(n, unit, rule.shadow)],
            name: rule.name.clone(),
            shown: (n, unit.proto()),
            rule_name: (!rule.name.is_empty()).then(|| rule.name.clone()),
            replaces: rule.replaces.clone(),
            stats,
            metadata: rule
                .metadata
                .clone()
                .filter(|_| self.policy.response_dynamic_metadata),
        }
    }

    /// The catalog domain: a descriptor carrying `method`, `path` and `api_key` (or, for the
    /// catalog's anonymous limits, `remote_address`), held to what the gateway's admission holds
    /// that request to ([`admission::hold`]: the same path normal form, policy, limits and
    /// counter). `None` when the descriptor is not of that shape.
    fn catalog_plan(&self, ask: &Ask<'_>) -> Option<Plan> {
        let gateway = self.catalog.as_ref()?;
        let get = |name: &str| ask.entries.iter().find(|(k, _)| *k == name).map(|e| e.1);
        let (method, raw) = (get("method")?, get("path")?);
        let key = get("api_key").filter(|k| !k.is_empty());
        let client = get("remote_address").and_then(|a| a.parse::<IpAddr>().ok());
        if key.is_none() && client.is_none() {
            return None;
        }
        let policy = &gateway.policy;
        let snapshot = gateway.live.snapshot();
        let raw = raw.split(['?', '#']).next().unwrap_or_default();
        let anywhere = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
        let client = || client.unwrap_or(anywhere);
        let key = key.map(str::as_bytes);
        let held = match admission::hold(policy, Some(&snapshot), method, raw, key, client) {
            Ok(held) => held,
            Err(decided) => return Some(uncounted(&decided)),
        };
        let (endpoint, limits) = (held.endpoint, held.limits(policy.shadow));
        // Rates only: Envoy's protocol tells no end of a request, so no slot could be freed.
        let (limits, pools) = admission::kept(&limits, &held.pool_counters(&limits), |_, l| {
            !l.is_concurrent()
        });
        let Some(&first) = limits.first() else {
            return Some(Plan::Free);
        };
        Some(Plan::Count {
            counter: held.counter(),
            pools,
            limits,
            name: endpoint.name.clone(),
            shown: (
                u32::try_from(first.rl).unwrap_or(u32::MAX),
                limit_unit(&first),
            ),
            rule_name: None,
            replaces: Vec::new(),
            metadata: None,
            stats: self.metrics.rule(
                &self.policy.catalog_domain,
                &format!("{}.{}", self.policy.catalog_domain, endpoint.name),
            ),
        })
    }

    /// A rule's limit of `n` per `unit`: a sliding window of the unit's length, or with
    /// `rls.window = fixed` a fixed window aligned to the clock, as envoyproxy/ratelimit counts.
    fn limit(&self, n: u32, unit: Unit, shadow: bool) -> Limit {
        let (n, w) = (u64::from(n), unit.seconds());
        match self.policy.window {
            WindowKind::Sliding => Limit::sliding(n, w),
            WindowKind::Fixed => Limit::aligned(n, w),
        }
        .shadowed(shadow)
    }

    /// The response: one status per descriptor, the overall code, and the header fields.
    fn respond(
        &self,
        plans: &[Plan],
        asks: &[Ask<'_>],
        decided: Vec<Option<Verdict>>,
        now_ms: u64,
    ) -> RateLimitResponse {
        let statuses: Vec<DescriptorStatus> = plans
            .iter()
            .zip(asks)
            .zip(decided)
            .map(|((plan, ask), verdict)| status(plan, verdict, ask.cost))
            .collect();
        let over = |s: &DescriptorStatus| s.code == Code::OverLimit as i32;
        let limited = |(_, s): &(usize, &DescriptorStatus)| s.current_limit.is_some();
        // The header fields describe the first refused descriptor, else the one with least room.
        let shown = statuses
            .iter()
            .enumerate()
            .filter(limited)
            .find(|(_, s)| over(s))
            .or_else(|| {
                statuses
                    .iter()
                    .enumerate()
                    .filter(limited)
                    .min_by_key(|(_, s)| s.limit_remaining)
            })
            .map(|(i, _)| i);
        let response_headers_to_add = match shown {
            Some(i) if self.policy.response_headers => {
                header_fields(&plans[i], &statuses[i], now_ms)
            }
            _ => Vec::new(),
        };
        RateLimitResponse {
            dynamic_metadata: None,
            overall_code: if statuses.iter().any(over) && !self.policy.shadow_mode {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            statuses,
            response_headers_to_add,
        }
    }
}

/// One descriptor's status from its plan and the store's verdict (of `cost` units), counted in
/// its rule's metrics.
fn status(plan: &Plan, verdict: Option<Verdict>, cost: u64) -> DescriptorStatus {
    let (
        Plan::Count {
            limits,
            name,
            shown: (n, unit),
            stats,
            ..
        },
        Some(verdict),
    ) = (plan, verdict)
    else {
        return DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: if matches!(plan, Plan::Unlimited) {
                u32::MAX
            } else {
                0
            },
            ..Default::default()
        };
    };
    let outcome = match verdict {
        Verdict::Decided(o) | Verdict::Local(o) => o,
        Verdict::Open => Outcome::new(true, false, &[open_quota(*n)]),
        Verdict::Closed => Outcome::new(false, false, &[closed_quota(*n)]),
    };
    let q = outcome.quotas()[outcome.most_restrictive(limits).unwrap_or(0)];
    stats.record(Hit {
        hits: cost,
        limit: q.limit,
        used: q.limit.saturating_sub(q.remaining),
        over: !outcome.allowed || outcome.shadow_limited,
        shadow: outcome.shadow_limited,
    });
    DescriptorStatus {
        code: if outcome.allowed {
            Code::Ok
        } else {
            Code::OverLimit
        } as i32,
        current_limit: Some(proto::RateLimit {
            requests_per_unit: *n,
            unit: *unit as i32,
            name: name.clone(),
        }),
        limit_remaining: if outcome.allowed {
            u32::try_from(q.remaining).unwrap_or(u32::MAX)
        } else {
            0
        },
        duration_until_reset: Some(proto::Duration {
            seconds: i64::try_from(q.reset).unwrap_or(i64::MAX),
            nanos: 0,
        }),
    }
}

/// The RateLimit header fields the gateway would send for one descriptor's status, decided at
/// `now_ms` (a calendar period's policy window is the length of the period holding it).
fn header_fields(plan: &Plan, status: &DescriptorStatus, now_ms: u64) -> Vec<proto::HeaderValue> {
    let (Plan::Count { limits, name, .. }, Some(limit)) = (plan, &status.current_limit) else {
        return Vec::new();
    };
    let allowed = status.code == Code::Ok as i32;
    let reset = status
        .duration_until_reset
        .map_or(0, |d| d.seconds.max(0) as u64);
    let q = Quota {
        allowed,
        limit: u64::from(limit.requests_per_unit),
        remaining: u64::from(status.limit_remaining),
        reset,
        retry_after: (!allowed).then_some(reset),
    };
    let first = [limits[0].shadowed(false)];
    let rate = Rate {
        name,
        limits: Limits::new(&first, false),
        outcome: Outcome::new(allowed, false, &[q]),
        cost: 1,
        at_ms: now_ms,
    };
    let mut headers = HeaderMap::new();
    set_rate_limit(&mut headers, HeaderSet::Both, &rate);
    headers
        .iter()
        .filter_map(|(k, v)| {
            Some(proto::HeaderValue {
                key: k.as_str().to_owned(),
                value: v.to_str().ok()?.to_owned(),
            })
        })
        .collect()
}

/// The catalog domain's answer for a descriptor its admission decided without a count: not
/// limited, whatever the gateway would have answered that request (docs/ratelimit.md, "The
/// catalog domain"): Envoy asks whether to limit, and a refusal of a request for what it is
/// (no key, an unknown key or endpoint, a path out of its normal form) is not a limit.
fn uncounted(decided: &admission::Admission<'_>) -> Plan {
    use admission::Decision as D;
    match decided.decision {
        // Limits off; no key where anonymous limits do not apply; no catalog yet; a path out of
        // its normal form; no endpoint; no limit for the key there (or an unknown key). The
        // rest are decided by a count or by a request's head, never here: not limited either.
        D::Unlimited
        | D::MissingKey
        | D::BadToken
        | D::NotReady
        | D::BadRequest
        | D::UnknownEndpoint
        | D::NoLimit
        | D::Allowed
        | D::ShadowLimited
        | D::Limited
        | D::TooLarge
        | D::StoreOpen
        | D::StoreUnavailable
        | D::UpstreamError => Plan::Free,
    }
}

/// `replaces`: a named rule that another matched rule replaces is not applied.
fn replace(plans: &mut [Plan]) {
    let replaced: Vec<String> = plans
        .iter()
        .filter_map(|p| match p {
            Plan::Count { replaces, .. } => Some(replaces.iter().cloned()),
            _ => None,
        })
        .flatten()
        .collect();
    if replaced.is_empty() {
        return;
    }
    for p in plans.iter_mut() {
        if let Plan::Count {
            rule_name: Some(n), ..
        } = p
            && replaced.contains(n)
        {
            *p = Plan::Free;
        }
    }
}

/// `dynamic_metadata`, as envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA` writes it: the
/// request's `domain`, its `descriptors` (each its `entries` as `key=value`, its `limit`
/// override and its `hitsAddend` when given), the request's `hitsAddend` when not 0, and
/// `metadata`: the rule metadata of every descriptor not over its limit, merged in order (the
/// first value of a name wins; mappings under one name are merged alike).
fn dynamic_metadata(
    req: &RateLimitRequest,
    plans: &[Plan],
    statuses: &[DescriptorStatus],
) -> proto::Struct {
    use proto::{Kind, ListValue, Struct, Value};
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut fields = std::collections::BTreeMap::new();
    fields.insert(
        "domain".to_owned(),
        Value::of(Kind::String(text(&req.domain))),
    );
    let descriptors = req
        .descriptors
        .iter()
        .map(|d| {
            let mut f = std::collections::BTreeMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| Value::of(Kind::String(format!("{}={}", text(&e.key), text(&e.value)))))
                .collect();
            f.insert(
                "entries".to_owned(),
                Value::of(Kind::List(ListValue { values: entries })),
            );
            if let Some(l) = &d.limit {
                // `envoy.type.v3.RateLimitUnit`'s names, as Go's protobuf prints them.
                let unit = [
                    "UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR",
                ]
                .get(usize::try_from(l.unit).unwrap_or(usize::MAX))
                .map_or_else(|| l.unit.to_string(), |u| (*u).to_owned());
                f.insert(
                    "limit".to_owned(),
                    Value::of(Kind::String(format!(
                        "requests_per_unit:{} unit:{unit}",
                        l.requests_per_unit
                    ))),
                );
            }
            if let Some(h) = d.hits_addend {
                f.insert(
                    "hitsAddend".to_owned(),
                    Value::of(Kind::Number(h.value as f64)),
                );
            }
            Value::of(Kind::Struct(Struct { fields: f }))
        })
        .collect();
    fields.insert(
        "descriptors".to_owned(),
        Value::of(Kind::List(ListValue {
            values: descriptors,
        })),
    );
    if req.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            Value::of(Kind::Number(f64::from(req.hits_addend))),
        );
    }
    let mut passed = Struct::default();
    for (plan, status) in plans.iter().zip(statuses) {
        if let Plan::Count {
            metadata: Some(m), ..
        } = plan
            && status.code != Code::OverLimit as i32
        {
            merge(&mut passed, Struct::from_json(m));
        }
    }
    if !passed.fields.is_empty() {
        fields.insert("metadata".to_owned(), Value::of(Kind::Struct(passed)));
    }
    Struct { fields }
}

/// Adds `from`'s fields to `into`: a name `into` has keeps its value, but two mappings under
/// one name are merged the same way (envoyproxy/ratelimit's `mergeMetadata`).
fn merge(into: &mut proto::Struct, from: proto::Struct) {
    use proto::Kind;
    for (k, v) in from.fields {
        match into.fields.get_mut(&k) {
            None => {
                into.fields.insert(k, v);
            }
            Some(proto::Value {
                kind: Some(Kind::Struct(inner)),
            }) => {
                if let Some(Kind::Struct(more)) = v.kind {
                    merge(inner, more);
                }
            }
            Some(_) => {}
        }
    }
}

/// The unit Envoy is shown for a catalog window of `w` seconds (the nearest that fits).
/// The unit `current_limit` shows for `l`: its calendar period's, or the longest unit its window
/// spans.
fn limit_unit(l: &Limit) -> proto::Unit {
    use quotagate_engine::limiter::Period;
    match l.period() {
        Some(Period::Hour) => proto::Unit::Hour,
        Some(Period::Day) => proto::Unit::Day,
        Some(Period::Week) => proto::Unit::Week,
        Some(Period::Month) => proto::Unit::Month,
        None => window_unit(l.w),
    }
}

fn window_unit(w: u32) -> proto::Unit {
    match w {
        0..60 => proto::Unit::Second,
        60..3_600 => proto::Unit::Minute,
        3_600..86_400 => proto::Unit::Hour,
        _ => proto::Unit::Day,
    }
}

/// The store is down and the policy is `open`: all the room there is.
fn open_quota(n: u32) -> Quota {
    Quota {
        allowed: true,
        limit: u64::from(n),
        remaining: u64::from(n),
        reset: 0,
        retry_after: None,
    }
}

/// The store is down and the policy is `closed`: refused, no wait known.
fn closed_quota(n: u32) -> Quota {
    Quota {
        allowed: false,
        limit: u64::from(n),
        remaining: 0,
        reset: 0,
        retry_after: None,
    }
}

/// Checks a request's shape and text: the domain and each descriptor's entries (UTF-8, keys not
/// empty), its override's unit, and what each descriptor counts.
fn check_request(req: &RateLimitRequest) -> Result<(&str, Vec<Ask<'_>>), Invalid> {
    let domain = std::str::from_utf8(&req.domain)
        .map_err(|_| Invalid("domain is not valid UTF-8".into()))?;
    if domain.is_empty() {
        return Err(Invalid("rate limit domain must not be empty".into()));
    }
    if req.descriptors.is_empty() {
        return Err(Invalid(format!(
            "domain '{domain}': rate limit descriptor list must not be empty"
        )));
    }
    let default_cost = u64::from(req.hits_addend.max(1));
    let mut asks = Vec::with_capacity(req.descriptors.len());
    for (i, d) in req.descriptors.iter().enumerate() {
        let mut entries = Vec::with_capacity(d.entries.len());
        if d.entries.is_empty() {
            return Err(Invalid(format!("descriptors[{i}] has no entries")));
        }
        for (j, e) in d.entries.iter().enumerate() {
            let (Ok(k), Ok(v)) = (std::str::from_utf8(&e.key), std::str::from_utf8(&e.value))
            else {
                return Err(Invalid(format!(
                    "descriptors[{i}].entries[{j}] is not valid UTF-8"
                )));
            };
            if k.is_empty() {
                return Err(Invalid(format!(
                    "descriptors[{i}].entries[{j}] has an empty key"
                )));
            }
            entries.push((k, v));
        }
        let override_limit = match &d.limit {
            None => None,
            Some(l) => match Unit::from_proto(l.unit) {
                Some(u) => Some((l.requests_per_unit, u)),
                None => {
                    return Err(Invalid(format!(
                        "descriptors[{i}].limit has no known unit ({})",
                        l.unit
                    )));
                }
            },
        };
        asks.push(Ask {
            entries,
            cost: d.hits_addend.map_or(default_cost, |h| h.value),
            override_limit,
        });
    }
    Ok((domain, asks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotagate_engine::limiter::{Period, ZoneId};

    #[test]
    fn dynamic_metadata_is_envoyproxy_ratelimits_with_the_passed_rules_metadata_merged() {
        use proto::{Entry, Kind, RateLimitDescriptor, RateLimitOverride, UInt64Value, Value};
        let plan = |metadata: serde_json::Value| Plan::Count {
            counter: CounterKey::descriptor("d", [("k", "v")].into_iter()),
            pools: Vec::new(),
            limits: Vec::new(),
            name: String::new(),
            shown: (1, proto::Unit::Minute),
            rule_name: None,
            replaces: Vec::new(),
            stats: RuleCounters::default(),
            metadata: metadata.as_object().cloned().map(Arc::new),
        };
        let status = |code: Code| DescriptorStatus {
            code: code as i32,
            ..Default::default()
        };
        let descriptor = |k: &str, v: &str| RateLimitDescriptor {
            entries: vec![Entry {
                key: k.into(),
                value: v.into(),
            }],
            ..Default::default()
        };
        let mut with_override = descriptor("b", "2");
        with_override.limit = Some(RateLimitOverride {
            requests_per_unit: 10,
            unit: 1,
        });
        with_override.hits_addend = Some(UInt64Value { value: 3 });
        let req = RateLimitRequest {
            domain: b"d".to_vec(),
            descriptors: vec![descriptor("a", "1"), with_override, descriptor("c", "")],
            hits_addend: 2,
        };
        let plans = [
            plan(serde_json::json!({"name": "one", "nested": {"a": 1}})),
            plan(serde_json::json!({"name": "two", "other": true, "nested": {"b": [2]}})),
            plan(serde_json::json!({"over": "not sent"})),
        ];
        let statuses = [status(Code::Ok), status(Code::Ok), status(Code::OverLimit)];
        let got = dynamic_metadata(&req, &plans, &statuses);
        let want = serde_json::json!({
            "domain": "d",
            "descriptors": [
                {"entries": ["a=1"]},
                {"entries": ["b=2"], "limit": "requests_per_unit:10 unit:SECOND", "hitsAddend": 3.0},
                {"entries": ["c="]},
            ],
            "hitsAddend": 2.0,
            "metadata": {"name": "one", "other": true, "nested": {"a": 1.0, "b": [2.0]}},
        });
        let want = proto::Struct::from_json(want.as_object().unwrap());
        assert_eq!(got, want);
        // Nothing passed: no `metadata`.
        let got = dynamic_metadata(&req, &plans[2..], &statuses[2..]);
        assert!(!got.fields.contains_key("metadata"));
        assert_eq!(
            got.fields["domain"],
            Value {
                kind: Some(Kind::String("d".into()))
            }
        );
    }

    /// The policy field `header_fields` writes for a descriptor held to `limit`, at `now_ms`.
    fn policy_at(limit: Limit, now_ms: u64) -> String {
        let plan = Plan::Count {
            counter: CounterKey::descriptor("quotagate", [("api_key", "k")].into_iter()),
            pools: Vec::new(),
            limits: vec![limit],
            name: "GET /a".into(),
            shown: (10, limit_unit(&limit)),
            rule_name: None,
            replaces: Vec::new(),
            stats: RuleCounters::default(),
            metadata: None,
        };
        let status = DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(proto::RateLimit {
                requests_per_unit: 10,
                unit: limit_unit(&limit) as i32,
                name: "GET /a".into(),
            }),
            limit_remaining: 9,
            duration_until_reset: Some(proto::Duration {
                seconds: 60,
                nanos: 0,
            }),
        };
        let fields = header_fields(&plan, &status, now_ms);
        let policy = fields.iter().find(|h| h.key == "ratelimit-policy");
        policy.expect("a policy field").value.clone()
    }

    #[test]
    fn a_calendar_months_policy_window_is_the_month_it_is_asked_in() {
        let month = Limit::calendar(10, Period::Month, ZoneId::UTC);
        // 2027-02-10T12:00:00Z: February has 28 days.
        assert_eq!(
            policy_at(month, 1_802_260_800_000),
            r#""GET /a month";q=10;w=2419200"#
        );
        // 2027-03-10T12:00:00Z: March has 31.
        assert_eq!(
            policy_at(month, 1_804_680_000_000),
            r#""GET /a month";q=10;w=2678400"#
        );
    }

    #[test]
    fn a_calendar_days_policy_window_is_23_hours_on_the_day_clocks_go_forward() {
        let zone = ZoneId::of("Europe/Berlin").expect("a zone");
        let day = Limit::calendar(10, Period::Day, zone);
        // 2026-03-29T12:00:00+02:00: Berlin's clocks went forward at 02:00.
        assert_eq!(
            policy_at(day, 1_774_778_400_000),
            r#""GET /a day";q=10;w=82800"#
        );
        // 2026-03-30T12:00:00+02:00: a day of 24 hours.
        assert_eq!(
            policy_at(day, 1_774_864_800_000),
            r#""GET /a day";q=10;w=86400"#
        );
    }
}
