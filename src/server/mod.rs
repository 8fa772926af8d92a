//! server: the HTTP server shared by the proxy, the rate-limit service and the example upstream.
//!
//! Takes an already-bound listener and a shutdown future (tests bind port 0). Speaks HTTP/1.1 and
//! HTTP/2 on the same port (told by a connection's first bytes, [`sniff`]). On shutdown it stops
//! accepting at once, lets in-flight requests finish (idle keep-alive connections are closed), and
//! gives up after the drain timeout.

mod body;
pub mod h1;
pub mod idle;
mod sniff;
mod socket;

pub use body::RequestBody;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;

use socket::Socket;

use crate::cold;
use crate::config::{ConfigError, ServerConfig, positive_ms};
use crate::workers::{self, Workers};

/// What a handler answers: its response, and header fields it wrote out already ([`Written`]).
/// A `Response` is an answer with none.
pub trait Answer: Send + 'static {
    type Body;
    fn split(self) -> (Response<Self::Body>, Written);
}

impl<B: Send + 'static> Answer for Response<B> {
    type Body = B;
    fn split(self) -> (Response<B>, Written) {
        (self, Written::default())
    }
}

/// Header fields written as they go on the wire, `name: value\r\n` each (names in lower case),
/// sent after the response's own: the gateway's own HTTP/1.1 server copies them as they are,
/// where a header map would hash, allocate and copy each (the rate-limit fields cost the
/// memory store's path 13% that way; an upstream's answer's fields, passed on this way, 4% of
/// a proxied request: docs/benchmarks.md). For hyper's servers they are set in the response's
/// map. The response's map must not hold their names.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Written {
    lines: Vec<u8>,
    /// A `Date` is among the lines (the server then writes none of its own).
    dated: bool,
}

impl Written {
    /// Adds `name: value`; a value with a byte no field may hold (a control character) is left
    /// out, as a `HeaderValue` would refuse it.
    pub fn push(&mut self, name: &http::HeaderName, value: &[u8]) {
        self.push_with(name, |v| v.extend_from_slice(value));
    }

    /// Adds `name: ` and the value `write` appends, checked as [`Written::push`] checks one.
    pub fn push_with(&mut self, name: &http::HeaderName, write: impl FnOnce(&mut Vec<u8>)) {
        let line = self.start(name);
        let value = self.lines.len();
        write(&mut self.lines);
        if !field_value(&self.lines[value..]) {
            self.lines.truncate(line);
            return;
        }
        self.lines.extend_from_slice(b"\r\n");
    }

    /// Adds a line that starts `start` (a field's name and `: `, as `"ratelimit: "`: best a
    /// constant, copied as one inline, where a name's bytes read from a `HeaderName` were a
    /// `memcpy` call a field) with the value `write` appends, which the caller makes of bytes a
    /// field may hold, so it is not checked again (debug builds do): the rate-limit lists, made of
    /// the catalog's names (printable ASCII, checked as it loads), digits and fixed ASCII. Their
    /// check was ~200 instructions a counted request (callgrind, docs/benchmarks.md).
    #[inline(always)]
    pub fn push_valid_with(&mut self, start: &str, write: impl FnOnce(&mut Vec<u8>)) {
        self.start_named(start);
        let value = self.lines.len();
        write(&mut self.lines);
        debug_assert!(
            field_value(&self.lines[value..]),
            "{:?}",
            &self.lines[value..]
        );
        self.lines.extend_from_slice(b"\r\n");
    }

    /// Adds `name: ` and `digits`, a number in decimal, which needs no check (the rate-limit
    /// fields' numbers: [`Written::push`]'s closure and check cost ~50 instructions a field,
    /// callgrind). `start` as [`Written::push_valid_with`]'s.
    #[inline(always)]
    pub fn push_digits(&mut self, start: &str, digits: &str) {
        debug_assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{digits:?}");
        self.start_named(start);
        self.lines.extend_from_slice(digits.as_bytes());
        self.lines.extend_from_slice(b"\r\n");
    }

    /// Adds `line`, a field line of a peer's head as `httparse` read it (`name: value`, without
    /// its end of line; `date`: a `Date`), as it was written: its value holds no byte a field
    /// may not (`http1::append_lines`), nor does its name, and neither is checked again (a tab
    /// is among them, which [`Written::push`] refuses). The name keeps the peer's case.
    pub fn push_line(&mut self, line: &[u8], date: bool) {
        self.dated |= date;
        if self.lines.capacity() == 0 {
            self.lines.reserve(256);
        }
        self.lines.extend_from_slice(line);
        self.lines.extend_from_slice(b"\r\n");
    }

    /// Starts a line: its name and `: `; where it starts.
    fn start(&mut self, name: &http::HeaderName) -> usize {
        let line = self.start_line(name.as_str().as_bytes());
        self.lines.extend_from_slice(b": ");
        line
    }

    /// Starts a line with `bytes`; where it starts.
    #[inline(always)]
    fn start_line(&mut self, bytes: &[u8]) -> usize {
        if self.lines.capacity() == 0 {
            // The usual answer's fields at once (they grew the lines four times).
            self.lines.reserve(256);
        }
        let line = self.lines.len();
        self.lines.extend_from_slice(bytes);
        line
    }

    /// Starts a line with `start`, a lower-case field name and `: ` (checked in debug builds).
    #[inline(always)]
    fn start_named(&mut self, start: &str) -> usize {
        debug_assert!(
            start.strip_suffix(": ").is_some_and(
                |n| http::HeaderName::from_bytes(n.as_bytes()).is_ok_and(|h| h.as_str() == n)
            ),
            "{start:?}"
        );
        self.start_line(start.as_bytes())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.lines
    }

    /// A `Date` field is among the lines.
    pub fn dated(&self) -> bool {
        self.dated
    }

    /// Each line's name and value.
    fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.lines.split(|&b| b == b'\n').filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            Some((&line[..colon], line[colon + 1..].trim_ascii()))
        })
    }

    /// The value of the first field named `name`, in any case. A line at a time (a name holds
    /// no `:`), not [`Written::fields`]: this runs on the answers whose cost they report.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        let name = name.as_bytes();
        let mut rest = &self.lines[..];
        while !rest.is_empty() {
            let end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
            let line = &rest[..end];
            // Exactly first: most peers write names in lower case, and a compare in any case
            // goes a byte at a time.
            let written = |n: &[u8]| n == name || n.eq_ignore_ascii_case(name);
            if line.get(name.len()) == Some(&b':') && written(&line[..name.len()]) {
                return Some(line[name.len() + 1..].trim_ascii());
            }
            rest = rest.get(end + 1..).unwrap_or_default();
        }
        None
    }

    /// Sets the fields in `headers`: the first of each name replaces what it held of that
    /// name, the others are added after it (an upstream's `Set-Cookie`s, each kept).
    pub fn set_in(&self, headers: &mut http::HeaderMap) {
        let mut set: Vec<http::HeaderName> = Vec::new();
        for (name, value) in self.fields() {
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name),
                http::HeaderValue::from_bytes(value),
            ) {
                match set.contains(&n) {
                    true => {
                        headers.append(n, v);
                    }
                    false => {
                        set.push(n.clone());
                        headers.insert(n, v);
                    }
                }
            }
        }
    }
}

/// Whether `v` may be a field's value as written here: no control character, DEL included (a
/// tab too, which `HeaderValue` would take: none is written here). Eight bytes at a time: this
/// runs on every counted request's fields.
fn field_value(v: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte below 0x20, or equal to 0x7f, in `x` (exact as to whether there is one).
    let bad = |x: u64| {
        let del = x ^ (0x7f * ONES);
        ((x.wrapping_sub(0x20 * ONES) & !x) | (del.wrapping_sub(ONES) & !del)) & HIGH != 0
    };
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        if bad(u64::from_le_bytes(c.try_into().expect("8 bytes"))) {
            return false;
        }
    }
    let mut last = [b' '; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    !bad(u64::from_le_bytes(last))
}

/// Connection-level limits of an HTTP listener.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Time a new connection has to send its first request's headers (with TLS: its first byte,
    /// then the handshake), and each HTTP/1 request's headers from their first byte. Default: 10 s.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight and nothing sent. Default:
    /// 75 s.
    pub keep_alive_timeout: Duration,
    /// Largest request header section, in bytes (HTTP/1 read buffer, HTTP/2 header list). Default: 64 KiB.
    pub max_header_bytes: usize,
    /// Open connections at most; more wait in the kernel's accept queue. Default: 10000.
    pub max_connections: usize,
    /// How long in-flight requests may take to finish after shutdown begins. Default: 10 s.
    pub drain_timeout: Duration,
    /// TLS on this listener (`server.tls_*`). Default: none, cleartext.
    pub tls: Option<crate::tls::TlsSettings>,
    /// Fields the handler hands on unread: the own HTTP/1.1 server gives them to it as lines
    /// beside the body, not in the request's map ([`crate::http1::Passes`]). Default: none,
    /// every field in the map. Not a setting: the proxy sets its own ([`crate::proxy`]).
    pub passes: Option<Arc<crate::http1::Passes>>,
}

/// Where a listener's connections run and what counts them: runtime objects, handed to
/// [`serve`] beside the settings. The default serves on the caller's runtime, uncounted.
#[derive(Clone, Default)]
pub struct Executor {
    /// Serve connections on these single-threaded workers (see [`crate::workers`]); `None`: on
    /// the caller's runtime. The gateway uses `server.workers`, one per core by default.
    pub workers: Option<Arc<Workers>>,
    /// Counts open connections, when given (a metric).
    pub open_connections: Option<prometheus_client::metrics::gauge::Gauge>,
    /// Speak TLS on every connection, with these certificates ([`crate::tls::Tls`]).
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("workers", &self.workers)
            .field("open_connections", &self.open_connections)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// The defaults are `[server]`'s, written once in `config/mod.rs`.
impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings::try_from(&ServerConfig::default()).expect("the [server] defaults are valid")
    }
}

impl TryFrom<&ServerConfig> for HttpSettings {
    type Error = ConfigError;

    /// The proxy listener's limits (`[server]`).
    fn try_from(c: &ServerConfig) -> Result<Self, ConfigError> {
        if c.max_header_bytes < 8192 {
            return Err(ConfigError::option(
                "server.max_header_bytes",
                "must be at least 8192",
            ));
        }
        if c.max_connections == 0 {
            return Err(ConfigError::option(
                "server.max_connections",
                "must be at least 1",
            ));
        }
        Ok(HttpSettings {
            header_read_timeout: positive_ms(
                "server.header_read_timeout_ms",
                c.header_read_timeout_ms,
            )?,
            keep_alive_timeout: positive_ms(
                "server.keep_alive_timeout_ms",
                c.keep_alive_timeout_ms,
            )?,
            max_header_bytes: c.max_header_bytes,
            max_connections: c.max_connections,
            drain_timeout: positive_ms("server.drain_timeout_ms", c.drain_timeout_ms)?,
            tls: tls_settings(c)?,
            passes: None,
        })
    }
}

/// `server.tls_*`: comma-separated lists of equal length, or all empty.
fn tls_settings(c: &ServerConfig) -> Result<Option<crate::tls::TlsSettings>, ConfigError> {
    let list = |s: &str| -> Vec<std::path::PathBuf> {
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(Into::into)
            .collect()
    };
    let (certs, keys) = (list(&c.tls_cert_file), list(&c.tls_key_file));
    let client_ca = (!c.tls_client_ca_file.trim().is_empty())
        .then(|| std::path::PathBuf::from(c.tls_client_ca_file.trim()));
    if certs.is_empty() && keys.is_empty() {
        return match client_ca {
            None => Ok(None),
            Some(_) => Err(ConfigError::option(
                "server.tls_client_ca_file",
                "needs server.tls_cert_file and server.tls_key_file",
            )),
        };
    }
    if certs.len() != keys.len() {
        return Err(ConfigError::option(
            "server.tls_key_file",
            format!(
                "lists {} keys for {} certificate files (server.tls_cert_file); give one key per certificate, in the same order",
                keys.len(),
                certs.len()
            ),
        ));
    }
    Ok(Some(crate::tls::TlsSettings {
        pairs: certs.into_iter().zip(keys).collect(),
        client_ca,
    }))
}

/// Serves `handler` on `listener` until `shutdown` completes, then drains. Returns `false` if the
/// drain timeout passed with requests still in flight.
pub async fn serve<H, F, A, B>(
    listener: TcpListener,
    settings: HttpSettings,
    executor: Executor,
    handler: H,
    shutdown: impl Future<Output = ()>,
) -> bool
where
    H: Fn(SocketAddr, Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = A> + Send + 'static,
    A: Answer<Body = B>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let handler = Arc::new(handler);
    let http = Arc::new(Http::new(&settings));
    let (max_connections, drain_timeout) = (settings.max_connections, settings.drain_timeout);
    let workers = executor.workers.clone();
    // Each connection holds a receiver until it ends: a value sent asks them to finish their
    // requests and close, and the sender's `closed` tells when all have.
    let (drain, _) = tokio::sync::watch::channel(());
    let drain = Arc::new(drain);
    let serve_one = {
        let drain = drain.clone();
        move |tcp: std::net::TcpStream,
              peer: SocketAddr,
              permit: tokio::sync::OwnedSemaphorePermit| {
            let h = handler.clone();
            let activity = idle::Activity::new();
            let bounds = idle::Bounds {
                keep_alive: settings.keep_alive_timeout,
                header_read: settings.header_read_timeout,
            };
            let conn = Conn {
                handler: h,
                peer,
                activity,
            };
            // Subscribed now, not when the connection's task first runs: a drain that begins in
            // between still waits for this connection.
            let (http, draining, gauge) = (
                http.clone(),
                drain.subscribe(),
                executor.open_connections.clone(),
            );
            let tls = executor.tls.clone();
            let first_byte = settings.header_read_timeout;
            async move {
                if let Some(g) = &gauge {
                    g.inc();
                }
                // Boxed: a connection's state is kilobytes, and the future of the task that runs
                // it is moved several times on its way to the scheduler.
                match tls {
                    // `Timed` bounds the wait for the first head from now, so a client that
                    // connects and sends nothing is closed after `header_read_timeout`.
                    None => {
                        let tcp = Lingering::new(Socket::new(tcp), conn.activity.clone());
                        let io = idle::Timed::accepted(tcp, conn.activity.clone(), bounds);
                        cold::boxed(|| http.serve(io, conn, draining)).await;
                    }
                    Some(acceptor) => {
                        cold::boxed(|| {
                            serve_tls(tcp, acceptor, first_byte, &http, conn, draining, bounds)
                        })
                        .await;
                    }
                }
                if let Some(g) = gauge {
                    g.dec();
                }
                drop(permit);
            }
        }
    };
    // Each worker accepts its own connections, which never leave its thread.
    workers::accept(
        listener,
        workers.as_deref(),
        max_connections,
        shutdown,
        serve_one,
    )
    .await;
    // No connection is accepted any more: ask those open to finish, and wait for them.
    let _ = drain.send(());
    tokio::time::timeout(drain_timeout, drain.closed())
        .await
        .is_ok()
}

/// A TLS connection: its handshake, then its HTTP. A plain HTTP request gets an answer it can read.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its future (rust-lang/rust#62958)"
)]
fn serve_tls<H, F, A, B>(
    tcp: std::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    first_byte: Duration,
    http: &Http,
    conn: Conn<H>,
    draining: tokio::sync::watch::Receiver<()>,
    bounds: idle::Bounds,
) -> impl Future<Output = ()> + Send
where
    H: Fn(SocketAddr, Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = A> + Send + 'static,
    A: Answer<Body = B>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    async move {
        // The first bytes tell a handshake (a TLS record starts with 22) from a plain HTTP request.
        // They are read once, and read again by the handshake.
        let mut tcp = Lingering::new(Socket::new(tcp), conn.activity.clone());
        let first = match tokio::time::timeout(first_byte, sniff::read_some(&mut tcp)).await {
            Ok(Ok(first)) if !first.is_empty() => first,
            _ => return,
        };
        if first[0] != 22 {
            return plaintext_on_tls(tcp).await;
        }
        let handshake = acceptor.accept(sniff::Replay::new(first, tcp));
        if let Ok(Ok(stream)) = tokio::time::timeout(first_byte, handshake).await {
            let io = idle::Timed::new(stream, conn.activity.clone(), bounds);
            http.serve(io, conn, draining).await;
        }
    }
}

/// A connection's handler, peer and activity.
struct Conn<H> {
    handler: Arc<H>,
    peer: SocketAddr,
    activity: Arc<idle::Activity>,
}

/// hyper's service for a connection's requests: `h`'s, each counted in `busy`.
fn service<H, F, A, B>(
    h: Arc<H>,
    peer: SocketAddr,
    busy: Arc<idle::Activity>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<idle::Tracked<B>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<idle::Tracked<B>>, Infallible>> + Send,
> + Send
+ 'static
where
    H: Fn(SocketAddr, Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = A> + Send + 'static,
    A: Answer<Body = B>,
    B: Body + Send + 'static,
{
    service_fn(move |req: Request<Incoming>| {
        let request = busy.begin();
        // `map`, not `async move { fut.await }`: an async block would hold the handler's
        // future twice (captured, then awaited), and hyper keeps this future per stream and,
        // for HTTP/1, in a slot per connection.
        futures_util::FutureExt::map(h(peer, req.map(RequestBody::Hyper)), move |answer| {
            let (mut resp, written) = answer.split();
            written.set_in(resp.headers_mut());
            Ok::<_, Infallible>(request.respond(resp))
        })
    })
}

/// hyper's HTTP/1 and HTTP/2 servers, set up once for a listener.
struct Http {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    /// `server.max_header_bytes`, at least 8 KiB (hyper's read buffer's bound).
    max_head: usize,
    passes: Option<Arc<crate::http1::Passes>>,
}

impl Http {
    fn new(settings: &HttpSettings) -> Http {
        let mut h1 = http1::Builder::new();
        // The header and keep-alive timers are the connection's own (`idle`). A response's head
        // and body are copied into one buffer and sent with one `write` rather than queued for
        // `writev`: an API answer is small, and hyper's queue cost more than the copy (callgrind:
        // about 360 instructions a request); large bodies pay a copy per chunk.
        h1.timer(TokioTimer::new())
            .header_read_timeout(None)
            .writev(false)
            .max_buf_size(settings.max_header_bytes.max(8192));
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
        Http {
            h1,
            h2,
            max_head: settings.max_header_bytes.max(8192),
            passes: settings.passes.clone(),
        }
    }

    /// Serves one connection, in the HTTP its first bytes tell, until it closes; once `draining`
    /// changes, it finishes the requests it has and closes. Holds `draining` until it ends.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future (rust-lang/rust#62958)"
    )]
    fn serve<I, H, F, A, B>(
        &self,
        mut io: I,
        conn: Conn<H>,
        mut draining: tokio::sync::watch::Receiver<()>,
    ) -> impl Future<Output = ()> + Send
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        H: Fn(SocketAddr, Request<RequestBody>) -> F + Send + Sync + 'static,
        F: Future<Output = A> + Send + 'static,
        A: Answer<Body = B>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        async move {
            // One wait for the drain for the connection's life (each new one joins, then leaves,
            // a waiter list every connection shares, under its lock), looked at through
            // `DrainWait`: a request looks at it twice.
            let sent = draining.clone();
            let wait = draining.changed();
            tokio::pin!(wait);
            let drain = DrainWait {
                wait,
                sent,
                joined: false,
            };
            tokio::pin!(drain);
            // A connection that has sent nothing yet has nothing to finish when the drain begins.
            let first = tokio::select! {
                biased;
                first = sniff::first_bytes(&mut io) => first,
                _ = &mut drain => return,
            };
            let Ok(Some((version, first))) = first else {
                return;
            };
            match version {
                sniff::Version::H1 => {
                    let own = h1::Conn {
                        handler: &*conn.handler,
                        peer: conn.peer,
                        activity: &conn.activity,
                        max_head: self.max_head,
                        passes: self.passes.as_deref(),
                    };
                    conn.activity.served_by_own_loop(true);
                    let h1::End::Hyper(rest, io) = h1::serve(io, first, own, drain.as_mut()).await
                    else {
                        return;
                    };
                    conn.activity.served_by_own_loop(false);
                    // Apart, as below: inline, hyper's connection would make every connection's
                    // future larger, and its code would sit among the own server's.
                    let drain = drain.as_mut();
                    crate::cold::apart(|| async move {
                        let io = TokioIo::new(sniff::Replay::new(rest, io));
                        let svc = service(conn.handler, conn.peer, conn.activity);
                        let mut c =
                            std::pin::pin!(self.h1.serve_connection(io, svc).with_upgrades());
                        until_drained(c.as_mut(), drain, |c| c.graceful_shutdown()).await;
                    })
                    .await;
                }
                sniff::Version::H2 => {
                    let drain = drain.as_mut();
                    crate::cold::apart(|| async move {
                        let io = TokioIo::new(sniff::Replay::new(first, io));
                        let svc = service(conn.handler, conn.peer, conn.activity);
                        let mut c = std::pin::pin!(self.h2.serve_connection(io, svc));
                        until_drained(c.as_mut(), drain, |c| c.graceful_shutdown()).await;
                    })
                    .await;
                }
            }
        }
    }
}

/// A connection's wait for its server's drain (`wait`, `watch`'s `changed`). The wait joins the
/// channel's waiter list on its first poll with the task's waker, which stays the same for the
/// task's life; each later poll of it takes the list's lock, one lock every connection of every
/// worker shares, and a connection looks at the drain twice a request (callgrind: four atomic
/// operations a request on a line both workers write; docs/benchmarks.md). So after the first
/// poll the wait is polled again only once `sent`, a receiver of the same channel, has seen the
/// drain's value (a load) or the server is gone; until then it is pending, and the drain's send
/// wakes the task through the waker the wait holds.
struct DrainWait<'a, F> {
    wait: Pin<&'a mut F>,
    sent: tokio::sync::watch::Receiver<()>,
    joined: bool,
}

impl<F: Future> Future for DrainWait<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        if this.joined && matches!(this.sent.has_changed(), Ok(false)) {
            return Poll::Pending;
        }
        this.joined = true;
        this.wait.as_mut().poll(cx)
    }
}

/// Drives `conn` to its end; if `drain` comes first, asks it (`shut`) to finish what it has.
async fn until_drained<C: Future, D: Future>(
    mut conn: Pin<&mut C>,
    drain: Pin<&mut D>,
    shut: impl FnOnce(Pin<&mut C>),
) {
    tokio::select! {
        biased;
        _ = conn.as_mut() => return,
        _ = drain => shut(conn.as_mut()),
    }
    let _ = conn.await;
}

/// Answers a cleartext request sent to a TLS listener with a 400 that says so, then closes (the
/// client would otherwise see a handshake failure it cannot read).
async fn plaintext_on_tls(mut tcp: Lingering) {
    use tokio::io::AsyncWriteExt;
    const BODY: &str = "this port speaks TLS: use https://\n";
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = tcp.write_all(answer.as_bytes()).await;
    let _ = tcp.shutdown().await;
}

/// How long a closed connection keeps discarding what the client still sends. Default: 2 s.
const LINGER_TIME: Duration = Duration::from_secs(2);
/// How much a closed connection discards at most. Default: 16 MiB.
const LINGER_BYTES: usize = 16 * 1024 * 1024;

/// A client socket with nginx's lingering close: when a connection ends while the client is still
/// sending (an upload answered early with 413, say), closing at once would make the kernel reset
/// the connection, and the client would often lose the answer along with it. So the rest is read
/// and discarded, within [`LINGER_TIME`] and [`LINGER_BYTES`], before the socket is closed.
/// Unless the connection's activity says the client sends nothing more (nginx looks too, only
/// where a client may still be sending): the look is a system call each connection.
///
/// It also holds off registering a socket that has not had to wait yet ([`Socket`]) while it is
/// read only to see the client go (a request's answer is being made): for [`WATCH_AFTER`], so a
/// short connection whose answer comes sooner is never registered at all.
struct Lingering {
    tcp: Option<Socket>,
    activity: Arc<idle::Activity>,
    /// The request whose answer the watch waits on, and when the socket is registered for it.
    watch: Option<(u64, Pin<Box<tokio::time::Sleep>>)>,
}

/// How long a request's answer may take before its client's socket is registered to see the
/// client go, when it has not been registered yet; a client that goes sooner is noticed when
/// the answer is sent or this much after the request, whichever is first. Default: 20 ms.
const WATCH_AFTER: Duration = Duration::from_millis(20);

impl Lingering {
    fn new(tcp: Socket, activity: Arc<idle::Activity>) -> Lingering {
        Lingering {
            tcp: Some(tcp),
            activity,
            watch: None,
        }
    }

    fn get(self: std::pin::Pin<&mut Self>) -> std::pin::Pin<&mut Socket> {
        let tcp = self.get_mut().tcp.as_mut().expect("present until dropped");
        std::pin::Pin::new(tcp)
    }

    /// Whether a read of the unregistered socket, which only watches for the client going, is to
    /// wait ([`WATCH_AFTER`]) before it registers the socket.
    fn hold_off(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        let Some(of) = self.activity.watched() else {
            return false;
        };
        let timer = match &mut self.watch {
            Some((watched, timer)) if *watched == of => timer,
            Some((watched, timer)) => {
                *watched = of;
                timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + WATCH_AFTER);
                timer
            }
            None => {
                let timer = Box::pin(tokio::time::sleep(WATCH_AFTER));
                &mut self.watch.insert((of, timer)).1
            }
        };
        timer.as_mut().poll(cx).is_pending()
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let Some(tcp) = self.tcp.take() else { return };
        if self.activity.is_quiet() {
            return;
        }
        // Nothing unread (the usual close): close now.
        if !matches!(tcp.try_read(&mut [0u8; 1]), Ok(n) if n > 0) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let Ok(mut tcp) = tcp.into_tokio() else {
                return;
            };
            let _ = tcp.shutdown().await;
            let mut buf = vec![0u8; 16 * 1024];
            let mut left = LINGER_BYTES;
            let _ = tokio::time::timeout(LINGER_TIME, async {
                while left > 0 {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => left = left.saturating_sub(n),
                    }
                }
            })
            .await;
        });
    }
}

impl tokio::io::AsyncRead for Lingering {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let tcp = this.tcp.as_mut().expect("present until dropped");
        if tcp.is_registered() {
            return std::pin::Pin::new(tcp).poll_read(cx, buf);
        }
        this.poll_read_unregistered(cx, buf)
    }
}

impl Lingering {
    /// A read before the socket has had to wait: what has come, or a wait, which registers the
    /// socket unless the read only watches for the client going ([`Lingering::hold_off`]).
    #[inline(never)]
    fn poll_read_unregistered(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let tcp = self.tcp.as_mut().expect("present until dropped");
        if let Some(read) = tcp.read_now(buf) {
            return std::task::Poll::Ready(read);
        }
        if self.hold_off(cx) {
            return std::task::Poll::Pending;
        }
        // Registered from here: no watch needs the timer again (left armed, it would wake the
        // connection for nothing).
        self.watch = None;
        tokio::io::AsyncRead::poll_read(std::pin::Pin::new(self).get(), cx, buf)
    }
}

impl tokio::io::AsyncWrite for Lingering {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.get().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.get().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.get().poll_flush(cx)
    }

    /// Nothing to do for a quiet connection: closing sends the same FIN, a system call less (a
    /// TLS stream above has written its `close_notify` by then).
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.activity.is_quiet() {
            return std::task::Poll::Ready(Ok(()));
        }
        self.get().poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One poll of a read of `tcp`: the bytes read, when it is ready.
    fn poll_read(tcp: &mut Lingering) -> std::task::Poll<std::io::Result<usize>> {
        let mut cx = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
        let mut buf = [0u8; 64];
        let mut buf = tokio::io::ReadBuf::new(&mut buf);
        tokio::io::AsyncRead::poll_read(Pin::new(tcp), &mut cx, &mut buf)
            .map_ok(|()| buf.filled().len())
    }

    fn registered(tcp: &Lingering) -> bool {
        tcp.tcp.as_ref().is_some_and(Socket::is_registered)
    }

    #[tokio::test(start_paused = true)]
    async fn a_socket_watched_for_its_client_going_is_registered_once_the_answer_takes_long() {
        use tokio::io::AsyncReadExt;
        let (socket, client) = socket::tests::pair().await;
        let activity = idle::Activity::new();
        let mut tcp = Lingering::new(socket, activity.clone());
        let _request = activity.begin();
        activity.watch_for_departure(true);
        assert!(poll_read(&mut tcp).is_pending());
        assert!(!registered(&tcp), "held off");
        // Gone while its answer is quick to come: noticed when the answer is sent.
        drop(client);
        tokio::time::sleep(WATCH_AFTER / 2).await;
        assert!(poll_read(&mut tcp).is_pending());
        assert!(!registered(&tcp), "still held off");
        // The answer takes long: the watch registers the socket, and the client is seen gone.
        tokio::time::sleep(WATCH_AFTER / 2).await;
        let mut buf = [0u8; 64];
        assert_eq!(tcp.read(&mut buf).await.unwrap(), 0);
        assert!(registered(&tcp));
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_for_a_request_registers_at_once() {
        let (socket, _client) = socket::tests::pair().await;
        let activity = idle::Activity::new();
        let mut tcp = Lingering::new(socket, activity.clone());
        // The next request, say: nothing watched.
        assert!(poll_read(&mut tcp).is_pending());
        assert!(registered(&tcp));
    }

    #[test]
    fn a_field_value_has_no_control_character_wherever_it_is() {
        for len in 1..=17 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut v = vec![b'a'; len];
                    v[at] = b;
                    assert_eq!(
                        field_value(&v),
                        !(b < 0x20 || b == 0x7f),
                        "{b:#x} at {at} of {len}"
                    );
                }
            }
        }
        assert!(field_value(b""));
    }

    #[test]
    fn lines_read_from_a_peer_are_written_as_they_came_and_found_by_name() {
        let mut w = Written::default();
        w.push_line(b"Content-Type:application/json", false);
        w.push_line(b"set-cookie: a=1", false);
        w.push_line(b"Set-Cookie: b=2\t", false);
        assert!(!w.dated());
        w.push_line(b"date: x", true);
        assert!(w.dated());
        w.push(&http::HeaderName::from_static("ratelimit"), b"r");
        assert_eq!(
            w.as_bytes(),
            b"Content-Type:application/json\r\nset-cookie: a=1\r\nSet-Cookie: b=2\t\r\ndate: x\r\nratelimit: r\r\n"
        );
        assert_eq!(w.get("content-type"), Some(&b"application/json"[..]));
        assert_eq!(w.get("Set-Cookie"), Some(&b"a=1"[..]));
        assert_eq!(w.get("ratelimit"), Some(&b"r"[..]));
        assert_eq!(w.get("date"), Some(&b"x"[..]));
        assert_eq!((w.get("set"), w.get("content-type:")), (None, None));
        // In a map, each field of a name kept, in order.
        let mut map = http::HeaderMap::new();
        w.set_in(&mut map);
        let cookies: Vec<_> = map.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(map.len(), 5);
    }

    #[test]
    fn written_fields_are_lines_and_set_in_a_map_as_they_were() {
        let mut w = Written::default();
        w.push_digits("retry-after: ", "13");
        w.push(
            &http::HeaderName::from_static("ratelimit"),
            br#""GET /a";r=0;t=13"#,
        );
        w.push(
            &http::HeaderName::from_static("x-bad"),
            b"a\r\nx-injected: 1",
        );
        assert_eq!(
            w.as_bytes(),
            b"retry-after: 13\r\nratelimit: \"GET /a\";r=0;t=13\r\n"
        );
        let mut map = http::HeaderMap::new();
        map.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("5"),
        );
        w.set_in(&mut map);
        assert_eq!(map.len(), 2);
        assert_eq!(map["retry-after"], "13");
        assert_eq!(map["ratelimit"], r#""GET /a";r=0;t=13"#);
    }

    #[test]
    fn a_number_is_written_as_its_digits_would_be() {
        let name = http::HeaderName::from_static("ratelimit-remaining");
        for n in [0, 9, 10, 4_294_967_296, u64::MAX] {
            let (mut by_number, mut by_digits) = (Written::default(), Written::default());
            by_number.push_digits("ratelimit-remaining: ", itoa::Buffer::new().format(n));
            by_digits.push(&name, n.to_string().as_bytes());
            assert_eq!(by_number, by_digits, "{n}");
        }
    }
}
