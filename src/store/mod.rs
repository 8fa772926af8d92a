//! store: where counters live, and what happens when that place fails.
//!
//! Two backends answer the same question ("may this request pass, and count it"): [`MemoryStore`]
//! (embedded, one instance) and [`RedisStore`] (shared by every instance on one Redis). The store
//! behaviour suite (`tests/store.rs`) runs the same cases against both.
//!
//! [`Store`] wraps the backend with the failure policy. When Redis errors or times out, the store is
//! marked down (logged once), requests are decided by the policy without waiting on Redis, and a
//! background probe pings Redis until it answers again (logged once).

mod blocked;
pub mod keys;
pub mod memory;
pub mod redis;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use keys::CounterKey;
pub use memory::{FixedDecision, FixedWindows, MemoryStore};
pub use redis::{RedisOptions, RedisStore, TimeSource};

use crate::config::{ConfigError, StoreConfig, StoreKind, positive_ms};
use crate::limiter::Quota;

/// A failed store call. Opaque; ask it with the `is_*` predicates.
#[derive(Debug)]
pub struct StoreError {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Timeout,
    Config(String),
    Pool(String),
    Redis(deadpool_redis::redis::RedisError),
    Reply(String),
}

impl StoreError {
    pub(crate) fn timeout() -> Self {
        StoreError {
            kind: Kind::Timeout,
        }
    }
    pub(crate) fn config(e: impl fmt::Display) -> Self {
        StoreError {
            kind: Kind::Config(e.to_string()),
        }
    }
    pub(crate) fn pool(e: impl fmt::Display) -> Self {
        StoreError {
            kind: Kind::Pool(e.to_string()),
        }
    }
    pub(crate) fn redis(e: deadpool_redis::redis::RedisError) -> Self {
        StoreError {
            kind: Kind::Redis(e),
        }
    }
    pub(crate) fn reply(msg: String) -> Self {
        StoreError {
            kind: Kind::Reply(msg),
        }
    }

    /// The call did not finish within the store timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, Kind::Timeout)
    }

    /// The store could not be set up from its configuration.
    pub fn is_config(&self) -> bool {
        matches!(self.kind, Kind::Config(_))
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Timeout => f.write_str("store call timed out"),
            Kind::Config(e) => write!(f, "invalid store configuration: {e}"),
            Kind::Pool(e) => write!(f, "no Redis connection: {e}"),
            Kind::Redis(e) => write!(f, "Redis error: {e}"),
            Kind::Reply(e) => write!(f, "bad reply from Redis: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Local => "local",
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
        }
    }
}

/// What to do with a request when the shared store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Enforce the same limits in this instance's memory until Redis answers. Default.
    #[default]
    Local,
    /// Let requests through unlimited.
    Open,
    /// Refuse requests with 503.
    Closed,
}

/// The answer for one request (`D`: a sliding-window [`Quota`] or a Divvy [`FixedDecision`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<D = Quota> {
    /// Decided by the configured store.
    Decided(D),
    /// Decided in this instance's memory because the shared store is down (policy `local`).
    Local(D),
    /// The shared store is down and the policy is `open`.
    Open,
    /// The shared store is down and the policy is `closed`.
    Closed,
}

/// The store's settings (`[store]`), checked.
#[derive(Debug, Clone)]
pub enum StoreSettings {
    Memory,
    Redis {
        redis: RedisOptions,
        policy: FailurePolicy,
        /// How often a down Redis is pinged.
        probe_interval: Duration,
    },
}

impl TryFrom<&StoreConfig> for StoreSettings {
    type Error = ConfigError;

    /// The Redis options are checked whichever kind is chosen, so a mistake shows before the day
    /// someone switches to Redis. `connections` is 1 here; the application sets one per worker.
    fn try_from(c: &StoreConfig) -> Result<Self, ConfigError> {
        keys::check_prefix(&c.key_prefix)
            .map_err(|m| ConfigError(format!("store.key_prefix: {m}")))?;
        let redis = RedisOptions {
            url: c.redis_url.clone(),
            timeout: positive_ms("store.timeout_ms", c.timeout_ms)?,
            pool_size: c.pool_size,
            prefix: c.key_prefix.clone(),
            time_source: c.time_source,
            connections: 1,
        };
        let probe_interval = positive_ms("store.probe_interval_ms", c.probe_interval_ms)?;
        Ok(match c.kind {
            StoreKind::Memory => StoreSettings::Memory,
            StoreKind::Redis => StoreSettings::Redis {
                redis,
                policy: c.failure_policy,
                probe_interval,
            },
        })
    }
}

enum Backend {
    Memory(MemoryStore, FixedWindows),
    Redis(Arc<RedisStore>),
}

/// Live Divvy windows kept in memory at most (memory store, and the `local` fallback). Default:
/// 1,000,000.
pub const MAX_FIXED_WINDOWS: usize = 1_000_000;

/// Health of the shared store, shared with the probe task.
struct Health {
    down: AtomicBool,
}

/// The configured backend plus the failure policy.
pub struct Store {
    backend: Backend,
    policy: FailurePolicy,
    /// Per-instance counters used while Redis is down under policy `local`.
    fallback: MemoryStore,
    fallback_fixed: FixedWindows,
    health: Arc<Health>,
    probe_interval: Duration,
    /// Failed or timed-out store calls (a metric).
    pub errors: prometheus_client::metrics::counter::Counter,
}

impl Store {
    /// The configured store. A Redis store connects lazily: this fails only on a malformed URL.
    pub fn open(s: &StoreSettings) -> Result<Store, StoreError> {
        Ok(match s {
            StoreSettings::Memory => Store::memory(),
            StoreSettings::Redis {
                redis,
                policy,
                probe_interval,
            } => Store::redis(RedisStore::connect(redis)?, *policy, *probe_interval),
        })
    }

    /// The embedded in-memory store.
    pub fn memory() -> Store {
        Store::with_backend(
            Backend::Memory(MemoryStore::new(), FixedWindows::new(MAX_FIXED_WINDOWS)),
            FailurePolicy::Local,
            Duration::from_secs(1),
        )
    }

    /// A Redis store. `probe_interval` is how often a down Redis is pinged.
    pub fn redis(store: RedisStore, policy: FailurePolicy, probe_interval: Duration) -> Store {
        Store::with_backend(Backend::Redis(Arc::new(store)), policy, probe_interval)
    }

    fn with_backend(backend: Backend, policy: FailurePolicy, probe_interval: Duration) -> Store {
        Store {
            backend,
            policy,
            fallback: MemoryStore::new(),
            fallback_fixed: FixedWindows::new(MAX_FIXED_WINDOWS),
            health: Arc::new(Health {
                down: AtomicBool::new(false),
            }),
            probe_interval,
            errors: Default::default(),
        }
    }

    /// `memory` or `redis`.
    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Memory(..) => "memory",
            Backend::Redis(_) => "redis",
        }
    }

    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// The Redis store, when that is the backend (for catalog announcements).
    pub fn redis_store(&self) -> Option<Arc<RedisStore>> {
        match &self.backend {
            Backend::Redis(r) => Some(r.clone()),
            Backend::Memory(..) => None,
        }
    }

    /// True while the shared store is considered down.
    pub fn is_degraded(&self) -> bool {
        self.health.down.load(Ordering::Relaxed)
    }

    /// Checks one request against `limit` at `now` and counts it if allowed.
    pub async fn check(&self, key: &CounterKey, limit: u64, now: u64) -> Verdict {
        if limit == 0 {
            return Verdict::Decided(Quota::zero_limit());
        }
        let redis = match &self.backend {
            Backend::Memory(m, _) => return Verdict::Decided(m.hit(key, limit, now)),
            Backend::Redis(r) => r,
        };
        // The call is awaited where it is made, not passed to a helper: a future passed by value
        // into an `async fn` is stored twice, and this one is in every request's future.
        if !self.is_degraded() {
            match redis.hit(key, limit, now).await {
                Ok(d) => return Verdict::Decided(d),
                Err(e) => self.mark_down(redis, &e),
            }
        }
        self.degraded(|| self.fallback.hit(key, limit, now))
    }

    /// One hit on Divvy's fixed window `key`: `limit` hits per `reset` seconds (both above 0),
    /// the window starting at its first hit.
    pub async fn check_fixed(
        &self,
        key: &str,
        limit: u64,
        reset: u64,
        now: u64,
    ) -> Verdict<FixedDecision> {
        let redis = match &self.backend {
            Backend::Memory(_, f) => return Verdict::Decided(f.hit(key, limit, reset, now)),
            Backend::Redis(r) => r,
        };
        if !self.is_degraded() {
            match redis.hit_fixed(key, limit, reset).await {
                Ok(d) => return Verdict::Decided(d),
                Err(e) => self.mark_down(redis, &e),
            }
        }
        self.degraded(|| self.fallback_fixed.hit(key, limit, reset, now))
    }

    /// The answer while Redis is down or just failed: the failure policy (`local` answers with
    /// `local()`).
    fn degraded<D>(&self, local: impl FnOnce() -> D) -> Verdict<D> {
        match self.policy {
            FailurePolicy::Local => Verdict::Local(local()),
            FailurePolicy::Open => Verdict::Open,
            FailurePolicy::Closed => Verdict::Closed,
        }
    }

    fn mark_down(&self, redis: &Arc<RedisStore>, e: &StoreError) {
        self.errors.inc();
        if self.health.down.swap(true, Ordering::SeqCst) {
            return; // already down; the probe is running
        }
        tracing::warn!(error = %e, policy = ?self.policy, "store unavailable; applying the failure policy until it answers");
        let (redis, health, every) = (redis.clone(), self.health.clone(), self.probe_interval);
        tokio::spawn(async move {
            let since = Instant::now();
            loop {
                tokio::time::sleep(every).await;
                // A fresh connection per probe: the old one may be stuck behind a hung server.
                redis.reset_connection();
                if redis.ping().await.is_ok() {
                    health.down.store(false, Ordering::SeqCst);
                    tracing::info!(
                        down_ms = since.elapsed().as_millis() as u64,
                        "store recovered"
                    );
                    return;
                }
            }
        });
    }
}
