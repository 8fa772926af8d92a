//! limiter: the sliding-window arithmetic, pure and exact.
//!
//! A limit is "at most `limit` requests in any 60 consecutive one-second buckets". At second `t` the
//! window is the buckets `[t-59, t]` (DynLimits' layout: one counter per second, 60 of them). A request
//! is allowed iff `sum + 1 <= limit`; only allowed requests are counted. This module has no I/O and no
//! clock: `now` is always an argument. The memory store runs this code directly; the Redis script
//! (`store/window.lua`) computes the same answers, and the store behaviour suite holds them equal.

/// Length of the window in seconds (and number of one-second buckets).
pub const WINDOW_SECONDS: u64 = 60;
const SLOTS: usize = WINDOW_SECONDS as usize;

/// The state of one limit after checking one request against it: allowed or not, and what is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub allowed: bool,
    /// The limit the request was checked against (requests per 60 s).
    pub limit: u64,
    /// Requests still allowed in the current window after this one.
    pub remaining: u64,
    /// Seconds until more quota is available. Rejected: the wait after which the same request passes
    /// (equal to `retry_after`). Allowed: until the oldest counted request leaves the window.
    pub reset: u64,
    /// Set on rejections that waiting can cure (every limit above zero): the exact number of seconds
    /// after which the same request passes if nothing else is sent, and before which it does not.
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

/// The 60 one-second buckets of one (API key, endpoint) counter.
///
/// `counts[s % 60]` holds the count of second `s` for the 60 seconds ending at `last`; buckets that
/// fall out of the window are zeroed as time moves on, so the ring never holds stale seconds.
#[derive(Debug, Clone)]
pub struct Window {
    counts: [u32; SLOTS],
    last: u64,
}

impl Default for Window {
    fn default() -> Self {
        Self::new()
    }
}

impl Window {
    pub fn new() -> Self {
        Window {
            counts: [0; SLOTS],
            last: 0,
        }
    }

    /// The latest second this window has seen.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// True when nothing counted is left in the window at `now`, so the window can be forgotten
    /// without changing any future answer.
    pub fn is_idle(&self, now: u64) -> bool {
        now >= self.last + WINDOW_SECONDS || self.counts.iter().all(|&c| c == 0)
    }

    /// Moves the window to `now`, zeroing buckets that left it. Time never runs backwards for a
    /// window: an earlier `now` is treated as the latest second seen.
    fn advance(&mut self, now: u64) -> u64 {
        if now <= self.last {
            return self.last;
        }
        let gap = now - self.last;
        if gap >= WINDOW_SECONDS {
            self.counts = [0; SLOTS];
        } else {
            for s in self.last + 1..=now {
                self.counts[(s % WINDOW_SECONDS) as usize] = 0;
            }
        }
        self.last = now;
        now
    }

    fn count_at(&self, s: u64) -> u64 {
        u64::from(self.counts[(s % WINDOW_SECONDS) as usize])
    }

    /// A window holding `counts` (absolute second, count); seconds outside the 60 ending at `now`
    /// are left out. For reading a window kept elsewhere (Redis' minute hashes).
    pub fn from_counts(now: u64, counts: impl IntoIterator<Item = (u64, u32)>) -> Window {
        let mut w = Window {
            counts: [0; SLOTS],
            last: now,
        };
        for (s, n) in counts {
            if s <= now && s + WINDOW_SECONDS > now {
                let slot = &mut w.counts[(s % WINDOW_SECONDS) as usize];
                *slot = slot.saturating_add(n);
            }
        }
        w
    }

    /// The state of `limit` at `now` without counting anything: what is left, and whether the next
    /// request would pass (`allowed`), with `retry_after` when it would not. `reset` is when the
    /// oldest counted request leaves the window (0 when the window is empty).
    pub fn peek(&self, now: u64, limit: u64) -> Quota {
        let mut probe = self.clone();
        let q = probe.hit(now, limit);
        if !q.allowed {
            return q;
        }
        let empty = q.remaining + 1 == limit;
        Quota {
            remaining: q.remaining + 1,
            reset: if empty { 0 } else { q.reset },
            ..q
        }
    }

    /// Checks one request at `now` against `limit` and counts it if allowed.
    pub fn hit(&mut self, now: u64, limit: u64) -> Quota {
        if limit == 0 {
            return Quota::zero_limit();
        }
        let t = self.advance(now);
        let first = t.saturating_sub(WINDOW_SECONDS - 1);
        let sum: u64 = self.counts.iter().map(|&c| u64::from(c)).sum();
        let oldest = (first..=t).find(|&s| self.count_at(s) > 0);

        if sum + 1 > limit {
            // Walk the oldest buckets out of the window until one more request fits. A bucket for
            // second `s` leaves the window at `s + 60`; at `t + 60` the window is empty and any
            // limit above zero fits, so this always ends within 60 seconds.
            let mut left = sum;
            let mut retry = WINDOW_SECONDS;
            for s in oldest.unwrap_or(t)..=t {
                left -= self.count_at(s);
                if left < limit {
                    retry = s + WINDOW_SECONDS - t;
                    break;
                }
            }
            return Quota {
                allowed: false,
                limit,
                remaining: 0,
                reset: retry,
                retry_after: Some(retry),
            };
        }

        let slot = &mut self.counts[(t % WINDOW_SECONDS) as usize];
        *slot = slot.saturating_add(1);
        let oldest = oldest.unwrap_or(t);
        Quota {
            allowed: true,
            limit,
            remaining: limit - sum - 1,
            reset: oldest + WINDOW_SECONDS - t,
            retry_after: None,
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
    fn allows_up_to_the_limit_then_rejects() {
        let mut w = Window::new();
        assert_eq!(hits(&mut w, T0, 3, 3), vec![true, true, true]);
        let d = w.hit(T0, 3);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after, Some(60));
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
        assert_eq!(
            (
                w.peek(T0, 3).remaining,
                w.peek(T0, 3).reset,
                w.peek(T0, 3).allowed
            ),
            (3, 0, true)
        );
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
        let copy = Window::from_counts(T0 + 20, [(T0, 2), (T0 + 10, 1), (T0 - 60, 9)]);
        assert_eq!(
            copy.peek(T0 + 20, 3),
            p,
            "a window rebuilt from its counts answers the same"
        );
    }

    #[test]
    fn zero_limit_rejects_without_counting() {
        let mut w = Window::new();
        let d = w.hit(T0, 0);
        assert_eq!(d, Quota::zero_limit());
        assert!(w.is_idle(T0));
    }

    #[test]
    fn window_is_exactly_sixty_seconds_across_a_minute_boundary() {
        // One hit at second 30 of a minute; it counts until second 29 of the next minute inclusive.
        let mut w = Window::new();
        assert!(w.hit(T0 + 30, 1).allowed);
        let d = w.hit(T0 + 89, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(1));
        assert!(w.hit(T0 + 90, 1).allowed);
    }

    #[test]
    fn retry_after_is_exact() {
        // limit 4: hits at t0 (2), t0+20 (1), t0+40 (1). At t0+50 one more needs the two t0 hits gone.
        let mut w = Window::new();
        hits(&mut w, T0, 4, 2);
        w.hit(T0 + 20, 4);
        w.hit(T0 + 40, 4);
        let d = w.hit(T0 + 50, 4);
        assert_eq!(d.retry_after, Some(10));
        assert_eq!(d.reset, 10);
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
        assert_eq!(d.remaining, 0);
        // 5 hits at T0 must all leave before a limit of 3 fits one more.
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
        assert!(!w.is_idle(T0 + 59));
        assert!(w.is_idle(T0 + 60));
        assert_eq!(hits(&mut w, T0 + 500, 2, 3), vec![true, true, false]);
    }

    #[test]
    fn small_unix_times_work() {
        let mut w = Window::new();
        assert!(w.hit(0, 1).allowed);
        assert_eq!(w.hit(5, 1).retry_after, Some(55));
        assert!(w.hit(60, 1).allowed);
    }
}
