//! The Divvy port at the wire: raw bytes over real TCP, on the memory store and on a private
//! redis-server, with the same cases for both.

mod support;

use std::sync::Arc;
use std::time::Duration;

use quotagate::divvy::Divvy;
use quotagate::divvy::rules::RuleSet;
use quotagate::divvy::server::{ConnectionLimits, serve};
use quotagate_engine::clock::FakeClock;
use quotagate_store::{FailurePolicy, RedisOptions, RedisStore, Store, TimeSource};
use support::RedisServer;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const README_RULES: &str = include_str!("../examples/divvy-example.ini");

const TEST_RULES: &str = "
[k=exact]
creditLimit = 100
resetSeconds = 600

[k=short]
creditLimit = 2
resetSeconds = 10

[k=always]
creditLimit = 5
resetSeconds = 0

[tier=*]
creditLimit = 2
resetSeconds = 60
matchPolicy = canary
label = watch

[k=deny]
creditLimit = 0

[default]
creditLimit = 1000
resetSeconds = 60
";

/// The Redis behind a port: one server, or a 3-master cluster.
enum Redis {
    Server(RedisServer),
    Cluster(support::RedisCluster),
}

impl Redis {
    fn target(&self) -> quotagate_store::RedisTarget {
        use quotagate_store::{RedisMode, RedisTarget, connect::TlsFiles};
        match self {
            Redis::Server(r) => RedisTarget::single(&r.url()).unwrap(),
            Redis::Cluster(c) => {
                RedisTarget::new(&c.url(), RedisMode::Cluster, "", "", &TlsFiles::default())
                    .unwrap()
            }
        }
    }

    /// `GET key`, wherever the key lives.
    fn get(&self, key: &str) -> String {
        match self {
            Redis::Server(r) => r.cli(&["GET", key]),
            Redis::Cluster(c) => c
                .masters()
                .into_iter()
                .filter_map(|p| c.cli(p, &["GET", key]))
                .find(|v| !v.is_empty() && !v.starts_with("MOVED"))
                .unwrap_or_default(),
        }
    }

    /// Runs `script` (no keys) on the server, or on every master.
    fn eval_everywhere(&self, script: &str, arg: &str) {
        match self {
            Redis::Server(r) => {
                r.cli(&["EVAL", script, "0", arg]);
            }
            Redis::Cluster(c) => {
                for p in c.masters() {
                    c.cli(p, &["EVAL", script, "0", arg]);
                }
            }
        }
    }

    fn server(&self) -> &RedisServer {
        match self {
            Redis::Server(r) => r,
            Redis::Cluster(_) => panic!("a single server was expected"),
        }
    }
}

/// A Divvy port on port 0 in front of one store, stopped on drop.
struct Port {
    addr: std::net::SocketAddr,
    divvy: Arc<Divvy>,
    clock: FakeClock,
    redis: Option<Redis>,
    store: Arc<Store>,
    token: CancellationToken,
}

impl Drop for Port {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

impl Port {
    async fn start(rules: &str, redis: Option<Redis>, settings: ConnectionLimits) -> Port {
        Port::start_with(rules, redis, settings, FailurePolicy::Closed).await
    }

    async fn start_with(
        rules: &str,
        redis: Option<Redis>,
        settings: ConnectionLimits,
        policy: FailurePolicy,
    ) -> Port {
        Port::start_full(rules, redis, settings, policy, None).await
    }

    async fn start_full(
        rules: &str,
        redis: Option<Redis>,
        settings: ConnectionLimits,
        policy: FailurePolicy,
        statsd: Option<quotagate::divvy::metrics::Statsd>,
    ) -> Port {
        // On Redis, every case also runs the connections on two workers, each with its own
        // Redis connection, as the binary does (memory cases use the test's runtime).
        let workers = redis.is_some().then(|| {
            Arc::new(quotagate::server::workers::Workers::start(2, "test-divvy").unwrap())
        });
        let store = Arc::new(match &redis {
            None => Store::memory(),
            Some(r) => {
                let s = RedisStore::connect(&RedisOptions {
                    target: r.target(),
                    timeout: Duration::from_millis(1000),
                    pool_size: 8,
                    prefix: "unused".into(),
                    time_source: TimeSource::Local,
                    connections: 2,
                    lease: Default::default(),
                    lease_max_units: 1000,
                    concurrency_hold: Duration::from_secs(10),
                })
                .unwrap()
                .with_thread_slot(quotagate::server::workers::current);
                Store::redis(s, policy, Duration::from_millis(50))
            }
        });
        let clock = FakeClock::new(1_700_000_000);
        let divvy = Arc::new(Divvy::new(
            RuleSet::parse("rules.ini", rules).unwrap(),
            store.clone(),
            Arc::new(clock.clone()),
            statsd,
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let token = CancellationToken::new();
        tokio::spawn(serve(
            listener,
            divvy.clone(),
            settings,
            workers,
            token.clone().cancelled_owned(),
        ));
        Port {
            addr,
            divvy,
            clock,
            redis,
            store,
            token,
        }
    }

    /// Lets `seconds` pass for the windows: the fake clock for memory, shorter TTLs in Redis.
    fn advance(&self, seconds: u64) {
        self.clock.advance(seconds);
        if let Some(r) = &self.redis {
            let script = "for _, k in ipairs(redis.call('KEYS', 'divvy:*')) do
                local left = redis.call('PTTL', k) - tonumber(ARGV[1])
                if left <= 0 then redis.call('DEL', k) else redis.call('PEXPIRE', k, left) end
            end";
            r.eval_everywhere(script, &(seconds * 1000).to_string());
        }
    }

    /// Sends `bytes` on a new connection, closes the writing side, and returns everything read.
    async fn exchange(&self, bytes: &[u8]) -> String {
        let mut tcp = TcpStream::connect(self.addr).await.unwrap();
        tcp.write_all(bytes).await.unwrap();
        tcp.shutdown().await.unwrap();
        read_all(&mut tcp).await
    }
}

async fn read_all(tcp: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut out))
        .await
        .expect("the server closed the connection")
        .unwrap();
    String::from_utf8(out).unwrap()
}

fn memory() -> Option<Redis> {
    None
}

fn redis() -> Option<Redis> {
    Some(Redis::Server(RedisServer::start()))
}

fn cluster() -> Option<Redis> {
    Some(Redis::Cluster(support::RedisCluster::start(3, 0)))
}

macro_rules! on_every_store {
    ($($case:ident),* $(,)?) => {
        mod on_memory { $( #[tokio::test] async fn $case() { super::$case(super::memory()).await } )* }
        mod on_redis { $( #[tokio::test] async fn $case() { super::$case(super::redis()).await } )* }
        /// On a 3-master cluster too: Divvy's keys are used one at a time, in any slot.
        mod on_cluster { $( #[tokio::test] async fn $case() { super::$case(super::cluster()).await } )* }
    };
}

on_every_store!(
    the_readme_walkthrough,
    windows_start_at_the_first_hit_and_are_not_extended,
    pipelined_replies_come_back_in_order,
    five_hundred_pipelined_hits_execute_in_order_under_load,
    errors_close_the_connection_and_later_lines_are_not_executed,
    canaries_consume_quota_but_never_decide,
    fifty_connections_never_get_more_than_the_limit,
    each_connection_sees_its_credit_only_go_down,
);

async fn the_readme_walkthrough(redis: Option<Redis>) {
    let p = Port::start(README_RULES, redis, ConnectionLimits::default()).await;
    let got = p
        .exchange(
            b"HIT method=GET path=/status\n\
              HIT method=GET path=/pantry/cookies ip=192.168.1.1\n\
              HIT method=GET path=/pantry/cookies ip=192.168.1.1\n\
              HIT method=GET path=/pantry/cookies ip=192.168.1.1\n\
              HIT method=GET path=/pantry/cookies ip=192.168.1.1\n\
              HIT method=GET path=/pantry/cookies ip=4.3.2.1\n\
              HIT method=\"POST\" path=\"/cgi-bin/upload.cgi\"\n\
              HIT method=\"DELETE\" path=\"/index.html\"\n",
        )
        .await;
    assert_eq!(
        got,
        "OK true 999 60\nOK true 2 3600\nOK true 1 3600\nOK true 0 3600\nOK false 0 3600\nOK true 2 3600\nOK true 59 60\nOK false 0 -1\n"
    );
    if let Some(r) = &p.redis {
        // The original Divvy's key layout, so both can share one Redis.
        assert_eq!(
            r.get("divvy:ip=* method=GET path=/pantry/cookies:192.168.1.1:3:3600"),
            "0"
        );
        assert_eq!(r.get("divvy:method=GET path=/status::1000:60"), "999");
    }
}

async fn windows_start_at_the_first_hit_and_are_not_extended(redis: Option<Redis>) {
    let p = Port::start(TEST_RULES, redis, ConnectionLimits::default()).await;
    assert_eq!(p.exchange(b"HIT k=short\n").await, "OK true 1 10\n");
    p.advance(3);
    assert_eq!(p.exchange(b"HIT k=short\n").await, "OK true 0 7\n");
    p.advance(3);
    assert_eq!(
        p.exchange(b"HIT k=short\nHIT k=short\n").await,
        "OK false 0 4\nOK false 0 4\n"
    );
    p.advance(4);
    assert_eq!(
        p.exchange(b"HIT k=short\n").await,
        "OK true 1 10\n",
        "a fresh full window"
    );
    assert_eq!(
        p.exchange(b"HIT k=always\nHIT k=always\n").await,
        "OK true 5 0\nOK true 5 0\n"
    );
    assert_eq!(p.exchange(b"HIT k=deny\n").await, "OK false 0 -1\n");
}

async fn pipelined_replies_come_back_in_order(redis: Option<Redis>) {
    let p = Port::start(TEST_RULES, redis, ConnectionLimits::default()).await;
    // Denials need no store call and finish first; they must still be answered in order.
    let mut req = String::new();
    for i in 0..200 {
        if i % 3 == 0 {
            req.push_str("HIT k=deny\n");
        } else {
            req.push_str("hit k=exact\r\n");
        }
    }
    req.push_str("\n\r\n"); // empty lines: ignored
    let got = p.exchange(req.as_bytes()).await;
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(lines.len(), 200);
    // Replies in request order, and hits executed in request order too (as Divvy does): the
    // credits count down line by line, with the store-free denials at their own positions.
    let mut credit = 100;
    for (i, line) in lines.iter().enumerate() {
        if i % 3 == 0 {
            assert_eq!(*line, "OK false 0 -1", "line {i}");
        } else if credit > 0 {
            credit -= 1;
            assert_eq!(*line, format!("OK true {credit} 600"), "line {i}");
        } else {
            assert_eq!(*line, "OK false 0 600", "line {i}");
        }
    }
}

/// Issue 9: 500 hits sent at once on one connection, for an actor with a limit of 100, must be
/// decided in request order (credit 99 down to 0, then denials) while other connections load the
/// same port; repeated on fresh windows, since a reordering shows only in some runs.
async fn five_hundred_pipelined_hits_execute_in_order_under_load(redis: Option<Redis>) {
    let on_redis = redis.is_some();
    let p = Port::start(
        "[k=exact]\ncreditLimit = 100\nresetSeconds = 600\n\n[k=load]\ncreditLimit = 1000000000\nresetSeconds = 600\n\n[default]\ncreditLimit = 0\n",
        redis,
        ConnectionLimits::default(),
    )
    .await;
    let addr = p.addr;
    let load: Vec<_> = (0..4)
        .map(|c| {
            tokio::spawn(async move {
                let mut tcp = TcpStream::connect(addr).await.unwrap();
                let _ = c;
                tcp.write_all("HIT k=load\n".repeat(250).as_bytes())
                    .await
                    .unwrap();
                tcp.shutdown().await.unwrap();
                read_all(&mut tcp).await.lines().count()
            })
        })
        .collect();
    for round in 0..10 {
        let sent = std::time::Instant::now();
        let got = p.exchange("HIT k=exact\n".repeat(500).as_bytes()).await;
        // On Redis the window's reset is its TTL, which Redis' own clock counts down in real
        // time (rounded to the nearest second): it may tick during the exchange, never rise.
        let ticks = match on_redis {
            true => (sent.elapsed().as_millis() as u64 + 500) / 1000,
            false => 0,
        };
        let want: Vec<(&str, u64)> = (0..100)
            .rev()
            .map(|c| ("true", c))
            .chain(std::iter::repeat_n(("false", 0), 400))
            .collect();
        let lines: Vec<(&str, u64, u64)> = got
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                assert_eq!((f.len(), f[0]), (4, "OK"), "round {round}: {l}");
                (f[1], f[2].parse().unwrap(), f[3].parse().unwrap())
            })
            .collect();
        assert_eq!(
            lines.iter().map(|&(a, c, _)| (a, c)).collect::<Vec<_>>(),
            want,
            "round {round}: in request order"
        );
        assert!(
            lines.windows(2).all(|w| w[1].2 <= w[0].2)
                && lines.iter().all(|l| (600 - ticks..=600).contains(&l.2)),
            "round {round}: resets {:?} after {ticks} s",
            lines.iter().map(|l| l.2).collect::<Vec<_>>()
        );
        p.advance(600); // a fresh window for the next round
    }
    for l in load {
        assert_eq!(l.await.unwrap(), 250);
    }
}

async fn errors_close_the_connection_and_later_lines_are_not_executed(redis: Option<Redis>) {
    let p = Port::start(TEST_RULES, redis, ConnectionLimits::default()).await;
    let got = p.exchange(b"HIT k=short\nBOGUS\nHIT k=short\n").await;
    assert_eq!(
        got,
        "OK true 1 10\nERR unknown-command \"Unrecognized command: BOGUS\"\n"
    );
    assert_eq!(
        p.exchange(b"HIT k=short\n").await,
        "OK true 0 10\n",
        "the line after the error consumed nothing"
    );
    assert_eq!(
        p.exchange(b"HIT a=b=c\nHIT k=short\n").await,
        "ERR unknown \"Expected whitespace, found '='\"\n"
    );
    assert_eq!(p.exchange(b"HIT k=short\n").await, "OK false 0 10\n");
}

async fn canaries_consume_quota_but_never_decide(redis: Option<Redis>) {
    let p = Port::start(TEST_RULES, redis, ConnectionLimits::default()).await;
    let got = p
        .exchange(b"HIT tier=gold\nHIT tier=gold\nHIT tier=gold\n")
        .await;
    assert_eq!(
        got, "OK true 999 60\nOK true 998 60\nOK true 997 60\n",
        "the default rule decides"
    );
    if let Some(r) = &p.redis {
        assert_eq!(
            r.get("divvy:tier=*::2:60"),
            "0",
            "the canary spent its own quota"
        );
    }
}

async fn fifty_connections_never_get_more_than_the_limit(redis: Option<Redis>) {
    let p = Port::start(TEST_RULES, redis, ConnectionLimits::default()).await;
    let addr = p.addr;
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            tokio::spawn(async move {
                let mut tcp = TcpStream::connect(addr).await.unwrap();
                tcp.write_all("HIT k=exact\n".repeat(6).as_bytes())
                    .await
                    .unwrap();
                tcp.shutdown().await.unwrap();
                read_all(&mut tcp).await
            })
        })
        .collect();
    let mut credits = Vec::new();
    let mut denied = 0;
    for t in tasks {
        for line in t.await.unwrap().lines() {
            match line
                .strip_prefix("OK true ")
                .and_then(|r| r.strip_suffix(" 600"))
            {
                Some(c) => credits.push(c.parse::<u64>().unwrap()),
                None => {
                    assert_eq!(line, "OK false 0 600");
                    denied += 1;
                }
            }
        }
    }
    credits.sort_unstable();
    assert_eq!(
        credits,
        (0..100).collect::<Vec<_>>(),
        "exactly 100 granted, credits 99..0 once each"
    );
    assert_eq!(denied, 200);
}

/// Issue 33: six connections on one rule of 100, three pipelining 50 hits and three sending one
/// at a time. Exactly 100 granted, credits 99..0 once each, and the credit each connection sees
/// only goes down, as the original Divvy's does (with leases too: the store tells one number
/// whichever way it decided).
async fn each_connection_sees_its_credit_only_go_down(redis: Option<Redis>) {
    let p = Port::start(TEST_RULES, redis, ConnectionLimits::default()).await;
    let addr = p.addr;
    let tasks: Vec<_> = (0..6)
        .map(|c| {
            tokio::spawn(async move {
                let mut tcp = TcpStream::connect(addr).await.unwrap();
                if c % 2 == 0 {
                    tcp.write_all("HIT k=exact\n".repeat(50).as_bytes())
                        .await
                        .unwrap();
                    tcp.shutdown().await.unwrap();
                    return read_all(&mut tcp).await;
                }
                let (read, mut write) = tcp.split();
                let mut lines = tokio::io::BufReader::new(read).lines();
                let mut got = String::new();
                for _ in 0..50 {
                    write.write_all(b"HIT k=exact\n").await.unwrap();
                    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
                        .await
                        .expect("answered")
                        .unwrap()
                        .unwrap();
                    got.push_str(&line);
                    got.push('\n');
                }
                got
            })
        })
        .collect();
    let mut granted = Vec::new();
    for (c, t) in tasks.into_iter().enumerate() {
        // Each line's credit: a denial says 0.
        let mut seen = Vec::new();
        for line in t.await.unwrap().lines() {
            match line.strip_prefix("OK true ") {
                Some(rest) => {
                    let credit: u64 = rest.strip_suffix(" 600").unwrap().parse().unwrap();
                    granted.push(credit);
                    seen.push(credit);
                }
                None => {
                    assert_eq!(line, "OK false 0 600");
                    seen.push(0);
                }
            }
        }
        assert_eq!(seen.len(), 50);
        assert!(
            seen.windows(2).all(|w| w[1] <= w[0]),
            "connection {c} saw its credit rise: {seen:?}"
        );
    }
    granted.sort_unstable();
    assert_eq!(
        granted,
        (0..100).collect::<Vec<_>>(),
        "exactly 100 granted, credits 99..0 once each"
    );
}

// ---- robustness (memory store: these are about the server, not the store) ----

fn small_lines() -> ConnectionLimits {
    ConnectionLimits {
        max_line_bytes: 4096,
        ..ConnectionLimits::default()
    }
}

#[tokio::test]
async fn an_over_long_line_gets_an_error_without_waiting_for_its_end() {
    let p = Port::start(TEST_RULES, None, small_lines()).await;
    let mut tcp = TcpStream::connect(p.addr).await.unwrap();
    // 1 MiB without a newline, and the connection left open: the answer must not wait for more.
    let long = format!("HIT k={}", "x".repeat(1024 * 1024));
    let _ = tcp.write_all(long.as_bytes()).await;
    let got = read_all(&mut tcp).await;
    assert_eq!(
        got,
        "ERR unknown \"Line too long: more than 4096 bytes.\"\n"
    );
    // Lines up to the limit are fine.
    let ok = format!("HIT k={}\n", "y".repeat(4000));
    assert_eq!(p.exchange(ok.as_bytes()).await, "OK true 999 60\n");
}

#[tokio::test]
async fn binary_junk_and_invalid_utf8_get_an_error_and_others_carry_on() {
    let p = Port::start(TEST_RULES, None, ConnectionLimits::default()).await;
    let got = p.exchange(b"\xff\xfe\x00junk\nHIT k=exact\n").await;
    assert_eq!(
        got,
        "ERR unknown-command \"Unrecognized command: \u{fffd}\u{fffd}\u{0}JUNK\"\n"
    );
    assert_eq!(
        p.exchange(b"HIT who=\xc3\x28\n").await,
        "OK true 999 60\n",
        "invalid UTF-8 in a value is replaced"
    );
    assert_eq!(p.exchange(b"HIT k=exact\n").await, "OK true 99 600\n");
}

#[tokio::test]
async fn a_dripping_client_and_a_half_closed_one_are_answered() {
    let p = Port::start(TEST_RULES, None, ConnectionLimits::default()).await;
    let mut drip = TcpStream::connect(p.addr).await.unwrap();
    for b in b"HIT k=exact\n" {
        drip.write_all(&[*b]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        // others are served meanwhile
    }
    assert_eq!(p.exchange(b"HIT k=short\n").await, "OK true 1 10\n");
    let mut line = [0u8; 15];
    drip.read_exact(&mut line).await.unwrap();
    assert_eq!(&line, b"OK true 99 600\n");
    // A last line without '\n' before FIN is answered too.
    assert_eq!(
        p.exchange(b"HIT k=exact\nHIT k=exact").await,
        "OK true 98 600\nOK true 97 600\n"
    );
}

#[tokio::test]
async fn a_client_that_never_reads_does_not_stall_others() {
    let settings = ConnectionLimits {
        max_in_flight: 64,
        ..ConnectionLimits::default()
    };
    let p = Port::start(TEST_RULES, None, settings).await;
    let addr = p.addr;
    // Writes far more than the socket buffers hold and never reads a reply.
    let hog = tokio::spawn(async move {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let burst = "HIT k=exact\n".repeat(10_000);
        for _ in 0..1000 {
            if tcp.write_all(burst.as_bytes()).await.is_err() {
                break;
            }
        }
        tcp
    });
    // The server is working through the hog's lines once its quota is used up.
    support::eventually(Duration::from_secs(5), || async {
        p.exchange(b"HIT k=exact\n").await.starts_with("OK false")
    })
    .await;
    // Others are answered meanwhile: a stall would hang, so each answer has a deadline.
    for _ in 0..20 {
        let answer = tokio::time::timeout(Duration::from_secs(3), p.exchange(b"HIT k=short\n"))
            .await
            .expect("answered while the hog is blocked");
        assert!(answer.starts_with("OK "), "{answer}");
    }
    // 120 MB of lines: the hog finishes only if the server reads on without writing replies.
    assert!(
        !hog.is_finished(),
        "the server stopped reading the hog: its writes block"
    );
    hog.abort();
}

#[tokio::test]
async fn lost_redis_scripts_heal_and_a_down_redis_follows_the_policy() {
    let p = Port::start(TEST_RULES, redis(), ConnectionLimits::default()).await;
    assert_eq!(p.exchange(b"HIT k=exact\n").await, "OK true 99 600\n");
    let r = p.redis.as_ref().unwrap().server();
    assert_eq!(r.cli(&["SCRIPT", "FLUSH"]), "OK");
    assert_eq!(p.exchange(b"HIT k=exact\n").await, "OK true 98 600\n");
    r.pause();
    assert_eq!(
        p.exchange(b"HIT k=exact\nHIT k=exact\n").await,
        "ERR unknown \"quota store unavailable\"\n"
    );
    r.resume();
    support::eventually(Duration::from_secs(5), || async { !p.store.is_degraded() }).await;

    let local = Port::start_with(
        TEST_RULES,
        redis(),
        ConnectionLimits::default(),
        FailurePolicy::Local,
    )
    .await;
    local.redis.as_ref().unwrap().server().pause();
    assert_eq!(
        local
            .exchange(b"HIT k=short\nHIT k=short\nHIT k=short\n")
            .await,
        "OK true 1 10\nOK true 0 10\nOK false 0 10\n"
    );
    local.redis.as_ref().unwrap().server().resume();
}

#[tokio::test]
async fn statsd_gets_divvys_metric_names() {
    let sink = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let statsd = quotagate::divvy::metrics::Statsd::from_env(|k| match k {
        "STATSD_HOST" => Some("127.0.0.1".into()),
        "STATSD_PORT" => Some(sink.local_addr().unwrap().port().to_string()),
        "STATSD_PREFIX" => Some("qg".into()),
        _ => None,
    })
    .unwrap();
    let p = Port::start_full(
        README_RULES,
        None,
        ConnectionLimits::default(),
        FailurePolicy::Local,
        Some(statsd),
    )
    .await;
    let got = p
        .exchange(
            b"HIT method=GET path=/pantry/cookies ip=1.1.1.1\nHIT method=GET path=/pantry/cookies ip=1.1.1.1\n\
              HIT method=GET path=/pantry/cookies ip=1.1.1.1\nHIT method=GET path=/pantry/cookies ip=1.1.1.1\nNOPE\n",
        )
        .await;
    assert!(
        got.ends_with("ERR unknown-command \"Unrecognized command: NOPE\"\n"),
        "{got}"
    );
    let mut seen = std::collections::HashMap::<String, u32>::new();
    let mut buf = [0u8; 512];
    let want = [
        ("qg.hit.accepted:1|c", 3),
        ("qg.hit.accepted.cookies:1|c", 3),
        ("qg.hit.rejected:1|c", 1),
        ("qg.hit.rejected.cookies:1|c", 1),
        ("qg.error.unknown-command:1|c", 1),
        ("qg.connections:1|g", 1),
        ("qg.connections:0|g", 1),
    ];
    let done = |seen: &std::collections::HashMap<String, u32>| {
        want.iter().all(|(m, n)| seen.get(*m) == Some(n))
    };
    let mut timers = 0;
    while !done(&seen) {
        let n = tokio::time::timeout(Duration::from_secs(5), sink.recv(&mut buf))
            .await
            .expect("statsd metrics arrive")
            .unwrap();
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        if m.starts_with("qg.hit:") && m.ends_with("|ms") {
            timers += 1;
        } else {
            *seen.entry(m).or_default() += 1;
        }
    }
    assert!(timers >= 3, "a timer per answered hit: {timers}");
}

#[tokio::test]
async fn prometheus_names_are_divvys() {
    let p = Port::start(README_RULES, None, ConnectionLimits::default()).await;
    p.exchange(
        b"HIT method=GET path=/pantry/cookies ip=1.1.1.1\nHIT method=GET path=/status\nNOPE\n",
    )
    .await;
    let mut registry = prometheus_client::registry::Registry::default();
    p.divvy.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        r#"divvy_hits_total{status="accepted",rule_label="cookies"} 1"#,
        r#"divvy_hits_total{status="accepted",rule_label=""} 1"#,
        r#"divvy_errors_total{code="unknown-command"} 1"#,
        "divvy_tcp_connections_total 0",
        "divvy_hit_duration_seconds_count 2",
        r#"divvy_hit_duration_seconds_bucket{le="0.001"}"#,
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "{line} missing from:\n{text}"
        );
    }
}
