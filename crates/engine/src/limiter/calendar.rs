//! calendar: a calendar quota's count ([`Tally`]): the units counted in the period (the hour,
//! day, ISO week or month of [`super::period`]) that holds the last time it was checked at.

use super::{Period, Quota, ZoneId, ceil_seconds, period_bounds};

/// The count of one calendar limit ([`super::Kind::Calendar`]) in the period holding the last
/// time it was checked at. A new period starts at zero; a clock that goes back into an earlier
/// period is read as the tally's own period (as a sliding window's clock never runs backwards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    period: Period,
    zone: ZoneId,
    /// The period's first instant and the next period's, Unix milliseconds.
    pub start_ms: u64,
    pub end_ms: u64,
    /// Units counted in it.
    pub count: u64,
}

impl Tally {
    /// An empty tally of `period` in `zone`, for the period holding `now_ms`.
    pub fn new(period: Period, zone: ZoneId, now_ms: u64) -> Tally {
        let (start_ms, end_ms) = period_bounds(period, zone, now_ms);
        Tally {
            period,
            zone,
            start_ms,
            end_ms,
            count: 0,
        }
    }

    /// A tally read from a store: `count` units in the period holding `now_ms`.
    pub fn holding(period: Period, zone: ZoneId, now_ms: u64, count: u64) -> Tally {
        Tally {
            count,
            ..Tally::new(period, zone, now_ms)
        }
    }

    /// The calendar period it counts in.
    pub fn period(&self) -> Period {
        self.period
    }

    /// The zone its periods lie in.
    pub fn zone(&self) -> ZoneId {
        self.zone
    }

    pub fn is_for(&self, period: Period, zone: ZoneId) -> bool {
        (self.period, self.zone) == (period, zone)
    }

    /// Counts for the same limit as `other` (of the same period and zone).
    pub fn same_as(&self, other: &Tally) -> bool {
        other.is_for(self.period, self.zone)
    }

    /// Moves to the period holding `now_ms` when that one is later; whether `cost` units fit in
    /// `limit` then.
    pub fn check(&mut self, now_ms: u64, limit: u64, cost: u64) -> bool {
        if now_ms >= self.end_ms {
            *self = Tally::new(self.period, self.zone, now_ms);
        }
        self.count.saturating_add(cost) <= limit
    }

    pub fn count(&mut self, cost: u64) {
        self.count = self.count.saturating_add(cost);
    }

    /// Takes up to `units` back, if they were counted in this period (at `at_ms`); the units
    /// taken.
    pub fn give_back(&mut self, at_ms: u64, units: u64) -> u64 {
        if !(self.start_ms..self.end_ms).contains(&at_ms) {
            return 0;
        }
        let taken = self.count.min(units);
        self.count -= taken;
        taken
    }

    /// Nothing counted in the period holding `now_ms`.
    pub fn is_idle(&self, now_ms: u64) -> bool {
        self.count == 0 || now_ms >= self.end_ms
    }

    /// Milliseconds from `now_ms` to the period's end (at least 1: it never ends now).
    pub fn ends_in_ms(&self, now_ms: u64) -> u64 {
        self.end_ms.saturating_sub(now_ms).max(1)
    }

    /// Milliseconds from `now_ms` until `units` more fit under a calendar limit of `rl` units a
    /// `period` in `zone`, whose tally (if it has one) is `tally`: 0 when they fit now, the
    /// period's end when they do not, `None` when they never can (above the limit). A tally of an
    /// earlier period holds nothing of the one holding `now_ms`.
    pub fn room_in_ms(
        tally: Option<&Tally>,
        (period, zone, rl): (Period, ZoneId, u64),
        units: u64,
        now_ms: u64,
    ) -> Option<u64> {
        let count = tally
            .filter(|t| (t.start_ms..t.end_ms).contains(&now_ms))
            .map_or(0, |t| t.count);
        match count.saturating_add(units) <= rl {
            true => Some(0),
            false if units > rl => None,
            false => Some(period_bounds(period, zone, now_ms).1.saturating_sub(now_ms)),
        }
    }

    /// The quota after the last [`Tally::check`] (`fits`) at `now_ms`, the request's `cost`
    /// counted or not. `reset` is the period's end whatever it holds (what a user of a calendar
    /// quota is told: when it starts again); a refusal waits for it.
    pub fn quota(&self, fits: bool, now_ms: u64, limit: u64) -> Quota {
        let reset = ceil_seconds(self.ends_in_ms(now_ms));
        Quota {
            allowed: fits,
            limit,
            remaining: if fits {
                limit.saturating_sub(self.count)
            } else {
                0
            },
            reset,
            retry_after: (!fits).then_some(reset),
        }
    }
}
