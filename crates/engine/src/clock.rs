//! clock: where "now" comes from.
//!
//! The limiter never reads the time itself; it is handed `now` (Unix milliseconds). Production uses
//! [`SystemClock`], tests use [`FakeClock`] and move time forward by hand, so no test has to sleep.
//! (Pattern from governor's `Clock`/`FakeRelativeClock`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of Unix time.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Whole seconds since the Unix epoch.
    fn now(&self) -> u64 {
        self.now_ms() / 1000
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
        ((self.anchor_unix + self.anchor.elapsed().as_secs_f64()) * 1000.0) as u64
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    /// Unix milliseconds.
    now_ms: Arc<AtomicU64>,
}

impl FakeClock {
    /// At second `now`.
    pub fn new(now: u64) -> Self {
        Self {
            now_ms: Arc::new(AtomicU64::new(now * 1000)),
        }
    }

    /// To second `now`.
    pub fn set(&self, now: u64) {
        self.now_ms.store(now * 1000, Ordering::SeqCst);
    }

    pub fn advance(&self, seconds: u64) {
        self.advance_ms(seconds * 1000);
    }

    pub fn advance_ms(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}
