//! held: concurrency limits' slots on Redis: taken in the script call, freed by name when
//! the call ends without a reply, renewed while this instance holds them (`slots.rs` keeps which).

use super::*;

impl RedisStore {
    /// [`RedisStore::hit_sliding`] for a request with concurrency limits: the slots it takes are
    /// named once (a retried call takes none twice) and held, renewed, until it ends
    /// ([`CounterStore::free`]).
    pub(super) async fn hit_holding(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        let who = self.held.name();
        let slot = SlotArg {
            renew: false,
            who: &who,
            hold_ms: self.held.hold_ms(),
        };
        // Until the reply says what was taken, a call dropped (its client gone, its time up) or
        // failed may have taken slots that nothing here would free or renew: they are freed by
        // name (a free of a slot never taken does nothing).
        let mut taking = Taking {
            store: self.me.get().cloned(),
            slots: parts
                .iter()
                .flat_map(|p| p.limits.iter().map(move |l| (p.counter, l)))
                .filter(|(_, l)| l.is_concurrent())
                .map(|(c, l)| (c.clone(), *l))
                .collect(),
            who: who.clone(),
            now_ms,
        };
        let called = self
            .run_window_script(parts, cost, now_ms, None, Some(slot))
            .await?;
        taking.slots.clear();
        let o = called.outcome;
        let limits = parts
            .iter()
            .flat_map(|p| p.limits.iter().map(move |l| (p, l)));
        let mut took = false;
        for (i, (p, l)) in limits.enumerate() {
            if l.is_concurrent() && o.counted_in(i, l) {
                self.held.took(p.counter, &who);
                took = true;
            }
        }
        if took {
            self.renew_slots();
        }
        Ok(o)
    }

    /// Frees slot `who` of each of `slots` (counter and concurrency limit).
    pub(super) async fn free_named(&self, slots: &[(CounterKey, Limit)], who: &str, now_ms: u64) {
        for (counter, l) in slots {
            if let Err(e) = self.free_one(counter, l, who, now_ms).await {
                tracing::debug!(error = %e, "freeing a slot whose call was dropped failed; its hold time frees it");
            }
        }
    }

    /// Frees slot `who` of `counter`'s concurrency limit `l`: one script call (a give-back).
    pub(super) async fn free_one(
        &self,
        counter: &CounterKey,
        l: &Limit,
        who: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let limits = [*l];
        let part = [Part {
            counter,
            limits: &limits,
        }];
        let slot = SlotArg {
            renew: false,
            who,
            hold_ms: self.held.hold_ms(),
        };
        let give = LeaseArgs {
            want: 0,
            give: 1,
            given_at_ms: i64::try_from(now_ms).unwrap_or(i64::MAX / 2),
        };
        let call = self.run_window_script(&part, 0, now_ms, Some(give), Some(slot));
        self.bounded(call).await.map(|_| ())
    }

    /// Starts, once, the task that renews the slots this instance holds, every third of their
    /// hold time, for as long as the store lives.
    pub(super) fn renew_slots(&self) {
        let Some(me) = self.me.get().cloned() else {
            return;
        };
        if self.renewing.set(()).is_err() {
            return;
        }
        let every = self.held.renew_every();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(store) = me.upgrade() else { return };
                store.renew_slots_now().await;
            }
        });
    }

    /// Renews every slot this instance holds: each is held its hold time from now (by the
    /// store's clock, or Redis'). A store that is not shared ([`RedisStore::shared`]) renews
    /// only when this is called.
    pub async fn renew_slots_now(&self) {
        let now_ms = self.clock.now_ms();
        for (counter, names) in self.held.renewals() {
            let limits = [Limit::concurrent(1)];
            let parts = [Part {
                counter: &counter,
                limits: &limits,
            }];
            let slot = SlotArg {
                renew: true,
                who: &names,
                hold_ms: self.held.hold_ms(),
            };
            let call = self.run_window_script(&parts, 0, now_ms, None, Some(slot));
            if let Err(e) = self.bounded(call).await {
                tracing::debug!(error = %e, "renewing concurrency slots failed; they are tried again in a third of their hold time");
            }
        }
    }

    /// Concurrency-limit slots this instance holds on Redis now.
    pub fn slots_held(&self) -> usize {
        self.held.len()
    }

    /// Frees one slot this instance holds in each concurrency limit of `parts`.
    pub(super) async fn free_slots(
        &self,
        parts: &[Part<'_>],
        now_ms: u64,
    ) -> Result<(), StoreError> {
        for p in parts {
            let Some(l) = p.limits.iter().find(|l| l.is_concurrent()) else {
                continue;
            };
            // A slot not held here (taken before a failover, or dropped after a failed call) is
            // freed by its hold time.
            let Some(who) = self.held.release(p.counter) else {
                continue;
            };
            self.free_one(p.counter, l, &who, now_ms).await?;
        }
        Ok(())
    }
}
