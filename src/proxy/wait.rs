//! wait: requests that wait for room instead of a 429 (`wait_ms`; docs/semantics.md, "Waiting
//! for room").
//!
//! Each counter with requests waiting on this instance has a line, and they are admitted in
//! arrival order: the head of the line holds its turn (a first-in first-out lock) while it waits,
//! and a later arrival on that counter waits behind it rather than asking the store first. For a
//! rate, the windows say when room comes for everyone in line: a request that could not get it
//! within its wait is refused at once. A waiting request costs a timer (and, for a slot, a wake-up
//! from the request that frees it on this instance), never a loop that spins; a client that goes
//! away leaves the line with its future.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use quotagate_engine::clock::Clock;
use quotagate_engine::limiter::{Limit, MAX_LIMITS, Outcome, WindowSet, line_room_in_ms};
use quotagate_store::{CounterKey, Part, Store, Verdict};
use tokio::sync::Notify;

use crate::observe::metrics::{Metrics, OutcomeLabels};

/// How often a request waiting for a slot on a shared store asks again: slots freed by other
/// instances are not announced.
pub const SLOT_POLL: Duration = Duration::from_millis(100);

/// How long a request refused with `outcome` may wait for room, in milliseconds: the least wait
/// of the enforced limits that refused it, when each has one and can pass later (`None`: it is
/// refused at once).
pub fn budget(limits: &[Limit], waits: &[u16; MAX_LIMITS], outcome: &Outcome) -> Option<u64> {
    if outcome.allowed {
        return None;
    }
    let mut least = None::<u64>;
    for ((l, q), w) in limits.iter().zip(outcome.quotas()).zip(waits) {
        if l.shadow || q.allowed {
            continue;
        }
        // A rate that can never pass the request has nothing to wait for.
        if *w == 0 || (!l.is_concurrent() && q.retry_after.is_none()) {
            return None;
        }
        least = Some(least.map_or(u64::from(*w), |x| x.min(u64::from(*w))));
    }
    least
}

/// How long a request that the store answered `first` may wait for room (`None`: the answer
/// stands).
pub fn wait_for(limits: &[Limit], waits: &[u16; MAX_LIMITS], first: &Verdict) -> Option<u64> {
    refusal(first).and_then(|o| budget(limits, waits, o))
}

/// The longest any enforced limit lets a request wait (for one that joins a line without asking
/// the store first: it does not know yet which limit would refuse it).
fn longest(limits: &[Limit], waits: &[u16; MAX_LIMITS]) -> u64 {
    let enforced = limits.iter().zip(waits).filter(|(l, _)| !l.shadow);
    enforced.map(|(_, w)| u64::from(*w)).max().unwrap_or(0)
}

/// The outcome of a verdict that refused, if it did.
fn refusal(v: &Verdict) -> Option<&Outcome> {
    match v {
        Verdict::Decided(o) | Verdict::Local(o) if !o.allowed => Some(o),
        _ => None,
    }
}

/// One counter's line on this instance.
#[derive(Default)]
struct Line {
    /// Held by the request whose turn it is (first in, first out).
    turn: tokio::sync::Mutex<()>,
    members: AtomicUsize,
    /// A slot of the counter was freed here.
    freed: Notify,
}

/// `quotagate_waits_total`'s counters and the rest, looked up once.
struct Counts {
    waiting: Gauge,
    admitted: Counter,
    refused: Counter,
    gone: Counter,
    seconds: Histogram,
}

/// Every line of this instance.
pub struct Lines {
    lines: Mutex<HashMap<CounterKey, Arc<Line>, foldhash::fast::RandomState>>,
    /// Requests in every line.
    waiting: AtomicUsize,
    max: usize,
    counts: Counts,
}

/// What one request asks while it waits.
pub struct Ask<'a> {
    pub store: &'a Store,
    pub clock: &'a dyn Clock,
    /// Its own counter (its line's).
    pub counter: &'a CounterKey,
    pub parts: &'a [Part<'a>],
    /// Every limit of `parts`, in order.
    pub limits: &'a [Limit],
    pub cost: u64,
    pub waits: &'a [u16; MAX_LIMITS],
}

impl Lines {
    /// Lines of at most `max` requests in all.
    pub fn new(max: usize, metrics: &Metrics) -> Lines {
        let outcome = |outcome| {
            metrics
                .waits
                .get_or_create(&OutcomeLabels { outcome })
                .clone()
        };
        Lines {
            lines: Mutex::default(),
            waiting: AtomicUsize::new(0),
            max,
            counts: Counts {
                waiting: metrics.waiting.clone(),
                admitted: outcome("admitted"),
                refused: outcome("refused"),
                gone: outcome("client_gone"),
                seconds: metrics.wait_seconds.clone(),
            },
        }
    }

    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<CounterKey, Arc<Line>, foldhash::fast::RandomState>>
    {
        self.lines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Has `counter` a line of requests waiting here? (No lock while nobody waits.)
    pub fn busy(&self, counter: &CounterKey) -> bool {
        self.waiting() > 0 && self.map().contains_key(counter)
    }

    /// Slots of `counters` were freed here: each line's head looks again.
    pub fn freed<'c>(&self, counters: impl Iterator<Item = &'c CounterKey>) {
        if self.waiting() == 0 {
            return;
        }
        let map = self.map();
        for c in counters {
            if let Some(line) = map.get(c) {
                line.freed.notify_one();
            }
        }
    }

    /// A place at the end of `counter`'s line; `None` when the lines are full.
    fn join(&self, counter: &CounterKey) -> Option<Place<'_>> {
        if self.waiting.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        // Members change under the map's lock: a line is removed only while empty.
        let line = {
            let mut map = self.map();
            let line = map.entry(counter.clone()).or_default().clone();
            line.members.fetch_add(1, Ordering::Relaxed);
            line
        };
        self.counts.waiting.inc();
        Some(Place {
            lines: self,
            counter: counter.clone(),
            line,
            since: tokio::time::Instant::now(),
            outcome: None,
            counted: true,
        })
    }

    /// Decides a request that may wait: `first`, the store's verdict, when it was asked (a
    /// refusal that may wait is waited on; anything else is the answer), or `None` when the
    /// request found a line on its counter and joins it without asking.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future (rust-lang/rust#62958)"
    )]
    pub fn decide(
        &self,
        ask: &Ask<'_>,
        first: Option<Verdict>,
    ) -> impl std::future::Future<Output = Verdict> + Send {
        async move {
            let budget = match &first {
                Some(v) => match wait_for(ask.limits, ask.waits, v) {
                    Some(b) => b,
                    None => return first.expect("asked"),
                },
                None => longest(ask.limits, ask.waits),
            };
            let hit = || ask.store.hit_parts(ask.parts, ask.cost, ask.clock.now_ms());
            // Bound in one statement: an `Option` kept in a local of its own would keep its place in
            // the future beside the place taken out of it.
            let Some(mut place) = (match budget {
                0 => None,
                _ => self.join(ask.counter),
            }) else {
                // The lines are full (or nothing waits): as if no line were here.
                return match first {
                    Some(v) => v,
                    None => Box::pin(hit()).await,
                };
            };
            let started_ms = ask.clock.now_ms();
            let deadline_ms = started_ms + budget;
            // Room for everyone in line, by the windows as they stand.
            let rates = ask.limits.iter().any(|l| !l.shadow && !l.is_concurrent());
            if rates {
                let ahead = place.line.members.load(Ordering::Relaxed) as u64;
                let eta = Box::pin(self.room(ask, ahead, started_ms)).await;
                if eta.is_none_or(|ms| ms > budget) {
                    place.outcome = Some(Ended::Refused);
                    place.counted = false;
                    return match first {
                        Some(v) => v,
                        None => Box::pin(self.refused_behind(ask, eta)).await,
                    };
                }
            }
            // Its turn, within the wait; then room, within the wait (by the clock of the decisions).
            let waited = async {
                let _turn = place.line.turn.lock().await;
                loop {
                    // Store calls boxed: a waiting request's future holds only its timer.
                    let v = Box::pin(hit()).await;
                    let Some(o) = refusal(&v) else {
                        return (v, Ended::Admitted);
                    };
                    let now_ms = ask.clock.now_ms();
                    if budget_left(ask, o, now_ms, deadline_ms).is_none() {
                        return (v, Ended::Refused);
                    }
                    let by_rate = ask
                        .limits
                        .iter()
                        .zip(o.quotas())
                        .any(|(l, q)| !l.shadow && !q.allowed && !l.is_concurrent());
                    if by_rate {
                        match Box::pin(self.room(ask, 1, now_ms)).await {
                            Some(ms) if now_ms + ms <= deadline_ms => {
                                until(ask.clock, now_ms + ms.max(1)).await;
                            }
                            _ => return (v, Ended::Refused),
                        }
                    } else {
                        // A slot: woken when one is freed here or (on a shared store, in real time)
                        // to ask again for one freed by another instance. The end of the wait is the
                        // deadline's below: a timer of its own here would be a second one in every
                        // waiting request's future.
                        let poll = async {
                            match ask.store.shared() {
                                Some(_) => tokio::time::sleep(SLOT_POLL).await,
                                None => std::future::pending().await,
                            }
                        };
                        tokio::select! {
                            _ = place.line.freed.notified() => {}
                            _ = poll => {}
                        }
                    }
                }
            };
            // The wait's end, for its turn and for room alike.
            let ended = tokio::select! {
                ended = waited => Some(ended),
                _ = until(ask.clock, deadline_ms) => None,
            };
            match ended {
                Some((v, outcome)) => {
                    place.outcome = Some(outcome);
                    v
                }
                None => {
                    place.outcome = Some(Ended::Refused);
                    Box::pin(self.refused_behind(ask, None)).await
                }
            }
        }
    }

    /// Milliseconds from `now_ms` until every rate of `ask` has room for the last of
    /// `requests` like it (those in line, it last), by the windows as they stand (`None`: never,
    /// or they could not be read).
    async fn room(&self, ask: &Ask<'_>, requests: u64, now_ms: u64) -> Option<u64> {
        let (sets, at) = ask.store.windows(ask.parts, now_ms).await.ok()?;
        let parts: Vec<(&WindowSet, &[Limit])> = sets
            .iter()
            .zip(ask.parts)
            .map(|(s, p)| (s, p.limits))
            .collect();
        line_room_in_ms(&parts, requests, ask.cost, at)
    }

    /// The answer of a request refused behind others in line (or whose wait ran out in line):
    /// its limits as they stand, told as a refusal with `eta_ms`'s wait.
    async fn refused_behind(&self, ask: &Ask<'_>, eta_ms: Option<u64>) -> Verdict {
        let now_ms = ask.clock.now_ms();
        match ask.store.peek_parts(ask.parts, ask.cost, now_ms).await {
            Ok(o) => Verdict::Decided(o.refused_behind(ask.limits, eta_ms)),
            // The store cannot be read: its failure policy answers, as for a hit.
            Err(_) => ask.store.hit_parts(ask.parts, ask.cost, now_ms).await,
        }
    }
}

/// Resolves once `clock` reads `at_ms`: woken by a clock moved by hand (a test's), else after
/// the time left in real time.
async fn until(clock: &dyn Clock, at_ms: u64) {
    let by_hand = std::future::poll_fn(|cx| {
        if clock.now_ms() >= at_ms {
            Poll::Ready(true)
        } else if clock.wake_at(at_ms, cx.waker()) {
            Poll::Pending
        } else {
            Poll::Ready(false)
        }
    })
    .await;
    if by_hand {
        return;
    }
    // A clock read from the system may be a millisecond behind the timer: sleep what is left.
    loop {
        let now_ms = clock.now_ms();
        if now_ms >= at_ms {
            return;
        }
        tokio::time::sleep(Duration::from_millis(at_ms - now_ms)).await;
    }
}

/// Whether a request refused with `o` at `now_ms` may still wait (its deadline not passed, every
/// refusing limit one that waits).
fn budget_left(ask: &Ask<'_>, o: &Outcome, now_ms: u64, deadline_ms: u64) -> Option<u64> {
    budget(ask.limits, ask.waits, o)?;
    (now_ms < deadline_ms).then(|| deadline_ms - now_ms)
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Admitted,
    Refused,
}

/// A request's place in a line: leaves it when dropped, counting how the wait ended (a place
/// dropped without an outcome: its client went away).
struct Place<'a> {
    lines: &'a Lines,
    counter: CounterKey,
    line: Arc<Line>,
    since: tokio::time::Instant,
    outcome: Option<Ended>,
    /// A wait to count in the metrics (not a request refused at once).
    counted: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let lines = self.lines;
        {
            let mut map = lines.map();
            if self.line.members.fetch_sub(1, Ordering::Relaxed) == 1 {
                map.remove(&self.counter);
            }
        }
        lines.waiting.fetch_sub(1, Ordering::Relaxed);
        lines.counts.waiting.dec();
        if !self.counted {
            return;
        }
        let c = &lines.counts;
        match self.outcome {
            Some(Ended::Admitted) => c.admitted.inc(),
            Some(Ended::Refused) => c.refused.inc(),
            None => c.gone.inc(),
        };
        c.seconds.observe(self.since.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotagate_engine::limiter::Quota;

    fn quota(allowed: bool, retry_after: Option<u64>) -> Quota {
        Quota {
            allowed,
            limit: 5,
            remaining: 0,
            reset: 1,
            retry_after,
        }
    }

    #[test]
    fn a_refusal_waits_the_least_of_the_waits_of_the_limits_that_refused_it() {
        let limits = [
            Limit::sliding(5, 1),
            Limit::sliding(50, 60),
            Limit::concurrent(2),
            Limit::sliding(9, 10).shadowed(true),
        ];
        let waits = [800, 200, 1000, 0, 0, 0];
        let o = |q: [Quota; 4]| Outcome::new(q.iter().all(|q| q.allowed), false, &q);
        let yes = quota(true, None);
        let no = quota(false, Some(1));
        assert_eq!(budget(&limits, &waits, &o([no, yes, yes, yes])), Some(800));
        assert_eq!(budget(&limits, &waits, &o([no, no, yes, yes])), Some(200));
        assert_eq!(
            budget(&limits, &waits, &o([yes, yes, quota(false, None), no])),
            Some(1000),
            "a slot waits though nothing says when; a shadow refusal is not a refusal"
        );
        assert_eq!(
            budget(&limits, &waits, &o([quota(false, None), yes, yes, yes])),
            None,
            "a cost above a rate never passes"
        );
        assert_eq!(budget(&limits, &waits, &o([yes; 4])), None, "admitted");
        let no_wait = [800, 0, 1000, 0, 0, 0];
        assert_eq!(
            budget(&limits, &no_wait, &o([no, no, yes, yes])),
            None,
            "refused by a limit that does not wait"
        );
        assert_eq!(longest(&limits, &waits), 1000);
    }
}
