//! blocked: counters known to be over their limit, so their requests are rejected without a Redis
//! round trip.
//!
//! This is exact, not an approximation: while a window rejects, nothing is counted (by any
//! instance), so the answer Redis would give changes only as its clock moves, until the second `b`
//! it reported ("rejected until"). A remembered block is used only for the same limit (a new catalog
//! may change it), and only when the script's second can be told for sure: with the caller's clock
//! that is exact; with Redis' clock it is estimated from the last reply's `TIME` (to the
//! microsecond), and near a second boundary the request goes to Redis instead.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
// tokio's clock: the same as std's in production, and frozen under a paused test runtime.
use tokio::time::Instant;

use super::keys::CounterKey;
use crate::limiter::Quota;

/// Blocks remembered at most; beyond that, expired ones are swept and new ones not remembered.
const MAX_BLOCKS: usize = 100_000;
/// With Redis' clock, how close to a second boundary the estimate may be before Redis is asked.
/// It covers the delay between Redis reading `TIME` and the reply being read here.
const BOUNDARY_MARGIN_US: i64 = 100_000;

#[derive(Debug, Clone, Copy)]
struct Block {
    limit: u64,
    /// The script's second from which the window accepts again.
    until: i64,
}

/// Remembered rejections of one Redis store.
#[derive(Debug)]
pub struct BlockCache {
    /// `std::sync::Mutex`: held for one hash lookup, never across an `.await`.
    blocks: Mutex<HashMap<CounterKey, Block>>,
    start: Instant,
    /// Redis time in microseconds minus microseconds since `start`, from the last reply;
    /// `i64::MIN` until a reply carried Redis' time.
    redis_offset_us: AtomicI64,
}

impl Default for BlockCache {
    fn default() -> Self {
        BlockCache {
            blocks: Mutex::new(HashMap::new()),
            start: Instant::now(),
            redis_offset_us: AtomicI64::new(i64::MIN),
        }
    }
}

impl BlockCache {
    fn elapsed_us(&self) -> i64 {
        i64::try_from(self.start.elapsed().as_micros()).unwrap_or(i64::MAX / 2)
    }

    /// Records the time Redis reported (`seconds` + `micros`) in a reply that just arrived.
    pub fn observe_redis_time(&self, seconds: i64, micros: i64) {
        let redis_us = seconds.saturating_mul(1_000_000).saturating_add(micros);
        self.redis_offset_us
            .store(redis_us - self.elapsed_us(), Ordering::Relaxed);
    }

    /// The script's current second with Redis' clock, if it is not too close to a boundary.
    fn redis_second(&self) -> Option<i64> {
        let offset = self.redis_offset_us.load(Ordering::Relaxed);
        if offset == i64::MIN {
            return None;
        }
        let us = self.elapsed_us() + offset;
        let frac = us.rem_euclid(1_000_000);
        (BOUNDARY_MARGIN_US..1_000_000 - BOUNDARY_MARGIN_US)
            .contains(&frac)
            .then(|| us.div_euclid(1_000_000))
    }

    /// The rejection Redis would give right now, if it is known. `caller_second` is the script's
    /// second when the caller's clock is used; `None` means Redis' clock.
    pub fn check(&self, key: &CounterKey, limit: u64, caller_second: Option<i64>) -> Option<Quota> {
        let mut blocks = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        let block = *blocks.get(key)?;
        if block.limit != limit {
            blocks.remove(key);
            return None;
        }
        let now = caller_second.or_else(|| self.redis_second())?;
        if now >= block.until {
            blocks.remove(key);
            return None;
        }
        let wait = u64::try_from(block.until - now).ok()?;
        Some(Quota {
            allowed: false,
            limit,
            remaining: 0,
            reset: wait,
            retry_after: Some(wait),
        })
    }

    /// Forgets the blocks of every counter whose name starts with `prefix` (its counts were reset).
    pub fn forget(&self, prefix: &str) {
        self.blocks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| !k.as_str().starts_with(prefix));
    }

    /// Remembers a rejection Redis gave at script second `now`.
    pub fn remember(&self, key: &CounterKey, limit: u64, now: i64, retry_after: u64) {
        let until = now.saturating_add(i64::try_from(retry_after).unwrap_or(i64::MAX / 2));
        let mut blocks = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        if blocks.len() >= MAX_BLOCKS && !blocks.contains_key(key) {
            // Anything that ended by `now` minus a window is certainly over.
            blocks.retain(|_, b| b.until > now - 60);
            if blocks.len() >= MAX_BLOCKS {
                return;
            }
        }
        blocks.insert(key.clone(), Block { limit, until });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.blocks.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(k: &str) -> CounterKey {
        CounterKey::new(k.as_bytes(), "GET /x")
    }

    #[test]
    fn with_the_callers_clock_the_answer_is_exact_until_the_block_ends() {
        let c = BlockCache::default();
        c.remember(&key("a"), 5, 1000, 7);
        let d = c.check(&key("a"), 5, Some(1000)).unwrap();
        assert_eq!(
            (d.allowed, d.retry_after, d.reset, d.remaining),
            (false, Some(7), 7, 0)
        );
        assert_eq!(
            c.check(&key("a"), 5, Some(1006)).unwrap().retry_after,
            Some(1)
        );
        assert!(
            c.check(&key("a"), 5, Some(1007)).is_none(),
            "the block has ended: ask Redis"
        );
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn another_limit_drops_the_block() {
        let c = BlockCache::default();
        c.remember(&key("a"), 5, 1000, 7);
        assert!(c.check(&key("a"), 6, Some(1000)).is_none());
        assert!(c.check(&key("a"), 5, Some(1000)).is_none(), "dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn with_redis_clock_only_away_from_second_boundaries() {
        let c = BlockCache::default();
        c.remember(&key("a"), 5, 1000, 10);
        assert!(
            c.check(&key("a"), 5, None).is_none(),
            "no Redis time seen yet"
        );
        c.remember(&key("a"), 5, 1000, 10);
        // Redis said 1000.5 s just now: safely inside second 1000.
        c.observe_redis_time(1000, 500_000);
        assert_eq!(c.check(&key("a"), 5, None).unwrap().retry_after, Some(10));
        // 0.45 s later it is 1000.95: too close to call.
        tokio::time::advance(Duration::from_millis(450)).await;
        assert!(c.check(&key("a"), 5, None).is_none());
    }

    #[test]
    fn the_cache_is_bounded() {
        let c = BlockCache::default();
        for i in 0..MAX_BLOCKS + 10 {
            c.remember(&key(&i.to_string()), 5, 1000, 10);
        }
        assert_eq!(c.len(), MAX_BLOCKS);
        // Once the old blocks are long over, they make room.
        c.remember(&key("late"), 5, 2000, 10);
        assert_eq!(c.len(), 1);
    }
}
