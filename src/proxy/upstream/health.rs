//! health: one active health check: `GET upstream.health_path` on a new connection to a target.
//! 2xx and 3xx pass; anything else, no answer within the interval, or no connection fails.
//! (A new connection each time: it also proves the target still accepts them.)

use std::time::Duration;

use bytes::Bytes;
use http::header::HOST;
use http::{Request, Version};
use http_body_util::Empty;

use super::connect::{Connector, Sender, Speak};
use super::settings::TargetUrl;

/// Why a target failed its check (the log line says it).
#[derive(Debug, thiserror::Error)]
pub enum CheckFailed {
    /// No connection: "connection refused", a certificate's problem.
    #[error("{0}")]
    Connect(String),
    #[error("the health path does not make a request")]
    BadPath,
    #[error("the check failed: {0}")]
    Request(#[source] hyper::Error),
    #[error("{path} answered {status}")]
    Status { path: String, status: u16 },
    #[error("no answer within {0} ms")]
    Timeout(u128),
}

/// Checks `target`; `Err` says why it failed.
pub async fn check(
    connector: &Connector,
    target: &TargetUrl,
    path: &str,
    within: Duration,
) -> Result<(), CheckFailed> {
    let asked = async {
        let sender = connector
            .connect::<Empty<Bytes>>(target, Speak::Either)
            .await
            .map_err(|e| CheckFailed::Connect(e.reason))?;
        let mut req = Request::get(path)
            .header(
                "user-agent",
                concat!("quotagate/", env!("CARGO_PKG_VERSION")),
            )
            .body(Empty::new())
            .map_err(|_| CheckFailed::BadPath)?;
        let resp = match sender {
            Sender::Http1(mut s) => {
                req.headers_mut().insert(HOST, target.host.clone());
                s.send_request(req).await
            }
            Sender::H2(mut s) => {
                *req.version_mut() = Version::HTTP_2;
                *req.uri_mut() = format!(
                    "{}://{}{path}",
                    if target.tls { "https" } else { "http" },
                    target.authority
                )
                .parse()
                .map_err(|_| CheckFailed::BadPath)?;
                s.send_request(req).await
            }
        }
        .map_err(CheckFailed::Request)?;
        let status = resp.status();
        match status.is_success() || status.is_redirection() {
            true => Ok(()),
            false => Err(CheckFailed::Status {
                path: path.to_owned(),
                status: status.as_u16(),
            }),
        }
    };
    tokio::time::timeout(within, asked)
        .await
        .unwrap_or_else(|_| Err(CheckFailed::Timeout(within.as_millis())))
}
