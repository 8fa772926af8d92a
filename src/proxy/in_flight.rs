//! in_flight: the concurrency-limit slots an admitted request holds, freed when it ends
//! (docs/semantics.md, "Concurrency limits").
//!
//! The request's [`InFlight`] travels with it and frees its slots when dropped: with the
//! response's body once it has been sent in full or its client went away (the upstream request is
//! then abandoned), at once on an upstream failure, and with the relay of an upgraded connection
//! when that closes. Dropping is the one way out, so no path can forget it.

use std::sync::Arc;

use quotagate_engine::clock::Clock;
use quotagate_engine::limiter::{Limit, Rate};
use quotagate_store::{CounterKey, Part, Store};

use super::admission::{Holds, kept};

/// The store and clock slots are freed with, and the lines waiting for them (one per proxy).
pub struct Freer {
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    pub lines: Arc<super::wait::Lines>,
}

impl Freer {
    /// Slots of `counter` and `pools` were freed: the requests waiting for them look again.
    fn wake(&self, counter: &CounterKey, pools: &[(CounterKey, usize)]) {
        let pooled = pools.iter().filter(|(_, n)| *n > 0).map(|(c, _)| c);
        self.lines.freed(std::iter::once(counter).chain(pooled));
    }
}

/// The slots one request holds.
pub struct InFlight {
    freer: Arc<Freer>,
    counter: CounterKey,
    pools: Vec<(CounterKey, usize)>,
    /// The concurrency limits it took a slot in, its own first, then each pool's.
    limits: Vec<Limit>,
    /// Taken in this instance's memory (decided there while the shared store was down).
    in_memory: bool,
}

impl InFlight {
    /// The slots a request admitted with `rate` took (`None`: none).
    pub fn took(freer: &Arc<Freer>, rate: &Rate<'_>, holds: Holds) -> Option<InFlight> {
        let (limits, pools) = kept(&rate.limits, &holds.pools, |i, l| {
            l.is_concurrent() && rate.outcome.counted_in(i, l)
        });
        if limits.is_empty() {
            return None;
        }
        Some(InFlight {
            freer: freer.clone(),
            counter: holds.counter,
            pools,
            limits,
            in_memory: holds.in_memory,
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let (counter, limits, pools) = (&self.counter, &self.limits, &self.pools);
        let freed = self
            .freer
            .store
            .free_in_memory(&Part::split(counter, limits, pools), self.in_memory);
        if freed {
            self.freer.wake(counter, pools);
            return;
        }
        // (A body dropped outside a runtime, at exit: its slots are freed by their hold time.)
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let freer = self.freer.clone();
        let (counter, limits, pools) = (
            std::mem::replace(&mut self.counter, CounterKey::new(b"", "")),
            std::mem::take(&mut self.limits),
            std::mem::take(&mut self.pools),
        );
        runtime.spawn(async move {
            let now_ms = freer.clock.now_ms();
            let parts = Part::split(&counter, &limits, &pools);
            freer.store.free(&parts, false, now_ms).await;
            freer.wake(&counter, &pools);
        });
    }
}
