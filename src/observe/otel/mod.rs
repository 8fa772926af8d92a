//! otel: OpenTelemetry traces of the gateway's requests, one server span each, exported over
//! OTLP/HTTP (protobuf) to `telemetry.otlp_endpoint`.
//!
//! The request path decides and records ([`Tracer::start`], [`Tracer::finish`]): a sampled span
//! is handed to a bounded queue with `try_send`, and dropped (counted) when the queue is full, so
//! a collector that is down, slow or hung costs requests nothing. [`export`] turns queued spans
//! into the official protobuf messages (`opentelemetry-proto`) and posts them in batches.
//!
//! Not the `opentelemetry` SDK's tracer: a span here is one small struct made and queued by the
//! request that owns it, with no global context to install, and the queue's drops are ours to
//! count (the SDK's batch processor only logs them).

pub mod context;
pub mod export;

use std::sync::Arc;
use std::time::SystemTime;

use http::HeaderMap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::Mutex;

use crate::config::{ConfigError, TelemetryConfig};
use crate::observe::metrics::OutcomeLabels;

/// Spans per export at most (the OpenTelemetry SDK's default batch size).
pub const BATCH_MAX: usize = 512;

/// The W3C Trace Context header.
pub static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// `[telemetry]`, checked. `None` from [`TraceSettings::from_config`]: tracing is off.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// `{otlp_endpoint}/v1/traces`.
    pub url: reqwest::Url,
    /// Share of new traces recorded. Default: 0.01.
    pub sample_ratio: f64,
    /// `service.name`. Default: `quotagate`.
    pub service_name: String,
    /// Spans queued for export at most. Default: 2048.
    pub queue_max: usize,
    /// Exports start at most this often, unless a full batch waits. Default: 5 s.
    pub export_interval: std::time::Duration,
}

impl TraceSettings {
    pub fn from_config(c: &TelemetryConfig) -> Result<Option<TraceSettings>, ConfigError> {
        if !(0.0..=1.0).contains(&c.sample_ratio) {
            return Err(ConfigError::option(
                "telemetry.sample_ratio",
                format!("{} is not a share from 0 to 1", c.sample_ratio),
            ));
        }
        if c.queue_max == 0 {
            return Err(ConfigError::option(
                "telemetry.queue_max",
                "must be at least 1",
            ));
        }
        if c.service_name.trim().is_empty() {
            return Err(ConfigError::option(
                "telemetry.service_name",
                "must not be empty",
            ));
        }
        if c.otlp_endpoint.is_empty() {
            return Ok(None);
        }
        let base = c.otlp_endpoint.trim_end_matches('/');
        let url = reqwest::Url::parse(&format!("{base}/v1/traces"))
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| {
                ConfigError::option(
                    "telemetry.otlp_endpoint",
                    format!("{:?} is not an http:// or https:// URL", c.otlp_endpoint),
                )
            })?;
        Ok(Some(TraceSettings {
            url,
            sample_ratio: c.sample_ratio,
            service_name: c.service_name.clone(),
            queue_max: c.queue_max,
            export_interval: crate::config::positive_ms(
                "telemetry.export_interval_ms",
                c.export_interval_ms,
            )?,
        }))
    }
}

/// A request being traced.
#[derive(Debug, Clone)]
pub struct Started {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The client's span, when it sent a `traceparent`.
    pub parent: Option<[u8; 8]>,
    pub start: SystemTime,
}

impl Started {
    /// The `traceparent` sent upstream: this request's span is the upstream's parent.
    pub fn traceparent(&self) -> String {
        context::format(&self.trace_id, &self.span_id)
    }
}

/// What a traced request came to.
#[derive(Debug, Clone)]
pub struct Span {
    pub started: Started,
    pub end: SystemTime,
    pub method: http::Method,
    /// The endpoint's name (`GET /users/{id}`), empty when none matched.
    pub endpoint: String,
    pub status: u16,
    /// A `decision` value of `quotagate_requests_total`.
    pub decision: &'static str,
    /// The API key's fingerprint (`key#...`), when it sent one.
    pub key: Option<String>,
    /// Time of the store's decision, when it was asked.
    pub store_seconds: Option<f64>,
}

/// Spans by what became of them: `exported`, `dropped` (the queue was full), `failed` (the
/// collector refused them or could not be reached in time).
#[derive(Debug, Clone)]
pub struct SpanCounts {
    pub exported: Counter,
    pub dropped: Counter,
    pub failed: Counter,
}

impl SpanCounts {
    /// The counts, and the family labelled by `outcome` that shows them (its counters are these,
    /// shared, so counting needs no lookup).
    pub fn new() -> (SpanCounts, Family<OutcomeLabels, Counter>) {
        let family = Family::<OutcomeLabels, Counter>::default();
        let get = |outcome| family.get_or_create(&OutcomeLabels { outcome }).clone();
        let counts = SpanCounts {
            exported: get("exported"),
            dropped: get("dropped"),
            failed: get("failed"),
        };
        (counts, family)
    }
}

/// Finished spans waiting for export: a vector behind a lock (one short lock per span), and the
/// exporter's wake-up, given only for the first span after an export and for a full batch, so a
/// busy gateway does not wake the exporter per span.
#[derive(Debug)]
pub struct Queue {
    spans: Mutex<Vec<Span>>,
    max: usize,
    wake: tokio::sync::Notify,
}

impl Queue {
    /// Everything queued, leaving it empty.
    pub fn take(&self) -> Vec<Span> {
        std::mem::take(&mut *self.spans.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn len(&self) -> usize {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for a wake-up.
    pub async fn woken(&self) {
        self.wake.notified().await
    }
}

/// What [`export::run`] is started with: the settings, the queue, the counts.
pub type Exporter = (TraceSettings, Arc<Queue>, SpanCounts);

/// The request path's half: sampling, and queueing finished spans.
#[derive(Debug)]
pub struct Tracer {
    threshold: u64,
    queue: Arc<Queue>,
    counts: SpanCounts,
}

impl Tracer {
    /// The tracer, and the queue the exporter ([`export::run`]) takes from.
    pub fn new(s: &TraceSettings, counts: SpanCounts) -> (Arc<Tracer>, Arc<Queue>) {
        let queue = Arc::new(Queue {
            spans: Mutex::new(Vec::new()),
            max: s.queue_max,
            wake: tokio::sync::Notify::new(),
        });
        let tracer = Tracer {
            threshold: context::threshold(s.sample_ratio),
            queue: queue.clone(),
            counts,
        };
        (Arc::new(tracer), queue)
    }

    /// Whether a request with these headers is traced (parent-based: the client's sampled flag
    /// decides when it sent a valid `traceparent`; otherwise the ratio does), and its span if so.
    pub fn start(&self, headers: &HeaderMap) -> Option<Started> {
        let parent = headers
            .get(&TRACEPARENT)
            .and_then(|v| context::parse(v.as_bytes()));
        let trace_id = match parent {
            Some(p) if !p.sampled => return None,
            Some(p) => p.trace_id,
            None => {
                let id = fastrand::u128(1..).to_be_bytes();
                if !context::sampled_by_ratio(&id, self.threshold) {
                    return None;
                }
                id
            }
        };
        Some(Started {
            trace_id,
            span_id: fastrand::u64(1..).to_be_bytes(),
            parent: parent.map(|p| p.span_id),
            start: SystemTime::now(),
        })
    }

    /// Queues a finished span for export, or drops it when the queue is full.
    pub fn finish(&self, span: Span) {
        let mut spans = self.queue.spans.lock().unwrap_or_else(|e| e.into_inner());
        if spans.len() >= self.queue.max {
            drop(spans);
            self.counts.dropped.inc();
            return;
        }
        spans.push(span);
        let n = spans.len();
        drop(spans);
        if n == 1 || n == BATCH_MAX {
            self.queue.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(f: impl FnOnce(&mut TelemetryConfig)) -> Result<Option<TraceSettings>, String> {
        let mut c = TelemetryConfig::default();
        f(&mut c);
        TraceSettings::from_config(&c).map_err(|e| e.to_string())
    }

    #[test]
    fn settings_are_checked_by_name() {
        assert_eq!(settings(|_| {}), Ok(None), "off by default");
        let on = settings(|c| c.otlp_endpoint = "http://collector:4318/".into()).unwrap();
        assert_eq!(on.unwrap().url.as_str(), "http://collector:4318/v1/traces");
        for (f, message) in [
            (
                Box::new(|c: &mut TelemetryConfig| c.sample_ratio = 1.5) as Box<dyn FnOnce(&mut _)>,
                "telemetry.sample_ratio: 1.5 is not a share from 0 to 1",
            ),
            (
                Box::new(|c: &mut TelemetryConfig| c.otlp_endpoint = "collector:4318".into()),
                "telemetry.otlp_endpoint: \"collector:4318\" is not an http:// or https:// URL",
            ),
            (
                Box::new(|c: &mut TelemetryConfig| c.queue_max = 0),
                "telemetry.queue_max: must be at least 1",
            ),
            (
                Box::new(|c: &mut TelemetryConfig| {
                    c.otlp_endpoint = "http://c".into();
                    c.export_interval_ms = 0;
                }),
                "telemetry.export_interval_ms: must be above 0",
            ),
        ] {
            assert_eq!(settings(f), Err(message.to_owned()));
        }
    }
}
