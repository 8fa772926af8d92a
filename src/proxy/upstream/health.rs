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

/// Checks `target`; `Err` says why it failed.
pub async fn check(
    connector: &Connector,
    target: &TargetUrl,
    path: &str,
    within: Duration,
) -> Result<(), String> {
    let asked = async {
        let sender = connector
            .connect::<Empty<Bytes>>(target, Speak::Either)
            .await
            .map_err(|e| e.reason)?;
        let mut req = Request::get(path)
            .header(
                "user-agent",
                concat!("quotagate/", env!("CARGO_PKG_VERSION")),
            )
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
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
                .map_err(|_| "the health path does not make a URL".to_owned())?;
                s.send_request(req).await
            }
        }
        .map_err(|e| format!("the check failed: {e}"))?;
        let status = resp.status();
        match status.is_success() || status.is_redirection() {
            true => Ok(()),
            false => Err(format!("{path} answered {}", status.as_u16())),
        }
    };
    tokio::time::timeout(within, asked)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} ms", within.as_millis())))
}
