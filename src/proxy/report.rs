//! report: what a `cost_from` endpoint's response reports it cost, applied to the store in
//! place of the request's reservation (docs/semantics.md, "Cost reported by the response").
//!
//! The header is read with the response's head; a body is read as it streams to the client
//! ([`Tapped`]), never held back. The adjustment goes to the store on a task of its own as soon as
//! the report is known. A client that goes away before the end does not take the report with it
//! (it could otherwise dodge what a long answer cost by leaving before the last event): the rest
//! of the upstream's body is read, and dropped, for it, for at most [`DRAIN_TIME`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use quotagate_engine::clock::Clock;
use quotagate_engine::limiter::Limit;
use quotagate_engine::report::{BodyReport, CostFrom, NoReport, parse_reported};
use quotagate_store::{CounterKey, Part, Store};

use crate::observe::metrics::{Metrics, OutcomeLabels};

/// `quotagate_cost_reports_total`'s counters, looked up once (a family's lookup hashes and
/// locks).
pub struct Counts {
    reported: prometheus_client::metrics::counter::Counter,
    missing: prometheus_client::metrics::counter::Counter,
    invalid: prometheus_client::metrics::counter::Counter,
    too_large: prometheus_client::metrics::counter::Counter,
    cut_short: prometheus_client::metrics::counter::Counter,
}

impl Counts {
    pub fn new(metrics: &Metrics) -> Counts {
        let get = |outcome| {
            metrics
                .cost_reports
                .get_or_create(&OutcomeLabels { outcome })
                .clone()
        };
        Counts {
            reported: get("reported"),
            missing: get(NoReport::Missing.as_str()),
            invalid: get(NoReport::Invalid.as_str()),
            too_large: get(NoReport::TooLarge.as_str()),
            cut_short: get(NoReport::CutShort.as_str()),
        }
    }

    fn of(&self, report: &Result<u64, NoReport>) -> &prometheus_client::metrics::counter::Counter {
        match report {
            Ok(_) => &self.reported,
            Err(NoReport::Missing) => &self.missing,
            Err(NoReport::Invalid) => &self.invalid,
            Err(NoReport::TooLarge) => &self.too_large,
            Err(NoReport::CutShort) => &self.cut_short,
        }
    }
}

/// What every report is settled with: one per proxy, shared by each pending request (one
/// reference counted per request, not three).
pub struct Settler {
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    pub counts: Counts,
}

/// A request admitted with a reservation, waiting for its response's report.
pub struct Pending {
    pub settler: Arc<Settler>,
    /// Its counter, its pools' (each with its number of limits) and the limits it was counted in.
    pub counter: CounterKey,
    pub pools: Vec<(CounterKey, usize)>,
    pub limits: Vec<Limit>,
    /// The units reserved, and when (the caller's clock).
    pub reserved: u64,
    pub reserved_at_ms: u64,
}

impl Pending {
    /// The response reported `report`: its difference from the reservation goes to the store
    /// (at once in memory, on a task of its own for a shared store); no report keeps the
    /// reservation. Counted in the metric either way.
    pub fn settle(self, report: Result<u64, NoReport>) {
        let settler = &*self.settler;
        settler.counts.of(&report).inc();
        let Ok(reported) = report else { return };
        let delta = reported as i64 - self.reserved as i64;
        if delta == 0 || self.limits.is_empty() {
            return;
        }
        let now_ms = || settler.clock.now_ms();
        let done = Part::with_split(&self.counter, &self.limits, &self.pools, |parts| {
            (settler.store).adjust_in_memory(parts, delta, self.reserved_at_ms, now_ms)
        });
        if done {
            return;
        }
        let now_ms = settler.clock.now_ms();
        tokio::spawn(async move {
            let parts = Part::split(&self.counter, &self.limits, &self.pools);
            (self.settler.store)
                .adjust(&parts, delta, self.reserved_at_ms, now_ms)
                .await;
        });
    }

    /// How the response with `fields` reports, for `from`: settled now (a header, or a body
    /// that carries no report), or a reader for its body.
    pub fn read(self, from: &CostFrom, fields: Fields<'_>, max_bytes: usize) -> Option<Tap> {
        match from {
            CostFrom::Header(name) => {
                let report = match fields.get(name.as_str()) {
                    Some(v) => parse_reported(v),
                    None => Err(NoReport::Missing),
                };
                self.settle(report);
                None
            }
            CostFrom::Json(path) => {
                let kind = fields.get(&http::header::CONTENT_TYPE).unwrap_or_default();
                match BodyReport::new(kind, path, max_bytes) {
                    Some(reader) => Some(Tap {
                        reader,
                        pending: self,
                    }),
                    None => {
                        self.settle(Err(NoReport::Missing));
                        None
                    }
                }
            }
        }
    }
}

/// A response's fields: those in its map, then those passed on as lines.
#[derive(Clone, Copy)]
pub struct Fields<'a> {
    pub map: &'a http::HeaderMap,
    pub lines: &'a crate::server::Written,
}

impl Fields<'_> {
    /// The first value of the field `name` (lower case).
    fn get<K>(&self, name: K) -> Option<&[u8]>
    where
        K: http::header::AsHeaderName + AsRef<str> + Copy,
    {
        match self.map.get(name) {
            Some(v) => Some(v.as_bytes()),
            None => self.lines.get(name.as_ref()),
        }
    }
}

/// The rates a request of `rate` was counted in (a shadow limit only if no shadow refused it)
/// and, of them, how many each pool of `pools` has (its own come first). A report changes what
/// a request cost, not that it is in flight: its concurrency slots are not among them.
pub fn counted(
    rate: &quotagate_engine::limiter::Rate<'_>,
    pools: &[(CounterKey, usize)],
) -> (Vec<Limit>, Vec<(CounterKey, usize)>) {
    super::admission::kept(&rate.limits, pools, |i, l| {
        !l.is_concurrent() && rate.outcome.counted_in(i, l)
    })
}

/// How long the rest of a body is read for its report once its client has gone.
pub const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(300);

/// A body being read for its report.
pub struct Tap {
    reader: BodyReport,
    pending: Pending,
}

/// A response body on its way to the client, read for its report when it has a [`Tap`]
/// (otherwise passed through untouched). Dropped before its end by a client that went away, the
/// rest is read for the report on a task of its own; a body that failed keeps the reservation.
pub struct Tapped<B: Body<Data = Bytes> + Unpin + Send + 'static> {
    /// Always there but while being dropped.
    body: Option<B>,
    tap: Option<Box<Tap>>,
    /// The request's concurrency slots, freed when the body is done with (sent, or its client
    /// gone). Boxed: rare, and a body is moved along every response.
    in_flight: Option<Box<super::in_flight::InFlight>>,
}

impl<B: Body<Data = Bytes> + Unpin + Send + 'static> Tapped<B> {
    pub fn new(body: B, tap: Option<Tap>) -> Self {
        let mut tapped = Tapped {
            body: Some(body),
            tap: tap.map(Box::new),
            in_flight: None,
        };
        if tapped.body.as_ref().is_some_and(|b| b.is_end_stream()) {
            tapped.finish();
        }
        tapped
    }

    /// This body, holding `in_flight` until it is done with.
    pub fn holding(mut self, in_flight: Option<super::in_flight::InFlight>) -> Self {
        self.in_flight = in_flight.map(Box::new);
        self
    }

    fn finish(&mut self) {
        if let Some(tap) = self.tap.take() {
            let Tap { reader, pending } = *tap;
            pending.settle(reader.end());
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin + Send + 'static> Drop for Tapped<B> {
    fn drop(&mut self) {
        // The tap first: most bodies have none, and taking the body moves it.
        let Some(tap) = self.tap.take() else { return };
        let Some(body) = self.body.take() else { return };
        tokio::spawn(drain(body, *tap));
    }
}

/// Reads the rest of `body` (its client has gone) for `tap`'s report, for at most
/// [`DRAIN_TIME`].
async fn drain<B: Body<Data = Bytes> + Unpin>(mut body: B, tap: Tap) {
    use http_body_util::BodyExt;
    let Tap {
        mut reader,
        pending,
    } = tap;
    let read = async {
        loop {
            match body.frame().await {
                Some(Ok(f)) => {
                    if let Some(data) = f.data_ref() {
                        reader.feed(data);
                    }
                }
                Some(Err(_)) => return false,
                None => return true,
            }
        }
    };
    match tokio::time::timeout(DRAIN_TIME, read).await {
        Ok(true) => pending.settle(reader.end()),
        _ => pending.settle(Err(NoReport::CutShort)),
    }
}

impl<B: Body<Data = Bytes> + Unpin + Send + 'static> Body for Tapped<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = std::task::ready!(Pin::new(&mut *body).poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let (Some(tap), Some(data)) = (this.tap.as_mut(), f.data_ref()) {
                    tap.reader.feed(data);
                }
                if body.is_end_stream() {
                    this.finish();
                }
            }
            None => this.finish(),
            // The upstream broke off: no report, the reservation stays.
            Some(Err(_)) => {
                if let Some(tap) = this.tap.take() {
                    tap.pending.settle(Err(NoReport::CutShort));
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}
