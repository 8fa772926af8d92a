//! idle: a client connection's time between requests, bounded twice: by
//! `server.keep_alive_timeout_ms` while it sends nothing, and by `server.header_read_timeout_ms`
//! from the first byte of an HTTP/1 request's head to the whole head (so a head sent a byte at a
//! time cannot hold the connection).
//!
//! hyper has one timer for both: it starts its header timer whenever it waits for a head, so an
//! idle keep-alive connection was closed after the header timeout, and it allocates that timer
//! anew for every request. Here the connection's requests tell [`Activity`] when they start and
//! end, and its socket ([`Timed`]) keeps one timer for the connection's life. When a bound
//! passes, reading the socket ends as if the client had closed it, and hyper closes the
//! connection. Nothing is timed while a request is in flight (its body, the upstream) nor after
//! an upgrade (the relay has `server.upgrade_idle_timeout_ms`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf;
use http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What a connection's requests are doing, shared by them and its socket.
#[derive(Debug)]
pub struct Activity {
    /// Requests begun, and ended (their response sent or dropped): equal when idle.
    begun: AtomicU64,
    ended: AtomicU64,
    /// When the last request ended, in nanoseconds since `epoch`.
    idle_since: AtomicU64,
    /// A response switched protocols: the connection is no longer HTTP's to time.
    upgraded: AtomicBool,
    /// The client sends nothing more (it closed, or asked to close and sent nothing after):
    /// the socket may close without looking for unread bytes.
    quiet: AtomicBool,
    /// The gateway's own HTTP/1.1 loop serves the connection ([`super::h1::serve`]): after each
    /// request it reads for the next head itself, so the socket starts the idle time then, and
    /// needs no timer while a request is in flight.
    own_loop: AtomicBool,
    /// The request (its number, from 1) whose answer is awaited while the socket is read only to
    /// see the client go; 0 while no read is of that kind (`super::Lingering` may wait before
    /// such a read registers the socket).
    watching: AtomicU64,
    epoch: Instant,
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            begun: AtomicU64::new(0),
            ended: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            upgraded: AtomicBool::new(false),
            quiet: AtomicBool::new(false),
            own_loop: AtomicBool::new(false),
            watching: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// A request begins: the connection is busy until the returned guard is dropped (it travels
    /// with the response's body, [`Request::respond`]).
    pub fn begin(self: &Arc<Self>) -> Request {
        self.begun.fetch_add(1, Ordering::Relaxed);
        Request(self.clone())
    }

    /// The client sends nothing more: see `quiet`.
    pub fn close_quietly(&self) {
        self.quiet.store(true, Ordering::Relaxed);
    }

    pub fn is_quiet(&self) -> bool {
        self.quiet.load(Ordering::Relaxed)
    }

    /// The gateway's own HTTP/1.1 loop serves the connection from now on (`true`), or hyper's
    /// server (`false`): see `own_loop`.
    pub fn served_by_own_loop(&self, own: bool) {
        self.own_loop.store(own, Ordering::Relaxed);
    }

    /// Reads of the socket from now on only look for the client going (`true`, while a request's
    /// answer is made), or are for the request's bytes again (`false`).
    pub fn watch_for_departure(&self, watch: bool) {
        let of = match watch {
            true => self.begun.load(Ordering::Relaxed),
            false => 0,
        };
        self.watching.store(of, Ordering::Relaxed);
    }

    /// The request whose answer a read now waits on, looking for the client going: see
    /// `watching`.
    pub fn watched(&self) -> Option<u64> {
        match self.watching.load(Ordering::Relaxed) {
            0 => None,
            of => Some(of),
        }
    }

    fn ended(&self) -> u64 {
        self.ended.load(Ordering::Acquire)
    }

    fn busy(&self, ended: u64) -> bool {
        self.begun.load(Ordering::Relaxed) != ended || self.upgraded.load(Ordering::Relaxed)
    }

    fn idle_since(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.idle_since.load(Ordering::Relaxed))
    }
}

/// One request of a connection, in flight while this lives.
#[derive(Debug)]
pub struct Request(Arc<Activity>);

impl Request {
    /// The response, its body holding the request in flight until it is sent or dropped.
    pub fn respond<B>(self, resp: Response<B>) -> Response<Tracked<B>> {
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            self.0.upgraded.store(true, Ordering::Relaxed);
        }
        resp.map(|inner| Tracked {
            inner,
            _request: self,
        })
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        let a = &self.0;
        let since = a.epoch.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        a.idle_since.store(since, Ordering::Relaxed);
        // Release: a socket that reads the new count also reads `idle_since`.
        a.ended.fetch_add(1, Ordering::Release);
    }
}

pin_project_lite::pin_project! {
    /// A response body that holds its request in flight.
    pub struct Tracked<B> {
        #[pin]
        inner: B,
        _request: Request,
    }
}

impl<B: Body> Body for Tracked<B>
where
    B::Data: Buf,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The bounds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Idle: from the end of the last request to the first byte of the next.
    pub keep_alive: Duration,
    /// From the first byte of an HTTP/1 head to its end.
    pub header_read: Duration,
}

/// A client socket whose reads end when a bound passes.
pub struct Timed<S> {
    io: S,
    activity: Arc<Activity>,
    bounds: Bounds,
    timer: Pin<Box<Sleep>>,
    /// Requests ended when last looked at: a change starts a new idle time.
    seen: u64,
    /// When the head being received began (HTTP/1), `None` while nothing came since idle.
    head_since: Option<Instant>,
    /// HTTP/2 (seen by its preface): its frames between requests (pings, settings) are no head.
    h2: bool,
    /// Nothing read yet: the first read tells HTTP/2 by its preface.
    first_read: bool,
}

/// The start of HTTP/2's connection preface.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

impl<S> Timed<S> {
    /// A new connection's socket: its first head is timed from now (by the header timeout), as
    /// if its first byte had arrived.
    pub fn new(io: S, activity: Arc<Activity>, bounds: Bounds) -> Timed<S> {
        Timed::from(io, activity, bounds, Instant::now())
    }

    /// [`Timed::new`] for a socket whose `activity` began as it was accepted: its first head is
    /// timed from then (one reading of the clock a connection, ~90 instructions, spared).
    pub fn accepted(io: S, activity: Arc<Activity>, bounds: Bounds) -> Timed<S> {
        let since = activity.epoch;
        Timed::from(io, activity, bounds, since)
    }

    fn from(io: S, activity: Arc<Activity>, bounds: Bounds, now: Instant) -> Timed<S> {
        Timed {
            io,
            activity,
            bounds,
            timer: Box::pin(tokio::time::sleep_until(now + bounds.header_read)),
            seen: 0,
            head_since: Some(now),
            h2: false,
            first_read: true,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Timed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let ended = this.activity.ended();
        if ended != this.seen {
            this.seen = ended;
            this.head_since = None;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let got = &buf.filled()[before..];
                if this.first_read && !got.is_empty() {
                    this.first_read = false;
                    this.h2 = got.starts_with(H2_PREFACE);
                }
                if !got.is_empty() && this.head_since.is_none() && !this.activity.busy(ended) {
                    this.head_since = Some(Instant::now());
                }
                return Poll::Ready(Ok(()));
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => {}
        }
        let busy = this.activity.busy(ended);
        if busy && this.activity.own_loop.load(Ordering::Relaxed) {
            // Read while the answer is made, for a client that goes: the loop reads again after
            // the request, when the idle time starts (a clock read and a timer's wait a request
            // spared).
            return Poll::Pending;
        }
        let deadline = match (busy, this.head_since) {
            // In flight: nothing is timed, but hyper's connection must be woken after the request
            // ends to start its idle time, and nothing else would wake it (hyper waits on the
            // socket). So the timer stays within a keep-alive time of the latest poll: it fires
            // no later than the idle deadline, when the time left is counted from the request's
            // end. Most polls leave it as it is.
            (true, _) => {
                let now = Instant::now();
                let armed = this.timer.deadline();
                match armed > now && armed <= now + this.bounds.keep_alive {
                    true => armed,
                    false => now + this.bounds.keep_alive,
                }
            }
            (false, Some(t)) if !this.h2 => t + this.bounds.header_read,
            (false, _) => this.activity.idle_since() + this.bounds.keep_alive,
        };
        if this.timer.deadline() != deadline {
            this.timer.as_mut().reset(deadline);
        }
        match (this.timer.as_mut().poll(cx), busy) {
            // Read as the end of the stream: hyper closes the connection.
            (Poll::Ready(()), false) => Poll::Ready(Ok(())),
            (Poll::Ready(()), true) => {
                // The clock passed the deadline just set: wake again to re-arm it.
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            (Poll::Pending, _) => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Timed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const BOUNDS: Bounds = Bounds {
        keep_alive: Duration::from_secs(60),
        header_read: Duration::from_secs(10),
    };

    /// Reads until the socket ends; how long that took on the paused clock.
    async fn ends_after(t: &mut Timed<tokio::io::DuplexStream>) -> Duration {
        let start = Instant::now();
        let mut buf = [0u8; 64];
        while t.read(&mut buf).await.unwrap() > 0 {}
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_ends_after_the_keep_alive_time_not_the_header_time() {
        let (io, _client) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut t = Timed::new(io, activity.clone(), BOUNDS);
        let request = activity.begin();
        // In flight far past both bounds: nothing is timed.
        tokio::time::advance(Duration::from_secs(120)).await;
        let resp = request.respond(Response::new(()));
        drop(resp);
        assert_eq!(ends_after(&mut t).await, BOUNDS.keep_alive);
    }

    /// hyper waits on the socket while a request is in flight, and nothing wakes it when the
    /// request ends: the idle time must start all the same.
    #[tokio::test(start_paused = true)]
    async fn a_read_waiting_while_the_request_ends_ends_after_the_keep_alive_time() {
        let (io, _client) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut t = Timed::new(io, activity.clone(), BOUNDS);
        let request = activity.begin();
        let start = Instant::now();
        let reading = tokio::spawn(async move { ends_after(&mut t).await });
        tokio::time::advance(Duration::from_secs(100)).await;
        drop(request.respond(Response::new(())));
        tokio::time::timeout(Duration::from_secs(3600), reading)
            .await
            .expect("the read ends")
            .unwrap();
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(100) + BOUNDS.keep_alive
        );
    }

    /// A timer set for an earlier request's idle deadline, when a later request ends before it
    /// fires (tokio moves a later deadline lazily: the timer fires at the first, and is put back
    /// for the rest), does not end the connection early.
    #[tokio::test(start_paused = true)]
    async fn a_timer_due_before_the_idle_deadline_does_not_end_the_connection() {
        let (io, _client) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut t = Timed::new(io, activity.clone(), BOUNDS);
        drop(activity.begin().respond(Response::new(())));
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(1), t.read(&mut buf)).await;
        assert!(read.is_err(), "idle, timed from the first request's end");
        let start = Instant::now();
        // A second request 29 s later: its end is the idle time's start.
        tokio::time::advance(Duration::from_secs(29)).await;
        drop(activity.begin().respond(Response::new(())));
        assert_eq!(ends_after(&mut t).await, BOUNDS.keep_alive);
        assert_eq!(start.elapsed(), Duration::from_secs(29) + BOUNDS.keep_alive);
    }

    /// A new connection's first head is timed from its acceptance (`accepted`), or from when
    /// its socket is made (`new`: after a TLS handshake).
    #[tokio::test(start_paused = true)]
    async fn a_first_head_is_timed_from_the_accept_or_from_the_socket() {
        let (io, _client) = tokio::io::duplex(64);
        let activity = Activity::new();
        tokio::time::advance(Duration::from_secs(4)).await;
        let mut t = Timed::accepted(io, activity, BOUNDS);
        assert_eq!(
            ends_after(&mut t).await,
            BOUNDS.header_read - Duration::from_secs(4)
        );
        let (io, _client) = tokio::io::duplex(64);
        let activity = Activity::new();
        tokio::time::advance(Duration::from_secs(4)).await;
        let mut t = Timed::new(io, activity, BOUNDS);
        assert_eq!(ends_after(&mut t).await, BOUNDS.header_read);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_sent_slowly_ends_after_the_header_time_from_its_first_byte() {
        let (io, mut client) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut t = Timed::new(io, activity.clone(), BOUNDS);
        drop(activity.begin().respond(Response::new(())));
        tokio::time::advance(Duration::from_secs(30)).await;
        client.write_all(b"G").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(t.read(&mut buf).await.unwrap(), 1);
        // A byte every second does not restart the clock.
        let drip = tokio::spawn(async move {
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let _ = client.write_all(b"E").await;
            }
            client
        });
        assert_eq!(ends_after(&mut t).await, BOUNDS.header_read);
        drop(drip);
    }

    #[tokio::test(start_paused = true)]
    async fn http2_frames_between_requests_do_not_start_a_head_and_upgrades_are_not_timed() {
        let (io, mut client) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut t = Timed::new(io, activity.clone(), BOUNDS);
        client
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        assert!(t.read(&mut buf).await.unwrap() > 0);
        drop(activity.begin().respond(Response::new(())));
        // A ping 10 s later is read, and the idle time still counts from the request's end.
        tokio::time::advance(Duration::from_secs(10)).await;
        client.write_all(b"ping").await.unwrap();
        assert_eq!(t.read(&mut buf).await.unwrap(), 4);
        assert_eq!(
            ends_after(&mut t).await,
            BOUNDS.keep_alive - Duration::from_secs(10)
        );

        let (io, _client) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut t = Timed::new(io, activity.clone(), BOUNDS);
        let switching = Response::builder().status(101).body(()).unwrap();
        drop(activity.begin().respond(switching));
        let read = tokio::time::timeout(Duration::from_secs(3600), t.read(&mut buf)).await;
        assert!(read.is_err(), "an upgraded connection is never ended here");
    }
}
