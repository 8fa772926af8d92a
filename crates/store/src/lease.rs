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
//! Time: with the caller's clock (`time_source = local`) a lease ends at its bucket's end by that
//! clock, exactly. With Redis' clock it ends at the local instant the call was sent plus the time
//! from Redis' `now` to the bucket's end: Redis read its clock after the call was sent, so the
//! lease always ends here before its bucket ends there.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use quotagate_engine::limiter::{
    Kind, Limit, MAX_LIMITS, Outcome, Quota, bucket_of, bucket_start, buckets,
};
use tokio::sync::watch;
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
/// the earliest end, over `limits`, of the bucket holding `at_ms`, in milliseconds.
pub fn bucket_end_ms(limits: &[Limit], at_ms: u64) -> u64 {
    limits
        .iter()
        .map(|l| bucket_start(l.w, bucket_of(l.w, at_ms) + 1))
        .min()
        .unwrap_or(at_ms)
}

/// The shortest bucket of `limits`, in microseconds: the period of a counter's rate. A fixed
/// window's lease is spent for at most a second: its rate is counted per second.
fn bucket_us(limits: &[Limit]) -> i64 {
    limits
        .iter()
        .map(|l| match l.kind {
            Kind::Sliding => i64::from(l.w) * 1_000_000 / buckets(l.w) as i64,
            Kind::Fixed | Kind::Aligned => 1_000_000,
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
        let len = limits.len().min(MAX_LIMITS);
        let mut set = LimitSet {
            limits: [Limit::per_minute(0); MAX_LIMITS],
            len,
        };
        set.limits[..len].copy_from_slice(&limits[..len]);
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
    /// Each limit's units left after the call that took it, counting the whole lease as used.
    remaining: [u64; MAX_LIMITS],
    /// When each limit's oldest count leaves its window (lease clock, microseconds).
    reset_at_us: [i64; MAX_LIMITS],
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
    /// Set while a call that asked for a lease is out: the counter's other requests wait for it
    /// rather than each calling Redis. Dropped when it returns, which wakes them.
    fetching: Option<watch::Sender<()>>,
}

/// A lease given up, to be given back to Redis with the limits it was counted in.
#[derive(Debug, Clone, Copy)]
pub struct GiveBack {
    pub limits: LimitSet,
    pub units: u64,
    pub at_ms: i64,
}

/// What a request on a counter does.
#[derive(Debug)]
pub enum Plan {
    /// Decided here, from the counter's lease.
    Local(Outcome),
    /// Another request is taking a lease: wait for it (then plan again).
    Wait(watch::Receiver<()>),
    /// Ask Redis: with `args` (a lease wanted, an old one given back) or plainly. `give_apart`: a
    /// lease counted with other limits (a new catalog), to give back in a call of its own first.
    Ask {
        args: Option<LeaseArgs>,
        give_apart: Option<GiveBack>,
        fetching: bool,
    },
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

    /// What a request of `cost` on `key` under `limits` does at `now_us` (lease clock).
    pub fn plan(&self, key: &CounterKey, limits: &[Limit], cost: u64, now_us: i64) -> Plan {
        let mut shard = self.shard(key);
        if !shard.contains_key(key) {
            if shard.len() >= MAX_COUNTERS / SHARDS {
                let period = bucket_us(limits);
                // Entries holding nothing and idle for two buckets tell nothing any more.
                shard.retain(|_, e| {
                    e.lease.is_some() || e.fetching.is_some() || now_us / period - e.epoch < 2
                });
                if shard.len() >= MAX_COUNTERS / SHARDS {
                    return Plan::Ask {
                        args: None,
                        give_apart: None,
                        fetching: false,
                    };
                }
            }
            shard.insert(key.clone(), Entry::default());
        }
        let Some(e) = shard.get_mut(key) else {
            // Inserted above: never taken.
            return Plan::Ask {
                args: None,
                give_apart: None,
                fetching: false,
            };
        };
        let epoch = now_us / bucket_us(limits);
        if epoch != e.epoch {
            e.prev_used = if epoch == e.epoch + 1 { e.used } else { 0 };
            e.used = 0;
            e.epoch = epoch;
        }
        if let Some(l) = e.lease.as_deref_mut()
            && l.limits.as_slice() == limits
            && now_us < l.until_us
            && l.left >= cost
        {
            l.left -= cost;
            e.used += cost;
            self.stats.decided_by_lease.inc();
            self.stats.units_used.inc_by(cost);
            return Plan::Local(local_outcome(l, now_us));
        }
        if let Some(f) = &e.fetching {
            return Plan::Wait(f.subscribe());
        }
        let rate = e.prev_used.max(e.used + cost);
        let want = if rate >= BUSY_UNITS && e.dry != Some(epoch) {
            rate.min(self.max_units)
        } else {
            0
        };
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
            if old.limits.as_slice() == limits {
                give = Some(g);
            } else {
                give_apart = Some(g);
            }
        }
        let fetching = want > 0;
        if fetching {
            e.fetching = Some(watch::Sender::new(()));
        }
        let args = (want > 0 || give.is_some()).then(|| LeaseArgs {
            want,
            give: give.map_or(0, |g| g.units),
            given_at_ms: give.map_or(0, |g| g.at_ms),
        });
        Plan::Ask {
            args,
            give_apart,
            fetching,
        }
    }

    /// Records a script's decision on `key` for a request of `cost` (`fetching`: the plan said
    /// so). `granted`: the lease it counted, `(units, at_ms, until_us, reset_at_us per limit)`,
    /// and the outcome's quotas (remaining counting the lease as used). Returns the new lease's
    /// id, for its timer.
    pub fn settle(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        fetching: bool,
        outcome: Option<&Outcome>,
        granted: Option<Granted>,
    ) -> Option<u64> {
        let mut shard = self.shard(key);
        let e = shard.get_mut(key)?;
        if fetching {
            e.fetching = None;
            if granted.is_none() && outcome.is_some() {
                e.dry = Some(e.epoch);
            }
        }
        if outcome.is_some_and(|o| o.allowed) {
            e.used += cost;
        }
        let g = granted?;
        let outcome = outcome?;
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut remaining = [0; MAX_LIMITS];
        for (r, q) in remaining.iter_mut().zip(outcome.quotas()) {
            *r = q.remaining;
        }
        self.stats.leases.inc();
        self.stats.units_leased.inc_by(g.units);
        // A lease of this counter still here was taken meanwhile by a call that did not wait
        // (none does while one is fetching): keep the later one, give none back twice.
        e.lease = Some(Box::new(Lease {
            limits: LimitSet::new(limits),
            left: g.units,
            at_ms: g.at_ms,
            until_us: g.until_us,
            remaining,
            reset_at_us: g.reset_at_us,
            id,
        }));
        Some(id)
    }

    /// The call that was to take a lease failed: let the others call Redis themselves.
    pub fn abandon(&self, key: &CounterKey) {
        if let Some(e) = self.shard(key).get_mut(key) {
            e.fetching = None;
        }
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
    pub reset_at_us: [i64; MAX_LIMITS],
}

/// The answer for a request admitted from lease `l` at `now_us` (its units already taken): what
/// Redis said when the lease was taken, plus the units still leased here (this instance's own
/// room; other instances' leases count as used).
fn local_outcome(l: &Lease, now_us: i64) -> Outcome {
    let mut quotas = [Quota::zero_limit(); MAX_LIMITS];
    let limits = l.limits.as_slice();
    for (i, (q, lim)) in quotas.iter_mut().zip(limits).enumerate() {
        let reset_us = u64::try_from(l.reset_at_us[i] - now_us).unwrap_or(0);
        *q = Quota {
            allowed: true,
            limit: lim.rl,
            remaining: l.remaining[i] + l.left,
            reset: reset_us.div_ceil(1_000_000),
            retry_after: None,
        };
    }
    Outcome::new(true, false, &quotas[..limits.len()])
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

    fn ask(p: Plan) -> (Option<LeaseArgs>, Option<GiveBack>, bool) {
        match p {
            Plan::Ask {
                args,
                give_apart,
                fetching,
            } => (args, give_apart, fetching),
            other => panic!("not a call: {other:?}"),
        }
    }

    fn granted(units: u64, at_ms: i64, until_us: i64) -> Granted {
        Granted {
            units,
            at_ms,
            until_us,
            reset_at_us: [until_us + 59_000_000; MAX_LIMITS],
        }
    }

    fn allowed(remaining: u64) -> Outcome {
        Outcome::new(
            true,
            false,
            &[Quota {
                allowed: true,
                limit: 100,
                remaining,
                reset: 60,
                retry_after: None,
            }],
        )
    }

    /// One request decided by Redis without a lease granted.
    fn plain(l: &Leases, k: &CounterKey, limits: &[Limit], now_us: i64) {
        let (_, _, fetching) = ask(l.plan(k, limits, 1, now_us));
        l.settle(k, limits, 1, fetching, Some(&allowed(90)), None);
    }

    #[test]
    fn a_busy_counter_takes_a_lease_spends_it_here_and_gives_back_the_rest() {
        let l = Leases::new(1000, StoreStats::default());
        let limits = [lim(100, 60)];
        let k = key();
        // Quiet: plain calls.
        for i in 0..3 {
            let (args, _, fetching) = ask(l.plan(&k, &limits, 1, 10_000 + i));
            assert!(args.is_none() && !fetching);
            l.settle(&k, &limits, 1, fetching, Some(&allowed(90)), None);
        }
        // The fourth unit of the bucket makes it busy: a lease of 4 is asked for.
        let (args, _, fetching) = ask(l.plan(&k, &limits, 1, 20_000));
        assert_eq!(args.unwrap().want, 4);
        assert!(fetching);
        // Others wait for it meanwhile.
        assert!(matches!(l.plan(&k, &limits, 1, 20_001), Plan::Wait(_)));
        l.settle(
            &k,
            &limits,
            1,
            true,
            Some(&allowed(80)),
            Some(granted(4, 1_000_020, 990_000)),
        );
        // Four units here, remaining counting down from Redis' 80 plus what is left here.
        for left in (0..4).rev() {
            let Plan::Local(o) = l.plan(&k, &limits, 1, 30_000) else {
                panic!("not local")
            };
            assert_eq!(o.quotas()[0].remaining, 80 + left);
        }
        // Spent: the next asks again, bigger (rate 9 in this bucket), nothing to give back.
        let (args, give_apart, _) = ask(l.plan(&k, &limits, 1, 40_000));
        assert_eq!(
            args.unwrap(),
            LeaseArgs {
                want: 9,
                give: 0,
                given_at_ms: 0
            }
        );
        assert!(give_apart.is_none());
        l.settle(
            &k,
            &limits,
            1,
            true,
            Some(&allowed(60)),
            Some(granted(9, 1_000_040, 990_000)),
        );
        // The bucket ends with 9 unused: the next call gives them back and asks for the rate of
        // the bucket before (9 units).
        let (args, _, _) = ask(l.plan(&k, &limits, 1, 1_000_000));
        assert_eq!(
            args.unwrap(),
            LeaseArgs {
                want: 9,
                give: 9,
                given_at_ms: 1_000_040
            }
        );
    }

    #[test]
    fn near_its_limit_a_counter_stops_asking_until_the_next_bucket() {
        let l = Leases::new(1000, StoreStats::default());
        let (k, limits) = (key(), [lim(100, 60)]);
        for _ in 0..3 {
            plain(&l, &k, &limits, 0);
        }
        // Busy: asks, and Redis grants nothing (no room for a lease).
        let (args, _, fetching) = ask(l.plan(&k, &limits, 1, 10));
        assert!(args.is_some() && fetching);
        l.settle(&k, &limits, 1, true, Some(&allowed(1)), None);
        let (args, _, fetching) = ask(l.plan(&k, &limits, 1, 20));
        assert!(
            args.is_none() && !fetching,
            "plain calls for the rest of the bucket"
        );
        l.settle(&k, &limits, 1, false, Some(&allowed(0)), None);
        let (args, _, _) = ask(l.plan(&k, &limits, 1, 1_000_000));
        assert!(args.is_some(), "asks again in the next bucket");
    }

    #[test]
    fn a_new_catalog_gives_the_old_lease_back_apart_and_leases_are_capped() {
        let l = Leases::new(5, StoreStats::default());
        let k = key();
        let old = [lim(100, 60)];
        for _ in 0..10 {
            plain(&l, &k, &old, 0);
        }
        let (args, _, _) = ask(l.plan(&k, &old, 1, 1_000_000));
        assert_eq!(args.unwrap().want, 5, "capped");
        l.settle(
            &k,
            &old,
            1,
            true,
            Some(&allowed(80)),
            Some(granted(5, 1_000, 1_900_000)),
        );
        let new = [lim(50, 60)];
        let (args, give_apart, _) = ask(l.plan(&k, &new, 1, 1_000_002));
        assert_eq!(args.unwrap().give, 0);
        let g = give_apart.unwrap();
        assert_eq!((g.limits.as_slice(), g.units), (&old[..], 5));
    }

    #[test]
    fn a_timer_takes_only_its_own_lease() {
        let l = Leases::new(100, StoreStats::default());
        let k = key();
        let limits = [lim(100, 60)];
        for _ in 0..5 {
            plain(&l, &k, &limits, 0);
        }
        ask(l.plan(&k, &limits, 1, 1_000_000));
        let id = l
            .settle(
                &k,
                &limits,
                1,
                true,
                Some(&allowed(80)),
                Some(granted(6, 0, 900_000)),
            )
            .unwrap();
        assert!(l.expire(&k, id + 1).is_none());
        assert_eq!(l.expire(&k, id).unwrap().units, 6);
        assert!(l.expire(&k, id).is_none(), "once");
    }
}
