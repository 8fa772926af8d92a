//! admission: what to do with one request, decided from its head, the catalog and the store's
//! verdict. No I/O and no clock: `Proxy::handle` does the waiting around it.
//!
//! Order of checks (each refusal is a small JSON problem, see `docs/semantics.md`):
//! 0. HTTP/1.1 without exactly one `Host`: 400;
//! 1. body larger than allowed (by `Content-Length`): 413;
//! 2. API key header missing or empty: 401; sent more than once: 400;
//! 3. path that cannot be normalised (bad escape, encoded slash): 400;
//! 4. no catalog yet: 503; no catalog endpoint: 404, or forwarded unlimited when configured;
//! 5. no limit for this key here (unknown keys included): 403, or forwarded unlimited when configured;
//!    neither creates a counter;
//! 6. the sliding window (the store's verdict): 429 with `Retry-After`, or forward.

use http::header::{CONTENT_LENGTH, HOST, HeaderValue, TRANSFER_ENCODING};
use http::request::Parts;
use http::{Method, StatusCode, Version};

use super::caller::{Found, Given, MAX_SOURCES, Two};
use super::client;
use super::jwt::Refusal;
use super::settings::Policy;
use crate::catalog::{Applied, Endpoint, KeyDigest, KeyId, LimitLookup, Snapshot};
use crate::config::Uncovered;
use quotagate_engine::limiter::{Limit, Limits, MAX_LIMITS, Rate};
use quotagate_engine::path;
use quotagate_store::{CounterKey, Verdict};

/// What happened to a request: the `decision` label of `quotagate_requests` and the access log.
/// (`as usize` indexes the metrics' per-endpoint handles: fewer than `metrics::DECISIONS`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Within its limit: forwarded and counted.
    Allowed,
    /// Forwarded and counted, but a shadow limit would have refused it.
    ShadowLimited,
    /// Over its limit: 429.
    Limited,
    /// Forwarded with limits turned off (`limits.enabled = false`).
    Unlimited,
    MissingKey,
    /// A JWT (`jwt:` source) that is not taken: 401.
    BadToken,
    BadRequest,
    TooLarge,
    /// No catalog loaded yet: 503.
    NotReady,
    /// No endpoint matched (404, or forwarded unlimited when configured).
    UnknownEndpoint,
    /// The key has no limit here (403, or forwarded unlimited when configured).
    NoLimit,
    /// The store is down and the failure policy is `open`: forwarded uncounted.
    StoreOpen,
    /// The store is down and the failure policy is `closed`: 503.
    StoreUnavailable,
    /// The upstream failed or timed out: 502 or 504.
    UpstreamError,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::ShadowLimited => "shadow_limited",
            Decision::Limited => "limited",
            Decision::Unlimited => "unlimited",
            Decision::MissingKey => "missing_key",
            Decision::BadToken => "bad_token",
            Decision::BadRequest => "bad_request",
            Decision::TooLarge => "too_large",
            Decision::NotReady => "not_ready",
            Decision::UnknownEndpoint => "unknown_endpoint",
            Decision::NoLimit => "no_limit",
            Decision::StoreOpen => "store_open",
            Decision::StoreUnavailable => "store_unavailable",
            Decision::UpstreamError => "upstream_error",
        }
    }
}

/// Where an admitted request goes upstream, and the rate-limit fields its answer gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'s> {
    /// The path to forward: the endpoint's canonical path; `None`, the client's own as it came
    /// (limits off: not copied, an allocation a request).
    pub path: Option<String>,
    /// The endpoint's canonical method, replacing the client's spelling.
    pub method: Option<Method>,
    /// For the rate-limit fields.
    pub limit: Option<Rate<'s>>,
    /// Where the response reports what the request cost, and the counters it reserved in.
    /// (Boxed: rare, and a target is moved along every forwarded request.)
    pub report: Option<Box<Reserved<'s>>>,
    /// Where its concurrency limits' slots were taken, when it has such limits (boxed: rare).
    pub holds: Option<Box<Holds>>,
}

/// The counters a request with concurrency limits took its slots in, and which store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holds {
    pub counter: CounterKey,
    pub pools: Vec<(CounterKey, usize)>,
    /// In this instance's memory (a [`Verdict::Local`]), not the shared store.
    pub in_memory: bool,
}

/// A request counted with a reservation that its response replaces (`cost_from`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved<'s> {
    pub from: &'s quotagate_engine::report::CostFrom,
    pub counter: CounterKey,
    pub pools: Vec<(CounterKey, usize)>,
}

impl Target<'_> {
    fn plain(path: Option<String>) -> Self {
        Target {
            path,
            method: None,
            limit: None,
            report: None,
            holds: None,
        }
    }
}

/// An answer quotagate gives itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection<'s> {
    pub status: StatusCode,
    pub detail: String,
    /// Set on 429: for the problem type and rate-limit fields.
    pub limit: Option<Rate<'s>>,
    /// The API key is not in the catalog (a 403 like a key without a limit here, but
    /// UNAUTHENTICATED for gRPC).
    pub unknown_key: bool,
}

impl Rejection<'_> {
    pub(super) fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Rejection {
            status,
            detail: detail.into(),
            limit: None,
            unknown_key: false,
        }
    }
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<'s> {
    Forward(Target<'s>),
    Reject(Rejection<'s>),
}

/// The admission of one request: its decision, the endpoint it matched, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission<'s> {
    pub decision: Decision,
    pub endpoint: Option<&'s Endpoint>,
    pub action: Action<'s>,
}

impl<'s> Admission<'s> {
    fn reject(decision: Decision, status: StatusCode, detail: impl Into<String>) -> Self {
        Admission {
            decision,
            endpoint: None,
            action: Action::Reject(Rejection::new(status, detail)),
        }
    }

    fn forward(decision: Decision, endpoint: Option<&'s Endpoint>, target: Target<'s>) -> Self {
        Admission {
            decision,
            endpoint,
            action: Action::Forward(target),
        }
    }

    /// What to do, the admission given up whole. Taking `action` out of it as a field would
    /// leave the admission's place in an async caller's future for as long as the request is
    /// forwarded (its 200-odd bytes beside the forward's).
    pub fn into_action(self) -> Action<'s> {
        self.action
    }
}

/// The first half of the decision: either done, or waiting for the store to count.
#[derive(Debug)]
// Unboxed on purpose: boxing the admission (its rate-limit fields are a few hundred bytes) would
// cost an allocation on every request, and a step is moved once.
#[allow(clippy::large_enum_variant)]
pub enum Step<'s, 'r> {
    Done(Admission<'s>),
    Count(Pending<'s, 'r>),
}

/// The counters a request is counted in ([`Pending::counters`]).
#[derive(Debug)]
pub struct Counters {
    pub counter: CounterKey,
    /// Each pool's, with its number of limits.
    pub pools: Vec<(CounterKey, usize)>,
}

/// A request that has a limit: the store decides.
#[derive(Debug)]
pub struct Pending<'s, 'r> {
    pub held: Held<'s, 'r>,
    /// Its limits here (all shadow under `limits.shadow`).
    pub limits: Limits<'s>,
    /// Units of every limit it uses.
    pub cost: u64,
    /// How long it may wait for room, per limit of `limits` (`None`: it never waits).
    pub waits: Option<[u16; MAX_LIMITS]>,
}

impl<'s> Pending<'s, '_> {
    /// The same with its key read from `key` (a copy of it): what a request that may wait for
    /// room holds, so that its head can let go of the buffer it was read into.
    pub fn rekeyed<'k>(self, key: &'k [u8]) -> Pending<'s, 'k> {
        let Held {
            endpoint,
            key: _,
            anonymous,
            limits,
            path,
            waits,
        } = self.held;
        Pending {
            held: Held {
                endpoint,
                key,
                anonymous,
                limits,
                path,
                waits,
            },
            limits: self.limits,
            cost: self.cost,
            waits: self.waits,
        }
    }

    /// The counter this request is counted in.
    pub fn counter(&self) -> CounterKey {
        self.held.counter()
    }

    /// The counters it is counted in: its own and its pools' (escaped names, so made once: for
    /// the store, then for [`Pending::conclude`]).
    pub fn counters(&self) -> Counters {
        Counters {
            counter: self.held.counter(),
            pools: self.held.pool_counters(&self.limits),
        }
    }

    /// The second half: the store's verdict (asked at `now_ms` on `counters`) turned into the
    /// admission.
    pub fn conclude(self, counters: Counters, verdict: Verdict, now_ms: u64) -> Admission<'s> {
        let endpoint = self.held.endpoint;
        let in_memory = matches!(verdict, Verdict::Local(_));
        let outcome = match verdict {
            Verdict::Decided(o) | Verdict::Local(o) => o,
            Verdict::Open => {
                let target = Target {
                    path: self.held.path,
                    method: Some(endpoint.method.clone()),
                    limit: None,
                    report: None,
                    holds: None,
                };
                return Admission::forward(Decision::StoreOpen, Some(endpoint), target);
            }
            Verdict::Closed => {
                return Admission {
                    endpoint: Some(endpoint),
                    ..Admission::reject(
                        Decision::StoreUnavailable,
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the rate-limit store is unavailable; try again shortly",
                    )
                };
            }
        };
        let (allowed, shadow_limited) = (outcome.allowed, outcome.shadow_limited);
        let holds = (allowed && self.limits.iter().any(Limit::is_concurrent)).then(|| {
            Box::new(Holds {
                counter: counters.counter.clone(),
                pools: counters.pools.clone(),
                in_memory,
            })
        });
        let report = match endpoint.cost_from.as_ref() {
            Some(from) if allowed => Some(Box::new(Reserved {
                from,
                counter: counters.counter,
                pools: counters.pools,
            })),
            _ => None,
        };
        let rate = Rate {
            name: endpoint.name.as_str(),
            limits: self.limits,
            outcome,
            cost: self.cost,
            at_ms: now_ms,
        };
        if allowed {
            let decision = if shadow_limited {
                Decision::ShadowLimited
            } else {
                Decision::Allowed
            };
            let target = Target {
                path: self.held.path,
                method: Some(endpoint.method.clone()),
                limit: Some(rate),
                report,
                holds,
            };
            return Admission::forward(decision, Some(endpoint), target);
        }
        Admission {
            decision: Decision::Limited,
            endpoint: Some(endpoint),
            action: Action::Reject(Rejection {
                status: StatusCode::TOO_MANY_REQUESTS,
                detail: refusal_detail(&rate),
                limit: Some(rate),
                unknown_key: false,
            }),
        }
    }
}

/// The problem detail of a 429: the limit that refused, and when to retry or that it never will.
fn refusal_detail(rate: &Rate) -> String {
    let who = |i| match rate.limits.pool_of(i) {
        Some("*") => "the pool of every endpoint".to_owned(),
        Some(group) => format!("the pool {group}"),
        None => rate.name.to_owned(),
    };
    if let Some(i) = rate.outcome.refused_by_slots(&rate.limits) {
        return format!(
            "{} allows {} of this API key in flight at once, and that many are",
            who(i),
            quotagate_engine::text::plural(rate.limits[i].rl, "request", "requests"),
        );
    }
    let Some(i) = rate.outcome.most_restrictive(&rate.limits) else {
        return format!("{} refused the request", rate.name);
    };
    let (l, q) = (rate.limits[i], rate.outcome.quotas()[i]);
    let per = match l.period() {
        Some(p) => p.as_str().to_owned(),
        None => format!("{} s", l.w),
    };
    let who = who(i);
    let allows = |rl| {
        format!(
            "{who} allows {} per {per}",
            quotagate_engine::text::plural(rl, "request", "requests"),
        )
    };
    match rate.outcome.retry_after(&rate.limits) {
        _ if l.rl == 0 => format!("{who} allows no requests for this API key"),
        None if rate.cost > l.rl => format!(
            "this request costs {} units and {}, so it can never pass",
            rate.cost,
            allows(l.rl)
        ),
        None => format!("{}; this request cannot pass", allows(q.limit)),
        Some(s) => format!("{}; retry after {s} s", allows(q.limit)),
    }
}

/// The value of a check that passed; a check's early admission (`Err`) ends [`admit`] there.
macro_rules! passed {
    ($check:expr) => {
        match $check {
            Ok(v) => v,
            Err(decided) => return Step::Done(decided),
        }
    };
}

/// Decides what it can from the request head, the catalog (`None`: none loaded yet) and the
/// peer's address (for anonymous limits): the checks of the module comment, in their order. Each
/// check's `Err` is an admission decided before the store (a refusal, or a request forwarded
/// without limits).
pub fn admit<'s, 'r>(
    head: &'r Parts,
    given: Given<'r>,
    policy: &Policy,
    catalog: Option<&'s Snapshot>,
    peer: std::net::IpAddr,
) -> Step<'s, 'r> {
    let fields = Fields::of(head, policy);
    passed!(check_head(head, &fields, policy));
    // Before the key is read: with limits off, a request is not refused for how it sends one.
    if !policy.enabled {
        return Step::Done(unlimited());
    }
    let key = passed!(api_key(&fields.keys, given, policy));
    let client = || client::client_address(peer, &head.headers, &policy.trusted_proxies);
    let held = passed!(hold(
        policy,
        catalog,
        head.method.as_str(),
        head.uri.path(),
        key,
        client
    ));
    counted(fields.cost, policy, held)
}

/// The fields of a request's head that admission reads, found in one pass over them: they were
/// four hashed lookups a request (`Host`, `Content-Length`, the API key's and the cost's field;
/// a custom name is hashed byte by byte: ~90-180 instructions each, callgrind).
#[derive(Default)]
struct Fields<'r> {
    /// How many `Host` fields (counted to two), and the first.
    hosts: u8,
    host: Option<&'r HeaderValue>,
    /// A `Transfer-Encoding` came.
    coded: bool,
    content_length: Option<&'r HeaderValue>,
    /// The fields of the key's sources (`limits.api_key_from`), in their order.
    keys: [Two<'r>; MAX_SOURCES],
    /// The cost field's (`limits.cost_header`), when one is configured.
    cost: Two<'r>,
}

impl<'r> Fields<'r> {
    fn of(head: &'r Parts, policy: &Policy) -> Fields<'r> {
        let mut f = Fields::default();
        let sources = policy.key_sources.names();
        for (name, value) in &head.headers {
            if name == HOST {
                f.hosts = f.hosts.saturating_add(1).min(2);
                f.host.get_or_insert(value);
            }
            f.coded |= name == TRANSFER_ENCODING;
            if name == CONTENT_LENGTH && f.content_length.is_none() {
                f.content_length = Some(value);
            }
            if let Some(i) = sources.iter().position(|n| n == name) {
                f.keys[i].add(value);
            }
            if policy.cost_header.as_ref() == Some(name) {
                f.cost.add(value);
            }
        }
        f
    }
}

/// What a request is held to: its endpoint, its counter's owner and its limits there.
#[derive(Debug)]
pub struct Held<'s, 'r> {
    pub endpoint: &'s Endpoint,
    /// The API key, as sent (empty for an anonymous request, and for one asked about by its
    /// digest). Its counters are named by `limits.key_id()`, never by it.
    pub key: &'r [u8],
    /// An anonymous request: the client's address group.
    pub anonymous: Option<ipnet::IpNet>,
    /// Its limits here, as the catalog has them (before `limits.shadow`): its own, and its
    /// pools'.
    pub limits: Applied<'s>,
    /// The endpoint's canonical path for this request; `None`: the request's own, as it came.
    pub path: Option<String>,
    /// How long it may wait for room, per limit (`None`: none of its limits waits).
    pub waits: Option<[u16; MAX_LIMITS]>,
}

impl<'s> Held<'s, '_> {
    /// The counter this request is counted in (its pools' aside).
    pub fn counter(&self) -> CounterKey {
        match &self.anonymous {
            Some(client) => CounterKey::anonymous(client, &self.endpoint.name),
            None => CounterKey::of_id(&self.owner(), &self.endpoint.name),
        }
    }

    /// What its key's counters are named by: the identifier of the digest the catalog knows
    /// the key by, never the key.
    fn owner(&self) -> KeyId {
        // A key's limits always carry their key's identifier; zeros are never a digest's.
        self.limits.key_id().unwrap_or(KeyId([0; 16]))
    }

    /// Its limits under `limits.shadow` (`all_shadow`): borrowed from the catalog without pools.
    pub fn limits(&self, all_shadow: bool) -> Limits<'s> {
        match self.limits.has_pools() {
            false => Limits::new(self.limits.own, all_shadow),
            true => Limits::pooled(self.limits.own, self.limits.pools(), all_shadow),
        }
    }

    /// The counter of each pool of `limits` (as [`Held::limits`] made them) and its number of
    /// limits, in order.
    pub fn pool_counters(&self, limits: &Limits<'_>) -> Vec<(CounterKey, usize)> {
        limits
            .pools()
            .map(|(name, l)| (CounterKey::pool_of_id(&self.owner(), name), l.len()))
            .collect()
    }
}

/// Of `limits` (a request's own, then each pool's: `pools` tells how many each has), those `keep`
/// takes, and how many of them each pool has.
pub fn kept(
    limits: &[Limit],
    pools: &[(CounterKey, usize)],
    keep: impl Fn(usize, &Limit) -> bool,
) -> (Vec<Limit>, Vec<(CounterKey, usize)>) {
    let pooled: usize = pools.iter().map(|(_, n)| n).sum();
    let mut at = limits.len().saturating_sub(pooled);
    let kept = limits
        .iter()
        .enumerate()
        .filter(|(i, l)| keep(*i, l))
        .map(|(_, l)| *l)
        .collect();
    let pools = pools
        .iter()
        .map(|(counter, n)| {
            let end = (at + n).min(limits.len());
            let here = (at..end).filter(|i| keep(*i, &limits[*i])).count();
            at = end;
            (counter.clone(), here)
        })
        .collect();
    (kept, pools)
}

/// Steps 3 to 5: the counter and limits a request of `method` on `raw_path` is held to, by its
/// API key (`None`: anonymous, by the address `client()` gives), in `catalog` under `policy`.
/// The gateway's admission and the rate-limit service's catalog domain both ask here, and only
/// here. `Err`: the admission decided without a count (limits off, no key where anonymous limits
/// do not apply, a path out of its normal form, no catalog yet, no endpoint, no limit).
#[allow(clippy::result_large_err)]
pub fn hold<'s, 'r>(
    policy: &Policy,
    catalog: Option<&'s Snapshot>,
    method: &str,
    raw_path: &str,
    key: Option<&'r [u8]>,
    client: impl FnOnce() -> std::net::IpAddr,
) -> Result<Held<'s, 'r>, Admission<'s>> {
    let caller = key.map(Caller::Key);
    hold_as(policy, catalog, method, raw_path, caller, client)
}

/// Who a request is held to: its API key as sent, or (the admin's questions about a key it is
/// not given) the digest the catalog knows the key by.
#[derive(Debug, Clone, Copy)]
pub enum Caller<'r> {
    Key(&'r [u8]),
    Digest(KeyDigest),
}

/// [`hold`] for a `caller` (`None`: anonymous).
#[allow(clippy::result_large_err)]
pub fn hold_as<'s, 'r>(
    policy: &Policy,
    catalog: Option<&'s Snapshot>,
    method: &str,
    raw_path: &str,
    key: Option<Caller<'r>>,
    client: impl FnOnce() -> std::net::IpAddr,
) -> Result<Held<'s, 'r>, Admission<'s>> {
    if !policy.enabled {
        return Err(unlimited());
    }
    if key.is_none() && !policy.anonymous {
        return Err(missing_key(policy));
    }
    let path = path::normalize(raw_path, policy.escaped_slashes).map_err(|e| {
        Admission::reject(Decision::BadRequest, StatusCode::BAD_REQUEST, e.to_string())
    })?;
    let Some(catalog) = catalog else {
        return Err(Admission::reject(
            Decision::NotReady,
            StatusCode::SERVICE_UNAVAILABLE,
            "no catalog is loaded yet; try again shortly",
        ));
    };
    let route = match catalog.route(method, path) {
        Ok(route) => route,
        Err(path) => return Err(unknown_endpoint(method, policy, &path)),
    };
    let endpoint = &catalog.endpoints()[route.endpoint];
    let Some(key) = key else {
        // Anonymous limits depend on the endpoint: decided now that it is known.
        if endpoint.anonymous.is_empty() {
            return Err(Admission {
                endpoint: Some(endpoint),
                ..missing_key(policy)
            });
        }
        return Ok(Held {
            endpoint,
            key: b"",
            anonymous: Some(client::group(client(), policy.ipv6_prefix)),
            limits: Applied::own(&endpoint.anonymous),
            path: route.path,
            waits: None,
        });
    };
    let (lookup, key) = match key {
        Caller::Key(key) => (catalog.limit(key, route.endpoint), key),
        Caller::Digest(d) => (catalog.limit_of(&d, route.endpoint), &b""[..]),
    };
    let limits = match lookup {
        LimitLookup::Limits(l) => l,
        LimitLookup::UnknownKey => {
            let mut a = no_limit(policy, endpoint, route.path);
            if let Action::Reject(r) = &mut a.action {
                r.unknown_key = true;
            }
            return Err(a);
        }
        LimitLookup::NoLimit => return Err(no_limit(policy, endpoint, route.path)),
    };
    Ok(Held {
        endpoint,
        key,
        anonymous: None,
        waits: catalog.waits(route.endpoint, &limits),
        limits,
        path: route.path,
    })
}

/// Step 0 and 1: exactly one `Host` on HTTP/1.1, and a declared body within the limit.
// The `Err` of a check is an admission decided early: it goes straight back to `admit` (no deep
// stack to climb), where boxing it would cost an allocation per refused request.
#[allow(clippy::result_large_err)]
fn check_head<'s>(head: &Parts, fields: &Fields<'_>, policy: &Policy) -> Result<(), Admission<'s>> {
    // RFC 9112 §3.2: an HTTP/1.1 request with no Host, or more than one, is answered 400 (the
    // upstream would otherwise get a Host of our choosing, or X-Forwarded-Host the first of two).
    // HTTP/1.0 may omit it; HTTP/2 carries the authority in the request target.
    if head.version == Version::HTTP_11 && fields.hosts != 1 {
        return Err(Admission::reject(
            Decision::BadRequest,
            StatusCode::BAD_REQUEST,
            "an HTTP/1.1 request needs exactly one Host header",
        ));
    }
    // RFC 9112 §3.2: and one with an invalid Host (it would go on as `X-Forwarded-Host`).
    if fields
        .host
        .is_some_and(|h| !crate::server::framing::valid_host_remembered(h.as_bytes()))
    {
        return Err(Admission::reject(
            Decision::BadRequest,
            StatusCode::BAD_REQUEST,
            "the Host header is not a host and an optional port",
        ));
    }
    if fields.coded {
        coding_refused(head)?;
    }
    let declared = fields
        .content_length
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > policy.max_body_bytes) {
        return Err(Admission::reject(
            Decision::TooLarge,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than {} bytes",
                policy.max_body_bytes
            ),
        ));
    }
    Ok(())
}

/// A request with a `Transfer-Encoding`, framed by its codings as the own server frames those it
/// reads ([`crate::server::framing`]): one hyper's server read (after a hand-off) may list codings
/// it decoded but for `chunked` and would pass on without them (hyper refuses the rest itself).
/// Its `Content-Length`, if it had one, is gone by now (hyper's server drops it: the connection
/// then closes after the answer).
#[cold]
#[inline(never)]
#[allow(clippy::result_large_err)]
fn coding_refused<'s>(head: &Parts) -> Result<(), Admission<'s>> {
    let mut framing = crate::server::framing::RequestFraming::default();
    for value in head.headers.get_all(http::header::TRANSFER_ENCODING) {
        framing.transfer_encoding(value.as_bytes());
    }
    match framing.decide(head.version == Version::HTTP_11) {
        Ok(_) => Ok(()),
        Err(refusal) => Err(Admission::reject(
            Decision::BadRequest,
            refusal.status,
            refusal.why,
        )),
    }
}

/// Step 2: the API key, `None` when it is missing and anonymous limits may apply.
#[allow(clippy::result_large_err)]
fn api_key<'s, 'a>(
    keys: &[Two<'a>; MAX_SOURCES],
    given: Given<'a>,
    policy: &Policy,
) -> Result<Option<&'a [u8]>, Admission<'s>> {
    match policy.key_sources.find(keys, given) {
        Found::Key(key) => Ok(Some(key)),
        Found::Twice => Err(Admission::reject(
            Decision::BadRequest,
            StatusCode::BAD_REQUEST,
            format!("send your API key once, in {}", policy.key_sources.said()),
        )),
        // Never counted against anyone, never forwarded: not even as anonymous.
        // No key set yet: the gateway's failing, not the token's (as no catalog yet).
        Found::Refused(why @ Refusal::NoKeys) => Err(Admission::reject(
            Decision::NotReady,
            StatusCode::SERVICE_UNAVAILABLE,
            why.why(""),
        )),
        Found::Refused(why) => Err(Admission::reject(
            Decision::BadToken,
            StatusCode::UNAUTHORIZED,
            why.why(&policy.key_sources.jwt_claim().unwrap_or_default()),
        )),
        Found::Empty | Found::Absent if policy.anonymous => Ok(None),
        Found::Empty | Found::Absent => Err(missing_key(policy)),
    }
}

/// `limits.enabled = false`: forwarded, nothing counted.
fn unlimited<'s>() -> Admission<'s> {
    Admission::forward(Decision::Unlimited, None, Target::plain(None))
}

fn missing_key<'s>(policy: &Policy) -> Admission<'s> {
    Admission::reject(
        Decision::MissingKey,
        StatusCode::UNAUTHORIZED,
        format!("send your API key in {}", policy.key_sources.said()),
    )
}

/// Step 4: no endpoint of the catalog matches (`limits.unknown_endpoint`).
fn unknown_endpoint<'s>(method: &str, policy: &Policy, path: &path::NormalPath) -> Admission<'s> {
    match policy.unknown_endpoint {
        Uncovered::Reject => Admission::reject(
            Decision::UnknownEndpoint,
            StatusCode::NOT_FOUND,
            format!("no endpoint matches {method} {}", path.to_path()),
        ),
        Uncovered::Forward => Admission::forward(
            Decision::UnknownEndpoint,
            None,
            Target::plain(Some(path.to_path())),
        ),
    }
}

/// Step 5: the key has no limit on this endpoint (`limits.no_limit`); no counter either way.
fn no_limit<'s>(policy: &Policy, endpoint: &'s Endpoint, path: Option<String>) -> Admission<'s> {
    match policy.no_limit {
        Uncovered::Reject => Admission {
            endpoint: Some(endpoint),
            ..Admission::reject(
                Decision::NoLimit,
                StatusCode::FORBIDDEN,
                format!("this API key has no limit for {}", endpoint.name),
            )
        },
        Uncovered::Forward => Admission::forward(
            Decision::NoLimit,
            Some(endpoint),
            Target {
                path,
                method: Some(endpoint.method.clone()),
                limit: None,
                report: None,
                holds: None,
            },
        ),
    }
}

/// A request with limits: its cost, then the store decides.
/// Step 6 for a request `held` that has no head (the admin's questions about a key by its
/// digest): its endpoint's cost.
pub fn counted_headless<'s, 'r>(policy: &Policy, held: Held<'s, 'r>) -> Step<'s, 'r> {
    counted(Two(None, None), policy, held)
}

fn counted<'s, 'r>(cost: Two<'_>, policy: &Policy, held: Held<'s, 'r>) -> Step<'s, 'r> {
    let endpoint = held.endpoint;
    let cost = passed!(
        request_cost(cost, policy, endpoint).map_err(|bad| Admission {
            endpoint: Some(endpoint),
            ..Admission::reject(
                Decision::BadRequest,
                StatusCode::BAD_REQUEST,
                bad.to_string(),
            )
        })
    );
    Step::Count(Pending {
        limits: held.limits(policy.shadow),
        cost,
        // A shadow limit never refuses: under `limits.shadow` nothing waits.
        waits: held.waits.filter(|_| !policy.shadow),
        held,
    })
}

/// The cost of a request: the endpoint's, or the cost header's when one is configured and sent.
/// `Err`: why the cost header cannot be used, for the 400's detail.
fn request_cost(values: Two<'_>, policy: &Policy, endpoint: &Endpoint) -> Result<u64, BadCost> {
    let Some(name) = &policy.cost_header else {
        return Ok(endpoint.cost);
    };
    match (values.0, values.1) {
        (None, _) => Ok(endpoint.cost),
        (Some(_), Some(_)) => Err(BadCost::Repeated(name.clone())),
        (Some(v), None) => std::str::from_utf8(v.as_bytes())
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|c| (1..=crate::catalog::MAX_COST).contains(c))
            .ok_or_else(|| BadCost::NotANumber(name.clone())),
    }
}

/// A cost header that cannot be used.
#[derive(Debug, thiserror::Error)]
enum BadCost {
    #[error("send the {0} header once")]
    Repeated(http::HeaderName),
    #[error("the {0} header must be a whole number from 1 to {max}", max = crate::catalog::MAX_COST)]
    NotANumber(http::HeaderName),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, HeaderSet};
    use quotagate_engine::limiter::{Limit, Outcome, Quota};

    const PEER: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

    const CATALOG: &str = r#"{
        "version": {"semver": "v1", "hash": "h1"},
        "methods": ["GET", "POST"],
        "paths": ["/users/{id}", "/open"],
        "endpoints": [{"p": 0, "m": 0}, {"p": 1, "m": 1, "default_rl": 5}],
        "apilimits": [{"key": "k1", "limits": [{"ep": 0, "rl": 2}]}]
    }"#;

    fn policy(sets: &[(&str, &str)]) -> Policy {
        let mut c = Config::default();
        for (k, v) in sets {
            match *k {
                "enabled" => c.limits.enabled = v.parse().unwrap(),
                "unknown_endpoint" => c.limits.unknown_endpoint = serde_json::from_str(v).unwrap(),
                "no_limit" => c.limits.no_limit = serde_json::from_str(v).unwrap(),
                _ => unreachable!(),
            }
        }
        Policy::try_from(&c).unwrap()
    }

    fn head(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "gw");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn snapshot() -> Snapshot {
        Snapshot::from_json("test", CATALOG.as_bytes()).unwrap()
    }

    /// The one pass over a head's fields finds what a lookup of each name finds: `Host` counted,
    /// the first `Content-Length`, the first two values of the key's and the cost's fields,
    /// whatever the order, the repeats and the other fields around them.
    #[test]
    fn the_fields_read_in_one_pass_are_the_ones_looked_up_by_name() {
        let mut c = Config::default();
        c.limits.cost_header = "X-Cost".into();
        let policy = Policy::try_from(&c).unwrap();
        let names = [
            "host",
            "content-length",
            "x-api-key",
            "x-cost",
            "accept",
            "x-other",
        ];
        let mut rng = fastrand::Rng::with_seed(29);
        for _ in 0..5_000 {
            let mut h = http::HeaderMap::new();
            for i in 0..rng.usize(..9) {
                let value = http::HeaderValue::from_str(&i.to_string()).unwrap();
                h.append(names[rng.usize(..names.len())], value);
            }
            let mut head = http::Request::new(()).into_parts().0;
            head.headers = h;
            let f = Fields::of(&head, &policy);
            let first_two = |name: &str| {
                let mut v = head.headers.get_all(name).iter();
                (v.next(), v.next())
            };
            let hosts = head.headers.get_all("host").iter().count().min(2);
            assert_eq!(usize::from(f.hosts), hosts, "{:?}", head.headers);
            assert_eq!(f.content_length, head.headers.get("content-length"));
            assert_eq!((f.keys[0].0, f.keys[0].1), first_two("x-api-key"));
            assert_eq!((f.cost.0, f.cost.1), first_two("x-cost"));
        }
        let none = Policy::try_from(&Config::default()).unwrap();
        let head = head("GET", "/a", &[("x-cost", "3")]);
        assert_eq!(
            Fields::of(&head, &none).cost.0,
            None,
            "no cost field configured"
        );
    }

    /// The decision and status of a request that does not reach the store.
    fn done(step: Step) -> (Decision, Option<u16>) {
        match step {
            Step::Done(a) => (
                a.decision,
                match a.action {
                    Action::Reject(r) => Some(r.status.as_u16()),
                    Action::Forward(_) => None,
                },
            ),
            Step::Count(p) => panic!(
                "wanted a decision, got a count for {}",
                p.held.endpoint.name
            ),
        }
    }

    #[test]
    fn refusals_before_the_store_in_order() {
        let (p, s) = (policy(&[]), snapshot());
        let cases = [
            (
                head("GET", "/users/1", &[]),
                (Decision::MissingKey, Some(401)),
            ),
            (
                head("GET", "/users/1", &[("x-api-key", "a"), ("x-api-key", "b")]),
                (Decision::BadRequest, Some(400)),
            ),
            (
                head("GET", "/users%2F1", &[("x-api-key", "k1")]),
                (Decision::BadRequest, Some(400)),
            ),
            (
                head("GET", "/nope", &[("x-api-key", "k1")]),
                (Decision::UnknownEndpoint, Some(404)),
            ),
            (
                head("GET", "/users/1", &[("x-api-key", "stranger")]),
                (Decision::NoLimit, Some(403)),
            ),
            (
                head(
                    "GET",
                    "/users/1",
                    &[("x-api-key", "k1"), ("content-length", "99999999999")],
                ),
                (Decision::TooLarge, Some(413)),
            ),
        ];
        for (h, want) in cases {
            assert_eq!(
                done(admit(&h, Given::default(), &p, Some(&s), PEER)),
                want,
                "{} {}",
                h.method,
                h.uri
            );
        }
        let h = head("GET", "/users/1", &[("x-api-key", "k1")]);
        assert_eq!(
            done(admit(&h, Given::default(), &p, None, PEER)),
            (Decision::NotReady, Some(503))
        );
        let mut h = head("GET", "/users/1", &[("x-api-key", "k1")]);
        h.headers.remove(HOST);
        assert_eq!(
            done(admit(&h, Given::default(), &p, Some(&s), PEER)),
            (Decision::BadRequest, Some(400))
        );
    }

    #[test]
    fn uncovered_requests_can_be_forwarded_unlimited() {
        let p = policy(&[
            ("unknown_endpoint", "\"forward\""),
            ("no_limit", "\"forward\""),
        ]);
        let s = snapshot();
        let h = head("GET", "/nope/../x", &[("x-api-key", "k1")]);
        assert_eq!(
            done(admit(&h, Given::default(), &p, Some(&s), PEER)),
            (Decision::UnknownEndpoint, None)
        );
        // The endpoint's spelling where the client's differs; the client's own path (`None`,
        // not copied) where it is that spelling.
        for (raw, path) in [("/users/7", None), ("/USERS/./7", Some("/users/7"))] {
            let h = head("get", raw, &[("x-api-key", "stranger")]);
            let Step::Done(a) = admit(&h, Given::default(), &p, Some(&s), PEER) else {
                panic!()
            };
            assert_eq!(
                a.action,
                Action::Forward(Target {
                    path: path.map(str::to_owned),
                    method: Some(Method::GET),
                    limit: None,
                    report: None,
                    holds: None,
                }),
                "{raw}"
            );
        }
        let off = policy(&[("enabled", "false")]);
        let h = head("GET", "/anything", &[]);
        assert_eq!(
            done(admit(&h, Given::default(), &off, None, PEER)),
            (Decision::Unlimited, None)
        );
    }

    #[test]
    fn the_store_verdict_decides_the_rest() {
        let (p, s) = (policy(&[]), snapshot());
        let h = head("GET", "/users/1", &[("x-api-key", "k1")]);
        let pending = || match admit(&h, Given::default(), &p, Some(&s), PEER) {
            Step::Count(p) => p,
            Step::Done(a) => panic!("{a:?}"),
        };
        assert_eq!(
            (&*pending().limits, pending().held.endpoint.name.as_str()),
            (&[Limit::per_minute(2)][..], "GET /users/{id}")
        );
        let quota = Quota {
            allowed: true,
            limit: 2,
            remaining: 1,
            reset: 60,
            retry_after: None,
        };
        let outcome = |q: Quota| Outcome::new(q.allowed, false, &[q]);
        let conclude = |v: Verdict| {
            let p = pending();
            let counters = p.counters();
            p.conclude(counters, v, 0)
        };
        let a = conclude(Verdict::Decided(outcome(quota)));
        assert_eq!(a.decision, Decision::Allowed);
        assert!(
            matches!(&a.action, Action::Forward(Target { limit: Some(r), .. }) if r.outcome.quotas() == [quota])
        );
        let refused = Quota {
            allowed: false,
            remaining: 0,
            retry_after: Some(7),
            ..quota
        };
        let a = conclude(Verdict::Local(outcome(refused)));
        let Action::Reject(r) = &a.action else {
            panic!()
        };
        assert_eq!((a.decision, r.status.as_u16()), (Decision::Limited, 429));
        assert_eq!(
            r.detail,
            "GET /users/{id} allows 2 requests per 60 s; retry after 7 s"
        );
        assert_eq!(r.response(HeaderSet::Both).headers()["retry-after"], "7");
        assert_eq!(conclude(Verdict::Open).decision, Decision::StoreOpen);
        assert_eq!(
            conclude(Verdict::Closed).decision,
            Decision::StoreUnavailable
        );
        let shadowed = Outcome::new(true, true, &[quota]);
        assert_eq!(
            conclude(Verdict::Decided(shadowed)).decision,
            Decision::ShadowLimited
        );
        // A default limit applies to a known key without its own.
        let h = head("POST", "/open", &[("x-api-key", "k1")]);
        let Step::Count(p5) = admit(&h, Given::default(), &p, Some(&s), PEER) else {
            panic!()
        };
        assert_eq!(&*p5.limits, &[Limit::per_minute(5)]);
    }

    #[test]
    fn cost_comes_from_the_endpoint_or_the_configured_header() {
        let s = Snapshot::from_json(
            "t",
            br#"{"methods":["GET"],"paths":["/a"],"endpoints":[{"p":0,"m":0,"cost":3}],
                "apilimits":[{"key":"k","limits":[{"ep":0,"rl":10},{"ep":0,"rl":2,"w":1}]}]}"#,
        )
        .unwrap();
        let cost = |p: &Policy, extra: &[(&str, &str)]| {
            let mut hs = vec![("x-api-key", "k")];
            hs.extend_from_slice(extra);
            match admit(&head("GET", "/a", &hs), Given::default(), p, Some(&s), PEER) {
                Step::Count(c) => Ok((c.cost, c.limits.len())),
                Step::Done(a) => Err(done(Step::Done(a))),
            }
        };
        assert_eq!(cost(&policy(&[]), &[("x-cost", "7")]), Ok((3, 2)));
        let mut c = Config::default();
        c.limits.cost_header = "X-Cost".into();
        c.limits.shadow = true;
        let p = Policy::try_from(&c).unwrap();
        assert_eq!(cost(&p, &[("x-cost", "7")]), Ok((7, 2)));
        assert_eq!(cost(&p, &[]), Ok((3, 2)));
        for bad in ["0", "-1", "1.5", "x", "1000001"] {
            assert_eq!(
                cost(&p, &[("x-cost", bad)]),
                Err((Decision::BadRequest, Some(400))),
                "{bad}"
            );
        }
        let h = head("GET", "/a", &[("x-api-key", "k")]);
        let Step::Count(c) = admit(&h, Given::default(), &p, Some(&s), PEER) else {
            panic!()
        };
        assert!(
            c.limits.iter().all(|l| l.shadow),
            "limits.shadow makes every limit shadow"
        );
    }
}
