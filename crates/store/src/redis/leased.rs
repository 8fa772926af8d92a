//! leased: busy counters decided from leases (`lease.rs` plans and settles; the calls are
//! here): a request planned against its counter's lease, the script call that takes or gives one
//! back, and the give-back when a lease ends.

use super::*;

impl Drop for Taking {
    fn drop(&mut self) {
        if self.slots.is_empty() {
            return;
        }
        let (Some(store), Ok(runtime)) = (
            self.store.as_ref().and_then(Weak::upgrade),
            tokio::runtime::Handle::try_current(),
        ) else {
            return;
        };
        let (slots, who, now_ms) = (
            std::mem::take(&mut self.slots),
            std::mem::take(&mut self.who),
            self.now_ms,
        );
        // On this thread's runtime, so on the connection the dropped call went out on: Redis
        // runs the free after the take, whenever the take arrives.
        runtime.spawn(async move { store.free_named(&slots, &who, now_ms).await });
    }
}

impl RedisStore {
    /// The leases `parts` are decided with, and its one part: none for a request that counts in
    /// a pool. A lease is one counter's, spent by the requests of that counter alone; a pool's
    /// windows are counted by the requests of several endpoints, so what one of them could tell
    /// from a lease would miss what the others counted meanwhile (docs/stores.md).
    pub(super) fn leases_for<'a>(
        &'a self,
        parts: &'a [Part<'a>],
    ) -> Option<(&'a Leases, &'a Part<'a>)> {
        match (&self.leases, parts) {
            // Slots are taken and freed by each request: never from a lease.
            (Some(leases), [p])
                if !p.counter.is_pool() && !p.limits.iter().any(Limit::is_concurrent) =>
            {
                Some((leases, p))
            }
            _ => None,
        }
    }

    /// A refusal remembered for `key`, if one applies now.
    pub(super) fn check_blocked(
        &self,
        key: &CounterKey,
        limits: &[Limit],
        cost: u64,
        now_ms: u64,
    ) -> Option<Quota> {
        let [l] = limits else { return None };
        if l.shadow || l.is_concurrent() {
            return None;
        }
        let caller_ms = match self.time_source {
            TimeSource::Redis => None,
            TimeSource::Local => Some(i64::try_from(now_ms).unwrap_or(i64::MAX / 2)),
        };
        self.blocked.check(key, l, cost, caller_ms)
    }

    /// The lease clock now: the caller's milliseconds with its clock, else this store's own.
    pub(super) fn lease_now_us(&self, leases: &Leases, now_ms: u64) -> i64 {
        match self.time_source {
            TimeSource::Local => i64::try_from(now_ms)
                .unwrap_or(i64::MAX / 2000)
                .saturating_mul(1000),
            TimeSource::Redis => leases.elapsed_us(),
        }
    }

    /// Plans a request on a leased counter: decided by its lease, or the call to make in the
    /// counter's turn (waited for when it is not free). `now_us`: the lease clock, read again
    /// once the turn comes.
    pub(super) async fn plan_leased(
        &self,
        leases: &Leases,
        key: &CounterKey,
        limits: &LimitSet,
        cost: u64,
        now_us: impl Fn() -> i64,
    ) -> Planned {
        // Calls that change a lease take the counter's turn alone, the others share it: the lease
        // held here and the counts a reply reflects then always match. Those waiting for a call
        // that takes a lease are mostly decided by it.
        let mut plan = leases.plan(key, limits, cost, now_us());
        if let Plan::Wait { line, alone, seen } = plan {
            let turn = Turn::wait(line, alone).await;
            plan = leases.plan_in_turn(key, limits, cost, now_us(), turn, seen);
        }
        match plan {
            Plan::Local(o) => Planned::Local(o),
            Plan::Ask {
                args,
                give_apart,
                turn,
                seen,
            } => Planned::Call {
                args,
                give_apart,
                turn,
                seen,
            },
            // Planned in its turn: never waits again.
            Plan::Wait { .. } | Plan::Unfollowed => Planned::Unfollowed,
        }
    }

    /// [`RedisStore::hit_sliding`] with leases: decided from the counter's lease when it has
    /// units left in its bucket, else by a script call in the counter's turn that gives back what
    /// an ended lease left and, for a busy counter, takes the next. What it tells follows one
    /// rule however it was decided ([`crate::lease::Told`]).
    pub(super) async fn hit_leased(
        &self,
        leases: &Leases,
        part: &Part<'_>,
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        let now_us = || self.lease_now_us(leases, now_ms);
        let parts = std::slice::from_ref(part);
        let (key, limits) = (part.counter, part.limits);
        let set = LimitSet::new(limits);
        let planned = self.plan_leased(leases, key, &set, cost, now_us).await;
        let (args, give_apart, turn, seen) = match planned {
            Planned::Local(o) => return Ok(o),
            Planned::Call {
                args,
                give_apart,
                turn,
                seen,
            } => (args, give_apart, turn, seen),
            Planned::Unfollowed => {
                let call = self.run_window_script(parts, cost, now_ms, None, None);
                return call.await.map(|c| c.outcome);
            }
        };
        if let Some(g) = give_apart {
            self.give_back(key, g, now_ms).await?;
        }
        let sent_us = leases.elapsed_us();
        // A give-back in a failed call may or may not have happened: its units stay counted at
        // worst, until they leave the window (refusing early, never too much).
        let called = self
            .run_window_script(parts, cost, now_ms, args, None)
            .await?;
        if let Some(a) = args
            && a.give > 0
        {
            leases.gave_back(a.give);
        }
        let at_ms = called.redis_now_ms;
        // The reply's instant on the lease clock. With Redis' clock, its arrival: Redis read its
        // clock before, so what it says leaves at some time is never taken to leave sooner here.
        let reply_us = match self.time_source {
            TimeSource::Local => at_ms.saturating_mul(1000),
            TimeSource::Redis => leases.elapsed_us(),
        };
        let mut exits_us = [0; MAX_LIMITS];
        for (e, ms) in exits_us.iter_mut().zip(called.resets_ms) {
            *e = reply_us + ms * 1000;
        }
        let granted = (called.grant > 0).then(|| {
            let end_ms = bucket_end_ms(limits, u64::try_from(at_ms).unwrap_or(0));
            let end_ms = i64::try_from(end_ms).unwrap_or(i64::MAX / 2000);
            let until_us = match self.time_source {
                TimeSource::Local => end_ms * 1000,
                // Redis read its clock after the call left: the lease ends here no later than
                // its bucket ends there.
                TimeSource::Redis => until_on_redis_clock(sent_us, at_ms, called.micros, end_ms),
            };
            Granted {
                units: called.grant,
                at_ms,
                until_us,
            }
        });
        let asked = args.is_some_and(|a| a.want > 0);
        let answer = Answer {
            outcome: called.outcome,
            rooms: called.rooms,
            exits_us,
            granted,
            at_us: reply_us,
        };
        let (told, lease) = leases.settle(key, &set, cost, asked, answer, &turn, seen);
        drop(turn);
        if let Some(g) = granted {
            self.blocked.remove(key);
            if let Some(id) = lease
                && self.time_source == TimeSource::Redis
            {
                self.give_back_at(key, id, g.until_us, leases);
            }
        }
        Ok(told)
    }

    /// Gives lease `id` of `key` back at lease-clock `until_us` (its bucket's end), unless a call
    /// has done it by then.
    pub(super) fn give_back_at(&self, key: &CounterKey, id: u64, until_us: i64, leases: &Leases) {
        let Some(me) = self.me.get().cloned() else {
            return;
        };
        let at = leases.instant_of(until_us);
        let key = key.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(store) = me.upgrade() else { return };
            let Some(leases) = &store.leases else { return };
            // A give-back is a call of the counter like any other: it waits its turn.
            let Some(line) = leases.turn(&key) else {
                return;
            };
            let _turn = Turn::wait(line, true).await;
            let Some(g) = leases.expire(&key, id) else {
                return;
            };
            let now_ms = store.clock.now_ms();
            if let Err(e) = store.bounded(store.give_back(&key, g, now_ms)).await {
                tracing::debug!(error = %e, "giving a lease back failed; its units stay counted until they leave the window");
            }
        });
    }

    /// Gives back `g`'s units (a call of its own, with the limits the lease was counted in).
    pub(super) async fn give_back(
        &self,
        key: &CounterKey,
        g: GiveBack,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let args = LeaseArgs {
            want: 0,
            give: g.units,
            given_at_ms: g.at_ms,
        };
        match (key.fixed_name(), g.limits.as_slice()) {
            (Some(name), [l]) => {
                self.fixed_script(name, l.rl, 1, 0, Some(args)).await?;
            }
            _ => {
                let parts = [Part {
                    counter: key,
                    limits: g.limits.as_slice(),
                }];
                self.run_window_script(&parts, 0, now_ms, Some(args), None)
                    .await?;
            }
        }
        if let Some(l) = &self.leases {
            l.gave_back(g.units);
        }
        Ok(())
    }

    /// [`RedisStore::hit_fixed_script`] with leases: decided from the window's lease while it
    /// has credit left (for at most a second, never past the window's end), else by a script
    /// call in the counter's turn that gives back what an ended lease left and, for a busy
    /// window, takes the next. A check (cost 0) changes no lease.
    pub(super) async fn hit_fixed_leased(
        &self,
        leases: &Leases,
        name: &str,
        l: &Limit,
        seconds: u64,
        cost: u64,
    ) -> Result<Outcome, StoreError> {
        // Fixed windows live by Redis' expiry: their leases keep this store's own clock.
        let key = &CounterKey::fixed(name);
        let limits = &LimitSet::new(std::slice::from_ref(l));
        let now_us = || leases.elapsed_us();
        let local = |o: Outcome| {
            let q = o.quotas()[0];
            let ttl = i64::try_from(q.reset).unwrap_or(i64::MAX);
            fixed_outcome(l, cost, o.allowed, q.remaining, ttl)
        };
        let (args, turn, seen) = match self.plan_leased(leases, key, limits, cost, now_us).await {
            Planned::Local(o) => return Ok(local(o)),
            Planned::Call {
                args, turn, seen, ..
            } => (args, turn, seen),
            Planned::Unfollowed => return self.hit_fixed_script(name, l, seconds, cost).await,
        };
        let sent_us = leases.elapsed_us();
        let args = args.unwrap_or_default();
        let reply = self
            .fixed_script(name, l.rl, seconds, cost, Some(args))
            .await?;
        if args.give > 0 {
            leases.gave_back(args.give);
        }
        let FixedReply::Decided {
            decision: d,
            grant,
            expiry_ms,
            pttl_ms,
        } = reply
        else {
            return Err(StoreError::reply(
                "a give-back where a decision was due".into(),
            ));
        };
        self.stats().decided_by_redis.inc();
        // The window ends there no sooner than its TTL from the reply's arrival here.
        let reply_us = leases.elapsed_us();
        let granted = (grant > 0 && pttl_ms > 1).then(|| Granted {
            units: grant,
            at_ms: expiry_ms,
            // Redis read its clock after the call left: the lease ends here before the window
            // ends there.
            until_us: until_of_ttl(sent_us, pttl_ms),
        });
        let mut rooms = [None; MAX_LIMITS];
        rooms[0] = Some(d.credit);
        let mut exits_us = [0; MAX_LIMITS];
        exits_us[0] = reply_us + pttl_ms.max(0) * 1000;
        let answer = Answer {
            outcome: fixed_outcome(l, cost, d.allowed, d.credit, d.ttl),
            rooms,
            exits_us,
            granted,
            at_us: reply_us,
        };
        let (told, lease) = leases.settle(key, limits, cost, args.want > 0, answer, &turn, seen);
        drop(turn);
        if let (Some(g), Some(id)) = (granted, lease) {
            self.give_back_at(key, id, g.until_us, leases);
        }
        Ok(told)
    }
}
