//! clock: where "now" comes from.
//!
//! The limiter never reads the time itself; it is handed `now` (Unix milliseconds). Production uses
//! [`SystemClock`], tests use [`FakeClock`] and move time forward by hand, so no test has to sleep.
//! (Pattern from governor's `Clock`/`FakeRelativeClock`.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of Unix time.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Milliseconds since the Unix epoch at `at`, an instant the caller read for a use of its own
    /// (a duration it measures), so that one request reads the host's clock once for both. A
    /// clock moved by hand has its own time and ignores `at`.
    fn now_ms_at(&self, at: Instant) -> u64 {
        let _ = at;
        self.now_ms()
    }

    /// Whole seconds since the Unix epoch.
    fn now(&self) -> u64 {
        self.now_ms() / 1000
    }

    /// For a clock moved by hand: arranges for `waker` to be woken once `now_ms()` has reached
    /// `at_ms` (at once if it has), and says so. A clock that runs by itself returns `false`: a
    /// caller waiting for `at_ms` then sleeps in real time. (What waits for a time of the
    /// decisions, a request waiting for room, waits by this clock, so a test that moves it wakes
    /// the request rather than racing its timer.)
    fn wake_at(&self, at_ms: u64, waker: &Waker) -> bool {
        let _ = (at_ms, waker);
        false
    }
}

/// Wall-clock time read once at start-up and then advanced by the monotonic clock.
///
/// Anchoring on `Instant` means an NTP step on the host cannot move a window backwards or skip it
/// forwards while the process runs; instances sharing Redis take their time from Redis anyway.
#[derive(Debug, Clone)]
pub struct SystemClock {
    anchor_unix: f64,
    anchor: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        Self {
            anchor_unix: unix,
            anchor: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        self.now_ms_at(Instant::now())
    }

    fn now_ms_at(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.anchor);
        ((self.anchor_unix + since.as_secs_f64()) * 1000.0) as u64
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    /// Unix milliseconds.
    now_ms: Arc<AtomicU64>,
    /// Who waits for which time ([`Clock::wake_at`]).
    sleepers: Arc<Mutex<Vec<(u64, Waker)>>>,
}

impl FakeClock {
    /// At second `now`.
    pub fn new(now: u64) -> Self {
        Self {
            now_ms: Arc::new(AtomicU64::new(now * 1000)),
            sleepers: Arc::default(),
        }
    }

    /// To second `now`.
    pub fn set(&self, now: u64) {
        self.now_ms.store(now * 1000, Ordering::SeqCst);
        self.wake_due();
    }

    pub fn advance(&self, seconds: u64) {
        self.advance_ms(seconds * 1000);
    }

    pub fn advance_ms(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
        self.wake_due();
    }

    fn wake_due(&self) {
        let now_ms = self.now_ms();
        let mut sleepers = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        sleepers.retain(|(at_ms, waker)| {
            let due = *at_ms <= now_ms;
            if due {
                waker.wake_by_ref();
            }
            !due
        });
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn wake_at(&self, at_ms: u64, waker: &Waker) -> bool {
        let mut sleepers = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        // Read under the lock: a move of the clock between this and the push would find the
        // waker when it takes the lock after us.
        if self.now_ms() >= at_ms {
            waker.wake_by_ref();
        } else if !sleepers
            .iter()
            .any(|(a, w)| *a == at_ms && w.will_wake(waker))
        {
            sleepers.push((at_ms, waker.clone()));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_system_clock_at_an_instant_is_its_anchor_moved_by_as_much() {
        let clock = SystemClock::new();
        let anchor_ms = clock.now_ms_at(clock.anchor);
        assert_eq!(anchor_ms, (clock.anchor_unix * 1000.0) as u64);
        let later = clock.anchor + std::time::Duration::from_millis(1_500);
        assert_eq!(clock.now_ms_at(later), anchor_ms + 1_500);
        let before = clock.anchor.checked_sub(std::time::Duration::from_secs(1));
        if let Some(before) = before {
            assert_eq!(
                clock.now_ms_at(before),
                anchor_ms,
                "never before its anchor"
            );
        }
        let now = Instant::now();
        assert!(clock.now_ms() >= clock.now_ms_at(now));
        assert_eq!(
            FakeClock::new(7).now_ms_at(now),
            7_000,
            "a fake clock keeps its own time"
        );
    }

    #[test]
    fn a_fake_clock_wakes_who_waits_once_it_reaches_their_time() {
        let clock = FakeClock::new(10);
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        assert!(clock.wake_at(10_500, &waker));
        assert!(clock.wake_at(10_500, &waker), "asked twice, woken once");
        clock.advance_ms(499);
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "not yet");
        clock.clone().advance_ms(1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "a clone moves it too");
        clock.advance(1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "forgotten once woken");
        assert!(clock.wake_at(5_000, &waker));
        assert_eq!(count.0.load(Ordering::SeqCst), 2, "a past time: at once");
    }

    #[test]
    fn the_system_clock_leaves_waiting_to_real_time() {
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        assert!(!SystemClock::new().wake_at(0, &waker));
    }
}
