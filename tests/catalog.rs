//! The live catalog at the wire: a real catalog server (and a misbehaving one), real gateways, real
//! Redis for the announcements between instances.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quotagate::config::{Config, StoreKind};
use quotagate_engine::clock::FakeClock;
use quotagate_store::{RedisMode, TimeSource};
use support::{
    CATALOG_SECRET, CatalogFixture, Fault, FaultyCatalogServer, RedisServer, TestGateway, Upstream,
    eventually, get, http2_client, send,
};

const T0: u64 = 1_700_000_040;
const REFRESH: &str = "X-Quotagate-Refresh";
const REFRESH_SECRET: &str = "refresh-secret";

/// A catalog with one endpoint, `GET /items/{id}`, and the given (key, limit) pairs.
fn catalog(released: &str, keys: &[(&str, u64)]) -> String {
    let apilimits: Vec<String> = keys
        .iter()
        .map(|(k, rl)| format!(r#"{{"key": "{k}", "limits": [{{"ep": 0, "rl": {rl}}}]}}"#))
        .collect();
    format!(
        r#"{{"version": {{"semver": "v", "released": "{released}"}}, "methods": ["GET"], "paths": ["/items/{{id}}"],
            "endpoints": [{{"p": 0, "m": 0}}], "apilimits": [{}]}}"#,
        apilimits.join(",")
    )
}

fn config(up: &Upstream, catalog_url: &str) -> Config {
    let mut c = Config::default();
    c.upstream.url = up.url();
    c.catalog.server_url = catalog_url.to_owned();
    c.catalog.server_secret = CATALOG_SECRET.into();
    c.catalog.poll_interval_ms = 3_600_000;
    c.catalog.refresh_secret = REFRESH_SECRET.into();
    c
}

/// A gateway with no start-up catalog, once it has fetched one from its catalog server.
async fn ready_gateway(c: Config) -> TestGateway {
    let gw = TestGateway::start_with(c, None, FakeClock::new(T0)).await;
    eventually(Duration::from_secs(5), || async {
        gw.gateway.catalog().is_ready()
    })
    .await;
    gw
}

async fn status_of(gw: &TestGateway, key: &str) -> u16 {
    get(&gw.url("/items/1"), &[("X-Api-Key", key)]).await.status
}

fn last_outcome(gw: &TestGateway) -> String {
    gw.gateway
        .catalog()
        .status
        .lock()
        .unwrap()
        .last_outcome
        .clone()
}

#[tokio::test]
async fn a_changed_limit_is_enforced_within_one_poll_interval_and_counters_carry_on() {
    let up = Upstream::start().await;
    let server = CatalogFixture::start(&catalog("2026-01-01T00:00:00Z", &[("k1", 2)])).await;
    let mut c = config(&up, &server.url());
    c.catalog.poll_interval_ms = 100;
    let gw = ready_gateway(c).await;
    assert_eq!(status_of(&gw, "k1").await, 200);
    assert_eq!(status_of(&gw, "k1").await, 200);
    assert_eq!(status_of(&gw, "k1").await, 429);

    server.publish(&catalog("2026-01-01T00:01:00Z", &[("k1", 5)]));
    // The schedule itself (every interval, back-off, spacing) is unit-tested in poller.rs
    // under paused time; here the deadline only catches a poller that stopped.
    eventually(Duration::from_secs(5), || async {
        gw.gateway.catalog().snapshot().limit(b"k1", 0)
            != quotagate::catalog::LimitLookup::Limits(quotagate::catalog::Applied::own(&[
                quotagate_engine::limiter::Limit::per_minute(2),
            ]))
    })
    .await;
    let r = get(&gw.url("/items/1"), &[("X-Api-Key", "k1")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("ratelimit-limit"), Some("5"));
    assert_eq!(
        r.header("ratelimit-remaining"),
        Some("2"),
        "the two earlier requests still count"
    );
    assert_eq!(
        server.count("indexed_limits"),
        1,
        "only the first fetch was whole"
    );
    assert!(
        server.count("catalog_diff") >= 1,
        "the change came as a diff"
    );
}

#[tokio::test]
async fn a_new_key_is_served_on_the_request_that_carries_the_refresh_header() {
    let up = Upstream::start().await;
    let server = CatalogFixture::start(&catalog("2026-01-01T00:00:00Z", &[("k1", 5)])).await;
    let gw = ready_gateway(config(&up, &server.url())).await;
    server.publish(&catalog("2026-01-01T00:01:00Z", &[("k1", 5), ("fresh", 3)]));
    assert_eq!(
        status_of(&gw, "fresh").await,
        403,
        "not polled yet (the interval is an hour)"
    );
    let r = get(
        &gw.url("/items/1"),
        &[("X-Api-Key", "fresh"), (REFRESH, REFRESH_SECRET)],
    )
    .await;
    assert_eq!(r.status, 200, "served on that very request");
    assert_eq!(r.header("ratelimit-limit"), Some("3"));
    assert!(
        up.last().headers.get(REFRESH).is_none(),
        "the header never reaches the upstream"
    );
}

/// A large catalog changes by diffs: one key changed and one added in a catalog of 50,000 keys
/// is applied from `/catalog_diff` (the whole catalog is fetched once, at start), every other key
/// served as before.
#[tokio::test]
async fn a_large_catalog_changes_by_diffs() {
    let up = Upstream::start().await;
    let names: Vec<String> = (0..50_000).map(|i| format!("key{i:05}")).collect();
    let mut keys: Vec<(&str, u64)> = names.iter().map(|k| (k.as_str(), 5)).collect();
    let server = CatalogFixture::start(&catalog("2026-01-01T00:00:00Z", &keys)).await;
    let gw = ready_gateway(config(&up, &server.url())).await;
    assert_eq!(gw.gateway.catalog().snapshot().key_count(), 50_000);
    keys[31_337].1 = 9;
    keys.push(("fresh", 3));
    server.publish(&catalog("2026-01-01T00:01:00Z", &keys));
    let r = get(
        &gw.url("/items/1"),
        &[("X-Api-Key", "fresh"), (REFRESH, REFRESH_SECRET)],
    )
    .await;
    assert_eq!((r.status, r.header("ratelimit-limit")), (200, Some("3")));
    for (key, limit) in [("key31337", "9"), ("key31338", "5"), ("key00000", "5")] {
        let r = get(&gw.url("/items/1"), &[("X-Api-Key", key)]).await;
        assert_eq!(r.header("ratelimit-limit"), Some(limit), "{key}");
    }
    assert_eq!(gw.gateway.catalog().snapshot().key_count(), 50_001);
    assert_eq!(
        server.count("indexed_limits"),
        1,
        "only the first fetch was whole"
    );
    assert_eq!(server.count("catalog_diff"), 1);
}

#[tokio::test]
async fn concurrent_forced_refreshes_share_one_fetch() {
    let up = Upstream::start().await;
    let server = CatalogFixture::start(&catalog("2026-01-01T00:00:00Z", &[("k1", 1000)])).await;
    let gw = ready_gateway(config(&up, &server.url())).await;
    // One HTTP/2 connection, warmed up, so the 100 requests arrive together.
    let client = Arc::new(http2_client());
    let url = gw.url("/items/1");
    assert_eq!(
        send(&client, "GET", &url, &[("X-Api-Key", "k1")], Bytes::new())
            .await
            .status,
        200
    );
    // The burst arrives within the start-up fetch's spacing (1 s), so every trigger waits for,
    // and shares, the one fetch that ends it.
    let before = server.count("latest");
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                send(
                    &client,
                    "GET",
                    &url,
                    &[("X-Api-Key", "k1"), (REFRESH, REFRESH_SECRET)],
                    Bytes::new(),
                )
                .await
                .status
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert_eq!(
        server.count("latest") - before,
        1,
        "one fetch for 100 triggers"
    );
}

#[tokio::test]
async fn a_wrong_secret_triggers_nothing_and_the_header_never_reaches_the_upstream() {
    let up = Upstream::start().await;
    let server = CatalogFixture::start(&catalog("2026-01-01T00:00:00Z", &[("k1", 1000)])).await;
    let gw = ready_gateway(config(&up, &server.url())).await;
    let before = (server.count("latest"), server.count("indexed_limits"));
    for secret in ["wrong", "", "refresh-secre", "refresh-secrett"] {
        let r = get(
            &gw.url("/items/1"),
            &[("X-Api-Key", "k1"), (REFRESH, secret)],
        )
        .await;
        assert_eq!(r.status, 200);
        assert!(up.last().headers.get(REFRESH).is_none());
    }
    let r = get(
        &gw.url("/items/1"),
        &[
            ("X-Api-Key", "k1"),
            (REFRESH, REFRESH_SECRET),
            (REFRESH, REFRESH_SECRET),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "a repeated header is not valid either");
    assert_eq!(
        (server.count("latest"), server.count("indexed_limits")),
        before,
        "nothing reached the catalog server"
    );
    let invalid = quotagate::observe::metrics::OutcomeLabels { outcome: "invalid" };
    assert_eq!(
        gw.gateway
            .metrics()
            .catalog_refreshes
            .get_or_create(&invalid)
            .get(),
        5
    );

    // With no secret configured the feature is off, and the header is still removed.
    let mut c = config(&up, &server.url());
    c.catalog.refresh_secret = String::new();
    let off = ready_gateway(c).await;
    let before = server.count("latest");
    get(&off.url("/items/1"), &[("X-Api-Key", "k1"), (REFRESH, "")]).await;
    assert!(up.last().headers.get(REFRESH).is_none());
    assert_eq!(server.count("latest"), before);

    // Without a catalog server there is nothing to fetch: a valid header does not wait.
    let mut c = config(&up, "");
    c.catalog.server_url = String::new();
    c.catalog.refresh_wait_ms = 60_000;
    let alone = TestGateway::start(
        c,
        &catalog("2026-01-01T00:00:00Z", &[("k1", 1000)]),
        FakeClock::new(T0),
    )
    .await;
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        get(
            &alone.url("/items/1"),
            &[("X-Api-Key", "k1"), (REFRESH, REFRESH_SECRET)],
        ),
    )
    .await
    .expect("no wait for a fetch that cannot happen (refresh_wait_ms is 60 s here)");
    assert_eq!(r.status, 200);
    assert!(up.last().headers.get(REFRESH).is_none());
}

#[tokio::test]
async fn two_instances_on_one_redis_converge_within_a_second() {
    let redis = RedisServer::start();
    two_instances_converge_within_a_second((redis.url(), RedisMode::Single, ""), || {
        redis
            .cli(&["PUBSUB", "NUMSUB", "quotagate:catalog"])
            .ends_with('2')
    })
    .await;
}

/// On a cluster, a plain PUBLISH reaches the subscribers of every node.
#[tokio::test]
async fn two_instances_on_a_redis_cluster_converge_within_a_second() {
    let cluster = support::RedisCluster::start(3, 0);
    two_instances_converge_within_a_second((cluster.url(), RedisMode::Cluster, ""), || {
        let subscribers: u64 = cluster
            .nodes
            .iter()
            .filter_map(|n| cluster.cli(n.port, &["PUBSUB", "NUMSUB", "quotagate:catalog"]))
            .filter_map(|out| out.lines().nth(1)?.trim().parse::<u64>().ok())
            .sum();
        subscribers == 2
    })
    .await;
}

/// With Sentinel, each instance subscribes on the master the sentinels name.
#[tokio::test]
async fn two_instances_on_a_sentinel_managed_redis_converge_within_a_second() {
    let set = support::SentinelSet::start();
    let master = set.master.port;
    let target = (set.url(), RedisMode::Sentinel, support::SENTINEL_MASTER);
    two_instances_converge_within_a_second(target, || {
        support::topology_cli(master, &["PUBSUB", "NUMSUB", "quotagate:catalog"])
            .is_some_and(|out| out.ends_with('2'))
    })
    .await;
}

/// `redis`: the URLs, the mode and the sentinel master's name.
async fn two_instances_converge_within_a_second(
    (url, mode, master): (String, RedisMode, &str),
    both_subscribed: impl Fn() -> bool,
) {
    let up = Upstream::start().await;
    let server = CatalogFixture::start(&catalog("2026-01-01T00:00:00Z", &[("k1", 5)])).await;
    let mut c = config(&up, &server.url());
    c.store.kind = StoreKind::Redis;
    c.store.redis_url = url;
    c.store.redis_mode = mode;
    c.store.sentinel_master = master.to_owned();
    c.store.timeout_ms = 2_000;
    c.store.time_source = TimeSource::Local;
    c.catalog.refresh_min_interval_ms = 100;
    let a = TestGateway::start_with(c.clone(), None, FakeClock::new(T0)).await;
    let b = TestGateway::start_with(c, None, FakeClock::new(T0)).await;
    for gw in [&a, &b] {
        eventually(Duration::from_secs(5), || async {
            gw.gateway.catalog().is_ready()
        })
        .await;
    }
    // Both listen for announcements.
    eventually(Duration::from_secs(5), || async { both_subscribed() }).await;

    server.publish(&catalog("2026-01-01T00:01:00Z", &[("k1", 5), ("fresh", 3)]));
    let r = get(
        &a.url("/items/1"),
        &[("X-Api-Key", "fresh"), (REFRESH, REFRESH_SECRET)],
    )
    .await;
    assert_eq!(r.status, 200);
    eventually(Duration::from_secs(1), || async {
        status_of(&b, "fresh").await == 200
    })
    .await;
}

#[tokio::test]
async fn every_failure_keeps_the_last_good_catalog_serving() {
    let up = Upstream::start().await;
    let good = catalog("2026-01-01T00:00:00Z", &[("k1", 20)]);
    let faulty = FaultyCatalogServer::start(Fault::Body(good.clone())).await;
    let mut c = config(&up, &faulty.url());
    c.catalog.poll_interval_ms = 50;
    c.catalog.backoff_max_ms = 100;
    c.catalog.request_timeout_ms = 300;
    c.catalog.max_bytes = 4096;
    let gw = ready_gateway(c).await;
    let served = gw.gateway.catalog().snapshot().version.hash.clone();

    let older = catalog("2025-01-01T00:00:00Z", &[("k1", 1)]);
    let keys: Vec<(String, u64)> = (0..200).map(|i| (format!("key{i}"), 5)).collect();
    let keys: Vec<(&str, u64)> = keys.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    let large = catalog("2026-01-02T00:00:00Z", &keys);
    assert!(large.len() > 4096);
    let broken =
        r#"{"methods": ["GET"], "paths": ["/a"], "endpoints": [{"p": 1, "m": 0}]}"#.to_owned();
    // A diff from the version served, read as it arrives: each fault is the poll's.
    let diff = |fault| Fault::Diff(Box::new(fault));
    let bad_key = format!(
        r#"{{"from": "{served}", "version": {{"hash": "d"}},
            "apilimits": [{{"key": "k1", "limits": [{{"ep": 7, "rl": 1}}]}}]}}"#
    );
    let large_diff = format!(
        r#"{{"from": "{served}", "version": {{"hash": "d"}}, "removed_keys": ["{}"]}}"#,
        "x".repeat(5000)
    );
    for (fault, kind) in [
        (Fault::Status(500), "status"),
        (Fault::Status(503), "status"),
        (Fault::Hang, "timeout"),
        (Fault::Truncated, "truncated"),
        (Fault::Body("{not json".into()), "invalid"),
        (Fault::Body(broken), "invalid"),
        (Fault::Body(older), "older"),
        (Fault::Body(large), "too_large"),
        (diff(Fault::Truncated), "truncated"),
        (diff(Fault::Body("{not json".into())), "invalid"),
        (diff(Fault::Body(bad_key)), "invalid"),
        (diff(Fault::Body(large_diff)), "too_large"),
    ] {
        faulty.set(fault.clone());
        let started = Instant::now();
        while last_outcome(&gw) != kind {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{fault:?}: outcome {:?}, want {kind}",
                last_outcome(&gw)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let r = get(&gw.url("/items/1"), &[("X-Api-Key", "k1")]).await;
        assert_eq!(
            (r.status, r.header("ratelimit-limit")),
            (200, Some("20")),
            "{fault:?}"
        );
        assert_eq!(
            gw.gateway.catalog().snapshot().version.hash,
            served,
            "{fault:?}"
        );
    }
    // And once the server is good again, polling resumes and a new version applies.
    faulty.set(Fault::Body(catalog("2026-02-01T00:00:00Z", &[("k1", 9)])));
    eventually(Duration::from_secs(5), || async {
        get(&gw.url("/items/1"), &[("X-Api-Key", "k1")])
            .await
            .header("ratelimit-limit")
            == Some("9")
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_server_leaves_the_start_up_file_serving() {
    let up = Upstream::start().await;
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let mut c = config(&up, &format!("http://{dead}"));
    c.catalog.poll_interval_ms = 50;
    let gw = TestGateway::start_with(
        c,
        Some(&catalog("2026-01-01T00:00:00Z", &[("k1", 4)])),
        FakeClock::new(T0),
    )
    .await;
    eventually(Duration::from_secs(5), || async {
        last_outcome(&gw) == "unreachable"
    })
    .await;
    assert_eq!(status_of(&gw, "k1").await, 200);
}

#[tokio::test]
async fn without_a_catalog_the_gateway_answers_503_until_one_arrives() {
    let up = Upstream::start().await;
    let faulty = FaultyCatalogServer::start(Fault::Status(503)).await;
    let mut c = config(&up, &faulty.url());
    c.catalog.poll_interval_ms = 50;
    c.catalog.backoff_max_ms = 100;
    let gw = TestGateway::start_with(c, None, FakeClock::new(T0)).await;
    eventually(Duration::from_secs(5), || async {
        last_outcome(&gw) == "status"
    })
    .await;
    let r = get(&gw.url("/items/1"), &[("X-Api-Key", "k1")]).await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.json()["detail"],
        "no catalog is loaded yet; try again shortly"
    );
    assert!(up.requests().is_empty());
    faulty.set(Fault::Body(catalog("2026-01-01T00:00:00Z", &[("k1", 4)])));
    eventually(Duration::from_secs(5), || async {
        status_of(&gw, "k1").await == 200
    })
    .await;
}

#[tokio::test]
async fn a_dynlimits_server_with_only_indexed_limits_works() {
    let up = Upstream::start().await;
    let v1 = r#"{"methods": ["GET"], "paths": ["/items/{id}"], "endpoints": [{"p": 0, "m": 0}], "apilimits": [{"key": "k1", "limits": [{"ep": 0, "rl": 3}]}]}"#;
    let faulty = FaultyCatalogServer::start(Fault::DynLimits(v1.into())).await;
    let mut c = config(&up, &faulty.url());
    c.catalog.poll_interval_ms = 50;
    let gw = TestGateway::start_with(c, None, FakeClock::new(T0)).await;
    eventually(Duration::from_secs(5), || async {
        status_of(&gw, "k1").await == 200
    })
    .await;
    faulty.set(Fault::DynLimits(v1.replace("\"rl\": 3", "\"rl\": 8")));
    eventually(Duration::from_secs(5), || async {
        get(&gw.url("/items/1"), &[("X-Api-Key", "k1")])
            .await
            .header("ratelimit-limit")
            == Some("8")
    })
    .await;
}

// ---- the catalog server itself ----

async fn ask(server: &CatalogFixture, path: &str, headers: &[(&str, &str)]) -> support::Got {
    get(&format!("{}{path}", server.url()), headers).await
}

#[tokio::test]
async fn catalog_server_speaks_the_protocol() {
    let server =
        CatalogFixture::start(&catalog("2026-01-01T00:00:00Z", &[("k1", 5), ("k2", 6)])).await;
    let auth = ("X-Api-Key", CATALOG_SECRET);
    for path in ["/latest", "/indexed_limits", "/catalog_diff?from=x"] {
        assert_eq!(ask(&server, path, &[]).await.status, 401, "{path}");
        assert_eq!(
            ask(&server, path, &[("X-Api-Key", "nope")]).await.status,
            401,
            "{path}"
        );
    }
    let latest = ask(&server, "/latest", &[auth]).await;
    assert_eq!(latest.status, 200);
    let v1 = latest.json()["hash"].as_str().unwrap().to_owned();
    assert_eq!(latest.header("etag"), Some(format!("\"{v1}\"").as_str()));
    assert_eq!(latest.json()["released"], "2026-01-01T00:00:00Z");
    let tag = format!("\"{v1}\"");
    assert_eq!(
        ask(&server, "/latest", &[auth, ("If-None-Match", &tag)])
            .await
            .status,
        304
    );
    assert_eq!(
        ask(&server, "/indexed_limits", &[auth, ("If-None-Match", &tag)])
            .await
            .status,
        304
    );
    let full = ask(&server, "/indexed_limits", &[auth]).await;
    assert_eq!(full.json()["version"]["hash"], v1.as_str());

    // The hash follows the content; a diff carries only what changed.
    server.publish(&catalog("2026-01-01T00:01:00Z", &[("k1", 50), ("k3", 1)]));
    let v2 = ask(&server, "/latest", &[auth]).await.json()["hash"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(v1, v2);
    let diff = ask(&server, &format!("/catalog_diff?from={v1}"), &[auth]).await;
    assert_eq!(diff.status, 200);
    let d = diff.json();
    assert_eq!(d["from"], v1.as_str());
    assert_eq!(d["version"]["hash"], v2.as_str());
    assert_eq!(
        d["apilimits"].as_array().unwrap().len(),
        2,
        "k1 changed, k3 new"
    );
    assert_eq!(d["removed_keys"], serde_json::json!(["k2"]));
    assert_eq!(
        ask(&server, &format!("/catalog_diff?from={v2}"), &[auth])
            .await
            .status,
        304
    );
    assert_eq!(
        ask(&server, "/catalog_diff?from=unknown", &[auth])
            .await
            .status,
        404
    );

    // A changed endpoint list cannot be a diff.
    server.publish(
        &catalog("2026-01-01T00:02:00Z", &[("k1", 50)]).replace("/items/{id}", "/things/{id}"),
    );
    assert_eq!(
        ask(&server, &format!("/catalog_diff?from={v2}"), &[auth])
            .await
            .status,
        409
    );

    // An invalid edit is not served; the last good version stays.
    let good = ask(&server, "/latest", &[auth]).await.json()["hash"].clone();
    server.publish("{broken");
    assert_eq!(ask(&server, "/latest", &[auth]).await.json()["hash"], good);
}

#[tokio::test]
async fn a_forced_fetch_waits_for_the_spacing_and_then_runs() {
    let up = Upstream::start().await;
    let server = CatalogFixture::start(&catalog("2026-01-01T00:00:00Z", &[("k1", 1000)])).await;
    let refresh = [("X-Api-Key", "k1"), (REFRESH, REFRESH_SECRET)];
    let outcome = |gw: &TestGateway, outcome: &'static str| {
        gw.gateway
            .metrics()
            .catalog_refreshes
            .get_or_create(&quotagate::observe::metrics::OutcomeLabels { outcome })
            .get()
    };
    // Spacing far beyond the request's wait: the fetch cannot start in time, the request goes on
    // with the current catalog, and nothing reaches the catalog server.
    let mut c = config(&up, &server.url());
    c.catalog.refresh_min_interval_ms = 3_600_000;
    c.catalog.refresh_wait_ms = 100;
    let gw = ready_gateway(c).await;
    let before = server.count("latest");
    assert_eq!(get(&gw.url("/items/1"), &refresh).await.status, 200);
    assert_eq!(outcome(&gw, "timed_out"), 1);
    assert_eq!(server.count("latest"), before);
    // No spacing: the fetch runs at once and the request sees it.
    let mut c = config(&up, &server.url());
    c.catalog.refresh_min_interval_ms = 0;
    let gw = ready_gateway(c).await;
    let before = server.count("latest");
    assert_eq!(get(&gw.url("/items/1"), &refresh).await.status, 200);
    assert_eq!(outcome(&gw, "fetched"), 1);
    assert_eq!(server.count("latest") - before, 1);
}
