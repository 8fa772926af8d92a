//! scripts: the calls of `window.lua` (sliding windows and calendar periods) and `divvy.lua`
//! (fixed windows) that decide a request on Redis alone, and the reads `peek` makes; their
//! arguments and replies are `script.rs`'s.

use super::*;

impl RedisStore {
    /// Checks one request of `cost` against the limits of its `parts` (its counters: one, or
    /// its own and its pools') and counts it where it belongs. `now_ms` is the caller's clock;
    /// with [`TimeSource::Redis`] it only helps name the keys.
    pub(super) async fn hit_sliding(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        if cost == 0 {
            return self.bounded(self.check_sliding(parts, now_ms)).await;
        }
        if let [p] = parts
            && let Some(q) = self.check_blocked(p.counter, p.limits, cost, now_ms)
        {
            self.stats().decided_by_block.inc();
            return Ok(Outcome::new(false, false, &[q]));
        }
        match self.leases_for(parts) {
            Some((leases, p)) => self.bounded(self.hit_leased(leases, p, cost, now_ms)).await,
            None if parts
                .iter()
                .any(|p| p.limits.iter().any(Limit::is_concurrent)) =>
            {
                Box::pin(self.bounded(self.hit_holding(parts, cost, now_ms))).await
            }
            None => {
                let call = self.run_window_script(parts, cost, now_ms, None, None);
                self.bounded(call).await.map(|c| c.outcome)
            }
        }
    }

    /// A check (cost 0) of sliding windows ([`RedisStore::check_windows`]); with leases in the
    /// counter's turn and told by the one rule.
    pub(super) async fn check_sliding(
        &self,
        parts: &[Part<'_>],
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        let Some((leases, part)) = self.leases_for(parts) else {
            return Ok(self.check_windows(parts, now_ms).await?.0);
        };
        let now_us = || self.lease_now_us(leases, now_ms);
        let key = part.counter;
        let set = LimitSet::new(part.limits);
        let (turn, seen) = match self.plan_leased(leases, key, &set, 0, now_us).await {
            Planned::Local(o) => return Ok(o),
            Planned::Call {
                args,
                give_apart,
                turn,
                seen,
            } => {
                // An ended lease goes back before the windows are read.
                let give = args.filter(|a| a.give > 0).map(|a| GiveBack {
                    limits: set,
                    units: a.give,
                    at_ms: a.given_at_ms,
                });
                for g in give_apart.into_iter().chain(give) {
                    self.give_back(key, g, now_ms).await?;
                }
                (turn, seen)
            }
            Planned::Unfollowed => return Ok(self.check_windows(parts, now_ms).await?.0),
        };
        let (o, exits_ms) = self.check_windows(parts, now_ms).await?;
        // The windows were read before now: an exit is never taken to come sooner than it does.
        let read_us = now_us();
        let mut exits_us = [0; MAX_LIMITS];
        for (e, ms) in exits_us.iter_mut().zip(exits_ms) {
            *e = read_us + i64::try_from(ms).unwrap_or(i64::MAX / 2000) * 1000;
        }
        let mut rooms = [None; MAX_LIMITS];
        for (r, q) in rooms.iter_mut().zip(o.quotas()) {
            *r = Some(q.remaining);
        }
        let answer = Answer {
            outcome: o,
            rooms,
            exits_us,
            granted: None,
            at_us: read_us,
        };
        let (told, _) = leases.settle(key, &set, 0, false, answer, &turn, seen);
        Ok(told)
    }

    /// The windows of each part's counter as Redis holds them at `now_ms` (Redis' time with its
    /// clock, returned), read with one `HGETALL` per hash: nothing counted.
    pub(super) async fn read_windows(
        &self,
        parts: &[Part<'_>],
        now_ms: u64,
    ) -> Result<(Vec<WindowSet>, u64), StoreError> {
        let now_ms = match self.time_source {
            TimeSource::Local => now_ms,
            TimeSource::Redis => {
                let (seconds, micros): (u64, u64) = self.command(redis::cmd("TIME")).await?;
                seconds * 1000 + micros / 1000
            }
        };
        let mut pipe = redis::pipe();
        let mut counts = Vec::with_capacity(parts.len());
        for p in parts {
            let reads = peek_reads(&self.prefix, p.counter, p.limits, now_ms);
            counts.push(reads.len());
            for read in reads {
                pipe.add_command(read);
            }
        }
        let replies: Vec<Fields> = self
            .bounded(self.on_connection(|mut conn| {
                let pipe = pipe.clone();
                async move { pipe.query_async::<Vec<Fields>>(&mut conn).await }
            }))
            .await?;
        let mut replies = replies.into_iter();
        let sets = parts
            .iter()
            .zip(counts)
            .map(|(p, n)| peek_windows(p.limits, now_ms, replies.by_ref().take(n).collect()))
            .collect();
        Ok((sets, now_ms))
    }

    /// A check (cost 0) of sliding windows: what the reference answers for a hit of 0
    /// ([`WindowSet::hit`]) on the windows as Redis holds them, nothing counted; and when each
    /// window's oldest count leaves it, in milliseconds from the time they were read at (0 when
    /// it holds none).
    pub(super) async fn check_windows(
        &self,
        parts: &[Part<'_>],
        now_ms: u64,
    ) -> Result<(Outcome, [u64; MAX_LIMITS]), StoreError> {
        let (mut sets, now_ms) = self.read_windows(parts, now_ms).await?;
        let o = {
            let mut decided: Vec<(&mut WindowSet, &[Limit])> = sets
                .iter_mut()
                .zip(parts)
                .map(|(w, p)| (w, p.limits))
                .collect();
            hit_parts(&mut decided, 0, now_ms)
        };
        let mut exits_ms = [0; MAX_LIMITS];
        let each = parts
            .iter()
            .zip(&sets)
            .flat_map(|(p, w)| p.limits.iter().map(move |l| (l, w)));
        for (e, (l, windows)) in exits_ms.iter_mut().zip(each) {
            let exit = match l.period() {
                // Nothing leaves a period before it ends.
                Some(p) => windows
                    .get_tally(p, l.zone)
                    .filter(|t| t.count > 0)
                    .map(|t| t.end_ms),
                None => windows.get(l.w).and_then(|w| w.oldest_exit_ms(now_ms)),
            };
            if let Some(ms) = exit {
                *e = ms.saturating_sub(now_ms);
            }
        }
        Ok((o, exits_ms))
    }

    pub(super) async fn run_window_script(
        &self,
        parts: &[Part<'_>],
        cost: u64,
        now_ms: u64,
        lease: Option<LeaseArgs>,
        slot: Option<SlotArg<'_>>,
    ) -> Result<Called, StoreError> {
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX / 2);
        let window = WindowCall::new(&self.prefix, parts).with_slot(slot);
        let set;
        let limits = match parts {
            [p] => p.limits,
            _ => {
                set = LimitSet::of_parts(parts.iter().map(|p| p.limits));
                set.as_slice()
            }
        };
        // Two tries: the second uses the minute Redis told us about in the first.
        for _ in 0..2 {
            let (estimate, caller_ms) = match self.time_source {
                TimeSource::Redis => (now + self.offset.load(Ordering::Relaxed), None),
                TimeSource::Local => (now, Some(now)),
            };
            let call = window.command(cost, estimate, caller_ms, lease, |k, a, b| {
                WINDOW.call(k, a, b)
            });
            let call = &call;
            let reply: String = self
                .on_connection(|mut conn| async move { WINDOW.run(&mut conn, call).await })
                .await?;
            match WindowReply::read(&reply, limits) {
                Some(WindowReply::WrongMinute { redis_now_ms }) => {
                    self.offset.store(redis_now_ms - now, Ordering::Relaxed);
                }
                Some(WindowReply::GaveBack { redis_now_ms }) => {
                    return Ok(Called {
                        outcome: Outcome::new(false, false, &[]),
                        grant: 0,
                        redis_now_ms,
                        micros: None,
                        resets_ms: [0; MAX_LIMITS],
                        rooms: [None; MAX_LIMITS],
                    });
                }
                Some(WindowReply::Decided {
                    outcome,
                    grant,
                    redis_now_ms,
                    micros,
                    retry_ms,
                    resets_ms,
                    rooms,
                }) => {
                    self.stats().decided_by_redis.inc();
                    if let Some(micros) = micros {
                        self.offset.store(redis_now_ms - now, Ordering::Relaxed);
                        self.blocked
                            .observe_redis_time(redis_now_ms.div_euclid(1000), micros);
                    }
                    if let [p] = parts
                        && let [l] = p.limits
                        && !l.shadow
                        && !outcome.allowed
                        && retry_ms > 0
                    {
                        // With leases, room may come back when one is given back: by the end
                        // of the next bucket at the latest.
                        let trust_ms = match self.leases {
                            None => i64::MAX,
                            Some(_) => {
                                let at = u64::try_from(redis_now_ms).unwrap_or(0);
                                i64::try_from(bucket_end_ms(limits, at)).unwrap_or(i64::MAX)
                            }
                        };
                        self.blocked
                            .remember(p.counter, l, cost, redis_now_ms, retry_ms, trust_ms);
                    }
                    return Ok(Called {
                        outcome,
                        grant,
                        redis_now_ms,
                        micros,
                        resets_ms,
                        rooms,
                    });
                }
                None => {
                    return Err(StoreError::reply(format!(
                        "unexpected script reply {reply:?}"
                    )));
                }
            }
        }
        Err(StoreError::reply(
            "the minute moved twice during one call".into(),
        ))
    }

    /// `divvy.lua` with lease arguments (`args.want` 0 and `cost` 0: a give-back alone).
    pub(super) async fn fixed_script(
        &self,
        name: &str,
        limit: u64,
        reset: u64,
        cost: u64,
        args: Option<LeaseArgs>,
    ) -> Result<FixedReply, StoreError> {
        let args = args.unwrap_or_default();
        let mut call = DIVVY.call(1, 7, name.len() + 120);
        call.arg(name)
            .arg(limit)
            .arg(reset)
            .arg(cost)
            .arg(args.want)
            .arg(args.give)
            .arg(args.given_at_ms);
        let call = &call;
        let reply: String = self
            .on_connection(|mut conn| async move { DIVVY.run(&mut conn, call).await })
            .await?;
        read_divvy_lease_reply(&reply)
            .ok_or_else(|| StoreError::reply(format!("unexpected script reply {reply:?}")))
    }

    /// One hit of `cost` on the fixed window `name` of `l`, lasting `seconds` if it starts now.
    pub(super) async fn hit_fixed_script(
        &self,
        name: &str,
        l: &Limit,
        seconds: u64,
        cost: u64,
    ) -> Result<Outcome, StoreError> {
        let fut = async {
            let mut call = DIVVY.call(1, 4, name.len() + 60);
            call.arg(name).arg(l.rl).arg(seconds).arg(cost);
            let call = &call;
            let reply: String = self
                .on_connection(|mut conn| async move { DIVVY.run(&mut conn, call).await })
                .await?;
            let d = read_divvy_reply(&reply)
                .ok_or_else(|| StoreError::reply(format!("unexpected script reply {reply:?}")))?;
            self.stats().decided_by_redis.inc();
            Ok(fixed_outcome(l, cost, d.allowed, d.credit, d.ttl))
        };
        self.bounded(fut).await
    }

    /// One hit of `cost` on `key`'s fixed window of `l` at `now_ms`: `divvy.lua` on the window's
    /// key ([`keys::fixed_window`]). Divvy's keys carry no time: Redis' own expiry times the
    /// window; an aligned window's key names its place on the caller's clock.
    pub(super) async fn hit_fixed(
        &self,
        key: &CounterKey,
        l: &Limit,
        cost: u64,
        now_ms: u64,
    ) -> Result<Outcome, StoreError> {
        let span = Span::of(l, now_ms);
        let name = keys::fixed_window(key, l, &span);
        match &self.leases {
            Some(leases) => {
                self.bounded(self.hit_fixed_leased(leases, &name, l, span.seconds, cost))
                    .await
            }
            _ => self.hit_fixed_script(&name, l, span.seconds, cost).await,
        }
    }
}
