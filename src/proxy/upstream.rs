//! upstream: the pooled client that forwards allowed requests.
//!
//! hyper-util's legacy client, one pool per upstream, HTTP/1.1 towards the upstream. Bodies stream
//! both ways with backpressure; nothing is buffered whole. Redirects are passed back, never followed.
//! The connect timeout gives 502 and the response-header timeout 504.

use std::error::Error as StdError;
use std::time::Duration;

use http::{Request, Response, Uri};
use http_body_util::{LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::config::{ConfigError, UpstreamConfig, UpstreamTarget};

/// Request body sent upstream: the client's body, cut off at the configured size.
pub type UpstreamBody = Limited<Incoming>;

/// Why forwarding failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamError {
    /// No connection could be made (refused, unresolvable, connect timeout): 502.
    Unreachable,
    /// No response headers within the response timeout: 504.
    Timeout,
    /// The client's body passed the size limit while streaming: 413.
    BodyTooLarge,
    /// The connection failed mid-exchange: 502.
    Broken,
    /// The client's request body could not be read (bad chunked framing, a body cut short): 400.
    BadRequestBody,
}

pub struct Upstream {
    /// One pool per worker ([`crate::workers`]): a pooled connection's task runs on the worker
    /// that opened it, so sharing one pool would send requests across threads.
    clients: Box<[Client<HttpConnector, UpstreamBody>]>,
    target: UpstreamTarget,
    response_timeout: Duration,
}

impl Upstream {
    /// `workers`: how many connection pools to keep (one per worker; `upstream.pool_max_idle`
    /// applies to each).
    pub fn new(
        cfg: &UpstreamConfig,
        max_header_bytes: usize,
        workers: usize,
    ) -> Result<Upstream, ConfigError> {
        let target = UpstreamTarget::parse(&cfg.url)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(cfg.connect_timeout()));
        let build = || {
            Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .pool_idle_timeout(cfg.pool_idle_timeout())
                .pool_max_idle_per_host(cfg.pool_max_idle)
                .http1_max_buf_size(max_header_bytes.max(8192))
                .build(connector.clone())
        };
        Ok(Upstream {
            clients: (0..workers.max(1)).map(|_| build()).collect(),
            target,
            response_timeout: cfg.response_timeout(),
        })
    }

    /// The absolute URI of `path` (and `query`) on the upstream.
    pub fn uri(&self, path: &str, query: Option<&str>) -> Option<Uri> {
        let mut pq = String::with_capacity(
            self.target.base_path.len() + path.len() + query.map_or(0, |q| q.len() + 1),
        );
        pq.push_str(&self.target.base_path);
        pq.push_str(path);
        if let Some(q) = query {
            pq.push('?');
            pq.push_str(q);
        }
        Uri::builder()
            .scheme("http")
            .authority(self.target.authority.clone())
            .path_and_query(pq)
            .build()
            .ok()
    }

    /// Sends the request and waits for the response headers.
    pub async fn send(
        &self,
        req: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let client = &self.clients[crate::workers::current() % self.clients.len()];
        match tokio::time::timeout(self.response_timeout, client.request(req)).await {
            Err(_) => Err(UpstreamError::Timeout),
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) if e.is_connect() => Err(UpstreamError::Unreachable),
            Ok(Err(e)) => {
                if sources(&e).any(|s| s.is::<LengthLimitError>()) {
                    return Err(UpstreamError::BodyTooLarge);
                }
                // The body hyper sends upstream is the client's: a failure to read it is a
                // user-body error of the upstream exchange, not the upstream's failure.
                if sources(&e).any(|s| {
                    s.downcast_ref::<hyper::Error>()
                        .is_some_and(hyper::Error::is_user)
                }) {
                    return Err(UpstreamError::BadRequestBody);
                }
                tracing::debug!(error = %e, "upstream exchange failed");
                Err(UpstreamError::Broken)
            }
        }
    }
}

/// The errors behind `e`, nearest first.
fn sources<'a>(
    e: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(e.source(), |s| (*s).source())
}
