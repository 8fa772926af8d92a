//! pool: keep-alive connections to one target, one pool per worker: a stack of idle HTTP/1.1
//! connections and at most one shared HTTP/2 connection.
//!
//! Why not hyper-util's pooled client: it serves any number of hosts, so every request hashes its
//! pool key (scheme and authority, SipHash) three times, takes a shared lock, and spawns a task per
//! response to put the connection back once its body is read. quotagate knows its targets up front
//! and each worker ([`crate::workers`]) keeps its own connections, so a stack per worker and target
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

/// Idle connections of one worker to one target.
pub struct Idle<B> {
    /// Most recently used last: the likeliest to be still open.
    senders: Mutex<Vec<(SendRequest<B>, Instant)>>,
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
            senders: Mutex::new(Vec::new()),
            h2: Mutex::new(None),
            max,
            timeout,
            reaping: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(SendRequest<B>, Instant)>> {
        // Nothing here can leave the list half-changed, so a poisoned lock is used as is.
        self.senders.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used idle connection that is not closed.
    pub fn take(&self) -> Option<SendRequest<B>> {
        let mut idle = self.lock();
        while let Some((sender, _)) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
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
        if sender.is_closed() {
            return;
        }
        {
            let mut idle = self.lock();
            if idle.len() >= self.max || self.timeout.is_zero() {
                return;
            }
            idle.push((sender, Instant::now()));
        }
        if !self.reaping.swap(true, Ordering::Relaxed) {
            tokio::spawn(reap(Arc::downgrade(self)));
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
        let timeout = idle.timeout;
        idle.lock()
            .retain(|(s, since)| !s.is_closed() && since.elapsed() < timeout);
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
/// not read. (An HTTP/2 connection stays shared whatever its streams do.)
pub struct PooledBody<B: Send + 'static> {
    body: Incoming,
    back: Option<(SendRequest<B>, Arc<Idle<B>>)>,
    flight: Option<InFlight>,
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
            body,
            back: Some((sender, idle)),
            flight: Some(flight),
        };
        if pooled.body.is_end_stream() {
            pooled.give_back();
        }
        pooled
    }

    /// The body of a response on a shared HTTP/2 connection.
    pub fn shared(body: Incoming, flight: InFlight) -> Self {
        let mut pooled = PooledBody {
            body,
            back: None,
            flight: Some(flight),
        };
        if pooled.body.is_end_stream() {
            pooled.flight = None;
        }
        pooled
    }

    fn give_back(&mut self) {
        self.flight = None;
        if let Some((sender, idle)) = self.back.take() {
            idle.put(sender);
        }
    }
}

impl<B: Send + 'static> Body for PooledBody<B> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let frame = std::task::ready!(Pin::new(&mut this.body).poll_frame(cx));
        match &frame {
            None => this.give_back(),
            Some(Ok(_)) if this.body.is_end_stream() => this.give_back(),
            Some(Ok(_)) => {}
            // A failed body leaves the connection in no known state.
            Some(Err(_)) => {
                this.back = None;
                this.flight = None;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
