//! set: one counter's places (its windows, calendar tallies and slots in flight), and the one
//! decision across a request's counters ([`hit_parts`]).

use super::{Check, Kind, Limit, MAX_LIMITS, Outcome, Period, Quota, Slots, Tally, Window, ZoneId};

/// The windows of one (API key, endpoint) counter, one per window length, and its calendar
/// tallies, one per period and zone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowSet {
    windows: Vec<Window>,
    tallies: Vec<Tally>,
    /// Its concurrency limit's slots in flight.
    slots: Slots,
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
        self.slots.in_flight() == 0
            && self.windows.iter().all(|w| w.is_idle(now_ms))
            && self.tallies.iter().all(|t| t.is_idle(now_ms))
    }

    /// Its windows, one per length.
    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    /// Its calendar tallies, one per period and zone.
    pub fn tallies(&self) -> &[Tally] {
        &self.tallies
    }

    /// Counts `units` at `at_ms` in the windows of lengths `windows` and the tallies of
    /// `tallies` (each created empty when missing), whatever their room: units a store reserved
    /// for this counter and may have spent, charged back when it reads them again (a store that
    /// keeps counters on disk, after a crash). A window whose latest bucket is later than
    /// `at_ms` counts them there.
    pub fn charge(
        &mut self,
        windows: &[u32],
        tallies: &[(Period, ZoneId)],
        units: u64,
        at_ms: u64,
    ) {
        for &w in windows {
            let i = self.window(w);
            self.windows[i].check(at_ms, u64::MAX, 0);
            self.windows[i].count(units);
        }
        for &(period, zone) in tallies {
            let i = match self.tallies.iter().position(|t| t.is_for(period, zone)) {
                Some(i) => i,
                None => {
                    self.tallies.push(Tally::new(period, zone, at_ms));
                    self.tallies.len() - 1
                }
            };
            self.tallies[i].check(at_ms, u64::MAX, 0);
            self.tallies[i].count(units);
        }
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
        self.slots.in_flight()
    }

    /// This counter with `n` slots taken (read from a store).
    pub fn with_in_flight(mut self, n: u64) -> WindowSet {
        self.slots = Slots::taken(n);
        self
    }

    /// Frees up to `slots` slots of its concurrency limit: requests that ended.
    pub fn free(&mut self, slots: u64) {
        self.slots.free(slots);
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
                        set.slots.fits(l, cost)
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
                    set.slots.take(l, cost);
                }
                set.slots.quota(l, fit[i])
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
