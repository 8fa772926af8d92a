//! slots: the concurrency-limit slots this instance holds on Redis, pure bookkeeping (the calls
//! stay in `redis.rs`; the layout is `window.lua`'s).
//!
//! A request that takes slots takes them under one name, unique among every instance's requests
//! in flight (`<instance>.<n>`), so that a call retried after a lost reply takes no second slot.
//! Slots of one counter are alike: a request that ends frees any one this instance holds there.
//! Every slot held is renewed while the instance lives ([`Slots::renewals`]); one whose instance
//! died is dropped by the next call on its counter once its hold time has passed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::keys::CounterKey;

/// Slot names in one renewal call at most: a Lua call's arguments are bounded (`unpack`).
pub const RENEWED_PER_CALL: usize = 500;

/// The slots this instance holds, by counter.
#[derive(Debug)]
pub struct Slots {
    /// This instance's part of every slot name: random, so instances never share one.
    instance: String,
    next: AtomicU64,
    hold: Duration,
    held: Mutex<HashMap<CounterKey, Vec<String>, foldhash::fast::RandomState>>,
}

impl Slots {
    /// Bookkeeping for slots held `hold` past their last write.
    pub fn new(hold: Duration) -> Slots {
        use std::hash::BuildHasher;
        let seed = std::hash::RandomState::new().hash_one(std::process::id());
        Slots {
            instance: format!("{seed:016x}"),
            next: AtomicU64::new(0),
            hold,
            held: Mutex::default(),
        }
    }

    /// How long a slot is held after its last write, in milliseconds (at least 1).
    pub fn hold_ms(&self) -> u64 {
        u64::try_from(self.hold.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// How often what is held is renewed: a third of the hold time, so that two renewals may be
    /// lost (a slow or briefly unreachable Redis) before a live request's slot could be dropped.
    pub fn renew_every(&self) -> Duration {
        (self.hold / 3).max(Duration::from_millis(1))
    }

    /// A name for the slots of one request.
    pub fn name(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{}.{n}", self.instance)
    }

    fn held(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<CounterKey, Vec<String>, foldhash::fast::RandomState>>
    {
        // The map stays consistent whatever panicked while holding it.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request took slot `who` of `counter`.
    pub fn took(&self, counter: &CounterKey, who: &str) {
        self.held()
            .entry(counter.clone())
            .or_default()
            .push(who.to_owned());
    }

    /// A slot of `counter` to free (a request there ended), no longer held; `None` when this
    /// instance holds none there.
    pub fn release(&self, counter: &CounterKey) -> Option<String> {
        let mut held = self.held();
        let names = held.get_mut(counter)?;
        let who = names.pop();
        if names.is_empty() {
            held.remove(counter);
        }
        who
    }

    /// Slots held now, by counter: each counter's names joined by commas, at most
    /// [`RENEWED_PER_CALL`] in one entry.
    pub fn renewals(&self) -> Vec<(CounterKey, String)> {
        let held = self.held();
        let mut out = Vec::with_capacity(held.len());
        for (counter, names) in held.iter() {
            for chunk in names.chunks(RENEWED_PER_CALL) {
                out.push((counter.clone(), chunk.join(",")));
            }
        }
        out
    }

    /// Slots held now, in all.
    pub fn len(&self) -> usize {
        self.held().values().map(Vec::len).sum()
    }

    /// No slot is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_slots_of_a_counter_alike() {
        let s = Slots::new(Duration::from_secs(10));
        let (a, b) = (s.name(), s.name());
        assert_ne!(a, b);
        assert_ne!(
            a,
            Slots::new(Duration::from_secs(10)).name(),
            "per instance"
        );
        let k = CounterKey::new(b"key", "GET /a");
        s.took(&k, &a);
        s.took(&k, &b);
        assert_eq!(s.renewals(), [(k.clone(), format!("{a},{b}"))]);
        assert_eq!(s.release(&k), Some(b));
        assert_eq!(s.release(&k), Some(a));
        assert_eq!(s.release(&k), None, "none held");
        assert!(s.is_empty() && s.renewals().is_empty());
        assert_eq!(
            (s.hold_ms(), s.renew_every()),
            (10_000, Duration::from_secs(10) / 3)
        );
    }

    #[test]
    fn a_renewal_call_names_a_bounded_number_of_slots() {
        let s = Slots::new(Duration::from_secs(1));
        let k = CounterKey::new(b"key", "GET /a");
        for _ in 0..RENEWED_PER_CALL + 1 {
            s.took(&k, &s.name());
        }
        let r = s.renewals();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].1.split(',').count(), RENEWED_PER_CALL);
        assert_eq!(s.len(), RENEWED_PER_CALL + 1);
    }
}
