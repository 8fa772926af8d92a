//! outcome: what a decision answers: each limit's [`Quota`], the request's [`Outcome`], and the
//! [`Rate`] an answer's rate-limit fields are written from.

use super::{Kind, Limit, Limits, MAX_LIMITS, WINDOW_SECONDS, period_bounds};

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

/// Milliseconds to whole seconds, rounded up: a wait is never reported shorter than it is.
pub fn ceil_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

impl Limit {
    /// The quota of a sliding or calendar limit for a request it can never pass (its cost is
    /// above the limit): refused for good, reset at the window's length or the period's end.
    pub(super) fn never(&self, now_ms: u64) -> Quota {
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
}
