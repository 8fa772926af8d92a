//! export: queued spans posted to the collector as OTLP/HTTP protobuf
//! (`ExportTraceServiceRequest`, `Content-Type: application/x-protobuf`), the messages being
//! `opentelemetry-proto`'s, generated from the official definitions.
//!
//! One export at a time: the spans queued while it is in flight make the next batch (at most
//! [`BATCH_MAX`]), so batches grow with the load and a quiet gateway sends each span soon after
//! its request. An export that gets no answer within [`EXPORT_TIMEOUT`] fails; its spans are
//! counted as `failed` and not retried (the queue behind it must not wait).

use std::time::{Duration, SystemTime};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1 as proto;
use prost::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Span, SpanCounts, TraceSettings};

/// Spans per export at most (the OpenTelemetry SDK's default batch size).
pub const BATCH_MAX: usize = 512;
/// How long an export may take (the OTLP exporters' default timeout).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Posts what `spans` receives until `shutdown`, then what is still queued (one last try).
pub async fn run(
    settings: TraceSettings,
    mut spans: mpsc::Receiver<Span>,
    counts: SpanCounts,
    shutdown: CancellationToken,
) {
    let client = match reqwest::Client::builder().timeout(EXPORT_TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "traces cannot be exported: no HTTP client");
            return;
        }
    };
    let resource = resource(&settings.service_name);
    let mut batch = Vec::with_capacity(BATCH_MAX);
    loop {
        let stopping = tokio::select! {
            n = spans.recv_many(&mut batch, BATCH_MAX) => n == 0,
            () = shutdown.cancelled() => {
                while batch.len() < BATCH_MAX {
                    match spans.try_recv() {
                        Ok(s) => batch.push(s),
                        Err(_) => break,
                    }
                }
                true
            }
        };
        if !batch.is_empty() {
            let body = encode(&resource, &batch).encode_to_vec();
            let sent = client
                .post(settings.url.clone())
                .header("content-type", "application/x-protobuf")
                .body(body)
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => counts.add("exported", batch.len()),
                Ok(r) => {
                    tracing::debug!(status = r.status().as_u16(), "the collector refused spans");
                    counts.add("failed", batch.len());
                }
                Err(e) => {
                    tracing::debug!(error = %e, "spans could not be exported");
                    counts.add("failed", batch.len());
                }
            }
            batch.clear();
        }
        if stopping {
            return;
        }
    }
}

fn resource(service_name: &str) -> Resource {
    Resource {
        attributes: vec![text("service.name", service_name)],
        ..Default::default()
    }
}

/// The export request of `spans`.
pub fn encode(resource: &Resource, spans: &[Span]) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![proto::ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![proto::ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "quotagate".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans: spans.iter().map(span).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn span(s: &Span) -> proto::Span {
    let mut attributes = vec![
        text("http.request.method", s.method.as_str()),
        int("http.response.status_code", i64::from(s.status)),
        text("quotagate.decision", s.decision),
    ];
    if !s.route.is_empty() {
        attributes.push(text("http.route", &s.route));
    }
    if let Some(k) = &s.key {
        attributes.push(text("quotagate.key", k));
    }
    if let Some(secs) = s.store_seconds {
        attributes.push(KeyValue {
            key: "quotagate.store.duration".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::DoubleValue(secs)),
            }),
            ..Default::default()
        });
    }
    let name = match s.route.is_empty() {
        true => s.method.as_str().to_owned(),
        false => format!("{} {}", s.method, s.route),
    };
    proto::Span {
        trace_id: s.started.trace_id.to_vec(),
        span_id: s.started.span_id.to_vec(),
        parent_span_id: s.started.parent.map(|p| p.to_vec()).unwrap_or_default(),
        // Sampled, as everything exported here is.
        flags: 1,
        name,
        kind: proto::span::SpanKind::Server as i32,
        start_time_unix_nano: nanos(s.started.start),
        end_time_unix_nano: nanos(s.end),
        attributes,
        // A server span is an error when the server failed (5xx), not when the client did.
        status: Some(proto::Status {
            code: match s.status >= 500 {
                true => proto::status::StatusCode::Error as i32,
                false => proto::status::StatusCode::Unset as i32,
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn text(key: &str, v: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

fn int(key: &str, v: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(v)),
        }),
        ..Default::default()
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64)
}
