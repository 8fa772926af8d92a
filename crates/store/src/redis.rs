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
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::Script;

use super::blocked::BlockCache;
use super::connect::{Conn, Connector, RedisTarget};
use super::keys::{CounterKey, api_key_pattern, minute_hash, window_hash};
use super::memory::FixedDecision;
use super::{CounterStore, StoreError};
use quotagate_engine::limiter::{
    Limit, MAX_LIMITS, Outcome, Quota, Window, WindowSet, buckets, ceil_seconds,
};

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

/// TTL of a per-minute hash in seconds (DynLimits: EXPIRE 180). It must outlive the next minute,
/// during which the hash is still read as the previous minute.
pub const MINUTE_HASH_TTL: u64 = 180;

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
    /// Which hot-path connection the calling thread uses (see [`RedisStore::with_thread_slot`]).
    thread_slot: fn() -> usize,
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
            thread_slot: || 0,
        })
    }

    /// Has each thread use hot-path connection `thread_slot() % connections`: the application
    /// passes its worker index, so a worker's calls stay on the connection whose task runs on
    /// that worker's own runtime. Default: every thread uses the first.
    pub fn with_thread_slot(mut self, thread_slot: fn() -> usize) -> RedisStore {
        self.thread_slot = thread_slot;
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

    /// Checks one request of `cost` against `limits` and counts it where it belongs. `now_ms` is
    /// the caller's clock; with [`TimeSource::Redis`] it only helps name the keys.
    async fn hit_sliding(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        if let [l] = limits
            && !l.shadow
        {
            let caller_ms = match self.time_source {
                TimeSource::Redis => None,
                TimeSource::Local => Some(i64::try_from(now_ms).unwrap_or(i64::MAX / 2)),
            };
            if let Some(q) = self.blocked.check(key, l, cost, caller_ms) {
                return Ok(Outcome::new(false, false, &[q]));
            }
        }
        self.bounded(self.hit_inner(key, limits, cost, now_ms))
            .await
    }

    async fn hit_inner(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        let limits = &limits[..limits.len().min(MAX_LIMITS)];
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX / 2);
        let has_minute_window = limits.iter().any(|l| l.w == 60);
        // Other window lengths have a hash each; most requests have none.
        let others: Vec<String> = limits
            .iter()
            .filter(|l| l.w != 60)
            .map(|l| window_hash(&self.prefix, key, l.w))
            .collect();
        // Two tries: the second uses the minute Redis told us about in the first.
        for _ in 0..2 {
            let (estimate, now_arg) = match self.time_source {
                TimeSource::Redis => (now + self.offset.load(Ordering::Relaxed), String::new()),
                TimeSource::Local => (now, now.to_string()),
            };
            let minute = estimate.div_euclid(60_000);
            let minutes: [String; 4] = if has_minute_window {
                std::array::from_fn(|i| minute_hash(&self.prefix, key, minute - 2 + i as i64))
            } else {
                Default::default()
            };
            let keys = if has_minute_window { 4 } else { 0 } + others.len();
            let key_bytes: usize = minutes.iter().chain(&others).map(String::len).sum();
            // Keys, 5 arguments, 3 per limit; numbers of at most 20 digits.
            let mut call = WINDOW.call(
                keys,
                keys + 5 + 3 * limits.len(),
                key_bytes + 20 * (5 + 3 * limits.len()),
            );
            if has_minute_window {
                call.arg(&minutes[..]);
            }
            call.arg(&others[..])
                .arg(minute)
                .arg(&now_arg)
                .arg(MINUTE_HASH_TTL)
                .arg(cost)
                .arg(limits.len());
            for l in limits {
                call.arg(l.rl).arg(l.w).arg(u8::from(l.shadow));
            }
            let call = &call;
            let reply: String = self
                .on_connection(|mut conn| async move { WINDOW.run(&mut conn, call).await })
                .await?;
            let mut fields = [0i64; 4 + 4 * MAX_LIMITS];
            match integers(&reply, &mut fields) {
                [-1, redis_now] => {
                    self.offset.store(redis_now - now, Ordering::Relaxed);
                }
                [allowed, shadow_limited, redis_now, micros, per_limit @ ..]
                    if per_limit.len() == 4 * limits.len() =>
                {
                    if *micros >= 0 {
                        self.offset.store(redis_now - now, Ordering::Relaxed);
                        self.blocked
                            .observe_redis_time(redis_now.div_euclid(1000), *micros);
                    }
                    let nonneg = |v: i64| u64::try_from(v).unwrap_or(0);
                    let mut quotas = [Quota::zero_limit(); MAX_LIMITS];
                    for (i, (l, f)) in limits.iter().zip(per_limit.chunks(4)).enumerate() {
                        let [fits, remaining, reset_ms, retry_ms] = [f[0], f[1], f[2], f[3]];
                        quotas[i] = Quota {
                            allowed: fits == 1,
                            limit: l.rl,
                            remaining: nonneg(remaining),
                            reset: ceil_seconds(nonneg(reset_ms)),
                            retry_after: (retry_ms >= 0).then(|| ceil_seconds(nonneg(retry_ms))),
                        };
                    }
                    if let [l] = limits
                        && !l.shadow
                        && *allowed != 1
                        && per_limit[3] > 0
                    {
                        self.blocked
                            .remember(key, l, cost, *redis_now, per_limit[3]);
                    }
                    return Ok(Outcome::new(
                        *allowed == 1,
                        *shadow_limited == 1,
                        &quotas[..limits.len()],
                    ));
                }
                _ => {
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

    /// One hit on Divvy's fixed window `key` (`limit` and `reset` both above 0).
    async fn hit_fixed_script(
        &self,
        key: &str,
        limit: u64,
        reset: u64,
    ) -> Result<FixedDecision, StoreError> {
        let fut = async {
            let mut call = DIVVY.call(1, 3, key.len() + 40);
            call.arg(key).arg(limit).arg(reset);
            let call = &call;
            let reply: String = self
                .on_connection(|mut conn| async move { DIVVY.run(&mut conn, call).await })
                .await?;
            let mut fields = [0i64; 3];
            match integers(&reply, &mut fields) {
                [allowed, credit, ttl] => Ok(FixedDecision {
                    allowed: *allowed == 1,
                    credit: u64::try_from(*credit).unwrap_or(0),
                    reset: *ttl,
                }),
                _ => Err(StoreError::reply(format!(
                    "unexpected script reply {reply:?}"
                ))),
            }
        };
        self.bounded(fut).await
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

/// The space-separated integers of a script's reply, in `out`; the slice of `out` they filled.
/// Anything else (too many, not a number) is an empty slice, which no caller accepts.
fn integers<'a>(reply: &str, out: &'a mut [i64]) -> &'a [i64] {
    let mut n = 0;
    // Bytes, not `str::split` and `parse`: that pair cost about 1.8k instructions per decision.
    for word in reply.as_bytes().split(|&b| b == b' ') {
        match (out.get_mut(n), integer(word)) {
            (Some(slot), Some(v)) => *slot = v,
            _ => return &[],
        }
        n += 1;
    }
    &out[..n]
}

/// A decimal integer with an optional `-`, and nothing else; `None` if it does not fit an `i64`.
fn integer(word: &[u8]) -> Option<i64> {
    let (negative, digits) = match word {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, word),
    };
    if digits.is_empty() {
        return None;
    }
    // Summed as a negative number, so that i64::MIN fits too.
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_sub(i64::from(d - b'0'))?;
    }
    if negative { Some(v) } else { v.checked_neg() }
}

impl CounterStore for RedisStore {
    async fn hit(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        self.hit_sliding(key, limits, cost, now_ms).await
    }

    /// Divvy's keys carry no time: Redis' own expiry times the window, whatever `now` says.
    async fn hit_fixed(
        &self,
        key: &str,
        limit: u64,
        reset: u64,
        _now: u64,
    ) -> Result<FixedDecision, StoreError> {
        self.hit_fixed_script(key, limit, reset).await
    }

    /// A fresh connection per probe: the old one may be stuck behind a hung server. On a cluster
    /// every slot range's master must answer, so that one live node does not end the failure
    /// policy while another's keys still fail ([`Conn::check_every_master`]).
    async fn probe(&self) -> Result<(), StoreError> {
        self.reset_connection();
        self.bounded(self.on_connection(|mut conn| async move { conn.check_every_master().await }))
            .await
    }

    /// Reads the hashes that hold the windows at `now_ms` and asks the Rust arithmetic
    /// ([`WindowSet::peek`]) about them: a read, no script, nothing counted.
    async fn peek(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        let now_ms = match self.time_source {
            TimeSource::Local => now_ms,
            TimeSource::Redis => {
                let (seconds, micros): (u64, u64) = self.command(redis::cmd("TIME")).await?;
                seconds * 1000 + micros / 1000
            }
        };
        let now = now_ms / 1000;
        let minute = i64::try_from(now / 60).unwrap_or(i64::MAX / 2);
        let mut pipe = redis::pipe();
        for l in limits {
            if l.w == 60 {
                pipe.cmd("HGETALL")
                    .arg(minute_hash(&self.prefix, key, minute - 1))
                    .cmd("HGETALL")
                    .arg(minute_hash(&self.prefix, key, minute));
            } else {
                pipe.cmd("HGETALL").arg(window_hash(&self.prefix, key, l.w));
            }
        }
        type Fields = Vec<(String, String)>;
        let mut replies: std::vec::IntoIter<Fields> = self
            .bounded(self.on_connection(|mut conn| {
                let pipe = pipe.clone();
                async move { pipe.query_async::<Vec<Fields>>(&mut conn).await }
            }))
            .await?
            .into_iter();
        let base = |m: i64| u64::try_from(m * 60).unwrap_or(0);
        let number = |v: &str| v.parse::<u64>().ok();
        let mut windows = Vec::with_capacity(limits.len());
        for l in limits {
            if l.w == 60 {
                let prev = replies.next().unwrap_or_default();
                let cur = replies.next().unwrap_or_default();
                // Fields that are not a second of the minute are the script's state.
                let counts = [(base(minute - 1), prev), (base(minute), cur)]
                    .into_iter()
                    .flat_map(|(base, fields)| {
                        fields.into_iter().filter_map(move |(f, v)| {
                            let second: u64 = f.parse().ok().filter(|s| *s < 60)?;
                            Some((base + second, v.parse().ok()?))
                        })
                    });
                windows.push(Window::from_counts(60, now, counts));
            } else {
                let fields = replies.next().unwrap_or_default();
                let n = buckets(l.w);
                let latest = fields
                    .iter()
                    .find(|(f, _)| f == "c")
                    .and_then(|(_, v)| number(v))
                    .unwrap_or(0);
                // Field `i` holds the bucket b <= latest with b mod n = i.
                let counts = fields.iter().filter_map(|(f, v)| {
                    let slot = number(f).filter(|i| *i < n)?;
                    let b = latest.checked_sub((latest + n - slot) % n)?;
                    Some((b, u32::try_from(number(v)?).ok()?))
                });
                let at = quotagate_engine::limiter::bucket_of(l.w, now_ms).max(latest);
                windows.push(Window::from_counts(l.w, at, counts));
            }
        }
        Ok(WindowSet::from_windows(windows).peek(limits, cost, now_ms))
    }

    /// Deletes every minute hash of `api_key` (`SCAN` over the keyspace: an admin operation, not a
    /// request's).
    async fn reset(&self, api_key: &[u8]) -> Result<u64, StoreError> {
        let pattern = api_key_pattern(&self.prefix, api_key);
        // Remembered rejections would otherwise outlive the counts they came from.
        self.blocked.forget(&CounterKey::api_key_prefix(api_key));
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

#[cfg(test)]
mod tests {
    #[test]
    fn script_replies_are_read_strictly() {
        let mut out = [0i64; 3];
        assert_eq!(super::integers("1 41 -1", &mut out), [1, 41, -1]);
        assert_eq!(
            super::integers("-9223372036854775808 0 9223372036854775807", &mut out),
            [i64::MIN, 0, i64::MAX]
        );
        for bad in [
            "",
            "1  2",
            "1 2 3 4",
            "1 x 2",
            "1.5 2 3",
            "+1 2 3",
            "- 2 3",
            "1 2 9223372036854775808",
            "1 2 3 ",
        ] {
            assert_eq!(super::integers(bad, &mut out), [] as [i64; 0], "{bad:?}");
        }
    }
}
