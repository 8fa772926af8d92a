//! memory: the embedded store. One process, no setup, bounded.
//!
//! Counters live in sharded maps of [`WindowSet`]s. A shard sweeps out idle counters (nothing left in
//! any of their windows) whenever it has doubled since its last sweep, so memory follows the number of counters
//! used in the last minute, never the number ever seen, at amortised O(1) per request.
//!
//! With a directory (`store.path`, [`MemoryStore::open`]) the same counters are also kept on
//! disk ([`crate::disk`]): each counter's units are covered by durable records ([`Cover`]),
//! and an answer whose units are not yet covered waits for the commit that covers them
//! ([`Ticket`]).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::disk::cover::{self, Cover, Spend};
use crate::disk::record::{self, Record};
use crate::disk::{Disk, DiskError, Source};
use quotagate_engine::clock::Clock;

use super::keys::{self, CounterKey};
use super::{CounterStore, Part, StoreError};
use quotagate_engine::limiter::FixedWindow;
use quotagate_engine::limiter::{
    Limit, Outcome, Shape, Span, WindowSet, fixed_outcome, hit_parts, peek_parts,
};

const SHARDS: usize = 32;
/// A shard is never swept below this many entries: sweeping tiny maps costs more than it saves.
const MIN_SWEEP_AT: usize = 1024;

#[derive(Debug)]
struct Shard {
    /// foldhash rather than SipHash: this runs on every counted request, and only catalog keys
    /// get a window, so clients cannot choose colliding keys. (Divvy's fixed windows, whose keys
    /// clients do choose, keep SipHash.)
    windows: HashMap<CounterKey, WindowSet, foldhash::fast::RandomState>,
    /// With a directory: each counter's units on disk (kept apart, so that the store without
    /// one carries nothing of it).
    covers: HashMap<CounterKey, Cover, foldhash::fast::RandomState>,
    sweep_at: usize,
}

/// What an answer waits for before it is given ([`MemoryStore::durable`]): nothing, or the
/// commit that makes its units durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
#[must_use]
pub struct Ticket(u64);

impl Ticket {
    /// Nothing to wait for.
    pub const NONE: Ticket = Ticket(0);
    /// The directory cannot be written: the units are not durable (the failure policy applies).
    pub const FAILED: Ticket = Ticket(u64::MAX);

    pub fn is_none(self) -> bool {
        self == Ticket::NONE
    }
}

/// `units` more spent at `now_ms` under `cover`, reserving `block` at a time: the ticket its
/// answer waits for, and a record (`encode` of its claim) appended when the cover needs one.
fn spend(
    disk: &Disk,
    cover: &mut Cover,
    units: u64,
    block: u64,
    now_ms: u64,
    encode: impl FnOnce(&mut Vec<u8>, &record::Claim),
) -> Ticket {
    match cover.spend(units, now_ms, block, disk.durable()) {
        Spend::Covered => Ticket::NONE,
        Spend::WaitFor(seq) => {
            // A renewal written ahead, not yet committed, is now waited for.
            disk.hurry();
            Ticket(seq)
        }
        Spend::Write { claim, wait } => {
            let seq = disk.append_with(wait, |buf| encode(buf, &claim));
            cover.wrote(seq, &claim, wait);
            if wait { Ticket(seq) } else { Ticket::NONE }
        }
    }
}

/// The reservation block of a counter whose limits are `limits` ([`cover::block`]).
fn block_of(limits: &[Limit]) -> u64 {
    limits
        .iter()
        .filter(|l| !l.is_concurrent())
        .map(|l| {
            let seconds = l.period().is_none().then_some(u64::from(l.w));
            cover::block(l.rl, seconds)
        })
        .min()
        .unwrap_or(1)
}

/// Sliding windows in memory, sharded by key.
#[derive(Debug)]
pub struct SlidingWindows {
    /// `std::sync::Mutex`: the critical section is a hash lookup and 60 additions, never held across
    /// an `.await`; sharding keeps unrelated keys from contending.
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    disk: Option<Arc<Disk>>,
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
                        covers: HashMap::default(),
                        sweep_at: MIN_SWEEP_AT,
                    })
                })
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            disk: None,
        }
    }

    /// The index of `key`'s shard: by its hash tag, so that every counter of one API key (a
    /// request's endpoint and its pools) is under one lock.
    fn shard_of(&self, key: &CounterKey) -> usize {
        (self.hasher.hash_one(key.tag()) as usize) % SHARDS
    }

    /// The shard of `key` ([`SlidingWindows::shard_of`]), locked.
    fn shard(&self, key: &CounterKey) -> std::sync::MutexGuard<'_, Shard> {
        let i = self.shard_of(key);
        // A panic while holding the lock cannot leave a window half-updated in a way that matters
        // more than refusing service would, so a poisoned lock is used as is.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`WindowSet::hit`] on `key`'s counter: checks one request of `cost` at `now_ms` against
    /// `limits` and counts it where it belongs, under one lock; with a directory, the commit
    /// its answer waits for.
    pub fn hit(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> (Outcome, Ticket) {
        let mut guard = self.shard(key);
        let shard = &mut *guard;
        if let Some(c) = shard.windows.get_mut(key) {
            let outcome = c.hit(limits, cost, now_ms);
            let ticket = match &self.disk {
                Some(disk) if outcome.allowed && cost > 0 => {
                    Self::spend(disk, &mut shard.covers, key, c, limits, cost, now_ms)
                }
                _ => Ticket::NONE,
            };
            return (outcome, ticket);
        }
        shard.sweep(now_ms);
        let mut counter = WindowSet::default();
        let outcome = counter.hit(limits, cost, now_ms);
        let ticket = match &self.disk {
            Some(disk) if outcome.allowed && cost > 0 => {
                Self::spend(disk, &mut shard.covers, key, &counter, limits, cost, now_ms)
            }
            _ => Ticket::NONE,
        };
        // A request that counted nothing leaves nothing behind.
        if !counter.is_idle(now_ms) {
            shard.windows.insert(key.clone(), counter);
        }
        (outcome, ticket)
    }

    /// [`spend`] for a sliding counter.
    fn spend(
        disk: &Disk,
        covers: &mut HashMap<CounterKey, Cover, foldhash::fast::RandomState>,
        key: &CounterKey,
        set: &WindowSet,
        limits: &[Limit],
        units: u64,
        now_ms: u64,
    ) -> Ticket {
        if limits.iter().all(Limit::is_concurrent) {
            // Slots are not kept on disk: no request is in flight after a restart.
            return Ticket::NONE;
        }
        if disk.is_failed() {
            return Ticket::FAILED;
        }
        let cover = match covers.get_mut(key) {
            Some(c) => c,
            None => covers.entry(key.clone()).or_default(),
        };
        spend(
            disk,
            cover,
            units,
            block_of(limits),
            now_ms,
            |buf, claim| record::encode_grant(buf, key.as_str(), claim, set),
        )
    }

    /// [`hit_parts`] on the parts' counters, under one lock (they share a hash tag: the caller
    /// checks). A counter that holds nothing afterwards is not kept.
    pub fn hit_parts(&self, parts: &[Part<'_>], cost: u64, now_ms: u64) -> (Outcome, Ticket) {
        let mut guard = self.shard(parts[0].counter);
        let shard = &mut *guard;
        // Taken out of the map while deciding (the parts need their windows at once), and put
        // back with the same key.
        let mut sets: Vec<(CounterKey, WindowSet)> = parts
            .iter()
            .map(|p| {
                shard
                    .windows
                    .remove_entry(p.counter)
                    .unwrap_or_else(|| (p.counter.clone(), WindowSet::default()))
            })
            .collect();
        let outcome = {
            let mut decided: Vec<(&mut WindowSet, &[Limit])> = sets
                .iter_mut()
                .zip(parts)
                .map(|((_, set), p)| (set, p.limits))
                .collect();
            hit_parts(&mut decided, cost, now_ms)
        };
        let mut ticket = Ticket::NONE;
        if let Some(disk) = &self.disk
            && outcome.allowed
            && cost > 0
        {
            for ((key, set), p) in sets.iter().zip(parts) {
                let t = Self::spend(disk, &mut shard.covers, key, set, p.limits, cost, now_ms);
                ticket = ticket.max(t);
            }
        }
        shard.sweep(now_ms);
        for (key, set) in sets {
            if !set.is_idle(now_ms) {
                shard.windows.insert(key, set);
            }
        }
        (outcome, ticket)
    }

    /// [`CounterStore::adjust`] on the parts' counters, under one lock. `now_ms` is used by an
    /// addition only (a give-back goes to the bucket of `reserved_at_ms`).
    ///
    /// With a directory, units added are written by the next commit and not waited for: the
    /// answer they were reported by is already given.
    pub fn adjust(&self, parts: &[Part<'_>], delta: i64, reserved_at_ms: u64, now_ms: u64) {
        let mut guard = self.shard(parts[0].counter);
        let shard = &mut *guard;
        for p in parts {
            if delta > 0 {
                if !shard.windows.contains_key(p.counter) {
                    shard.sweep(now_ms);
                    shard
                        .windows
                        .insert(p.counter.clone(), WindowSet::default());
                }
                if let Some(set) = shard.windows.get_mut(p.counter) {
                    set.add(p.limits, delta.unsigned_abs(), now_ms);
                    if let Some(disk) = &self.disk {
                        let units = delta.unsigned_abs();
                        let covers = &mut shard.covers;
                        let _ = Self::spend(disk, covers, p.counter, set, p.limits, units, now_ms);
                    }
                }
            } else if let Some(set) = shard.windows.get_mut(p.counter) {
                set.give_back(p.limits, delta.unsigned_abs(), reserved_at_ms);
            }
        }
    }

    /// [`CounterStore::free`] on the parts' counters, under one lock.
    pub fn free(&self, parts: &[Part<'_>]) {
        let mut shard = self.shard(parts[0].counter);
        for p in parts {
            if p.limits.iter().any(Limit::is_concurrent)
                && let Some(set) = shard.windows.get_mut(p.counter)
            {
                set.free(1);
            }
        }
    }

    /// Copies of the parts' counters (empty ones where there are none).
    pub fn windows(&self, parts: &[Part<'_>]) -> Vec<WindowSet> {
        let shard = self.shard(parts[0].counter);
        parts
            .iter()
            .map(|p| shard.windows.get(p.counter).cloned().unwrap_or_default())
            .collect()
    }

    /// [`peek_parts`] on the parts' counters (empty ones where there are none).
    pub fn peek_parts(&self, parts: &[Part<'_>], cost: u64, now_ms: u64) -> Outcome {
        let shard = self.shard(parts[0].counter);
        let empty = WindowSet::default();
        let sets: Vec<(&WindowSet, &[Limit])> = parts
            .iter()
            .map(|p| (shard.windows.get(p.counter).unwrap_or(&empty), p.limits))
            .collect();
        peek_parts(&sets, cost, now_ms)
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
        if let Some(disk) = &self.disk {
            // Not waited for: a crash before it is written keeps the counts (never fewer).
            let _ = disk.append(&Record::Forget {
                prefix: prefix.to_owned(),
            });
        }
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            let before = shard.windows.len();
            shard.windows.retain(|k, _| !k.as_str().starts_with(prefix));
            shard.covers.retain(|k, _| !k.as_str().starts_with(prefix));
            gone += (before - shard.windows.len()) as u64;
        }
        gone
    }

    /// Every counter as a snapshot entry ([`Source::each`]).
    fn each(&self, now_ms: u64, clean: bool, f: &mut dyn FnMut(&[u8])) -> u64 {
        let mut n = 0;
        let mut out = Vec::new();
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            for (key, set) in &shard.windows {
                let (outstanding, until_ms) = match (clean, shard.covers.get(key)) {
                    (false, Some(c)) => c.outstanding(now_ms),
                    _ => (0, 0),
                };
                out.clear();
                record::encode_counter(&mut out, key.as_str(), set, outstanding, until_ms);
                f(&out);
                n += 1;
            }
        }
        n
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

impl Shard {
    /// Sweeps out idle counters once the shard has doubled since its last sweep (before a new
    /// counter goes in).
    fn sweep(&mut self, now_ms: u64) {
        if self.windows.len() >= self.sweep_at {
            self.windows.retain(|_, c| !c.is_idle(now_ms));
            if !self.covers.is_empty() {
                let windows = &self.windows;
                self.covers.retain(|k, _| windows.contains_key(k));
            }
            self.sweep_at = (self.windows.len() * 2).max(MIN_SWEEP_AT);
        }
    }
}

#[derive(Debug)]
struct FixedShard {
    windows: HashMap<String, FixedWindow>,
    /// With a directory: each window's units on disk, and the end of the window they are for.
    covers: HashMap<String, (u64, Cover)>,
    sweep_at: usize,
    /// When the shard was last swept because it was full: at most once a second.
    swept_full: u64,
}

/// Fixed windows ([`Kind::Fixed`], [`Kind::Aligned`]: the Divvy port's and the rate-limit
/// service's), in memory, named as in Redis ([`keys::fixed_window`]).
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
    disk: Option<Arc<Disk>>,
}

impl FixedWindows {
    /// At most `max` live windows.
    pub fn new(max: usize) -> Self {
        FixedWindows {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(FixedShard {
                        windows: HashMap::new(),
                        covers: HashMap::new(),
                        sweep_at: MIN_SWEEP_AT,
                        swept_full: 0,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
            max_per_shard: (max / SHARDS).max(1),
            full_logged: std::sync::atomic::AtomicBool::new(false),
            disk: None,
        }
    }

    /// One hit of `cost` units at `now_ms` on `counter`'s fixed window of `l`
    /// ([`FixedWindow::hit`]); a hit without room takes none.
    pub fn hit(
        &self,
        counter: &CounterKey,
        l: &Limit,
        cost: u64,
        now_ms: u64,
    ) -> (Outcome, Ticket) {
        let span = Span::of(l, now_ms);
        let name = keys::fixed_window(counter, l, &span);
        let (allowed, credit, ttl, ticket) =
            self.hit_named(&name, l.rl, span.seconds, cost, now_ms);
        let outcome = fixed_outcome(
            l,
            cost,
            allowed,
            credit,
            i64::try_from(ttl).unwrap_or(i64::MAX),
        );
        (outcome, ticket)
    }

    /// Every window as a snapshot entry ([`Source::each`]).
    fn each(&self, now_ms: u64, clean: bool, f: &mut dyn FnMut(&[u8])) -> u64 {
        let mut n = 0;
        let mut out = Vec::new();
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            // Expired windows too (swept as they are in memory): the clock that says which
            // are is the requests', which may not be `now_ms`'s.
            for (name, w) in &shard.windows {
                let outstanding = match (clean, shard.covers.get(name)) {
                    (false, Some((expires, c))) if *expires == w.expires => c.outstanding(now_ms).0,
                    _ => 0,
                };
                out.clear();
                record::encode_fixed(
                    &mut out,
                    name,
                    w.credit.saturating_sub(outstanding),
                    w.expires,
                );
                f(&out);
                n += 1;
            }
        }
        n
    }

    /// One hit on the window `key` ([`FixedWindow::hit`]): allowed, credit, seconds left, and
    /// with a directory the commit its answer waits for.
    fn hit_named(
        &self,
        key: &str,
        limit: u64,
        seconds: u64,
        cost: u64,
        now_ms: u64,
    ) -> (bool, u64, u64, Ticket) {
        let now = now_ms / 1000;
        let i = (self.hasher.hash_one(key) as usize) % SHARDS;
        let mut guard = self.shards[i].lock().unwrap_or_else(|e| e.into_inner());
        let shard = &mut *guard;
        let map = &mut shard.windows;
        if let Some(w) = map.get_mut(key) {
            let mut slot = Some(*w);
            let (allowed, credit, ttl) = FixedWindow::hit(&mut slot, limit, seconds, cost, now);
            // A hit only updates a window or starts a new one, never removes it.
            *w = slot.unwrap_or(*w);
            let expires = w.expires;
            let ticket = match &self.disk {
                Some(disk) if allowed && cost > 0 => Self::spend(
                    disk,
                    &mut shard.covers,
                    key,
                    (limit, seconds),
                    expires,
                    cost,
                    now_ms,
                ),
                _ => Ticket::NONE,
            };
            return (allowed, credit, ttl, ticket);
        }
        let mut fresh = None;
        let (allowed, credit, ttl) = FixedWindow::hit(&mut fresh, limit, seconds, cost, now);
        let Some(fresh) = fresh else {
            return (allowed, credit, ttl, Ticket::NONE);
        };
        let full = map.len() >= self.max_per_shard && now > shard.swept_full;
        if map.len() >= shard.sweep_at || full {
            map.retain(|_, w| now < w.expires);
            if !shard.covers.is_empty() {
                shard.covers.retain(|k, _| map.contains_key(k));
            }
            shard.sweep_at = (map.len() * 2).max(MIN_SWEEP_AT);
            if full {
                shard.swept_full = now;
            }
        }
        if map.len() >= self.max_per_shard {
            if !self
                .full_logged
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::warn!(
                    "divvy memory store is full: new counters are denied until windows expire"
                );
            }
            return (false, 0, seconds, Ticket::NONE);
        }
        map.insert(key.to_owned(), fresh);
        let ticket = match &self.disk {
            Some(disk) if allowed && cost > 0 => Self::spend(
                disk,
                &mut shard.covers,
                key,
                (limit, seconds),
                fresh.expires,
                cost,
                now_ms,
            ),
            _ => Ticket::NONE,
        };
        (allowed, credit, ttl, ticket)
    }

    /// [`spend`] for the window `name` of `limit` units a `seconds` ending at `expires`.
    fn spend(
        disk: &Disk,
        covers: &mut HashMap<String, (u64, Cover)>,
        name: &str,
        (limit, seconds): (u64, u64),
        expires: u64,
        units: u64,
        now_ms: u64,
    ) -> Ticket {
        if disk.is_failed() {
            return Ticket::FAILED;
        }
        let entry = match covers.get_mut(name) {
            Some(e) => e,
            None => covers.entry(name.to_owned()).or_default(),
        };
        if entry.0 != expires {
            // A new window: nothing reserved for it yet.
            *entry = (expires, Cover::default());
        }
        spend(
            disk,
            &mut entry.1,
            units,
            cover::block(limit, Some(seconds)),
            now_ms,
            |buf, claim| record::encode_fixed_grant(buf, name, limit, expires, claim),
        )
    }
}

/// Live Divvy windows kept in memory at most (memory store, and the `local` fallback). Default:
/// 1,000,000.
pub const MAX_FIXED_WINDOWS: usize = 1_000_000;

/// The in-memory store: sliding windows for the gateway, fixed windows for the Divvy port. Also
/// the `local` fallback while a shared store is down.
#[derive(Debug)]
pub struct MemoryStore {
    windows: Arc<SlidingWindows>,
    fixed: Arc<FixedWindows>,
    /// With a directory: it, and what its writer snapshots from (held here; the writer holds
    /// it weakly).
    disk: Option<(Arc<Disk>, Arc<Counters>)>,
}

/// Both maps, as the directory's writer reads them for a snapshot.
#[derive(Debug)]
struct Counters {
    windows: Arc<SlidingWindows>,
    fixed: Arc<FixedWindows>,
}

impl Source for Counters {
    fn each(&self, now_ms: u64, clean: bool, f: &mut dyn FnMut(&[u8])) -> (u64, u64) {
        (
            self.windows.each(now_ms, clean, f),
            self.fixed.each(now_ms, clean, f),
        )
    }
}

/// The maps of a store being opened, as the directory's counters are read into them (owned:
/// no lock is taken).
struct Restoring<'a> {
    windows: &'a mut SlidingWindows,
    fixed: &'a mut FixedWindows,
}

impl crate::disk::Restore for Restoring<'_> {
    fn reserve(&mut self, sliding: usize, fixed: usize) {
        for s in self.windows.shards.iter_mut() {
            let s = s.get_mut().unwrap_or_else(|e| e.into_inner());
            s.windows.reserve(sliding / SHARDS + sliding / SHARDS / 8);
        }
        for s in self.fixed.shards.iter_mut() {
            let s = s.get_mut().unwrap_or_else(|e| e.into_inner());
            s.windows.reserve(fixed / SHARDS + fixed / SHARDS / 8);
        }
    }

    fn put_counter(&mut self, key: String, set: WindowSet) {
        let key = CounterKey::from_stored(key);
        let i = self.windows.shard_of(&key);
        let shard = self.windows.shards[i]
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        shard.windows.insert(key, set);
    }

    fn counter(&mut self, key: &str) -> &mut WindowSet {
        let key = CounterKey::from_stored(key.to_owned());
        let i = self.windows.shard_of(&key);
        let shard = self.windows.shards[i]
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        shard.windows.entry(key).or_default()
    }

    fn forget(&mut self, prefix: &str) {
        for s in self.windows.shards.iter_mut() {
            let s = s.get_mut().unwrap_or_else(|e| e.into_inner());
            s.windows.retain(|k, _| !k.as_str().starts_with(prefix));
        }
    }

    fn put_fixed(&mut self, name: String, w: FixedWindow) {
        let i = (self.fixed.hasher.hash_one(name.as_str()) as usize) % SHARDS;
        let shard = self.fixed.shards[i]
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        shard.windows.insert(name, w);
    }

    fn fixed(&mut self, name: &str) -> Option<&mut FixedWindow> {
        let i = (self.fixed.hasher.hash_one(name) as usize) % SHARDS;
        let shard = self.fixed.shards[i]
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        shard.windows.get_mut(name)
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore {
            windows: Arc::new(SlidingWindows::new()),
            fixed: Arc::new(FixedWindows::new(MAX_FIXED_WINDOWS)),
            disk: None,
        }
    }

    /// The embedded store keeping its counters in `dir` too ([`crate::disk`]): resumes what the
    /// directory holds, and refuses one it cannot show holds every committed count. `clock`:
    /// the application's (the time a crash's reservations are charged at, and snapshots'
    /// "now").
    pub fn open(dir: &Path, clock: Arc<dyn Clock>) -> Result<MemoryStore, DiskError> {
        Self::open_with(dir, clock, crate::disk::COMMIT_EVERY)
    }

    /// [`MemoryStore::open`] committing at most once per `commit_every` (tests that wait on
    /// every commit: [`crate::disk::COMMIT_EVERY`] otherwise).
    pub fn open_with(
        dir: &Path,
        clock: Arc<dyn Clock>,
        commit_every: std::time::Duration,
    ) -> Result<MemoryStore, DiskError> {
        let mut windows = SlidingWindows::new();
        let mut fixed = FixedWindows::new(MAX_FIXED_WINDOWS);
        let mut into = Restoring {
            windows: &mut windows,
            fixed: &mut fixed,
        };
        let (disk, recovered) = Disk::open(dir, clock, commit_every, &mut into)?;
        tracing::debug!(
            counters = recovered.counters,
            clean = recovered.clean,
            "store.path read"
        );
        let disk = Arc::new(disk);
        windows.disk = Some(disk.clone());
        fixed.disk = Some(disk.clone());
        let (windows, fixed) = (Arc::new(windows), Arc::new(fixed));
        let counters = Arc::new(Counters {
            windows: windows.clone(),
            fixed: fixed.clone(),
        });
        let source: Arc<dyn Source> = counters.clone();
        disk.start(Arc::downgrade(&source));
        Ok(MemoryStore {
            windows,
            fixed,
            disk: Some((disk, counters)),
        })
    }

    /// Writes every counter exactly and releases the directory (nothing without one). Call it
    /// after the last request: later answers are not durable.
    pub fn close(&self) {
        if let Some((disk, _)) = &self.disk {
            disk.close();
        }
    }

    /// The directory, if the counters are kept in one.
    pub fn disk(&self) -> Option<&Disk> {
        self.disk.as_ref().map(|(d, _)| &**d)
    }

    /// The directory cannot be written (answers are not durable: the failure policy applies).
    pub fn is_failed(&self) -> bool {
        self.disk().is_some_and(Disk::is_failed)
    }

    /// Waits until what `ticket` names is durable; an error when the directory cannot be
    /// written.
    pub async fn durable(&self, ticket: Ticket) -> Result<(), StoreError> {
        if ticket.is_none() {
            return Ok(());
        }
        match self.disk() {
            Some(disk) if ticket != Ticket::FAILED && disk.wait(ticket.0).await => Ok(()),
            Some(_) => Err(StoreError::disk()),
            None => Ok(()),
        }
    }

    /// [`CounterStore::hit`] without a future (the failover's local fallback and the store's
    /// own): sliding windows in [`SlidingWindows`], a fixed one in [`FixedWindows`]; the answer
    /// is given once its ticket is durable ([`MemoryStore::durable`]).
    pub fn hit_now(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Result<(Outcome, Ticket), StoreError> {
        match Shape::of(limits) {
            Shape::Sliding => Ok(self.windows.hit(key, limits, cost, now_ms)),
            Shape::Fixed(l) => Ok(self.fixed.hit(key, l, cost, now_ms)),
            Shape::Mixed => Err(StoreError::mixed_kinds()),
        }
    }
}

/// Parts one store call can decide: at least one, every limit a sliding window or a calendar
/// period, every counter with the first one's hash tag.
pub(crate) fn check_parts(parts: &[Part<'_>]) -> Result<(), StoreError> {
    let fine = match parts {
        [] => false,
        // One counter has its own tag (finding it scans the key: a third of a give-back).
        [p] => Shape::of(p.limits) == Shape::Sliding,
        [first, ..] => {
            let tag = first.counter.tag();
            parts
                .iter()
                .all(|p| p.counter.tag() == tag && Shape::of(p.limits) == Shape::Sliding)
        }
    };
    if fine {
        Ok(())
    } else {
        Err(StoreError::parts_apart())
    }
}

impl MemoryStore {
    /// [`CounterStore::hit_parts`] without a future (the failover's local fallback too).
    pub fn hit_parts_now(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> Result<(Outcome, Ticket), StoreError> {
        if let [p] = parts {
            return self.hit_now(p.counter, p.limits, cost, now_ms);
        }
        check_parts(parts)?;
        Ok(self.windows.hit_parts(parts, cost, now_ms))
    }
}

impl MemoryStore {
    /// [`CounterStore::adjust`] without a future (the failover's local fallback too).
    pub fn adjust_now(
        &self,
        parts: &[Part<'_>],
        delta: i64,
        reserved_at_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        check_parts(parts)?;
        if delta != 0 {
            self.windows.adjust(parts, delta, reserved_at_ms, now_ms);
        }
        Ok(())
    }
}

impl MemoryStore {
    /// [`CounterStore::free`] without a future (the failover's local fallback too).
    pub fn free_now(&self, parts: &[Part<'_>]) -> Result<(), StoreError> {
        check_parts(parts)?;
        self.windows.free(parts);
        Ok(())
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
        let (outcome, ticket) = self.hit_now(key, limits, cost, now_ms)?;
        self.durable(ticket).await?;
        Ok(outcome)
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
        match Shape::of(limits) {
            Shape::Sliding => Ok(self.windows.peek(key, limits, cost, now_ms)),
            _ => Err(StoreError::peek_fixed()),
        }
    }

    async fn reset(&self, api_key: &[u8]) -> Result<u64, StoreError> {
        Ok(self.windows.forget(&CounterKey::api_key_prefix(api_key)))
    }

    async fn hit_parts(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        let (outcome, ticket) = self.hit_parts_now(parts, cost, now_ms)?;
        self.durable(ticket).await?;
        Ok(outcome)
    }

    async fn peek_parts(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        check_parts(parts)?;
        Ok(self.windows.peek_parts(parts, cost, now_ms))
    }

    async fn adjust(
        &self,
        parts: &[Part<'_>],
        delta: i64,
        reserved_at_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.adjust_now(parts, delta, reserved_at_ms, now_ms)
    }

    async fn free(&self, parts: &[Part<'_>], _now_ms: u64) -> Result<(), StoreError> {
        self.free_now(parts)
    }

    async fn windows(
        &self,
        parts: &[Part<'_>],
        now_ms: u64,
    ) -> Result<(Vec<WindowSet>, u64), StoreError> {
        check_parts(parts)?;
        Ok((self.windows.windows(parts), now_ms))
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
        let l = Limit::fixed(2, 10);
        let hit = |f: &FixedWindows, actor: &str, l: &Limit, s: u64| {
            let (o, _) = f.hit(&CounterKey::divvy("m=a", actor), l, 1, s * 1000);
            (o.allowed, o.quotas()[0].remaining, o.quotas()[0].reset)
        };
        assert_eq!(hit(&f, "a", &l, 100), (true, 1, 10));
        assert_eq!(hit(&f, "a", &l, 103), (true, 0, 7));
        assert_eq!(hit(&f, "a", &l, 109), (false, 0, 1));
        assert_eq!(hit(&f, "a", &l, 110), (true, 1, 10), "a fresh window");
        // Another limit is another window (Divvy's keys name both).
        assert_eq!(hit(&f, "a", &Limit::fixed(3, 10), 110), (true, 2, 10));
        // At the cap, new counters are denied, old ones keep working, expired ones make room.
        let l = Limit::fixed(5, 60);
        for i in 0..10_000 {
            hit(&f, &format!("k{i}"), &l, 200);
        }
        assert!(!hit(&f, "newcomer", &l, 200).0);
        assert!(hit(&f, "newcomer", &l, 260).0, "expired windows make room");
    }

    #[test]
    fn aligned_windows_lie_on_the_clock() {
        let f = FixedWindows::new(SHARDS * 2);
        let k = CounterKey::descriptor("d", [("k", "v")].into_iter());
        let l = Limit::aligned(2, 60);
        let hit = |ms| {
            let (o, _) = f.hit(&k, &l, 1, ms);
            (o.allowed, o.quotas()[0].remaining, o.quotas()[0].reset)
        };
        assert_eq!(hit(1_700_000_040_000), (true, 1, 60));
        assert_eq!(hit(1_700_000_099_000), (true, 0, 1));
        assert_eq!(hit(1_700_000_099_999), (false, 0, 1));
        assert_eq!(hit(1_700_000_100_000), (true, 1, 60), "the next minute");
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
            let _ = store.hit(
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
