//! Store behaviour suite: the same cases against the memory store and a real redis-server, plus the
//! Redis-only matters (shared clock, lost scripts, outages and the failure policy).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use quotagate_engine::clock::SystemClock;
use quotagate_engine::limiter::{
    FixedWindow, Kind, Limit, Outcome, Period, Quota, Span, Window, WindowSet, ZoneId,
};
use quotagate_store::connect::TlsFiles;
use quotagate_store::{
    CounterKey, FailurePolicy, LeaseMode, MemoryStore, RedisMode, RedisOptions, RedisStore,
    RedisTarget, Store, TimeSource, Verdict,
};
use support::{RedisCluster, RedisServer, SentinelSet, TlsRedis, eventually, file_in};

/// Second 0 of a minute.
const T0: u64 = 1_700_000_040;

/// A store under test, plus the redis-server behind it (if any), kept alive for the test.
struct Subject {
    store: Store,
    /// Tells apart the keys of cases that name Redis keys themselves (fixed windows), run more
    /// than once on one deployment.
    tag: String,
    _redis: Option<RedisServer>,
    /// The embedded store's directory, when it keeps one.
    _dir: Option<tempfile::TempDir>,
}

/// A store on a shared topology (cluster, TLS server), with a key prefix of its own so that the
/// cases run one after another on one deployment without seeing each other's counters.
fn subject_on(target: RedisTarget, prefix: &str) -> Subject {
    subject_leased_on(target, prefix, LeaseMode::Off)
}

/// [`subject_on`] with leases `lease`.
fn subject_leased_on(target: RedisTarget, prefix: &str, lease: LeaseMode) -> Subject {
    let options = RedisOptions {
        target,
        lease,
        prefix: format!("qg-{prefix}-{lease:?}"),
        // Connecting to a cluster reads its topology first: more than one round trip.
        timeout: Duration::from_secs(2),
        ..redis_options("redis://unused".into(), TimeSource::Local)
    };
    Subject {
        store: Store::redis(
            RedisStore::connect(&options).unwrap(),
            FailurePolicy::Closed,
            Duration::from_millis(50),
        ),
        tag: format!("{lease:?}"),
        _redis: None,
        _dir: None,
    }
}

fn cluster_target(c: &RedisCluster) -> RedisTarget {
    RedisTarget::new(&c.url(), RedisMode::Cluster, "", "", &TlsFiles::default()).unwrap()
}

fn sentinel_target(s: &SentinelSet) -> RedisTarget {
    RedisTarget::new(
        &s.url(),
        RedisMode::Sentinel,
        support::SENTINEL_MASTER,
        "",
        &TlsFiles::default(),
    )
    .unwrap()
}

/// A TLS-only server that wants a client certificate, reached with the test's CA and client
/// certificate and an ACL user whose password comes from a file.
fn tls_target(t: &TlsRedis, password_file: &str) -> RedisTarget {
    let files = TlsFiles {
        ca: &t.certs.path("ca.pem"),
        cert: &t.certs.path("client.pem"),
        key: &t.certs.path("client.key"),
        insecure: false,
    };
    let url = format!("rediss://quota:placeholder@127.0.0.1:{}", t.port);
    RedisTarget::new(&url, RedisMode::Single, "", password_file, &files).unwrap()
}

/// redis-server arguments: an ACL user `quota` and no default user.
const ACL_ARGS: [&str; 10] = [
    "--user",
    "quota",
    "on",
    ">s3cret-pw",
    "~*",
    "&*",
    "+@all",
    "--user",
    "default",
    "off",
];

/// redis-cli's arguments to log in as `ACL_ARGS`'s user.
const ACL_LOGIN: [&str; 4] = ["--user", "quota", "--pass", "s3cret-pw"];

impl Subject {
    async fn hit(&self, key: &CounterKey, limit: u64, now: u64) -> Quota {
        match self.store.hit_per_minute(key, limit, now).await {
            Verdict::Decided(d) => d,
            other => panic!("store did not decide: {other:?}"),
        }
    }

    async fn hit_all(&self, key: &CounterKey, limits: &[Limit], cost: u64, now_ms: u64) -> Outcome {
        match self.store.hit(key, limits, cost, now_ms).await {
            Verdict::Decided(o) => o,
            other => panic!("store did not decide: {other:?}"),
        }
    }

    async fn peek(&self, key: &CounterKey, limit: u64, now: u64) -> Quota {
        let limits = [Limit::per_minute(limit)];
        self.store
            .peek(key, &limits, 1, now * 1000)
            .await
            .unwrap()
            .quotas()[0]
    }
}

fn redis_options(url: String, time_source: TimeSource) -> RedisOptions {
    RedisOptions {
        target: quotagate_store::RedisTarget::single(&url).unwrap(),
        timeout: Duration::from_millis(250),
        pool_size: 8,
        prefix: "qgtest".into(),
        time_source,
        connections: 1,
        lease: LeaseMode::Off,
        lease_max_units: 1000,
        concurrency_hold: Duration::from_secs(10),
    }
}

fn memory() -> Subject {
    Subject {
        store: Store::memory(),
        tag: String::new(),
        _redis: None,
        _dir: None,
    }
}

/// The embedded store keeping its counters in a directory (`store.path`): every answer waits
/// for the commit that makes it durable (committing at once, not every 20 ms: the cases wait on
/// one answer at a time).
fn on_disk_in(dir: &std::path::Path) -> MemoryStore {
    MemoryStore::open_with(dir, Arc::new(SystemClock::new()), Duration::ZERO).unwrap()
}

/// [`on_disk_in`] for a directory whose store was just closed in this process. Its lock is an
/// `flock` on an open file, and a child forked meanwhile by another test of this binary (a
/// `redis-server` started) holds a copy of the descriptor until it execs, so for that moment
/// the lock is still held: the open is tried again until a deadline, while the refusal is the
/// one naming this process (seen in CI: "in use by another quotagate (pid <this test's>)").
fn reopen_on_disk(dir: &std::path::Path) -> MemoryStore {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match MemoryStore::open_with(dir, Arc::new(SystemClock::new()), Duration::ZERO) {
            Ok(store) => return store,
            Err(e)
                if e.to_string()
                    .contains(&format!("(pid {})", std::process::id()))
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::yield_now();
            }
            Err(e) => panic!("{e}"),
        }
    }
}

fn disk() -> Subject {
    let dir = tempfile::tempdir().unwrap();
    Subject {
        store: Store::embedded(on_disk_in(dir.path()), FailurePolicy::Closed),
        tag: String::new(),
        _redis: None,
        _dir: Some(dir),
    }
}

fn redis() -> Subject {
    redis_with(LeaseMode::Off)
}

/// Leases on: busy counters decide in memory (single instance: every answer the same).
fn redis_leased() -> Subject {
    redis_with(LeaseMode::Auto)
}

fn redis_with(lease: LeaseMode) -> Subject {
    let server = RedisServer::start();
    let options = RedisOptions {
        lease,
        ..redis_options(server.url(), TimeSource::Local)
    };
    let store = RedisStore::connect(&options).unwrap();
    Subject {
        store: Store::redis(store, FailurePolicy::Closed, Duration::from_millis(50)),
        tag: String::new(),
        _redis: Some(server),
        _dir: None,
    }
}

/// One test per backend for each behaviour case.
macro_rules! on_every_store {
    ($($case:ident),* $(,)?) => {
        mod on_memory { $( #[tokio::test] async fn $case() { super::$case(super::memory()).await } )* }
        mod on_disk { $( #[tokio::test] async fn $case() { super::$case(super::disk()).await } )* }
        mod on_redis { $( #[tokio::test] async fn $case() { super::$case(super::redis()).await } )* }
        mod on_redis_leased { $( #[tokio::test] async fn $case() { super::$case(super::redis_leased()).await } )* }
        /// Every case on one 3-master Redis Cluster (started once: it takes seconds), with leases
        /// off and on.
        #[tokio::test]
        async fn on_cluster_every_case() {
            let cluster = RedisCluster::start(3, 0);
            for lease in [LeaseMode::Off, LeaseMode::Auto] {
                $( $case(subject_leased_on(cluster_target(&cluster), stringify!($case), lease)).await; )*
            }
        }
        /// Every case on a sentinel-managed master.
        #[tokio::test]
        async fn on_sentinel_every_case() {
            let set = SentinelSet::start();
            $( $case(subject_on(sentinel_target(&set), stringify!($case))).await; )*
        }
        /// Every case on a 3-master cluster that speaks only TLS.
        #[tokio::test]
        async fn on_tls_cluster_every_case() {
            let certs = support::Certs::make();
            let cluster = RedisCluster::start_tls(3, &certs);
            let files = TlsFiles { ca: &certs.path("ca.pem"), ..TlsFiles::default() };
            $(
                let target = RedisTarget::new(&cluster.url(), RedisMode::Cluster, "", "", &files).unwrap();
                $case(subject_on(target, stringify!($case))).await;
            )*
        }
        /// Every case on a sentinel-managed master, sentinels and data nodes speaking only TLS.
        #[tokio::test]
        async fn on_tls_sentinel_every_case() {
            let certs = support::Certs::make();
            let set = SentinelSet::start_tls(&certs);
            let files = TlsFiles { ca: &certs.path("ca.pem"), ..TlsFiles::default() };
            $(
                let target = RedisTarget::new(
                    &set.url(), RedisMode::Sentinel, support::SENTINEL_MASTER, "", &files,
                ).unwrap();
                $case(subject_on(target, stringify!($case))).await;
            )*
        }
        /// Every case over TLS with a client certificate and an ACL user.
        #[tokio::test]
        async fn on_tls_every_case() {
            let tls = TlsRedis::start(true, &ACL_ARGS, &ACL_LOGIN);
            let pw = file_in(tls.certs.dir.path(), "pw", "s3cret-pw\n");
            $( $case(subject_on(tls_target(&tls, pw.to_str().unwrap()), stringify!($case))).await; )*
        }
    };
}

on_every_store!(
    allows_up_to_the_limit_and_counts_down,
    retry_after_is_exact,
    window_spans_a_minute_boundary,
    rejected_requests_are_not_counted,
    zero_limit_always_rejects,
    counters_are_per_key_and_endpoint,
    lowered_and_raised_limits_apply_to_the_same_counts,
    time_never_runs_backwards,
    concurrent_requests_never_overshoot,
    agrees_with_the_reference_window_on_a_random_workload,
    agrees_with_the_reference_window_on_busy_keys,
    peeking_counts_nothing_and_tells_what_a_hit_would,
    reset_forgets_one_api_key_on_every_endpoint,
    several_windows_count_together_or_not_at_all,
    cost_uses_units_and_a_cost_above_the_limit_never_passes,
    shadow_limits_count_but_never_refuse,
    agrees_with_the_reference_counter_on_random_windows_costs_and_shadows,
    peeking_several_windows_agrees_with_the_reference,
    fixed_windows_take_a_cost_only_when_it_fits,
    fixed_windows_agree_with_the_engine_on_random_costs,
    a_day_quota_beside_a_per_second_limit_resets_at_local_midnight,
    calendar_periods_agree_with_the_reference_across_their_boundaries,
    pools_and_endpoints_agree_with_the_reference,
    reported_costs_replace_reservations_as_the_reference_does,
    concurrency_slots_are_taken_and_freed,
    concurrency_slots_agree_with_the_reference_beside_rates_and_pools,
);

/// Requests reserve their cost, and later their response reports what they cost
/// (`Store::adjust`): more is counted whatever the room (counts may go above a limit, and later
/// requests are refused until room comes), less is given back where the reservation was counted.
/// On an endpoint of its own and on one with a pool (each endpoint always the same: a catalog
/// gives an endpoint its pools for good); every answer the reference's (`WindowSet::add` /
/// `give_back`).
async fn reported_costs_replace_reservations_as_the_reference_does(s: Subject) {
    use quotagate_store::Part;
    let mut next = xorshift(0x7A3C_0FFE_E15C_0DE5u64);
    let (alone, chat, pool) = (
        CounterKey::new(b"reporter", "POST /complete"),
        CounterKey::new(b"reporter", "POST /chat"),
        CounterKey::pool(b"reporter", "llm"),
    );
    let own_limits = [lim(8, 10), lim(40, 60)];
    let pool_limits = [calendar(120, Period::Hour, "UTC"), shadow(30, 60)];
    // /complete's, /chat's, the pool's.
    let mut reference = [
        WindowSet::default(),
        WindowSet::default(),
        WindowSet::default(),
    ];
    // Reservations not reported yet: when, how much, with the pool or not.
    let mut open: std::collections::VecDeque<(u64, u64, bool, bool)> = Default::default();
    let mut now = T0 * 1000 + 3;
    for step in 0..1500 {
        match next(100) {
            0..=59 => now += next(300),
            60..=94 => now += next(3_000),
            _ => now += next(40_000),
        }
        let pooled = next(3) == 0;
        let parts_of = |pooled: bool| {
            let mut parts = vec![Part {
                counter: if pooled { &chat } else { &alone },
                limits: &own_limits[..],
            }];
            if pooled {
                parts.push(Part {
                    counter: &pool,
                    limits: &pool_limits[..],
                });
            }
            parts
        };
        if next(2) == 0 || open.is_empty() {
            let cost = 1 + next(3);
            let parts = parts_of(pooled);
            let want = {
                let [a, c, p] = &mut reference;
                let mut decided: Vec<(&mut WindowSet, &[Limit])> = Vec::new();
                if pooled {
                    decided.push((c, &own_limits[..]));
                    decided.push((p, &pool_limits[..]));
                } else {
                    decided.push((a, &own_limits[..]));
                }
                quotagate_engine::limiter::hit_parts(&mut decided, cost, now)
            };
            let got = match s.store.hit_parts(&parts, cost, now).await {
                Verdict::Decided(o) => o,
                other => panic!("store did not decide: {other:?}"),
            };
            assert_eq!(
                got, want,
                "step {step}, now {now}, cost {cost}, pooled {pooled}"
            );
            if got.allowed {
                // Counted in the shadow limit too unless a shadow refused it.
                open.push_back((now, cost, pooled, !got.shadow_limited));
            }
        } else {
            let (at, cost, pooled, in_shadows) = open.pop_front().unwrap();
            let reported = next(cost + 5);
            let delta = reported as i64 - cost as i64;
            // The limits it was counted in: a shadow limit only if no shadow refused it.
            let pool_counted: Vec<Limit> = pool_limits
                .iter()
                .filter(|l| in_shadows || !l.shadow)
                .copied()
                .collect();
            let mut parts = parts_of(pooled);
            if pooled {
                parts[1].limits = &pool_counted;
            }
            s.store.adjust(&parts, delta, at, now).await;
            let [a, c, p] = &mut reference;
            let sets: Vec<(&mut WindowSet, &[Limit])> = match pooled {
                true => vec![(c, &own_limits[..]), (p, &pool_counted[..])],
                false => vec![(a, &own_limits[..])],
            };
            for (set, limits) in sets {
                if delta > 0 {
                    set.add(limits, delta as u64, now);
                } else {
                    set.give_back(limits, delta.unsigned_abs(), at);
                }
            }
        }
    }
}

/// Requests of one API key on two endpoints that share a pool (`CounterKey::pool`): each counted
/// in its endpoint's limits and the pool's, or in none, every answer the reference's
/// (`limiter::hit_parts` on three `WindowSet`s). Endpoint b has no limit of its own half of the
/// time (its requests then count in the pool alone); windows of 60 s on an endpoint and the pool
/// (two minute layouts in one script call), calendar periods, shadows, costs and checks.
async fn pools_and_endpoints_agree_with_the_reference(s: Subject) {
    use quotagate_engine::limiter::hit_parts;
    use quotagate_store::Part;
    let mut next = xorshift(0x0DDB_1A5E_5BAD_5EEDu64);
    let (a, b, pool) = (
        CounterKey::new(b"walker", "GET /a"),
        CounterKey::new(b"walker", "GET /b"),
        CounterKey::pool(b"walker", "search"),
    );
    // (a's own, b's own, the pool's), changing as a catalog would.
    let sets: [(Vec<Limit>, Vec<Limit>, Vec<Limit>); 3] = [
        (
            vec![lim(3, 1), lim(6, 60)],
            vec![lim(2, 10)],
            vec![lim(10, 60), calendar(40, Period::Hour, "UTC")],
        ),
        (
            vec![calendar(25, Period::Day, "Europe/Berlin")],
            vec![],
            vec![lim(4, 1), shadow(8, 60)],
        ),
        (
            vec![shadow(2, 1)],
            vec![lim(5, 60)],
            vec![calendar(30, Period::Week, "Asia/Kolkata"), lim(12, 90)],
        ),
    ];
    let mut reference = [
        WindowSet::default(),
        WindowSet::default(),
        WindowSet::default(),
    ];
    let mut now = T0 * 1000 + 17;
    for step in 0..1500 {
        match next(100) {
            0..=49 => {}
            50..=84 => now += next(400),
            85..=94 => now += next(30_000),
            _ => now += next(2 * 3_600_000),
        }
        let (own_a, own_b, shared) = &sets[step / 500];
        let on_b = next(2) == 1;
        let (counter, own, i) = if on_b { (&b, own_b, 1) } else { (&a, own_a, 0) };
        let cost = next(4);
        let [ra, rb, rp] = &mut reference;
        let mine = if on_b { rb } else { ra };
        let mut decided: Vec<(&mut WindowSet, &[Limit])> = Vec::new();
        let mut parts = Vec::new();
        if !own.is_empty() {
            decided.push((mine, own));
            parts.push(Part {
                counter,
                limits: own,
            });
        }
        decided.push((rp, shared));
        parts.push(Part {
            counter: &pool,
            limits: shared,
        });
        let want = hit_parts(&mut decided, cost, now);
        let got = match s.store.hit_parts(&parts, cost, now).await {
            Verdict::Decided(o) => o,
            other => panic!("store did not decide: {other:?}"),
        };
        assert_eq!(
            got,
            want,
            "step {step}, endpoint {i}, now {now}, cost {cost}, {:?}",
            sets[step / 500]
        );
        if step % 97 == 0 {
            let peeked = s.store.peek_parts(&parts, 1, now).await.unwrap();
            let views: Vec<(&WindowSet, &[Limit])> = if own.is_empty() {
                vec![(&reference[2], &shared[..])]
            } else {
                vec![(&reference[i], &own[..]), (&reference[2], &shared[..])]
            };
            assert_eq!(
                peeked,
                quotagate_engine::limiter::peek_parts(&views, 1, now),
                "peek at step {step}"
            );
        }
    }
}

/// A concurrency limit beside a rate: a slot per request in flight, freed when it ends; a request
/// refused by either takes nothing from the other; a check (cost 0) takes no slot.
async fn concurrency_slots_are_taken_and_freed(s: Subject) {
    use quotagate_store::Part;
    let k = CounterKey::new(b"slots", "GET /a");
    let limits = [Limit::concurrent(2), lim(5, 60)];
    let parts = [Part {
        counter: &k,
        limits: &limits,
    }];
    let t = T0 * 1000;
    let hit = |cost, now| {
        let store = &s.store;
        let parts = &parts;
        async move {
            match store.hit_parts(parts, cost, now).await {
                Verdict::Decided(o) => o,
                other => panic!("store did not decide: {other:?}"),
            }
        }
    };
    let o = hit(3, t).await;
    assert!(o.allowed);
    assert_eq!((o.quotas()[0].remaining, o.quotas()[1].remaining), (1, 2));
    assert_eq!(hit(1, t + 1).await.quotas()[0].remaining, 0);
    let o = hit(1, t + 2).await;
    assert!(!o.allowed, "two in flight");
    assert_eq!(o.refused_by_slots(&limits), Some(0));
    assert_eq!(o.retry_after(&limits), None);
    let p = s.store.peek_parts(&parts, 1, t + 3).await.unwrap();
    assert_eq!(
        p.quotas()[1].remaining,
        1,
        "the refusal took nothing from the rate"
    );
    assert!(!p.allowed, "a peek sees the slots taken");
    assert!(hit(0, t + 3).await.allowed, "a check takes no slot");
    s.store.free(&parts, false, t + 4).await;
    let o = hit(1, t + 5).await;
    assert!(o.allowed, "a slot was freed");
    assert_eq!(o.quotas()[1].remaining, 0);
    s.store.free(&parts, false, t + 6).await;
    let o = hit(1, t + 7).await;
    assert!(!o.allowed, "the rate refuses now");
    assert_eq!(o.refused_by_slots(&limits), None);
    assert_eq!(o.retry_after(&limits), Some(60));
    for _ in 0..3 {
        s.store.free(&parts, false, t + 8).await;
    }
    let p = s.store.peek_parts(&parts, 1, t + 9).await.unwrap();
    assert_eq!(
        p.quotas()[0].remaining,
        2,
        "every slot free, never below none"
    );
}

/// A random walk of requests that take slots (an endpoint's and a pool's, beside rates and
/// shadow limits) and end in any order, against the reference (`limiter::hit_parts` and
/// `WindowSet::free`).
async fn concurrency_slots_agree_with_the_reference_beside_rates_and_pools(s: Subject) {
    use quotagate_engine::limiter::hit_parts;
    use quotagate_store::Part;
    let mut next = xorshift(0x5107_5A11_F1EE_7ED5u64);
    let (a, pool) = (
        CounterKey::new(b"slotwalk", "GET /a"),
        CounterKey::pool(b"slotwalk", "*"),
    );
    let own = [Limit::concurrent(3), lim(8, 1)];
    let shared = [Limit::concurrent(4), Limit::concurrent(2).shadowed(true)];
    // (A shadow and an enforced concurrency limit cannot share a counter: one per counter. The
    // pool's second limit stands in a counter of its own.)
    let ghost = CounterKey::pool(b"slotwalk", "ghost");
    let (shared, ghostly) = ([shared[0]], [shared[1]]);
    let mut reference = [
        WindowSet::default(),
        WindowSet::default(),
        WindowSet::default(),
    ];
    let parts = [
        Part {
            counter: &a,
            limits: &own,
        },
        Part {
            counter: &pool,
            limits: &shared,
        },
        Part {
            counter: &ghost,
            limits: &ghostly,
        },
    ];
    let all: Vec<Limit> = own.iter().chain(&shared).chain(&ghostly).copied().collect();
    // Requests in flight: for each, which parts it holds a slot in.
    let mut in_flight: Vec<[bool; 3]> = Vec::new();
    let mut now = T0 * 1000 + 3;
    for step in 0..600 {
        now += next(150);
        if next(2) == 0 && !in_flight.is_empty() {
            let held = in_flight.swap_remove(next(in_flight.len() as u64) as usize);
            let freed: Vec<Part> = parts
                .iter()
                .zip(held)
                .filter(|(_, h)| *h)
                .map(|(p, _)| *p)
                .collect();
            for (r, h) in reference.iter_mut().zip(held) {
                if h {
                    r.free(1);
                }
            }
            if !freed.is_empty() {
                s.store.free(&freed, false, now).await;
            }
            continue;
        }
        let cost = next(3);
        let [ra, rp, rg] = &mut reference;
        let mut decided: Vec<(&mut WindowSet, &[Limit])> =
            vec![(ra, &own[..]), (rp, &shared[..]), (rg, &ghostly[..])];
        let want = hit_parts(&mut decided, cost, now);
        let got = match s.store.hit_parts(&parts, cost, now).await {
            Verdict::Decided(o) => o,
            other => panic!("store did not decide: {other:?}"),
        };
        assert_eq!(got, want, "step {step}, now {now}, cost {cost}");
        if cost > 0 {
            let held = [
                got.counted_in(0, &all[0]),
                got.counted_in(2, &all[2]),
                got.counted_in(3, &all[3]),
            ];
            if held.iter().any(|h| *h) {
                in_flight.push(held);
            }
        }
    }
}

/// Slots live while their instance renews them, and those of an instance that died are dropped
/// once their hold time has passed: two instances on one Redis, driven by one fake clock (these
/// stores are not shared, so nothing renews but the test).
#[tokio::test]
async fn slots_are_renewed_while_their_instance_lives_and_dropped_after_it_dies() {
    use quotagate_engine::clock::FakeClock;
    use quotagate_store::CounterStore;
    let server = RedisServer::start();
    let clock = FakeClock::new(T0);
    let open = || {
        RedisStore::connect(&RedisOptions {
            concurrency_hold: Duration::from_secs(1),
            ..redis_options(server.url(), TimeSource::Local)
        })
        .unwrap()
        .with_clock(Arc::new(clock.clone()))
    };
    let (a, b) = (open(), open());
    let k = key("held");
    let limits = [Limit::concurrent(2)];
    let t = T0 * 1000;
    for _ in 0..2 {
        assert!(a.hit(&k, &limits, 1, t).await.unwrap().allowed);
    }
    assert_eq!(a.slots_held(), 2);
    assert!(!b.hit(&k, &limits, 1, t + 500).await.unwrap().allowed);
    clock.advance_ms(900);
    a.renew_slots_now().await;
    assert!(
        !b.hit(&k, &limits, 1, t + 1_500).await.unwrap().allowed,
        "renewed at t + 900: held until t + 1900"
    );
    assert!(
        !b.hit(&k, &limits, 1, t + 1_899).await.unwrap().allowed,
        "still held"
    );
    // a dies here: nothing renews its slots any more.
    let o = b.hit(&k, &limits, 1, t + 1_900).await.unwrap();
    assert!(o.allowed, "a's slots were dropped at the end of their hold");
    assert_eq!(o.quotas()[0].remaining, 1, "and only b's is taken");
    let parts = [quotagate_store::Part {
        counter: &k,
        limits: &limits,
    }];
    a.free(&parts, t + 2_000).await.unwrap();
    a.free(&parts, t + 2_000).await.unwrap();
    assert_eq!(a.slots_held(), 0);
    let o = b.peek(&k, &limits, 1, t + 2_000).await.unwrap();
    assert_eq!(
        o.quotas()[0].remaining,
        1,
        "freeing a dropped slot frees no other"
    );
    b.free(&parts, t + 2_001).await.unwrap();
    let o = b.peek(&k, &limits, 1, t + 2_002).await.unwrap();
    assert_eq!(o.quotas()[0].remaining, 2);
}

fn calendar(rl: u64, period: Period, zone: &str) -> Limit {
    Limit::calendar(rl, period, ZoneId::of(zone).unwrap())
}

/// A day quota in Los Angeles beside 2 per second: a request refused by either takes nothing
/// from the other; a used-up day refuses until local midnight (told in `reset` and
/// `retry_after`), then starts again from zero; a check counts nothing.
async fn a_day_quota_beside_a_per_second_limit_resets_at_local_midnight(s: Subject) {
    let limits = [lim(2, 1), calendar(5, Period::Day, "America/Los_Angeles")];
    let k = key("day");
    // 2023-11-14T23:59:00-08:00: a minute before midnight in Los Angeles.
    let t = 1_700_035_140_000;
    assert!(s.hit_all(&k, &limits, 1, t).await.allowed);
    assert!(s.hit_all(&k, &limits, 1, t + 10).await.allowed);
    let o = s.hit_all(&k, &limits, 1, t + 20).await;
    assert!(!o.allowed, "the per-second limit refuses");
    assert_eq!(o.quotas()[1].remaining, 3, "nothing taken from the day");
    let o = s.hit_all(&k, &limits, 3, t + 1_000).await;
    assert!(!o.allowed, "2 per second refuses a cost of 3 for good");
    assert_eq!(o.retry_after(&limits), None);
    for i in 0..3 {
        let o = s.hit_all(&k, &limits, 1, t + 2_000 + 500 * i).await;
        assert!(o.allowed, "hit {i}");
        assert_eq!(o.quotas()[1].remaining, 2 - i);
        let to_midnight = (60_000 - 2_000 - 500 * i).div_ceil(1_000);
        assert_eq!(o.quotas()[1].reset, to_midnight, "until midnight");
    }
    let o = s.hit_all(&k, &limits, 1, t + 5_000).await;
    assert!(!o.allowed, "the day is used up");
    assert_eq!(o.retry_after(&limits), Some(55));
    assert_eq!(o.most_restrictive(&limits), Some(1));
    let o = s.hit_all(&k, &limits, 0, t + 30_000).await;
    assert!(o.allowed, "a check passes");
    assert_eq!(o.quotas()[1].remaining, 0);
    let o = s.hit_all(&k, &limits, 1, t + 60_000).await;
    assert!(o.allowed, "a new day at midnight");
    assert_eq!(o.quotas()[1].remaining, 4);
    assert_eq!(o.quotas()[1].reset, 86_400);
    let p = s.store.peek(&k, &limits, 1, t + 61_000).await.unwrap();
    assert_eq!(p.quotas()[1].remaining, 4, "peeking counts nothing");
}

/// The random walk of several windows, with calendar periods in zones far apart (and in shadow),
/// through hours, days, weeks and months: every answer the reference's (`WindowSet`).
async fn calendar_periods_agree_with_the_reference_across_their_boundaries(s: Subject) {
    let mut next = xorshift(0x51_7CC1_B727_220Au64);
    let sets: [Vec<Limit>; 5] = [
        vec![lim(3, 1), calendar(20, Period::Hour, "UTC")],
        vec![
            lim(10, 60),
            calendar(50, Period::Day, "America/Los_Angeles"),
        ],
        vec![
            calendar(30, Period::Week, "Asia/Kolkata").shadowed(true),
            calendar(40, Period::Month, "Pacific/Kiritimati"),
        ],
        vec![
            lim(4, 10),
            calendar(5, Period::Hour, "Asia/Kathmandu").shadowed(true),
            calendar(60, Period::Day, "Europe/Berlin"),
        ],
        vec![calendar(25, Period::Hour, "Asia/Kolkata")],
    ];
    let sets: Vec<&[Limit]> = sets.iter().map(Vec::as_slice).collect();
    walk_limit_sets(&s, &mut next, &sets, |r, next| match r {
        0..=49 => 0,
        50..=84 => next(400),
        85..=94 => next(900_000),
        _ => next(3 * 86_400_000),
    })
    .await;
}

/// 1200 requests of two keys, each key holding one of `sets` for 300 steps at a time (as a
/// catalog would), of costs 0 (a check) to 3, the clock moved on by `advance(r, next)` (`r` below
/// 100) before each: every answer the reference's (`WindowSet::hit`).
async fn walk_limit_sets(
    s: &Subject,
    next: &mut impl FnMut(u64) -> u64,
    sets: &[&[Limit]],
    advance: impl Fn(u64, &mut dyn FnMut(u64) -> u64) -> u64,
) {
    let keys = [key("a"), key("b")];
    let mut reference = vec![WindowSet::default(); keys.len()];
    let mut now = T0 * 1000 + 17;
    for step in 0..1200 {
        let r = next(100);
        now += advance(r, next);
        let i = next(2) as usize;
        let set = sets[(i + step / 300) % sets.len()];
        let cost = next(4);
        let want = reference[i].hit(set, cost, now);
        let got = s.hit_all(&keys[i], set, cost, now).await;
        assert_eq!(
            got, want,
            "step {step}, key {i}, now {now}, cost {cost}, {set:?}"
        );
    }
}

/// The fixed windows (Divvy's, from the first hit, and the rate-limit service's, on the clock): a
/// hit of `cost` takes credit only when all of it fits; a cost of 0 checks. Limits that mix a
/// fixed window with others have no answer yet: refused, and not taken for an outage.
async fn fixed_windows_take_a_cost_only_when_it_fits(s: Subject) {
    for l in [Limit::fixed(5, 60), Limit::aligned(5, 3600)] {
        let key = CounterKey::divvy(&format!("case={}", s.tag), &format!("{:?}", l.kind));
        let hit = |cost| s.store.hit(&key, std::slice::from_ref(&l), cost, T0 * 1000);
        let got = |v: Verdict| match v {
            Verdict::Decided(o) => {
                let q = o.quotas()[0];
                assert!((1..=u64::from(l.w)).contains(&q.reset), "{l:?} {o:?}");
                assert_eq!(q.retry_after.is_some(), !q.allowed && q.remaining < 5);
                (o.allowed, q.remaining)
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(got(hit(6).await), (false, 5), "never fits");
        assert_eq!(got(hit(3).await), (true, 2));
        assert_eq!(got(hit(3).await), (false, 2), "refused, nothing taken");
        assert_eq!(got(hit(0).await), (true, 2), "a check");
        assert_eq!(got(hit(2).await), (true, 0));
        assert_eq!(got(hit(1).await), (false, 0));
    }
    let key = CounterKey::divvy("mixed", "a");
    let mixed = [Limit::fixed(5, 60), Limit::per_minute(5)];
    assert_eq!(
        s.store.hit(&key, &mixed, 1, T0 * 1000).await,
        Verdict::Closed
    );
    assert!(!s.store.is_degraded());
}

fn key(k: &str) -> CounterKey {
    CounterKey::new(k.as_bytes(), "GET /users/{id}")
}

async fn peeking_counts_nothing_and_tells_what_a_hit_would(s: Subject) {
    let k = key("a");
    let p = s.peek(&k, 3, T0).await;
    assert_eq!((p.allowed, p.remaining, p.reset), (true, 3, 0));
    s.hit(&k, 3, T0 + 50).await;
    s.hit(&k, 3, T0 + 61).await;
    for _ in 0..3 {
        let p = s.peek(&k, 3, T0 + 70).await;
        assert_eq!((p.allowed, p.remaining, p.reset), (true, 1, 40));
    }
    s.hit(&k, 3, T0 + 70).await;
    let p = s.peek(&k, 3, T0 + 80).await;
    assert_eq!(
        (p.allowed, p.remaining, p.retry_after),
        (false, 0, Some(30))
    );
    // The hit that peeking predicted is refused, and the window was left as it was.
    let d = s.hit(&k, 3, T0 + 80).await;
    assert_eq!((d.allowed, d.retry_after), (false, Some(30)));
}

async fn reset_forgets_one_api_key_on_every_endpoint(s: Subject) {
    let (a1, a2) = (key("a"), CounterKey::new(b"a", "POST /users"));
    let b = key("b");
    for k in [&a1, &a2, &b] {
        s.hit(k, 1, T0).await;
        assert!(!s.hit(k, 1, T0 + 1).await.allowed);
    }
    assert!(s.store.reset(b"a").await.unwrap() >= 2);
    assert!(s.hit(&a1, 1, T0 + 2).await.allowed, "a's counters are gone");
    assert!(s.hit(&a2, 1, T0 + 2).await.allowed);
    assert!(!s.hit(&b, 1, T0 + 2).await.allowed, "b's are not");
}

async fn allows_up_to_the_limit_and_counts_down(s: Subject) {
    let k = key("a");
    for want in [2, 1, 0] {
        let d = s.hit(&k, 3, T0 + 5).await;
        assert!(d.allowed);
        assert_eq!((d.limit, d.remaining, d.reset), (3, want, 60));
    }
    let d = s.hit(&k, 3, T0 + 6).await;
    assert_eq!(
        (d.allowed, d.remaining, d.retry_after, d.reset),
        (false, 0, Some(59), 59)
    );
}

async fn retry_after_is_exact(s: Subject) {
    let k = key("a");
    s.hit(&k, 4, T0).await;
    s.hit(&k, 4, T0).await;
    s.hit(&k, 4, T0 + 20).await;
    let d = s.hit(&k, 4, T0 + 40).await;
    assert_eq!((d.allowed, d.reset), (true, 20));
    let d = s.hit(&k, 4, T0 + 50).await;
    assert_eq!(d.retry_after, Some(10));
    assert!(
        !s.hit(&k, 4, T0 + 59).await.allowed,
        "one second before Retry-After"
    );
    let d = s.hit(&k, 4, T0 + 60).await;
    assert!(d.allowed, "exactly Retry-After later");
    assert_eq!((d.remaining, d.reset), (1, 20));
}

async fn window_spans_a_minute_boundary(s: Subject) {
    let k = key("a");
    assert!(s.hit(&k, 2, T0 + 30).await.allowed);
    assert!(s.hit(&k, 2, T0 + 59).await.allowed);
    let d = s.hit(&k, 2, T0 + 60 + 29).await;
    assert_eq!((d.allowed, d.retry_after), (false, Some(1)));
    let d = s.hit(&k, 2, T0 + 60 + 30).await;
    assert_eq!((d.allowed, d.remaining, d.reset), (true, 0, 29));
    let d = s.hit(&k, 2, T0 + 60 + 58).await;
    assert_eq!((d.allowed, d.retry_after), (false, Some(1)));
    assert!(s.hit(&k, 2, T0 + 60 + 59).await.allowed);
}

async fn rejected_requests_are_not_counted(s: Subject) {
    let k = key("a");
    assert!(s.hit(&k, 1, T0).await.allowed);
    for t in 1..60 {
        let d = s.hit(&k, 1, T0 + t).await;
        assert_eq!((d.allowed, d.retry_after), (false, Some(60 - t)), "t={t}");
    }
    assert!(s.hit(&k, 1, T0 + 60).await.allowed);
}

async fn zero_limit_always_rejects(s: Subject) {
    let k = key("a");
    for t in [0, 1, 61] {
        assert_eq!(s.hit(&k, 0, T0 + t).await, Quota::zero_limit());
    }
    // and it left nothing behind that a real limit would see
    assert_eq!(s.hit(&k, 1, T0 + 61).await.remaining, 0);
    assert!(s.hit(&k, 1, T0 + 61).await.retry_after.is_some());
}

async fn counters_are_per_key_and_endpoint(s: Subject) {
    let a = CounterKey::new(b"a", "GET /x");
    let b = CounterKey::new(b"b", "GET /x");
    let a2 = CounterKey::new(b"a", "POST /x");
    assert!(s.hit(&a, 1, T0).await.allowed);
    assert!(s.hit(&b, 1, T0).await.allowed);
    assert!(s.hit(&a2, 1, T0).await.allowed);
    assert!(!s.hit(&a, 1, T0).await.allowed);
}

async fn lowered_and_raised_limits_apply_to_the_same_counts(s: Subject) {
    let k = key("a");
    for _ in 0..5 {
        s.hit(&k, 10, T0).await;
    }
    let d = s.hit(&k, 3, T0 + 1).await;
    assert_eq!((d.allowed, d.retry_after), (false, Some(59)));
    let d = s.hit(&k, 6, T0 + 2).await;
    assert_eq!((d.allowed, d.remaining), (true, 0));
    let d = s.hit(&k, 3, T0 + 3).await;
    assert_eq!(
        (d.allowed, d.retry_after),
        (false, Some(57)),
        "the five hits of T0 must leave"
    );
}

async fn time_never_runs_backwards(s: Subject) {
    let k = key("a");
    assert!(s.hit(&k, 2, T0 + 30).await.allowed);
    let d = s.hit(&k, 2, T0 + 10).await; // treated as T0 + 30
    assert_eq!((d.allowed, d.reset), (true, 60));
    assert!(!s.hit(&k, 2, T0 + 20).await.allowed);
}

async fn concurrent_requests_never_overshoot(s: Subject) {
    let s = Arc::new(s);
    let k = key("hot");
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (s, k) = (s.clone(), k.clone());
            tokio::spawn(async move { s.hit(&k, 50, T0 + 7).await })
        })
        .collect();
    let mut remaining = Vec::new();
    for t in tasks {
        let d = t.await.unwrap();
        if d.allowed {
            remaining.push(d.remaining);
        }
    }
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (0..50).collect::<Vec<_>>(),
        "exactly 50 allowed, each a distinct remaining"
    );
}

/// A deterministic pseudo-random walk through time, limits and counters, compared step by step with
/// `limiter::Window`. This is what holds the Lua script and the Rust arithmetic equal.
async fn agrees_with_the_reference_window_on_a_random_workload(s: Subject) {
    random_walk(s, [3, 5, 8], 12, |r, next| match r {
        0..=59 => 0,
        60..=89 => next(4),
        90..=96 => next(40),
        _ => 55 + next(70),
    })
    .await;
}

/// The same with busy keys: limits of dozens, several hits a second, windows full and moving on
/// every second (the script's fast path, and its way back to the general one).
async fn agrees_with_the_reference_window_on_busy_keys(s: Subject) {
    random_walk(s, [40, 60, 90], 100, |r, next| match r {
        0..=69 => 0,
        70..=96 => 1,
        97..=98 => next(8),
        _ => 50 + next(30),
    })
    .await;
}

/// 1500 steps: each advances the clock by `advance(next(100), next)` seconds, changes a limit now
/// and then (to 1..=`max_limit`), and hits one of three keys.
async fn random_walk(
    s: Subject,
    mut limits: [u64; 3],
    max_limit: u64,
    advance: impl Fn(u64, &mut dyn FnMut(u64) -> u64) -> u64,
) {
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15u64);
    let keys = [key("a"), key("b"), key("c")];
    let mut reference: Vec<Window> = vec![Window::new(); keys.len()];
    let mut now = T0 + 17;
    for step in 0..1500 {
        let r = next(100);
        now += advance(r, &mut next);
        if next(50) == 0 {
            let i = next(3) as usize;
            limits[i] = 1 + next(max_limit);
        }
        let i = next(3) as usize;
        let want = reference[i].hit(now, limits[i]);
        let got = s.hit(&keys[i], limits[i], now).await;
        assert_eq!(
            got, want,
            "step {step}, key {i}, now {now}, limit {}",
            limits[i]
        );
    }
}

/// A repeatable random walk: `next(n)` is the next number below `n` from `seed`.
fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    }
}

fn lim(rl: u64, w: u32) -> Limit {
    Limit::sliding(rl, w)
}

fn shadow(rl: u64, w: u32) -> Limit {
    lim(rl, w).shadowed(true)
}

async fn several_windows_count_together_or_not_at_all(s: Subject) {
    let k = key("a");
    let limits = [lim(2, 1), lim(3, 60), lim(10, 3600)];
    let t = T0 * 1000;
    assert!(s.hit_all(&k, &limits, 1, t).await.allowed);
    assert!(s.hit_all(&k, &limits, 1, t + 100).await.allowed);
    let o = s.hit_all(&k, &limits, 1, t + 200).await;
    assert!(!o.allowed, "the per-second limit refuses");
    assert_eq!(o.retry_after(&limits), Some(1));
    let left: Vec<u64> = o.quotas().iter().map(|q| q.remaining).collect();
    assert_eq!(left, [0, 1, 8], "the refused request used up nothing");
    let o = s.hit_all(&k, &limits, 1, t + 1_000).await;
    assert!(o.allowed);
    let left: Vec<u64> = o.quotas().iter().map(|q| q.remaining).collect();
    assert_eq!(
        left,
        [0, 0, 7],
        "the request at t left the per-second window at t + 1 s"
    );
    let o = s.hit_all(&k, &limits, 1, t + 2_000).await;
    assert!(!o.allowed, "now the per-minute limit refuses");
    assert_eq!(o.retry_after(&limits), Some(58));
    assert!(!s.hit_all(&k, &limits, 1, t + 59_999).await.allowed);
    let o = s.hit_all(&k, &limits, 1, t + 60_000).await;
    assert!(o.allowed, "after exactly Retry-After it passes");
    assert_eq!(o.quotas()[2].remaining, 6, "the hour still holds all four");
}

async fn cost_uses_units_and_a_cost_above_the_limit_never_passes(s: Subject) {
    let k = key("a");
    let limits = [lim(10, 1), lim(25, 60)];
    let t = T0 * 1000;
    let o = s.hit_all(&k, &limits, 4, t).await;
    let left: Vec<u64> = o.quotas().iter().map(|q| q.remaining).collect();
    assert_eq!(left, [6, 21]);
    let o = s.hit_all(&k, &limits, 7, t + 300).await;
    assert!(!o.allowed);
    assert_eq!(o.retry_after(&limits), Some(1));
    let o = s.hit_all(&k, &limits, 11, t + 300).await;
    assert!(!o.allowed);
    assert_eq!(o.retry_after(&limits), None, "never: no Retry-After");
    let one = [lim(3, 60)];
    let o = s.hit_all(&key("b"), &one, 4, t).await;
    assert_eq!((o.allowed, o.quotas()[0].retry_after), (false, None));
    let o = s.hit_all(&key("b"), &one, 3, t).await;
    assert!(o.allowed, "a cost equal to the limit fits an empty window");
}

async fn shadow_limits_count_but_never_refuse(s: Subject) {
    let k = key("a");
    let limits = [lim(10, 60), shadow(2, 3600)];
    let t = T0 * 1000;
    for _ in 0..2 {
        let o = s.hit_all(&k, &limits, 1, t).await;
        assert!(o.allowed && !o.shadow_limited);
    }
    let o = s.hit_all(&k, &limits, 1, t + 10).await;
    assert!(o.allowed && o.shadow_limited);
    assert_eq!(o.quotas()[0].remaining, 7);
    assert_eq!(o.quotas()[1].retry_after, Some(3600));
    // A whole catalog in shadow: refusals are only reported.
    let dry = [shadow(1, 1)];
    assert!(!s.hit_all(&key("b"), &dry, 1, t).await.shadow_limited);
    let o = s.hit_all(&key("b"), &dry, 1, t + 10).await;
    assert!(o.allowed && o.shadow_limited);
}

/// The random walk of the single window, with several windows, costs (checks too) and shadow
/// limits, against `limiter::WindowSet`.
async fn agrees_with_the_reference_counter_on_random_windows_costs_and_shadows(s: Subject) {
    let mut next = xorshift(0x2545_F491_4F6C_DD1Du64);
    let sets: [&[Limit]; 5] = [
        &[lim(3, 1), lim(8, 60)],
        &[lim(4, 10), shadow(6, 3600)],
        &[lim(5, 60)],
        &[lim(7, 90), shadow(2, 1), lim(12, 7)],
        &[shadow(3, 2), shadow(9, 60)],
    ];
    // Costs of 0 are checks (the rate-limit service's `hits_addend` 0), counting nothing.
    walk_limit_sets(&s, &mut next, &sets, |r, next| match r {
        0..=49 => 0,
        50..=89 => next(400),
        90..=97 => next(20_000),
        _ => 50_000 + next(100_000),
    })
    .await;
}

/// A random walk of costs (within the limit, and above it) on fixed windows of both kinds agrees
/// with the engine's model ([`FixedWindow::hit`]) at every step. A window from the first hit
/// outlives the walk (Redis times it by its own clock): that walk is the credit's arithmetic. The
/// aligned walk moves the caller's clock on too, through about a hundred windows: each new window
/// is a new key, full again.
async fn fixed_windows_agree_with_the_engine_on_random_costs(s: Subject) {
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15u64);
    for l in [Limit::fixed(40, 600), Limit::aligned(40, 60)] {
        let key = CounterKey::divvy(&format!("walk={}", s.tag), &format!("{:?}", l.kind));
        let mut now_ms = T0 * 1000;
        let mut model = None;
        for step in 0..400 {
            if l.kind == Kind::Aligned {
                now_ms += next(30_000);
            }
            let span = Span::of(&l, now_ms);
            let cost = match next(10) {
                0 => 1 + next(l.rl + 3),
                _ => 1 + next(4),
            };
            let (allowed, credit, _) =
                FixedWindow::hit(&mut model, l.rl, span.seconds, cost, now_ms / 1000);
            let got = match s.store.hit(&key, &[l], cost, now_ms).await {
                Verdict::Decided(o) => o,
                other => panic!("{other:?}"),
            };
            let q = got.quotas()[0];
            assert_eq!(
                (got.allowed, q.remaining),
                (allowed, credit),
                "step {step}, cost {cost}, {l:?}"
            );
            assert_eq!(q.retry_after.is_some(), !allowed && cost <= l.rl);
        }
    }
}

async fn peeking_several_windows_agrees_with_the_reference(s: Subject) {
    let k = key("a");
    let limits = [lim(3, 1), lim(5, 60), lim(9, 3600)];
    let mut reference = WindowSet::default();
    let t = T0 * 1000;
    for (i, dt) in [0u64, 150, 420, 1_300, 61_000, 62_500]
        .into_iter()
        .enumerate()
    {
        reference.hit(&limits, 1, t + dt);
        s.hit_all(&k, &limits, 1, t + dt).await;
        let at = t + dt + 50 * i as u64;
        let got = s.store.peek(&k, &limits, 1, at).await.unwrap();
        assert_eq!(got, reference.peek(&limits, 1, at), "after step {i}");
    }
}

// ---- Redis only ----

/// What a failover under load looked like from the gateway's side.
struct FailoverRun {
    /// The longest any request waited for its answer.
    slowest: Duration,
    /// From the kill to the lasting return of decisions from Redis.
    recovery: Duration,
    /// Requests answered by the failure policy (`local`) meanwhile.
    local: usize,
}

impl FailoverRun {
    /// Prints the run (its numbers go to docs/operations.md) and checks that every request was
    /// answered within the store timeout and a margin.
    fn report(&self, what: &str, timeout: Duration) {
        println!(
            "{what} failover: recovered in {:?}, {} requests answered locally meanwhile, slowest answer {:?}",
            self.recovery, self.local, self.slowest
        );
        assert!(
            self.slowest <= timeout + ANSWER_MARGIN,
            "slowest {:?}",
            self.slowest
        );
    }
}

/// Eight tasks send requests through `store` (policy `local`, so every request gets an answer)
/// while `kill` takes the master down; runs until decisions come from Redis again and `promoted`
/// says the replica took over (within 60 s).
async fn failover_under_load(
    store: Arc<Store>,
    kill: impl FnOnce(),
    promoted: impl Fn() -> bool,
) -> FailoverRun {
    use std::sync::Mutex;
    // The store's own warnings (what marked it down, when it recovered) go with a failure's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("quotagate=info")
        .with_test_writer()
        .try_init();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // (started, took, decided by Redis)
    let log: Arc<Mutex<Vec<(Instant, Duration, bool)>>> = Arc::default();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (store, stop, log) = (store.clone(), stop.clone(), log.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let k = CounterKey::new(format!("load-{t}-{}", i % 50).as_bytes(), "GET /x");
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_millis() as u64;
                    let start = Instant::now();
                    let v = store.hit(&k, &[lim(1_000_000, 60)], 1, now).await;
                    let took = start.elapsed();
                    let decided = match v {
                        Verdict::Decided(o) => {
                            assert!(o.allowed);
                            true
                        }
                        Verdict::Local(o) => {
                            assert!(o.allowed);
                            false
                        }
                        other => panic!("policy local answers every request: {other:?}"),
                    };
                    log.lock().unwrap().push((start, took, decided));
                    i += 1;
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    kill();
    let deadline = killed + Duration::from_secs(60);
    // Recovered: the replica took over, and the answers since the last one from the policy (at
    // least 200 of them, over at least 300 ms) all came from Redis. Until then the store may
    // return to Redis and fail again (a cluster answers for the slots of its live masters, and
    // CLUSTERDOWN on some nodes for a moment after the promotion): the failure policy at work, so
    // recovery is the lasting return.
    let recovered = loop {
        assert!(Instant::now() < deadline, "no lasting recovery within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
        if !promoted() {
            continue;
        }
        // By the time each request started, not the order they finished in: under CPU starvation
        // a slow answer from Redis can finish after a local one that started later (the store went
        // down again meanwhile), and a run counted in finishing order would then begin before
        // that local answer.
        let mut log = log.lock().unwrap().clone();
        log.sort_by_key(|(at, _, _)| *at);
        let run: Vec<_> = log
            .iter()
            .rev()
            .take_while(|(_, _, decided)| *decided)
            .collect();
        if run.len() >= 200
            && let Some((at, _, _)) = run.last()
            && at.elapsed() >= Duration::from_millis(300)
        {
            break *at;
        }
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.expect("no task panicked");
    }
    let log = log.lock().unwrap();
    let local = log.iter().filter(|(_, _, d)| !d).count();
    // Only the requests that started in the moment between the check above and the tasks' stop
    // can be local here: the store left Redis again after a lasting return.
    let again: Vec<_> = log
        .iter()
        .filter(|(at, _, d)| !*d && *at >= recovered)
        .map(|(at, _, _)| at.duration_since(killed))
        .collect();
    assert!(
        again.is_empty(),
        "decisions left Redis again after a lasting recovery (a second failover?), at {again:?} after the kill"
    );
    FailoverRun {
        slowest: log.iter().map(|(_, took, _)| *took).max().unwrap(),
        recovery: recovered - killed,
        local,
    }
}

fn failover_store(target: RedisTarget, timeout: Duration) -> Arc<Store> {
    let options = RedisOptions {
        target,
        timeout,
        ..redis_options("redis://unused".into(), TimeSource::Redis)
    };
    Arc::new(Store::redis(
        RedisStore::connect(&options).unwrap(),
        FailurePolicy::Local,
        Duration::from_millis(50),
    ))
}

/// Margin over `store.timeout_ms` for one request: the second try on a fresh connection after a
/// broken one, and scheduling on a loaded two-core machine.
const ANSWER_MARGIN: Duration = Duration::from_millis(300);

#[tokio::test]
async fn kill_9_of_the_sentinel_managed_master_under_load() {
    let set = SentinelSet::start();
    let timeout = Duration::from_millis(250);
    let store = failover_store(sentinel_target(&set), timeout);
    let replica = set.replica.port;
    let run = failover_under_load(
        store,
        || set.master.kill(),
        || set.master_port() == Some(replica),
    )
    .await;
    run.report("sentinel", timeout);
    assert!(run.local > 0, "the policy answered during the gap");
}

#[tokio::test]
async fn kill_9_of_a_cluster_master_under_load() {
    let cluster = RedisCluster::start(3, 1);
    let timeout = Duration::from_millis(250);
    let store = failover_store(cluster_target(&cluster), timeout);
    let victim = cluster.masters()[0];
    let index = cluster.nodes.iter().position(|n| n.port == victim).unwrap();
    let run = failover_under_load(
        store,
        || cluster.nodes[index].kill(),
        || {
            let masters = cluster.masters();
            masters.len() == 3 && !masters.contains(&victim) && cluster.is_ok()
        },
    )
    .await;
    run.report("cluster", timeout);
}

#[tokio::test]
async fn on_a_cluster_two_instances_admit_exactly_the_limit_and_keys_spread_over_every_master() {
    let cluster = RedisCluster::start(3, 0);
    for run in 0..3 {
        for lease in [LeaseMode::Off, LeaseMode::Auto] {
            let name = format!("shared-{run}-{lease:?}");
            two_instances_share_one_limit_exactly(cluster_target(&cluster), &name, lease).await;
        }
    }
    // Several windows on one key in one script call: one slot, no CROSSSLOT.
    let s = subject_on(cluster_target(&cluster), "spread");
    let limits = [lim(5, 1), lim(100, 60), lim(1000, 3600)];
    for i in 0..3000 {
        let k = CounterKey::new(format!("key-{i}").as_bytes(), "GET /x");
        let o = s.hit_all(&k, &limits, 1, T0 * 1000).await;
        assert!(o.allowed, "key {i}");
    }
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    let counts: Vec<u64> = masters.iter().map(|&p| cluster.dbsize(p)).collect();
    // 3000 keys x 3 hashes (a minute hash and one per other window), plus the minute hashes of the
    // six shared counters above; about a third on each master.
    assert_eq!(counts.iter().sum::<u64>(), 9006, "{counts:?}");
    assert!(
        counts.iter().all(|&n| n > 2000),
        "every master holds a share: {counts:?}"
    );
    // Resetting a key finds its hashes on whichever master holds its slot.
    let reset = s.store.reset(b"key-7").await.unwrap();
    assert_eq!(reset, 3);
}

#[tokio::test]
async fn instances_share_one_limit_exactly_even_with_clocks_30s_apart() {
    let server = RedisServer::start();
    for lease in [LeaseMode::Off, LeaseMode::Auto] {
        let target = RedisTarget::single(&server.url()).unwrap();
        two_instances_share_one_limit_exactly(target, &format!("shared-{lease:?}"), lease).await;
    }
}

/// Two instances, clocks 30 s apart, 200 concurrent requests (100 each) on a limit of 50 for the
/// counter `name`: exactly 50 pass; with leases, 50 less what is still leased and unused.
async fn two_instances_share_one_limit_exactly(target: RedisTarget, name: &str, lease: LeaseMode) {
    let connect = || {
        let options = RedisOptions {
            target: target.clone(),
            timeout: Duration::from_secs(2),
            lease,
            ..redis_options("redis://unused".into(), TimeSource::Redis)
        };
        Arc::new(Store::redis(
            RedisStore::connect(&options).unwrap(),
            FailurePolicy::Closed,
            Duration::from_millis(50),
        ))
    };
    let (a, b) = (connect(), connect());
    // Instance clocks 30 s apart, and both far from Redis' own clock.
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (now_a, now_b) = (real - 3600, real - 3600 + 30);
    let k = key(name);
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let (store, now, k) = if i % 2 == 0 {
                (a.clone(), now_a, k.clone())
            } else {
                (b.clone(), now_b, k.clone())
            };
            tokio::spawn(async move { store.hit_per_minute(&k, 50, now).await })
        })
        .collect();
    let mut remaining = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Verdict::Decided(d) if d.allowed => remaining.push(d.remaining),
            Verdict::Decided(_) => {}
            other => panic!("{other:?}"),
        }
    }
    remaining.sort_unstable();
    if lease == LeaseMode::Off {
        assert_eq!(remaining, (0..50).collect::<Vec<_>>());
        return;
    }
    // Units leased and neither used nor given back yet are counted in Redis: they and the
    // admitted requests make the limit exactly.
    let unused: u64 = [&a, &b]
        .iter()
        .map(|s| {
            let st = s.stats().unwrap();
            st.units_leased.get() - st.units_used.get() - st.units_given_back.get()
        })
        .sum();
    assert_eq!(remaining.len() as u64 + unused, 50, "{remaining:?}");
    assert!(remaining.iter().all(|&r| r < 50), "{remaining:?}");
}

/// One instance with leases: a key hit 400 times in one second takes a few leases and decides
/// the rest in memory, every answer the reference's; the next second gives the rest back in the
/// same call that takes the next lease, and the window stays exact across the minute.
#[tokio::test]
async fn a_busy_key_decides_from_leases_with_the_references_answers() {
    let s = redis_leased();
    let stats = s.store.stats().unwrap().clone();
    let k = key("busy");
    let limits = [lim(1500, 60), lim(2000, 5)];
    let mut reference = WindowSet::default();
    let mut now_ms = (T0 + 58) * 1000;
    for step in 0..2400u64 {
        // 400 a second, then a pause of half a second every 600 requests.
        now_ms += if step % 600 == 599 { 500 } else { 2 };
        let cost = 1 + step % 3 / 2;
        let want = reference.hit(&limits, cost, now_ms);
        let got = s.hit_all(&k, &limits, cost, now_ms).await;
        assert_eq!(got, want, "step {step}, now {now_ms}");
    }
    let redis_calls = stats.decided_by_redis.get();
    let local = stats.decided_by_lease.get();
    assert!(
        local > 800,
        "most decided here: {local} local, {redis_calls} Redis"
    );
    assert!(stats.units_given_back.get() > 0, "some given back");
    // Nothing left over: Redis holds what was admitted, and a lease still out.
    let leased_out =
        stats.units_leased.get() - stats.units_used.get() - stats.units_given_back.get();
    let peek = s.store.peek(&k, &limits, 1, now_ms).await.unwrap();
    let want = reference.peek(&limits, 1, now_ms);
    assert_eq!(
        peek.quotas()[0].remaining + leased_out,
        want.quotas()[0].remaining
    );
}

/// Fixed windows (the Divvy port, the rate-limit service's aligned windows) lease too. Two
/// instances hit one window of 1000 credit: first 300 hits, far under the limit (leases taken and
/// left unused), then 3000 at once. At every point admitted hits and credit still leased make at
/// most 1000; once every lease has ended (a second at most) Redis holds exactly the credit not
/// admitted, and the window gives out the rest to the last unit, never one more.
///
/// Leases end and are given back on tokio's clock: paused here, and kept from auto-advancing
/// while Redis answers (a blocking task runs throughout), so leases end only when the test moves
/// time on, however slow the machine.
#[tokio::test(start_paused = true)]
async fn fixed_windows_lease_and_give_every_unit_back() {
    let (_hold, held) = std::sync::mpsc::channel::<()>();
    let frozen = tokio::task::spawn_blocking(move || held.recv());
    // A real-time pause that does not move tokio's clock.
    let nap = || tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(10)));
    let server = RedisServer::start();
    let connect = || {
        let options = RedisOptions {
            lease: LeaseMode::Auto,
            ..redis_options(server.url(), TimeSource::Redis)
        };
        Arc::new(Store::redis(
            RedisStore::connect(&options).unwrap(),
            FailurePolicy::Closed,
            Duration::from_millis(50),
        ))
    };
    let (a, b) = (connect(), connect());
    let counter = CounterKey::divvy("method=GET", "actor");
    let limit = [Limit::fixed(1000, 60)];
    let name = "divvy:method=GET:actor:1000:60";
    let hit = |s: &Arc<Store>| {
        let (s, counter) = (s.clone(), counter.clone());
        async move {
            match s.hit(&counter, &limit, 1, 0).await {
                Verdict::Decided(o) => (o.allowed, o.quotas()[0]),
                other => panic!("{other:?}"),
            }
        }
    };
    let unused = || -> u64 {
        [&a, &b]
            .iter()
            .map(|s| {
                let st = s.stats().unwrap();
                st.units_leased.get() - st.units_used.get() - st.units_given_back.get()
            })
            .sum()
    };
    let all_given_back = || async {
        let deadline = Instant::now() + Duration::from_secs(5);
        tokio::time::advance(Duration::from_millis(1100)).await;
        while unused() > 0 {
            assert!(Instant::now() < deadline, "{} units still leased", unused());
            nap().await.unwrap();
        }
    };
    let mut admitted = 0u64;
    let waves = |n: usize| {
        let (a, b, hit) = (a.clone(), b.clone(), &hit);
        async move {
            let mut got = 0;
            for _ in 0..n {
                let tasks: Vec<_> = (0..100)
                    .map(|i| tokio::spawn(hit(if i % 2 == 0 { &a } else { &b })))
                    .collect();
                for t in tasks {
                    let (allowed, q) = t.await.unwrap();
                    assert!(q.remaining <= 1000 && (1..=60).contains(&q.reset), "{q:?}");
                    got += u64::from(allowed);
                }
            }
            got
        }
    };
    admitted += waves(3).await;
    assert_eq!(admitted, 300);
    assert!(unused() > 0, "leases out");
    let credit = || -> u64 { server.cli(&["GET", name]).parse().unwrap() };
    assert_eq!(credit() + unused(), 1000 - admitted);
    let by_lease: u64 = [&a, &b]
        .iter()
        .map(|s| s.stats().unwrap().decided_by_lease.get())
        .sum();
    assert!(by_lease > 100, "{by_lease} hits decided from leases");
    // Every lease ends within a second and its timer gives the rest back.
    all_given_back().await;
    assert_eq!(
        credit(),
        1000 - admitted,
        "Redis holds what was not admitted"
    );
    admitted += waves(30).await;
    assert!(admitted + unused() <= 1000, "{admitted} admitted");
    all_given_back().await;
    assert_eq!(credit(), 1000 - admitted);
    // The rest, one hit at a time: to the last unit, then no more.
    while admitted < 1000 {
        let (allowed, q) = hit(&a).await;
        assert!(allowed, "refused with {admitted} admitted: {q:?}");
        admitted += 1;
    }
    assert!(!hit(&a).await.0 && !hit(&b).await.0);
    drop(_hold);
    frozen.await.unwrap().unwrap_err();
}

/// A fixed window's lease is given back only to the window it was taken from: a window started
/// later (the first expired) never gets credit it did not give.
#[tokio::test]
async fn a_fixed_lease_is_given_back_only_to_its_own_window() {
    let server = RedisServer::start();
    let script = include_str!("../crates/store/src/divvy.lua");
    let eval = |args: &[&str]| {
        let mut all = vec!["EVAL", script, "1", "w"];
        all.extend_from_slice(args);
        server.cli(&all)
    };
    // limit 100, 60 s, cost 1, wanting 80: granted 49, half of the 99 left.
    let reply = eval(&["100", "60", "1", "80", "0", "0"]);
    let fields: Vec<i64> = reply.split(' ').map(|f| f.parse().unwrap()).collect();
    assert_eq!(&fields[..4], &[1, 50, 60, 49], "{reply}");
    let expiry = fields[4].to_string();
    // A give-back naming another window (a second later) changes nothing.
    let later = (fields[4] + 1000).to_string();
    assert_eq!(eval(&["100", "60", "0", "0", "30", &later]), "2");
    assert_eq!(server.cli(&["GET", "w"]), "50");
    // Its own: the credit comes back, the window keeps its expiry.
    assert_eq!(eval(&["100", "60", "0", "0", "30", &expiry]), "2");
    assert_eq!(server.cli(&["GET", "w"]), "80");
    let ttl: u64 = server.cli(&["TTL", "w"]).parse().unwrap();
    assert!((58..=60).contains(&ttl), "{ttl}");
    // Never above the limit, whatever is given back.
    assert_eq!(eval(&["100", "60", "0", "0", "30", &expiry]), "2");
    assert_eq!(server.cli(&["GET", "w"]), "100");
    // The window gone, a give-back starts none.
    server.cli(&["DEL", "w"]);
    assert_eq!(eval(&["100", "60", "0", "0", "30", &expiry]), "2");
    assert_eq!(server.cli(&["EXISTS", "w"]), "0");
}

#[tokio::test]
async fn lost_scripts_are_reloaded() {
    let s = redis();
    let k = key("a");
    assert!(s.hit(&k, 5, T0).await.allowed);
    assert_eq!(s._redis.as_ref().unwrap().cli(&["SCRIPT", "FLUSH"]), "OK");
    let d = s.hit(&k, 5, T0).await;
    assert_eq!((d.allowed, d.remaining), (true, 3));
}

#[tokio::test]
async fn counters_expire_from_redis() {
    let s = redis();
    s.hit(&key("a"), 5, T0).await;
    let server = s._redis.as_ref().unwrap();
    let keys = server.cli(&["KEYS", "*"]);
    assert_eq!(keys, "qgtest:w:{a}:GET%20/users/%7Bid%7D:28333334");
    let ttl: u64 = server.cli(&["TTL", &keys]).parse().unwrap();
    assert!((170..=180).contains(&ttl), "ttl {ttl}");
}

#[tokio::test]
async fn other_windows_set_their_ttl_once_per_window() {
    let s = redis();
    let k = key("a");
    let limits = [lim(1000, 10)];
    let t = T0 * 1000;
    s.hit_all(&k, &limits, 1, t).await;
    let server = s._redis.as_ref().unwrap();
    let name = server.cli(&["KEYS", "*"]);
    assert!(name.ends_with(":s10"), "{name}");
    let ttl = || -> u64 { server.cli(&["TTL", &name]).parse().unwrap() };
    assert!((70..=80).contains(&ttl()), "2 w + 60 s: {}", ttl());
    // A TTL set by hand shows whether a later call sets it again.
    assert_eq!(server.cli(&["EXPIRE", &name, "100000"]), "1");
    s.hit_all(&k, &limits, 1, t + 9_900).await;
    assert!(ttl() > 99_000, "99 buckets on, within one window: kept");
    let o = s.hit_all(&k, &limits, 1, t + 10_000).await;
    assert_eq!(o.quotas()[0].remaining, 998, "the first count left");
    assert!(
        (70..=80).contains(&ttl()),
        "a window on: set again, {}",
        ttl()
    );
}

fn store_on(server: &RedisServer, policy: FailurePolicy) -> Store {
    let store = RedisStore::connect(&redis_options(server.url(), TimeSource::Local)).unwrap();
    Store::redis(store, policy, Duration::from_millis(50))
}

#[tokio::test]
async fn a_hung_redis_costs_at_most_the_timeout_then_the_policy_applies() {
    let server = RedisServer::start();
    for (policy, want) in [
        (FailurePolicy::Local, "local"),
        (FailurePolicy::Open, "open"),
        (FailurePolicy::Closed, "closed"),
    ] {
        let store = store_on(&server, policy);
        let k = key(want);
        assert!(matches!(
            store.hit_per_minute(&k, 2, T0).await,
            Verdict::Decided(_)
        ));
        server.pause();
        // The store timeout (250 ms) ends the call; the deadline only catches a hang.
        let v = tokio::time::timeout(Duration::from_secs(2), store.hit_per_minute(&k, 2, T0))
            .await
            .expect("the store timeout ends the call");
        let got = match v {
            Verdict::Local(d) => {
                assert!(d.allowed, "local counters start empty");
                "local"
            }
            Verdict::Open => "open",
            Verdict::Closed => "closed",
            Verdict::Decided(_) => "decided",
        };
        assert_eq!(got, want);
        assert!(store.is_degraded());
        // That nobody waits on Redis while it is down is unit-tested in store/failover.rs.
        server.resume();
        eventually(Duration::from_secs(5), || async { !store.is_degraded() }).await;
        // The call that timed out was already written to the socket, so the resumed server counts it.
        assert!(
            matches!(store.hit_per_minute(&k, 10, T0).await, Verdict::Decided(d) if d.allowed && d.remaining == 7)
        );
    }
}

#[tokio::test]
async fn local_policy_enforces_the_limit_while_redis_is_gone_and_recovery_is_automatic() {
    let mut server = RedisServer::start();
    let store = store_on(&server, FailurePolicy::Local);
    let k = key("a");
    assert!(matches!(
        store.hit_per_minute(&k, 3, T0).await,
        Verdict::Decided(_)
    ));
    server.kill();
    let mut allowed = 0;
    for _ in 0..10 {
        match store.hit_per_minute(&k, 3, T0).await {
            Verdict::Local(d) => allowed += u32::from(d.allowed),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(allowed, 3, "the limit still holds, per instance");
    server.restart();
    eventually(Duration::from_secs(5), || async { !store.is_degraded() }).await;
    match store.hit_per_minute(&k, 3, T0).await {
        Verdict::Decided(d) => assert_eq!(d.remaining, 2, "a restarted Redis is empty"),
        other => panic!("{other:?}"),
    }
}

/// With Redis' clock, a counter over its limit is answered from the block cache most of the time
/// (all but the requests near a second boundary), and every answer is still a correct rejection.
#[tokio::test]
async fn over_limit_counters_mostly_skip_the_round_trip_with_redis_clock() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&redis_options(server.url(), TimeSource::Redis)).unwrap();
    let store = Store::redis(store, FailurePolicy::Closed, Duration::from_millis(50));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let k = key("hog");
    for _ in 0..2 {
        assert!(matches!(store.hit_per_minute(&k, 2, now).await, Verdict::Decided(d) if d.allowed));
    }
    let calls = || -> u64 {
        let stats = server.cli(&["INFO", "commandstats"]);
        stats
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let before = calls();
    let mut retries = Vec::new();
    // Spread over about a second so that the share near second boundaries is what it is on average.
    for _ in 0..100 {
        match store.hit_per_minute(&k, 2, now).await {
            Verdict::Decided(d) => {
                assert!(!d.allowed);
                retries.push(d.retry_after.unwrap());
            }
            other => panic!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let round_trips = calls() - before;
    assert!(
        round_trips <= 60,
        "{round_trips} of 100 rejections went to Redis"
    );
    // Retry-After counts down from about 60 and never goes up.
    assert!(retries.windows(2).all(|w| w[1] <= w[0]), "{retries:?}");
    assert!(
        retries[0] >= 58 && *retries.last().unwrap() >= 56,
        "{retries:?}"
    );
}

/// Two instances on one Redis, limit 50, requests alternating between them; in the middle, Redis
/// drops their connections. Each instance must retry on a fresh connection, never count Redis as
/// down, and together admit exactly 50.
async fn two_instances_survive_dropped_connections(drop_connections: impl FnOnce(&RedisServer)) {
    let server = RedisServer::start();
    let a = store_on(&server, FailurePolicy::Closed);
    let b = store_on(&server, FailurePolicy::Closed);
    let k = key("shared");
    let mut allowed = 0;
    for i in 0..30 {
        let store = if i % 2 == 0 { &a } else { &b };
        match store.hit_per_minute(&k, 50, T0).await {
            Verdict::Decided(d) => allowed += u32::from(d.allowed),
            other => panic!("request {i}: {other:?}"),
        }
    }
    drop_connections(&server);
    for i in 30..120 {
        let store = if i % 2 == 0 { &a } else { &b };
        match store.hit_per_minute(&k, 50, T0).await {
            Verdict::Decided(d) => allowed += u32::from(d.allowed),
            other => panic!("request {i} after the drop: {other:?}"),
        }
    }
    assert_eq!(allowed, 50, "exactly the limit across both instances");
    for s in [&a, &b] {
        assert!(!s.is_degraded(), "a healthy Redis is never declared down");
        assert_eq!(s.errors.get(), 0, "no store error counted");
    }
}

#[tokio::test]
async fn client_kill_is_retried_on_a_fresh_connection() {
    two_instances_survive_dropped_connections(|server| {
        let killed: u32 = server
            .cli(&["CLIENT", "KILL", "TYPE", "normal"])
            .parse()
            .unwrap();
        assert!(
            killed >= 2,
            "both instances' connections were killed ({killed})"
        );
    })
    .await;
}

#[tokio::test]
async fn an_idle_timeout_disconnect_is_retried_on_a_fresh_connection() {
    two_instances_survive_dropped_connections(|server| {
        server.cli(&["CONFIG", "SET", "timeout", "1"]);
        // Redis closes idle clients on its own clock: wait (bounded) until only redis-cli's own
        // connection is listed.
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.cli(&["CLIENT", "LIST"]).lines().count() > 1 {
            assert!(
                Instant::now() < deadline,
                "Redis never closed the idle connections"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server.cli(&["CONFIG", "SET", "timeout", "0"]);
    })
    .await;
}

#[tokio::test]
async fn a_script_flush_under_two_instances_loses_no_count() {
    two_instances_survive_dropped_connections(|server| {
        assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    })
    .await;
}

/// A request whose call to take a slot is dropped before its reply (its client went away, its
/// time ran out) leaves no slot taken: the call may have taken it in Redis, so it is freed by
/// name, after the take, rather than held until its hold time.
#[tokio::test]
async fn a_call_dropped_while_taking_a_slot_leaves_no_slot_taken() {
    use quotagate_store::CounterStore;
    use std::sync::atomic::Ordering::Relaxed;
    let server = RedisServer::start();
    let delay = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (url, _proxy) = server.delayed(delay.clone()).await;
    let store = RedisStore::connect(&RedisOptions {
        timeout: Duration::from_secs(5),
        concurrency_hold: Duration::from_secs(60),
        ..redis_options(url, TimeSource::Local)
    })
    .unwrap()
    .shared();
    let k = key("dropped");
    let limits = [Limit::concurrent(1)];
    let t = T0 * 1000;
    // The connection is open and the scripts loaded before the latency comes.
    assert_eq!(
        store.peek(&k, &limits, 1, t).await.unwrap().quotas()[0].remaining,
        1
    );
    delay.store(300, Relaxed);
    let call = store.hit(&k, &limits, 1, t);
    assert!(
        tokio::time::timeout(Duration::from_millis(100), call)
            .await
            .is_err(),
        "dropped before its reply"
    );
    delay.store(0, Relaxed);
    support::eventually(Duration::from_secs(5), || async {
        server.cli(&["ZCARD", &format!("qgtest:w:{}:c", k.as_str())]) == "0"
            && store.peek(&k, &limits, 1, t).await.unwrap().quotas()[0].remaining == 1
    })
    .await;
    assert!(store.hit(&k, &limits, 1, t).await.unwrap().allowed);
    assert_eq!(store.slots_held(), 1);
}

/// Added network latency between two instances and Redis: below the store timeout every decision
/// is Redis' and together they admit exactly the limit; above it, a call ends at the timeout and
/// the failure policy answers (no request waits on the slow link longer than that).
#[tokio::test]
async fn added_latency_keeps_counts_exact_below_the_timeout_and_bounded_above() {
    let server = RedisServer::start();
    // 10 ms each way against a 1 s store timeout: a new connection (connect, two SCRIPT LOADs,
    // the call) fits many times over, even on a loaded machine.
    let delay = Arc::new(std::sync::atomic::AtomicU64::new(10));
    let (url, _proxy) = server.delayed(delay.clone()).await;
    let open = |url: &str| {
        let options = RedisOptions {
            timeout: Duration::from_secs(1),
            ..redis_options(url.to_owned(), TimeSource::Local)
        };
        let store = RedisStore::connect(&options).unwrap();
        Arc::new(Store::redis(
            store,
            FailurePolicy::Closed,
            Duration::from_millis(50),
        ))
    };
    let (a, b) = (open(&url), open(&url));
    let k = key("slow");
    let calls: Vec<_> = (0..120)
        .map(|i| {
            let (store, k) = (if i % 2 == 0 { a.clone() } else { b.clone() }, k.clone());
            tokio::spawn(async move { store.hit_per_minute(&k, 50, T0).await })
        })
        .collect();
    let mut allowed = 0;
    for c in calls {
        match c.await.unwrap() {
            Verdict::Decided(d) => allowed += u32::from(d.allowed),
            other => panic!("20 ms round trips are far below the 1 s timeout: {other:?}"),
        }
    }
    assert_eq!(allowed, 50, "exactly the limit across both instances");

    delay.store(3_000, std::sync::atomic::Ordering::Relaxed);
    let v = tokio::time::timeout(
        Duration::from_secs(2),
        a.hit_per_minute(&key("other"), 5, T0),
    )
    .await
    .expect("the 1 s store timeout ends the call, not the 6 s round trip");
    assert_eq!(v, Verdict::Closed);
    assert!(a.is_degraded());
}

/// A wrong CA, a wrong password, no client certificate, a seed list where nothing answers: each is
/// one clear error at start-up that never holds the password.
#[tokio::test]
async fn bad_tls_credentials_and_seeds_are_clear_errors_without_the_password() {
    use quotagate_store::CounterStore;
    let tls = TlsRedis::start(true, &ACL_ARGS, &ACL_LOGIN);
    let dir = tls.certs.dir.path();
    let (good, bad) = (
        file_in(dir, "good", "s3cret-pw\n"),
        file_in(dir, "bad", "wrong-pw"),
    );
    let reach = |target: RedisTarget| async move {
        let options = RedisOptions {
            target,
            timeout: Duration::from_secs(2),
            ..redis_options("redis://unused".into(), TimeSource::Local)
        };
        let store = RedisStore::connect(&options).unwrap();
        store.check_reachable().await.map_err(|e| e.to_string())
    };
    assert_eq!(
        reach(tls_target(&tls, good.to_str().unwrap())).await,
        Ok(())
    );
    let url = format!("rediss://quota:placeholder@127.0.0.1:{}", tls.port);
    let with = |ca: &str, cert: bool, pw: &std::path::Path| {
        let (c, k) = (tls.certs.path("client.pem"), tls.certs.path("client.key"));
        let files = TlsFiles {
            ca: &tls.certs.path(ca),
            cert: if cert { &c } else { "" },
            key: if cert { &k } else { "" },
            insecure: false,
        };
        RedisTarget::new(&url, RedisMode::Single, "", pw.to_str().unwrap(), &files).unwrap()
    };
    for (case, target) in [
        ("wrong CA", with("other-ca.pem", true, &good)),
        ("wrong password", with("ca.pem", true, &bad)),
        ("no client certificate", with("ca.pem", false, &good)),
    ] {
        let e = reach(target).await.unwrap_err();
        assert!(
            e.starts_with("cannot connect to Redis at rediss://quota:***@127.0.0.1:"),
            "{case}: {e}"
        );
        assert!(
            !e.contains("s3cret") && !e.contains("wrong-pw") && !e.contains('\n'),
            "{case}: {e}"
        );
    }
    let nowhere = format!(
        "redis://127.0.0.1:{},redis://127.0.0.1:{}",
        support::free_port_pair(),
        support::free_port_pair()
    );
    let target =
        RedisTarget::new(&nowhere, RedisMode::Cluster, "", "", &TlsFiles::default()).unwrap();
    let e = reach(target).await.unwrap_err();
    assert!(
        e.starts_with("cannot connect to Redis at redis://127.0.0.1:"),
        "{e}"
    );
    assert!(e.contains(" (cluster): "), "{e}");
}

/// What a caller was told about one request: the event numbers (one sequence for every caller)
/// at which it asked and was answered, and the answer.
#[derive(Debug, Clone, Copy)]
struct Told {
    instance: usize,
    /// The callers' clock when it asked (Unix ms).
    clock: u64,
    asked: u64,
    told: u64,
    allowed: bool,
    remaining: u64,
}

/// `callers` callers, spread over `instances` stores on the Redis at `url` (leases on, the
/// callers' clock moving 1 ms a request), each sending `hits` requests of cost 1 on one counter of
/// `limits`, one after another. Every caller's answers, in order.
async fn callers_on_one_counter(
    url: &str,
    instances: usize,
    callers: usize,
    hits: usize,
    k: &CounterKey,
    limits: &'static [Limit],
) -> Vec<Vec<Told>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let stores: Vec<Arc<Store>> = (0..instances)
        .map(|_| {
            let options = RedisOptions {
                lease: LeaseMode::Auto,
                timeout: Duration::from_secs(2),
                ..redis_options(url.into(), TimeSource::Local)
            };
            Arc::new(Store::redis(
                RedisStore::connect(&options).unwrap(),
                FailurePolicy::Closed,
                Duration::from_millis(50),
            ))
        })
        .collect();
    let events = Arc::new(AtomicU64::new(0));
    let clock = Arc::new(AtomicU64::new(T0 * 1000 + 7));
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let store = stores[c % instances].clone();
            let (events, clock, k) = (events.clone(), clock.clone(), k.clone());
            tokio::spawn(async move {
                let mut told = Vec::with_capacity(hits);
                for _ in 0..hits {
                    let now = clock.fetch_add(1, Ordering::SeqCst);
                    let asked = events.fetch_add(1, Ordering::SeqCst);
                    let o = match store.hit(&k, limits, 1, now).await {
                        Verdict::Decided(o) => o,
                        other => panic!("{other:?}"),
                    };
                    told.push(Told {
                        instance: c % instances,
                        clock: now,
                        asked,
                        told: events.fetch_add(1, Ordering::SeqCst),
                        allowed: o.allowed,
                        remaining: o.quotas()[0].remaining,
                    });
                }
                told
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.unwrap());
    }
    let by_lease: u64 = stores
        .iter()
        .map(|s| s.stats().unwrap().decided_by_lease.get())
        .sum();
    assert!(by_lease > 0, "leases decided some requests");
    all
}

/// The remaining each caller is told never rises (nothing leaves the window meanwhile), and is
/// never above the room there was at the instance's latest call to Redis for the counter, less
/// what was admitted since: the limit less every request admitted before it was asked (and
/// itself), except those other instances admitted since that call, which it cannot know. That
/// call was made in the lease's bucket (`bucket_ms` of the callers' clock; `u64::MAX`: leases
/// kept by another clock, assume the whole run). The number of requests admitted.
fn check_told(limit: u64, bucket_ms: u64, answers: &[Vec<Told>]) -> u64 {
    let all: Vec<&Told> = answers.iter().flatten().collect();
    let bucket = |t: &Told| t.clock.checked_div(bucket_ms).unwrap_or(0);
    let admitted: Vec<&Told> = all.iter().copied().filter(|t| t.allowed).collect();
    for (c, told) in answers.iter().enumerate() {
        for w in told.windows(2) {
            assert!(
                w[1].remaining <= w[0].remaining,
                "caller {c} was told {} after {}: {:?}",
                w[1].remaining,
                w[0].remaining,
                told.iter().map(|t| t.remaining).collect::<Vec<_>>()
            );
        }
        for t in told {
            // The instance's latest call was asked for in this bucket at the earliest.
            let bucket_began = all
                .iter()
                .filter(|o| bucket(o) == bucket(t))
                .map(|o| o.asked)
                .min()
                .unwrap_or(0);
            let unseen = admitted
                .iter()
                .filter(|o| o.instance != t.instance && o.told > bucket_began && o.told < t.asked)
                .count() as u64;
            let before = admitted.iter().filter(|o| o.told < t.asked).count() as u64;
            let room = limit - before - u64::from(t.allowed) + unseen;
            assert!(
                t.remaining <= room,
                "caller {c}: {t:?} above the room {room}"
            );
        }
    }
    admitted.len() as u64
}

/// Leases across several callers of one counter on one instance (keep-alive clients of the
/// gateway, the Divvy port's connections): each caller is told a remaining that only goes down,
/// and one instance being exact, every admitted request is told its own number, the limit down to
/// 0, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_tells_each_caller_a_remaining_that_only_goes_down() {
    static SLIDING: [Limit; 1] = [Limit::sliding(600, 30)];
    static FIXED: [Limit; 1] = [Limit::fixed(100, 60)];
    let server = RedisServer::start();
    for (limits, callers, hits, k) in [
        (&SLIDING, 9, 100, key("one-sliding")),
        (&FIXED, 6, 25, CounterKey::divvy("method=GET", "one")),
    ] {
        let answers = callers_on_one_counter(&server.url(), 1, callers, hits, &k, limits).await;
        let limit = limits[0].rl;
        // One instance sees every count: the room exactly, whatever the bucket.
        assert_eq!(check_told(limit, 1, &answers), limit, "{limits:?}");
        let mut told: Vec<u64> = answers
            .iter()
            .flatten()
            .filter(|t| t.allowed)
            .map(|t| t.remaining)
            .collect();
        told.sort_unstable();
        assert_eq!(told, (0..limit).collect::<Vec<_>>(), "{limits:?}");
    }
}

/// Three instances with leases, nine callers on one counter: what each caller is told only goes
/// down and is never above the true room, though other instances' leases count as used and come
/// back when they are given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_tell_each_caller_a_remaining_that_only_goes_down() {
    static SLIDING: [Limit; 1] = [Limit::sliding(600, 30)];
    static FIXED: [Limit; 1] = [Limit::fixed(100, 60)];
    let server = RedisServer::start();
    // Leases of a 30 s window end with its 100 ms buckets; a fixed window's last a second (of
    // real time, not the callers' clock).
    for (limits, bucket_ms, callers, hits, k) in [
        (&SLIDING, 100, 9, 100, key("three-sliding")),
        (
            &FIXED,
            u64::MAX,
            6,
            25,
            CounterKey::divvy("method=GET", "three"),
        ),
    ] {
        let answers = callers_on_one_counter(&server.url(), 3, callers, hits, &k, limits).await;
        let admitted = check_told(limits[0].rl, bucket_ms, &answers);
        assert!(admitted <= limits[0].rl, "{limits:?}");
    }
}

/// How far below the room what an instance tells is (docs/stores.md "What is told"), measured:
/// instances on one Redis with leases take turns one request at a time, on the callers' clock,
/// through 90 s of a 3000-per-minute limit (steady, bursty and slow callers; counts leave the
/// window from second 60), and each answer is set beside the room there truly is then (the
/// reference window fed every admitted request). One instance tells the room exactly; several
/// never tell a rise while nothing has left the window, nor more than the room plus what other
/// instances admitted since the instance's latest script call. `cargo test --test store --
/// --nocapture told_stays_close` prints the figures.
#[tokio::test]
async fn what_is_told_stays_close_to_the_room() {
    let server = RedisServer::start();
    let limits = [Limit::sliding(3000, 60)];
    for instances in [1, 3] {
        let stores: Vec<Store> = (0..instances)
            .map(|_| {
                let options = RedisOptions {
                    lease: LeaseMode::Auto,
                    prefix: format!("close-{instances}"),
                    timeout: Duration::from_secs(2),
                    ..redis_options(server.url(), TimeSource::Local)
                };
                Store::redis(
                    RedisStore::connect(&options).unwrap(),
                    FailurePolicy::Closed,
                    Duration::from_millis(50),
                )
            })
            .collect();
        let k = key("close");
        let mut truth = WindowSet::default();
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        let (mut answers, mut under_sum, mut under_max, mut over_max) = (0u64, 0u64, 0u64, 0u64);
        let mut last_told = vec![u64::MAX; instances];
        // Units other instances admitted since each instance's latest script call: what it
        // cannot know of.
        let mut unseen = vec![0u64; instances];
        for ms in 0..90_000u64 {
            let now = T0 * 1000 + ms;
            // Caller 0 steady at 80/s; caller 1 at 200/s for 2 s in every 5; caller 2 at 20/s.
            let rates = [80, if ms % 5000 < 2000 { 200 } else { 0 }, 20];
            for (caller, rate) in rates.into_iter().enumerate() {
                if next(1000) >= rate {
                    continue;
                }
                let i = caller % instances;
                let calls = stores[i].stats().unwrap().decided_by_redis.get();
                let o = match stores[i].hit(&k, &limits, 1, now).await {
                    Verdict::Decided(o) => o,
                    other => panic!("{other:?}"),
                };
                if stores[i].stats().unwrap().decided_by_redis.get() > calls {
                    unseen[i] = 0;
                }
                let told = o.quotas()[0].remaining;
                let room = if o.allowed {
                    let r = truth.hit(&limits, 1, now);
                    assert!(r.allowed, "never over the limit at {ms} ms");
                    r.quotas()[0].remaining
                } else {
                    truth.peek(&limits, 0, now).quotas()[0].remaining
                };
                if ms < 60_000 {
                    assert!(
                        told <= last_told[i],
                        "instance {i} told {told} after {}",
                        last_told[i]
                    );
                }
                last_told[i] = told;
                if instances == 1 {
                    assert_eq!(told, if o.allowed { room } else { 0 }, "at {ms} ms");
                }
                assert!(
                    told <= room + unseen[i],
                    "instance {i} told {told} at {ms} ms: room {room}, {} unseen",
                    unseen[i]
                );
                if o.allowed {
                    for (j, u) in unseen.iter_mut().enumerate() {
                        if j != i {
                            *u += 1;
                        }
                    }
                    answers += 1;
                    under_sum += room.saturating_sub(told);
                    under_max = under_max.max(room.saturating_sub(told));
                    over_max = over_max.max(told.saturating_sub(room));
                }
            }
        }
        let (redis, lease): (u64, u64) = stores.iter().fold((0, 0), |(r, l), s| {
            let st = s.stats().unwrap();
            (r + st.decided_by_redis.get(), l + st.decided_by_lease.get())
        });
        eprintln!(
            "{instances} instance(s): {answers} admitted; under the room by {:.1} on average, \
             {under_max} at worst; over it by {over_max} at worst; {redis} script calls, \
             {lease} decided from leases",
            under_sum as f64 / answers.max(1) as f64
        );
    }
}

/// `window.lua` keeps a straight line for one enforced 60 s limit beside its general path. The same
/// call with a lease of nothing (`want` 0, nothing given back) has the same meaning and always
/// takes the general path: so every call of one random walk goes to two twin counters, one each
/// way, and the two answers must agree, and agree with the engine's `WindowSet::hit`. The walk
/// covers what the straight line decides itself (room in this minute, a minute's first call, a
/// known block) and what it leaves to the general path (over the limit, a block that ended, the
/// oldest count to look for, idle minutes).
#[tokio::test]
async fn window_lua_straight_line_answers_as_its_general_path_and_the_engine() {
    use quotagate_store::Part;
    use quotagate_store::script::{LeaseArgs, WindowCall, WindowReply};
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let script = include_str!("../crates/store/src/window.lua");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (straight, general) = (key("straight"), key("general"));
    let mut model = WindowSet::default();
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    let mut now_ms = T0 * 1000 + 17;
    let mut rl = 7;
    for step in 0..4000 {
        now_ms += match next(100) {
            0..=59 => next(400),
            60..=89 => next(3_000),
            90..=97 => next(30_000),
            _ => 40_000 + next(100_000),
        };
        if next(200) == 0 {
            rl = 1 + next(12);
        }
        let cost = 1 + next(3);
        let limits = [Limit::sliding(rl, 60)];
        let now = i64::try_from(now_ms).unwrap();
        let mut answers = Vec::new();
        for (counter, lease) in [(&straight, None), (&general, Some(LeaseArgs::default()))] {
            let parts = [Part {
                counter,
                limits: &limits,
            }];
            let cmd =
                WindowCall::new("t", &parts).command(cost, now, Some(now), lease, |k, _, _| {
                    let mut c = redis::cmd("EVALSHA");
                    c.arg(&sha).arg(k);
                    c
                });
            let reply: String = cmd.query_async(&mut conn).await.unwrap();
            match WindowReply::read(&reply, &limits) {
                Some(WindowReply::Decided {
                    outcome,
                    grant,
                    retry_ms,
                    resets_ms,
                    ..
                }) => answers.push((outcome, grant, retry_ms, resets_ms)),
                other => panic!("step {step}: {reply:?} read as {other:?}"),
            }
        }
        assert_eq!(
            answers[0], answers[1],
            "step {step} at {now_ms}, limit {rl}, cost {cost}"
        );
        let want = model.hit(&limits, cost, now_ms);
        assert_eq!(
            answers[0].0, want,
            "step {step} at {now_ms}, limit {rl}, cost {cost}"
        );
    }
}

/// A random walk of requests (sliding windows with a calendar quota, a pool, a Divvy-style
/// fixed window) on the embedded store kept in a directory, stopped cleanly and opened again at
/// random points, answers exactly as the memory store that never stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_and_start_on_disk_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let reference = Store::memory();
    let mut durable = Store::embedded(on_disk_in(dir.path()), FailurePolicy::Closed);
    let mut next = xorshift(0x5EED_D15C_0000_0001);
    let (own, pooled, pool) = (
        CounterKey::new(b"k1", "GET /a"),
        CounterKey::new(b"k1", "GET /b"),
        CounterKey::pool(b"k1", "g"),
    );
    let divvy = CounterKey::divvy("method=GET", "actor");
    let limits = [lim(5, 10), calendar(40, Period::Day, "Europe/Berlin")];
    let pooled_limits = [lim(6, 60), lim(3, 10)];
    let pools = [(pool.clone(), 1)];
    let fixed = [Limit::fixed(7, 30)];
    let mut now = T0 * 1000;
    let (mut stops, mut admitted) = (0, 0);
    for step in 0..3000 {
        now += next(1500);
        let cost = 1 + next(2);
        let (a, b) = match next(3) {
            0 => (
                reference.hit(&own, &limits, cost, now).await,
                durable.hit(&own, &limits, cost, now).await,
            ),
            1 => (
                reference
                    .hit_pooled(&pooled, &pooled_limits, &pools, cost, now)
                    .await,
                durable
                    .hit_pooled(&pooled, &pooled_limits, &pools, cost, now)
                    .await,
            ),
            _ => (
                reference.hit(&divvy, &fixed, cost, now).await,
                durable.hit(&divvy, &fixed, cost, now).await,
            ),
        };
        assert_eq!(a, b, "step {step} at {now}");
        admitted += usize::from(matches!(a, Verdict::Decided(o) if o.allowed));
        if next(100) == 0 {
            let local = durable.local();
            tokio::task::block_in_place(|| local.close());
            drop(durable);
            durable = Store::embedded(reopen_on_disk(dir.path()), FailurePolicy::Closed);
            stops += 1;
        }
    }
    assert!(
        stops >= 10 && admitted >= 500,
        "{stops} stops, {admitted} admitted"
    );
}

/// A store abandoned without a stop (as a crash leaves it: every commit on disk, nothing
/// after) charges each counter back at least what it admitted and at most its reservations
/// more: a quota of 1,000 a month, hit from several tasks, then the store opened again, never
/// admits more than 1,000 in all, and at least 950.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_never_lets_a_quota_pass_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let key = CounterKey::new(b"monthly", "GET /x");
    let limits = [calendar(1000, Period::Month, "UTC")];
    let clock = SystemClock::new();
    let mut admitted = 0u64;
    let open = || {
        MemoryStore::open_with(
            dir.path(),
            Arc::new(clock.clone()),
            Duration::from_millis(2),
        )
    };
    let mut opened = open().unwrap();
    for _crash in 0..3 {
        let store = Arc::new(Store::embedded(opened, FailurePolicy::Closed));
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (store, key) = (store.clone(), key.clone());
                let clock = clock.clone();
                tokio::spawn(async move {
                    use quotagate_engine::clock::Clock;
                    let mut n = 0u64;
                    for _ in 0..120 {
                        if let Verdict::Decided(o) =
                            store.hit(&key, &limits, 1, clock.now_ms()).await
                            && o.allowed
                        {
                            n += 1;
                        }
                    }
                    n
                })
            })
            .collect();
        for t in tasks {
            admitted += t.await.unwrap();
        }
        // A crash: the store is dropped, never closed; its directory is free once the writer
        // sees it gone.
        drop(store);
        let deadline = Instant::now() + Duration::from_secs(5);
        opened = loop {
            match open() {
                Ok(s) => break s,
                Err(e) => assert!(Instant::now() < deadline, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
    }
    // What is left after the three crashes.
    let store = Store::embedded(opened, FailurePolicy::Closed);
    use quotagate_engine::clock::Clock;
    for _ in 0..1000 {
        if let Verdict::Decided(o) = store.hit(&key, &limits, 1, clock.now_ms()).await
            && o.allowed
        {
            admitted += 1;
        }
    }
    eprintln!("{admitted} admitted");
    assert!((950..=1000).contains(&admitted), "{admitted} admitted");
}

/// Two processes on one directory would each admit the whole quota: the second is refused,
/// naming the directory and the holder.
#[tokio::test]
async fn a_directory_serves_one_store_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let first = on_disk_in(dir.path());
    let e = MemoryStore::open_with(dir.path(), Arc::new(SystemClock::new()), Duration::ZERO)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&dir.path().display().to_string()), "{e}");
    assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
    first.close();
    reopen_on_disk(dir.path()).close();
}

/// Files damaged after a stop: the start resumes from the last whole commit (a commit cut
/// short at the end was never answered) or refuses with one line; it never starts from less
/// than what was committed without saying so, and never panics.
#[tokio::test]
async fn damaged_files_resume_from_the_last_commit_or_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let key = CounterKey::new(b"k", "GET /x");
    let limits = [calendar(100_000, Period::Month, "UTC")];
    let now = T0 * 1000;
    {
        // Snapshot, then a log of commits (abandoned: no final snapshot).
        let store = Store::embedded(on_disk_in(dir.path()), FailurePolicy::Closed);
        for i in 0..200 {
            let k = CounterKey::new(format!("k{i}").as_bytes(), "GET /x");
            store.hit(&k, &limits, 1, now).await;
        }
        store.local().close();
        let store = Store::embedded(on_disk_in(dir.path()), FailurePolicy::Closed);
        for _ in 0..50 {
            store.hit(&key, &limits, 1, now).await;
        }
    }
    let log = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("log."))
        .unwrap();
    let (snapshot, log_bytes) = (
        std::fs::read(dir.path().join("snapshot")).unwrap(),
        std::fs::read(&log).unwrap(),
    );
    let mut next = xorshift(0xDA4A_6ED0_0000_0001);
    for round in 0..60 {
        std::fs::write(dir.path().join("snapshot"), &snapshot).unwrap();
        std::fs::write(&log, &log_bytes).unwrap();
        let (target, bytes) = if round % 2 == 0 {
            (&log, &log_bytes)
        } else {
            (&dir.path().join("snapshot"), &snapshot)
        };
        let mut damaged = bytes.clone();
        if round % 4 < 2 {
            damaged.truncate(next(bytes.len() as u64) as usize);
        } else {
            let at = next(bytes.len() as u64) as usize;
            damaged[at] ^= 1 << next(8);
        }
        std::fs::write(target, &damaged).unwrap();
        match MemoryStore::open_with(dir.path(), Arc::new(SystemClock::new()), Duration::ZERO) {
            Ok(store) => {
                // Resumed: the key holds at most the 50 it admitted, and at least what the
                // commits left whole hold (a cut log: fewer, never more).
                let store = Store::embedded(store, FailurePolicy::Closed);
                let o = store.peek(&key, &limits, 1, now).await.unwrap();
                assert!(
                    o.quotas()[0].remaining >= 100_000 - 50 - 2 * 500,
                    "round {round}"
                );
                store.local().close();
            }
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.starts_with("store.path ") && !e.contains('\n'),
                    "round {round}: {e}"
                );
            }
        }
        // Each round starts from the same files.
        for f in std::fs::read_dir(dir.path()).unwrap() {
            let p = f.unwrap().path();
            if p.file_name().unwrap() != "lock" {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
}

/// A directory that stops taking writes (its next log is a full disk, `/dev/full`) marks the
/// store degraded at its next snapshot: the failure policy answers (`closed`: refused, counting
/// nothing); once a snapshot can be written again, answers are durable again, and a stop then
/// keeps every count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_that_cannot_be_written_applies_the_failure_policy() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::embedded(on_disk_in(dir.path()), FailurePolicy::Closed);
    let full = dir.path().join("log.0000000002");
    std::os::unix::fs::symlink("/dev/full", &full).unwrap();
    let key = CounterKey::new(b"k", "GET /x");
    let limits = [lim(100, 60)];
    let now = T0 * 1000;
    let decided = |v: Verdict| matches!(v, Verdict::Decided(o) if o.allowed);
    assert!(decided(store.hit(&key, &limits, 1, now).await));
    store.local().disk().unwrap().compact_now();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !store.is_degraded() {
        assert!(Instant::now() < deadline, "never degraded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.hit(&key, &limits, 1, now).await, Verdict::Closed);
    std::fs::remove_file(&full).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.is_degraded() {
        assert!(Instant::now() < deadline, "never writable again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(decided(store.hit(&key, &limits, 1, now).await));
    store.local().close();
    drop(store);
    let store = Store::embedded(on_disk_in(dir.path()), FailurePolicy::Closed);
    let o = store.peek(&key, &limits, 1, now).await.unwrap();
    assert_eq!(
        o.quotas()[0].remaining,
        98,
        "the two answered, not the refused one"
    );
    store.local().close();
}
