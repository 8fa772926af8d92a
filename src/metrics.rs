//! metrics: what the gateway counts, served as Prometheus (OpenMetrics) text on the admin listener.
//!
//! Label sets are bounded: requests are labelled by decision and endpoint name (from the catalog),
//! never by API key or raw path. Values that are states rather than events (catalog version and
//! age, store health) are set when `/metrics` is read.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::catalog::live::Live;
use crate::store::Store;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `allowed`, `limited`, `missing_key`, `unknown_endpoint`, `no_limit`, `upstream_error`, ...
    pub decision: &'static str,
    /// The endpoint's name (`GET /users/{id}`), empty when no endpoint matched.
    pub endpoint: String,
}

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

/// The gateway's metrics.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub request_seconds: Histogram,
    pub decision_seconds: Histogram,
    pub upstream_responses: Family<ClassLabels, Counter>,
    pub open_connections: Gauge,
    catalog_info: Family<CatalogLabels, Gauge>,
    catalog_age: Gauge<f64, AtomicU64>,
    catalog_ready: Gauge,
    store_info: Family<PolicyLabels, Gauge>,
    store_degraded: Gauge,
    live: Arc<Live>,
    store: Arc<Store>,
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    // 100 µs to about 13 s.
    exponential_buckets(0.0001, 2.0, 18)
}

impl Metrics {
    /// Registers everything the gateway counts; the catalog's and the store's own counters too.
    pub fn new(live: Arc<Live>, store: Arc<Store>) -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            requests: Family::default(),
            request_seconds: Histogram::new(latency_buckets()),
            decision_seconds: Histogram::new(latency_buckets()),
            upstream_responses: Family::default(),
            open_connections: Gauge::default(),
            catalog_info: Family::default(),
            catalog_age: Gauge::default(),
            catalog_ready: Gauge::default(),
            store_info: Family::default(),
            store_degraded: Gauge::default(),
            registry: Registry::default(),
            live,
            store,
        };
        let r = &mut registry;
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
            m.live.polls.clone(),
        );
        r.register(
            "quotagate_catalog_refreshes",
            "Forced-refresh headers by outcome",
            m.live.refreshes.clone(),
        );
        r.register(
            "quotagate_store_errors",
            "Failed or timed-out store calls",
            m.store.errors.clone(),
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
        Metrics { registry, ..m }
    }

    /// Adds metrics registered elsewhere (the Divvy port's).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The text of `/metrics`.
    pub fn render(&self) -> String {
        let snapshot = self.live.snapshot();
        self.catalog_info.clear();
        if self.live.is_ready() {
            self.catalog_info
                .get_or_create(&CatalogLabels {
                    hash: snapshot.version.hash.clone(),
                    semver: snapshot.version.semver.clone(),
                })
                .set(1);
        }
        self.catalog_ready.set(i64::from(self.live.is_ready()));
        let applied = self
            .live
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .applied_at;
        self.catalog_age
            .set(applied.map_or(0.0, |t| t.elapsed().as_secs_f64()));
        self.store_info.clear();
        self.store_info
            .get_or_create(&PolicyLabels {
                kind: self.store.kind(),
                policy: self.store.policy().as_str(),
            })
            .set(1);
        self.store_degraded.set(i64::from(self.store.is_degraded()));
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The status class label of an HTTP status.
pub fn status_class(status: u16) -> &'static str {
    match status {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "1xx",
    }
}
