//! server: the HTTP accept loop shared by the proxy and the example upstream.
//!
//! Takes an already-bound listener and a shutdown future (tests bind port 0). Speaks HTTP/1.1 and
//! cleartext HTTP/2 on the same port. On shutdown it stops accepting at once, lets in-flight
//! requests finish (idle keep-alive connections are closed), and gives up after the drain timeout.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connection-level limits of an HTTP listener.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Time a client has to send its first byte, and each request's headers. Default: 10 s.
    pub header_read_timeout: Duration,
    /// Largest request header section, in bytes (HTTP/1 read buffer, HTTP/2 header list). Default: 64 KiB.
    pub max_header_bytes: usize,
    /// Open connections at most; more wait in the kernel's accept queue. Default: 10000.
    pub max_connections: usize,
    /// How long in-flight requests may take to finish after shutdown begins. Default: 10 s.
    pub drain_timeout: Duration,
    /// Counts open connections, when given (a metric).
    pub connections: Option<prometheus_client::metrics::gauge::Gauge>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 64 * 1024,
            max_connections: 10_000,
            drain_timeout: Duration::from_secs(10),
            connections: None,
        }
    }
}

/// Serves `handler` on `listener` until `shutdown` completes, then drains. Returns `false` if the
/// drain timeout passed with requests still in flight.
pub async fn serve<H, F, B>(
    listener: TcpListener,
    settings: HttpSettings,
    handler: H,
    shutdown: impl Future<Output = ()>,
) -> bool
where
    H: Fn(SocketAddr, Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let handler = Arc::new(handler);
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(settings.max_header_bytes.max(8192));
    http.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            () = &mut shutdown => break,
        };
        let (tcp, peer) = tokio::select! {
            res = listener.accept() => match res {
                Ok(c) => c,
                Err(e) => {
                    // Typically EMFILE: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let h = handler.clone();
        let svc = service_fn(move |req| {
            let fut = h(peer, req);
            async move { Ok::<_, Infallible>(fut.await) }
        });
        let (http, watcher, gauge) = (
            http.clone(),
            graceful.watcher(),
            settings.connections.clone(),
        );
        let first_byte = settings.header_read_timeout;
        tokio::spawn(async move {
            // hyper's header timer starts with the first byte: a client that connects and sends
            // nothing would hold a connection slot forever.
            // (`peek` waits for a byte; `readable` may report a fresh socket ready before one.)
            match tokio::time::timeout(first_byte, tcp.peek(&mut [0u8; 1])).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
            if let Some(g) = &gauge {
                g.inc();
            }
            let _ = watcher
                .watch(http.serve_connection(TokioIo::new(tcp), svc).into_owned())
                .await;
            if let Some(g) = gauge {
                g.dec();
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::time::timeout(settings.drain_timeout, graceful.shutdown())
        .await
        .is_ok()
}
