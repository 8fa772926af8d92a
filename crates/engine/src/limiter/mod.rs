//! limiter: the sliding-window arithmetic, pure and exact.
//!
//! A request on an endpoint is checked against every [`Limit`] its key has there (one per window
//! length: 10 per second *and* 1000 per minute), each a [`Window`] of its own. It passes only if
//! every enforced limit has room for its cost, and it is counted in all of them or in none
//! ([`WindowSet::hit`]). Shadow limits are computed and counted as if enforced but never refuse.
//! No I/O and no clock here: `now` is always an argument. The memory store runs this code
//! directly; the Redis script (`store/window.lua`) computes the same answers, and the store
//! behaviour suite holds them equal.

pub mod calendar;
mod fixed;
mod window;

pub use calendar::{Period, Tally, ZoneId, period_bounds};
pub use fixed::{FixedWindow, Span, fixed_outcome};
pub use window::{Check, WINDOW_SECONDS, Window, bucket_of, bucket_start, buckets, ceil_seconds};

/// Longest window a limit may have, in seconds (one day).
pub const MAX_WINDOW_SECONDS: u32 = 86_400;
/// Limits one key may have on one endpoint (one per window length).
pub const MAX_LIMITS: usize = 6;

/// The kind of window a limit counts in. Each kind's arithmetic lives once here (Rust) and once
/// in Lua (`window.lua` for sliding windows, `divvy.lua` for fixed ones); see
/// `docs/architecture.md` for adding one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Kind {
    /// The last `w` seconds, counted in buckets ([`Window`]): DynLimits' window. Default.
    #[default]
    Sliding,
    /// `w` seconds from the window's first hit, holding the credit left ([`FixedWindow`]):
    /// Divvy's.
    Fixed,
    /// `w` seconds aligned to Unix time, `[k w, (k + 1) w)`, holding the credit left
    /// ([`FixedWindow`] over a [`Span`]): envoyproxy/ratelimit's.
    Aligned,
    /// The hour, day, ISO week or month in the limit's `zone`, counted from zero at its start
    /// ([`Tally`]): a calendar quota. It has no `w`. Counted beside sliding windows (a day quota
    /// next to a per-second limit), by the same stores and in the same script.
    Calendar(Period),
    /// At most `rl` requests in flight at once: a slot is taken at admission and freed when the
    /// request ends ([`WindowSet::free`]). It has no `w`; a request takes one slot whatever its
    /// cost (a check, cost 0, takes none). Counted beside the others, in the same call.
    Concurrent,
}

/// One limit: `rl` units per `w` seconds in a window of one [`Kind`], enforced or shadow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    pub rl: u64,
    /// Window length in seconds: 1 to [`MAX_WINDOW_SECONDS`] for a sliding window, above 0 for
    /// the others; 0 for a calendar limit (its periods' lengths vary).
    pub w: u32,
    /// Computed and counted, never refuses.
    pub shadow: bool,
    pub kind: Kind,
    /// The zone a calendar limit's periods lie in; UTC (unused) for the others.
    pub zone: ZoneId,
}

impl Limit {
    /// An enforced sliding window: `rl` units per `w` seconds.
    pub const fn sliding(rl: u64, w: u32) -> Limit {
        Limit {
            rl,
            w,
            shadow: false,
            kind: Kind::Sliding,
            zone: ZoneId::UTC,
        }
    }

    /// An enforced calendar quota: `rl` units per `period` in `zone`.
    pub const fn calendar(rl: u64, period: Period, zone: ZoneId) -> Limit {
        Limit {
            kind: Kind::Calendar(period),
            zone,
            ..Limit::sliding(rl, 0)
        }
    }

    /// An enforced concurrency limit: at most `n` requests in flight at once.
    pub const fn concurrent(n: u64) -> Limit {
        Limit {
            kind: Kind::Concurrent,
            ..Limit::sliding(n, 0)
        }
    }

    /// A limit on requests in flight ([`Kind::Concurrent`]), not on a rate.
    pub const fn is_concurrent(&self) -> bool {
        matches!(self.kind, Kind::Concurrent)
    }

    /// The units a request of `cost` takes from this limit: its cost, or for a concurrency limit
    /// one slot (none for a check).
    pub const fn units(&self, cost: u64) -> u64 {
        match self.kind {
            Kind::Concurrent if cost > 0 => 1,
            _ => cost,
        }
    }

    /// The calendar period this limit counts in, if it is a calendar limit.
    pub const fn period(&self) -> Option<Period> {
        match self.kind {
            Kind::Calendar(p) => Some(p),
            _ => None,
        }
    }

    /// The length in seconds of the window holding `now_ms`: `w`, or the calendar period's (0 for
    /// a concurrency limit, which has none).
    pub fn seconds_at(&self, now_ms: u64) -> u64 {
        match self.kind {
            Kind::Calendar(p) => {
                let (start, end) = period_bounds(p, self.zone, now_ms);
                (end - start) / 1000
            }
            _ => u64::from(self.w),
        }
    }

    /// An enforced DynLimits limit: `rl` requests per 60 s.
    pub const fn per_minute(rl: u64) -> Limit {
        Limit::sliding(rl, WINDOW_SECONDS as u32)
    }

    /// An enforced fixed window of `rl` units for `w` seconds from its first hit.
    pub const fn fixed(rl: u64, w: u32) -> Limit {
        Limit {
            kind: Kind::Fixed,
            ..Limit::sliding(rl, w)
        }
    }

    /// An enforced fixed window of `rl` units per `w` seconds on the clock.
    pub const fn aligned(rl: u64, w: u32) -> Limit {
        Limit {
            kind: Kind::Aligned,
            ..Limit::sliding(rl, w)
        }
    }

    /// This limit as a shadow limit (`shadow`) or an enforced one.
    pub const fn shadowed(self, shadow: bool) -> Limit {
        Limit { shadow, ..self }
    }

    /// Counted in a [`WindowSet`] (a sliding window or a calendar period), not as a fixed window.
    const fn in_window_set(&self) -> bool {
        matches!(
            self.kind,
            Kind::Sliding | Kind::Calendar(_) | Kind::Concurrent
        )
    }

    /// Can a request of `cost` ever pass this limit? Not when it is 0 or below the cost: such a
    /// request is refused without reading any window (and, in a window, counted nowhere).
    pub const fn can_pass(&self, cost: u64) -> bool {
        self.rl > 0 && self.units(cost) <= self.rl
    }

    /// The quota of a sliding or calendar limit for a request it can never pass (its cost is
    /// above the limit): refused for good, reset at the window's length or the period's end.
    fn never(&self, now_ms: u64) -> Quota {
        let reset = match self.kind {
            Kind::Calendar(p) => {
                let (_, end) = period_bounds(p, self.zone, now_ms);
                ceil_seconds(end.saturating_sub(now_ms).max(1))
            }
            _ => u64::from(self.w),
        };
        Quota {
            limit: self.rl,
            reset,
            ..Quota::zero_limit()
        }
    }

    /// The answer for a request of `cost` that this limit gives alone, without any count: the
    /// request can never pass it (a sliding window below the cost), a fixed window of 0 units
    /// (nothing to count: it admits only checks, and never resets), or a window from the first
    /// hit of 0 seconds (it never fills: Divvy's "always allow"). `None`: a store must count.
    pub fn alone(&self, cost: u64, now_ms: u64) -> Option<Outcome> {
        match self.kind {
            // A shadow limit's refusal is the store's to tell (it counts the enforced ones).
            Kind::Sliding | Kind::Calendar(_) | Kind::Concurrent
                if !self.shadow && self.units(cost) > self.rl =>
            {
                // (A zero limit with a cost of 0 goes to the store, which refuses it too.)
                Some(Outcome::new(false, false, &[self.never(now_ms)]))
            }
            Kind::Aligned if self.rl == 0 => {
                let span = Span::of(self, now_ms);
                Some(fixed_outcome(self, cost, cost == 0, 0, span.seconds as i64))
            }
            Kind::Fixed if self.rl == 0 => Some(fixed_outcome(self, cost, cost == 0, 0, 0)),
            Kind::Fixed if self.w == 0 => {
                Some(fixed_outcome(self, cost, cost <= self.rl, self.rl, 0))
            }
            _ => None,
        }
    }
}

/// The kinds of a request's limits, as a store decides them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape<'a> {
    /// Sliding windows and calendar periods only (or none): one [`WindowSet`].
    Sliding,
    /// One fixed or aligned window.
    Fixed(&'a Limit),
    /// Fixed windows with others, or several fixed ones: no store decides these yet (no door
    /// asks them).
    Mixed,
}

impl<'a> Shape<'a> {
    pub fn of(limits: &'a [Limit]) -> Shape<'a> {
        match limits {
            _ if limits.iter().all(|l| l.in_window_set()) => Shape::Sliding,
            [l] => Shape::Fixed(l),
            _ => Shape::Mixed,
        }
    }
}

/// The limits of one request: borrowed from the catalog, or a copy when a config switch turns them
/// all to shadow or pools apply (rare, so the common request path copies nothing). Its own
/// limits come first, then each pool's ([`Limits::pools`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits<'a> {
    all: std::borrow::Cow<'a, [Limit]>,
    /// Each pool's name and number of limits, in order after the request's own. Empty (no
    /// allocation) without pools.
    pools: Box<[(&'a str, usize)]>,
}

impl<'a> Limits<'a> {
    /// The first [`MAX_LIMITS`] of `limits`; all of them shadow limits if `all_shadow`.
    pub fn new(limits: &'a [Limit], all_shadow: bool) -> Limits<'a> {
        let limits = &limits[..limits.len().min(MAX_LIMITS)];
        let all = if all_shadow && limits.iter().any(|l| !l.shadow) {
            std::borrow::Cow::Owned(limits.iter().map(|l| l.shadowed(true)).collect())
        } else {
            std::borrow::Cow::Borrowed(limits)
        };
        Limits {
            all,
            pools: Box::default(),
        }
    }

    /// `own` and each pool's limits (its group's name, its limits), at most [`MAX_LIMITS`] in
    /// all; all of them shadow limits if `all_shadow`.
    pub fn pooled(
        own: &'a [Limit],
        pools: impl IntoIterator<Item = (&'a str, &'a [Limit])>,
        all_shadow: bool,
    ) -> Limits<'a> {
        let mut all: Vec<Limit> = own.iter().take(MAX_LIMITS).copied().collect();
        let mut named = Vec::new();
        for (name, limits) in pools {
            let n = limits.len().min(MAX_LIMITS - all.len());
            if n > 0 {
                all.extend_from_slice(&limits[..n]);
                named.push((name, n));
            }
        }
        if all_shadow {
            for l in &mut all {
                *l = l.shadowed(true);
            }
        }
        Limits {
            all: std::borrow::Cow::Owned(all),
            pools: named.into(),
        }
    }

    /// Some limits count in pools.
    pub fn has_pools(&self) -> bool {
        !self.pools.is_empty()
    }

    /// The request's own limits (the first ones).
    pub fn own(&self) -> &[Limit] {
        let pooled: usize = self.pools.iter().map(|(_, n)| n).sum();
        &self.all[..self.all.len() - pooled]
    }

    /// Each pool's name and limits, in order.
    pub fn pools(&self) -> impl Iterator<Item = (&'a str, &[Limit])> {
        let mut at = self.own().len();
        self.pools.iter().map(move |&(name, n)| {
            let limits = &self.all[at..at + n];
            at += n;
            (name, limits)
        })
    }

    /// The pool limit `i` counts in (`None`: the request's own counter).
    pub fn pool_of(&self, i: usize) -> Option<&'a str> {
        let mut at = self.own().len();
        for &(name, n) in self.pools.iter() {
            if (at..at + n).contains(&i) {
                return Some(name);
            }
            at += n;
        }
        None
    }
}

impl std::ops::Deref for Limits<'_> {
    type Target = [Limit];

    fn deref(&self) -> &[Limit] {
        &self.all
    }
}

/// The state of one limit after checking one request against it: allowed or not, and what is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// This limit has room for the request.
    pub allowed: bool,
    /// The limit the request was checked against (units per window).
    pub limit: u64,
    /// Units still allowed in the current window after this request (if it was counted).
    pub remaining: u64,
    /// Seconds until more quota is available. Rejected: the wait after which the same request passes
    /// (equal to `retry_after`). Allowed: until the oldest counted request leaves the window.
    pub reset: u64,
    /// Set on rejections that waiting can cure: whole seconds after which the same request passes
    /// if nothing else is sent (rounded up). `None` when it never can (its cost is above the limit).
    pub retry_after: Option<u64>,
}

impl Quota {
    /// The answer for a zero limit, which rejects every request without touching any counter.
    pub fn zero_limit() -> Self {
        Quota {
            allowed: false,
            limit: 0,
            remaining: 0,
            reset: WINDOW_SECONDS,
            retry_after: None,
        }
    }
}

/// The answer for one request against all its limits.
///
/// Small for the common case of one limit (it travels in every request's future, and copying a
/// few hundred bytes per move cost more than the decision): several quotas go to the heap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Every enforced limit had room: the request passes and was counted.
    pub allowed: bool,
    /// Allowed, but at least one shadow limit would have refused it.
    pub shadow_limited: bool,
    quotas: Quotas,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Quotas {
    One(Quota),
    Several(Box<[Quota]>),
}

impl Outcome {
    /// An outcome from per-limit quotas (in the order of the request's limits).
    pub fn new(allowed: bool, shadow_limited: bool, quotas: &[Quota]) -> Outcome {
        let quotas = match quotas {
            [q] => Quotas::One(*q),
            more => Quotas::Several(more[..more.len().min(MAX_LIMITS)].into()),
        };
        Outcome {
            allowed,
            shadow_limited,
            quotas,
        }
    }

    /// One quota per limit of the request, in its order.
    pub fn quotas(&self) -> &[Quota] {
        match &self.quotas {
            Quotas::One(q) => std::slice::from_ref(q),
            Quotas::Several(qs) => qs,
        }
    }

    /// The wait in whole seconds after which the request passes every enforced limit, if nothing
    /// else is sent; `None` when allowed, or when some limit can never pass it.
    pub fn retry_after(&self, limits: &[Limit]) -> Option<u64> {
        if self.allowed {
            return None;
        }
        let (mut wait, mut by_rate, mut by_slots) = (0, false, false);
        for (l, q) in limits.iter().zip(self.quotas()) {
            if l.shadow || q.allowed {
                continue;
            }
            // Nothing says when a slot frees: a refusal by concurrency alone tells no wait.
            if l.is_concurrent() {
                by_slots = true;
                continue;
            }
            by_rate = true;
            wait = wait.max(q.retry_after?);
        }
        (by_rate || !by_slots).then_some(wait)
    }

    /// This answer (a request's limits as they stand, counting nothing) told as a refusal of a
    /// request behind others in line for the same room: each enforced rate limit refuses it,
    /// with a wait of `wait_ms` (`None`: it never passes); with no rate, its concurrency limits
    /// refuse it.
    pub fn refused_behind(&self, limits: &[Limit], wait_ms: Option<u64>) -> Outcome {
        let mut quotas = [Quota::zero_limit(); MAX_LIMITS];
        let n = self.quotas().len().min(MAX_LIMITS);
        quotas[..n].copy_from_slice(&self.quotas()[..n]);
        let rates = limits.iter().any(|l| !l.shadow && !l.is_concurrent());
        let retry = wait_ms.map(ceil_seconds);
        for (l, q) in limits.iter().zip(&mut quotas[..n]) {
            if l.shadow || l.is_concurrent() == rates {
                continue;
            }
            q.allowed = false;
            q.remaining = 0;
            q.retry_after = if l.is_concurrent() { None } else { retry };
            q.reset = q.retry_after.unwrap_or(q.reset);
        }
        Outcome::new(false, false, &quotas[..n])
    }

    /// Was the request counted in limit `l`, its `i`th? Every limit of an admitted request but
    /// the shadow ones one of which refused it.
    pub fn counted_in(&self, i: usize, l: &Limit) -> bool {
        self.allowed
            && self.quotas().get(i).is_some_and(|q| q.allowed)
            && (!l.shadow || !self.shadow_limited)
    }

    /// The enforced concurrency limit that refused this request, if only such limits did (no
    /// rate refused it).
    pub fn refused_by_slots(&self, limits: &[Limit]) -> Option<usize> {
        if self.allowed {
            return None;
        }
        let mut slots = None;
        for (i, (l, q)) in limits.iter().zip(self.quotas()).enumerate() {
            if l.shadow || q.allowed {
                continue;
            }
            if !l.is_concurrent() {
                return None;
            }
            slots = slots.or(Some(i));
        }
        slots
    }

    /// The enforced limit that tells most about this answer, for the single-policy headers: on a
    /// refusal the refusing limit with the longest wait (one that can never pass first); else the
    /// one with the least left, then the longest reset. `None` when every limit is shadow or
    /// counts requests in flight (not a rate: [`Outcome::refused_by_slots`] tells of those).
    pub fn most_restrictive(&self, limits: &[Limit]) -> Option<usize> {
        let rank = |q: &Quota| {
            (
                q.allowed,
                std::cmp::Reverse(q.retry_after.unwrap_or(u64::MAX)),
                q.remaining,
                std::cmp::Reverse(q.reset),
            )
        };
        limits
            .iter()
            .zip(self.quotas())
            .enumerate()
            .filter(|(_, (l, _))| !l.shadow && !l.is_concurrent())
            .min_by_key(|(_, (_, q))| rank(q))
            .map(|(i, _)| i)
    }
}

/// What the rate-limit fields of an answer say (HTTP headers, a Divvy reply, an Envoy status):
/// the endpoint, the request's limits and the store's outcome for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rate<'s> {
    /// The endpoint's name: the name of its per-minute policy, and the stem of the others'.
    pub name: &'s str,
    pub limits: Limits<'s>,
    pub outcome: Outcome,
    /// Units the request used.
    pub cost: u64,
    /// When it was decided (Unix milliseconds): a calendar period's length depends on it.
    pub at_ms: u64,
}

/// The windows of one (API key, endpoint) counter, one per window length, and its calendar
/// tallies, one per period and zone.
#[derive(Debug, Clone, Default)]
pub struct WindowSet {
    windows: Vec<Window>,
    tallies: Vec<Tally>,
    /// Slots of its concurrency limit taken and not yet freed (one such limit per counter).
    in_flight: u64,
}

impl WindowSet {
    /// A counter holding `windows` (one per window length; later duplicates are ignored).
    pub fn from_windows(windows: Vec<Window>) -> WindowSet {
        let mut c = WindowSet::default();
        for w in windows {
            if c.get(w.seconds()).is_none() {
                c.windows.push(w);
            }
        }
        c
    }

    /// `tallies` beside these windows (one per period and zone; later duplicates are ignored).
    pub fn with_tallies(mut self, tallies: impl IntoIterator<Item = Tally>) -> WindowSet {
        for t in tallies {
            if !self.tallies.iter().any(|x| x.same_as(&t)) {
                self.tallies.push(t);
            }
        }
        self
    }

    /// True when no window holds anything at `now_ms` and no slot is taken.
    pub fn is_idle(&self, now_ms: u64) -> bool {
        self.in_flight == 0
            && self.windows.iter().all(|w| w.is_idle(now_ms))
            && self.tallies.iter().all(|t| t.is_idle(now_ms))
    }

    /// The tally of calendar limit `l` (created empty, for the period holding `now_ms`, if new).
    fn tally(&mut self, l: &Limit, now_ms: u64) -> usize {
        let period = l.period().unwrap_or(Period::Hour);
        match self.tallies.iter().position(|t| t.is_for(period, l.zone)) {
            Some(i) => i,
            None => {
                self.tallies.push(Tally::new(period, l.zone, now_ms));
                self.tallies.len() - 1
            }
        }
    }

    /// The tally of `period` in `zone`, if it has one.
    pub fn get_tally(&self, period: Period, zone: ZoneId) -> Option<&Tally> {
        self.tallies.iter().find(|t| t.is_for(period, zone))
    }

    /// Slots taken in its concurrency limit.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// This counter with `n` slots taken (read from a store).
    pub fn with_in_flight(mut self, n: u64) -> WindowSet {
        self.in_flight = n;
        self
    }

    /// Frees up to `slots` slots of its concurrency limit: requests that ended.
    pub fn free(&mut self, slots: u64) {
        self.in_flight -= self.in_flight.min(slots);
    }

    /// The window of `w` seconds (created empty if new).
    fn window(&mut self, w: u32) -> usize {
        match self.windows.iter().position(|x| x.seconds() == w) {
            Some(i) => i,
            None => {
                self.windows.push(Window::of_seconds(w));
                self.windows.len() - 1
            }
        }
    }

    /// The window of `w` seconds, if it has one.
    pub fn get(&self, w: u32) -> Option<&Window> {
        self.windows.iter().find(|x| x.seconds() == w)
    }

    /// Checks one request of `cost` units at `now_ms` against `limits` (distinct `w`, at most
    /// [`MAX_LIMITS`]) and counts it where it belongs:
    /// - if an enforced limit has no room, it is refused and counted nowhere;
    /// - else it is counted in every enforced limit, and in the shadow limits too if all of them
    ///   have room; if one has not, it is counted in no shadow limit (as if a shadow refusal were
    ///   real, so a catalog run all in shadow counts exactly what enforcing it would) and the
    ///   outcome is `shadow_limited`.
    pub fn hit(&mut self, limits: &[Limit], cost: u64, now_ms: u64) -> Outcome {
        // The common case, one enforced limit, without the bookkeeping for several: the same
        // answer as `decide` (the test `the_short_path_answers_as_the_general_one` holds them
        // equal), without the per-limit arrays the memory store would pay for on every request.
        if let [l] = limits
            && !l.shadow
            && l.kind == Kind::Sliding
            && l.can_pass(cost)
        {
            let i = self.window(l.w);
            let win = &mut self.windows[i];
            let c = win.check(now_ms, l.rl, cost);
            if c.fits {
                win.count(cost);
            }
            let q = win.quota(&c, now_ms, l.rl, cost, c.fits);
            return Outcome::new(c.fits, false, &[q]);
        }
        self.decide(limits, cost, now_ms, true)
    }

    /// Counts `units` more at `now_ms` in the window of each of `limits`, whatever room they have:
    /// a request whose response reported a cost above what it reserved (docs/semantics.md).
    pub fn add(&mut self, limits: &[Limit], units: u64, now_ms: u64) {
        for l in limits.iter().take(MAX_LIMITS) {
            if l.is_concurrent() {
                // A report changes what a request cost, not that it was in flight.
                continue;
            } else if l.period().is_some() {
                let i = self.tally(l, now_ms);
                self.tallies[i].check(now_ms, u64::MAX, 0);
                self.tallies[i].count(units);
            } else {
                let i = self.window(l.w);
                self.windows[i].check(now_ms, u64::MAX, 0);
                self.windows[i].count(units);
            }
        }
    }

    /// Takes up to `units` back from each of `limits`' windows, from the bucket (or period)
    /// holding `at_ms`, if it is still in the window: a request whose response reported a cost
    /// below what it reserved at `at_ms`.
    pub fn give_back(&mut self, limits: &[Limit], units: u64, at_ms: u64) {
        for l in limits.iter().take(MAX_LIMITS) {
            if l.is_concurrent() {
                continue;
            } else if let Some(p) = l.period() {
                if let Some(t) = self.tallies.iter_mut().find(|t| t.is_for(p, l.zone)) {
                    t.give_back(at_ms, units);
                }
            } else if let Some(w) = self.windows.iter_mut().find(|w| w.seconds() == l.w) {
                w.give_back(at_ms, units);
            }
        }
    }

    /// The state of every limit at `now_ms` for one more request of `cost`, counting nothing.
    pub fn peek(&self, limits: &[Limit], cost: u64, now_ms: u64) -> Outcome {
        // Checking moves a window's buckets forward: on a copy.
        self.clone().decide(limits, cost, now_ms, false)
    }

    /// [`decide_parts`] on this counter alone.
    fn decide(&mut self, limits: &[Limit], cost: u64, now_ms: u64, count: bool) -> Outcome {
        decide_parts(&mut [(self, limits)], cost, now_ms, count)
    }
}

/// Milliseconds from `now_ms` until every enforced rate limit of `parts` (each a counter's
/// windows and the limits that count there) has room for `units` more, if nothing else is
/// counted meanwhile: what a request waiting for room, behind others in line, waits for. 0 when
/// they fit now; `None` when they never can (above a limit). Concurrency limits are not rates:
/// they say nothing of when a slot frees, and are left out.
pub fn room_in_ms(parts: &[(&WindowSet, &[Limit])], units: u64, now_ms: u64) -> Option<u64> {
    let mut wait = 0;
    for (set, limits) in parts {
        for l in limits.iter().filter(|l| !l.shadow && !l.is_concurrent()) {
            let ms = match l.kind {
                Kind::Calendar(p) => {
                    let count = set
                        .get_tally(p, l.zone)
                        .filter(|t| (t.start_ms..t.end_ms).contains(&now_ms))
                        .map_or(0, |t| t.count);
                    match count.saturating_add(units) <= l.rl {
                        true => 0,
                        false if units > l.rl => return None,
                        false => period_bounds(p, l.zone, now_ms).1.saturating_sub(now_ms),
                    }
                }
                _ => match set.get(l.w) {
                    Some(w) => w.room_in_ms(now_ms, l.rl, units)?,
                    None if units <= l.rl => 0,
                    None => return None,
                },
            };
            wait = wait.max(ms);
        }
    }
    Some(wait)
}

/// Milliseconds from `now_ms` until the last of `requests` requests of `cost` each, in line for
/// the enforced rate limits of `parts`, has room, each admitted as soon as it fits and counted
/// there (a line of requests waiting for room, this one last): 0 when all fit now; `None` when
/// one never can. Concurrency and shadow limits are left out, as in [`room_in_ms`].
pub fn line_room_in_ms(
    parts: &[(&WindowSet, &[Limit])],
    requests: u64,
    cost: u64,
    now_ms: u64,
) -> Option<u64> {
    let rates: Vec<Vec<Limit>> = parts
        .iter()
        .map(|(_, limits)| {
            limits
                .iter()
                .filter(|l| !l.shadow && !l.is_concurrent())
                .copied()
                .collect()
        })
        .collect();
    let mut sets: Vec<WindowSet> = parts.iter().map(|(s, _)| (*s).clone()).collect();
    let mut at = now_ms;
    for _ in 0..requests {
        let wait = {
            let views: Vec<(&WindowSet, &[Limit])> =
                sets.iter().zip(&rates).map(|(s, l)| (s, &l[..])).collect();
            room_in_ms(&views, cost, at)?
        };
        at += wait;
        let mut counted: Vec<(&mut WindowSet, &[Limit])> = sets
            .iter_mut()
            .zip(&rates)
            .map(|(s, l)| (s, &l[..]))
            .collect();
        if !hit_parts(&mut counted, cost, at).allowed {
            // Room by the windows but not by the decision: the two disagree only on input no
            // catalog gives (a limit of 0): say never rather than loop.
            return None;
        }
    }
    Some(at - now_ms)
}

/// [`WindowSet::hit`] across several counters: a request whose limits count in more than one
/// (its endpoint's, and a pool's shared by several endpoints). `parts[i]` is a counter's windows
/// and the limits that count there; the request passes only if every enforced limit of every part
/// has room, and is counted in all of them or in none. Quotas come in the parts' order, at most
/// [`MAX_LIMITS`] in all.
pub fn hit_parts(parts: &mut [(&mut WindowSet, &[Limit])], cost: u64, now_ms: u64) -> Outcome {
    decide_parts(parts, cost, now_ms, true)
}

/// [`WindowSet::peek`] across several counters ([`hit_parts`]), counting nothing.
pub fn peek_parts(parts: &[(&WindowSet, &[Limit])], cost: u64, now_ms: u64) -> Outcome {
    // Checking moves a window's buckets forward: on copies.
    let mut copies: Vec<(WindowSet, &[Limit])> =
        parts.iter().map(|(w, l)| ((*w).clone(), *l)).collect();
    let mut parts: Vec<(&mut WindowSet, &[Limit])> =
        copies.iter_mut().map(|(w, l)| (w, *l)).collect();
    decide_parts(&mut parts, cost, now_ms, false)
}

/// The one decision [`WindowSet::hit`], [`WindowSet::peek`] and [`hit_parts`] share: every limit
/// checked, then, when `count`, the request counted where the rules above put it.
fn decide_parts(
    parts: &mut [(&mut WindowSet, &[Limit])],
    cost: u64,
    now_ms: u64,
    count: bool,
) -> Outcome {
    // Per limit, in the parts' order: its part, where it counts in that part (a window's index
    // in `windows`, a tally's in `tallies`, or the slots in flight) and what checking it found.
    #[derive(Clone, Copy)]
    enum At {
        Window(usize, Check),
        Tally(usize),
        Slots,
    }
    let mut part = [0usize; MAX_LIMITS];
    let mut at = [At::Slots; MAX_LIMITS];
    let mut fit = [false; MAX_LIMITS];
    let mut all = [Limit::per_minute(0); MAX_LIMITS];
    let mut n = 0;
    let (mut enforced_ok, mut shadow_ok) = (true, true);
    for (p, (set, limits)) in parts.iter_mut().enumerate() {
        for l in limits.iter().take(MAX_LIMITS - n) {
            let i = n;
            n += 1;
            (part[i], all[i]) = (p, *l);
            // A limit below the cost can never pass: no window is needed to say so.
            let fits = l.can_pass(cost)
                && match l.kind {
                    Kind::Calendar(_) => {
                        let t = set.tally(l, now_ms);
                        at[i] = At::Tally(t);
                        set.tallies[t].check(now_ms, l.rl, cost)
                    }
                    Kind::Concurrent => {
                        at[i] = At::Slots;
                        set.in_flight.saturating_add(l.units(cost)) <= l.rl
                    }
                    _ => {
                        let w = set.window(l.w);
                        let c = set.windows[w].check(now_ms, l.rl, cost);
                        at[i] = At::Window(w, c);
                        c.fits
                    }
                };
            fit[i] = fits;
            if !fits {
                if l.shadow {
                    shadow_ok = false;
                } else {
                    enforced_ok = false;
                }
            }
        }
    }
    let mut quotas = [Quota::zero_limit(); MAX_LIMITS];
    for (i, l) in all[..n].iter().enumerate() {
        let counted = count && enforced_ok && (shadow_ok || !l.shadow);
        if !l.can_pass(cost) {
            quotas[i] = l.never(now_ms);
            continue;
        }
        let set = &mut *parts[part[i]].0;
        quotas[i] = match at[i] {
            At::Tally(t) => {
                let t = &mut set.tallies[t];
                if counted {
                    t.count(cost);
                }
                t.quota(fit[i], now_ms, l.rl)
            }
            At::Slots => {
                if counted {
                    set.in_flight = set.in_flight.saturating_add(l.units(cost));
                }
                Quota {
                    allowed: fit[i],
                    limit: l.rl,
                    remaining: if fit[i] {
                        l.rl.saturating_sub(set.in_flight)
                    } else {
                        0
                    },
                    reset: 0,
                    retry_after: None,
                }
            }
            At::Window(w, c) => {
                let win = &mut set.windows[w];
                if counted {
                    win.count(cost);
                }
                win.quota(&c, now_ms, l.rl, cost, counted)
            }
        };
    }
    Outcome::new(
        enforced_ok,
        count && enforced_ok && !shadow_ok,
        &quotas[..n],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_040_000; // a minute boundary, in ms

    fn lim(rl: u64, w: u32) -> Limit {
        Limit::sliding(rl, w)
    }

    fn shadow(rl: u64, w: u32) -> Limit {
        Limit::sliding(rl, w).shadowed(true)
    }

    #[test]
    fn a_request_refused_by_one_window_uses_up_none() {
        let limits = [lim(2, 1), lim(3, 60)];
        let mut c = WindowSet::default();
        assert!(c.hit(&limits, 1, T0).allowed);
        assert!(c.hit(&limits, 1, T0 + 10).allowed);
        let o = c.hit(&limits, 1, T0 + 20);
        assert!(!o.allowed, "the per-second limit refuses");
        assert_eq!(
            o.quotas()[1].remaining,
            1,
            "the per-minute quota is untouched"
        );
        assert_eq!(o.retry_after(&limits), Some(1));
        assert!(c.hit(&limits, 1, T0 + 1_000).allowed, "one second later");
        let o = c.hit(&limits, 1, T0 + 2_000);
        assert!(!o.allowed, "now the per-minute limit refuses");
        assert_eq!(o.retry_after(&limits), Some(58));
        assert_eq!(o.most_restrictive(&limits), Some(1));
    }

    #[test]
    fn retry_after_waits_for_every_window() {
        let limits = [lim(1, 1), lim(1, 10)];
        let mut c = WindowSet::default();
        assert!(c.hit(&limits, 1, T0).allowed);
        let o = c.hit(&limits, 1, T0 + 500);
        assert_eq!(o.retry_after(&limits), Some(10));
        assert!(!c.hit(&limits, 1, T0 + 9_999).allowed);
        assert!(c.hit(&limits, 1, T0 + 10_000).allowed);
    }

    #[test]
    fn cost_counts_units_in_every_window() {
        let limits = [lim(10, 1), lim(25, 60)];
        let mut c = WindowSet::default();
        let o = c.hit(&limits, 4, T0);
        assert_eq!((o.quotas()[0].remaining, o.quotas()[1].remaining), (6, 21));
        let o = c.hit(&limits, 11, T0 + 5_000);
        assert!(!o.allowed);
        assert_eq!(
            o.retry_after(&limits),
            None,
            "a cost above a limit never passes"
        );
        assert_eq!(o.most_restrictive(&limits), Some(0));
    }

    #[test]
    fn shadow_limits_count_but_never_refuse() {
        let limits = [lim(10, 60), shadow(2, 60 * 60)];
        let mut c = WindowSet::default();
        for _ in 0..2 {
            let o = c.hit(&limits, 1, T0);
            assert!(o.allowed && !o.shadow_limited);
        }
        let o = c.hit(&limits, 1, T0);
        assert!(o.allowed && o.shadow_limited);
        assert_eq!(o.quotas()[0].remaining, 7, "counted in the enforced limit");
        assert_eq!(
            o.most_restrictive(&limits),
            Some(0),
            "shadow limits are not reported"
        );
    }

    #[test]
    fn a_catalog_all_in_shadow_counts_what_enforcing_it_would() {
        let enforced = [lim(3, 1), lim(5, 60)];
        let dry = [shadow(3, 1), shadow(5, 60)];
        let (mut a, mut b) = (WindowSet::default(), WindowSet::default());
        for i in 0..200u64 {
            let now = T0 + i * 137;
            let x = a.hit(&enforced, 1 + i % 2, now);
            let y = b.hit(&dry, 1 + i % 2, now);
            assert!(y.allowed);
            assert_eq!(x.allowed, !y.shadow_limited, "at step {i}");
            assert_eq!(x.quotas(), y.quotas(), "at step {i}");
        }
    }

    #[test]
    fn peek_counts_nothing() {
        let limits = [lim(2, 1), lim(3, 60)];
        let mut c = WindowSet::default();
        c.hit(&limits, 1, T0);
        let p = c.peek(&limits, 1, T0 + 10);
        assert!(p.allowed);
        assert_eq!((p.quotas()[0].remaining, p.quotas()[1].remaining), (1, 2));
        assert_eq!(c.peek(&limits, 1, T0 + 10), p);
    }

    #[test]
    fn a_limit_stays_sixteen_bytes() {
        // A catalog holds millions of them (issue 32's memory per key).
        assert_eq!(std::mem::size_of::<Limit>(), 16);
    }

    #[test]
    fn a_day_quota_beside_a_per_second_limit_counts_in_both_or_neither() {
        let day = Limit::calendar(5, Period::Day, ZoneId::UTC);
        let limits = [lim(2, 1), day];
        // 2023-11-14T22:13:20Z: 6,400 s before midnight UTC.
        let t0 = 1_700_000_000_000;
        let mut c = WindowSet::default();
        assert!(c.hit(&limits, 1, t0).allowed);
        assert!(c.hit(&limits, 1, t0).allowed);
        let o = c.hit(&limits, 1, t0 + 10);
        assert!(!o.allowed, "the per-second limit refuses");
        assert_eq!(o.quotas()[1].remaining, 3, "nothing taken from the day");
        assert_eq!(o.quotas()[1].reset, 6_400, "the day ends at midnight");
        for i in 0..3 {
            assert!(c.hit(&limits, 1, t0 + 1_000 * (i + 1)).allowed, "hit {i}");
        }
        let o = c.hit(&limits, 1, t0 + 5_000);
        assert!(!o.allowed, "the day is used up");
        assert_eq!(o.retry_after(&limits), Some(6_395), "until midnight");
        assert_eq!(o.most_restrictive(&limits), Some(1));
        assert!(!c.is_idle(t0 + 6_000_000), "a day holds its count");
        let o = c.hit(&limits, 1, t0 + 6_400_000);
        assert!(o.allowed, "a new day starts at zero");
        assert_eq!(o.quotas()[1].remaining, 4);
        assert_eq!(o.quotas()[1].reset, 86_400);
        assert!(
            c.hit(&limits, 1, t0 + 6_399_000).allowed,
            "a clock back in yesterday counts in today"
        );
        assert_eq!(c.peek(&limits, 1, t0 + 6_400_000).quotas()[1].remaining, 3);
        assert_eq!(day.seconds_at(t0), 86_400);
        assert_eq!(
            Limit::calendar(5, Period::Month, ZoneId::UTC).seconds_at(t0),
            30 * 86_400
        );
    }

    #[test]
    fn a_calendar_limit_below_the_cost_never_passes_and_counts_nowhere() {
        let limits = [lim(10, 60), Limit::calendar(3, Period::Hour, ZoneId::UTC)];
        let mut c = WindowSet::default();
        let o = c.hit(&limits, 4, T0 + 1_000);
        assert!(!o.allowed);
        assert_eq!(o.retry_after(&limits), None);
        assert_eq!(o.quotas()[1].reset, 2_759, "until the hour's end");
        assert_eq!(o.quotas()[0].remaining, 10);
        assert!(c.is_idle(T0 + 1_000));
        let alone = limits[1].alone(4, T0 + 1_000).unwrap();
        assert_eq!(alone.quotas()[0], o.quotas()[1]);
    }

    #[test]
    fn a_pool_and_an_endpoint_count_together_or_not_at_all() {
        // Endpoint a: 2 per second of its own; a pool of 3 a minute shared with endpoint b.
        let (own, pool) = ([lim(2, 1)], [lim(3, 60)]);
        let (mut a, mut b, mut shared) = (
            WindowSet::default(),
            WindowSet::default(),
            WindowSet::default(),
        );
        let hit = |set: &mut WindowSet, shared: &mut WindowSet, own: &[Limit], now| {
            hit_parts(&mut [(set, own), (shared, &pool[..])], 1, now)
        };
        assert!(hit(&mut a, &mut shared, &own, T0).allowed);
        assert!(hit(&mut a, &mut shared, &own, T0).allowed);
        let o = hit(&mut a, &mut shared, &own, T0);
        assert!(!o.allowed, "a's own limit refuses");
        assert_eq!(
            o.quotas()[1].remaining,
            1,
            "and takes nothing from the pool"
        );
        let o = hit(&mut b, &mut shared, &[], T0);
        assert!(o.allowed, "b has the pool alone");
        assert_eq!(o.quotas(), &[o.quotas()[0]]);
        let o = hit(&mut b, &mut shared, &[], T0 + 10);
        assert!(!o.allowed, "the pool is used up");
        assert_eq!(o.retry_after(&pool), Some(60));
        assert!(
            !hit(&mut a, &mut shared, &own, T0 + 1_000).allowed,
            "for a too"
        );
        assert!(
            a.get(1).is_some_and(|w| w.is_idle(T0 + 1_000)),
            "nor from a"
        );
        let p = peek_parts(&[(&a, &own[..]), (&shared, &pool[..])], 1, T0 + 60_000);
        assert!(p.allowed);
        assert_eq!(p.quotas()[1].remaining, 3, "a minute later");
        assert!(
            hit(&mut a, &mut shared, &own, T0 + 60_000).allowed,
            "peeking counted nothing"
        );
    }

    #[test]
    fn a_report_adds_past_the_limit_or_gives_back_where_the_reservation_was_counted() {
        let limits = [lim(10, 60), Limit::calendar(100, Period::Day, ZoneId::UTC)];
        let mut c = WindowSet::default();
        assert!(c.hit(&limits, 5, T0).allowed, "a reservation of 5");
        c.add(&limits, 7, T0 + 2_000);
        let o = c.peek(&limits, 1, T0 + 3_000);
        assert!(!o.allowed, "12 of 10: refused until room comes");
        assert_eq!(o.quotas()[0].remaining, 0);
        assert_eq!(
            o.retry_after(&limits),
            Some(57),
            "when the 5 leave, 7 of 10 are left"
        );
        assert_eq!(o.quotas()[1].remaining, 88);
        let mut d = WindowSet::default();
        assert!(d.hit(&limits, 5, T0).allowed);
        assert!(d.hit(&limits, 1, T0 + 1_000).allowed);
        d.give_back(&limits, 4, T0);
        let o = d.peek(&limits, 1, T0 + 1_500);
        assert_eq!((o.quotas()[0].remaining, o.quotas()[1].remaining), (8, 98));
        d.give_back(&limits, 1, T0 - 86_400_000);
        assert_eq!(
            d.peek(&limits, 1, T0 + 1_500).quotas()[1].remaining,
            98,
            "yesterday's units are gone already"
        );
        d.give_back(&limits, 9, T0);
        assert_eq!(
            d.peek(&limits, 1, T0 + 1_500).quotas()[0].remaining,
            9,
            "never below 0"
        );
        let mut e = WindowSet::default();
        assert!(e.hit(&limits, 5, T0).allowed);
        e.give_back(&limits, 5, T0);
        assert!(e.is_idle(T0));
        assert!(e.hit(&limits, 2, T0 + 61_000).allowed);
        e.give_back(&limits, 2, T0);
        assert_eq!(
            e.peek(&limits, 1, T0 + 61_000).quotas()[0].remaining,
            8,
            "the minute-old bucket has left: nothing to take from"
        );
    }

    #[test]
    fn a_concurrency_limit_holds_a_slot_per_request_until_it_is_freed() {
        let limits = [Limit::concurrent(2), lim(10, 60)];
        let mut c = WindowSet::default();
        let o = c.hit(&limits, 3, T0);
        assert!(o.allowed, "a cost of 3 takes one slot");
        assert_eq!(o.quotas()[0].remaining, 1);
        assert_eq!(o.quotas()[1].remaining, 7);
        assert!(c.hit(&limits, 1, T0 + 10).allowed);
        let o = c.hit(&limits, 1, T0 + 20);
        assert!(!o.allowed, "two in flight");
        assert_eq!(
            o.retry_after(&limits),
            None,
            "nothing says when a slot frees"
        );
        assert_eq!(o.refused_by_slots(&limits), Some(0));
        assert_eq!(o.most_restrictive(&limits), Some(1), "rates only");
        assert_eq!(c.in_flight(), 2);
        assert_eq!(
            c.peek(&limits, 1, T0 + 20).quotas()[1].remaining,
            6,
            "the refused request took nothing from the rate"
        );
        assert!(c.hit(&limits, 0, T0 + 20).allowed, "a check takes no slot");
        c.free(1);
        assert!(c.hit(&limits, 1, T0 + 30).allowed, "a slot freed");
        c.free(9);
        assert_eq!(c.in_flight(), 0, "never below none");
        assert!(c.is_idle(T0 + 120_000));
        c.hit(&limits, 1, T0 + 120_000);
        assert!(!c.is_idle(T0 + 240_000), "a slot taken is state to keep");
        c.add(&limits, 5, T0 + 120_000);
        c.give_back(&limits, 5, T0 + 120_000);
        assert_eq!(c.in_flight(), 1, "reports change rates, not slots");
    }

    #[test]
    fn a_rate_refusal_beside_slots_takes_no_slot_and_tells_its_wait() {
        let limits = [Limit::concurrent(5), lim(1, 60)];
        let mut c = WindowSet::default();
        assert!(c.hit(&limits, 1, T0).allowed);
        let o = c.hit(&limits, 1, T0 + 1_000);
        assert!(!o.allowed);
        assert_eq!(c.in_flight(), 1);
        assert_eq!(o.retry_after(&limits), Some(59));
        assert_eq!(o.refused_by_slots(&limits), None);
        let full = [Limit::concurrent(1), lim(1, 60)];
        let o = c.hit(&full, 1, T0 + 2_000);
        assert_eq!(
            o.retry_after(&full),
            Some(58),
            "refused by both: the rate tells when"
        );
        assert_eq!(o.refused_by_slots(&full), None);
        let never = Limit::concurrent(1).alone(1, T0);
        assert!(never.is_none(), "one slot is room for any cost");
        let shadow = [Limit::concurrent(1).shadowed(true)];
        assert!(c.hit(&shadow, 1, T0).allowed);
        let o = c.hit(&shadow, 1, T0);
        assert!(
            o.allowed && o.shadow_limited,
            "a shadow limit never refuses"
        );
    }

    #[test]
    fn room_comes_when_enough_of_the_oldest_counts_leave() {
        let limits = [lim(3, 1), lim(5, 60), Limit::concurrent(1)];
        let mut c = WindowSet::default();
        // 1 s window: 100 ms buckets. Two at T0, one at T0 + 300.
        c.hit(&limits[..2], 1, T0);
        c.hit(&limits[..2], 1, T0);
        c.free(5);
        c.hit(&limits[..2], 1, T0 + 300);
        let room = |units, now| room_in_ms(&[(&c, &limits[..])], units, now);
        assert_eq!(room(0, T0 + 400), Some(0));
        assert_eq!(
            room(1, T0 + 400),
            Some(600),
            "the two of T0 leave at T0 + 1000"
        );
        assert_eq!(room(2, T0 + 400), Some(600));
        assert_eq!(
            room(3, T0 + 400),
            Some(59_600),
            "the 60 s window holds 3 of 5: room for 3 when the first leaves it"
        );
        assert_eq!(room(4, T0 + 400), None, "4 never fit in 3");
        assert_eq!(
            room(2, T0 + 900),
            Some(100),
            "the two of T0 leave at T0 + 1000"
        );
        assert_eq!(room(2, T0 + 1_000), Some(0));
        let day = [Limit::calendar(2, Period::Day, ZoneId::UTC)];
        let mut d = WindowSet::default();
        // 2023-11-14T22:13:20Z: 6,400 s before midnight UTC.
        let t0 = 1_700_000_000_000;
        d.hit(&day, 2, t0);
        assert_eq!(room_in_ms(&[(&d, &day[..])], 1, t0 + 400), Some(6_399_600));
        assert_eq!(room_in_ms(&[(&d, &day[..])], 3, t0), None);
    }

    #[test]
    fn a_line_gets_room_one_request_after_another() {
        let limits = [lim(2, 1), Limit::concurrent(1)];
        let mut c = WindowSet::default();
        c.hit(&limits[..1], 1, T0);
        c.hit(&limits[..1], 1, T0 + 200);
        let line = |n, now| line_room_in_ms(&[(&c, &limits[..])], n, 1, now);
        assert_eq!(line(0, T0 + 500), Some(0));
        assert_eq!(
            line(1, T0 + 500),
            Some(500),
            "the first of T0 leaves at T0 + 1000"
        );
        assert_eq!(line(2, T0 + 500), Some(700), "the second at T0 + 1200");
        assert_eq!(
            line(3, T0 + 500),
            Some(1_500),
            "the third waits for the first admitted"
        );
        assert_eq!(line(4, T0 + 500), Some(1_700));
        assert_eq!(line_room_in_ms(&[(&c, &limits[..])], 1, 3, T0), None);
    }

    #[test]
    fn the_short_path_answers_as_the_general_one() {
        // A walk of requests of varying cost and spacing on one enforced limit, hit through the
        // short path on one set and through the general one on its twin.
        let (mut short, mut general) = (WindowSet::default(), WindowSet::default());
        let mut now_ms = 1_700_000_000_000u64;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let day = Limit::calendar(7, Period::Day, ZoneId::UTC);
        for (w, l) in [
            (60u32, Limit::sliding(7, 60)),
            (1, Limit::sliding(7, 1)),
            (3600, Limit::sliding(7, 3600)),
            (86_400, day),
        ] {
            let l = [l];
            for _ in 0..2000 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                now_ms += seed % (u64::from(w) * 1000 / 8 + 1);
                let cost = 1 + seed % 3;
                assert_eq!(
                    short.hit(&l, cost, now_ms),
                    general.decide(&l, cost, now_ms, true),
                    "w {w} at {now_ms} cost {cost}"
                );
            }
        }
    }
}
