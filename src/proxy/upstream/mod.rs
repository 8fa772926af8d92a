//! upstream: the client that forwards allowed requests to one or more targets.
//!
//! Each request goes to one target ([`balance`]: round robin or the less busy of two, skipping
//! targets that are out), over a keep-alive connection from that target's pool on the current
//! worker ([`pool`]): HTTP/1.1, or HTTP/2 when ALPN agrees or the request is gRPC
//! ([`connect::Speak`]). Bodies stream both ways with backpressure, but for a request body of at
//! most [`outgoing::WHOLE_MAX`] bytes with a known length that goes through the gateway's own
//! exchange: it is read whole first ([`outgoing`]).
//! Redirects are passed back, never followed. A connection that fails before any byte of the
//! request was sent is tried on another target (`upstream.retries`); nothing else is retried. The
//! connect timeout gives 502 and the response-header timeout 504.

pub mod balance;
pub mod connect;
pub mod h1;
pub mod health;
mod outgoing;
pub mod pool;
mod raw;
pub mod settings;

use std::error::Error as StdError;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::header::HOST;
use http::{Request, Response, Uri, Version};

use http_body_util::LengthLimitError;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::config::{Balance, UpstreamProtocol};
use crate::proxy::headers::Forwarded;
use balance::{Failed, Health, Standing, Succeeded};
use connect::{ClientTls, ConnectError, Connector, Sender, Speak};
pub use outgoing::Outgoing;
use pool::{Idle, InFlight, PooledBody};
pub use settings::{TargetUrl, UpstreamSettings};

/// Request body sent upstream: the client's body, cut off at the configured size.
pub type UpstreamBody = Outgoing;

/// Why forwarding failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamError {
    /// No connection could be made to the last target tried (refused, unresolvable, TLS
    /// handshake, connect timeout): 502.
    Unreachable {
        /// The target's URL.
        target: String,
        reason: String,
    },
    /// No response headers within the response timeout: 504.
    Timeout,
    /// The client's body passed the size limit while streaming: 413.
    BodyTooLarge,
    /// The connection failed mid-exchange: 502.
    Broken,
    /// The client's request body could not be read (bad chunked framing, a body cut short): 400.
    BadRequestBody,
}

/// A response from the upstream, its body putting the connection back when read. Boxed where it
/// is made: it goes up through every layer of an attempt (a connection, an attempt, the retries,
/// the response timeout) to the forwarding, and each copied its ~190 bytes (callgrind,
/// docs/benchmarks/).
pub type UpstreamResponse = Box<Response<PooledBody<UpstreamBody>>>;

/// What a request asks of the connection it goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Needs {
    /// `content-type: application/grpc*`: HTTP/2 under `upstream.protocol = auto`.
    pub grpc: bool,
    /// `Connection: Upgrade`: HTTP/1.1 whatever the protocol setting.
    pub upgrade: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    target: String,
}

/// One target and what the gateway knows of it.
pub struct Target {
    pub url: TargetUrl,
    /// One pool per worker ([`crate::server::workers`]): a connection's task runs on the worker that
    /// opened it, so sharing one pool would send requests across threads.
    pools: Box<[Arc<Idle<UpstreamBody>>]>,
    health: Health,
    /// Set while its connections fail, so that a streak is logged once.
    failing: AtomicBool,
    in_flight: Gauge,
    requests: Counter,
    failures: Counter,
    up: Gauge,
}

impl Target {
    fn update_up(&self) {
        self.up.set(i64::from(self.health.is_in()));
    }
}

/// The targets, their pools and health, and how requests are spread over them.
pub struct Upstream {
    targets: Box<[Target]>,
    base_path: String,
    balance: Balance,
    protocol: UpstreamProtocol,
    eject_after: u32,
    eject: Duration,
    retries: u32,
    connector: Connector,
    response_timeout: Duration,
    /// Requests so far (round robin).
    turn: AtomicUsize,
    /// Zero of the milliseconds passive health counts in.
    epoch: Instant,
    health_check: Option<(String, Duration)>,
    families: TargetFamilies,
}

#[derive(Default)]
struct TargetFamilies {
    requests: Family<TargetLabels, Counter>,
    failures: Family<TargetLabels, Counter>,
    up: Family<TargetLabels, Gauge>,
    in_flight: Family<TargetLabels, Gauge>,
}

impl Upstream {
    /// `workers`: how many connection pools to keep per target (one per worker; `pool_max_idle`
    /// applies to each). Fails when a TLS file cannot be used, naming it.
    pub fn new(
        s: &UpstreamSettings,
        workers: usize,
    ) -> Result<Upstream, crate::server::tls::TlsFileError> {
        let tls = match s.any_tls() {
            true => Some(ClientTls::new(&s.tls)?),
            false => None,
        };
        let families = TargetFamilies::default();
        let targets = s
            .targets
            .iter()
            .map(|url| {
                let labels = TargetLabels {
                    target: url.url.clone(),
                };
                let t = Target {
                    url: url.clone(),
                    pools: (0..workers.max(1))
                        .map(|_| Idle::new(s.pool_max_idle, s.pool_idle_timeout))
                        .collect(),
                    health: Health::default(),
                    failing: AtomicBool::new(false),
                    in_flight: families.in_flight.get_or_create(&labels).clone(),
                    requests: families.requests.get_or_create(&labels).clone(),
                    failures: families.failures.get_or_create(&labels).clone(),
                    up: families.up.get_or_create(&labels).clone(),
                };
                t.update_up();
                t
            })
            .collect();
        Ok(Upstream {
            targets,
            base_path: s.base_path.clone(),
            balance: s.balance,
            protocol: s.protocol,
            eject_after: s.eject_after,
            eject: s.eject,
            retries: s.retries,
            connector: Connector {
                tls,
                timeout: s.connect_timeout,
                max_header_bytes: s.max_header_bytes,
            },
            response_timeout: s.response_timeout,
            turn: AtomicUsize::new(0),
            epoch: Instant::now(),
            health_check: s.health_path.clone().map(|p| (p, s.health_interval)),
            families,
        })
    }

    /// Registers the per-target metrics.
    pub fn register(&self, registry: &mut Registry) {
        let f = &self.families;
        registry.register(
            "quotagate_upstream_target_requests",
            "Requests sent to each upstream target (retries included)",
            f.requests.clone(),
        );
        registry.register(
            "quotagate_upstream_target_failures",
            "Connect failures and timeouts of each upstream target",
            f.failures.clone(),
        );
        registry.register(
            "quotagate_upstream_target_up",
            "1 while an upstream target is in the balance, 0 while it is out",
            f.up.clone(),
        );
        registry.register(
            "quotagate_upstream_target_in_flight",
            "Requests in flight to each upstream target (to the end of the response body)",
            f.in_flight.clone(),
        );
    }

    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// Each target's state, for `/status`.
    pub fn status(&self) -> serde_json::Value {
        self.targets
            .iter()
            .map(|t| {
                serde_json::json!({
                    "url": t.url.url,
                    "up": t.health.is_in(),
                    "in_flight": t.in_flight.get(),
                    "requests": t.requests.get(),
                    "failures": t.failures.get(),
                })
            })
            .collect()
    }

    /// Targets up now, and all targets.
    pub fn targets_up(&self) -> (usize, usize) {
        let up = self.targets.iter().filter(|t| t.health.is_in()).count();
        (up, self.targets.len())
    }

    /// The request target (origin form) of `path`, with the query of the client's target, on the
    /// upstream.
    pub fn uri(&self, path: &str, client: &Uri) -> Option<Uri> {
        request_target(&self.base_path, path, client)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Sends the request (its URI in origin form, from [`Upstream::uri`]) to a target and waits
    /// for the response headers. `written`: where the response's fields may go as lines, for the
    /// gateway's own HTTP/1.1 server (the own exchange puts them there; hyper's client, in the
    /// response's map).
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future (rust-lang/rust#62958)"
    )]
    pub fn send(
        &self,
        mut req: Box<Request<UpstreamBody>>,
        needs: Needs,
        forwarded: Forwarded,
        mut written: Option<&mut crate::server::Written>,
    ) -> impl std::future::Future<Output = Result<UpstreamResponse, UpstreamError>> + Send {
        async move {
            // Set in the request's map by the first attempt that goes through hyper's client;
            // the own exchange writes them after the request's fields instead.
            let mut forwarded = Some(forwarded);
            // The target being tried, read when the response timeout cuts the attempt short.
            let trying = AtomicUsize::new(usize::MAX);
            let exchange = async {
                let mut skip = None;
                let mut retries = self.retries;
                loop {
                    let i = self.pick(skip);
                    trying.store(i, Ordering::Relaxed);
                    let t = &self.targets[i];
                    let to = written.as_deref_mut();
                    match self.send_to(t, req, needs, &mut forwarded, to).await {
                        Ok(resp) => {
                            self.succeeded(t);
                            return Ok(resp);
                        }
                        Err(Attempt::NotSent(unsent, e)) => {
                            self.failed(t, &e.reason);
                            if retries == 0 || self.targets.len() == 1 {
                                return Err(UpstreamError::Unreachable {
                                    target: t.url.url.clone(),
                                    reason: e.reason,
                                });
                            }
                            retries -= 1;
                            skip = Some(i);
                            req = unsent;
                        }
                        Err(Attempt::Failed(e)) => {
                            // An answer of sorts: the target is there.
                            self.succeeded(t);
                            return Err(e);
                        }
                    }
                }
            };
            match crate::server::deadline::timeout(self.response_timeout, exchange).await {
                Ok(result) => result,
                Err(_) => {
                    if let Some(t) = self.targets.get(trying.load(Ordering::Relaxed)) {
                        self.failed(t, "no response within the response timeout");
                    }
                    Err(UpstreamError::Timeout)
                }
            }
        }
    }

    fn pick(&self, skip: Option<usize>) -> usize {
        if self.targets.len() == 1 {
            return 0;
        }
        let turn = match self.balance {
            Balance::RoundRobin => self.turn.fetch_add(1, Ordering::Relaxed),
            Balance::LeastRequests => 0,
        };
        let now = self.now_ms();
        balance::pick(&Now(self, now), self.balance, skip, turn, |below| {
            fastrand::usize(..below)
        })
    }

    fn succeeded(&self, t: &Target) {
        if t.failing.load(Ordering::Relaxed) {
            t.failing.store(false, Ordering::Relaxed);
        }
        if t.health.success() == Succeeded::Back {
            back_in(t);
        }
    }

    #[cold]
    #[inline(never)]
    fn failed(&self, t: &Target, reason: &str) {
        t.failures.inc();
        if !t.failing.swap(true, Ordering::Relaxed) {
            tracing::warn!(target = %t.url.url, reason, "upstream target failing");
        }
        if let Failed::Ejected(out) = t
            .health
            .failure(self.now_ms(), self.eject_after, self.eject)
        {
            tracing::warn!(
                target = %t.url.url,
                reason,
                out_ms = out.as_millis() as u64,
                "upstream target taken out; one trial request when the time is up"
            );
            t.update_up();
        }
    }

    /// How a request on `t` must be carried.
    fn speak(&self, t: &Target, needs: Needs) -> Speak {
        if needs.upgrade {
            return Speak::Http1;
        }
        match self.protocol {
            UpstreamProtocol::Http1 => Speak::Http1,
            UpstreamProtocol::H2 => Speak::H2,
            UpstreamProtocol::Auto if needs.grpc => Speak::H2,
            UpstreamProtocol::Auto if t.url.tls => Speak::Either,
            UpstreamProtocol::Auto => Speak::Http1,
        }
    }

    /// One attempt on one target.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future (rust-lang/rust#62958)"
    )]
    fn send_to(
        &self,
        t: &Target,
        mut req: Box<Request<UpstreamBody>>,
        needs: Needs,
        forwarded: &mut Option<Forwarded>,
        written: Option<&mut crate::server::Written>,
    ) -> impl std::future::Future<Output = Result<UpstreamResponse, Attempt>> + Send {
        async move {
            let speak = self.speak(t, needs);
            let idle = &t.pools[crate::server::workers::current() % t.pools.len()];
            t.requests.inc();
            let flight = InFlight::start(&t.in_flight);
            if speak == Speak::Http1
                && !t.url.tls
                && !needs.upgrade
                && req.method() != http::Method::CONNECT
                && req.body().fits_whole()
                // gRPC asks for trailers (`TE: trailers`, the only `TE` forwarded).
                && !needs.grpc
            {
                return self
                    .send_raw(t, idle, req, flight, forwarded.as_ref(), written)
                    .await;
            }
            let passed = req.body_mut().take_passed();
            if !passed.is_empty() {
                passed.restore(req.headers_mut());
            }
            if let Some(f) = forwarded.take() {
                f.set(req.headers_mut());
            }
            // Through hyper's client (TLS, HTTP/2, a streamed body, an upgrade, gRPC). Apart, so
            // that the own exchange's future and code stay as small as they are (every request's
            // future is moved a few times: its size is paid per request; and its code shares the
            // instruction cache with the rest of the request's).
            crate::server::cold::apart(|| self.send_any(t, idle, req, speak, flight)).await
        }
    }

    /// One attempt on one target through the gateway's own HTTP/1.1 exchange ([`raw`]): a
    /// request with no body or a small one of known length ([`Outgoing::fits_whole`]), no
    /// upgrade and no trailers asked for, to a cleartext target.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future (rust-lang/rust#62958)"
    )]
    fn send_raw(
        &self,
        t: &Target,
        idle: &Arc<Idle<UpstreamBody>>,
        mut req: Box<Request<UpstreamBody>>,
        flight: InFlight,
        forwarded: Option<&Forwarded>,
        mut written: Option<&mut crate::server::Written>,
    ) -> impl std::future::Future<Output = Result<UpstreamResponse, Attempt>> + Send {
        async move {
            // Read before a connection is taken: a slow client holds none. Whole, the request
            // can go again on a new connection, or to another target, as it is.
            if !http_body::Body::is_end_stream(req.body()) {
                if let Err(e) = req.body_mut().read_whole().await {
                    return Err(Attempt::Failed(client_body_error(&*e)));
                }
                // The length the client sent is the body's (hyper read it by that length), but
                // the head must say what is sent whatever the client said.
                let len = http::HeaderValue::from(req.body().whole().len());
                if req.headers().get(http::header::CONTENT_LENGTH) != Some(&len) {
                    req.headers_mut().insert(http::header::CONTENT_LENGTH, len);
                }
            }
            // The target's Host and the origin form are written by the exchange itself, and the
            // forwarding fields after the request's own (unless an earlier attempt set them).
            let max_head = self.connector.max_header_bytes.max(8192);
            let passed_on = written.is_some();
            // As with hyper's client: a request that a reused connection could not take (the
            // upstream closed it while idle) goes once more, on a new connection.
            let mut fresh = false;
            loop {
                let mut conn = match idle.take_raw().filter(|_| !fresh) {
                    Some(c) => c,
                    None => {
                        fresh = true;
                        match crate::server::cold::apart(|| self.connector.connect_raw(&t.url))
                            .await
                        {
                            Ok(c) => c,
                            Err(e) => return Err(Attempt::NotSent(req, e)),
                        }
                    }
                };
                match conn
                    .exchange(
                        &req,
                        req.body().whole(),
                        req.body().passed(),
                        &t.url.host,
                        &Fields(forwarded),
                        max_head,
                        written.as_deref_mut(),
                    )
                    .await
                {
                    Ok(head) => {
                        let body = raw::RawBody::new(&head, conn, max_head);
                        let body = PooledBody::raw(body, idle.clone(), flight);
                        let mut resp = Box::new(http::Response::new(body));
                        *resp.status_mut() = head.status;
                        *resp.version_mut() = head.version;
                        *resp.headers_mut() = match passed_on {
                            // The request's map, emptied, carries the few fields left in a map:
                            // the own server reuses its room for the connection's next request.
                            true => {
                                let mut map = std::mem::take(req.headers_mut());
                                map.clear();
                                if map.capacity() < crate::server::http1::KEPT_ROOM {
                                    map.reserve(crate::server::http1::KEPT_ROOM);
                                }
                                if !head.headers.is_empty() {
                                    map.extend(head.headers);
                                }
                                map
                            }
                            false => head.headers,
                        };
                        return Ok(resp);
                    }
                    Err(raw::Failure::NotSent(_)) if !fresh => fresh = true,
                    Err(e) => {
                        tracing::debug!(error = %e, "upstream exchange failed");
                        return Err(Attempt::Failed(UpstreamError::Broken));
                    }
                }
            }
        }
    }

    /// One attempt on one target through hyper's client, over HTTP/1.1 or HTTP/2 as `speak` says.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future (rust-lang/rust#62958)"
    )]
    fn send_any(
        &self,
        t: &Target,
        idle: &Arc<Idle<UpstreamBody>>,
        mut req: Box<Request<UpstreamBody>>,
        speak: Speak,
        flight: InFlight,
    ) -> impl std::future::Future<Output = Result<UpstreamResponse, Attempt>> + Send {
        async move {
            let mut fresh = false;
            loop {
                let reused = match (speak, fresh) {
                    (_, true) => None,
                    (Speak::Http1, false) => idle.take().map(Sender::Http1),
                    (Speak::H2, false) => idle.take_h2().map(Sender::H2),
                    (Speak::Either, false) => idle
                        .take_h2()
                        .map(Sender::H2)
                        .or_else(|| idle.take().map(Sender::Http1)),
                };
                let sender = match reused {
                    Some(s) => s,
                    None => {
                        fresh = true;
                        match self.connector.connect(&t.url, speak).await {
                            Ok(Sender::H2(s)) => {
                                idle.put_h2(&s);
                                Sender::H2(s)
                            }
                            Ok(s) => s,
                            Err(e) => return Err(Attempt::NotSent(req, e)),
                        }
                    }
                };
                match sender {
                    Sender::Http1(mut s) => {
                        if !fresh && s.ready().await.is_err() {
                            continue;
                        }
                        for_http1(&mut req, &t.url);
                        match s.try_send_request(*req).await {
                            Ok(resp) => {
                                return Ok(Box::new(
                                    resp.map(|b| PooledBody::new(b, s, idle.clone(), flight)),
                                ));
                            }
                            Err(mut e) => match e.take_message() {
                                Some(unsent) if !fresh => {
                                    *req = unsent;
                                    fresh = true;
                                }
                                _ => return Err(Attempt::Failed(classify(&e.into_error()))),
                            },
                        }
                    }
                    Sender::H2(mut s) => {
                        if !fresh && s.ready().await.is_err() {
                            fresh = true;
                            continue;
                        }
                        for_h2(&mut req, &t.url);
                        match s.try_send_request(*req).await {
                            Ok(resp) => {
                                return Ok(Box::new(resp.map(|b| PooledBody::shared(b, flight))));
                            }
                            Err(mut e) => match e.take_message() {
                                Some(unsent) if !fresh => {
                                    *req = unsent;
                                    fresh = true;
                                }
                                _ => return Err(Attempt::Failed(classify(&e.into_error()))),
                            },
                        }
                    }
                }
            }
        }
    }

    /// Runs the active health checks (`upstream.health_path`) until dropped; returns at once
    /// when they are off.
    pub async fn check_health(self: Arc<Self>) {
        let Some((path, every)) = self.health_check.clone() else {
            return;
        };
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let checks = self.targets.iter().map(|t| async {
                let verdict = health::check(&self.connector, &t.url, &path, every).await;
                if t.health.checked(verdict.is_ok()) {
                    match &verdict {
                        Ok(()) => tracing::info!(target = %t.url.url, "upstream target passes its health check: in"),
                        Err(why) => tracing::warn!(target = %t.url.url, problem = %why, "upstream target fails its health check: out"),
                    }
                    t.update_up();
                }
            });
            futures_util::future::join_all(checks).await;
        }
    }
}

/// The targets as the balancer sees them at one moment.
struct Now<'a>(&'a Upstream, u64);

impl balance::Targets for Now<'_> {
    fn count(&self) -> usize {
        self.0.targets.len()
    }
    fn standing(&self, i: usize) -> Standing {
        self.0.targets[i].health.standing(self.1)
    }
    fn claim(&self, i: usize) -> bool {
        // A trial takes at most the connect and response timeouts, tried a second time.
        let u = self.0;
        let ttl = (u.connector.timeout + u.response_timeout) * 2;
        u.targets[i].health.claim_trial(self.1, ttl)
    }
    fn busy(&self, i: usize) -> usize {
        self.0.targets[i].in_flight.get().max(0) as usize
    }
}

/// The forwarding fields, as the own exchange writes them (`None`: already in the request's
/// map).
struct Fields<'a>(Option<&'a Forwarded>);

impl h1::After for Fields<'_> {
    fn replaces(&self, name: &http::HeaderName) -> bool {
        self.0.is_some() && Forwarded::replaces(name)
    }

    fn write(
        &self,
        headers: &http::HeaderMap,
        replaced: bool,
        line: impl FnMut(&http::HeaderName, &http::HeaderValue),
    ) {
        if let Some(f) = self.0 {
            f.each(headers, replaced, line);
        }
    }
}

/// How one attempt failed.
enum Attempt {
    /// No connection, so nothing was sent: the request comes back.
    NotSent(Box<Request<UpstreamBody>>, ConnectError),
    /// The exchange started and failed.
    Failed(UpstreamError),
}

/// A target out of the balance answered: it is back in.
#[cold]
#[inline(never)]
fn back_in(t: &Target) {
    tracing::info!(target = %t.url.url, "upstream target back in");
    t.update_up();
}

/// An HTTP/1.1 request to `t`: origin form, `t`'s `Host`.
fn for_http1<B: http_body::Body>(req: &mut Request<B>, t: &TargetUrl) {
    *req.version_mut() = Version::HTTP_11;
    if req.uri().authority().is_some() {
        let pq = req.uri().path_and_query().cloned();
        *req.uri_mut() = pq.map_or_else(|| Uri::from_static("/"), Uri::from);
    }
    req.headers_mut().insert(HOST, t.host.clone());
    // A body of unknown length (the client's was chunked) goes chunked, whatever the method:
    // hyper's client sends a GET's or HEAD's as no body at all unless told (the client's
    // `Transfer-Encoding` was removed as hop-by-hop), and the body would be lost unread.
    if !req.body().is_end_stream() && req.body().size_hint().exact().is_none() {
        req.headers_mut().insert(
            http::header::TRANSFER_ENCODING,
            http::HeaderValue::from_static("chunked"),
        );
    }
}

/// An HTTP/2 request to `t`: the scheme and authority in the URI (`:authority`), no `Host`.
fn for_h2<B>(req: &mut Request<B>, t: &TargetUrl) {
    *req.version_mut() = Version::HTTP_2;
    req.headers_mut().remove(HOST);
    let mut parts = std::mem::take(req.uri_mut()).into_parts();
    parts.scheme = Some(match t.tls {
        true => http::uri::Scheme::HTTPS,
        false => http::uri::Scheme::HTTP,
    });
    parts.authority = http::uri::Authority::try_from(t.host.as_bytes()).ok();
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    *req.uri_mut() = Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"));
}

/// What a failed exchange means for the client.
fn classify(e: &hyper::Error) -> UpstreamError {
    // The body sent upstream is the client's: a failure to read it is a user-body error of the
    // exchange, not the upstream's failure.
    if is_too_large(e) || e.is_user() {
        return client_body_error(e);
    }
    tracing::debug!(error = %e, "upstream exchange failed");
    UpstreamError::Broken
}

/// What a failure to read the client's body means for the client: 413 past the size limit,
/// 400 otherwise (cut short, bad framing).
fn client_body_error(e: &(dyn StdError + 'static)) -> UpstreamError {
    match is_too_large(e) {
        true => UpstreamError::BodyTooLarge,
        false => UpstreamError::BadRequestBody,
    }
}

/// `e` is, or comes from, the client's body passing its size limit.
fn is_too_large(e: &(dyn StdError + 'static)) -> bool {
    std::iter::once(e)
        .chain(sources(e))
        .any(|s| s.is::<LengthLimitError>())
}

/// The errors behind `e`, nearest first.
fn sources<'a>(
    e: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(e.source(), |s| (*s).source())
}

/// `base_path` and `path`, with the query of the client's target `client`: an origin-form
/// request target (`None`: not a valid one).
fn request_target(base_path: &str, path: &str, client: &Uri) -> Option<Uri> {
    // The client's own target when it is what would be built (no base path, the same path,
    // origin form): a copy of a checked one, where building it anew cost an allocation and
    // a parse of every byte (about 300 instructions a request, callgrind).
    if base_path.is_empty()
        && client.scheme().is_none()
        && client.authority().is_none()
        && client.path() == path
    {
        return Some(client.clone());
    }
    let query = client.query();
    let mut pq =
        String::with_capacity(base_path.len() + path.len() + query.map_or(0, |q| q.len() + 1));
    pq.push_str(base_path);
    pq.push_str(path);
    if let Some(q) = query {
        pq.push('?');
        pq.push_str(q);
    }
    Uri::try_from(pq).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(u: &str) -> TargetUrl {
        settings::parse_targets(u).unwrap().0.remove(0)
    }

    #[test]
    fn requests_take_each_protocols_form_for_their_target() {
        let mut req = Request::new(http_body_util::Empty::<bytes::Bytes>::new());
        *req.uri_mut() = "/v1/users/1?x=2".parse().unwrap();
        req.headers_mut()
            .insert(HOST, "client.test".parse().unwrap());
        for_h2(&mut req, &url("https://b.test"));
        assert_eq!(req.uri().to_string(), "https://b.test/v1/users/1?x=2");
        assert_eq!(req.version(), Version::HTTP_2);
        assert!(req.headers().get(HOST).is_none(), ":authority carries it");
        // A retry on another target, over HTTP/1.1 this time.
        for_http1(&mut req, &url("http://a.test:8080"));
        assert_eq!(req.uri().to_string(), "/v1/users/1?x=2");
        assert_eq!(req.version(), Version::HTTP_11);
        assert_eq!(req.headers()[HOST], "a.test:8080");
        for_h2(&mut req, &url("http://[::1]:9000"));
        assert_eq!(req.uri().to_string(), "http://[::1]:9000/v1/users/1?x=2");
        // A body of unknown length goes chunked over HTTP/1.1, a GET's too.
        assert!(req.headers().get(http::header::TRANSFER_ENCODING).is_none());
        let stream = http_body_util::StreamBody::new(futures_util::stream::empty::<
            Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>,
        >());
        let mut req = req.map(|_| stream);
        for_http1(&mut req, &url("http://a.test:8080"));
        assert_eq!(req.headers()[http::header::TRANSFER_ENCODING], "chunked");
    }

    #[test]
    fn the_request_target_is_the_clients_own_only_when_it_would_be_built_the_same() {
        let target = |base: &str, path: &str, client: &str| {
            let client: Uri = client.parse().unwrap();
            request_target(base, path, &client).map(|u| u.to_string())
        };
        let own = "/items/9?b=2&a=%2F";
        assert_eq!(target("", "/items/9", own).as_deref(), Some(own));
        assert_eq!(target("", "/a", "/a?").as_deref(), Some("/a?"));
        // The endpoint's canonical path, the upstream's base path, a client's absolute form.
        let built = target("", "/items/9", "//items//9?q=1");
        assert_eq!(built.as_deref(), Some("/items/9?q=1"));
        let based = target("/api", "/items/9", own);
        assert_eq!(based.as_deref(), Some("/api/items/9?b=2&a=%2F"));
        let absolute = target("", "/items/9", "http://client.test/items/9?x");
        assert_eq!(absolute.as_deref(), Some("/items/9?x"));
        assert_eq!(target("", "/bad path", "/x"), None);
    }
}
