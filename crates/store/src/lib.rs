//! quotagate-store: where counters live, and what happens when that place fails.
//!
//! Owns:
//! - [`CounterStore`]: the one question every backend answers ("may this request pass its
//!   limits, and count it"), for every kind of window (`quotagate_engine::limiter::Kind`).
//! - [`MemoryStore`] (embedded, one instance) and [`RedisStore`] (shared by every instance on one
//!   Redis) implement it; the store behaviour suite (`tests/store.rs`) runs the same cases against
//!   both, on every Redis topology.
//! - [`Failover`]: this instance's memory, or a shared store under the failure policy (memory
//!   again for `local`); [`Store`] is it around Redis, what the doors hold. There is no dispatch
//!   over backends: memory is the failover's own.
//! - [`keys`]: every Redis key name; [`script`]: what the scripts (`window.lua`, `divvy.lua`) are
//!   given and answer, and how the windows lie in Redis' hashes, pure.
//! - [`Announcer`]: messages between instances over Redis pub/sub (catalog versions), on
//!   connections of its own.
//!
//! Depends on `quotagate-engine` (the window arithmetic the memory backend runs and the Redis
//! script mirrors) and must not depend on the application: no configuration file types, no HTTP,
//! no metrics registry. Its settings ([`StoreSettings`], [`RedisOptions`]) are plain values the
//! application builds.

mod announce;
mod blocked;
mod configured;
pub mod connect;
pub mod disk;
mod error;
mod failover;
pub mod keys;
pub mod lease;
pub mod memory;
pub mod redis;
pub mod script;
pub mod slots;
pub mod target;

use std::future::Future;

pub use self::redis::{RedisOptions, RedisStore, TimeSource};
pub use announce::Announcer;
pub use configured::{Sequence, Store, StoreSettings};
pub use error::StoreError;
pub use failover::Failover;
pub use keys::CounterKey;
pub use lease::{LeaseMode, StoreStats};
pub use memory::{FixedWindows, MAX_FIXED_WINDOWS, MemoryStore, SlidingWindows, Ticket};
pub use target::{RedisMode, RedisTarget};

use quotagate_engine::limiter::{Limit, Outcome, WindowSet};

/// One counter of a request and the limits that count in it: a request whose limits count in
/// several counters (its endpoint's and its pools') is decided over all of them at once
/// ([`CounterStore::hit_parts`]). Every counter of one request has the same hash tag (one API
/// key's, [`CounterKey::tag`]), so one Redis script call and one memory lock decide it.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    pub counter: &'a CounterKey,
    pub limits: &'a [Limit],
}

impl<'a> Part<'a> {
    /// The parts of a request whose own counter is `counter` and whose `limits` end with its
    /// pools' (`pools`: each pool's counter and how many of the limits are its): its own counter
    /// with its own limits (when it has some), then each pool's counter with the pool's.
    pub fn split(
        counter: &'a CounterKey,
        limits: &'a [Limit],
        pools: &'a [(CounterKey, usize)],
    ) -> Vec<Part<'a>> {
        let pooled: usize = pools.iter().map(|(_, n)| n).sum();
        let own = limits.len().saturating_sub(pooled);
        let mut parts = Vec::with_capacity(pools.len() + 1);
        if own > 0 {
            parts.push(Part {
                counter,
                limits: &limits[..own],
            });
        }
        let mut at = own;
        for (c, n) in pools {
            let end = (at + n).min(limits.len());
            parts.push(Part {
                counter: c,
                limits: &limits[at..end],
            });
            at = end;
        }
        parts
    }

    /// `f` of [`Part::split`]'s parts; a request without pools (most) lends its one part from
    /// the stack, where the list would be an allocation a request.
    pub fn with_split<R>(
        counter: &'a CounterKey,
        limits: &'a [Limit],
        pools: &'a [(CounterKey, usize)],
        f: impl FnOnce(&[Part<'_>]) -> R,
    ) -> R {
        match pools.is_empty() {
            true => f(&[Part { counter, limits }]),
            false => f(&Part::split(counter, limits, pools)),
        }
    }
}

/// A place counters live. Calls are bounded by the backend's own timeout.
pub trait CounterStore: Send + Sync + 'static {
    /// The one question every door asks: may a request of `cost` units (0: a check) on counter
    /// `key` pass `limits` at `now_ms` (Unix milliseconds)? Counted where it belongs, atomically.
    /// `limits` are sliding windows of distinct lengths (at most
    /// [`quotagate_engine::limiter::MAX_LIMITS`], [`quotagate_engine::limiter::WindowSet::hit`]),
    /// or one fixed window ([`quotagate_engine::limiter::Kind`], [`quotagate_engine::limiter::FixedWindow`]:
    /// above 0 units and seconds; a hit without room takes none); other sets are
    /// [`StoreError::is_unsupported`].
    fn hit(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// [`CounterStore::hit`] across several counters ([`Part`]): the request passes only if
    /// every enforced limit of every part has room, and is counted in all of them or in none
    /// ([`quotagate_engine::limiter::hit_parts`]); quotas in the parts' order. Sliding windows and
    /// calendar periods only, all parts with the same hash tag; else
    /// [`StoreError::is_unsupported`].
    fn hit_parts(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// [`CounterStore::peek`] across several counters ([`CounterStore::hit_parts`]).
    fn peek_parts(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// A response reported a cost other than the `reserved` one a request was admitted with at
    /// `reserved_at_ms` (the caller's clock, as `now_ms`): `delta` more units counted at
    /// `now_ms` in every limit of `parts` whatever its room (counts may go above a limit), or
    /// `-delta` given back from where the reservation was counted, never below what is there.
    /// `parts`: the rates the request was counted in (its shadow limits only if it was counted
    /// in them; never its concurrency limits: a report changes a cost, not that the request is in
    /// flight).
    fn adjust(
        &self,
        parts: &[Part<'_>],
        delta: i64,
        reserved_at_ms: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Frees one slot of each concurrency limit of `parts`: a request that took them at
    /// admission (its enforced ones, its shadow ones if it was counted in them:
    /// [`Outcome::counted_in`]) ended.
    fn free(
        &self,
        parts: &[Part<'_>],
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The windows each part's counter holds at `now_ms`, counting nothing, and the time they
    /// were read at (Redis' with its clock): for a request that waits for room, when it comes
    /// ([`quotagate_engine::limiter::room_in_ms`]).
    fn windows(
        &self,
        parts: &[Part<'_>],
        now_ms: u64,
    ) -> impl Future<Output = Result<(Vec<WindowSet>, u64), StoreError>> + Send;

    /// Does the backend answer? Asked while it is marked down.
    fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The state of `key`'s windows against `limits` at `now_ms` for one more request of `cost`,
    /// counting nothing ([`quotagate_engine::limiter::WindowSet::peek`]). For the admin's "why was I limited".
    fn peek(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// Forgets every sliding-window count of `api_key`, on every endpoint; the number of counters
    /// (memory) or minute hashes (Redis) removed.
    fn reset(&self, api_key: &[u8]) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Does the backend answer? Asked once at start-up, outside any worker, so it must not leave a
    /// connection behind for the hot path.
    fn check_reachable(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.probe()
    }

    /// `memory` or `redis`.
    fn kind(&self) -> &'static str;
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Local => "local",
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
        }
    }
}

/// What to do with a request when the shared store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Enforce the same limits in this instance's memory until Redis answers. Default.
    #[default]
    Local,
    /// Let requests through unlimited.
    Open,
    /// Refuse requests with 503.
    Closed,
}

/// The answer for one request (`D`: the limits' [`Outcome`], or one
/// [`quotagate_engine::limiter::Quota`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<D = Outcome> {
    /// Decided by the configured store.
    Decided(D),
    /// Decided in this instance's memory because the shared store is down (policy `local`).
    Local(D),
    /// The shared store is down and the policy is `open`.
    Open,
    /// The shared store is down and the policy is `closed`.
    Closed,
}

impl<D> Verdict<D> {
    /// The same verdict with its decision turned by `f`.
    pub fn map<E>(self, f: impl FnOnce(D) -> E) -> Verdict<E> {
        match self {
            Verdict::Decided(d) => Verdict::Decided(f(d)),
            Verdict::Local(d) => Verdict::Local(f(d)),
            Verdict::Open => Verdict::Open,
            Verdict::Closed => Verdict::Closed,
        }
    }
}
