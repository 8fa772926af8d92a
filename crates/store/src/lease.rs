//! lease: quota a Redis store has counted ahead for one counter, spent in this instance's memory.
//!
//! A lease is taken by a request's own script call: Redis counts the request's cost plus up to
//! `want` more units in the bucket of now (`window.lua`), and this instance may admit up to those
//! extra units itself until that bucket ends. Whatever is left then is given back: with the
//! counter's next call (one call that gives back and decides, taking the next lease), or by a timer
//! at the bucket's end when no call comes. So every unit admitted here was counted in the bucket in
//! which it was admitted, and the window stays exact at its own resolution: never over the limit,
//! across any number of instances.
//!
//! Leases are sized from this instance's recent rate for the counter (units it admitted in the
//! current and the previous bucket) and capped by `store.lease_max_units`; Redis grants at most
//! half of each window's room after the cost, so near a limit leases shrink to none and every
//! decision is one call again. A counter is "busy" (asks for leases) from [`BUSY_UNITS`] units a
//! bucket.
//!
//! Every call this instance makes for one counter takes a turn ([`Turn`]): a call that takes or
//! gives back a lease alone, the others together. So no lease of the counter changes here while
//! another call is out, the counts a reply reflects and the lease this instance holds always
//! match, and what it tells ([`Told`]) is exact for one instance.
//!
//! Time: with the caller's clock (`time_source = local`) a lease ends at its bucket's end by that
//! clock, exactly. With Redis' clock it ends at the local instant the call was sent plus the time
//! from Redis' `now` to the bucket's end: Redis read its clock after the call was sent, so the
//! lease always ends here before its bucket ends there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use quotagate_engine::limiter::{
    Kind, Limit, MAX_LIMITS, Outcome, Quota, bucket_of, bucket_start, buckets,
};
// tokio's clock: std's in production, frozen under a paused test runtime.
use tokio::time::Instant;

use crate::keys::CounterKey;
use crate::script::LeaseArgs;

/// Units a bucket from which a counter asks for leases.
pub const BUSY_UNITS: u64 = 4;
/// Counters followed at most (per shard: this over [`SHARDS`]); beyond that, idle ones are swept
/// and new ones decided by Redis alone.
pub const MAX_COUNTERS: usize = 131_072;
const SHARDS: usize = 16;

/// `store.lease`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseMode {
    /// Busy counters take leases. Default.
    #[default]
    Auto,
    /// One script call per decision.
    Off,
}

/// What the Redis store counts about its decisions and leases (registered by the application).
#[derive(Debug, Clone, Default)]
pub struct StoreStats {
    /// Requests decided in this instance's memory, from a lease.
    pub decided_by_lease: Counter,
    /// Requests refused in this instance's memory from a remembered refusal.
    pub decided_by_block: Counter,
    /// Requests decided by a script call.
    pub decided_by_redis: Counter,
    /// Leases granted.
    pub leases: Counter,
    /// Units granted in leases.
    pub units_leased: Counter,
    /// Units of leases admitted here.
    pub units_used: Counter,
    /// Units of leases given back unused.
    pub units_given_back: Counter,
}

/// The last instant (on the lease clock, microseconds) a lease counted at `at_ms` may be spent:
/// the earliest end, over `limits`, of the bucket holding `at_ms`, in milliseconds. A calendar
/// period's lease lasts to the end of its second (periods start and end on whole seconds), so
/// what one instance holds back from the others is never more than a second's worth.
pub fn bucket_end_ms(limits: &[Limit], at_ms: u64) -> u64 {
    limits
        .iter()
        .map(|l| match l.kind {
            // (A concurrency limit is never leased: `RedisStore::leases_for`.)
            Kind::Calendar(_) | Kind::Concurrent => (at_ms / 1000 + 1) * 1000,
            _ => bucket_start(l.w, bucket_of(l.w, at_ms) + 1),
        })
        .min()
        .unwrap_or(at_ms)
}

/// The lease-clock instant (microseconds) before which a lease Redis counted by its own clock may
/// be spent: the call left here at `sent_us`, Redis read its clock after that (`redis_now_ms`,
/// with `micros`, the microseconds of its `TIME`, when it sent them) and counted the lease in a
/// bucket ending at Unix `end_ms` there. Counted from the microsecond Redis read, not its
/// millisecond: from the millisecond a lease was spent up to 1 ms into the next bucket, where its
/// units were not counted (a window one unit over, seen across three instances).
pub fn until_on_redis_clock(
    sent_us: i64,
    redis_now_ms: i64,
    micros: Option<i64>,
    end_ms: i64,
) -> i64 {
    // Without the microseconds, the millisecond's last: never before Redis read its clock.
    let read_us = match micros {
        Some(us) => redis_now_ms.div_euclid(1000) * 1_000_000 + us,
        None => redis_now_ms * 1000 + 999,
    };
    sent_us + (end_ms * 1000 - read_us)
}

/// The lease-clock instant before which a fixed window's lease may be spent: the call left here
/// at `sent_us` and Redis answered its key's `PTTL` (whole milliseconds, from a millisecond clock,
/// so up to 1 ms more than is left), spent for at most a second.
pub fn until_of_ttl(sent_us: i64, pttl_ms: i64) -> i64 {
    sent_us + (pttl_ms - 1).clamp(0, 1000) * 1000
}

/// The shortest bucket of `limits`, in microseconds: the period of a counter's rate. A fixed
/// window's or a calendar period's lease is spent for at most a second: its rate is counted per
/// second.
fn bucket_us(limits: &[Limit]) -> i64 {
    limits
        .iter()
        .map(|l| match l.kind {
            Kind::Sliding => i64::from(l.w) * 1_000_000 / buckets(l.w) as i64,
            Kind::Fixed | Kind::Aligned | Kind::Calendar(_) | Kind::Concurrent => 1_000_000,
        })
        .min()
        .unwrap_or(1_000_000)
        .max(1)
}

/// The limits a lease was taken for, by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSet {
    limits: [Limit; MAX_LIMITS],
    len: usize,
}

impl LimitSet {
    pub fn new(limits: &[Limit]) -> LimitSet {
        LimitSet::of_parts(std::iter::once(limits))
    }

    /// The limits of several counters' parts, in order, at most [`MAX_LIMITS`] in all.
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [Limit]>) -> LimitSet {
        let mut set = LimitSet {
            limits: [Limit::per_minute(0); MAX_LIMITS],
            len: 0,
        };
        for limits in parts {
            let n = limits.len().min(MAX_LIMITS - set.len);
            set.limits[set.len..set.len + n].copy_from_slice(&limits[..n]);
            set.len += n;
        }
        set
    }

    pub fn as_slice(&self) -> &[Limit] {
        &self.limits[..self.len]
    }
}

#[derive(Debug)]
struct Lease {
    limits: LimitSet,
    /// Units left to admit here.
    left: u64,
    /// Names the counts it was taken from, for the give-back: by the limits' kind, a sliding
    /// window's script time (its bucket) or a fixed window's expiry (the window).
    at_ms: i64,
    /// Spent only before this instant (lease clock, microseconds).
    until_us: i64,
    /// Tells this lease from a later one of the same counter (for the timer).
    id: u64,
}

#[derive(Debug, Default)]
struct Entry {
    /// The rate's bucket (lease clock over the counter's shortest bucket).
    epoch: i64,
    /// Units admitted by this instance in `epoch` and in the one before.
    used: u64,
    prev_used: u64,
    lease: Option<Box<Lease>>,
    /// The epoch in which Redis granted no lease (the counter is near its limit): no more are
    /// asked for in it, so its calls keep the script's cheaper path for plain decisions.
    dry: Option<i64>,
    /// The counter's calls to Redis from this instance, in turns ([`Turn`]).
    line: Line,
    /// What this instance has told of the counter's windows (none before its first answer).
    told: Option<Told>,
}

/// A lease given up, to be given back to Redis with the limits it was counted in.
#[derive(Debug, Clone, Copy)]
pub struct GiveBack {
    pub limits: LimitSet,
    pub units: u64,
    pub at_ms: i64,
}

/// A counter's calls to Redis from this instance ([`Leases::turn`]).
pub type Line = Arc<tokio::sync::RwLock<()>>;

/// A counter's turn to call Redis from this instance, held until the call is settled: shared by
/// calls that take and give back no lease (several may be out at once), alone for one that does
/// (while it is out, no other call of the counter is).
#[derive(Debug)]
pub enum Turn {
    Shared(tokio::sync::OwnedRwLockReadGuard<()>),
    Alone(tokio::sync::OwnedRwLockWriteGuard<()>),
}

impl Turn {
    /// Waits for a turn on `line`, alone or shared.
    pub async fn wait(line: Line, alone: bool) -> Turn {
        if alone {
            Turn::Alone(line.write_owned().await)
        } else {
            Turn::Shared(line.read_owned().await)
        }
    }

    fn is_alone(&self) -> bool {
        matches!(self, Turn::Alone(_))
    }
}

/// What this instance had told of each window of a counter when a request was planned: nothing
/// told for that request may be more, less its cost ([`Told`]).
#[derive(Debug, Clone, Copy)]
pub struct Seen([u64; MAX_LIMITS]);

/// What a request on a counter does.
#[derive(Debug)]
pub enum Plan {
    /// Decided here, from the counter's lease.
    Local(Outcome),
    /// Redis must decide and the counter's turn is not free: wait for it ([`Turn::wait`], alone
    /// or not), then plan again in it ([`Leases::plan_in_turn`]).
    Wait { line: Line, alone: bool, seen: Seen },
    /// Ask Redis, in `turn`: with `args` (a lease wanted, an old one given back) or plainly.
    /// `give_apart`: a lease counted with other limits (a new catalog), to give back in a call
    /// of its own first.
    Ask {
        args: Option<LeaseArgs>,
        give_apart: Option<GiveBack>,
        turn: Turn,
        seen: Seen,
    },
    /// Too many counters are followed: Redis alone decides, nothing is leased or told here.
    Unfollowed,
}

type Counters = HashMap<CounterKey, Entry, foldhash::fast::RandomState>;

/// The leases and rates of one Redis store's counters.
#[derive(Debug)]
pub struct Leases {
    max_units: u64,
    shards: Box<[Mutex<Counters>]>,
    start: Instant,
    next_id: std::sync::atomic::AtomicU64,
    pub stats: StoreStats,
}

fn shard_of(key: &CounterKey) -> usize {
    use std::hash::BuildHasher;
    (foldhash::fast::FixedState::with_seed(7).hash_one(key) as usize) % SHARDS
}

impl Leases {
    /// Leases of at most `max_units` units (at least 1).
    pub fn new(max_units: u64, stats: StoreStats) -> Leases {
        Leases {
            max_units: max_units.max(1),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            start: Instant::now(),
            next_id: 1.into(),
            stats,
        }
    }

    /// The lease clock for Redis' time: microseconds since this table was made.
    pub fn elapsed_us(&self) -> i64 {
        i64::try_from(self.start.elapsed().as_micros()).unwrap_or(i64::MAX / 2)
    }

    /// The instant of lease-clock microseconds `us` (for a timer).
    pub fn instant_of(&self, us: i64) -> Instant {
        self.start + std::time::Duration::from_micros(u64::try_from(us).unwrap_or(0))
    }

    fn shard(&self, key: &CounterKey) -> std::sync::MutexGuard<'_, Counters> {
        self.shards[shard_of(key)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// What a request of `cost` on `key` under `limits` does at `now_us` (lease clock): decided
    /// from the counter's lease, or by Redis in the counter's turn: a call that gives back what
    /// an ended lease left and, for a busy counter, takes the next, or a plain one. A check (cost
    /// 0) takes no lease.
    pub fn plan(&self, key: &CounterKey, limits: &LimitSet, cost: u64, now_us: i64) -> Plan {
        self.plan_at(key, limits, cost, now_us, None)
    }

    /// [`Leases::plan`] again once `turn` came: the call before may have left a lease that
    /// decides this request. In a shared turn no lease is changed.
    pub fn plan_in_turn(
        &self,
        key: &CounterKey,
        limits: &LimitSet,
        cost: u64,
        now_us: i64,
        turn: Turn,
        seen: Seen,
    ) -> Plan {
        self.plan_at(key, limits, cost, now_us, Some((turn, seen)))
    }

    fn plan_at(
        &self,
        key: &CounterKey,
        limits: &LimitSet,
        cost: u64,
        now_us: i64,
        held: Option<(Turn, Seen)>,
    ) -> Plan {
        let mut shard = self.shard(key);
        if !shard.contains_key(key) {
            if shard.len() >= MAX_COUNTERS / SHARDS {
                let period = bucket_us(limits.as_slice());
                // Entries holding nothing, with no call out, and idle for two buckets tell
                // nothing any more.
                shard.retain(|_, e| {
                    e.lease.is_some()
                        || Arc::strong_count(&e.line) > 1
                        || now_us / period - e.epoch < 2
                });
                if shard.len() >= MAX_COUNTERS / SHARDS {
                    return Plan::Unfollowed;
                }
            }
            shard.insert(key.clone(), Entry::default());
        }
        let Some(e) = shard.get_mut(key) else {
            // Inserted above: never taken.
            return Plan::Unfollowed;
        };
        let epoch = now_us / bucket_us(limits.as_slice());
        if epoch != e.epoch {
            e.prev_used = if epoch == e.epoch + 1 { e.used } else { 0 };
            e.used = 0;
            e.epoch = epoch;
        }
        if let Some(l) = e.lease.as_deref_mut()
            && l.limits == *limits
            && now_us < l.until_us
            && l.left >= cost
            && let Some(told) = e.told.as_mut().filter(|t| t.is_for(limits))
        {
            l.left -= cost;
            e.used += cost;
            self.stats.decided_by_lease.inc();
            self.stats.units_used.inc_by(cost);
            return Plan::Local(told.spend(cost, now_us));
        }
        let rate = e.prev_used.max(e.used + cost);
        let want = if cost > 0 && rate >= BUSY_UNITS && e.dry != Some(epoch) {
            rate.min(self.max_units)
        } else {
            0
        };
        // A lease left over must go back with the next call that counts (ended, or too small),
        // and an ended one with a check too: its units may have left some windows and not
        // others, so no answer could count them as this instance's room.
        let changes = want > 0
            || e.lease.as_ref().is_some_and(|l| {
                l.left > 0 && (cost > 0 || now_us >= l.until_us || l.limits != *limits)
            });
        let (turn, seen) = match held {
            Some(held) => held,
            None => {
                let seen = Seen::of(e.told.as_ref().filter(|t| t.is_for(limits)));
                let line = e.line.clone();
                let taken = if changes {
                    line.clone().try_write_owned().ok().map(Turn::Alone)
                } else {
                    line.clone().try_read_owned().ok().map(Turn::Shared)
                };
                match taken {
                    Some(turn) => (turn, seen),
                    None => {
                        return Plan::Wait {
                            line,
                            alone: changes,
                            seen,
                        };
                    }
                }
            }
        };
        if !changes || !turn.is_alone() {
            return Plan::Ask {
                args: None,
                give_apart: None,
                turn,
                seen,
            };
        }
        let mut give = None;
        let mut give_apart = None;
        if let Some(old) = e.lease.take()
            && old.left > 0
        {
            let g = GiveBack {
                limits: old.limits,
                units: old.left,
                at_ms: old.at_ms,
            };
            if old.limits == *limits {
                give = Some(g);
            } else {
                give_apart = Some(g);
            }
        }
        let args = (want > 0 || give.is_some()).then(|| LeaseArgs {
            want,
            give: give.map_or(0, |g| g.units),
            given_at_ms: give.map_or(0, |g| g.at_ms),
        });
        Plan::Ask {
            args,
            give_apart,
            turn,
            seen,
        }
    }

    /// The counter's calls to Redis from this instance (`None`: it is not followed): a give-back
    /// of its own takes a turn alone too.
    pub fn turn(&self, key: &CounterKey) -> Option<Line> {
        self.shard(key).get(key).map(|e| e.line.clone())
    }

    /// Records a script call's answer on `key` for a request of `cost`, made in the counter's
    /// `turn` (`asked`: it asked for a lease; `seen`: as planned). Returns the answer to give, its
    /// remaining what this instance tells ([`Told`]), and the new lease's id, for its timer.
    #[allow(clippy::too_many_arguments)]
    pub fn settle(
        &self,
        key: &CounterKey,
        limits: &LimitSet,
        cost: u64,
        asked: bool,
        a: Answer,
        turn: &Turn,
        seen: Seen,
    ) -> (Outcome, Option<u64>) {
        let mut shard = self.shard(key);
        let Some(e) = shard.get_mut(key) else {
            return (a.outcome, None);
        };
        if asked && a.granted.is_none() {
            e.dry = Some(e.epoch);
        }
        if a.outcome.allowed {
            e.used += cost;
        }
        let mut id = None;
        if let Some(g) = a.granted {
            let next = self
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.stats.leases.inc();
            self.stats.units_leased.inc_by(g.units);
            // Calls take turns: no other lease of this counter was taken meanwhile.
            e.lease = Some(Box::new(Lease {
                limits: *limits,
                left: g.units,
                at_ms: g.at_ms,
                until_us: g.until_us,
                id: next,
            }));
            id = Some(next);
        }
        // Units leased here and unused are counted in Redis' answer: they are this instance's
        // room.
        let own = e
            .lease
            .as_ref()
            .filter(|l| l.limits == *limits)
            .map_or(0, |l| l.left);
        let told = match e.told.as_mut().filter(|t| t.is_for(limits)) {
            Some(t) => t,
            None => e.told.insert(Told::new(limits)),
        };
        (told.reply(&a, cost, own, seen, turn.is_alone()), id)
    }

    /// The lease `id` of `key`, if it is still the counter's and has units left: taken away (its
    /// bucket is over), to be given back.
    pub fn expire(&self, key: &CounterKey, id: u64) -> Option<GiveBack> {
        let mut shard = self.shard(key);
        let e = shard.get_mut(key)?;
        if e.lease.as_ref().is_none_or(|l| l.id != id) {
            return None;
        }
        let l = e.lease.take()?;
        (l.left > 0).then_some(GiveBack {
            limits: l.limits,
            units: l.left,
            at_ms: l.at_ms,
        })
    }

    /// `units` more counted for a request of `key` under `limits` that this instance admitted
    /// (a response reported more than was reserved, docs/semantics.md): taken from the
    /// counter's lease when it has them left now (`true`: nothing more to count in Redis), and
    /// either way off what this instance tells.
    pub fn added(&self, key: &CounterKey, limits: &LimitSet, units: u64, now_us: i64) -> bool {
        let mut shard = self.shard(key);
        let Some(e) = shard.get_mut(key) else {
            return false;
        };
        if let Some(t) = e.told.as_mut().filter(|t| t.is_for(limits)) {
            for s in t.slots.iter_mut() {
                s.floor = s.floor.saturating_sub(units);
            }
        }
        match e.lease.as_deref_mut() {
            Some(l) if l.limits == *limits && now_us < l.until_us && l.left >= units => {
                l.left -= units;
                e.used += units;
                self.stats.units_used.inc_by(units);
                true
            }
            _ => false,
        }
    }

    /// `units` of a request of `key` under `limits`, reserved at `reserved_at_ms` (the script's
    /// clock), were given back at `now_ms`: room again, told at once in each window that still
    /// holds the bucket they were counted in (a period: the same period), never above its limit.
    pub fn given_back(
        &self,
        key: &CounterKey,
        limits: &LimitSet,
        units: u64,
        reserved_at_ms: u64,
        now_ms: u64,
    ) {
        let mut shard = self.shard(key);
        let Some(t) = shard
            .get_mut(key)
            .and_then(|e| e.told.as_mut())
            .filter(|t| t.is_for(limits))
        else {
            return;
        };
        for s in t.slots.iter_mut() {
            let l = &s.limit;
            if l.still_counts(reserved_at_ms, now_ms) && s.floor != u64::MAX {
                s.floor = s.floor.saturating_add(units).min(l.rl);
            }
        }
    }

    /// Forgets the leases of every counter whose name starts with `prefix` (its counts were
    /// reset): giving them back would take from counts made since.
    pub fn forget(&self, prefix: &str) {
        for shard in &self.shards {
            shard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|k, _| !k.as_str().starts_with(prefix));
        }
    }

    /// A lease's units were given back.
    pub fn gave_back(&self, units: u64) {
        self.stats.units_given_back.inc_by(units);
    }
}

/// A lease a script call granted, on the lease clock.
#[derive(Debug, Clone, Copy)]
pub struct Granted {
    pub units: u64,
    pub at_ms: i64,
    pub until_us: i64,
}

/// A script call's answer, as [`Leases::settle`] takes it.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The decision, its remaining counting every lease (this instance's too) as used.
    pub outcome: Outcome,
    /// Each window's room: its remaining, and where the cost did not fit (told as such), the room
    /// it has (`None`: not read).
    pub rooms: [Option<u64>; MAX_LIMITS],
    /// When each window's oldest count leaves it, as of the answer (lease clock, microseconds;
    /// a fixed window's end).
    pub exits_us: [i64; MAX_LIMITS],
    /// The lease it took.
    pub granted: Option<Granted>,
    /// The lease clock at the answer.
    pub at_us: i64,
}

/// What this instance tells of one counter's windows: one rule for the remaining of every answer,
/// whichever way it was decided (from a lease, or by a script call).
///
/// Each window's remaining is the least this instance has told since counts could last have left
/// the window, each request counted here taking its cost off; a script call's answer brings it
/// down to Redis' remaining plus this instance's unused lease (Redis counts every lease as used,
/// and this instance knows its own is room). So within a window it never rises until the oldest
/// count a reply saw leaves, it is never above the room (other instances' leases count as used),
/// and with one instance it is the room exactly. With several, what it leaves out is other
/// instances' unused leases, and those given back since counts last left (docs/stores.md).
#[derive(Debug)]
pub struct Told {
    /// The limits it tells of (a new catalog's are told anew).
    set: LimitSet,
    slots: Box<[Slot]>,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    limit: Limit,
    /// The remaining told last: the least since counts could last leave the window.
    floor: u64,
    /// When the window's oldest count, as of the latest reply, leaves it (lease clock,
    /// microseconds; a fixed window's end): until then nothing can leave, so nothing told rises.
    exit_us: i64,
}

impl Seen {
    /// What `told` says now (nothing told yet: no bound).
    fn of(told: Option<&Told>) -> Seen {
        let mut seen = [u64::MAX; MAX_LIMITS];
        for (v, s) in seen.iter_mut().zip(told.map_or(&[][..], |t| &t.slots[..])) {
            *v = s.floor;
        }
        Seen(seen)
    }
}

impl Told {
    fn new(set: &LimitSet) -> Told {
        Told {
            set: *set,
            slots: set
                .as_slice()
                .iter()
                .map(|&limit| Slot {
                    limit,
                    floor: u64::MAX,
                    exit_us: i64::MIN,
                })
                .collect(),
        }
    }

    fn is_for(&self, set: &LimitSet) -> bool {
        self.set == *set
    }

    /// Answer `a` for a request of `cost`, with `own` units of this instance's lease unused after
    /// it; `seen`: what was told when it was planned; `alone`: no other call of the counter was
    /// out meanwhile. The outcome to tell.
    fn reply(&mut self, a: &Answer, cost: u64, own: u64, seen: Seen, alone: bool) -> Outcome {
        let outcome = &a.outcome;
        let granted = a.granted.map_or(0, |g| g.units);
        let mut quotas = [Quota::zero_limit(); MAX_LIMITS];
        let n = self.slots.len().min(outcome.quotas().len());
        for (i, (s, q)) in self.slots.iter_mut().zip(outcome.quotas()).enumerate() {
            // Counted in this window: admitted, and a shadow window counts only with room in all.
            let counted =
                outcome.allowed && q.allowed && !(s.limit.shadow && outcome.shadow_limited);
            let took = if counted { cost + granted } else { 0 };
            let room = if q.allowed {
                Some(q.remaining)
            } else {
                a.rooms[i]
            };
            let Some(room) = room else {
                // Refused without reading the window (a remembered refusal): it has less room
                // than the cost, which is all that is known.
                s.floor = s.floor.min(cost.saturating_sub(1).saturating_add(own));
                quotas[i] = Quota {
                    remaining: q.remaining.min(s.floor),
                    ..*q
                };
                continue;
            };
            let fresh = room.saturating_add(own);
            let told = if a.at_us >= s.exit_us || room.saturating_add(took) >= s.limit.rl {
                // Counts may have left the window since it was last told, or it holds nothing
                // but what this call counted (a fixed window begun again, though its end moved
                // less than time did): told as it is.
                s.floor = fresh;
                fresh
            } else {
                // Never more than was told before this request, less what it took. Calls out
                // together may settle in another order than Redis ran them: each goes by what
                // was told when it was planned. A call alone also by what was told since (from
                // the lease, while it waited for its turn).
                let before = if alone {
                    seen.0[i].min(s.floor)
                } else {
                    seen.0[i]
                };
                let told = fresh.min(before.saturating_sub(if counted { cost } else { 0 }));
                s.floor = s.floor.min(told);
                told
            };
            // A refusal's reset is its wait, not when the oldest count leaves.
            if q.allowed {
                s.exit_us = a.exits_us[i];
            }
            quotas[i] = if q.allowed {
                Quota {
                    remaining: told,
                    ..*q
                }
            } else {
                // No room for this cost: told as every store tells it (a sliding window's 0, a
                // fixed window's credit), never above what was told before.
                Quota {
                    remaining: q.remaining.min(told),
                    ..*q
                }
            };
        }
        Outcome::new(outcome.allowed, outcome.shadow_limited, &quotas[..n])
    }

    /// The answer for a request of `cost` admitted from this instance's lease at `now_us`.
    fn spend(&mut self, cost: u64, now_us: i64) -> Outcome {
        let mut quotas = [Quota::zero_limit(); MAX_LIMITS];
        for (q, s) in quotas.iter_mut().zip(self.slots.iter_mut()) {
            s.floor = s.floor.saturating_sub(cost);
            // Redis rounds a fixed window's TTL to the nearest second: so does this answer.
            let shave = match s.limit.kind {
                Kind::Sliding | Kind::Calendar(_) | Kind::Concurrent => 0,
                Kind::Fixed | Kind::Aligned => 500_000,
            };
            let reset_us = u64::try_from(s.exit_us - shave - now_us).unwrap_or(0);
            *q = Quota {
                allowed: true,
                limit: s.limit.rl,
                remaining: s.floor,
                reset: reset_us.div_ceil(1_000_000),
                retry_after: None,
            };
        }
        Outcome::new(true, false, &quotas[..self.slots.len()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CounterKey {
        CounterKey::new(b"k", "GET /x")
    }

    fn lim(rl: u64, w: u32) -> Limit {
        Limit::sliding(rl, w)
    }

    #[test]
    fn a_lease_ends_with_the_shortest_bucket() {
        // 60 s: one-second buckets; 10 s: 100 ms; 3600 s: one minute.
        assert_eq!(bucket_end_ms(&[lim(5, 60)], 1_000_123), 1_001_000);
        assert_eq!(
            bucket_end_ms(&[lim(5, 60), lim(1, 10)], 1_000_123),
            1_000_200
        );
        assert_eq!(bucket_end_ms(&[lim(5, 3600)], 1_000_123), 1_020_000);
        // 90 s: 1.5 s buckets, exact to the millisecond.
        assert_eq!(bucket_end_ms(&[lim(5, 90)], 1_500), 3_000);
    }

    #[test]
    fn a_lease_on_redis_clock_ends_before_its_bucket_does_there() {
        // The call left at 5 s on the lease clock, Unix 1_000_099.850 ms; Redis read its clock
        // at 1_000_099.900 (the 900 µs of its `TIME`); the 100 ms bucket ends at 1_000_100.
        // 100 µs are left there, so 100 µs here from the call's leaving (it reached Redis later).
        let sent_us = 5_000_000;
        let until = until_on_redis_clock(sent_us, 1_000_099, Some(99_900), 1_000_100);
        assert_eq!(until, sent_us + 100);
        // Without the microseconds: as if Redis read at the millisecond's last one.
        assert_eq!(
            until_on_redis_clock(sent_us, 1_000_099, None, 1_000_100),
            sent_us + 1
        );
        // A TTL read from a millisecond clock is up to 1 ms more than is left; at most a second.
        assert_eq!(until_of_ttl(sent_us, 40), sent_us + 39_000);
        assert_eq!(until_of_ttl(sent_us, 5_000), sent_us + 1_000_000);
        assert_eq!(until_of_ttl(sent_us, 1), sent_us);
    }

    /// The call a request makes in its turn (it must not be decided here).
    fn ask(
        l: &Leases,
        k: &CounterKey,
        limits: &[Limit],
        now_us: i64,
    ) -> (Option<LeaseArgs>, Option<GiveBack>) {
        match l.plan(k, &LimitSet::new(limits), 1, now_us) {
            Plan::Ask {
                args, give_apart, ..
            } => (args, give_apart),
            other => panic!("not a call in its turn: {other:?}"),
        }
    }

    /// A turn alone, and nothing seen: a call settled by itself.
    fn alone() -> (Turn, Seen) {
        let line: Line = Arc::default();
        (
            Turn::Alone(line.try_write_owned().unwrap()),
            Seen([u64::MAX; MAX_LIMITS]),
        )
    }

    fn granted(units: u64, at_ms: i64, until_us: i64) -> Granted {
        Granted {
            units,
            at_ms,
            until_us,
        }
    }

    fn answer(allowed: bool, remaining: u64) -> Outcome {
        Outcome::new(
            allowed,
            false,
            &[Quota {
                allowed,
                limit: 100,
                remaining,
                reset: 60,
                retry_after: None,
            }],
        )
    }

    /// Settles a call of cost 1 answered `allowed` with Redis' `remaining` at `now_us`, the oldest
    /// count leaving at `exit_us`: what is told.
    #[allow(clippy::too_many_arguments)]
    fn settle(
        l: &Leases,
        k: &CounterKey,
        limits: &[Limit],
        asked: bool,
        allowed: bool,
        remaining: u64,
        lease: Option<Granted>,
        now_us: i64,
        exit_us: i64,
    ) -> u64 {
        let (o, _) = l.settle(
            k,
            &LimitSet::new(limits),
            1,
            asked,
            reply(answer(allowed, remaining), lease, now_us, exit_us),
            &alone().0,
            alone().1,
        );
        o.quotas()[0].remaining
    }

    fn local(l: &Leases, k: &CounterKey, limits: &[Limit], now_us: i64) -> u64 {
        match l.plan(k, &LimitSet::new(limits), 1, now_us) {
            Plan::Local(o) => o.quotas()[0].remaining,
            other => panic!("not decided here: {other:?}"),
        }
    }

    const EXIT: i64 = 60_000_000;

    /// A script call's answer for one window: what Redis said, the lease it took, when, and when
    /// its oldest count leaves. A refusal's room is taken to be unknown.
    fn reply(outcome: Outcome, granted: Option<Granted>, at_us: i64, exit_us: i64) -> Answer {
        let mut rooms = [None; MAX_LIMITS];
        let mut exits_us = [0; MAX_LIMITS];
        for (i, q) in outcome.quotas().iter().enumerate() {
            rooms[i] = q.allowed.then_some(q.remaining);
            exits_us[i] = exit_us;
        }
        Answer {
            outcome,
            rooms,
            exits_us,
            granted,
            at_us,
        }
    }

    #[test]
    fn a_busy_counter_takes_a_lease_spends_it_here_and_gives_back_the_rest() {
        let l = Leases::new(1000, StoreStats::default());
        let limits = [lim(100, 60)];
        let k = key();
        // Quiet: plain calls.
        for i in 0..3 {
            let (args, _) = ask(&l, &k, &limits, 10_000 + i);
            assert!(args.is_none());
            let told = settle(
                &l,
                &k,
                &limits,
                false,
                true,
                99 - i as u64,
                None,
                10_000,
                EXIT,
            );
            assert_eq!(told, 99 - i as u64);
        }
        // The fourth unit of the bucket makes it busy: a lease of 4 is asked for. Redis counts
        // it as used (remaining 92); this instance tells it as its room.
        let (args, _) = ask(&l, &k, &limits, 20_000);
        assert_eq!(args.unwrap().want, 4);
        let told = settle(
            &l,
            &k,
            &limits,
            true,
            true,
            92,
            Some(granted(4, 1_000_020, 990_000)),
            20_000,
            EXIT,
        );
        assert_eq!(told, 96);
        // Four units here, counting down.
        for want in (92..96).rev() {
            assert_eq!(local(&l, &k, &limits, 30_000), want);
        }
        // Spent: the next asks again, bigger (rate 9 in this bucket), nothing to give back.
        let (args, give_apart) = ask(&l, &k, &limits, 40_000);
        assert_eq!(
            args.unwrap(),
            LeaseArgs {
                want: 9,
                give: 0,
                given_at_ms: 0
            }
        );
        assert!(give_apart.is_none());
        let told = settle(
            &l,
            &k,
            &limits,
            true,
            true,
            82,
            Some(granted(9, 1_000_040, 990_000)),
            40_000,
            EXIT,
        );
        assert_eq!(told, 91);
        // The bucket ends with 9 unused: the next call gives them back and asks for the rate of
        // the bucket before (9 units).
        let (args, _) = ask(&l, &k, &limits, 1_000_000);
        assert_eq!(
            args.unwrap(),
            LeaseArgs {
                want: 9,
                give: 9,
                given_at_ms: 1_000_040
            }
        );
        // Given back and counted: 90 left, none of it leased (no room granted).
        let told = settle(&l, &k, &limits, true, true, 90, None, 1_000_000, EXIT);
        assert_eq!(told, 90);
    }

    #[test]
    fn what_is_told_rises_only_once_counts_can_have_left_the_window() {
        let l = Leases::new(1000, StoreStats::default());
        let (k, limits) = (key(), [lim(100, 60)]);
        ask(&l, &k, &limits, 0);
        assert_eq!(settle(&l, &k, &limits, false, true, 50, None, 0, EXIT), 50);
        // Another instance gave back a lease: Redis has room 60 now. Nothing has left the
        // window, so this instance goes on from what it told.
        ask(&l, &k, &limits, 1_000);
        assert_eq!(
            settle(&l, &k, &limits, false, true, 60, None, 1_000, EXIT),
            49
        );
        // Others admitted more: Redis' room is below what was told.
        ask(&l, &k, &limits, 2_000);
        assert_eq!(
            settle(&l, &k, &limits, false, true, 40, None, 2_000, EXIT),
            40
        );
        // A window holding nothing but this call's count is told as it is.
        ask(&l, &k, &limits, 3_600);
        assert_eq!(
            settle(&l, &k, &limits, false, true, 99, None, 3_600, EXIT),
            99
        );
        // Once the oldest count has left, Redis' room is told as it is.
        ask(&l, &k, &limits, EXIT);
        assert_eq!(
            settle(&l, &k, &limits, false, true, 70, None, EXIT, 2 * EXIT),
            70
        );
        // Other limits (a new catalog) start again.
        let other = [lim(80, 60)];
        ask(&l, &k, &other, EXIT + 1);
        assert_eq!(
            settle(&l, &k, &other, false, true, 79, None, EXIT + 1, 2 * EXIT),
            79
        );
    }

    #[test]
    fn after_a_refusal_nothing_told_rises_though_room_comes_back() {
        let l = Leases::new(1000, StoreStats::default());
        let (k, limits) = (key(), [lim(100, 60)]);
        ask(&l, &k, &limits, 0);
        assert_eq!(settle(&l, &k, &limits, false, true, 2, None, 0, EXIT), 2);
        // Refused from a refusal Redis remembered: told 0, and all that is known is that the
        // room is below the cost (others' leases counted as used).
        ask(&l, &k, &limits, 1_000);
        let refused = reply(answer(false, 0), None, 1_000, EXIT);
        let (o, _) = l.settle(
            &k,
            &LimitSet::new(&limits),
            1,
            false,
            refused,
            &alone().0,
            alone().1,
        );
        assert_eq!(o.quotas()[0].remaining, 0);
        // Another instance gave its lease back: Redis admits again, with room 30 after it. The
        // window's counts have not left: what is told stays at 0.
        ask(&l, &k, &limits, 2_000);
        assert_eq!(
            settle(&l, &k, &limits, false, true, 30, None, 2_000, EXIT),
            0
        );
    }

    #[test]
    fn a_shadow_window_refused_counts_nothing_in_what_is_told() {
        let l = Leases::new(1000, StoreStats::default());
        let k = key();
        let limits = [lim(10, 60), Limit::sliding(2, 60).shadowed(true)];
        let q = |remaining| Quota {
            allowed: true,
            limit: 10,
            remaining,
            reset: 60,
            retry_after: None,
        };
        let call = |shadow_limited: bool, enforced: u64, shadow: u64| {
            assert!(matches!(
                l.plan(&k, &LimitSet::new(&limits), 1, 0),
                Plan::Ask { .. }
            ));
            let o = Outcome::new(true, shadow_limited, &[q(enforced), q(shadow)]);
            let (o, _) = l.settle(
                &k,
                &LimitSet::new(&limits),
                1,
                false,
                reply(o, None, 0, EXIT),
                &alone().0,
                alone().1,
            );
            (o.quotas()[0].remaining, o.quotas()[1].remaining)
        };
        assert_eq!(call(false, 9, 1), (9, 1));
        assert_eq!(call(false, 8, 0), (8, 0));
        // The shadow window is full: counted in the enforced one only.
        assert_eq!(call(true, 7, 0), (7, 0));
    }

    #[test]
    fn near_its_limit_a_counter_stops_asking_until_the_next_bucket() {
        let l = Leases::new(1000, StoreStats::default());
        let (k, limits) = (key(), [lim(100, 60)]);
        for i in 0..3 {
            ask(&l, &k, &limits, 0);
            settle(&l, &k, &limits, false, true, 90 - i, None, 0, EXIT);
        }
        // Busy: asks, and Redis grants nothing (no room for a lease).
        let (args, _) = ask(&l, &k, &limits, 10);
        assert!(args.is_some());
        settle(&l, &k, &limits, true, true, 1, None, 10, EXIT);
        let (args, _) = ask(&l, &k, &limits, 20);
        assert!(args.is_none(), "plain calls for the rest of the bucket");
        settle(&l, &k, &limits, false, true, 0, None, 20, EXIT);
        let (args, _) = ask(&l, &k, &limits, 1_000_000);
        assert!(args.is_some(), "asks again in the next bucket");
    }

    #[test]
    fn a_check_changes_no_lease_and_is_told_by_the_same_rule() {
        let l = Leases::new(1000, StoreStats::default());
        let (k, limits) = (key(), [lim(100, 60)]);
        for i in 0..3 {
            ask(&l, &k, &limits, 0);
            settle(&l, &k, &limits, false, true, 99 - i, None, 0, EXIT);
        }
        // The fourth takes a lease of 5: Redis counts 1 + 5.
        ask(&l, &k, &limits, 0);
        let lease = Some(granted(5, 0, 900_000));
        assert_eq!(settle(&l, &k, &limits, true, true, 91, lease, 0, EXIT), 96);
        // A check spends nothing of the lease and is told what is left.
        let Plan::Local(o) = l.plan(&k, &LimitSet::new(&limits), 0, 10) else {
            panic!("decided here")
        };
        assert_eq!(o.quotas()[0].remaining, 96);
        // Once the lease has ended, a check gives it back first, in a turn alone: its units may
        // have left one window and not another, so no answer could count them as room.
        let Plan::Ask {
            args: Some(a),
            give_apart: None,
            turn,
            ..
        } = l.plan(&k, &LimitSet::new(&limits), 0, 1_000_000)
        else {
            panic!("a call in its turn that gives back")
        };
        assert!(turn.is_alone());
        assert_eq!((a.want, a.give, a.given_at_ms), (0, 5, 0));
        // Another check waits for that turn; then checks share turns again.
        assert!(matches!(
            l.plan(&k, &LimitSet::new(&limits), 0, 1_000_001),
            Plan::Wait { alone: false, .. }
        ));
        drop(turn);
        let Plan::Ask {
            args: None, turn, ..
        } = l.plan(&k, &LimitSet::new(&limits), 0, 1_000_002)
        else {
            panic!("a plain call")
        };
        assert!(!turn.is_alone());
    }

    #[test]
    fn calls_out_together_each_tell_their_own_answer() {
        let l = Leases::new(1000, StoreStats::default());
        let (k, limits) = (key(), [lim(100, 60)]);
        ask(&l, &k, &limits, 0);
        assert_eq!(settle(&l, &k, &limits, false, true, 90, None, 0, EXIT), 90);
        // Two plain calls share the counter's turn; Redis runs x then y, y's answer comes first.
        let mut out = Vec::new();
        for now in [10, 11] {
            let Plan::Ask { turn, seen, .. } = l.plan(&k, &LimitSet::new(&limits), 1, now) else {
                panic!("a call")
            };
            assert!(!turn.is_alone());
            out.push((turn, seen));
        }
        let (y, x) = (out.pop().unwrap(), out.pop().unwrap());
        let told = |(turn, seen): &(Turn, Seen), remaining| {
            let a = reply(answer(true, remaining), None, 20, EXIT);
            l.settle(&k, &LimitSet::new(&limits), 1, false, a, turn, *seen)
                .0
                .quotas()[0]
                .remaining
        };
        assert_eq!(told(&y, 88), 88);
        assert_eq!(told(&x, 89), 89, "each its own: one instance is exact");
    }

    #[test]
    fn a_new_catalog_gives_the_old_lease_back_apart_and_leases_are_capped() {
        let l = Leases::new(5, StoreStats::default());
        let k = key();
        let old = [lim(100, 60)];
        for i in 0..10 {
            ask(&l, &k, &old, 0);
            settle(&l, &k, &old, false, true, 99 - i, None, 0, EXIT);
        }
        let (args, _) = ask(&l, &k, &old, 1_000_000);
        assert_eq!(args.unwrap().want, 5, "capped");
        settle(
            &l,
            &k,
            &old,
            true,
            true,
            80,
            Some(granted(5, 1_000, 1_900_000)),
            1_000_000,
            EXIT,
        );
        let new = [lim(50, 60)];
        let (args, give_apart) = ask(&l, &k, &new, 1_000_002);
        assert_eq!(args.unwrap().give, 0);
        let g = give_apart.unwrap();
        assert_eq!((g.limits.as_slice(), g.units), (&old[..], 5));
    }

    #[test]
    fn a_timer_takes_only_its_own_lease() {
        let l = Leases::new(100, StoreStats::default());
        let k = key();
        let limits = [lim(100, 60)];
        for i in 0..5 {
            ask(&l, &k, &limits, 0);
            settle(&l, &k, &limits, false, true, 99 - i, None, 0, EXIT);
        }
        ask(&l, &k, &limits, 1_000_000);
        let (_, id) = l.settle(
            &k,
            &LimitSet::new(&limits),
            1,
            true,
            reply(
                answer(true, 80),
                Some(granted(6, 0, 900_000)),
                1_000_000,
                EXIT,
            ),
            &alone().0,
            alone().1,
        );
        let id = id.unwrap();
        assert!(l.expire(&k, id + 1).is_none());
        assert_eq!(l.expire(&k, id).unwrap().units, 6);
        assert!(l.expire(&k, id).is_none(), "once");
    }
}
