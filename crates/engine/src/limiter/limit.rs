//! limit: what one limit is ([`Limit`], of a [`Kind`]): its number, its window or period, whether
//! it is enforced; the constants every limit is held to.

use super::{Period, ZoneId, period_bounds};

/// The DynLimits window: 60 seconds of one-second buckets.
pub const WINDOW_SECONDS: u64 = 60;
/// Longest window a limit may have, in seconds (one day).
pub const MAX_WINDOW_SECONDS: u32 = 86_400;
/// Limits one key may have on one endpoint (one per window length).
pub const MAX_LIMITS: usize = 6;

/// The kind of window a limit counts in. Each kind's arithmetic lives once here (Rust) and once
/// in Lua (`window.lua` for sliding windows, `divvy.lua` for fixed ones); see
/// `docs/architecture.md` for adding one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Kind {
    /// The last `w` seconds, counted in buckets ([`Window`](super::Window)): DynLimits' window. Default.
    #[default]
    Sliding,
    /// `w` seconds from the window's first hit, holding the credit left ([`FixedWindow`](super::FixedWindow)):
    /// Divvy's.
    Fixed,
    /// `w` seconds aligned to Unix time, `[k w, (k + 1) w)`, holding the credit left
    /// ([`FixedWindow`](super::FixedWindow) over a [`Span`](super::Span)): envoyproxy/ratelimit's.
    Aligned,
    /// The hour, day, ISO week or month in the limit's `zone`, counted from zero at its start
    /// ([`Tally`](super::Tally)): a calendar quota. It has no `w`. Counted beside sliding windows (a day quota
    /// next to a per-second limit), by the same stores and in the same script.
    Calendar(Period),
    /// At most `rl` requests in flight at once: a slot is taken at admission and freed when the
    /// request ends ([`WindowSet::free`](super::WindowSet::free)). It has no `w`; a request takes one slot whatever its
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
    pub(super) const fn in_window_set(&self) -> bool {
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
}
