//! limiter: the one question a request asks, pure and exact: may it pass its limits now?
//!
//! A request on an endpoint is checked against every [`Limit`] its key has there (10 per second
//! *and* 1000 per minute *and* 10,000 a month), each counted in a place of its kind. It passes only
//! if every enforced limit has room for its cost, and it is counted in all of them or in none.
//! Shadow limits are computed and counted as if enforced but never refuse. No I/O and no clock
//! here: `now` is always an argument. The memory store runs this code directly; the Redis scripts
//! (`window.lua`, `divvy.lua`) compute the same answers, and the store behaviour suite holds them
//! equal.
//!
//! This module only names its rooms' items. A limit ([`limit`]: [`Limit`], its [`Kind`]). Each
//! kind's arithmetic has a room of its own: the sliding window ([`window`]: [`Window`]), fixed and
//! aligned windows ([`fixed`]), calendar quotas ([`calendar`]: [`Tally`], in the periods of
//! [`period`]), concurrency slots ([`slots`]: [`Slots`]). Around them: a
//! request's limits ([`limits`]: [`Limits`], [`Shape`]), what a decision answers ([`outcome`]:
//! [`Quota`], [`Outcome`], [`Rate`]), one counter's places and the one decision across a
//! request's counters ([`set`]: [`WindowSet`], [`hit_parts`]), and when room comes for a request
//! waiting in line ([`room`]).

pub mod calendar;
pub mod fixed;
pub mod limit;
pub mod limits;
pub mod outcome;
pub mod period;
pub mod room;
pub mod set;
pub mod slots;
pub mod window;

pub use calendar::Tally;
pub use fixed::{FixedWindow, Span, fixed_outcome};
pub use limit::{Kind, Limit, MAX_LIMITS, MAX_WINDOW_SECONDS, WINDOW_SECONDS};
pub use limits::{Limits, Shape};
pub use outcome::{Outcome, Quota, Rate, ceil_seconds};
pub use period::{Period, ZoneId, period_bounds};
pub use room::{line_room_in_ms, room_in_ms};
pub use set::{WindowSet, hit_parts, peek_parts};
pub use slots::Slots;
pub use window::{Check, Window, bucket_of, bucket_start, buckets};

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
}
