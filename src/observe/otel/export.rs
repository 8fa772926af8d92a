//! export: queued spans posted to the collector as OTLP/HTTP protobuf
//! (`ExportTraceServiceRequest`, `Content-Type: application/x-protobuf`), the messages being
//! `opentelemetry-proto`'s, generated from the official definitions.
//!
//! One export at a time, and at most one per `telemetry.export_interval_ms` unless a full batch
//! ([`BATCH_MAX`]) waits: a quiet gateway sends a span as soon as it comes (the last export was
//! long ago), a busy one sends batches of what came in an interval. An export that gets no answer
//! within [`EXPORT_TIMEOUT`] fails; its spans are counted as `failed` and not retried (the queue
//! behind it must not wait).

use std::time::{Duration, SystemTime};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1 as proto;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{BATCH_MAX, Queue, Span, SpanCounts, TraceSettings};

/// How long an export may take (the OTLP exporters' default timeout).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Posts what `queue` holds until `shutdown`, then what is still queued (one last try).
pub async fn run(
    settings: TraceSettings,
    queue: Arc<Queue>,
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
    let head = Head::new(&settings.service_name);
    let mut next = tokio::time::Instant::now();
    loop {
        let stopping = tokio::select! {
            () = queue.woken() => {
                // Until the interval since the last export is over, or a full batch waits.
                while queue.len() < BATCH_MAX {
                    tokio::select! {
                        () = tokio::time::sleep_until(next) => break,
                        () = queue.woken() => {}
                        () = shutdown.cancelled() => break,
                    }
                }
                shutdown.is_cancelled()
            }
            () = shutdown.cancelled() => true,
        };
        let spans = queue.take();
        if !spans.is_empty() {
            next = tokio::time::Instant::now() + settings.export_interval;
        }
        for batch in spans.chunks(BATCH_MAX) {
            let sent = client
                .post(settings.url.clone())
                .header("content-type", "application/x-protobuf")
                .body(head.encode(batch))
                .send()
                .await;
            let n = batch.len() as u64;
            match sent {
                Ok(r) if r.status().is_success() => {
                    counts.exported.inc_by(n);
                }
                Ok(r) => {
                    tracing::debug!(status = r.status().as_u16(), "the collector refused spans");
                    counts.failed.inc_by(n);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "spans could not be exported");
                    counts.failed.inc_by(n);
                }
            }
        }
        if stopping {
            return;
        }
    }
}

/// The parts of an export request that are the same in every one, encoded once.
struct Head {
    /// `ResourceSpans.resource` (field 1), tag and length included.
    resource: Vec<u8>,
    /// `ScopeSpans.scope` (field 1), tag and length included.
    scope: Vec<u8>,
}

impl Head {
    fn new(service_name: &str) -> Head {
        let mut resource = Vec::new();
        let mut scope = Vec::new();
        prost::encoding::message::encode(1, &self::resource(service_name), &mut resource);
        let s = InstrumentationScope {
            name: "quotagate".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        };
        prost::encoding::message::encode(1, &s, &mut scope);
        Head { resource, scope }
    }

    /// The `ExportTraceServiceRequest` of `spans`, encoded: what `encode(..).encode_to_vec()`
    /// gives, with the wrappers written here so each span is measured once, not once per level
    /// of nesting (the test decodes it with the official message).
    fn encode(&self, spans: &[Span]) -> Vec<u8> {
        use prost::encoding::{WireType, encode_key, encode_varint};
        let mut spans_part = Vec::with_capacity(spans.len() * 256);
        for s in spans {
            prost::encoding::message::encode(2, &span(s), &mut spans_part);
        }
        // ScopeSpans = scope + spans; ResourceSpans = resource + scope_spans (field 2);
        // the request = resource_spans (field 1).
        let scope_spans = self.scope.len() + spans_part.len();
        let resource_spans = self.resource.len() + 1 + varint_len(scope_spans) + scope_spans;
        let mut out = Vec::with_capacity(resource_spans + 16);
        encode_key(1, WireType::LengthDelimited, &mut out);
        encode_varint(resource_spans as u64, &mut out);
        out.extend_from_slice(&self.resource);
        encode_key(2, WireType::LengthDelimited, &mut out);
        encode_varint(scope_spans as u64, &mut out);
        out.extend_from_slice(&self.scope);
        out.extend_from_slice(&spans_part);
        out
    }
}

fn varint_len(n: usize) -> usize {
    prost::encoding::encoded_len_varint(n as u64)
}

fn resource(service_name: &str) -> Resource {
    Resource {
        attributes: vec![text("service.name", service_name)],
        ..Default::default()
    }
}

/// The export request of `spans`, as a message ([`Head::encode`] writes the same bytes).
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
    let route = s.endpoint.split_once(' ').map_or("", |(_, r)| r);
    if !route.is_empty() {
        attributes.push(text("http.route", route));
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
    let name = match s.endpoint.is_empty() {
        true => s.method.as_str().to_owned(),
        false => s.endpoint.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn the_written_request_is_the_messages_encoding() {
        let span = |n: u8| Span {
            started: crate::observe::otel::Started {
                trace_id: [n; 16],
                span_id: [n; 8],
                parent: n.is_multiple_of(2).then_some([7; 8]),
                start: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            },
            end: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_001),
            method: http::Method::GET,
            endpoint: if n == 3 {
                String::new()
            } else {
                "GET /users/{id}".into()
            },
            status: 200 + u16::from(n),
            decision: "allowed",
            key: (n != 2).then(|| "key#0123456789ab".into()),
            store_seconds: (n != 1).then_some(0.00012),
        };
        for n in [0, 1, 4, 300] {
            let spans: Vec<Span> = (0..n).map(|i| span((i % 251) as u8)).collect();
            let head = Head::new("quotagate");
            let written = head.encode(&spans);
            assert_eq!(
                written,
                encode(&resource("quotagate"), &spans).encode_to_vec()
            );
            let back = ExportTraceServiceRequest::decode(&written[..]).unwrap();
            assert_eq!(back.resource_spans[0].scope_spans[0].spans.len(), n);
        }
    }
}
