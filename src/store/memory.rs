//! memory: the embedded store. One process, no setup, bounded.
//!
//! Counters live in sharded maps of [`Window`]s. A shard sweeps out idle windows (nothing left in
//! their 60 s) whenever it has doubled since its last sweep, so memory follows the number of counters
//! used in the last minute, never the number ever seen, at amortised O(1) per request.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use super::keys::CounterKey;
use crate::limiter::{Decision, Window};

const SHARDS: usize = 32;
/// A shard is never swept below this many entries: sweeping tiny maps costs more than it saves.
const MIN_SWEEP_AT: usize = 1024;

#[derive(Debug)]
struct Shard {
    windows: HashMap<CounterKey, Window>,
    sweep_at: usize,
}

/// The in-memory store.
#[derive(Debug)]
pub struct MemoryStore {
    /// `std::sync::Mutex`: the critical section is a hash lookup and 60 additions, never held across
    /// an `.await`; sharding keeps unrelated keys from contending.
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        windows: HashMap::new(),
                        sweep_at: MIN_SWEEP_AT,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, key: &CounterKey) -> std::sync::MutexGuard<'_, Shard> {
        let i = (self.hasher.hash_one(key) as usize) % self.shards.len();
        // A panic while holding the lock cannot leave a window half-updated in a way that matters
        // more than refusing service would, so a poisoned lock is used as is.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks one request at `now` against `limit` (requests per 60 s) and counts it if allowed.
    pub fn hit(&self, key: &CounterKey, limit: u64, now: u64) -> Decision {
        if limit == 0 {
            return Decision::zero_limit();
        }
        let mut shard = self.shard(key);
        if let Some(w) = shard.windows.get_mut(key) {
            return w.hit(now, limit);
        }
        if shard.windows.len() >= shard.sweep_at {
            shard.windows.retain(|_, w| !w.is_idle(now));
            shard.sweep_at = (shard.windows.len() * 2).max(MIN_SWEEP_AT);
        }
        shard
            .windows
            .entry(key.clone())
            .or_default()
            .hit(now, limit)
    }

    /// Number of counters held (for tests and metrics).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).windows.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_stays_flat_under_a_stream_of_distinct_counters() {
        let store = MemoryStore::new();
        let mut now = 1_700_000_000;
        let mut peak = 0;
        for i in 0..300_000u32 {
            if i % 1000 == 0 {
                now += 1; // 1000 new counters per second
            }
            store.hit(&CounterKey::new(&i.to_be_bytes(), "GET /x"), 10, now);
            if i % 10_000 == 0 {
                peak = peak.max(store.len());
            }
        }
        // 60 s of traffic is 60,000 live counters; sweeping at 2x bounds what is kept.
        assert!(peak <= 2 * 61_000 + SHARDS * MIN_SWEEP_AT, "peak {peak}");
        assert!(store.len() < 300_000);
    }
}
