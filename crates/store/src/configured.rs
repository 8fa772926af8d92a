//! configured: the store a gateway runs on, as its settings say: this instance's memory, or
//! Redis under the failure policy ([`Store`]); and keeping one caller's calls in order
//! ([`Sequence`]).

use std::sync::Arc;
use std::time::Duration;

use quotagate_engine::clock::Clock;

use crate::{Failover, FailurePolicy, RedisMode, RedisOptions, RedisStore, StoreError, StoreStats};

/// The store's settings (`[store]`), checked.
#[derive(Debug, Clone)]
// Built once at start-up: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum StoreSettings {
    /// The embedded store; `path`: the directory it keeps its counters in (`None`: memory
    /// only); `policy`: what to do while that directory cannot be written.
    Memory {
        path: Option<std::path::PathBuf>,
        policy: FailurePolicy,
    },
    Redis {
        redis: RedisOptions,
        policy: FailurePolicy,
        /// How often a down Redis is pinged.
        probe_interval: Duration,
    },
}

/// The configured store: this instance's memory, or Redis under the failure policy. What every
/// door holds.
pub type Store = Failover<RedisStore>;

impl Store {
    /// The configured store. A Redis store connects lazily: this fails only on a malformed URL.
    /// `thread_slot`: see [`RedisStore::with_thread_slot`]; `clock`: the application's.
    pub fn open(
        s: &StoreSettings,
        thread_slot: fn() -> usize,
        clock: Arc<dyn Clock>,
    ) -> Result<Store, StoreError> {
        Ok(match s {
            StoreSettings::Memory { path: None, .. } => Store::memory(),
            StoreSettings::Memory {
                path: Some(dir),
                policy,
            } => Failover::embedded(
                crate::MemoryStore::open(dir, clock)
                    .map_err(|e| StoreError::unreachable(e.to_string()))?,
                *policy,
            ),
            StoreSettings::Redis {
                redis,
                policy,
                probe_interval,
            } => Store::redis(
                RedisStore::connect(redis)?
                    .with_thread_slot(thread_slot)
                    .with_clock(clock),
                *policy,
                *probe_interval,
            ),
        })
    }

    /// The embedded in-memory store (it never fails, so the policy never applies).
    pub fn memory() -> Store {
        Failover::in_memory()
    }

    /// A Redis store. `probe_interval` is how often a down Redis is pinged.
    pub fn redis(store: RedisStore, policy: FailurePolicy, probe_interval: Duration) -> Store {
        Failover::new(store.shared(), policy, probe_interval)
    }

    /// What the Redis store counts about its decisions and leases (`None` on memory).
    pub fn stats(&self) -> Option<&StoreStats> {
        self.shared().map(|r| r.stats())
    }

    /// A sequence for a caller whose calls must apply in the order it issues them (a Divvy
    /// connection's hits), whatever the backend.
    pub fn sequence(&self) -> Sequence {
        // Calls reach memory, and one Redis connection, in the order they are first polled; a
        // Redis Cluster's connection sends each command on its own, and with leases a call may
        // be decided here while an earlier one is still on its way to Redis: there they wait in
        // line.
        let in_line = self
            .shared()
            .is_some_and(|r| r.target().mode == RedisMode::Cluster || r.leases_on());
        Sequence(in_line.then(|| Arc::new(tokio::sync::Mutex::new(()))))
    }
}

/// One caller's calls, applied in the order it issues them ([`Store::sequence`]). Free where the
/// backend keeps order by itself; elsewhere each call waits for the one before it to finish.
#[derive(Debug, Clone)]
pub struct Sequence(Option<Arc<tokio::sync::Mutex<()>>>);

impl Sequence {
    /// A place in line for the next call: await it first (the place is taken when it is first
    /// polled, so poll the turns in issue order) and keep what it gives until the call returns.
    pub fn turn(
        &self,
    ) -> impl Future<Output = Option<tokio::sync::OwnedMutexGuard<()>>> + Send + 'static {
        let line = self.0.clone();
        async move {
            match line {
                Some(m) => Some(m.lock_owned().await),
                None => None,
            }
        }
    }
}
