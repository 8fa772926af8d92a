//! serve: accepting connections, each one's protocol (HTTP/1.1 or HTTP/2, told by its first
//! bytes), and the drain at shutdown.

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

use crate::server::cold;

use super::linger::Lingering;
use super::socket::Socket;
use super::{Answer, Executor, HttpSettings, RequestBody, h1, idle, sniff};
use crate::server::workers;

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
    /// `server.max_headers`.
    max_headers: usize,
    passes: Option<Arc<crate::server::passed::Passes>>,
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
            .max_buf_size(settings.max_header_bytes.max(8192))
            .max_headers(settings.max_headers);
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
        Http {
            h1,
            h2,
            max_head: settings.max_header_bytes.max(8192),
            max_headers: settings.max_headers,
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
                        max_headers: self.max_headers,
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
                    crate::server::cold::apart(|| async move {
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
                    crate::server::cold::apart(|| async move {
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
/// operations a request on a line both workers write; docs/benchmarks/). So after the first
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
