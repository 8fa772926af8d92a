//! coarse: the time as of the kernel's last tick, for what is measured in seconds.
//!
//! `Instant::now` and `SystemTime::now` read the CPU's time-stamp counter (~25 ns each on the
//! benchmark machine, docs/benchmarks/), and a proxied request read them about ten times. The
//! kernel also keeps a copy of both clocks updated at each tick (`CLOCK_*_COARSE`), read from
//! shared memory in ~5 ns, late by at most a tick (1 to 4 ms). nginx reads the time once per
//! event-loop turn for the same reason. Used where a tick cannot show: the `Date` field (whole
//! seconds) and how long an upstream connection has been idle (seconds). Request durations,
//! the limiter's clock and tokio's timers keep the precise clocks.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch, as of the last tick.
pub fn unix_seconds() -> u64 {
    read(Clock::Realtime).map_or_else(
        || {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        },
        |d| d.as_secs(),
    )
}

/// A monotonic instant as of the last tick: within a tick of `Instant::now()`, either side
/// (the coarse clock is mapped onto `Instant` through a pair of readings taken at first use),
/// and never going backwards.
pub fn instant() -> Instant {
    static ANCHOR: OnceLock<Option<(Instant, Duration)>> = OnceLock::new();
    let anchor = ANCHOR.get_or_init(|| read(Clock::Monotonic).map(|c| (Instant::now(), c)));
    match (anchor, read(Clock::Monotonic)) {
        (Some((at, coarse)), Some(now)) => *at + now.saturating_sub(*coarse),
        _ => Instant::now(),
    }
}

#[derive(Clone, Copy)]
enum Clock {
    Realtime,
    Monotonic,
}

#[cfg(target_os = "linux")]
fn read(clock: Clock) -> Option<Duration> {
    let id = match clock {
        Clock::Realtime => libc::CLOCK_REALTIME_COARSE,
        Clock::Monotonic => libc::CLOCK_MONOTONIC_COARSE,
    };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes the `timespec` it is handed and nothing else; `ts` lives
    // across the call.
    let ok = unsafe { libc::clock_gettime(id, &mut ts) } == 0;
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u32::try_from(ts.tv_nsec).ok()?;
    ok.then(|| Duration::new(secs, nanos))
}

/// Elsewhere the precise clocks are used.
#[cfg(not(target_os = "linux"))]
fn read(_: Clock) -> Option<Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coarse clocks stay within a few ticks of the precise ones (a tick is at most 10 ms
    /// on any Linux configuration; 50 ms leaves room for a descheduled test thread) and never go
    /// back.
    #[test]
    fn the_coarse_clocks_are_the_precise_ones_to_within_a_few_ticks() {
        let slack = Duration::from_millis(50);
        let mut last = instant();
        for _ in 0..1_000 {
            let (before, coarse, after) = (Instant::now(), instant(), Instant::now());
            assert!(coarse + slack >= before && coarse <= after + slack);
            assert!(coarse >= last, "never backwards");
            last = coarse;
        }
        let precise = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(unix_seconds().abs_diff(precise) <= 1);
    }
}
