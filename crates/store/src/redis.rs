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

static WINDOW: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("window.lua")));
static DIVVY: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("divvy.lua")));

/// A script, called with `EVALSHA` built directly into one command. (redis-rs' `ScriptInvocation`
/// keeps every key and argument in an allocation of its own and copies them into the command at
/// each call: about 1k instructions per decision.)
struct Lua {
    script: Script,
}

impl Lua {
    fn new(source: &'static str) -> Lua {
        Lua {
            script: Script::new(source),
        }
    }

    /// `SCRIPT LOAD` (on a cluster, redis-rs sends it to every master).
    async fn load_async<C: redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
    ) -> redis::RedisResult<String> {
        self.script.load_async(conn).await
    }

    /// `EVALSHA <hash> <number of keys>`, with room for `args` more arguments of `bytes` bytes in
    /// all (so the command is not regrown as the caller adds the keys and arguments).
    fn call(&self, keys: usize, args: usize, bytes: usize) -> redis::Cmd {
        let hash = self.script.get_hash();
        let mut cmd = redis::Cmd::with_capacity(3 + args, 16 + hash.len() + bytes);
        cmd.arg("EVALSHA").arg(hash).arg(keys);
        cmd
    }

    /// Runs `cmd` (from [`Lua::call`]); a server that lost the script (a restart, `SCRIPT FLUSH`,
    /// a failover to a replica that never saw it) is given it and asked once more.
    async fn run<C: redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<String> {
        match cmd.query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.load_async(conn).await?;
                cmd.query_async(conn).await
            }
            r => r,
        }
    }
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

impl Drop for Taking {
    fn drop(&mut self) {
        if self.slots.is_empty() {
            return;
        }
        let (Some(store), Ok(runtime)) = (
            self.store.as_ref().and_then(Weak::upgrade),
            tokio::runtime::Handle::try_current(),
        ) else {
            return;
        };
        let (slots, who, now_ms) = (
            std::mem::take(&mut self.slots),
            std::mem::take(&mut self.who),
            self.now_ms,
        );
        // On this thread's runtime, so on the connection the dropped call went out on: Redis
        // runs the free after the take, whenever the take arrives.
        runtime.spawn(async move { store.free_named(&slots, &who, now_ms).await });
    }
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

/// A failure of the connection rather than of the command: the connection is dropped and the
/// call may be tried on a fresh one.
fn is_broken(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
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

    fn slot(&self) -> &Slot {
        &self.slots[(self.thread_slot)() % self.slots.len()]
    }

    async fn connection(&self) -> Result<Arc<Conn>, StoreError> {
        let slot = self.slot();
        if let Some(c) = slot.conn.load_full() {
            return Ok(c);
        }
        // Boxed: connecting is a large future, and every store call's future (and so every
        // request's) would otherwise carry it, and copy it, although it is rarely needed.
        Box::pin(self.refill(slot)).await
    }

    async fn refill(&self, slot: &Slot) -> Result<Arc<Conn>, StoreError> {
        let _refilling = slot.refill.lock().await;
        if let Some(c) = slot.conn.load_full() {
            return Ok(c);
        }
        let mut c = self
            .connector
            .connect(self.timeout)
            .await
            .map_err(|e| StoreError::connect(self.target.shown(), &e))?;
        // Load the scripts before anyone uses the connection: a NOSCRIPT retry would let later
        // commands overtake earlier ones. (A later SCRIPT FLUSH is still healed by `Lua::run`.)
        // On a cluster, SCRIPT LOAD goes to every master.
        for script in [&*WINDOW, &*DIVVY] {
            script.load_async(&mut c).await.map_err(StoreError::redis)?;
        }
        let c = Arc::new(c);
        slot.conn.store(Some(c.clone()));
        Ok(c)
    }

    /// Runs `call` on this worker's connection; if that connection turns out to be broken (Redis
    /// closed it when idle, a proxy in between restarted, `CLIENT KILL`), once more on a fresh
    /// one, so that one stale connection never makes a healthy Redis look down. Both tries fall
    /// within the caller's `store.timeout_ms`. A broken connection can lose the reply of a call
    /// Redis did execute; the retry then counts that request twice, which can only refuse early,
    /// never admit too much.
    async fn on_connection<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.connection().await?;
        match call((*conn).clone()).await {
            Ok(v) => return Ok(v),
            Err(e) if !is_broken(&e) => return Err(StoreError::redis(e)),
            Err(_) => self.forget(&conn),
        }
        let conn = self.connection().await?;
        call((*conn).clone()).await.map_err(|e| {
            if is_broken(&e) {
                self.forget(&conn);
            }
            StoreError::redis(e)
        })
    }

    /// Clears this worker's slot if it still holds `conn` (not a fresh one another call put there).
    fn forget(&self, conn: &Arc<Conn>) {
        self.slot().conn.compare_and_swap(conn, None::<Arc<Conn>>);
    }

    /// Where Redis is, as configured.
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// Forgets the current connection, so the next call opens a fresh one.
    pub fn reset_connection(&self) {
        for slot in &self.slots {
            slot.conn.store(None);
        }
    }

    /// Checks one request of `cost` against the limits of its `parts` (its counters: one, or
    /// its own and its pools') and counts it where it belongs. `now_ms` is the caller's clock;
    /// with [`TimeSource::Redis`] it only helps name the keys.
    async fn hit_sliding(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        if cost == 0 {
            return self.bounded(self.check_sliding(parts, now_ms)).await;
        }
        if let [p] = parts
            && let Some(q) = self.check_blocked(p.counter, p.limits, cost, now_ms)
        {
            self.stats().decided_by_block.inc();
            return Ok(Outcome::new(false, false, &[q]));
        }
        match self.leases_for(parts) {
            Some((leases, p)) => self.bounded(self.hit_leased(leases, p, cost, now_ms)).await,
            None if parts
                .iter()
                .any(|p| p.limits.iter().any(Limit::is_concurrent)) =>
            {
                Box::pin(self.bounded(self.hit_holding(parts, cost, now_ms))).await
            }
            None => {
                let call = self.run_window_script(parts, cost, now_ms, None, None);
                self.bounded(call).await.map(|c| c.outcome)
            }
        }
    }

    /// [`RedisStore::hit_sliding`] for a request with concurrency limits: the slots it takes are
    /// named once (a retried call takes none twice) and held, renewed, until it ends
    /// ([`CounterStore::free`]).
    async fn hit_holding(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        let who = self.held.name();
        let slot = SlotArg {
            renew: false,
            who: &who,
            hold_ms: self.held.hold_ms(),
        };
        // Until the reply says what was taken, a call dropped (its client gone, its time up) or
        // failed may have taken slots that nothing here would free or renew: they are freed by
        // name (a free of a slot never taken does nothing).
        let mut taking = Taking {
            store: self.me.get().cloned(),
            slots: parts
                .iter()
                .flat_map(|p| p.limits.iter().map(move |l| (p.counter, l)))
                .filter(|(_, l)| l.is_concurrent())
                .map(|(c, l)| (c.clone(), *l))
                .collect(),
            who: who.clone(),
            now_ms,
        };
        let called = self
            .run_window_script(parts, cost, now_ms, None, Some(slot))
            .await?;
        taking.slots.clear();
        let o = called.outcome;
        let limits = parts
            .iter()
            .flat_map(|p| p.limits.iter().map(move |l| (p, l)));
        let mut took = false;
        for (i, (p, l)) in limits.enumerate() {
            if l.is_concurrent() && o.counted_in(i, l) {
                self.held.took(p.counter, &who);
                took = true;
            }
        }
        if took {
            self.renew_slots();
        }
        Ok(o)
    }

    /// Frees slot `who` of each of `slots` (counter and concurrency limit).
    async fn free_named(&self, slots: &[(CounterKey, Limit)], who: &str, now_ms: u64) {
        for (counter, l) in slots {
            if let Err(e) = self.free_one(counter, l, who, now_ms).await {
                tracing::debug!(error = %e, "freeing a slot whose call was dropped failed; its hold time frees it");
            }
        }
    }

    /// Frees slot `who` of `counter`'s concurrency limit `l`: one script call (a give-back).
    async fn free_one(
        &self,
        counter: &CounterKey,
        l: &Limit,
        who: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let limits = [*l];
        let part = [Part {
            counter,
            limits: &limits,
        }];
        let slot = SlotArg {
            renew: false,
            who,
            hold_ms: self.held.hold_ms(),
        };
        let give = LeaseArgs {
            want: 0,
            give: 1,
            given_at_ms: i64::try_from(now_ms).unwrap_or(i64::MAX / 2),
        };
        let call = self.run_window_script(&part, 0, now_ms, Some(give), Some(slot));
        self.bounded(call).await.map(|_| ())
    }

    /// Starts, once, the task that renews the slots this instance holds, every third of their
    /// hold time, for as long as the store lives.
    fn renew_slots(&self) {
        let Some(me) = self.me.get().cloned() else {
            return;
        };
        if self.renewing.set(()).is_err() {
            return;
        }
        let every = self.held.renew_every();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(store) = me.upgrade() else { return };
                store.renew_slots_now().await;
            }
        });
    }

    /// Renews every slot this instance holds: each is held its hold time from now (by the
    /// store's clock, or Redis'). A store that is not shared ([`RedisStore::shared`]) renews
    /// only when this is called.
    pub async fn renew_slots_now(&self) {
        let now_ms = self.clock.now_ms();
        for (counter, names) in self.held.renewals() {
            let limits = [Limit::concurrent(1)];
            let parts = [Part {
                counter: &counter,
                limits: &limits,
            }];
            let slot = SlotArg {
                renew: true,
                who: &names,
                hold_ms: self.held.hold_ms(),
            };
            let call = self.run_window_script(&parts, 0, now_ms, None, Some(slot));
            if let Err(e) = self.bounded(call).await {
                tracing::debug!(error = %e, "renewing concurrency slots failed; they are tried again in a third of their hold time");
            }
        }
    }

    /// Concurrency-limit slots this instance holds on Redis now.
    pub fn slots_held(&self) -> usize {
        self.held.len()
    }

    /// Frees one slot this instance holds in each concurrency limit of `parts`.
    async fn free_slots(&self, parts: &[Part<'_>], now_ms: u64) -> Result<(), StoreError> {
        for p in parts {
            let Some(l) = p.limits.iter().find(|l| l.is_concurrent()) else {
                continue;
            };
            // A slot not held here (taken before a failover, or dropped after a failed call) is
            // freed by its hold time.
            let Some(who) = self.held.release(p.counter) else {
                continue;
            };
            self.free_one(p.counter, l, &who, now_ms).await?;
        }
        Ok(())
    }

    /// The leases `parts` are decided with, and its one part: none for a request that counts in
    /// a pool. A lease is one counter's, spent by the requests of that counter alone; a pool's
    /// windows are counted by the requests of several endpoints, so what one of them could tell
    /// from a lease would miss what the others counted meanwhile (docs/stores.md).
    fn leases_for<'a>(&'a self, parts: &'a [Part<'a>]) -> Option<(&'a Leases, &'a Part<'a>)> {
        match (&self.leases, parts) {
            // Slots are taken and freed by each request: never from a lease.
            (Some(leases), [p])
                if !p.counter.is_pool() && !p.limits.iter().any(Limit::is_concurrent) =>
            {
                Some((leases, p))
            }
            _ => None,
        }
    }

    /// A refusal remembered for `key`, if one applies now.
    fn check_blocked(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Option<Quota> {
        let [l] = limits else { return None };
        if l.shadow || l.is_concurrent() {
            return None;
        }
        let caller_ms = match self.time_source {
            TimeSource::Redis => None,
            TimeSource::Local => Some(i64::try_from(now_ms).unwrap_or(i64::MAX / 2)),
        };
        self.blocked.check(key, l, cost, caller_ms)
    }

    /// The lease clock now: the caller's milliseconds with its clock, else this store's own.
    fn lease_now_us(&self, leases: &Leases, now_ms: u64) -> i64 {
        match self.time_source {
            TimeSource::Local => i64::try_from(now_ms)
                .unwrap_or(i64::MAX / 2000)
                .saturating_mul(1000),
            TimeSource::Redis => leases.elapsed_us(),
        }
    }

    /// Plans a request on a leased counter: decided by its lease, or the call to make in the
    /// counter's turn (waited for when it is not free). `now_us`: the lease clock, read again
    /// once the turn comes.
    async fn plan_leased(
        &self,
        leases: &Leases,
        key: &CounterKey,
        limits: &LimitSet,
        cost: u64,
        now_us: impl Fn() -> i64,
    ) -> Planned {
        // Calls that change a lease take the counter's turn alone, the others share it: the lease
        // held here and the counts a reply reflects then always match. Those waiting for a call
        // that takes a lease are mostly decided by it.
        let mut plan = leases.plan(key, limits, cost, now_us());
        if let Plan::Wait { line, alone, seen } = plan {
            let turn = Turn::wait(line, alone).await;
            plan = leases.plan_in_turn(key, limits, cost, now_us(), turn, seen);
        }
        match plan {
            Plan::Local(o) => Planned::Local(o),
            Plan::Ask {
                args,
                give_apart,
                turn,
                seen,
            } => Planned::Call {
                args,
                give_apart,
                turn,
                seen,
            },
            // Planned in its turn: never waits again.
            Plan::Wait { .. } | Plan::Unfollowed => Planned::Unfollowed,
        }
    }

    /// [`RedisStore::hit_sliding`] with leases: decided from the counter's lease when it has
    /// units left in its bucket, else by a script call in the counter's turn that gives back what
    /// an ended lease left and, for a busy counter, takes the next. What it tells follows one
    /// rule however it was decided ([`crate::lease::Told`]).
    async fn hit_leased(
        &self,
        leases: &Leases,
        part: &Part<'_>,
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        let now_us = || self.lease_now_us(leases, now_ms);
        let parts = std::slice::from_ref(part);
        let (key, limits) = (part.counter, part.limits);
        let set = LimitSet::new(limits);
        let planned = self.plan_leased(leases, key, &set, cost, now_us).await;
        let (args, give_apart, turn, seen) = match planned {
            Planned::Local(o) => return Ok(o),
            Planned::Call {
                args,
                give_apart,
                turn,
                seen,
            } => (args, give_apart, turn, seen),
            Planned::Unfollowed => {
                let call = self.run_window_script(parts, cost, now_ms, None, None);
                return call.await.map(|c| c.outcome);
            }
        };
        if let Some(g) = give_apart {
            self.give_back(key, g, now_ms).await?;
        }
        let sent_us = leases.elapsed_us();
        // A give-back in a failed call may or may not have happened: its units stay counted at
        // worst, until they leave the window (refusing early, never too much).
        let called = self
            .run_window_script(parts, cost, now_ms, args, None)
            .await?;
        if let Some(a) = args
            && a.give > 0
        {
            leases.gave_back(a.give);
        }
        let at_ms = called.redis_now_ms;
        // The reply's instant on the lease clock. With Redis' clock, its arrival: Redis read its
        // clock before, so what it says leaves at some time is never taken to leave sooner here.
        let reply_us = match self.time_source {
            TimeSource::Local => at_ms.saturating_mul(1000),
            TimeSource::Redis => leases.elapsed_us(),
        };
        let mut exits_us = [0; MAX_LIMITS];
        for (e, ms) in exits_us.iter_mut().zip(called.resets_ms) {
            *e = reply_us + ms * 1000;
        }
        let granted = (called.grant > 0).then(|| {
            let end_ms = bucket_end_ms(limits, u64::try_from(at_ms).unwrap_or(0));
            let end_ms = i64::try_from(end_ms).unwrap_or(i64::MAX / 2000);
            let until_us = match self.time_source {
                TimeSource::Local => end_ms * 1000,
                // Redis read its clock after the call left: the lease ends here no later than
                // its bucket ends there.
                TimeSource::Redis => until_on_redis_clock(sent_us, at_ms, called.micros, end_ms),
            };
            Granted {
                units: called.grant,
                at_ms,
                until_us,
            }
        });
        let asked = args.is_some_and(|a| a.want > 0);
        let answer = Answer {
            outcome: called.outcome,
            rooms: called.rooms,
            exits_us,
            granted,
            at_us: reply_us,
        };
        let (told, lease) = leases.settle(key, &set, cost, asked, answer, &turn, seen);
        drop(turn);
        if let Some(g) = granted {
            self.blocked.remove(key);
            if let Some(id) = lease
                && self.time_source == TimeSource::Redis
            {
                self.give_back_at(key, id, g.until_us, leases);
            }
        }
        Ok(told)
    }

    /// A check (cost 0) of sliding windows ([`RedisStore::check_windows`]); with leases in the
    /// counter's turn and told by the one rule.
    async fn check_sliding(&self, parts: &[Part<'_>], now_ms: u64) -> Result<Outcome, StoreError> {
        let Some((leases, part)) = self.leases_for(parts) else {
            return Ok(self.check_windows(parts, now_ms).await?.0);
        };
        let now_us = || self.lease_now_us(leases, now_ms);
        let key = part.counter;
        let set = LimitSet::new(part.limits);
        let (turn, seen) = match self.plan_leased(leases, key, &set, 0, now_us).await {
            Planned::Local(o) => return Ok(o),
            Planned::Call {
                args,
                give_apart,
                turn,
                seen,
            } => {
                // An ended lease goes back before the windows are read.
                let give = args.filter(|a| a.give > 0).map(|a| GiveBack {
                    limits: set,
                    units: a.give,
                    at_ms: a.given_at_ms,
                });
                for g in give_apart.into_iter().chain(give) {
                    self.give_back(key, g, now_ms).await?;
                }
                (turn, seen)
            }
            Planned::Unfollowed => return Ok(self.check_windows(parts, now_ms).await?.0),
        };
        let (o, exits_ms) = self.check_windows(parts, now_ms).await?;
        // The windows were read before now: an exit is never taken to come sooner than it does.
        let read_us = now_us();
        let mut exits_us = [0; MAX_LIMITS];
        for (e, ms) in exits_us.iter_mut().zip(exits_ms) {
            *e = read_us + i64::try_from(ms).unwrap_or(i64::MAX / 2000) * 1000;
        }
        let mut rooms = [None; MAX_LIMITS];
        for (r, q) in rooms.iter_mut().zip(o.quotas()) {
            *r = Some(q.remaining);
        }
        let answer = Answer {
            outcome: o,
            rooms,
            exits_us,
            granted: None,
            at_us: read_us,
        };
        let (told, _) = leases.settle(key, &set, 0, false, answer, &turn, seen);
        Ok(told)
    }

    /// Gives lease `id` of `key` back at lease-clock `until_us` (its bucket's end), unless a call
    /// has done it by then.
    fn give_back_at(&self, key: &CounterKey, id: u64, until_us: i64, leases: &Leases) {
        let Some(me) = self.me.get().cloned() else {
            return;
        };
        let at = leases.instant_of(until_us);
        let key = key.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(store) = me.upgrade() else { return };
            let Some(leases) = &store.leases else { return };
            // A give-back is a call of the counter like any other: it waits its turn.
            let Some(line) = leases.turn(&key) else {
                return;
            };
            let _turn = Turn::wait(line, true).await;
            let Some(g) = leases.expire(&key, id) else {
                return;
            };
            let now_ms = store.clock.now_ms();
            if let Err(e) = store.bounded(store.give_back(&key, g, now_ms)).await {
                tracing::debug!(error = %e, "giving a lease back failed; its units stay counted until they leave the window");
            }
        });
    }

    /// Gives back `g`'s units (a call of its own, with the limits the lease was counted in).
    async fn give_back(
        &self,
        key: &CounterKey,
        g: GiveBack,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let args = LeaseArgs {
            want: 0,
            give: g.units,
            given_at_ms: g.at_ms,
        };
        match (key.fixed_name(), g.limits.as_slice()) {
            (Some(name), [l]) => {
                self.fixed_script(name, l.rl, 1, 0, Some(args)).await?;
            }
            _ => {
                let parts = [Part {
                    counter: key,
                    limits: g.limits.as_slice(),
                }];
                self.run_window_script(&parts, 0, now_ms, Some(args), None)
                    .await?;
            }
        }
        if let Some(l) = &self.leases {
            l.gave_back(g.units);
        }
        Ok(())
    }

    /// The windows of each part's counter as Redis holds them at `now_ms` (Redis' time with its
    /// clock, returned), read with one `HGETALL` per hash: nothing counted.
    async fn read_windows(
        &self,
        parts: &[Part<'_>],
        now_ms: u64,
    ) -> Result<(Vec<WindowSet>, u64), StoreError> {
        let now_ms = match self.time_source {
            TimeSource::Local => now_ms,
            TimeSource::Redis => {
                let (seconds, micros): (u64, u64) = self.command(redis::cmd("TIME")).await?;
                seconds * 1000 + micros / 1000
            }
        };
        let mut pipe = redis::pipe();
        let mut counts = Vec::with_capacity(parts.len());
        for p in parts {
            let reads = peek_reads(&self.prefix, p.counter, p.limits, now_ms);
            counts.push(reads.len());
            for read in reads {
                pipe.add_command(read);
            }
        }
        let replies: Vec<Fields> = self
            .bounded(self.on_connection(|mut conn| {
                let pipe = pipe.clone();
                async move { pipe.query_async::<Vec<Fields>>(&mut conn).await }
            }))
            .await?;
        let mut replies = replies.into_iter();
        let sets = parts
            .iter()
            .zip(counts)
            .map(|(p, n)| peek_windows(p.limits, now_ms, replies.by_ref().take(n).collect()))
            .collect();
        Ok((sets, now_ms))
    }

    /// A check (cost 0) of sliding windows: what the reference answers for a hit of 0
    /// ([`WindowSet::hit`]) on the windows as Redis holds them, nothing counted; and when each
    /// window's oldest count leaves it, in milliseconds from the time they were read at (0 when
    /// it holds none).
    async fn check_windows(
        &self,
        parts: &[Part<'_>],
        now_ms: u64,
    ) -> Result<(Outcome, [u64; MAX_LIMITS]), StoreError> {
        let (mut sets, now_ms) = self.read_windows(parts, now_ms).await?;
        let o = {
            let mut decided: Vec<(&mut WindowSet, &[Limit])> = sets
                .iter_mut()
                .zip(parts)
                .map(|(w, p)| (w, p.limits))
                .collect();
            hit_parts(&mut decided, 0, now_ms)
        };
        let mut exits_ms = [0; MAX_LIMITS];
        let each = parts
            .iter()
            .zip(&sets)
            .flat_map(|(p, w)| p.limits.iter().map(move |l| (l, w)));
        for (e, (l, windows)) in exits_ms.iter_mut().zip(each) {
            let exit = match l.period() {
                // Nothing leaves a period before it ends.
                Some(p) => windows
                    .get_tally(p, l.zone)
                    .filter(|t| t.count > 0)
                    .map(|t| t.end_ms),
                None => windows.get(l.w).and_then(|w| w.oldest_exit_ms(now_ms)),
            };
            if let Some(ms) = exit {
                *e = ms.saturating_sub(now_ms);
            }
        }
        Ok((o, exits_ms))
    }

    async fn run_window_script(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
        lease: Option<LeaseArgs>,
        slot: Option<SlotArg<'_>>,
    ) -> Result<Called, StoreError> {
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX / 2);
        let window = WindowCall::new(&self.prefix, parts).with_slot(slot);
        let set;
        let limits = match parts {
            [p] => p.limits,
            _ => {
                set = LimitSet::of_parts(parts.iter().map(|p| p.limits));
                set.as_slice()
            }
        };
        // Two tries: the second uses the minute Redis told us about in the first.
        for _ in 0..2 {
            let (estimate, caller_ms) = match self.time_source {
                TimeSource::Redis => (now + self.offset.load(Ordering::Relaxed), None),
                TimeSource::Local => (now, Some(now)),
            };
            let call = window.command(cost, estimate, caller_ms, lease, |k, a, b| {
                WINDOW.call(k, a, b)
            });
            let call = &call;
            let reply: String = self
                .on_connection(|mut conn| async move { WINDOW.run(&mut conn, call).await })
                .await?;
            match WindowReply::read(&reply, limits) {
                Some(WindowReply::WrongMinute { redis_now_ms }) => {
                    self.offset.store(redis_now_ms - now, Ordering::Relaxed);
                }
                Some(WindowReply::GaveBack { redis_now_ms }) => {
                    return Ok(Called {
                        outcome: Outcome::new(false, false, &[]),
                        grant: 0,
                        redis_now_ms,
                        micros: None,
                        resets_ms: [0; MAX_LIMITS],
                        rooms: [None; MAX_LIMITS],
                    });
                }
                Some(WindowReply::Decided {
                    outcome,
                    grant,
                    redis_now_ms,
                    micros,
                    retry_ms,
                    resets_ms,
                    rooms,
                }) => {
                    self.stats().decided_by_redis.inc();
                    if let Some(micros) = micros {
                        self.offset.store(redis_now_ms - now, Ordering::Relaxed);
                        self.blocked
                            .observe_redis_time(redis_now_ms.div_euclid(1000), micros);
                    }
                    if let [p] = parts
                        && let [l] = p.limits
                        && !l.shadow
                        && !outcome.allowed
                        && retry_ms > 0
                    {
                        // With leases, room may come back when one is given back: by the end
                        // of the next bucket at the latest.
                        let trust_ms = match self.leases {
                            None => i64::MAX,
                            Some(_) => {
                                let at = u64::try_from(redis_now_ms).unwrap_or(0);
                                i64::try_from(bucket_end_ms(limits, at)).unwrap_or(i64::MAX)
                            }
                        };
                        self.blocked
                            .remember(p.counter, l, cost, redis_now_ms, retry_ms, trust_ms);
                    }
                    return Ok(Called {
                        outcome,
                        grant,
                        redis_now_ms,
                        micros,
                        resets_ms,
                        rooms,
                    });
                }
                None => {
                    return Err(StoreError::reply(format!(
                        "unexpected script reply {reply:?}"
                    )));
                }
            }
        }
        Err(StoreError::reply(
            "the minute moved twice during one call".into(),
        ))
    }

    /// [`RedisStore::hit_fixed_script`] with leases: decided from the window's lease while it
    /// has credit left (for at most a second, never past the window's end), else by a script
    /// call in the counter's turn that gives back what an ended lease left and, for a busy
    /// window, takes the next. A check (cost 0) changes no lease.
    async fn hit_fixed_leased(
        &self,
        leases: &Leases,
        name: &str,
        l: &Limit,
        seconds: u64,
        cost: u64,
    ) -> Result<Outcome, StoreError> {
        // Fixed windows live by Redis' expiry: their leases keep this store's own clock.
        let key = &CounterKey::fixed(name);
        let limits = &LimitSet::new(std::slice::from_ref(l));
        let now_us = || leases.elapsed_us();
        let local = |o: Outcome| {
            let q = o.quotas()[0];
            let ttl = i64::try_from(q.reset).unwrap_or(i64::MAX);
            fixed_outcome(l, cost, o.allowed, q.remaining, ttl)
        };
        let (args, turn, seen) = match self.plan_leased(leases, key, limits, cost, now_us).await {
            Planned::Local(o) => return Ok(local(o)),
            Planned::Call {
                args, turn, seen, ..
            } => (args, turn, seen),
            Planned::Unfollowed => return self.hit_fixed_script(name, l, seconds, cost).await,
        };
        let sent_us = leases.elapsed_us();
        let args = args.unwrap_or_default();
        let reply = self
            .fixed_script(name, l.rl, seconds, cost, Some(args))
            .await?;
        if args.give > 0 {
            leases.gave_back(args.give);
        }
        let FixedReply::Decided {
            decision: d,
            grant,
            expiry_ms,
            pttl_ms,
        } = reply
        else {
            return Err(StoreError::reply(
                "a give-back where a decision was due".into(),
            ));
        };
        self.stats().decided_by_redis.inc();
        // The window ends there no sooner than its TTL from the reply's arrival here.
        let reply_us = leases.elapsed_us();
        let granted = (grant > 0 && pttl_ms > 1).then(|| Granted {
            units: grant,
            at_ms: expiry_ms,
            // Redis read its clock after the call left: the lease ends here before the window
            // ends there.
            until_us: until_of_ttl(sent_us, pttl_ms),
        });
        let mut rooms = [None; MAX_LIMITS];
        rooms[0] = Some(d.credit);
        let mut exits_us = [0; MAX_LIMITS];
        exits_us[0] = reply_us + pttl_ms.max(0) * 1000;
        let answer = Answer {
            outcome: fixed_outcome(l, cost, d.allowed, d.credit, d.ttl),
            rooms,
            exits_us,
            granted,
            at_us: reply_us,
        };
        let (told, lease) = leases.settle(key, limits, cost, args.want > 0, answer, &turn, seen);
        drop(turn);
        if let (Some(g), Some(id)) = (granted, lease) {
            self.give_back_at(key, id, g.until_us, leases);
        }
        Ok(told)
    }

    /// `divvy.lua` with lease arguments (`args.want` 0 and `cost` 0: a give-back alone).
    async fn fixed_script(
        &self,
        name: &str,
        limit: u64,
        reset: u64,
        cost: u64,
        args: Option<LeaseArgs>,
    ) -> Result<FixedReply, StoreError> {
        let args = args.unwrap_or_default();
        let mut call = DIVVY.call(1, 7, name.len() + 120);
        call.arg(name)
            .arg(limit)
            .arg(reset)
            .arg(cost)
            .arg(args.want)
            .arg(args.give)
            .arg(args.given_at_ms);
        let call = &call;
        let reply: String = self
            .on_connection(|mut conn| async move { DIVVY.run(&mut conn, call).await })
            .await?;
        read_divvy_lease_reply(&reply)
            .ok_or_else(|| StoreError::reply(format!("unexpected script reply {reply:?}")))
    }

    /// One hit of `cost` on the fixed window `name` of `l`, lasting `seconds` if it starts now.
    async fn hit_fixed_script(
        &self,
        name: &str,
        l: &Limit,
        seconds: u64,
        cost: u64,
    ) -> Result<Outcome, StoreError> {
        let fut = async {
            let mut call = DIVVY.call(1, 4, name.len() + 60);
            call.arg(name).arg(l.rl).arg(seconds).arg(cost);
            let call = &call;
            let reply: String = self
                .on_connection(|mut conn| async move { DIVVY.run(&mut conn, call).await })
                .await?;
            let d = read_divvy_reply(&reply)
                .ok_or_else(|| StoreError::reply(format!("unexpected script reply {reply:?}")))?;
            self.stats().decided_by_redis.inc();
            Ok(fixed_outcome(l, cost, d.allowed, d.credit, d.ttl))
        };
        self.bounded(fut).await
    }

    /// One hit of `cost` on `key`'s fixed window of `l` at `now_ms`: `divvy.lua` on the window's
    /// key ([`keys::fixed_window`]). Divvy's keys carry no time: Redis' own expiry times the
    /// window; an aligned window's key names its place on the caller's clock.
    async fn hit_fixed(
        &self,
        key: &CounterKey,
        l: &Limit,
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        let span = Span::of(l, now_ms);
        let name = keys::fixed_window(key, l, &span);
        match &self.leases {
            Some(leases) => {
                self.bounded(self.hit_fixed_leased(leases, &name, l, span.seconds, cost))
                    .await
            }
            _ => self.hit_fixed_script(&name, l, span.seconds, cost).await,
        }
    }

    /// One PING, bounded by the timeout: is Redis answering?
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.command::<String>(redis::cmd("PING")).await.map(drop)
    }

    async fn command<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        self.bounded(self.on_connection(|mut conn| {
            let cmd = cmd.clone();
            async move { cmd.query_async::<T>(&mut conn).await }
        }))
        .await
    }

    /// Runs a store call within the store timeout. (A combinator, not an `async fn`: that would
    /// hold `call` twice, doubling the size of every request's future.)
    fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> impl Future<Output = Result<T, StoreError>> {
        use futures_util::FutureExt;
        tokio::time::timeout(self.timeout, call)
            .map(|r| r.unwrap_or_else(|_| Err(StoreError::timeout())))
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
