//! failover: where a request is decided: this instance's memory, or a shared [`CounterStore`]
//! under the failure policy.
//!
//! Without a shared store every request is decided in memory (`store.kind = memory`). With one,
//! when it errors or times out it is marked down (logged once), requests are decided by the policy
//! without waiting on it, and a background probe pings it until it answers again (logged once).
//! Under `local` the same limits are enforced in this instance's memory meanwhile: the same
//! counters a memory-only store keeps. The probe sleeps on tokio's clock, so tests drive it with
//! paused time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::memory::MemoryStore;
use super::{CounterKey, CounterStore, FailurePolicy, Part, StoreError, Verdict};
use quotagate_engine::limiter::{Limit, Outcome, Quota, WindowSet};

/// This instance's counters, and a shared store under the failure policy.
pub struct Failover<B> {
    /// The shared store; `None`: every request is decided in `local`.
    shared: Option<Arc<B>>,
    policy: FailurePolicy,
    /// This instance's counters: all of them without a shared store; with one, those used while
    /// it is down under policy `local`.
    local: MemoryStore,
    /// Shared with the probe task.
    down: Arc<AtomicBool>,
    probe_interval: Duration,
    /// Failed or timed-out store calls (a metric).
    pub errors: Counter,
    /// A question no store answers was logged.
    unanswerable_logged: AtomicBool,
}

impl<B: CounterStore> Failover<B> {
    /// Requests decided by `shared` under `policy`; `probe_interval`: how often a down one is
    /// pinged.
    pub fn new(shared: Arc<B>, policy: FailurePolicy, probe_interval: Duration) -> Self {
        Failover::around(Some(shared), policy, probe_interval)
    }

    /// Every request decided in this instance's memory (it never fails: no policy applies).
    pub fn in_memory() -> Self {
        Failover::around(None, FailurePolicy::Local, Duration::from_secs(1))
    }

    /// Every request decided in `local`, the embedded store (kept in a directory, whose writes
    /// can fail: then `policy` applies until it can be written again).
    pub fn embedded(local: MemoryStore, policy: FailurePolicy) -> Self {
        Failover {
            local,
            ..Failover::around(None, policy, Duration::from_secs(1))
        }
    }

    /// The embedded store (all counters without a shared store; else those of policy `local`).
    pub fn local(&self) -> &MemoryStore {
        &self.local
    }

    fn around(shared: Option<Arc<B>>, policy: FailurePolicy, probe_interval: Duration) -> Self {
        Failover {
            shared,
            policy,
            local: MemoryStore::new(),
            down: Arc::new(AtomicBool::new(false)),
            probe_interval,
            errors: Counter::default(),
            unanswerable_logged: AtomicBool::new(false),
        }
    }

    /// The shared store, if there is one.
    pub fn shared(&self) -> Option<&Arc<B>> {
        self.shared.as_ref()
    }

    /// `memory`, or the shared store's kind.
    pub fn kind(&self) -> &'static str {
        self.shared.as_ref().map_or("memory", |s| s.kind())
    }

    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// True while the backend is considered down (the embedded store's directory cannot be
    /// written, without a shared store).
    pub fn is_degraded(&self) -> bool {
        self.down.load(Ordering::Relaxed) || (self.shared.is_none() && self.local.is_failed())
    }

    /// Asks the backend once, at start-up, so that an unreachable one is said at once in one line
    /// (and the failure policy applies from the first request) rather than on the first request.
    /// Starting never waits for it.
    pub async fn check_at_start(&self) {
        let Some(shared) = &self.shared else { return };
        match shared.check_reachable().await {
            Ok(()) => tracing::debug!(store = shared.kind(), "store answers"),
            Err(e) => self.mark_down(&e),
        }
    }

    /// Checks one request of `cost` units against `limits` (windows of any kind) at `now_ms` and
    /// counts it where it belongs ([`CounterStore::hit`]).
    pub async fn hit(&self, key: &CounterKey, limits: &[Limit], cost: u64, now_ms: u64) -> Verdict {
        // One limit that decides alone (a request that can never pass it, an aligned window of
        // 0): the answer needs no store.
        if let [l] = limits
            && let Some(o) = l.alone(cost, now_ms)
        {
            return Verdict::Decided(o);
        }
        let Some(shared) = &self.shared else {
            if self.local.is_failed() {
                return self.without_disk(|| self.local.hit_now(key, limits, cost, now_ms));
            }
            return match self.local.hit_now(key, limits, cost, now_ms) {
                Ok((o, ticket)) if ticket.is_none() => Verdict::Decided(o),
                // Boxed: waiting for a commit is rare, and its state would otherwise be in every
                // request's future.
                Ok((o, ticket)) => Box::pin(self.on_disk(o, ticket)).await,
                Err(e) => self.unanswerable(&e),
            };
        };
        // Boxed: the shared store's state (kilobytes, for Redis) would otherwise be in every
        // request's future, which is held as long as the request, waiting or forwarded, and
        // sizes hyper's per-connection slot; the memory store's path allocates nothing.
        if !self.is_degraded() {
            match Box::pin(shared.hit(key, limits, cost, now_ms)).await {
                Ok(o) => return Verdict::Decided(o),
                Err(e) if e.is_unsupported() => return self.unanswerable(&e),
                Err(e) => self.mark_down(&e),
            }
        }
        match self.policy {
            FailurePolicy::Local => self.in_local(key, limits, cost, now_ms, Verdict::Local),
            FailurePolicy::Open => Verdict::Open,
            FailurePolicy::Closed => Verdict::Closed,
        }
    }

    /// A request's own `counter` and `limits`, the last of which are `pools`' (as
    /// [`Part::split`] takes them): [`Failover::hit`] without pools, else
    /// [`Failover::hit_parts`]. Every door that counts a request asks here.
    pub async fn hit_pooled(
        &self,
        counter: &CounterKey,
        limits: &[Limit],
        pools: &[(CounterKey, usize)],
        cost: u64,
        now_ms: u64,
    ) -> Verdict {
        match pools.is_empty() {
            true => self.hit(counter, limits, cost, now_ms).await,
            false => {
                let parts = Part::split(counter, limits, pools);
                self.hit_parts(&parts, cost, now_ms).await
            }
        }
    }

    /// [`Failover::hit`] across several counters ([`CounterStore::hit_parts`]: a request's own
    /// and its pools').
    pub async fn hit_parts(&self, parts: &[Part<'_>], cost: u64, now_ms: u64) -> Verdict {
        if let [p] = parts {
            return self.hit(p.counter, p.limits, cost, now_ms).await;
        }
        let Some(shared) = &self.shared else {
            if self.local.is_failed() {
                return self.without_disk(|| self.local.hit_parts_now(parts, cost, now_ms));
            }
            return match self.local.hit_parts_now(parts, cost, now_ms) {
                Ok((o, ticket)) if ticket.is_none() => Verdict::Decided(o),
                // Boxed, as in `hit`.
                Ok((o, ticket)) => Box::pin(self.on_disk(o, ticket)).await,
                Err(e) => self.unanswerable(&e),
            };
        };
        if !self.is_degraded() {
            // Boxed, as in `hit`.
            match Box::pin(shared.hit_parts(parts, cost, now_ms)).await {
                Ok(o) => return Verdict::Decided(o),
                Err(e) if e.is_unsupported() => return self.unanswerable(&e),
                Err(e) => self.mark_down(&e),
            }
        }
        match self.policy {
            FailurePolicy::Local => self.parts_in_local(parts, cost, now_ms, Verdict::Local),
            FailurePolicy::Open => Verdict::Open,
            FailurePolicy::Closed => Verdict::Closed,
        }
    }

    /// [`Failover::hit_parts`] in this instance's memory, the answer told as `told`.
    fn parts_in_local(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
        told: impl FnOnce(Outcome) -> Verdict,
    ) -> Verdict {
        match self.local.hit_parts_now(parts, cost, now_ms) {
            Ok((o, _)) => told(o),
            Err(e) => self.unanswerable(&e),
        }
    }

    /// The failure policy's answer while the embedded store's directory cannot be written:
    /// `local` decides in memory (`hit`), not durably; `open` and `closed` count nothing.
    fn without_disk(
        &self,
        hit: impl FnOnce() -> Result<(Outcome, crate::Ticket), StoreError>,
    ) -> Verdict {
        match self.policy {
            FailurePolicy::Local => match hit() {
                Ok((o, _)) => Verdict::Local(o),
                Err(e) => self.unanswerable(&e),
            },
            FailurePolicy::Open => Verdict::Open,
            FailurePolicy::Closed => Verdict::Closed,
        }
    }

    /// The embedded store's answer `o`, given once its units are durable (`ticket`: nothing to
    /// wait for without a directory); when the directory cannot be written, the failure policy's
    /// answer (`local`: `o`, decided in memory).
    async fn on_disk(&self, o: Outcome, ticket: crate::Ticket) -> Verdict {
        match self.local.durable(ticket).await {
            Ok(()) => Verdict::Decided(o),
            Err(_) => match self.policy {
                FailurePolicy::Local => Verdict::Local(o),
                FailurePolicy::Open => Verdict::Open,
                FailurePolicy::Closed => Verdict::Closed,
            },
        }
    }

    /// [`CounterStore::adjust`] on the shared store, or under policy `local` (and without one) in
    /// this instance's memory, where the request was counted. Errors mark the store down; an
    /// adjustment that no store takes is lost (its reservation stays counted, or its extra
    /// units are not).
    pub async fn adjust(&self, parts: &[Part<'_>], delta: i64, reserved_at_ms: u64, now_ms: u64) {
        if let Some(shared) = &self.shared
            && !self.is_degraded()
        {
            match shared.adjust(parts, delta, reserved_at_ms, now_ms).await {
                Ok(()) => return,
                Err(e) if e.is_unsupported() => return,
                Err(e) => self.mark_down(&e),
            }
        }
        if self.shared.is_none() || self.policy == FailurePolicy::Local {
            let _ = self.local.adjust_now(parts, delta, reserved_at_ms, now_ms);
        }
    }

    /// [`Failover::adjust`] at once, without a future, when there is no shared store (the
    /// embedded memory store: a lock and a few additions, not worth a task). `false`: there is
    /// one; call [`Failover::adjust`]. `now_ms` is read only for an addition: a give-back finds
    /// its units by `reserved_at_ms` (and a clock read is a fifth of what it costs).
    pub fn adjust_in_memory(
        &self,
        parts: &[Part<'_>],
        delta: i64,
        reserved_at_ms: u64,
        now_ms: impl FnOnce() -> u64,
    ) -> bool {
        if self.shared.is_some() {
            return false;
        }
        let now_ms = if delta > 0 { now_ms() } else { reserved_at_ms };
        let _ = self.local.adjust_now(parts, delta, reserved_at_ms, now_ms);
        true
    }

    /// [`CounterStore::free`] where the request took its slots: this instance's memory when it
    /// was decided there (`in_memory`: a [`Verdict::Local`], or no shared store), else the shared
    /// store. An error marks the shared store down; its slots are then freed by their hold time.
    pub async fn free(&self, parts: &[Part<'_>], in_memory: bool, now_ms: u64) {
        match &self.shared {
            Some(shared) if !in_memory => match shared.free(parts, now_ms).await {
                Ok(()) => {}
                Err(e) if e.is_unsupported() => {}
                Err(e) => self.mark_down(&e),
            },
            _ => {
                let _ = self.local.free_now(parts);
            }
        }
    }

    /// [`Failover::free`] at once, without a future, when the slots are in this instance's
    /// memory; `false`: they are in the shared store, call [`Failover::free`].
    pub fn free_in_memory(&self, parts: &[Part<'_>], in_memory: bool) -> bool {
        if self.shared.is_some() && !in_memory {
            return false;
        }
        let _ = self.local.free_now(parts);
        true
    }

    /// [`CounterStore::windows`] where the request is decided: the shared store while it
    /// answers, else (policy `local`, or no shared store) this instance's memory.
    pub async fn windows(
        &self,
        parts: &[Part<'_>],
        now_ms: u64,
    ) -> Result<(Vec<WindowSet>, u64), StoreError> {
        match &self.shared {
            Some(shared) if !self.is_degraded() => shared.windows(parts, now_ms).await,
            _ => self.local.windows(parts, now_ms).await,
        }
    }

    /// [`Failover::peek`] across several counters ([`CounterStore::peek_parts`]).
    pub async fn peek_parts(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        match &self.shared {
            Some(shared) => shared.peek_parts(parts, cost, now_ms).await,
            None => self.local.peek_parts(parts, cost, now_ms).await,
        }
    }

    /// One request against one enforced limit of `limit` per 60 s at second `now`: the DynLimits
    /// case, [`Failover::hit`] with one limit.
    pub async fn hit_per_minute(&self, key: &CounterKey, limit: u64, now: u64) -> Verdict<Quota> {
        self.hit(key, &[Limit::per_minute(limit)], 1, now * 1000)
            .await
            .map(|o| o.quotas()[0])
    }

    /// [`Failover::hit`] in this instance's memory, the answer told as `told`.
    fn in_local(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
        told: impl FnOnce(Outcome) -> Verdict,
    ) -> Verdict {
        match self.local.hit_now(key, limits, cost, now_ms) {
            Ok((o, _)) => told(o),
            Err(e) => self.unanswerable(&e),
        }
    }

    /// A question no store answers: refused as if the store were down under `closed`, said once.
    fn unanswerable<D>(&self, e: &StoreError) -> Verdict<D> {
        if !self.unanswerable_logged.swap(true, Ordering::Relaxed) {
            tracing::error!(error = %e, "a request asked the store what it cannot answer; refused");
        }
        Verdict::Closed
    }

    /// [`CounterStore::peek`] of the shared store (or of this instance's memory without one);
    /// errors are the caller's to report (no policy: it counts nothing).
    pub async fn peek(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        match &self.shared {
            Some(shared) => shared.peek(key, limits, cost, now_ms).await,
            None => self.local.peek(key, limits, cost, now_ms).await,
        }
    }

    /// [`CounterStore::reset`] of this instance's counters and of the shared store's.
    pub async fn reset(&self, api_key: &[u8]) -> Result<u64, StoreError> {
        let local = self.local.reset(api_key).await.unwrap_or(0);
        match &self.shared {
            Some(shared) => Ok(shared.reset(api_key).await? + local),
            None => Ok(local),
        }
    }

    fn mark_down(&self, e: &StoreError) {
        self.errors.inc();
        if self.down.swap(true, Ordering::SeqCst) {
            return; // already down; the probe is running
        }
        tracing::warn!(error = %e, policy = self.policy.as_str(), "store unavailable; applying the failure policy until it answers");
        let Some(shared) = self.shared.clone() else {
            return; // memory never fails
        };
        let (down, every) = (self.down.clone(), self.probe_interval);
        tokio::spawn(async move {
            let since = Instant::now();
            loop {
                tokio::time::sleep(every).await;
                if shared.probe().await.is_ok() {
                    down.store(false, Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A backend that answers "allowed" or fails, as told, and counts its calls.
    #[derive(Default)]
    struct Fake {
        failing: AtomicBool,
        calls: AtomicU64,
        probes: AtomicU64,
    }

    impl Fake {
        fn answer(&self) -> Result<(), StoreError> {
            match self.failing.load(Ordering::SeqCst) {
                true => Err(StoreError::timeout()),
                false => Ok(()),
            }
        }
    }

    impl CounterStore for Fake {
        async fn hit(
            &self,
            _: &CounterKey,
            limits: &[Limit],
            _: u64,
            _: u64,
        ) -> Result<Outcome, StoreError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let limit = limits[0].rl;
            self.answer().map(|()| {
                let q = Quota {
                    allowed: true,
                    limit,
                    remaining: limit - 1,
                    reset: 60,
                    retry_after: None,
                };
                Outcome::new(true, false, &[q])
            })
        }

        async fn probe(&self) -> Result<(), StoreError> {
            self.probes.fetch_add(1, Ordering::SeqCst);
            self.answer()
        }

        async fn peek(
            &self,
            key: &CounterKey,
            limits: &[Limit],
            cost: u64,
            now_ms: u64,
        ) -> Result<Outcome, StoreError> {
            self.hit(key, limits, cost, now_ms).await
        }

        async fn reset(&self, _: &[u8]) -> Result<u64, StoreError> {
            self.answer().map(|()| 0)
        }

        // The policy's tests ask one counter at a time.
        async fn hit_parts(
            &self,
            parts: &[Part<'_>],
            cost: u64,
            now_ms: u64,
        ) -> Result<Outcome, StoreError> {
            let [p] = parts else { unreachable!("one part") };
            self.hit(p.counter, p.limits, cost, now_ms).await
        }

        async fn peek_parts(
            &self,
            parts: &[Part<'_>],
            cost: u64,
            now_ms: u64,
        ) -> Result<Outcome, StoreError> {
            let [p] = parts else { unreachable!("one part") };
            self.peek(p.counter, p.limits, cost, now_ms).await
        }

        async fn adjust(&self, _: &[Part<'_>], _: i64, _: u64, _: u64) -> Result<(), StoreError> {
            self.answer()
        }

        async fn free(&self, _: &[Part<'_>], _: u64) -> Result<(), StoreError> {
            self.answer()
        }

        async fn windows(
            &self,
            parts: &[Part<'_>],
            now_ms: u64,
        ) -> Result<(Vec<WindowSet>, u64), StoreError> {
            self.answer()
                .map(|()| (vec![WindowSet::default(); parts.len()], now_ms))
        }

        fn kind(&self) -> &'static str {
            "fake"
        }
    }

    fn failing(policy: FailurePolicy) -> Failover<Fake> {
        let f = Failover::new(Arc::new(Fake::default()), policy, Duration::from_secs(1));
        f.fake().failing.store(true, Ordering::SeqCst);
        f
    }

    impl Failover<Fake> {
        fn fake(&self) -> &Fake {
            self.shared().unwrap()
        }
    }

    const KEY: fn() -> CounterKey = || CounterKey::new(b"k", "GET /a");

    #[tokio::test]
    async fn each_policy_answers_for_a_failing_backend() {
        let local = failing(FailurePolicy::Local);
        for remaining in [1, 0] {
            let Verdict::Local(q) = local.hit_per_minute(&KEY(), 2, 100).await else {
                panic!("local")
            };
            assert_eq!((q.allowed, q.remaining), (true, remaining));
        }
        assert!(
            matches!(local.hit_per_minute(&KEY(), 2, 100).await, Verdict::Local(q) if !q.allowed)
        );
        let divvy = CounterKey::divvy("m=a", "x");
        let fixed = [Limit::fixed(1, 60)];
        assert!(matches!(
            local.hit(&divvy, &fixed, 1, 100_000).await,
            Verdict::Local(o) if o.allowed
        ));
        let open = failing(FailurePolicy::Open);
        assert_eq!(open.hit_per_minute(&KEY(), 2, 100).await, Verdict::Open);
        let closed = failing(FailurePolicy::Closed);
        assert_eq!(closed.hit_per_minute(&KEY(), 2, 100).await, Verdict::Closed);
        assert_eq!(
            closed.hit(&divvy, &fixed, 1, 100_000).await,
            Verdict::Closed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_down_backend_is_not_asked_until_the_probe_sees_it_answer() {
        let store = failing(FailurePolicy::Closed);
        store.hit_per_minute(&KEY(), 5, 100).await;
        assert!(store.is_degraded());
        assert_eq!(store.errors.get(), 1);
        for _ in 0..20 {
            assert_eq!(store.hit_per_minute(&KEY(), 5, 100).await, Verdict::Closed);
        }
        // One failing call, then none while down.
        assert_eq!(store.fake().calls.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(store.fake().probes.load(Ordering::SeqCst), 2);
        assert!(store.is_degraded());

        store.fake().failing.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!store.is_degraded());
        assert!(
            matches!(store.hit_per_minute(&KEY(), 5, 100).await, Verdict::Decided(q) if q.allowed)
        );
        assert_eq!(store.fake().calls.load(Ordering::SeqCst), 2);
        assert_eq!(store.errors.get(), 1);
    }

    #[tokio::test]
    async fn a_zero_limit_never_reaches_the_backend() {
        let store = Failover::new(
            Arc::new(Fake::default()),
            FailurePolicy::Closed,
            Duration::from_secs(1),
        );
        assert_eq!(
            store.hit_per_minute(&KEY(), 0, 100).await,
            Verdict::Decided(Quota::zero_limit())
        );
        assert_eq!(store.fake().calls.load(Ordering::SeqCst), 0);
    }
}
