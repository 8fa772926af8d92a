//! upstream: the client that forwards allowed requests.
//!
//! HTTP/1.1 towards the upstream over keep-alive connections, one pool per worker ([`super::pool`]).
//! Bodies stream both ways with backpressure; nothing is buffered whole. Redirects are passed back,
//! never followed. The connect timeout gives 502 and the response-header timeout 504.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use http::header::HOST;
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::{LengthLimitError, Limited};
use hyper::body::Incoming;

use super::pool::{self, Idle, PooledBody};

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

/// A response from the upstream, its body putting the connection back when read.
pub type UpstreamResponse = Response<PooledBody<UpstreamBody>>;

pub struct Upstream {
    /// One pool per worker ([`crate::workers`]): a connection's task runs on the worker that
    /// opened it, so sharing one pool would send requests across threads.
    pools: Box<[Arc<Idle<UpstreamBody>>]>,
    target: UpstreamTarget,
    /// `Host` of every forwarded request: the upstream's authority.
    host: HeaderValue,
    connect_timeout: Duration,
    response_timeout: Duration,
    max_header_bytes: usize,
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
        let bad = |why: &str| ConfigError::option("upstream.url", format!("{url:?} {why}"));
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
        Upstream {
            pools: (0..workers.max(1))
                .map(|_| Idle::new(s.pool_max_idle, s.pool_idle_timeout))
                .collect(),
            host: HeaderValue::from_str(s.target.authority.as_str())
                .expect("an authority is a valid header value"),
            target: s.target.clone(),
            connect_timeout: s.connect_timeout,
            response_timeout: s.response_timeout,
            max_header_bytes: s.max_header_bytes,
        }
    }

    /// The request target (origin form) of `path` (and `query`) on the upstream.
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
        Uri::try_from(pq).ok()
    }

    /// Sends the request (its `Host` is set to the upstream's) and waits for the response headers.
    pub async fn send(
        &self,
        mut req: Request<UpstreamBody>,
    ) -> Result<UpstreamResponse, UpstreamError> {
        req.headers_mut().insert(HOST, self.host.clone());
        let idle = &self.pools[crate::workers::current() % self.pools.len()];
        let exchange = async {
            // A reused connection may have been closed by the upstream while idle: a request it
            // could not start is sent once more, on a new connection.
            let mut fresh = false;
            loop {
                let mut sender = match idle.take().filter(|_| !fresh) {
                    Some(mut s) => {
                        if s.ready().await.is_err() {
                            continue;
                        }
                        s
                    }
                    None => {
                        fresh = true;
                        pool::connect(
                            self.target.authority.as_str(),
                            self.connect_timeout,
                            self.max_header_bytes,
                        )
                        .await
                        .map_err(|e| {
                            tracing::debug!(error = %e, "cannot connect to the upstream");
                            UpstreamError::Unreachable
                        })?
                    }
                };
                match sender.try_send_request(req).await {
                    Ok(resp) => {
                        return Ok(resp.map(|body| PooledBody::new(body, sender, idle.clone())));
                    }
                    Err(mut e) => match e.take_message() {
                        Some(unsent) if !fresh => {
                            req = unsent;
                            fresh = true;
                        }
                        _ => return Err(classify(&e.into_error())),
                    },
                }
            }
        };
        tokio::time::timeout(self.response_timeout, exchange)
            .await
            .unwrap_or(Err(UpstreamError::Timeout))
    }
}

/// What a failed exchange means for the client.
fn classify(e: &hyper::Error) -> UpstreamError {
    let mut chain = std::iter::once(e as &(dyn StdError + 'static)).chain(sources(e));
    if chain.any(|s| s.is::<LengthLimitError>()) {
        return UpstreamError::BodyTooLarge;
    }
    // The body sent upstream is the client's: a failure to read it is a user-body error of the
    // exchange, not the upstream's failure.
    if e.is_user() {
        return UpstreamError::BadRequestBody;
    }
    tracing::debug!(error = %e, "upstream exchange failed");
    UpstreamError::Broken
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
        assert!(e.to_string().contains("http://"), "{e}");
    }
}
