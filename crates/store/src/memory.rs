//! memory: the embedded store. One process, no setup, bounded.
//!
//! Counters live in sharded maps of [`WindowSet`]s. A shard sweeps out idle counters (nothing left in
//! any of their windows) whenever it has doubled since its last sweep, so memory follows the number of counters
//! used in the last minute, never the number ever seen, at amortised O(1) per request.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use super::keys::CounterKey;
use super::{CounterStore, StoreError};
use quotagate_engine::limiter::{Limit, Outcome, WindowSet};

const SHARDS: usize = 32;
/// A shard is never swept below this many entries: sweeping tiny maps costs more than it saves.
const MIN_SWEEP_AT: usize = 1024;

#[derive(Debug)]
struct Shard {
    /// foldhash rather than SipHash: this runs on every counted request, and only catalog keys
    /// get a window, so clients cannot choose colliding keys. (Divvy's fixed windows, whose keys
    /// clients do choose, keep SipHash.)
    windows: HashMap<CounterKey, WindowSet, foldhash::fast::RandomState>,
    sweep_at: usize,
}

/// Sliding windows in memory, sharded by key.
#[derive(Debug)]
pub struct SlidingWindows {
    /// `std::sync::Mutex`: the critical section is a hash lookup and 60 additions, never held across
    /// an `.await`; sharding keeps unrelated keys from contending.
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
}

impl Default for SlidingWindows {
    fn default() -> Self {
        Self::new()
    }
}

impl SlidingWindows {
    pub fn new() -> Self {
        SlidingWindows {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        windows: HashMap::default(),
                        sweep_at: MIN_SWEEP_AT,
                    })
                })
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn shard(&self, key: &CounterKey) -> std::sync::MutexGuard<'_, Shard> {
        let i = (self.hasher.hash_one(key) as usize) % self.shards.len();
        // A panic while holding the lock cannot leave a window half-updated in a way that matters
        // more than refusing service would, so a poisoned lock is used as is.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`WindowSet::hit`] on `key`'s counter: checks one request of `cost` at `now_ms` against
    /// `limits` and counts it where it belongs, under one lock.
    pub fn hit(&self, key: &CounterKey, limits: &[Limit], cost: u64, now_ms: u64) -> Outcome {
        let mut shard = self.shard(key);
        if let Some(c) = shard.windows.get_mut(key) {
            return c.hit(limits, cost, now_ms);
        }
        if shard.windows.len() >= shard.sweep_at {
            shard.windows.retain(|_, c| !c.is_idle(now_ms));
            shard.sweep_at = (shard.windows.len() * 2).max(MIN_SWEEP_AT);
        }
        let mut counter = WindowSet::default();
        let outcome = counter.hit(limits, cost, now_ms);
        // A request that counted nothing leaves nothing behind.
        if !counter.is_idle(now_ms) {
            shard.windows.insert(key.clone(), counter);
        }
        outcome
    }

    /// [`WindowSet::peek`] of `key`'s counter (an empty one when it has none).
    pub fn peek(&self, key: &CounterKey, limits: &[Limit], cost: u64, now_ms: u64) -> Outcome {
        match self.shard(key).windows.get(key) {
            Some(c) => c.peek(limits, cost, now_ms),
            None => WindowSet::default().peek(limits, cost, now_ms),
        }
    }

    /// Forgets every window whose counter name starts with `prefix`; how many.
    pub fn forget(&self, prefix: &str) -> u64 {
        let mut gone = 0;
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            let before = shard.windows.len();
            shard.windows.retain(|k, _| !k.as_str().starts_with(prefix));
            gone += (before - shard.windows.len()) as u64;
        }
        gone
    }

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

/// The answer of a fixed window (Divvy): allowed, credit left, seconds until the window resets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedDecision {
    pub allowed: bool,
    pub credit: u64,
    pub reset: i64,
}

#[derive(Debug, Clone, Copy)]
struct Fixed {
    expires: u64,
    credit: u64,
}

#[derive(Debug)]
struct FixedShard {
    windows: HashMap<String, Fixed>,
    sweep_at: usize,
    /// When the shard was last swept because it was full: at most once a second.
    swept_full: u64,
}

/// Fixed windows that start at their first hit (Divvy's counters), in memory.
///
/// Expired windows are swept like idle sliding windows. Actors are whatever clients send, so the
/// number of live windows is capped at `max`; at the cap, new counters are refused (the request is
/// denied) until windows expire, rather than letting memory grow without bound.
#[derive(Debug)]
pub struct FixedWindows {
    /// `std::sync::Mutex`: a lookup and an update, never held across an `.await`.
    shards: Box<[Mutex<FixedShard>]>,
    hasher: RandomState,
    max_per_shard: usize,
    full_logged: std::sync::atomic::AtomicBool,
}

impl FixedWindows {
    /// At most `max` live windows.
    pub fn new(max: usize) -> Self {
        FixedWindows {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(FixedShard {
                        windows: HashMap::new(),
                        sweep_at: MIN_SWEEP_AT,
                        swept_full: 0,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
            max_per_shard: (max / SHARDS).max(1),
            full_logged: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// One hit of `cost` units at `now` (seconds) on the window `key` of `limit` units per `reset`
    /// seconds (both > 0); a hit without room takes none.
    pub fn hit(&self, key: &str, limit: u64, reset: u64, cost: u64, now: u64) -> FixedDecision {
        let i = (self.hasher.hash_one(key) as usize) % self.shards.len();
        let mut guard = self.shards[i].lock().unwrap_or_else(|e| e.into_inner());
        let shard = &mut *guard;
        let map = &mut shard.windows;
        if let Some(w) = map.get_mut(key).filter(|w| now < w.expires) {
            let ttl = (w.expires - now) as i64;
            if w.credit < cost {
                return FixedDecision {
                    allowed: false,
                    credit: w.credit,
                    reset: ttl,
                };
            }
            w.credit -= cost;
            return FixedDecision {
                allowed: true,
                credit: w.credit,
                reset: ttl,
            };
        }
        if cost > limit {
            return FixedDecision {
                allowed: false,
                credit: limit,
                reset: reset as i64,
            };
        }
        let full = map.len() >= self.max_per_shard && now > shard.swept_full;
        if map.len() >= shard.sweep_at || full {
            map.retain(|_, w| now < w.expires);
            shard.sweep_at = (map.len() * 2).max(MIN_SWEEP_AT);
            if full {
                shard.swept_full = now;
            }
        }
        if map.len() >= self.max_per_shard && !map.contains_key(key) {
            if !self
                .full_logged
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::warn!(
                    "divvy memory store is full: new counters are denied until windows expire"
                );
            }
            return FixedDecision {
                allowed: false,
                credit: 0,
                reset: reset as i64,
            };
        }
        map.insert(
            key.to_owned(),
            Fixed {
                expires: now + reset,
                credit: limit - cost,
            },
        );
        FixedDecision {
            allowed: true,
            credit: limit - cost,
            reset: reset as i64,
        }
    }
}

/// Live Divvy windows kept in memory at most (memory store, and the `local` fallback). Default:
/// 1,000,000.
pub const MAX_FIXED_WINDOWS: usize = 1_000_000;

/// The in-memory store: sliding windows for the gateway, fixed windows for the Divvy port. Also
/// the `local` fallback while a shared store is down.
#[derive(Debug)]
pub struct MemoryStore {
    windows: SlidingWindows,
    fixed: FixedWindows,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore {
            windows: SlidingWindows::new(),
            fixed: FixedWindows::new(MAX_FIXED_WINDOWS),
        }
    }

    /// [`SlidingWindows::hit`], without a future (the failover's local fallback and the store's own `hit`).
    pub fn hit_now(&self, key: &CounterKey, limits: &[Limit], cost: u64, now_ms: u64) -> Outcome {
        self.windows.hit(key, limits, cost, now_ms)
    }

    /// [`FixedWindows::hit`], without a future.
    pub fn hit_fixed_now(
        &self,
        key: &str,
        limit: u64,
        reset: u64,
        cost: u64,
        now: u64,
    ) -> FixedDecision {
        self.fixed.hit(key, limit, reset, cost, now)
    }
}

impl CounterStore for MemoryStore {
    async fn hit(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        Ok(self.hit_now(key, limits, cost, now_ms))
    }

    async fn hit_fixed(
        &self,
        key: &str,
        limit: u64,
        reset: u64,
        cost: u64,
        now: u64,
    ) -> Result<FixedDecision, StoreError> {
        Ok(self.hit_fixed_now(key, limit, reset, cost, now))
    }

    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn peek(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        Ok(self.windows.peek(key, limits, cost, now_ms))
    }

    async fn reset(&self, api_key: &[u8]) -> Result<u64, StoreError> {
        Ok(self.windows.forget(&CounterKey::api_key_prefix(api_key)))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_windows_start_at_the_first_hit_and_are_bounded() {
        let f = FixedWindows::new(SHARDS * 2);
        let d = |allowed, credit, reset| FixedDecision {
            allowed,
            credit,
            reset,
        };
        assert_eq!(f.hit("a", 2, 10, 1, 100), d(true, 1, 10));
        assert_eq!(f.hit("a", 2, 10, 1, 103), d(true, 0, 7));
        assert_eq!(f.hit("a", 2, 10, 1, 109), d(false, 0, 1));
        assert_eq!(
            f.hit("a", 2, 10, 1, 110),
            d(true, 1, 10),
            "a fresh window after expiry"
        );
        // At the cap, new counters are denied, old ones keep working, expired ones make room.
        for i in 0..10_000 {
            f.hit(&format!("k{i}"), 5, 60, 1, 200);
        }
        assert!(!f.hit("newcomer", 5, 60, 1, 200).allowed);
        assert!(
            f.hit("newcomer", 5, 60, 1, 260).allowed,
            "expired windows make room"
        );
    }

    #[test]
    fn a_cost_takes_credit_only_when_it_fits() {
        let f = FixedWindows::new(SHARDS * 2);
        let d = |allowed, credit, reset| FixedDecision {
            allowed,
            credit,
            reset,
        };
        assert_eq!(
            f.hit("a", 5, 10, 6, 100),
            d(false, 5, 10),
            "never fits: nothing kept"
        );
        assert_eq!(f.hit("a", 5, 10, 3, 100), d(true, 2, 10));
        assert_eq!(f.hit("a", 5, 10, 3, 101), d(false, 2, 9));
        assert_eq!(
            f.hit("a", 5, 10, 0, 102),
            d(true, 2, 8),
            "a check takes nothing"
        );
        assert_eq!(f.hit("a", 5, 10, 2, 103), d(true, 0, 7));
    }

    #[test]
    fn memory_stays_flat_under_a_stream_of_distinct_counters() {
        let store = SlidingWindows::new();
        let mut now = 1_700_000_000;
        let mut peak = 0;
        for i in 0..300_000u32 {
            if i % 1000 == 0 {
                now += 1; // 1000 new counters per second
            }
            store.hit(
                &CounterKey::new(&i.to_be_bytes(), "GET /x"),
                &[quotagate_engine::limiter::Limit::per_minute(10)],
                1,
                now * 1000,
            );
            if i % 10_000 == 0 {
                peak = peak.max(store.len());
            }
        }
        // 60 s of traffic is 60,000 live counters; sweeping at 2x bounds what is kept.
        assert!(peak <= 2 * 61_000 + SHARDS * MIN_SWEEP_AT, "peak {peak}");
        assert!(store.len() < 300_000);
    }
}
