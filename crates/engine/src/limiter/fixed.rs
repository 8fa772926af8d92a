//! fixed: the arithmetic of fixed windows ([`Kind::Fixed`], from the first hit: Divvy's;
//! [`Kind::Aligned`], on the clock: envoyproxy/ratelimit's). A fixed window holds the credit left
//! until it ends; a hit takes its cost only when all of it fits. `divvy.lua` is the same rule in
//! Lua, on Divvy's key layout, and the store behaviour suite holds the two equal.

use super::{Kind, Limit, Outcome, Quota};

/// Where a fixed window lies at a moment: which one it is and how long it lasts when it starts
/// then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// An aligned window's number: it covers Unix seconds `[index w, (index + 1) w)`. `None` for a
    /// window that starts at its first hit (one per counter at a time).
    pub index: Option<u64>,
    /// Seconds from now to the end of a window started now (at least 1).
    pub seconds: u64,
}

impl Span {
    /// The window of `l` holding Unix millisecond `now_ms`.
    pub fn of(l: &Limit, now_ms: u64) -> Span {
        let w = u64::from(l.w.max(1));
        match l.kind {
            Kind::Aligned => {
                let now = now_ms / 1000;
                let index = now / w;
                Span {
                    index: Some(index),
                    seconds: (index + 1) * w - now,
                }
            }
            Kind::Sliding | Kind::Fixed | Kind::Calendar(_) | Kind::Concurrent => Span {
                index: None,
                seconds: w,
            },
        }
    }
}

/// One fixed window: the credit left, until Unix second `expires`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    pub credit: u64,
    pub expires: u64,
}

impl FixedWindow {
    /// One hit of `cost` units (0: a check) at Unix second `now` on `window` (`None`, or one that
    /// ended: there is none yet) of `limit` units lasting `seconds` from its first hit. Returns
    /// whether it was allowed, the credit left and the seconds until the window ends. A hit
    /// without room takes nothing; one that can never fit starts no window.
    pub fn hit(
        window: &mut Option<FixedWindow>,
        limit: u64,
        seconds: u64,
        cost: u64,
        now: u64,
    ) -> (bool, u64, u64) {
        match window.as_mut().filter(|w| now < w.expires) {
            Some(w) if w.credit >= cost => {
                w.credit -= cost;
                (true, w.credit, w.expires - now)
            }
            Some(w) => (false, w.credit, w.expires - now),
            None if cost > limit => (false, limit, seconds),
            None => {
                *window = Some(FixedWindow {
                    credit: limit - cost,
                    expires: now + seconds,
                });
                (true, limit - cost, seconds)
            }
        }
    }
}

/// The outcome of a fixed window's answer for a request of `cost` on `l`: `allowed`, the
/// `credit` left and `ttl`, the seconds until the window ends as Redis' `TTL` tells them (rounded
/// to the nearest, so 0 for a window about to end). An aligned window's end is on the clock: it
/// is never reported as now. A refusal that waiting can cure (the cost is within the limit) is
/// retried at the window's end.
pub fn fixed_outcome(l: &Limit, cost: u64, allowed: bool, credit: u64, ttl: i64) -> Outcome {
    let ttl = u64::try_from(ttl).unwrap_or(0);
    let reset = match l.kind {
        Kind::Aligned => ttl.max(1),
        Kind::Sliding | Kind::Fixed | Kind::Calendar(_) | Kind::Concurrent => ttl,
    };
    let q = Quota {
        allowed,
        limit: l.rl,
        remaining: credit,
        reset,
        retry_after: (!allowed && cost <= l.rl).then_some(reset.max(1)),
    };
    let passes = allowed || l.shadow;
    Outcome::new(passes, passes && !allowed, &[q])
}

impl Limit {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_starts_at_its_first_hit_and_takes_a_cost_only_when_it_fits() {
        let mut w = None;
        let hit = |w: &mut Option<FixedWindow>, cost, now| FixedWindow::hit(w, 5, 10, cost, now);
        assert_eq!(hit(&mut w, 6, 100), (false, 5, 10), "never fits");
        assert_eq!(w, None, "and starts nothing");
        assert_eq!(hit(&mut w, 3, 100), (true, 2, 10));
        assert_eq!(hit(&mut w, 3, 101), (false, 2, 9), "refused, nothing taken");
        assert_eq!(hit(&mut w, 0, 102), (true, 2, 8), "a check");
        assert_eq!(hit(&mut w, 2, 103), (true, 0, 7));
        assert_eq!(hit(&mut w, 1, 109), (false, 0, 1));
        assert_eq!(hit(&mut w, 1, 110), (true, 4, 10), "a fresh window");
    }

    #[test]
    fn aligned_windows_lie_on_the_clock() {
        let l = Limit::aligned(5, 60);
        assert_eq!(
            Span::of(&l, 1_700_000_039_999),
            Span {
                index: Some(28_333_333),
                seconds: 1
            }
        );
        assert_eq!(Span::of(&l, 1_700_000_040_000).seconds, 60);
        assert_eq!(Span::of(&Limit::fixed(5, 60), 7).index, None);
    }

    #[test]
    fn outcomes_report_the_window_end_and_shadow_refusals() {
        let q = |o: Outcome| (o.allowed, o.shadow_limited, o.quotas()[0]);
        let (allowed, shadow_limited, got) =
            q(fixed_outcome(&Limit::aligned(5, 60), 2, false, 1, 0));
        assert_eq!((allowed, shadow_limited), (false, false));
        assert_eq!((got.reset, got.retry_after), (1, Some(1)), "never now");
        let got = q(fixed_outcome(&Limit::fixed(5, 60), 6, false, 5, 0)).2;
        assert_eq!((got.reset, got.retry_after), (0, None), "never fits");
        let (allowed, shadow_limited, _) = q(fixed_outcome(
            &Limit::aligned(5, 60).shadowed(true),
            2,
            false,
            1,
            30,
        ));
        assert_eq!((allowed, shadow_limited), (true, true));
        // An aligned window of 0 admits checks only, with no store.
        let o = Limit::aligned(0, 60).alone(0, 1_700_000_050_000).unwrap();
        assert_eq!((o.allowed, o.quotas()[0].reset), (true, 50));
        assert!(!Limit::aligned(0, 60).alone(1, 0).unwrap().allowed);
        assert!(Limit::aligned(1, 60).alone(1, 0).is_none());
        // Divvy's rules of 0 credit (never, no reset) and of 0 seconds (always, no window).
        let never = Limit::fixed(0, 60).alone(1, 0).unwrap();
        assert!(!never.allowed && never.quotas()[0].retry_after.is_none());
        let always = Limit::fixed(5, 0).alone(1, 0).unwrap();
        assert_eq!((always.allowed, always.quotas()[0].remaining), (true, 5));
        assert!(Limit::fixed(5, 60).alone(1, 0).is_none());
    }
}
