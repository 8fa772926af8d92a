//! slots: a concurrency limit's arithmetic: requests in flight at once, each holding
//! [`Limit::units`] slots from its admission until it ends (`Kind::Concurrent`). A slot is not a
//! rate: it frees when its request ends, not with time, so it has no window and no wait.

use super::{Limit, Quota};

/// Slots of a counter's concurrency limit taken and not yet freed (one such limit per counter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slots(u64);

impl Slots {
    /// `n` slots taken (read from a store).
    pub const fn taken(n: u64) -> Slots {
        Slots(n)
    }

    /// Slots taken now.
    pub const fn in_flight(self) -> u64 {
        self.0
    }

    /// Whether one more request of `cost` fits under `l`.
    pub fn fits(self, l: &Limit, cost: u64) -> bool {
        self.0.saturating_add(l.units(cost)) <= l.rl
    }

    /// Takes the slots of one more request of `cost` under `l`.
    pub fn take(&mut self, l: &Limit, cost: u64) {
        self.0 = self.0.saturating_add(l.units(cost));
    }

    /// Frees up to `n` slots: requests that ended.
    pub fn free(&mut self, n: u64) {
        self.0 -= self.0.min(n);
    }

    /// What `l` answers after a request that `fit` (and was taken, if it was counted): the slots
    /// left, and no wait (a slot frees when a request ends, which no clock tells).
    pub fn quota(self, l: &Limit, fit: bool) -> Quota {
        Quota {
            allowed: fit,
            limit: l.rl,
            remaining: if fit { l.rl.saturating_sub(self.0) } else { 0 },
            reset: 0,
            retry_after: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_by_cost_and_freed_never_below_none() {
        let l = Limit::concurrent(3);
        let mut s = Slots::default();
        assert!(s.fits(&l, 1));
        s.take(&l, 1);
        s.take(&l, 1);
        assert_eq!(s.quota(&l, true).remaining, 1);
        s.take(&l, 1);
        assert!(!s.fits(&l, 1));
        assert_eq!(s.quota(&l, false).remaining, 0);
        s.free(5);
        assert_eq!(s.in_flight(), 0);
    }
}
