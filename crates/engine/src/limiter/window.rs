//! window: one sliding window of `n` buckets, pure and exact.
//!
//! A window of `w` seconds is cut into buckets ([`buckets`]): one second each for `w = 60` (the
//! DynLimits layout), `w / 60` seconds for longer windows, 100 ms for shorter ones. Bucket `b` covers
//! the milliseconds `[start(b), start(b + 1))` with `start(b) = ceil(b * 1000 * w / n)`, so bucket
//! boundaries are the same for every instance and every store. At bucket `t` the window is the
//! buckets `[t - n + 1, t]`, and a request of cost `c` fits iff `sum + c <= limit`. This module has
//! no I/O and no clock: `now` (Unix milliseconds) is always an argument. The Redis script
//! (`store/window.lua`) computes the same answers; the store behaviour suite holds them equal.

use super::{Quota, WINDOW_SECONDS, ceil_seconds, period_bounds};

/// Buckets of a window of a minute or longer: the DynLimits window's one-second buckets, and as
/// many for longer windows, so that no window costs more to keep than a minute's.
pub const LONG_WINDOW_BUCKETS: u64 = 60;

/// Buckets per window of `w` seconds: [`LONG_WINDOW_BUCKETS`] for `w >= 60`, else one per 100 ms.
pub fn buckets(w: u32) -> u64 {
    if u64::from(w) >= WINDOW_SECONDS {
        LONG_WINDOW_BUCKETS
    } else {
        10 * u64::from(w)
    }
}

/// The bucket that holds millisecond `now_ms` in a window of `w` seconds.
pub fn bucket_of(w: u32, now_ms: u64) -> u64 {
    now_ms * buckets(w) / (1000 * u64::from(w))
}

/// The first millisecond of bucket `b` in a window of `w` seconds.
pub fn bucket_start(w: u32, b: u64) -> u64 {
    (b * 1000 * u64::from(w)).div_ceil(buckets(w))
}

/// What one window says about one request, before anything is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    /// The request fits (`sum + cost <= limit`).
    pub fits: bool,
    /// The window's sum at `now`, this request not counted.
    pub sum: u64,
    /// The oldest bucket holding a count, if any.
    pub oldest: Option<u64>,
    /// When it does not fit: the bucket whose leaving makes room (`None`: nothing can, the cost is
    /// above the limit).
    pub room_after: Option<u64>,
    /// The bucket of `now` (never earlier than the latest the window has seen).
    pub bucket: u64,
}

/// The buckets of one (counter, window length).
///
/// `counts[b % n]` holds the count of bucket `b` for the `n` buckets ending at `last`; buckets that
/// fall out of the window are zeroed as time moves on, so the ring never holds stale buckets.
///
/// The sum of the buckets and a lower bound of the oldest counted one are kept as they change:
/// a request then reads the bucket it counts in, not all of them (four cache lines a minute's
/// window, each request of a different key a cache miss). Both follow from `counts`, so two
/// windows are equal when their buckets are.
#[derive(Debug, Clone)]
pub struct Window {
    w: u32,
    counts: Box<[u32]>,
    last: u64,
    /// The sum of `counts`.
    sum: u64,
    /// No bucket of the window before this one holds a count.
    floor: u64,
}

impl PartialEq for Window {
    fn eq(&self, other: &Window) -> bool {
        (self.w, &self.counts, self.last) == (other.w, &other.counts, other.last)
    }
}

impl Eq for Window {}

impl Default for Window {
    fn default() -> Self {
        Self::new()
    }
}

impl Window {
    /// A DynLimits window: 60 one-second buckets.
    pub fn new() -> Self {
        Self::of_seconds(WINDOW_SECONDS as u32)
    }

    /// An empty window of `w` seconds (1 to 86400).
    pub fn of_seconds(w: u32) -> Self {
        let w = w.max(1);
        Window {
            w,
            counts: vec![0; buckets(w) as usize].into_boxed_slice(),
            last: 0,
            sum: 0,
            floor: 0,
        }
    }

    /// The window's length in seconds.
    pub fn seconds(&self) -> u32 {
        self.w
    }

    fn n(&self) -> u64 {
        self.counts.len() as u64
    }

    /// The latest bucket this window has seen.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// True when nothing counted is left in the window at `now_ms`, so the window can be forgotten
    /// without changing any future answer.
    pub fn is_idle(&self, now_ms: u64) -> bool {
        bucket_of(self.w, now_ms) >= self.last + self.n() || self.sum == 0
    }

    /// Moves the window to bucket `now`, zeroing buckets that left it. Time never runs backwards
    /// for a window: an earlier `now` is treated as the latest bucket seen.
    fn advance(&mut self, now: u64) -> u64 {
        if now <= self.last {
            return self.last;
        }
        let n = self.n();
        if now - self.last >= n || self.sum == 0 {
            if self.sum > 0 {
                self.counts.fill(0);
                self.sum = 0;
            }
        } else {
            for b in self.last + 1..=now {
                let slot = &mut self.counts[(b % n) as usize];
                self.sum -= u64::from(*slot);
                *slot = 0;
            }
        }
        self.last = now;
        now
    }

    /// The oldest bucket of the window ending at bucket `t` that holds a count, looked for from
    /// `floor` (remembered: the next request starts where this one found it). The ring read in
    /// order from the first bucket looked at, two slices and no division per bucket (a 64-bit
    /// `%` costs tens of cycles).
    fn oldest_counted(&mut self, t: u64) -> Option<u64> {
        let n = self.n();
        let from = self.floor.max((t + 1).saturating_sub(n));
        let (newer, older) = self.counts.split_at((from % n) as usize);
        let found = older
            .iter()
            .chain(newer)
            .take((t + 1 - from.min(t + 1)) as usize)
            .position(|&c| c > 0)
            .map(|i| from + i as u64);
        self.floor = found.unwrap_or(t + 1);
        found
    }

    fn count_at(&self, b: u64) -> u64 {
        u64::from(self.counts[(b % self.n()) as usize])
    }

    /// A window of `w` seconds holding `counts` (bucket, count) at bucket `now`; buckets outside
    /// the window are left out. For reading a window kept elsewhere (Redis' hashes).
    pub fn from_counts(w: u32, now: u64, counts: impl IntoIterator<Item = (u64, u32)>) -> Window {
        let mut win = Window::of_seconds(w);
        win.last = now;
        let n = win.n();
        for (b, c) in counts {
            if b <= now && b + n > now {
                let slot = &mut win.counts[(b % n) as usize];
                *slot = slot.saturating_add(c);
            }
        }
        win.sum = win.counts.iter().map(|&c| u64::from(c)).sum();
        win
    }

    /// The buckets holding a count, oldest first, as (bucket, count): what [`Window::from_counts`]
    /// takes back (a store that keeps windows on disk writes these).
    pub fn held(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        let n = self.n();
        let first = (self.last + 1).saturating_sub(n);
        (first..=self.last).filter_map(move |b| {
            let c = self.counts[(b % n) as usize];
            (c > 0).then_some((b, c))
        })
    }

    /// Brings the window to `now_ms` and says whether `cost` more fits under `limit`, counting
    /// nothing.
    pub fn check(&mut self, now_ms: u64, limit: u64, cost: u64) -> Check {
        let t = self.advance(bucket_of(self.w, now_ms));
        let sum = self.sum;
        debug_assert_eq!(sum, self.counts.iter().map(|&c| u64::from(c)).sum::<u64>());
        let oldest = match sum {
            0 => None,
            _ => self.oldest_counted(t),
        };
        let fits = sum + cost <= limit;
        let room_after = if fits || cost > limit {
            None
        } else {
            // Walk the oldest buckets out until `cost` fits. At `t + n` the window is empty and
            // the cost fits, so this always ends.
            let mut left = sum;
            let mut at = t;
            for b in oldest.unwrap_or(t)..=t {
                left -= self.count_at(b);
                if left + cost <= limit {
                    at = b;
                    break;
                }
            }
            Some(at)
        };
        Check {
            fits,
            sum,
            oldest,
            room_after,
            bucket: t,
        }
    }

    /// Milliseconds from `now_ms` until `units` more fit under `limit`, if nothing else is
    /// counted meanwhile: 0 when they fit now, `None` when they never can (above the limit).
    pub fn room_in_ms(&self, now_ms: u64, limit: u64, units: u64) -> Option<u64> {
        let mut probe = self.clone();
        let c = probe.check(now_ms, limit, units);
        if c.fits {
            return Some(0);
        }
        let now_ms = now_ms.max(bucket_start(self.w, c.bucket));
        c.room_after
            .map(|b| bucket_start(self.w, b + self.n()).saturating_sub(now_ms))
    }

    /// When the oldest count in the window at `now_ms` leaves it (Unix ms), if it holds any:
    /// until then nothing it holds can leave.
    pub fn oldest_exit_ms(&self, now_ms: u64) -> Option<u64> {
        let mut probe = self.clone();
        let c = probe.check(now_ms, u64::MAX, 0);
        c.oldest.map(|b| bucket_start(self.w, b + self.n()))
    }

    /// Takes up to `units` back from the bucket holding `at_ms`, if it is still in the window
    /// (never below what that bucket holds: what `window.lua` does with a lease given back).
    /// The units taken.
    pub fn give_back(&mut self, at_ms: u64, units: u64) -> u64 {
        let (b, n) = (bucket_of(self.w, at_ms), self.n());
        if b > self.last || b + n <= self.last {
            return 0;
        }
        let slot = &mut self.counts[(b % n) as usize];
        let taken = u64::from(*slot).min(units);
        *slot -= taken as u32;
        self.sum -= taken;
        taken
    }

    /// Counts `cost` in the bucket of the last [`Window::check`].
    pub fn count(&mut self, cost: u64) {
        let n = self.n();
        let slot = &mut self.counts[(self.last % n) as usize];
        let before = *slot;
        *slot = slot.saturating_add(u32::try_from(cost).unwrap_or(u32::MAX));
        self.sum += u64::from(*slot - before);
        self.floor = self.floor.min(self.last);
    }

    /// The quota `check` describes at `now_ms`, after `cost` was counted (`counted`) or not.
    pub fn quota(&self, c: &Check, now_ms: u64, limit: u64, cost: u64, counted: bool) -> Quota {
        let n = self.n();
        // A clock behind the window's is read as the window's own time.
        let now_ms = now_ms.max(bucket_start(self.w, c.bucket));
        let until = |b: u64| bucket_start(self.w, b + n) - now_ms;
        if !c.fits {
            let retry = c.room_after.map(|b| ceil_seconds(until(b)));
            return Quota {
                allowed: false,
                limit,
                remaining: 0,
                reset: retry.unwrap_or(u64::from(self.w)),
                retry_after: retry,
            };
        }
        if counted {
            let oldest = c.oldest.unwrap_or(c.bucket);
            return Quota {
                allowed: true,
                limit,
                remaining: limit - c.sum - cost,
                reset: ceil_seconds(until(oldest)),
                retry_after: None,
            };
        }
        Quota {
            allowed: true,
            limit,
            remaining: limit - c.sum,
            reset: c.oldest.map_or(0, |b| ceil_seconds(until(b))),
            retry_after: None,
        }
    }

    /// The state of `limit` at `now_ms` without counting anything: what is left, and whether one
    /// more request would pass, with `retry_after` when it would not. `reset` is when the oldest
    /// counted request leaves the window (0 when the window is empty).
    pub fn peek_ms(&self, now_ms: u64, limit: u64) -> Quota {
        if limit == 0 {
            return Quota::zero_limit();
        }
        let mut probe = self.clone();
        let c = probe.check(now_ms, limit, 1);
        probe.quota(&c, now_ms, limit, 1, false)
    }

    /// Checks one request (cost 1) at `now_ms` against `limit` and counts it if it fits.
    pub fn hit_ms(&mut self, now_ms: u64, limit: u64) -> Quota {
        if limit == 0 {
            return Quota::zero_limit();
        }
        let c = self.check(now_ms, limit, 1);
        if c.fits {
            self.count(1);
        }
        self.quota(&c, now_ms, limit, 1, c.fits)
    }

    /// [`Window::hit_ms`] at the start of second `now`.
    pub fn hit(&mut self, now: u64, limit: u64) -> Quota {
        self.hit_ms(now * 1000, limit)
    }

    /// [`Window::peek_ms`] at the start of second `now`.
    pub fn peek(&self, now: u64, limit: u64) -> Quota {
        self.peek_ms(now * 1000, limit)
    }
}

impl super::Limit {
    /// Whether a unit counted at `at_ms` still counts in this limit at `now_ms`: in the same
    /// calendar period, or in a bucket still inside a window of `w` (what a give-back may take
    /// from: [`Window::give_back`], [`Tally::give_back`](super::Tally::give_back)).
    pub fn still_counts(&self, at_ms: u64, now_ms: u64) -> bool {
        match self.period() {
            Some(p) => {
                let (start, end) = period_bounds(p, self.zone, now_ms);
                (start..end).contains(&at_ms)
            }
            None => bucket_of(self.w, at_ms) + buckets(self.w) > bucket_of(self.w, now_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_040; // second 0 of a minute

    fn hits(w: &mut Window, now: u64, limit: u64, n: usize) -> Vec<bool> {
        (0..n).map(|_| w.hit(now, limit).allowed).collect()
    }

    #[test]
    fn a_window_read_back_from_its_held_buckets_is_the_same() {
        for w in [1u32, 60, 3600] {
            let mut win = Window::of_seconds(w);
            let mut now_ms = 1_700_000_000_000u64;
            for i in 0..500u64 {
                now_ms += (i * 7919) % (u64::from(w) * 40 + 1);
                win.check(now_ms, u64::MAX, 0);
                win.count(1 + i % 3);
                let back = Window::from_counts(w, win.last(), win.held());
                assert_eq!(back, win, "w {w} at {now_ms}");
                assert_eq!(back.sum, win.sum);
            }
        }
    }

    #[test]
    fn bucket_geometry() {
        assert_eq!(
            (buckets(60), buckets(1), buckets(59), buckets(3600)),
            (60, 10, 590, 60)
        );
        assert_eq!(bucket_of(60, 61_999), 61);
        assert_eq!(bucket_of(1, 1_250), 12, "100 ms buckets");
        assert_eq!(bucket_of(3600, 3_599_999), 59, "one-minute buckets");
        // w = 90: buckets of 1.5 s; boundaries are exact milliseconds or rounded up.
        assert_eq!((bucket_start(90, 1), bucket_start(90, 2)), (1_500, 3_000));
        assert_eq!((bucket_of(90, 1_499), bucket_of(90, 1_500)), (0, 1));
        assert_eq!(bucket_start(7, 3), 300);
        // w = 61: 1016.67 ms buckets, starts rounded up, and consistent with bucket_of.
        for b in [1u64, 2, 3, 1_000_000] {
            let s = bucket_start(61, b);
            assert_eq!(bucket_of(61, s), b);
            assert_eq!(bucket_of(61, s - 1), b - 1);
        }
    }

    #[test]
    fn allows_up_to_the_limit_then_rejects() {
        let mut w = Window::new();
        assert_eq!(hits(&mut w, T0, 3, 3), vec![true, true, true]);
        let d = w.hit(T0, 3);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after, Some(60));
    }

    #[test]
    fn the_oldest_count_leaves_a_window_length_after_its_bucket_starts() {
        let mut w = Window::of_seconds(10);
        assert_eq!(w.oldest_exit_ms(5_000), None, "empty");
        w.hit_ms(5_050, 3);
        w.hit_ms(7_000, 3);
        // 100 ms buckets: the first count's bucket starts at 5,000 ms.
        assert_eq!(w.oldest_exit_ms(7_000), Some(15_000));
        assert_eq!(w.oldest_exit_ms(15_000), Some(17_000));
        assert_eq!(w.oldest_exit_ms(17_000), None);
    }

    #[test]
    fn remaining_counts_down_and_reset_points_at_the_oldest_hit() {
        let mut w = Window::new();
        let d = w.hit(T0, 5);
        assert_eq!((d.remaining, d.reset), (4, 60));
        let d = w.hit(T0 + 10, 5);
        assert_eq!((d.remaining, d.reset), (3, 50));
    }

    #[test]
    fn peek_tells_without_counting() {
        let mut w = Window::new();
        let p = w.peek(T0, 3);
        assert_eq!((p.remaining, p.reset, p.allowed), (3, 0, true));
        hits(&mut w, T0, 3, 2);
        let p = w.peek(T0 + 10, 3);
        assert_eq!((p.allowed, p.remaining, p.reset), (true, 1, 50));
        assert_eq!(
            w.peek(T0 + 10, 3),
            w.peek(T0 + 10, 3),
            "peeking counts nothing"
        );
        w.hit(T0 + 10, 3);
        let p = w.peek(T0 + 20, 3);
        assert_eq!(
            (p.allowed, p.remaining, p.retry_after),
            (false, 0, Some(40))
        );
        let copy = Window::from_counts(60, T0 + 20, [(T0, 2), (T0 + 10, 1), (T0 - 60, 9)]);
        assert_eq!(
            copy.peek(T0 + 20, 3),
            p,
            "a window rebuilt from its counts answers the same"
        );
    }

    #[test]
    fn zero_limit_rejects_without_counting() {
        let mut w = Window::new();
        assert_eq!(w.hit(T0, 0), Quota::zero_limit());
        assert!(w.is_idle(T0 * 1000));
    }

    #[test]
    fn window_is_exactly_sixty_seconds_across_a_minute_boundary() {
        let mut w = Window::new();
        assert!(w.hit(T0 + 30, 1).allowed);
        let d = w.hit(T0 + 89, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(1));
        assert!(w.hit(T0 + 90, 1).allowed);
    }

    #[test]
    fn retry_after_is_exact() {
        let mut w = Window::new();
        hits(&mut w, T0, 4, 2);
        w.hit(T0 + 20, 4);
        w.hit(T0 + 40, 4);
        let d = w.hit(T0 + 50, 4);
        assert_eq!((d.retry_after, d.reset), (Some(10), 10));
        assert!(
            !w.hit(T0 + 59, 4).allowed,
            "one second early must still be rejected"
        );
        assert!(
            w.hit(T0 + 60, 4).allowed,
            "after exactly retry_after it passes"
        );
    }

    #[test]
    fn retry_after_rounds_up_within_a_second() {
        // Rejected 300 ms into a second: the wait to the next second boundary rounds up to whole
        // seconds, so a retry after Retry-After always passes.
        let mut w = Window::new();
        w.hit_ms(T0 * 1000, 1);
        let d = w.hit_ms((T0 + 59) * 1000 + 300, 1);
        assert_eq!(d.retry_after, Some(1));
        assert!(w.hit_ms((T0 + 60) * 1000, 1).allowed);
    }

    #[test]
    fn rejected_requests_are_not_counted() {
        let mut w = Window::new();
        assert!(w.hit(T0, 1).allowed);
        for s in 1..60 {
            assert!(!w.hit(T0 + s, 1).allowed);
        }
        assert!(w.hit(T0 + 60, 1).allowed);
    }

    #[test]
    fn a_lowered_limit_applies_to_what_is_already_counted() {
        let mut w = Window::new();
        hits(&mut w, T0, 10, 5);
        let d = w.hit(T0 + 1, 3);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(59));
    }

    #[test]
    fn time_never_runs_backwards() {
        let mut w = Window::new();
        w.hit(T0 + 100, 2);
        let d = w.hit(T0, 2); // treated as T0 + 100
        assert!(d.allowed);
        assert_eq!(d.reset, 60);
        assert!(!w.hit(T0 + 100, 2).allowed);
    }

    #[test]
    fn gaps_longer_than_the_window_clear_it() {
        let mut w = Window::new();
        hits(&mut w, T0, 2, 2);
        assert!(!w.is_idle((T0 + 59) * 1000));
        assert!(w.is_idle((T0 + 60) * 1000));
        assert_eq!(hits(&mut w, T0 + 500, 2, 3), vec![true, true, false]);
    }

    #[test]
    fn small_unix_times_work() {
        let mut w = Window::new();
        assert!(w.hit(0, 1).allowed);
        assert_eq!(w.hit(5, 1).retry_after, Some(55));
        assert!(w.hit(60, 1).allowed);
    }

    #[test]
    fn one_second_window_has_100ms_precision() {
        let mut w = Window::of_seconds(1);
        let t = T0 * 1000;
        assert!(w.hit_ms(t + 250, 2).allowed);
        assert!(w.hit_ms(t + 700, 2).allowed);
        let d = w.hit_ms(t + 900, 2);
        assert!(!d.allowed);
        // The 250 ms hit is in bucket [200, 300): it leaves at 1200 ms, 300 ms from now: 1 s.
        assert_eq!(d.retry_after, Some(1));
        assert!(!w.hit_ms(t + 1_199, 2).allowed);
        assert!(w.hit_ms(t + 1_200, 2).allowed);
    }

    #[test]
    fn hour_window_uses_minute_buckets() {
        let mut w = Window::of_seconds(3600);
        let t = T0 * 1000; // a minute boundary
        assert!(w.hit_ms(t + 30_000, 1).allowed);
        let d = w.hit_ms(t + 3_599_999, 1);
        assert_eq!(
            d.retry_after,
            Some(1),
            "the first minute's bucket leaves at t + 3600 s"
        );
        assert!(w.hit_ms(t + 3_600_000, 1).allowed);
    }

    #[test]
    fn cost_uses_several_units_and_a_cost_above_the_limit_never_fits() {
        let mut w = Window::new();
        let c = w.check(T0 * 1000, 10, 4);
        assert!(c.fits);
        w.count(4);
        assert_eq!(w.quota(&c, T0 * 1000, 10, 4, true).remaining, 6);
        let c = w.check((T0 + 5) * 1000, 10, 7);
        assert!(!c.fits);
        assert_eq!(
            w.quota(&c, (T0 + 5) * 1000, 10, 7, false).retry_after,
            Some(55)
        );
        let c = w.check((T0 + 5) * 1000, 10, 11);
        assert_eq!((c.fits, c.room_after), (false, None));
        assert_eq!(
            w.quota(&c, (T0 + 5) * 1000, 10, 11, false).retry_after,
            None
        );
    }

    /// What the kept sum and oldest bucket stand for, recomputed from the buckets alone.
    fn scanned(w: &Window, t: u64) -> (u64, Option<u64>) {
        let n = w.n();
        let sum = w.counts.iter().map(|&c| u64::from(c)).sum();
        let oldest = ((t + 1).saturating_sub(n)..=t).find(|&b| w.count_at(b) > 0);
        (sum, oldest)
    }

    #[test]
    fn the_kept_sum_and_oldest_bucket_are_the_buckets_own() {
        // Counts, give-backs and checks at times that move a bucket, a few, or past the window,
        // for a window of 100 ms buckets and one of one-second buckets.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for secs in [1, 60] {
            let mut w = Window::of_seconds(secs);
            let mut now = T0 * 1000;
            for _ in 0..20_000 {
                now += [0, 1, 150, 1_000, 7_000, 70_000][next(6) as usize] * u64::from(secs) / 60;
                match next(4) {
                    0 => {
                        let at = now.saturating_sub(next(2) * 1000 * u64::from(secs));
                        w.give_back(at, next(3));
                    }
                    _ => {
                        let c = w.check(now, 50, 1 + next(3));
                        assert_eq!((c.sum, c.oldest), scanned(&w, c.bucket), "at {now}");
                        if c.fits {
                            w.count(1 + next(3));
                        }
                    }
                }
            }
        }
    }
}
