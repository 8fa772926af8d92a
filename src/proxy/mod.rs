//! proxy: the request path. Read `Proxy::handle` top to bottom: the forced-refresh header, the
//! admission (pure, in [`admission`]: key, route, limit), the store's count (`Proxy::decide`),
//! then forward or answer.
//!
//! Allowed requests are forwarded with the endpoint's canonical path (see `router`), so the upstream
//! receives exactly the endpoint that was counted.

pub mod admission;
pub mod answer;
pub mod caller;
pub mod client;
pub mod explain;
pub mod fields;
pub mod headers;
pub mod in_flight;
pub mod jwt;
pub mod report;
pub mod settings;
pub mod upgrade;
pub mod upstream;
pub mod wait;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::server::{RequestBody, Written};
use bytes::Bytes;
use http::header::HOST;
use http::request::Parts;
use http::{Request, Response};
use http_body_util::{Either, Full};

use crate::catalog::live::Live;
use crate::observe::metrics::Metrics;
use crate::runtime::Runtime;
use admission::{Action, Decision, Step, Target};
use quotagate_engine::clock::Clock;
use quotagate_store::{Part, Store};
use upstream::Upstream;

pub use settings::{Policy, ProxySettings, Refresh};

/// Response body: the upstream's, streamed, or one of our own small ones.
pub type Body =
    Either<report::Tapped<upstream::pool::PooledBody<upstream::UpstreamBody>>, Full<Bytes>>;

/// What happened to one request, for metrics and the access log.
#[derive(Debug)]
struct Record<'s> {
    decision: Decision,
    /// The endpoint's name, empty when none matched: the catalog's, not a copy (an allocation
    /// and a copy a request).
    endpoint: &'s str,
    /// The API key's fingerprint (for the access log and traces only).
    key: Option<String>,
    /// Whether to take `key` (it costs a SHA-256).
    want_key: bool,
    /// How long the store's decision took, when it was asked.
    store_seconds: Option<f64>,
    /// A forwarded answer's rate-limit fields, written for the wire ([`Answered`]).
    written: Written,
}

impl Default for Record<'_> {
    fn default() -> Self {
        Record {
            decision: Decision::BadRequest,
            endpoint: "",
            key: None,
            want_key: false,
            store_seconds: None,
            written: Written::default(),
        }
    }
}

/// A request's answer: the response, and the rate-limit fields of a forwarded one, written as
/// they go on the wire (the own HTTP/1.1 server sends them as they are; the map would hash,
/// allocate and copy each: 13% of a counted request, docs/benchmarks/).
///
/// Boxed where it is made: it goes up through the forwarding and the handling to the server, and
/// each copied its ~210 bytes (callgrind, docs/benchmarks/).
pub struct Answered {
    pub resp: Box<Response<Body>>,
    pub written: Written,
}

impl crate::server::Answer for Answered {
    type Body = Body;
    fn split(self) -> (Response<Body>, Written) {
        (*self.resp, self.written)
    }
}

fn own(resp: Response<Full<Bytes>>) -> Box<Response<Body>> {
    Box::new(resp.map(Either::Right))
}

/// Everything a request needs, shared by all connections.
pub struct Proxy {
    /// The current catalog: read once per request without locking; a new catalog is swapped in
    /// whole, so a request never sees routes of one version and limits of another.
    catalog: Arc<Live>,
    refresh: Refresh,
    store: Arc<Store>,
    clock: Arc<dyn Clock>,
    upstream: Arc<Upstream>,
    policy: Policy,
    metrics: Arc<Metrics>,
    /// The API keys refused most lately (`/status` `top_limited`).
    top: crate::observe::top::TopLimited,
    /// Traces requests, when `telemetry.otlp_endpoint` is set.
    tracer: Option<Arc<crate::observe::otel::Tracer>>,
    /// Settles what `cost_from` responses report.
    settler: Arc<report::Settler>,
    /// Frees the slots of requests that end.
    freer: Arc<in_flight::Freer>,
    /// Requests waiting for room, by counter.
    lines: Arc<wait::Lines>,
    /// Set while upstream requests fail, so the failure is logged once per episode.
    upstream_failing: AtomicBool,
    /// The `jwt:` source's keys and memo, when one is listed.
    jwt: Option<Arc<jwt::source::Jwt>>,
}

impl Proxy {
    /// The request path over `catalog`, forwarding to `upstream`, counting in `rt`'s store.
    pub fn new(
        s: &ProxySettings,
        catalog: Arc<Live>,
        upstream: Arc<Upstream>,
        rt: &Runtime,
        tracer: Option<Arc<crate::observe::otel::Tracer>>,
    ) -> Proxy {
        let lines = Arc::new(wait::Lines::new(s.policy.wait_queue_max, &rt.metrics));
        Proxy {
            catalog,
            refresh: s.refresh.clone(),
            store: rt.store.clone(),
            clock: rt.clock.clone(),
            upstream,
            policy: s.policy.clone(),
            metrics: rt.metrics.clone(),
            top: Default::default(),
            tracer,
            settler: Arc::new(report::Settler {
                store: rt.store.clone(),
                clock: rt.clock.clone(),
                counts: report::Counts::new(&rt.metrics),
            }),
            freer: Arc::new(in_flight::Freer {
                store: rt.store.clone(),
                clock: rt.clock.clone(),
                lines: lines.clone(),
            }),
            lines,
            upstream_failing: AtomicBool::new(false),
            jwt: (s.policy.jwt.as_ref())
                .map(|j| Arc::new(jwt::source::Jwt::new(j, rt.clock.clone(), &rt.metrics))),
        }
    }

    /// The `jwt:` source's keys and memo, when one is listed (their fetching runs apart).
    pub fn jwt(&self) -> Option<&Arc<jwt::source::Jwt>> {
        self.jwt.as_ref()
    }

    /// What the `query:` and `jwt:` sources find in a request: a key in the query is taken out
    /// of the target here, whichever source decides (it is a credential, for neither the
    /// upstream nor anything logged after); a token is checked when the `jwt:` source decides.
    async fn take_keys(&self, parts: &mut Parts) -> Box<caller::Taken> {
        let mut taken = Box::<caller::Taken>::default();
        if let Some(name) = self.policy.key_sources.query() {
            taken.query = caller::QueryKey::take(parts, name);
        }
        // With limits off no key is read: no token is checked either.
        if self.policy.enabled {
            taken.token = self.check_token(&parts.headers, taken.query.as_ref()).await;
        }
        taken
    }

    /// The `jwt:` source's check of the token in `headers`, when that source decides (no source
    /// before it is present: `query`, what the `query:` source found).
    pub async fn check_token(
        &self,
        headers: &http::HeaderMap,
        query: Option<&caller::QueryKey>,
    ) -> Option<jwt::Checked> {
        let jwt = self.jwt.as_ref()?;
        let token = self.policy.key_sources.jwt_token(headers, query)?;
        Some(match jwt.check(token) {
            Some(checked) => checked,
            // Boxed: a fetch is rare, and its future would otherwise be in every request's.
            None => crate::server::cold::apart(|| jwt.check_fetching(token)).await,
        })
    }

    /// The admission policy (`[limits]`).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn catalog(&self) -> &Arc<Live> {
        &self.catalog
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The `n` API keys refused most over the last 15 minutes, most first.
    pub fn most_limited(&self, n: usize) -> Vec<crate::observe::top::Limited> {
        self.top.top(self.clock.now_ms(), n)
    }

    /// The upstream targets.
    pub fn upstream(&self) -> &Arc<Upstream> {
        &self.upstream
    }

    /// True while upstream requests fail (since the last one that got an answer).
    pub fn upstream_failing(&self) -> bool {
        self.upstream_failing.load(Ordering::Relaxed)
    }

    /// Where a request's API key is found.
    pub fn key_sources(&self) -> &caller::Sources {
        &self.policy.key_sources
    }

    /// The request fields this proxy hands on unread ([`headers::HANDED_ON`] but the names it
    /// is configured to read), for its listener ([`crate::server::HttpSettings::passes`]).
    pub fn passes(&self) -> crate::server::passed::Passes {
        let configured = self.policy.key_sources.names().iter();
        headers::handed_on(
            configured
                .chain([&self.refresh.header])
                .chain(&self.policy.cost_header),
        )
    }

    /// Handles one request from `peer`. Never fails: every outcome is a response.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future (rust-lang/rust#62958)"
    )]
    pub fn handle(
        self: Arc<Self>,
        peer: SocketAddr,
        req: Request<RequestBody>,
    ) -> impl std::future::Future<Output = Answered> + Send {
        // Taken apart here, not in the future: a request captured whole would keep its place in
        // the future after it was taken apart (docs/benchmarks/, "A request's future").
        let (mut parts, body) = req.into_parts();
        async move {
            let started = Instant::now();
            let access = self
                .policy
                .access_log
                .then(|| (parts.method.clone(), parts.uri.path().to_owned()));
            let traced = self.tracer.as_ref().and_then(|t| t.start(&parts.headers));
            // Taken after a forced refresh (below); declared first, so that the record may
            // borrow the endpoint's name from it.
            let catalog;
            let mut record = Record {
                want_key: self.policy.access_log,
                ..Record::default()
            };
            if let Some(t) = &traced {
                propagate(t, &mut parts);
                record.want_key = true;
            }
            let method = traced.as_ref().map(|_| parts.method.clone());
            // Inline, not a function of its own: its future would take the request by value, a
            // copy of it a request (callgrind, docs/benchmarks/).
            let resp = 'resp: {
                let record = &mut record;
                self.forced_refresh(&mut parts).await;
                let taken = match self.policy.key_sources.needs_more() {
                    true => Some(self.take_keys(&mut parts).await),
                    false => None,
                };
                let grpc = answer::is_grpc(&parts.headers);
                catalog = self.catalog.is_ready().then(|| self.catalog.snapshot());
                let admission = match admission::admit(
                    &parts,
                    taken
                        .as_deref()
                        .map(caller::Taken::given)
                        .unwrap_or_default(),
                    &self.policy,
                    catalog.as_deref(),
                    peer.ip(),
                ) {
                    Step::Done(admission) => admission,
                    Step::Count(pending) => match pending.waits {
                        None => self.decide(pending, record).await,
                        // Its key copied: `may_wait` changes the head. Apart: it may hold a
                        // request a while, and inline its future and code would be every
                        // request's.
                        Some(waits) => {
                            let key: Box<[u8]> = pending.held.key.into();
                            let pending = pending.rekeyed(&key);
                            let parts = &mut parts;
                            crate::server::cold::apart(|| {
                                self.may_wait(pending, waits, parts, record)
                            })
                            .await
                        }
                    },
                };
                record.decision = admission.decision;
                if let Some(e) = admission.endpoint {
                    record.endpoint = &e.name;
                }
                let target = match admission.into_action() {
                    Action::Reject(r) if grpc => {
                        break 'resp own(r.grpc_response(self.policy.headers));
                    }
                    Action::Reject(r) => break 'resp own(r.response(self.policy.headers)),
                    Action::Forward(target) => target,
                };
                // Boxed: it is handed down through the upstream's layers (a pool, an attempt, a
                // connection), and each would otherwise copy it (callgrind, docs/benchmarks/).
                let max = self.policy.max_body_bytes as usize;
                let body = upstream::Outgoing::new(body, max, &mut parts.headers);
                let req = Box::new(Request::from_parts(parts, body));
                self.forward(req, peer, target, record, grpc).await
            };
            let elapsed = started.elapsed();
            let decision = record.decision;
            self.metrics.count_request(
                record.endpoint,
                (decision as usize, decision.as_str()),
                elapsed.as_secs_f64(),
            );
            if let Some((method, path)) = access {
                log_access(&method, &path, resp.status().as_u16(), &record, elapsed);
            }
            if let (Some(started), Some(method), Some(tracer)) = (traced, method, &self.tracer) {
                finish_span(tracer, started, method, resp.status().as_u16(), &mut record);
            }
            Answered {
                resp,
                written: record.written,
            }
        }
    }

    /// Asks the store about a request that has limits ([`Step::Count`]) and never waits. A
    /// future of its own: what it holds across its awaits then shares room in `handle`'s future
    /// with `forward`'s, where inline it had a place of its own beside it, in every request's
    /// future (a future is as large as its largest await, plus what lives across several;
    /// docs/benchmarks/).
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future (rust-lang/rust#62958)"
    )]
    fn decide<'s>(
        &self,
        pending: admission::Pending<'s, '_>,
        record: &mut Record<'_>,
    ) -> impl std::future::Future<Output = admission::Admission<'s>> + Send {
        async move {
            let (counters, now_ms, asked) = self.asking(&pending, record);
            let (counter, limits) = (&counters.counter, &pending.limits);
            let verdict = (self.store)
                .hit_pooled(counter, limits, &counters.pools, pending.cost, now_ms)
                .await;
            self.concluded(pending, counters, verdict, now_ms, asked, record)
        }
    }

    /// Decides a request with limits that wait for room (`waits`, per limit): the store first,
    /// unless others wait on its counter here (no overtaking), then, if it was refused and may
    /// wait, in line ([`wait::Lines::decide`]). `pending` borrows nothing of `head` (its key is
    /// a copy), so that a request that waits can let go of the buffer its head was read into.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future (rust-lang/rust#62958)"
    )]
    fn may_wait<'s>(
        &self,
        pending: admission::Pending<'s, '_>,
        waits: [u16; quotagate_engine::limiter::MAX_LIMITS],
        head: &mut Parts,
        record: &mut Record<'_>,
    ) -> impl std::future::Future<Output = admission::Admission<'s>> + Send {
        async move {
            let (counters, now_ms, asked) = self.asking(&pending, record);
            let parts = Part::split(&counters.counter, &pending.limits, &counters.pools);
            let first = match self.lines.busy(&counters.counter) {
                true => None,
                false => Some(self.store.hit_parts(&parts, pending.cost, now_ms).await),
            };
            let verdict = match first {
                Some(v) if wait::wait_for(&pending.limits, &waits, &v).is_none() => v,
                first => {
                    // Held for a while: its head lets go of the buffer it was read into (8 KiB
                    // of an HTTP/1 connection's; docs/benchmarks/). HTTP/2's share theirs
                    // with the connection's other streams: nothing measurable to gain.
                    if head.version < http::Version::HTTP_2 {
                        headers::own_head(head);
                    }
                    let ask = wait::Ask {
                        store: &self.store,
                        clock: &*self.clock,
                        counter: &counters.counter,
                        parts: &parts,
                        limits: &pending.limits,
                        cost: pending.cost,
                        waits: &waits,
                    };
                    self.lines.decide(&ask, first).await
                }
            };
            drop(parts);
            self.concluded(pending, counters, verdict, now_ms, asked, record)
        }
    }

    /// What asking the store about `pending` starts with: its counters, the time (and the
    /// instant) it is asked at, and its key's fingerprint where the access log or a trace wants
    /// it.
    #[inline(always)]
    fn asking(
        &self,
        pending: &admission::Pending<'_, '_>,
        record: &mut Record<'_>,
    ) -> (admission::Counters, u64, Instant) {
        if record.want_key {
            record.key = Some(match pending.held.anonymous {
                Some(_) => "anonymous".into(),
                None => crate::observe::telemetry::fingerprint_remembered(pending.held.key),
            });
        }
        // One reading for the decision's time and for how long the store takes to give it.
        let asked = Instant::now();
        (pending.counters(), self.clock.now_ms_at(asked), asked)
    }

    /// The store's `verdict` on `pending` (asked at `now_ms`, from `asked`) made its admission,
    /// and recorded. Inline: by value, its arguments would be copied (~300 bytes, callgrind).
    #[inline(always)]
    fn concluded<'s>(
        &self,
        pending: admission::Pending<'s, '_>,
        counters: admission::Counters,
        verdict: quotagate_store::Verdict,
        now_ms: u64,
        asked: Instant,
        record: &mut Record<'_>,
    ) -> admission::Admission<'s> {
        let store_seconds = asked.elapsed().as_secs_f64();
        self.metrics.decision_seconds.observe(store_seconds);
        record.store_seconds = Some(store_seconds);
        let key = pending.held.anonymous.is_none().then_some(pending.held.key);
        let a = pending.conclude(counters, verdict, now_ms);
        if let (Decision::Limited, Some(key), Some(e)) = (a.decision, key, a.endpoint) {
            self.top.count(now_ms, key, &e.name);
        }
        if a.decision == Decision::ShadowLimited {
            tracing::debug!(
                endpoint = a.endpoint.map(|e| e.name.as_str()),
                key = record.key.as_deref(),
                "a shadow limit would have refused this request"
            );
        }
        a
    }

    /// Handles the forced-refresh header: always removed, so it never reaches the upstream; with
    /// the right secret, fetches the catalog (shared with concurrent triggers) and waits for it, so
    /// this very request sees a key provisioned a moment ago.
    async fn forced_refresh(&self, parts: &mut Parts) {
        // Looked up before `entry`, which makes room for a field it might insert: a map that
        // hyper sized to the client's fields grew for every request (callgrind).
        if headers::find(&parts.headers, &self.refresh.header).is_none() {
            return;
        }
        // Apart: rare, and inline its wait would be part of every request's future and code.
        crate::server::cold::apart(|| self.refresh_now(parts)).await
    }

    /// [`Proxy::forced_refresh`] for a request that has the header.
    async fn refresh_now(&self, parts: &mut Parts) {
        let values: Vec<http::HeaderValue> = match parts.headers.entry(&self.refresh.header) {
            http::header::Entry::Occupied(e) => e.remove_entry_mult().1.collect(),
            http::header::Entry::Vacant(_) => return,
        };
        let valid = match (&self.refresh.secret, values.as_slice()) {
            (Some(secret), [v]) => bool::from(subtle::ConstantTimeEq::ct_eq(
                v.as_bytes(),
                secret.as_slice(),
            )),
            _ => false,
        };
        let outcome = if !valid {
            tracing::debug!("refresh header without the right secret: ignored");
            "invalid"
        } else if self.catalog.refresh(self.refresh.wait).await {
            "fetched"
        } else {
            tracing::debug!(
                "forced catalog refresh did not finish in time; using the current catalog"
            );
            "timed_out"
        };
        self.metrics
            .catalog_refreshes
            .get_or_create(&crate::observe::metrics::OutcomeLabels { outcome })
            .inc();
    }

    /// Forwards the request to `target` on the upstream and relays the answer, adding the
    /// target's rate-limit fields.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future (rust-lang/rust#62958)"
    )]
    fn forward(
        &self,
        mut req: Box<Request<upstream::UpstreamBody>>,
        peer: SocketAddr,
        target: Target<'_>,
        record: &mut Record<'_>,
        grpc: bool,
    ) -> impl std::future::Future<Output = Box<Response<Body>>> + Send {
        async move {
            // Held until the request ends, however it ends (dropped with this future, with the
            // response's body, or with an upgraded connection's relay).
            let mut in_flight = match (target.holds, &target.limit) {
                (Some(holds), Some(rate)) => in_flight::InFlight::took(&self.freer, rate, *holds),
                _ => None,
            };
            let path = target.path.as_deref().unwrap_or(req.uri().path());
            let Some(uri) = self.upstream.uri(path, req.uri()) else {
                record.decision = Decision::BadRequest;
                return own(crate::server::problem::problem(
                    http::StatusCode::BAD_REQUEST,
                    None,
                    "the request target cannot be forwarded",
                    None,
                ));
            };
            // The client's Host, or its HTTP/2 authority, for `X-Forwarded-Host`. Left in the
            // map: each way to the upstream puts the target's in its place (the own exchange
            // skips the map's, hyper's HTTP/1.1 replaces it, HTTP/2 removes it), and taking it
            // out cost ~230 instructions a request (callgrind).
            // An absolute-form target's authority is the request's host, whatever its Host says
            // (RFC 9112 §3.2.2); without userinfo, which names no host.
            let host = match req.uri().authority() {
                Some(a) => {
                    let a = a.as_str();
                    let a = a.rsplit_once('@').map_or(a, |(_, host)| host);
                    http::HeaderValue::from_str(a).ok()
                }
                None => match headers::find(req.headers(), &HOST) {
                    Some(v) if v.to_str().is_ok() => Some(v.clone()),
                    _ => None,
                },
            };
            // Only a request that hyper's server read as asking to switch (HTTP/1.1 with an
            // `Upgrade`) carries an `OnUpgrade`: the own server hands every such request to
            // hyper's. Without one, its fields are not looked up (~85 instructions a request).
            let can_switch = req
                .extensions()
                .get::<hyper::upgrade::OnUpgrade>()
                .is_some();
            let upgrade = can_switch
                .then(|| upgrade::requested(&req))
                .flatten()
                .map(|protocol| {
                    (
                        req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>(),
                        protocol,
                    )
                });
            let headers = req.headers_mut();
            headers::strip_hop_by_hop(headers, self.policy.key_sources.names());
            if let Some((_, protocol)) = &upgrade {
                upgrade::restore(headers, protocol.clone());
            }
            let forwarded = headers::Forwarded::new(peer.ip(), host);
            if grpc {
                // gRPC servers ask for it; it is hop-by-hop, so it was removed above.
                headers.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
            }
            // Origin form; the upstream puts in each target's authority and HTTP version.
            *req.uri_mut() = uri;
            if let Some(m) = target.method {
                *req.method_mut() = m;
            }
            let needs = upstream::Needs {
                grpc,
                upgrade: upgrade.is_some(),
            };
            // An HTTP/1 client's answer is written by the own server (or, after an upgrade,
            // hyper's, which sets the lines in its map): the upstream's fields go there as lines.
            let lines = (req.version() < http::Version::HTTP_2).then_some(&mut record.written);
            match self.upstream.send(req, needs, forwarded, lines).await {
                Ok(mut resp) => {
                    if self.upstream_failing.load(Ordering::Relaxed) {
                        self.upstream_back();
                    }
                    self.metrics.count_upstream_response(resp.status().as_u16());
                    let switched = match upgrade {
                        Some((Some(client), _))
                            if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS =>
                        {
                            self.switch(client, &mut resp, in_flight.take())
                        }
                        _ => None,
                    };
                    let (mut head, body) = resp.into_parts();
                    // What the response reports it cost, read before the fields it may also have.
                    let tap = match (target.report, &target.limit) {
                        (Some(reserved), Some(rate)) => {
                            self.tap(*reserved, rate, &head.headers, &record.written)
                        }
                        _ => None,
                    };
                    headers::strip_hop_by_hop(&mut head.headers, &[]);
                    if let Some(rate) = &target.limit {
                        if !headers::keeps_upstream_retry_after(head.status) {
                            head.headers.remove(http::header::RETRY_AFTER);
                        }
                        let mut fields = fields::Lines::new(&mut head.headers, &mut record.written);
                        headers::set_rate_limit(&mut fields, self.policy.headers, rate);
                    }
                    if let Some(protocol) = switched {
                        upgrade::restore(&mut head.headers, protocol);
                        let empty = Either::Right(Full::new(Bytes::new()));
                        return Box::new(Response::from_parts(head, empty));
                    }
                    let body = report::Tapped::new(body, tap).holding(in_flight);
                    Box::new(Response::from_parts(head, Either::Left(body)))
                }
                Err(e) => self.failed(e, record, grpc),
            }
        }
    }

    // What follows is off the common path of `forward` and `handle`, and out of line: inline,
    // their code sat among the common path's (a request runs through ~90 KiB of code, more than
    // the instruction cache holds; docs/benchmarks/).

    /// The answer to a request the upstream did not answer (`e`).
    #[cold]
    #[inline(never)]
    fn failed(
        &self,
        e: upstream::UpstreamError,
        record: &mut Record<'_>,
        grpc: bool,
    ) -> Box<Response<Body>> {
        let (decision, rejection) = answer::upstream_failure(e);
        record.decision = decision;
        if decision == Decision::UpstreamError
            && !self.upstream_failing.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                error = rejection.detail,
                "upstream failing; answering 502/504 until it answers again"
            );
        }
        match grpc {
            true => own(rejection.grpc_response(self.policy.headers)),
            false => own(rejection.response(self.policy.headers)),
        }
    }

    /// The upstream answered while it was marked failing.
    #[cold]
    #[inline(never)]
    fn upstream_back(&self) {
        if self.upstream_failing.swap(false, Ordering::Relaxed) {
            tracing::info!("upstream answers again");
        }
    }

    /// Relays an upgraded connection (the upstream agreed to switch: `resp`) between `client` and
    /// the upstream, holding `held`; the protocol agreed on, for the client's answer.
    #[inline(never)]
    fn switch(
        &self,
        client: hyper::upgrade::OnUpgrade,
        resp: &mut upstream::UpstreamResponse,
        held: Option<in_flight::InFlight>,
    ) -> Option<http::HeaderValue> {
        let agreed = resp.headers().get(http::header::UPGRADE).cloned();
        let upstream = hyper::upgrade::on(&mut **resp);
        upgrade::relay(client, upstream, self.policy.upgrade_idle, held);
        agreed
    }

    /// What reads the cost a response reports (its fields: `map` and `lines`), for a request
    /// that reserved `reserved` of `rate`.
    #[inline(never)]
    fn tap(
        &self,
        reserved: admission::Reserved<'_>,
        rate: &quotagate_engine::limiter::Rate<'_>,
        map: &http::HeaderMap,
        lines: &Written,
    ) -> Option<report::Tap> {
        let (limits, pools) = report::counted(rate, &reserved.pools);
        let pending = report::Pending {
            settler: self.settler.clone(),
            counter: reserved.counter,
            pools,
            limits,
            reserved: rate.cost,
            reserved_at_ms: rate.at_ms,
        };
        let fields = report::Fields { map, lines };
        pending.read(reserved.from, fields, self.policy.cost_body_max_bytes)
    }
}

/// Passes the request's trace on upstream: its span is the upstream's parent.
#[inline(never)]
fn propagate(t: &crate::observe::otel::Started, parts: &mut Parts) {
    if let Ok(v) = http::HeaderValue::try_from(t.traceparent()) {
        parts
            .headers
            .insert(crate::observe::otel::TRACEPARENT.clone(), v);
    }
}

/// The access log's line for a request.
#[inline(never)]
fn log_access(
    method: &http::Method,
    path: &str,
    status: u16,
    record: &Record<'_>,
    elapsed: std::time::Duration,
) {
    tracing::info!(
        target: "quotagate::access",
        %method,
        path,
        status,
        decision = record.decision.as_str(),
        endpoint = record.endpoint,
        key = record.key.as_deref().unwrap_or(""),
        ms = elapsed.as_secs_f64() * 1000.0,
        "request"
    );
}

/// Ends a traced request's span.
#[inline(never)]
fn finish_span(
    tracer: &crate::observe::otel::Tracer,
    started: crate::observe::otel::Started,
    method: http::Method,
    status: u16,
    record: &mut Record<'_>,
) {
    tracer.finish(crate::observe::otel::Span {
        started,
        end: std::time::SystemTime::now(),
        method,
        endpoint: record.endpoint.to_owned(),
        status,
        decision: record.decision.as_str(),
        key: record.key.take(),
        store_seconds: record.store_seconds,
    });
}
