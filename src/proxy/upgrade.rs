//! upgrade: requests that switch protocols (WebSocket, and any other `Connection: Upgrade`).
//!
//! Such a request is admitted and counted once like any other; its `Connection: upgrade` and
//! `Upgrade` fields are forwarded (they are hop-by-hop, so otherwise removed). When the upstream
//! answers 101, the client gets the 101 and the bytes of both connections are relayed as they are
//! until either side closes, or neither sends anything for `server.upgrade_idle_timeout_ms`.

use std::time::Duration;

use http::header::{CONNECTION, UPGRADE};
use http::{HeaderMap, HeaderValue, Request, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The protocol an HTTP/1.1 request asks to switch to (`Upgrade`, with `upgrade` among the
/// `Connection` tokens), if it does.
pub fn requested<B>(req: &Request<B>) -> Option<HeaderValue> {
    // `Upgrade` first: one lookup, and absent from nearly every request.
    let protocol = req.headers().get(UPGRADE)?;
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let asks = req
        .headers()
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| protocol.clone())
}

/// Puts back the two fields that ask for (or agree to) `protocol`, after the hop-by-hop ones were
/// removed.
pub fn restore(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, protocol);
}

/// Relays the two upgraded connections in the background once both are ready.
/// `held`: what the request holds until the connection closes (its concurrency slots).
pub fn relay<H: Send + 'static>(client: OnUpgrade, upstream: OnUpgrade, idle: Duration, held: H) {
    tokio::spawn(async move {
        let (Ok(client), Ok(upstream)) = (client.await, upstream.await) else {
            tracing::debug!("an upgrade did not complete on one side");
            return;
        };
        pump(TokioIo::new(client), TokioIo::new(upstream), idle).await;
        drop(held);
    });
}

/// Copies bytes both ways until either side closes or both stay silent for `idle`.
async fn pump<A, B>(a: A, b: B, idle: Duration)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let (mut from_a, mut from_b) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let silence = tokio::time::sleep(idle);
    tokio::pin!(silence);
    loop {
        tokio::select! {
            n = ar.read(&mut from_a) => match n {
                Ok(n) if n > 0 => if bw.write_all(&from_a[..n]).await.is_err() { break },
                _ => break,
            },
            n = br.read(&mut from_b) => match n {
                Ok(n) if n > 0 => if aw.write_all(&from_b[..n]).await.is_err() { break },
                _ => break,
            },
            () = &mut silence => {
                tracing::debug!("upgraded connection idle: closed");
                break;
            }
        }
        silence.as_mut().reset(tokio::time::Instant::now() + idle);
    }
    let _ = aw.shutdown().await;
    let _ = bw.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: Version, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = http::Request::builder().version(version);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn only_http11_with_the_upgrade_token_and_a_protocol_asks() {
        let ws = [
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ];
        assert_eq!(
            requested(&request(Version::HTTP_11, &ws)).unwrap(),
            "websocket"
        );
        assert_eq!(requested(&request(Version::HTTP_2, &ws)), None);
        assert_eq!(
            requested(&request(Version::HTTP_11, &[("upgrade", "websocket")])),
            None
        );
        assert_eq!(
            requested(&request(Version::HTTP_11, &[("connection", "upgrade")])),
            None
        );
    }
}
