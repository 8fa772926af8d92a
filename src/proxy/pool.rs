//! pool: keep-alive HTTP/1.1 connections to the upstream, one stack of idle connections per worker.
//!
//! Why not hyper-util's pooled client: it serves any number of hosts, so every request hashes its
//! pool key (scheme and authority, SipHash) three times, takes a shared lock, and spawns a task per
//! response to put the connection back once its body is read. quotagate talks to one upstream and
//! each worker ([`crate::workers`]) keeps its own connections, so a stack per worker is enough; a
//! connection goes back when its response body ends, from the body itself ([`PooledBody`]).
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
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Idle connections of one worker.
pub struct Idle<B> {
    /// Most recently used last: the likeliest to be still open.
    senders: Mutex<Vec<(SendRequest<B>, Instant)>>,
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

/// Opens a connection to `authority` and starts its task on the current runtime.
pub async fn connect<B>(
    authority: &str,
    connect_timeout: Duration,
    max_buf_size: usize,
) -> std::io::Result<SendRequest<B>>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::time::timeout(connect_timeout, async {
        let mut last = std::io::Error::other("the upstream name resolves to no address");
        for addr in tokio::net::lookup_host(authority).await? {
            match TcpStream::connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(last)
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timeout"))??;
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::Builder::new()
        .max_buf_size(max_buf_size.max(8192))
        .handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        // With upgrades: a 101 hands the connection over (`crate::proxy::upgrade`).
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upstream connection closed");
        }
    });
    Ok(sender)
}

/// A response body that puts its connection back into the pool when it ends. Dropped before its
/// end, it drops the connection instead: hyper closes a connection whose response was not read.
pub struct PooledBody<B: Send + 'static> {
    body: Incoming,
    back: Option<(SendRequest<B>, Arc<Idle<B>>)>,
}

impl<B: Send + 'static> PooledBody<B> {
    pub fn new(body: Incoming, sender: SendRequest<B>, idle: Arc<Idle<B>>) -> Self {
        let mut pooled = PooledBody {
            body,
            back: Some((sender, idle)),
        };
        if pooled.body.is_end_stream() {
            pooled.give_back();
        }
        pooled
    }

    fn give_back(&mut self) {
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
            Some(Err(_)) => this.back = None,
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
