//! metrics: what the gateway counts, served as Prometheus (OpenMetrics) text on the admin listener.
//!
//! Label sets are bounded: requests are labelled by decision and endpoint name (from the catalog),
//! never by API key or raw path. Values that are states rather than events (catalog version and
//! age, store health) are handed in as a [`State`] when `/metrics` is read.
//!
//! This module depends on no other part of quotagate: the parts that count hold its families.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `allowed`, `limited`, `missing_key`, `unknown_endpoint`, `no_limit`, `upstream_error`, ...
    pub decision: &'static str,
    /// The endpoint's name (`GET /users/{id}`), empty when no endpoint matched.
    pub endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    /// The endpoint's name, empty when no endpoint matched.
    pub endpoint: String,
}

/// A latency histogram, as a family's constructor.
pub type LatencyFamily<S> = Family<S, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    /// `2xx`, `3xx`, `4xx` or `5xx`.
    pub class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub kind: &'static str,
    pub policy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CatalogLabels {
    pub hash: String,
    pub semver: String,
}

/// Distinct decision labels at most ([`Metrics::count_request`]'s `decision.0`).
pub const DECISIONS: usize = 16;

/// Each [`Metrics`] has its own id, so a thread's cache of handles never serves another instance
/// (even one allocated where a dropped one was).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The metric handles of one endpoint, resolved once per worker thread: a family lookup hashes its
/// label set with SipHash under a lock, and a request would do two.
struct Handles {
    latency: Histogram,
    decisions: [Option<Counter>; DECISIONS],
}

/// Endpoints cached per thread at most; beyond, the cache starts over.
const MAX_CACHED_ENDPOINTS: usize = 10_000;

thread_local! {
    static HANDLES: RefCell<(u64, HashMap<String, Handles, foldhash::fast::RandomState>)> =
        RefCell::new((0, HashMap::default()));
}

/// The gateway's metrics.
pub struct Metrics {
    id: u64,
    /// Each part registers its own families while the application is built, through a shared
    /// `Metrics` ([`Metrics::register`]); locked again only to render `/metrics`.
    registry: std::sync::Mutex<Registry>,
    pub requests: Family<RequestLabels, Counter>,
    /// Time to answer, per endpoint (sum over `endpoint` for all requests).
    pub request_seconds: LatencyFamily<EndpointLabels>,
    pub decision_seconds: Histogram,
    upstream_responses: Family<ClassLabels, Counter>,
    /// `upstream_responses`' counter of each class, by [`class_index`], once asked for: the
    /// family's lookup locks, hashes and probes each response (~150 instructions, callgrind).
    upstream_classes: [std::sync::OnceLock<Counter>; 5],
    pub open_connections: Gauge,
    catalog_info: Family<CatalogLabels, Gauge>,
    catalog_age: Gauge<f64, AtomicU64>,
    catalog_ready: Gauge,
    store_info: Family<PolicyLabels, Gauge>,
    store_degraded: Gauge,
    /// Catalog server polls by outcome (`unchanged`, `applied`, or the failure kind).
    pub catalog_polls: Family<OutcomeLabels, Counter>,
    /// Forced-refresh headers by outcome: `fetched`, `timed_out`, `invalid`.
    pub catalog_refreshes: Family<OutcomeLabels, Counter>,
    /// Responses of `cost_from` endpoints by what they reported: `reported`, or why the
    /// reservation stayed (`missing`, `invalid`, `too_large`, `cut_short`).
    pub cost_reports: Family<OutcomeLabels, Counter>,
    /// Requests waiting for room now (`wait_ms`).
    pub waiting: Gauge,
    /// Waits by outcome: `admitted`, `refused` (after waiting), `client_gone`.
    pub waits: Family<OutcomeLabels, Counter>,
    /// Time waited, by every wait that ended.
    pub wait_seconds: Histogram,
}

/// The states `/metrics` shows, read when it is rendered.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// The catalog being served (`None`: none loaded yet).
    pub catalog: Option<CatalogLabels>,
    /// Seconds since the current catalog was applied.
    pub catalog_age_seconds: f64,
    /// `memory` or `redis`, and the failure policy.
    pub store: Option<PolicyLabels>,
    pub store_degraded: bool,
}

pub fn latency_buckets() -> impl Iterator<Item = f64> {
    // 100 µs to about 13 s.
    exponential_buckets(0.0001, 2.0, 18)
}

impl Metrics {
    /// Registers what the store counts (`store_errors` is its own counter) and, with `gateway`,
    /// everything the proxy and its catalog count.
    pub fn new(store_errors: Counter, gateway: bool) -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(|| Histogram::new(latency_buckets())),
            decision_seconds: Histogram::new(latency_buckets()),
            upstream_responses: Family::default(),
            upstream_classes: Default::default(),
            open_connections: Gauge::default(),
            catalog_info: Family::default(),
            catalog_age: Gauge::default(),
            catalog_ready: Gauge::default(),
            store_info: Family::default(),
            store_degraded: Gauge::default(),
            registry: Default::default(),
            catalog_polls: Family::default(),
            catalog_refreshes: Family::default(),
            cost_reports: Family::default(),
            waiting: Gauge::default(),
            waits: Family::default(),
            wait_seconds: Histogram::new(latency_buckets()),
        };
        let r = &mut registry;
        if gateway {
            r.register(
                "quotagate_requests",
                "Requests by decision and endpoint",
                m.requests.clone(),
            );
            r.register(
                "quotagate_request_duration_seconds",
                "Time to answer a request (to the response headers)",
                m.request_seconds.clone(),
            );
            r.register(
                "quotagate_decision_duration_seconds",
                "Time of the limit decision alone (store call)",
                m.decision_seconds.clone(),
            );
            r.register(
                "quotagate_upstream_responses",
                "Upstream responses by status class",
                m.upstream_responses.clone(),
            );
            r.register(
                "quotagate_open_connections",
                "Open client connections on the proxy listener",
                m.open_connections.clone(),
            );
            r.register(
                "quotagate_catalog_info",
                "The catalog version being served (value 1)",
                m.catalog_info.clone(),
            );
            r.register(
                "quotagate_catalog_age_seconds",
                "Seconds since the current catalog was applied",
                m.catalog_age.clone(),
            );
            r.register(
                "quotagate_catalog_ready",
                "1 once a catalog is loaded",
                m.catalog_ready.clone(),
            );
            r.register(
                "quotagate_catalog_polls",
                "Catalog server polls by outcome",
                m.catalog_polls.clone(),
            );
            r.register(
                "quotagate_catalog_refreshes",
                "Forced-refresh headers by outcome",
                m.catalog_refreshes.clone(),
            );
            r.register(
                "quotagate_cost_reports",
                "Responses of cost_from endpoints by what they reported (reported, or why the reservation stayed)",
                m.cost_reports.clone(),
            );
            r.register(
                "quotagate_requests_waiting",
                "Requests waiting for room now (wait_ms)",
                m.waiting.clone(),
            );
            r.register(
                "quotagate_waits",
                "Waits for room by outcome (admitted, refused after waiting, client_gone)",
                m.waits.clone(),
            );
            r.register(
                "quotagate_wait_duration_seconds",
                "Time requests waited for room",
                m.wait_seconds.clone(),
            );
        }
        r.register(
            "quotagate_store_errors",
            "Failed or timed-out store calls",
            store_errors,
        );
        r.register(
            "quotagate_store_info",
            "The store kind and failure policy (value 1)",
            m.store_info.clone(),
        );
        r.register(
            "quotagate_store_degraded",
            "1 while the shared store is down and the failure policy applies",
            m.store_degraded.clone(),
        );
        Metrics {
            registry: std::sync::Mutex::new(registry),
            ..m
        }
    }

    /// Counts one answered request of `endpoint` (empty: none matched): its decision (an index
    /// below [`DECISIONS`] and its label) and how long it took.
    pub fn count_request(&self, endpoint: &str, decision: (usize, &'static str), seconds: f64) {
        HANDLES.with(|cache| {
            let mut cache = cache.borrow_mut();
            let (owner, handles) = &mut *cache;
            if *owner != self.id || handles.len() >= MAX_CACHED_ENDPOINTS {
                *owner = self.id;
                handles.clear();
            }
            if !handles.contains_key(endpoint) {
                let latency = self
                    .request_seconds
                    .get_or_create(&EndpointLabels {
                        endpoint: endpoint.to_owned(),
                    })
                    .clone();
                handles.insert(
                    endpoint.to_owned(),
                    Handles {
                        latency,
                        decisions: Default::default(),
                    },
                );
            }
            let Some(h) = handles.get_mut(endpoint) else {
                return;
            };
            h.latency.observe(seconds);
            let (index, label) = decision;
            if let Some(slot) = h.decisions.get_mut(index) {
                slot.get_or_insert_with(|| {
                    self.requests
                        .get_or_create(&RequestLabels {
                            decision: label,
                            endpoint: endpoint.to_owned(),
                        })
                        .clone()
                })
                .inc();
            }
        });
    }

    /// Counts an upstream response with `status` (`quotagate_upstream_responses`, by class).
    pub fn count_upstream_response(&self, status: u16) {
        let i = class_index(status);
        self.upstream_classes[i]
            .get_or_init(|| {
                let labels = ClassLabels { class: CLASSES[i] };
                self.upstream_responses.get_or_create(&labels).clone()
            })
            .inc();
    }

    /// Registers what the Redis store counts: decisions by where they were taken, and leases.
    /// The embedded store's commits to its directory (`store.path`).
    pub fn register_disk(&self, commits: &prometheus_client::metrics::counter::Counter) {
        self.registry().register(
            "quotagate_store_disk_commits",
            "Commits the embedded store wrote to store.path (one write and one fdatasync each; at most 50 a second)",
            commits.clone(),
        );
    }

    pub fn register_store(&self, stats: &quotagate_store::StoreStats) {
        let mut r = self.registry();
        let r = &mut *r;
        for (by, c) in [
            ("lease", &stats.decided_by_lease),
            ("block", &stats.decided_by_block),
            ("redis", &stats.decided_by_redis),
        ] {
            r.sub_registry_with_label(("by".into(), by.into())).register(
                "quotagate_store_decisions",
                "Sliding-window decisions on Redis by where they were taken: from a lease or a remembered refusal (in memory), or by a script call",
                c.clone(),
            );
        }
        r.register(
            "quotagate_store_leases",
            "Leases granted by Redis",
            stats.leases.clone(),
        );
        for (kind, c) in [
            ("leased", &stats.units_leased),
            ("used", &stats.units_used),
            ("given_back", &stats.units_given_back),
        ] {
            r.sub_registry_with_label(("kind".into(), kind.into()))
                .register(
                    "quotagate_store_lease_units",
                    "Units of leases: granted, admitted here, given back unused",
                    c.clone(),
                );
        }
    }

    /// Adds metrics registered elsewhere (the Divvy port's, the listener's certificates', the
    /// upstream's): `register` is handed the registry.
    pub fn register(&self, register: impl FnOnce(&mut Registry)) {
        register(&mut self.registry());
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic while registering leaves nothing half-done that rendering would trip on.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The text of `/metrics`, with the states in `state`.
    pub fn render(&self, state: &State) -> String {
        self.catalog_info.clear();
        if let Some(labels) = &state.catalog {
            self.catalog_info.get_or_create(labels).set(1);
        }
        self.catalog_ready.set(i64::from(state.catalog.is_some()));
        self.catalog_age.set(state.catalog_age_seconds);
        self.store_info.clear();
        if let Some(labels) = &state.store {
            self.store_info.get_or_create(labels).set(1);
        }
        self.store_degraded.set(i64::from(state.store_degraded));
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry());
        out
    }
}

/// The status classes, by [`class_index`].
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Where `status`'s class is in [`CLASSES`] (an answer outside 200-599 counts as `1xx`).
fn class_index(status: u16) -> usize {
    match status {
        200..=599 => usize::from(status / 100 - 1),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_count_by_class_and_odd_ones_as_1xx() {
        let labels = [101, 200, 299, 302, 404, 503, 599, 600, 42].map(|s| CLASSES[class_index(s)]);
        assert_eq!(
            labels,
            [
                "1xx", "2xx", "2xx", "3xx", "4xx", "5xx", "5xx", "1xx", "1xx"
            ]
        );
    }

    #[test]
    fn each_instance_counts_its_own_requests_on_one_thread() {
        let (a, b) = (
            Metrics::new(Counter::default(), true),
            Metrics::new(Counter::default(), true),
        );
        a.count_request("GET /x", (0, "allowed"), 0.001);
        b.count_request("GET /x", (1, "limited"), 0.001);
        a.count_request("GET /x", (0, "allowed"), 0.001);
        let (ta, tb) = (a.render(&State::default()), b.render(&State::default()));
        assert!(
            ta.contains(r#"quotagate_requests_total{decision="allowed",endpoint="GET /x"} 2"#),
            "{ta}"
        );
        assert!(!ta.contains("limited"), "{ta}");
        assert!(
            tb.contains(r#"quotagate_requests_total{decision="limited",endpoint="GET /x"} 1"#),
            "{tb}"
        );
        assert!(
            ta.contains(r#"quotagate_request_duration_seconds_count{endpoint="GET /x"} 2"#),
            "{ta}"
        );
    }
}
