//! redis: counters shared by every instance that uses the same Redis.
//!
//! One script call per request checks and counts atomically (`window.lua`), so instances can never
//! over-admit together. By default the script reads the time from Redis itself (`TIME`), so a shared
//! limit does not depend on the instances' clocks agreeing; the caller only estimates the minute to
//! name the keys, and learns Redis' time from every reply.
//!
//! The hot path does not check a connection out of the pool per request (each checkout costs a PING
//! round trip): the store keeps one multiplexed connection and clones it per call; when it breaks,
//! the slot is cleared and the next call gets a fresh one from the pool. Every call is bounded by the
//! configured timeout. `NOSCRIPT` (a restarted Redis, `SCRIPT FLUSH`) is answered by loading the
//! script and retrying, inside `invoke_async`.
//!
//! Its rooms: the store and its types here; [`connection`] (connections, loading scripts,
//! timeouts), [`scripts`] (deciding on Redis alone), [`leased`] (deciding from leases), [`held`]
//! (concurrency slots).

mod connection;
mod held;
mod leased;
mod scripts;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::Script;

use super::blocked::BlockCache;
use super::connect::{Conn, Connector, RedisTarget};
use super::keys::{self, CounterKey, api_key_pattern};
use super::lease::{
    Answer, GiveBack, Granted, LeaseMode, Leases, LimitSet, Plan, Seen, StoreStats, Turn,
    bucket_end_ms, until_of_ttl, until_on_redis_clock,
};
use super::memory::check_parts;
use super::script::{
    Fields, FixedReply, LeaseArgs, SlotArg, WindowCall, WindowReply, peek_reads, peek_windows,
    read_divvy_lease_reply, read_divvy_reply,
};
use super::slots::Slots;
use super::{CounterStore, Part, StoreError};
use quotagate_engine::clock::{Clock, SystemClock};
use quotagate_engine::limiter::{
    Limit, MAX_LIMITS, Outcome, Quota, Shape, Span, WindowSet, fixed_outcome, hit_parts, peek_parts,
};

/// A limit no count reaches (exact in the script's doubles): what a count made whatever the room
/// is checked against.
const OUT_OF_REACH: u64 = 1 << 52;

static WINDOW: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../window.lua")));
static DIVVY: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../divvy.lua")));

/// A script, called with `EVALSHA` built directly into one command. (redis-rs' `ScriptInvocation`
/// keeps every key and argument in an allocation of its own and copies them into the command at
/// each call: about 1k instructions per decision.)
struct Lua {
    script: Script,
}

/// Whose clock decides which second a request falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeSource {
    /// Redis' `TIME`: one clock for every instance. Default.
    #[default]
    Redis,
    /// The caller's `now`. For tests that drive time by hand, and single-instance setups.
    Local,
}

/// Options for [`RedisStore::connect`].
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Where Redis is: mode, URLs, TLS, credentials.
    pub target: RedisTarget,
    /// Bound on every store call, including getting a connection. Default: 250 ms.
    pub timeout: Duration,
    /// Hot-path connections at most (fewer than `connections` makes workers share). Default: 16.
    pub pool_size: usize,
    /// Key prefix. Default: `quotagate`.
    pub prefix: String,
    pub time_source: TimeSource,
    /// Multiplexed connections kept for the hot path: one per proxy worker
    /// (see [`RedisStore::with_thread_slot`]), so a worker's calls never wait on another thread. Default: 1.
    pub connections: usize,
    /// Whether busy counters take leases ([`crate::lease`]). Default: auto.
    pub lease: LeaseMode,
    /// Units one lease holds at most. Default: 1000.
    pub lease_max_units: u64,
    /// How long a concurrency limit's slot is held after its instance last renewed it: the time
    /// after which the slots of an instance that died are freed (renewed every third of it).
    /// Default: 10 s.
    pub concurrency_hold: Duration,
}

/// Slots a call is taking, freed by name if the call ends without a reply
/// ([`RedisStore::hit_holding`]): cleared once the reply is read.
struct Taking {
    store: Option<Weak<RedisStore>>,
    slots: Vec<(CounterKey, Limit)>,
    who: String,
    now_ms: u64,
}

/// What one window script call answered.
struct Called {
    outcome: Outcome,
    /// Units granted as a lease (0: none).
    grant: u64,
    redis_now_ms: i64,
    /// The microseconds of Redis' `TIME` (`None`: the caller gave the time).
    micros: Option<i64>,
    resets_ms: [i64; MAX_LIMITS],
    /// Each limit's room, also where the cost did not fit ([`WindowReply::Decided`]).
    rooms: [Option<u64>; MAX_LIMITS],
}

/// A request on a leased counter, planned ([`RedisStore::plan_leased`]).
enum Planned {
    /// Decided from the counter's lease.
    Local(Outcome),
    /// A call to make (`args`: a lease wanted, one given back; `give_apart`: a lease of other
    /// limits to give back first) in the counter's `turn`, held until it is settled; `seen`: for
    /// [`Leases::settle`].
    Call {
        args: Option<LeaseArgs>,
        give_apart: Option<GiveBack>,
        turn: Turn,
        seen: Seen,
    },
    /// The counter is not followed: Redis alone decides.
    Unfollowed,
}

/// One multiplexed connection the hot path uses.
#[derive(Default)]
struct Slot {
    /// `None` after it broke, then opened again. `ArcSwapOption`: read on every request, written
    /// only on failure.
    conn: ArcSwapOption<Conn>,
    /// Held while the slot is refilled, so concurrent callers share one new connection (and their
    /// commands stay in the order they were issued) instead of each opening one.
    /// `tokio::sync::Mutex`: held across the pool's `.await`, and fair (FIFO).
    refill: tokio::sync::Mutex<()>,
}

/// The Redis store.
pub struct RedisStore {
    /// As configured.
    target: RedisTarget,
    connector: Connector,
    /// One slot per worker: the connection's task runs on the worker that opened it.
    slots: Box<[Slot]>,
    timeout: Duration,
    prefix: String,
    time_source: TimeSource,
    /// Redis' clock minus ours, in milliseconds, as last seen in a reply. Only used to guess the
    /// minute.
    offset: AtomicI64,
    /// Counters known to be over their limit: answered without a round trip.
    blocked: BlockCache,
    /// Busy counters' leases (`None`: `store.lease = off`).
    leases: Option<Leases>,
    stats: StoreStats,
    /// This store, for the timers that give leases back (set when it is shared, [`RedisStore::shared`]).
    me: OnceLock<Weak<RedisStore>>,
    /// Which hot-path connection the calling thread uses (see [`RedisStore::with_thread_slot`]).
    thread_slot: fn() -> usize,
    /// The caller's clock, for calls this store makes on its own (a lease given back by a timer).
    clock: Arc<dyn Clock>,
    /// Concurrency limits' slots this instance holds.
    held: Slots,
    /// Set once the task that renews the slots runs.
    renewing: OnceLock<()>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Creates the store. Nothing is sent to Redis until the first call, so a Redis that is down at
    /// start-up is handled by the store failure policy like any other outage.
    pub fn connect(opts: &RedisOptions) -> Result<RedisStore, StoreError> {
        let connector = Connector::new(&opts.target, opts.timeout).map_err(StoreError::config)?;
        let slots = opts.connections.min(opts.pool_size).max(1);
        Ok(RedisStore {
            target: opts.target.clone(),
            connector,
            slots: (0..slots).map(|_| Slot::default()).collect(),
            timeout: opts.timeout,
            prefix: opts.prefix.clone(),
            time_source: opts.time_source,
            offset: AtomicI64::new(0),
            blocked: BlockCache::default(),
            leases: (opts.lease == LeaseMode::Auto)
                .then(|| Leases::new(opts.lease_max_units, StoreStats::default())),
            stats: StoreStats::default(),
            me: OnceLock::new(),
            thread_slot: || 0,
            clock: Arc::new(SystemClock::new()),
            held: Slots::new(opts.concurrency_hold),
            renewing: OnceLock::new(),
        })
    }

    /// The store, shared: leases left unused are then given back by a timer at their bucket's
    /// end (without it, by the counter's next call).
    pub fn shared(self) -> Arc<RedisStore> {
        let store = Arc::new(self);
        let _ = store.me.set(Arc::downgrade(&store));
        store
    }

    /// Are busy counters decided from leases (`store.lease = auto`)?
    pub fn leases_on(&self) -> bool {
        self.leases.is_some()
    }

    /// What this store counts about its decisions and leases.
    pub fn stats(&self) -> &StoreStats {
        match &self.leases {
            Some(l) => &l.stats,
            None => &self.stats,
        }
    }

    /// Has each thread use hot-path connection `thread_slot() % connections`: the application
    /// passes its worker index, so a worker's calls stay on the connection whose task runs on
    /// that worker's own runtime. Default: every thread uses the first.
    pub fn with_thread_slot(mut self, thread_slot: fn() -> usize) -> RedisStore {
        self.thread_slot = thread_slot;
        self
    }

    /// Reads the time for calls of its own from `clock` (the application's). Default: the
    /// system clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> RedisStore {
        self.clock = clock;
        self
    }

    /// Where Redis is, as configured.
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }
}

impl CounterStore for RedisStore {
    async fn hit(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        let limits = &limits[..limits.len().min(MAX_LIMITS)];
        match Shape::of(limits) {
            Shape::Sliding => {
                let parts = [Part {
                    counter: key,
                    limits,
                }];
                self.hit_sliding(&parts, cost, now_ms).await
            }
            Shape::Fixed(l) => self.hit_fixed(key, l, cost, now_ms).await,
            Shape::Mixed => Err(StoreError::mixed_kinds()),
        }
    }

    async fn hit_parts(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        if let [p] = parts {
            return self.hit(p.counter, p.limits, cost, now_ms).await;
        }
        check_parts(parts)?;
        self.hit_sliding(parts, cost, now_ms).await
    }

    async fn peek_parts(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        check_parts(parts)?;
        let (sets, now_ms) = self.read_windows(parts, now_ms).await?;
        let sets: Vec<(&WindowSet, &[Limit])> =
            sets.iter().zip(parts).map(|(w, p)| (w, p.limits)).collect();
        Ok(peek_parts(&sets, cost, now_ms))
    }

    async fn windows(
        &self,
        parts: &[Part<'_>],
        now_ms: u64,
    ) -> Result<(Vec<WindowSet>, u64), StoreError> {
        check_parts(parts)?;
        self.read_windows(parts, now_ms).await
    }

    async fn free(&self, parts: &[Part<'_>], now_ms: u64) -> Result<(), StoreError> {
        check_parts(parts)?;
        Box::pin(self.free_slots(parts, now_ms)).await
    }

    /// A positive `delta` is taken from the counter's lease when it has that many units left
    /// (they are counted in Redis already), else counted by a script call whose limits are out
    /// of reach (so it counts whatever the room); a negative one is given back by a script call,
    /// as a lease is, from the bucket of the reservation (by Redis' clock, estimated from the
    /// caller's).
    async fn adjust(
        &self,
        parts: &[Part<'_>],
        delta: i64,
        reserved_at_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        check_parts(parts)?;
        let units = delta.unsigned_abs();
        if delta > 0 {
            if let Some((leases, p)) = self.leases_for(parts) {
                let now_us = self.lease_now_us(leases, now_ms);
                if leases.added(p.counter, &LimitSet::new(p.limits), units, now_us) {
                    return Ok(());
                }
            }
            let forced: Vec<Vec<Limit>> = parts
                .iter()
                .map(|p| {
                    p.limits
                        .iter()
                        .map(|l| Limit {
                            rl: OUT_OF_REACH,
                            ..*l
                        })
                        .collect()
                })
                .collect();
            let forced: Vec<Part> = parts
                .iter()
                .zip(&forced)
                .map(|(p, limits)| Part {
                    counter: p.counter,
                    limits,
                })
                .collect();
            self.bounded(self.run_window_script(&forced, units, now_ms, None, None))
                .await?;
        } else if delta < 0 {
            let at = i64::try_from(reserved_at_ms).unwrap_or(i64::MAX / 2);
            let given_at_ms = match self.time_source {
                TimeSource::Local => at,
                TimeSource::Redis => at + self.offset.load(Ordering::Relaxed),
            };
            let args = LeaseArgs {
                want: 0,
                give: units,
                given_at_ms,
            };
            self.bounded(self.run_window_script(parts, 0, now_ms, Some(args), None))
                .await?;
            // Room came back: a refusal remembered may no longer hold.
            for p in parts {
                self.blocked.remove(p.counter);
            }
            if let Some((leases, p)) = self.leases_for(parts) {
                let now = i64::try_from(now_ms).unwrap_or(i64::MAX / 2);
                let now = match self.time_source {
                    TimeSource::Local => now,
                    TimeSource::Redis => now + self.offset.load(Ordering::Relaxed),
                };
                let set = LimitSet::new(p.limits);
                let (at, now) = (
                    u64::try_from(given_at_ms).unwrap_or(0),
                    u64::try_from(now).unwrap_or(0),
                );
                leases.given_back(p.counter, &set, units, at, now);
            }
        }
        Ok(())
    }

    /// A fresh connection per probe: the old one may be stuck behind a hung server. On a cluster
    /// every slot range's master must answer, so that one live node does not end the failure
    /// policy while another's keys still fail ([`Conn::check_every_master`]).
    async fn probe(&self) -> Result<(), StoreError> {
        self.reset_connection();
        self.bounded(self.on_connection(|mut conn| async move { conn.check_every_master().await }))
            .await
    }

    /// Reads the hashes that hold the windows at `now_ms` ([`peek_reads`], [`peek_windows`]) and
    /// asks the Rust arithmetic ([`WindowSet::peek`]) about them: a read, no script, nothing
    /// counted.
    async fn peek(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        if Shape::of(limits) != Shape::Sliding {
            return Err(StoreError::peek_fixed());
        }
        let parts = [Part {
            counter: key,
            limits,
        }];
        self.peek_parts(&parts, cost, now_ms).await
    }

    /// Deletes every minute hash of `api_key` (`SCAN` over the keyspace: an admin operation, not a
    /// request's).
    async fn reset(&self, api_key: &[u8]) -> Result<u64, StoreError> {
        let pattern = api_key_pattern(&self.prefix, api_key);
        // Remembered rejections would otherwise outlive the counts they came from, and leases
        // given back later would take from counts made after the reset.
        self.blocked.forget(&CounterKey::api_key_prefix(api_key));
        if let Some(l) = &self.leases {
            l.forget(&CounterKey::api_key_prefix(api_key));
        }
        let (mut cursor, mut gone) = (0u64, 0u64);
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            // Every key of one API key is in one slot (its hash tag): on a cluster, SCAN the
            // master that holds it.
            let slot_key = CounterKey::api_key_prefix(api_key);
            let reply = self
                .bounded(self.on_connection(|mut conn| {
                    let (scan, slot_key) = (scan.clone(), slot_key.clone());
                    async move { conn.on_slot_of(scan, &slot_key).await }
                }))
                .await?;
            let (next, keys): (u64, Vec<String>) = redis::from_redis_value(reply)
                .map_err(|e| StoreError::reply(format!("SCAN: {e}")))?;
            if !keys.is_empty() {
                let mut del = redis::cmd("DEL");
                del.arg(&keys);
                gone += self.command::<u64>(del).await?;
            }
            if next == 0 {
                // Again: a rejection computed before the DEL may have been remembered meanwhile.
                self.blocked.forget(&CounterKey::api_key_prefix(api_key));
                return Ok(gone);
            }
            cursor = next;
        }
    }

    /// A connection of its own, closed after one `PING`: one opened here, outside the workers,
    /// would later serve a worker from another thread.
    async fn check_reachable(&self) -> Result<(), StoreError> {
        let fail = |why: String| {
            let mode = match self.target.mode {
                super::RedisMode::Single => String::new(),
                m => format!(" ({})", m.as_str()),
            };
            StoreError::unreachable(format!(
                "cannot connect to Redis at {}{mode}: {why}",
                self.target.shown()
            ))
        };
        let attempt = async {
            let connector =
                Connector::new(&self.target, self.timeout).map_err(|e| e.to_string())?;
            let mut conn = connector
                .connect(self.timeout)
                .await
                .map_err(|e| e.to_string())?;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(fail(why)),
            Err(_) => Err(fail("no answer within store.timeout_ms".into())),
        }
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}
