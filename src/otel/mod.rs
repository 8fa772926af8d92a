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
use tokio::sync::mpsc;

use crate::config::{ConfigError, TelemetryConfig};
use crate::metrics::OutcomeLabels;

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
    /// The endpoint's template (`/users/{id}`), empty when none matched.
    pub route: String,
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
#[derive(Debug, Clone, Default)]
pub struct SpanCounts(pub Family<OutcomeLabels, Counter>);

impl SpanCounts {
    pub fn add(&self, outcome: &'static str, n: usize) {
        self.0
            .get_or_create(&OutcomeLabels { outcome })
            .inc_by(n as u64);
    }
}

/// What [`export::run`] is started with: the settings, the queue's receiving end, the counts.
pub type Exporter = (TraceSettings, mpsc::Receiver<Span>, SpanCounts);

/// The request path's half: sampling, and queueing finished spans.
#[derive(Debug)]
pub struct Tracer {
    threshold: u64,
    queue: mpsc::Sender<Span>,
    counts: SpanCounts,
}

impl Tracer {
    /// The tracer, and what the exporter ([`export::run`]) reads from.
    pub fn new(s: &TraceSettings, counts: SpanCounts) -> (Arc<Tracer>, mpsc::Receiver<Span>) {
        let (queue, spans) = mpsc::channel(s.queue_max);
        let tracer = Tracer {
            threshold: context::threshold(s.sample_ratio),
            queue,
            counts,
        };
        (Arc::new(tracer), spans)
    }

    /// Whether a request with these headers is traced (parent-based: the client's sampled flag
    /// decides when it sent a valid `traceparent`; otherwise the ratio does), and its span if so.
    pub fn start(&self, headers: &HeaderMap) -> Option<Started> {
        let parent = headers
            .get("traceparent")
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
        if self.queue.try_send(span).is_err() {
            self.counts.add("dropped", 1);
        }
    }
}
