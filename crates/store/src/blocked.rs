//! blocked: counters known to be over their limit, so their requests are refused without a Redis
//! round trip.
//!
//! This is exact, not an approximation: while a window refuses, nothing is counted in it (by any
//! instance), so the answer Redis would give changes only as its clock moves, until the moment it
//! reported ("refused until"). Only requests with one enforced limit and no shadow limit are
//! remembered (with several, another window's answer can change sooner). A remembered block is used
//! only for the same limit and cost (a new catalog may change them), and only when the answer can
//! be told for sure: with the caller's clock that is exact; with Redis' clock the time is estimated
//! from the last reply's `TIME` (to the microsecond), and when the estimate is too close to call
//! (the block's end, or a change in the whole seconds of the wait) the request goes to Redis.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
// tokio's clock: the same as std's in production, and frozen under a paused test runtime.
use tokio::time::Instant;

use super::keys::CounterKey;
use quotagate_engine::limiter::{Limit, Quota};

/// Blocks remembered at most; beyond that, expired ones are swept and new ones not remembered.
const MAX_BLOCKS: usize = 100_000;
/// With Redis' clock, how far the estimate of Redis' time may be off. It covers the delay between
/// Redis reading `TIME` and the reply being read here.
const MARGIN_US: i64 = 100_000;

#[derive(Debug, Clone, Copy)]
struct Block {
    limit: Limit,
    cost: u64,
    /// The script's time (Unix microseconds) from which the window accepts again.
    until_us: i64,
    /// Trusted until this time: the block's end, or with leases the end of the bucket it was
    /// computed in (a lease given back may make room sooner, but every lease of a bucket is given
    /// back by the end of the next).
    trust_until_us: i64,
}

/// Remembered refusals of one Redis store.
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

fn wait_seconds(us: i64) -> i64 {
    (us + 999_999).div_euclid(1_000_000)
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

    /// The refusal Redis would give right now, if it is known. `caller_ms` is the script's time
    /// when the caller's clock is used; `None` means Redis' clock.
    pub fn check(
        &self,
        key: &CounterKey,
        limit: &Limit,
        cost: u64,
        caller_ms: Option<i64>,
    ) -> Option<Quota> {
        let mut blocks = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        let block = *blocks.get(key)?;
        if block.limit != *limit || block.cost != cost {
            blocks.remove(key);
            return None;
        }
        let (earliest, latest) = match caller_ms {
            Some(ms) => (ms.saturating_mul(1000), ms.saturating_mul(1000)),
            None => {
                let offset = self.redis_offset_us.load(Ordering::Relaxed);
                if offset == i64::MIN {
                    return None;
                }
                let us = self.elapsed_us() + offset;
                (us - MARGIN_US, us + MARGIN_US)
            }
        };
        if latest >= block.trust_until_us {
            if earliest >= block.trust_until_us {
                blocks.remove(key);
            }
            return None;
        }
        let wait = wait_seconds(block.until_us - earliest);
        if wait != wait_seconds(block.until_us - latest) {
            return None;
        }
        let wait = u64::try_from(wait).ok()?;
        Some(Quota {
            allowed: false,
            limit: limit.rl,
            remaining: 0,
            reset: wait,
            retry_after: Some(wait),
        })
    }

    /// Forgets `key`'s block (a lease was just granted on it: its window has room).
    pub fn remove(&self, key: &CounterKey) {
        self.blocks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// Forgets the blocks of every counter whose name starts with `prefix` (its counts were reset).
    pub fn forget(&self, prefix: &str) {
        self.blocks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| !k.as_str().starts_with(prefix));
    }

    /// Remembers a refusal Redis gave at script time `now_ms`, to last `retry_ms`, trusted until
    /// script time `trust_ms` at most.
    pub fn remember(
        &self,
        key: &CounterKey,
        limit: &Limit,
        cost: u64,
        now_ms: i64,
        retry_ms: i64,
        trust_ms: i64,
    ) {
        let until_us = now_ms.saturating_add(retry_ms).saturating_mul(1000);
        let trust_until_us = trust_ms.saturating_mul(1000).min(until_us);
        let mut blocks = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        if blocks.len() >= MAX_BLOCKS && !blocks.contains_key(key) {
            // Anything that ended by `now` is certainly over.
            let now_us = now_ms.saturating_mul(1000);
            blocks.retain(|_, b| b.trust_until_us > now_us);
            if blocks.len() >= MAX_BLOCKS {
                return;
            }
        }
        blocks.insert(
            key.clone(),
            Block {
                limit: *limit,
                cost,
                until_us,
                trust_until_us,
            },
        );
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

    const L5: Limit = Limit::per_minute(5);

    fn key(k: &str) -> CounterKey {
        CounterKey::new(k.as_bytes(), "GET /x")
    }

    #[test]
    fn with_the_callers_clock_the_answer_is_exact_until_the_block_ends() {
        let c = BlockCache::default();
        c.remember(&key("a"), &L5, 1, 1_000_000, 7_000, i64::MAX);
        let d = c.check(&key("a"), &L5, 1, Some(1_000_000)).unwrap();
        assert_eq!(
            (d.allowed, d.retry_after, d.reset, d.remaining),
            (false, Some(7), 7, 0)
        );
        assert_eq!(
            c.check(&key("a"), &L5, 1, Some(1_006_000))
                .unwrap()
                .retry_after,
            Some(1)
        );
        assert!(
            c.check(&key("a"), &L5, 1, Some(1_007_000)).is_none(),
            "the block has ended: ask Redis"
        );
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn another_limit_drops_the_block() {
        let c = BlockCache::default();
        c.remember(&key("a"), &L5, 1, 1_000_000, 7_000, i64::MAX);
        assert!(
            c.check(&key("a"), &Limit::per_minute(6), 1, Some(1_000_000))
                .is_none()
        );
        assert!(
            c.check(&key("a"), &L5, 1, Some(1_000_000)).is_none(),
            "dropped"
        );
        c.remember(&key("a"), &L5, 1, 1_000_000, 7_000, i64::MAX);
        assert!(
            c.check(&key("a"), &L5, 2, Some(1_000_000)).is_none(),
            "another cost"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn with_redis_clock_only_away_from_second_boundaries() {
        let c = BlockCache::default();
        c.remember(&key("a"), &L5, 1, 1_000_000, 10_000, i64::MAX);
        assert!(
            c.check(&key("a"), &L5, 1, None).is_none(),
            "no Redis time seen yet"
        );
        c.remember(&key("a"), &L5, 1, 1_000_000, 10_000, i64::MAX);
        // Redis said 1000.5 s just now: safely inside second 1000.
        c.observe_redis_time(1000, 500_000);
        assert_eq!(
            c.check(&key("a"), &L5, 1, None).unwrap().retry_after,
            Some(10)
        );
        // 0.45 s later it is 1000.95: too close to call.
        tokio::time::advance(Duration::from_millis(450)).await;
        assert!(c.check(&key("a"), &L5, 1, None).is_none());
    }

    #[test]
    fn the_cache_is_bounded() {
        let c = BlockCache::default();
        for i in 0..MAX_BLOCKS + 10 {
            c.remember(&key(&i.to_string()), &L5, 1, 1_000_000, 10_000, i64::MAX);
        }
        assert_eq!(c.len(), MAX_BLOCKS);
        // Once the old blocks are long over, they make room.
        c.remember(&key("late"), &L5, 1, 2_000_000, 10_000, i64::MAX);
        assert_eq!(c.len(), 1);
    }
}
