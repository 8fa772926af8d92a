//! pool: keep-alive connections to one target, one pool per worker: a stack of idle HTTP/1.1
//! connections and at most one shared HTTP/2 connection.
//!
//! Why not hyper-util's pooled client: it serves any number of hosts, so every request hashes its
//! pool key (scheme and authority, SipHash) three times, takes a shared lock, and spawns a task per
//! response to put the connection back once its body is read. quotagate knows its targets up front
//! and each worker ([`crate::server::workers`]) keeps its own connections, so a stack per worker and target
//! is enough; a connection goes back when its response body ends, from the body itself
//! ([`PooledBody`]).
//!
//! A request that a reused connection could not even start (the upstream closed it while idle) is
//! sent again once on a new connection, as hyper-util does; a request that was started is never
//! sent twice.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::client::conn::http2;
use prometheus_client::metrics::gauge::Gauge;

use super::raw::{BodyError as RawBodyError, RawBody, RawConn};

/// A connection that can tell, without a wait, that its peer closed it.
trait Conn {
    fn is_closed(&self) -> bool;
}

impl<B> Conn for SendRequest<B> {
    fn is_closed(&self) -> bool {
        SendRequest::is_closed(self)
    }
}

impl Conn for RawConn {
    fn is_closed(&self) -> bool {
        RawConn::is_closed(self)
    }
}

/// Idle connections of one kind, most recently used last: the likeliest to be still open.
struct Stack<C>(Mutex<Vec<(C, Instant)>>);

impl<C: Conn> Stack<C> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(C, Instant)>> {
        // Nothing here can leave the list half-changed, so a poisoned lock is used as is.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used connection that is not closed.
    fn take(&self) -> Option<C> {
        let mut idle = self.lock();
        while let Some((conn, _)) = idle.pop() {
            if !conn.is_closed() {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` if fewer than `max` are kept; whether it was.
    fn put(&self, conn: C, max: usize) -> bool {
        let mut idle = self.lock();
        if idle.len() >= max {
            return false;
        }
        // Idle times are seconds: the kernel's tick-updated clock is enough (src/coarse.rs).
        idle.push((conn, crate::server::coarse::instant()));
        true
    }

    /// Closes those closed by their peer or idle for `timeout`.
    fn reap(&self, timeout: Duration) {
        self.lock()
            .retain(|(c, since)| !c.is_closed() && since.elapsed() < timeout);
    }
}

/// Idle connections of one worker to one target.
pub struct Idle<B> {
    senders: Stack<SendRequest<B>>,
    /// The same, for the gateway's own exchange ([`super::raw`]).
    raw: Stack<RawConn>,
    /// The HTTP/2 connection requests share, once one is open.
    h2: Mutex<Option<http2::SendRequest<B>>>,
    /// Idle connections kept at most.
    max: usize,
    /// Idle connections older than this are closed.
    timeout: Duration,
    /// The task that closes idle connections has been started (on this worker's runtime).
    reaping: AtomicBool,
}

impl<B: Send + 'static> Idle<B> {
    pub fn new(max: usize, timeout: Duration) -> Arc<Idle<B>> {
        Arc::new(Idle {
            senders: Stack(Mutex::new(Vec::new())),
            raw: Stack(Mutex::new(Vec::new())),
            h2: Mutex::new(None),
            max,
            timeout,
            reaping: AtomicBool::new(false),
        })
    }

    /// The most recently used idle connection that is not closed.
    pub fn take(&self) -> Option<SendRequest<B>> {
        self.senders.take()
    }

    /// The most recently used idle connection of the gateway's own exchange that is not closed.
    pub fn take_raw(&self) -> Option<RawConn> {
        self.raw.take()
    }

    /// Keeps a connection of the gateway's own exchange whose response is finished, if there
    /// is room.
    pub fn put_raw(self: &Arc<Self>, conn: RawConn) {
        if !self.timeout.is_zero() && self.raw.put(conn, self.max) {
            self.reap();
        }
    }

    /// Starts the task that closes idle connections, once.
    fn reap(self: &Arc<Self>) {
        if !self.reaping.swap(true, Ordering::Relaxed) {
            tokio::spawn(reap(Arc::downgrade(self)));
        }
    }

    /// The shared HTTP/2 connection, if one is open.
    pub fn take_h2(&self) -> Option<http2::SendRequest<B>> {
        let mut h2 = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        match h2.as_ref() {
            Some(s) if !s.is_closed() => Some(s.clone()),
            Some(_) => {
                *h2 = None;
                None
            }
            None => None,
        }
    }

    /// Shares a new HTTP/2 connection (replacing a closed one; one opened concurrently by another
    /// request simply serves that request alone).
    pub fn put_h2(&self, sender: &http2::SendRequest<B>) {
        let mut h2 = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        if h2.as_ref().is_none_or(|s| s.is_closed()) {
            *h2 = Some(sender.clone());
        }
    }

    /// Keeps a connection whose last response is finished, if there is room.
    fn put(self: &Arc<Self>, sender: SendRequest<B>) {
        if !sender.is_closed() && !self.timeout.is_zero() && self.senders.put(sender, self.max) {
            self.reap();
        }
    }
}

/// Closes connections idle for longer than the timeout, until the pool is gone.
async fn reap<B: Send + 'static>(idle: Weak<Idle<B>>) {
    loop {
        let Some(every) = idle.upgrade().map(|i| i.timeout / 2) else {
            return;
        };
        tokio::time::sleep(every.max(Duration::from_millis(10))).await;
        let Some(idle) = idle.upgrade() else {
            return;
        };
        idle.senders.reap(idle.timeout);
        idle.raw.reap(idle.timeout);
    }
}

/// A request in flight to a target, counted in its gauge (which least-requests balancing reads)
/// until dropped: when its response body ends or is dropped.
pub struct InFlight(Gauge);

impl InFlight {
    pub fn start(gauge: &Gauge) -> InFlight {
        gauge.inc();
        InFlight(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A response body that puts its HTTP/1.1 connection back into the pool when it ends. Dropped
/// before its end, it drops the connection instead: hyper closes a connection whose response was
/// not read, and so does the gateway's own exchange. (An HTTP/2 connection stays shared whatever
/// its streams do.)
pub struct PooledBody<B: Send + 'static> {
    body: Inner<B>,
    flight: Option<InFlight>,
}

enum Inner<B: Send + 'static> {
    Hyper {
        body: Incoming,
        back: Option<(SendRequest<B>, Arc<Idle<B>>)>,
    },
    /// The gateway's own exchange ([`super::raw`]).
    Raw(RawBody, Arc<Idle<B>>),
}

/// Why a response body could not be read to its end.
#[derive(Debug)]
pub enum BodyError {
    Hyper(hyper::Error),
    Raw(RawBodyError),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Hyper(e) => e.fmt(f),
            BodyError::Raw(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BodyError::Hyper(e) => Some(e),
            BodyError::Raw(e) => Some(e),
        }
    }
}

impl<B: Send + 'static> PooledBody<B> {
    /// The body of a response on an HTTP/1.1 connection, which goes back to `idle` at its end.
    pub fn new(
        body: Incoming,
        sender: SendRequest<B>,
        idle: Arc<Idle<B>>,
        flight: InFlight,
    ) -> Self {
        let mut pooled = PooledBody {
            body: Inner::Hyper {
                body,
                back: Some((sender, idle)),
            },
            flight: Some(flight),
        };
        if pooled.is_end_stream() {
            pooled.give_back();
        }
        pooled
    }

    /// The body of a response of the gateway's own exchange, whose connection goes back to
    /// `idle` at its end.
    pub fn raw(body: RawBody, idle: Arc<Idle<B>>, flight: InFlight) -> Self {
        let mut pooled = PooledBody {
            body: Inner::Raw(body, idle),
            flight: Some(flight),
        };
        if pooled.is_end_stream() {
            pooled.give_back();
        }
        pooled
    }

    /// The body of a response on a shared HTTP/2 connection.
    pub fn shared(body: Incoming, flight: InFlight) -> Self {
        let mut pooled = PooledBody {
            body: Inner::Hyper { body, back: None },
            flight: Some(flight),
        };
        if pooled.is_end_stream() {
            pooled.flight = None;
        }
        pooled
    }

    fn give_back(&mut self) {
        self.flight = None;
        match &mut self.body {
            Inner::Hyper { back, .. } => {
                if let Some((sender, idle)) = back.take() {
                    idle.put(sender);
                }
            }
            Inner::Raw(body, idle) => {
                if let Some(conn) = body.reusable() {
                    idle.put_raw(conn);
                }
            }
        }
    }
}

impl<B: Send + 'static> Body for PooledBody<B> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let (body, back) = match &mut this.body {
            Inner::Raw(raw, _) => {
                let frame = std::task::ready!(raw.poll_frame(cx));
                // A failed body has dropped its connection already.
                if raw.is_end_stream() || matches!(frame, Some(Err(_))) {
                    this.give_back();
                }
                return Poll::Ready(frame.map(|f| f.map_err(BodyError::Raw)));
            }
            Inner::Hyper { body, back } => (body, back),
        };
        let frame = std::task::ready!(Pin::new(&mut *body).poll_frame(cx));
        let ended = match &frame {
            None => true,
            Some(Ok(_)) => body.is_end_stream(),
            // A failed body leaves the connection in no known state.
            Some(Err(_)) => {
                *back = None;
                this.flight = None;
                false
            }
        };
        if ended {
            this.give_back();
        }
        Poll::Ready(frame.map(|f| f.map_err(BodyError::Hyper)))
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Inner::Hyper { body, .. } => body.is_end_stream(),
            Inner::Raw(raw, _) => raw.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Inner::Hyper { body, .. } => body.size_hint(),
            Inner::Raw(raw, _) => raw.size_hint(),
        }
    }
}
