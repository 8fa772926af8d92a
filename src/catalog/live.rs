//! live: the catalog the gateway serves right now, and the machinery to refresh it.
//!
//! Requests read [`Live::snapshot`]; the poller replaces it whole with one `ArcSwap::store`. A
//! refresh can be requested (the forced-refresh header, a pub/sub message): requests arriving
//! together share one fetch (single flight), and a caller can wait, bounded, until a fetch that
//! started after its request has finished.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::{Notify, watch};

use super::Snapshot;

/// What the last poll found, for logs and the admin endpoint.
#[derive(Debug, Clone, Default)]
pub struct PollStatus {
    /// `unchanged`, `applied`, or the failure (`unreachable`, `status 503`, ...).
    pub last_outcome: String,
    pub last_poll: Option<Instant>,
    /// When the current catalog was applied.
    pub applied_at: Option<Instant>,
    pub polls: u64,
    pub failures: u64,
}

/// The live catalog shared by requests, the poller and the pub/sub listener.
pub struct Live {
    current: ArcSwap<Snapshot>,
    /// A catalog has been loaded (from a file or a server). Until then requests get 503.
    ready: AtomicBool,
    /// Wakes the poller for a fetch now (coalesced: any number of wake-ups before it runs count once).
    wake: Notify,
    /// Number of fetches started and finished. A caller that read `started == n` waits for
    /// `finished >= n + 1`: a fetch that started after it asked.
    started: AtomicU64,
    finished: watch::Sender<u64>,
    /// `std::sync::Mutex`: written once per poll, read by the admin endpoint; never across an await.
    pub status: Mutex<PollStatus>,
}

impl Live {
    /// A live catalog starting from `initial` (`None`: nothing loaded yet, not ready).
    pub fn new(initial: Option<Snapshot>) -> Arc<Live> {
        let ready = initial.is_some();
        if let Some(s) = &initial {
            warn_unknown_fields(s);
        }
        Arc::new(Live {
            current: ArcSwap::from_pointee(initial.unwrap_or_default()),
            ready: AtomicBool::new(ready),
            wake: Notify::new(),
            started: AtomicU64::new(0),
            finished: watch::Sender::new(0),
            status: Mutex::new(PollStatus {
                applied_at: ready.then(Instant::now),
                ..PollStatus::default()
            }),
        })
    }

    /// The current catalog. Take it once per request and keep the `Arc` for the request's life.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Swaps in a new catalog.
    pub fn store(&self, snapshot: Snapshot) {
        warn_unknown_fields(&snapshot);
        retire(self.current.swap(Arc::new(snapshot)));
        self.ready.store(true, Ordering::Release);
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .applied_at = Some(Instant::now());
    }

    /// Asks the poller to fetch now.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Waits until the poller is asked to fetch.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Called by the poller when a fetch begins and ends.
    pub fn fetch_started(&self) -> u64 {
        self.started.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub fn fetch_finished(&self, generation: u64) {
        self.finished.send_replace(generation);
    }

    /// Asks for a fetch and waits, at most `wait`, until one that started after this call has
    /// finished. Returns whether it did.
    pub async fn refresh(&self, wait: Duration) -> bool {
        let want = self.started.load(Ordering::SeqCst) + 1;
        let mut rx = self.finished.subscribe();
        self.wake();
        tokio::time::timeout(wait, rx.wait_for(|&done| done >= want))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// Says once per catalog version served which of its fields are ignored: a misspelt optional
/// field (`defualt_rl`) would otherwise change nothing, silently.
fn warn_unknown_fields(snapshot: &Snapshot) {
    let unknown = snapshot.unknown_fields();
    if !unknown.is_empty() {
        tracing::warn!(
            version = %snapshot.version.semver,
            hash = %snapshot.version.hash,
            fields = %unknown.join(", "),
            "the catalog has fields quotagate does not know; they are ignored"
        );
    }
}

/// How long a catalog swapped out is kept before it is freed: requests take the catalog once and
/// keep it for their life, so by then the last of them is usually done with it.
const RETIRE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Frees a catalog swapped out on a blocking thread, after [`RETIRE_AFTER`]: freeing a million
/// keys takes tens of milliseconds, a stall for the requests of the worker that would do it.
/// (Outside a runtime it is freed here.)
fn retire(old: Arc<Snapshot>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        tokio::time::sleep(RETIRE_AFTER).await;
        let _ = tokio::task::spawn_blocking(move || {
            drop(old);
            crate::alloc::release();
        })
        .await;
    });
}
