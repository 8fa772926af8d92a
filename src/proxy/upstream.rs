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

use crate::config::{Config, ConfigError, positive_ms};

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

/// The upstream's settings (`[upstream]`), checked.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    pub target: UpstreamTarget,
    /// Connecting to the upstream; then 502.
    pub connect_timeout: Duration,
    /// Waiting for the upstream's response headers; then 504.
    pub response_timeout: Duration,
    /// Idle upstream connections are closed after this.
    pub pool_idle_timeout: Duration,
    /// Idle upstream connections kept open, per worker.
    pub pool_max_idle: usize,
    /// Largest response header section read from the upstream (`server.max_header_bytes`).
    pub max_header_bytes: usize,
}

impl TryFrom<&Config> for UpstreamSettings {
    type Error = ConfigError;

    fn try_from(c: &Config) -> Result<Self, ConfigError> {
        let u = &c.upstream;
        Ok(UpstreamSettings {
            target: UpstreamTarget::parse(&u.url)?,
            connect_timeout: positive_ms("upstream.connect_timeout_ms", u.connect_timeout_ms)?,
            response_timeout: positive_ms("upstream.response_timeout_ms", u.response_timeout_ms)?,
            pool_idle_timeout: Duration::from_millis(u.pool_idle_timeout_ms),
            pool_max_idle: u.pool_max_idle,
            max_header_bytes: c.server.max_header_bytes,
        })
    }
}

/// The parsed `upstream.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTarget {
    /// `host:port`.
    pub authority: http::uri::Authority,
    /// Prepended to every forwarded path; empty or starting with `/`, never ending with `/`.
    pub base_path: String,
}

impl UpstreamTarget {
    pub fn parse(url: &str) -> Result<UpstreamTarget, ConfigError> {
        let bad = |why: &str| ConfigError(format!("upstream.url: {url:?} {why}"));
        let uri: Uri = url.parse().map_err(|_| bad("is not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "must start with http:// (TLS to the upstream is not supported yet)",
            ));
        }
        let authority = uri.authority().cloned().ok_or_else(|| bad("has no host"))?;
        if uri.query().is_some() {
            return Err(bad("must not have a query"));
        }
        Ok(UpstreamTarget {
            authority,
            base_path: uri.path().trim_end_matches('/').to_owned(),
        })
    }
}

impl Upstream {
    /// `workers`: how many connection pools to keep (one per worker; `pool_max_idle` applies to
    /// each).
    pub fn new(s: &UpstreamSettings, workers: usize) -> Upstream {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(s.connect_timeout));
        let build = || {
            Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .pool_idle_timeout(s.pool_idle_timeout)
                .pool_max_idle_per_host(s.pool_max_idle)
                .http1_max_buf_size(s.max_header_bytes.max(8192))
                .build(connector.clone())
        };
        Upstream {
            clients: (0..workers.max(1)).map(|_| build()).collect(),
            target: s.target.clone(),
            response_timeout: s.response_timeout,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_base_path() {
        let t = UpstreamTarget::parse("http://api:9000/v1/").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.base_path.as_str()),
            ("api:9000", "/v1")
        );
        assert_eq!(
            UpstreamTarget::parse("http://api:9000").unwrap().base_path,
            ""
        );
        let e = UpstreamTarget::parse("https://x").unwrap_err();
        assert!(e.0.contains("http://"), "{e}");
    }
}
