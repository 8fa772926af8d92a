//! balance: which target gets a request, and when a target is in or out. Pure: the time is an
//! argument (milliseconds on any monotonic clock), the random numbers are given.
//!
//! Passive health: `eject_after` consecutive connect failures or timeouts take a target out for
//! `eject`, doubling per ejection in a row up to [`MAX_EJECT`]. When that time is up the target gets
//! one trial request; its success brings it back, its failure takes it out again (for twice as
//! long). Active health (a failed check) takes it out until a check passes. When every target is
//! out, the pick goes over all of them: the gateway never causes a total outage by itself.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::settings::MAX_EJECT;
use crate::config::Balance;

/// A target's health, shared by every worker.
#[derive(Debug, Default)]
pub struct Health {
    /// Connect failures and timeouts in a row.
    failures: AtomicU32,
    /// Ejections in a row (the next lasts `eject << ejections`).
    ejections: AtomicU32,
    /// Out until this time (ms); 0: in.
    out_until: AtomicU64,
    /// Its time out over, its trial request is under way until this time (ms; 0: none). A trial
    /// whose request vanished (the client went away) leaves room for another after it.
    trial_until: AtomicU64,
    /// The last active check failed.
    check_failed: AtomicBool,
}

/// Where a target stands for the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    In,
    Out,
    /// Its time out is over: the next request is its trial.
    Trial,
}

/// What a recorded failure did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// Counted; the target stays in.
    Counted { in_a_row: u32 },
    /// The target is now out for this long.
    Ejected(Duration),
}

/// What a recorded success did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Succeeded {
    /// Nothing changed.
    Same,
    /// The target was out (its trial passed): it is in again.
    Back,
}

impl Health {
    pub fn standing(&self, now_ms: u64) -> Standing {
        if self.check_failed.load(Ordering::Relaxed) {
            return Standing::Out;
        }
        match self.out_until.load(Ordering::Relaxed) {
            0 => Standing::In,
            until if now_ms < until || now_ms < self.trial_until.load(Ordering::Relaxed) => {
                Standing::Out
            }
            _ => Standing::Trial,
        }
    }

    /// Is the target in (for metrics and `/status`)? A target waiting for its trial is not.
    pub fn is_in(&self) -> bool {
        !self.check_failed.load(Ordering::Relaxed) && self.out_until.load(Ordering::Relaxed) == 0
    }

    /// Claims the trial of a target in [`Standing::Trial`] for `ttl` (the longest a request may
    /// take): true for exactly one caller until the trial ends or its time passes.
    pub fn claim_trial(&self, now_ms: u64, ttl: Duration) -> bool {
        let current = self.trial_until.load(Ordering::Relaxed);
        if now_ms < current {
            return false;
        }
        let until = now_ms.saturating_add(ttl.as_millis() as u64).max(1);
        self.trial_until
            .compare_exchange(current, until, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// A request got through to the target (a response, of any status).
    pub fn success(&self) -> Succeeded {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.out_until.load(Ordering::Relaxed) == 0 {
            return Succeeded::Same;
        }
        self.ejections.store(0, Ordering::Relaxed);
        self.out_until.store(0, Ordering::Relaxed);
        self.trial_until.store(0, Ordering::Release);
        Succeeded::Back
    }

    /// A connect failure or a timeout at `now_ms`; `eject_after` 0 never takes it out.
    pub fn failure(&self, now_ms: u64, eject_after: u32, eject: Duration) -> Failed {
        let in_a_row = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        // While out, failures of requests sent before (or sent because every target is out) are
        // counted only: the time out doubles per failed trial, not per failure.
        let out_until = self.out_until.load(Ordering::Relaxed);
        let out = out_until != 0;
        if eject_after == 0 || (out && now_ms < out_until) || (!out && in_a_row < eject_after) {
            return Failed::Counted { in_a_row };
        }
        let n = self.ejections.fetch_add(1, Ordering::Relaxed).min(16);
        let out = eject.saturating_mul(1 << n).min(MAX_EJECT);
        self.out_until.store(
            now_ms.saturating_add(out.as_millis() as u64).max(1),
            Ordering::Relaxed,
        );
        self.trial_until.store(0, Ordering::Release);
        Failed::Ejected(out)
    }

    /// The result of an active check; true when it changed whether the target is in.
    pub fn checked(&self, passed: bool) -> bool {
        self.check_failed.swap(!passed, Ordering::Relaxed) == passed
    }
}

/// What the pick needs to know of the targets.
pub trait Targets {
    fn count(&self) -> usize;
    fn standing(&self, i: usize) -> Standing;
    /// Claims target `i`'s trial (see [`Health::claim_trial`]).
    fn claim(&self, i: usize) -> bool;
    /// Its requests in flight.
    fn busy(&self, i: usize) -> usize;
}

/// Picks a target for a request. `skip`: one already tried; `turn` counts requests (round robin);
/// `random(k)` gives independent numbers below `k`. A target due for its trial, if this request
/// wins the claim, goes first.
pub fn pick(
    t: &impl Targets,
    balance: Balance,
    skip: Option<usize>,
    turn: usize,
    mut random: impl FnMut(usize) -> usize,
) -> usize {
    let n = t.count();
    if n <= 1 {
        return 0;
    }
    let eligible = |i: usize| Some(i) != skip;
    let mut ins = 0;
    for i in (0..n).filter(|&i| eligible(i)) {
        match t.standing(i) {
            Standing::Trial if t.claim(i) => return i,
            Standing::In => ins += 1,
            _ => {}
        }
    }
    // Nothing in: every target but the skipped one (or that one, when it is the only one).
    let usable = |i: usize| eligible(i) && (ins == 0 || t.standing(i) == Standing::In);
    let count = if ins == 0 {
        n - usize::from(skip.is_some())
    } else {
        ins
    };
    if count == 0 {
        return skip.unwrap_or(0);
    }
    let nth = |k: usize| (0..n).filter(|&i| usable(i)).nth(k).unwrap_or(0);
    match balance {
        Balance::RoundRobin => nth(turn % count),
        Balance::LeastRequests if count == 1 => nth(0),
        Balance::LeastRequests => {
            let a = random(count);
            let mut b = random(count - 1);
            if b >= a {
                b += 1;
            }
            let (a, b) = (nth(a), nth(b));
            if t.busy(b) < t.busy(a) { b } else { a }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EJECT: Duration = Duration::from_secs(10);
    const TTL: Duration = Duration::from_secs(30);

    #[test]
    fn failures_while_out_do_not_double_the_time_out() {
        let h = Health::default();
        for _ in 0..3 {
            h.failure(0, 3, EJECT);
        }
        for t in [1, 5_000, 9_999] {
            assert!(
                matches!(h.failure(t, 3, EJECT), Failed::Counted { .. }),
                "requests sent before it went out fail too"
            );
        }
        assert_eq!(h.standing(10_000), Standing::Trial, "still 10 s, not 80");
        assert!(h.claim_trial(10_000, TTL));
        assert_eq!(
            h.failure(10_500, 3, EJECT),
            Failed::Ejected(EJECT * 2),
            "a failed trial: out again, twice as long"
        );
    }

    #[test]
    fn a_trial_whose_request_vanished_makes_room_for_another() {
        let h = Health::default();
        for _ in 0..3 {
            h.failure(0, 3, EJECT);
        }
        assert!(h.claim_trial(10_000, TTL));
        assert_eq!(h.standing(39_999), Standing::Out);
        assert_eq!(h.standing(40_000), Standing::Trial);
        assert!(h.claim_trial(40_000, TTL));
    }

    #[test]
    fn a_target_goes_out_after_failures_in_a_row_and_back_after_one_trial() {
        let h = Health::default();
        assert_eq!(h.failure(0, 3, EJECT), Failed::Counted { in_a_row: 1 });
        assert_eq!(h.success(), Succeeded::Same, "a success resets the count");
        assert_eq!(h.failure(0, 3, EJECT), Failed::Counted { in_a_row: 1 });
        assert_eq!(h.failure(0, 3, EJECT), Failed::Counted { in_a_row: 2 });
        assert_eq!(h.standing(0), Standing::In);
        assert_eq!(h.failure(1_000, 3, EJECT), Failed::Ejected(EJECT));
        assert_eq!(h.standing(1_000), Standing::Out);
        assert_eq!(h.standing(10_999), Standing::Out);
        assert!(!h.is_in());
        assert_eq!(h.standing(11_000), Standing::Trial);
        assert!(h.claim_trial(11_000, TTL));
        assert!(!h.claim_trial(11_000, TTL), "one trial at a time");
        assert_eq!(h.standing(11_000), Standing::Out, "while its trial is out");
        assert_eq!(h.success(), Succeeded::Back);
        assert_eq!(h.standing(11_000), Standing::In);
        assert!(h.is_in());
    }

    #[test]
    fn a_failed_trial_doubles_the_time_out_up_to_five_minutes() {
        let h = Health::default();
        let mut now = 0;
        let mut outs = Vec::new();
        for _ in 0..3 {
            h.failure(now, 3, EJECT);
        }
        outs.push(h.out_until.load(Ordering::Relaxed) - now);
        for _ in 0..7 {
            now = h.out_until.load(Ordering::Relaxed);
            assert_eq!(h.standing(now), Standing::Trial);
            assert!(h.claim_trial(now, TTL));
            match h.failure(now, 3, EJECT) {
                Failed::Ejected(d) => outs.push(d.as_millis() as u64),
                other => panic!("a failed trial ejects at once: {other:?}"),
            }
        }
        assert_eq!(
            outs,
            [
                10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000, 300_000
            ]
        );
        h.success();
        assert_eq!(
            (0..3).map(|_| h.failure(now, 3, EJECT)).last(),
            Some(Failed::Ejected(EJECT)),
            "after a success the doubling starts over"
        );
    }

    #[test]
    fn eject_after_zero_never_takes_a_target_out() {
        let h = Health::default();
        for _ in 0..100 {
            h.failure(0, 0, EJECT);
        }
        assert_eq!(h.standing(0), Standing::In);
    }

    #[test]
    fn active_checks_take_a_target_out_until_one_passes() {
        let h = Health::default();
        assert!(h.checked(false));
        assert!(!h.checked(false), "no change");
        assert_eq!(h.standing(0), Standing::Out);
        assert!(h.checked(true));
        assert_eq!(h.standing(0), Standing::In);
    }

    /// Targets described by their standings and in-flight counts; `trials` claims left.
    struct Fixed {
        standing: &'static [Standing],
        busy: &'static [usize],
        trials: std::cell::Cell<usize>,
    }

    impl Targets for Fixed {
        fn count(&self) -> usize {
            self.standing.len()
        }
        fn standing(&self, i: usize) -> Standing {
            self.standing[i]
        }
        fn claim(&self, _: usize) -> bool {
            let left = self.trials.get();
            self.trials.set(left.saturating_sub(1));
            left > 0
        }
        fn busy(&self, i: usize) -> usize {
            self.busy.get(i).copied().unwrap_or(0)
        }
    }

    fn fixed(standing: &'static [Standing]) -> Fixed {
        Fixed {
            standing,
            busy: &[],
            trials: std::cell::Cell::new(0),
        }
    }

    #[test]
    fn round_robin_takes_the_targets_in_turn_skipping_those_out() {
        use Standing::*;
        let rr = |s: &'static [Standing], turn, skip| {
            pick(&fixed(s), Balance::RoundRobin, skip, turn, |_| 0)
        };
        let got: Vec<usize> = (0..6).map(|t| rr(&[In, In, In], t, None)).collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2]);
        let got: Vec<usize> = (0..4).map(|t| rr(&[In, Out, In], t, None)).collect();
        assert_eq!(got, [0, 2, 0, 2]);
        assert_eq!(rr(&[In, Out, In], 0, Some(0)), 2, "a retry goes elsewhere");
        let got: Vec<usize> = (0..3).map(|t| rr(&[Out, Out, Out], t, None)).collect();
        assert_eq!(got, [0, 1, 2], "all out: all tried anyway");
        assert_eq!(rr(&[Out, Out], 0, Some(0)), 1);
        assert_eq!(rr(&[In, Out], 0, Some(0)), 1, "the one left, though out");
        assert_eq!(rr(&[In], 5, Some(0)), 0, "a single target is always it");
    }

    #[test]
    fn a_due_trial_goes_first_and_only_once() {
        use Standing::*;
        let t = Fixed {
            standing: &[In, Trial],
            busy: &[],
            trials: std::cell::Cell::new(1),
        };
        assert_eq!(pick(&t, Balance::RoundRobin, None, 0, |_| 0), 1);
        assert_eq!(pick(&t, Balance::RoundRobin, None, 0, |_| 0), 0, "taken");
    }

    #[test]
    fn least_requests_takes_the_less_busy_of_two() {
        use Standing::*;
        let t = Fixed {
            standing: &[In, In, In],
            busy: &[5, 1, 3],
            trials: std::cell::Cell::new(0),
        };
        // Draws (0, 1 -> 2): targets 0 and 2, 2 is less busy. Draws (2, 0): targets 2 and 0.
        let mut numbers = vec![0, 1, 2, 0].into_iter();
        let mut random = |_: usize| numbers.next().unwrap();
        assert_eq!(pick(&t, Balance::LeastRequests, None, 0, &mut random), 2);
        assert_eq!(pick(&t, Balance::LeastRequests, None, 0, &mut random), 2);
        let t = Fixed {
            standing: &[In, Out, In],
            busy: &[0, 0, 9],
            trials: std::cell::Cell::new(0),
        };
        assert_eq!(
            pick(&t, Balance::LeastRequests, Some(0), 0, |_| 0),
            2,
            "one candidate left"
        );
    }
}
