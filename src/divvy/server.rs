//! server: the Divvy TCP port.
//!
//! Each connection has a reader that frames lines and starts each request at once (requests run
//! concurrently), and a writer that sends the replies strictly in request order. At most
//! `max_in_flight` requests per connection are pending: a client that does not read its replies
//! stops being read, so its memory stays bounded and other connections are unaffected. After an
//! `ERR` reply the connection closes and later lines are not executed. A line longer than
//! `max_line_bytes` is answered with an `ERR` as soon as it passes the limit, without buffering it.

use std::future::Future;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::Divvy;
use super::protocol::{self, ProtoError, Reply, Request};

/// Limits of the Divvy port.
#[derive(Debug, Clone)]
pub struct DivvySettings {
    /// Longest request line in bytes. Default: 1 MiB.
    pub max_line_bytes: usize,
    /// Open connections at most; more wait in the kernel's accept queue. Default: 10000.
    pub max_connections: usize,
    /// Requests per connection whose replies are not yet written, at most. Default: 1024.
    pub max_in_flight: usize,
}

impl Default for DivvySettings {
    fn default() -> Self {
        DivvySettings {
            max_line_bytes: 1024 * 1024,
            max_connections: 10_000,
            max_in_flight: 1024,
        }
    }
}

/// Serves the Divvy protocol on `listener` until `shutdown`; open connections then stop reading,
/// send the replies they owe, and close.
pub async fn serve(
    listener: TcpListener,
    divvy: Arc<Divvy>,
    settings: DivvySettings,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    let stop = CancellationToken::new();
    let settings = Arc::new(settings);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "divvy accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let (divvy, settings, stop) = (divvy.clone(), settings.clone(), stop.clone());
        tokio::spawn(async move {
            connection(stream, divvy, &settings, stop).await;
            drop(permit);
        });
    }
    stop.cancel();
}

/// What the reader hands the writer: a reply to wait for, in order.
type Pending = oneshot::Receiver<Reply>;

async fn connection(
    stream: TcpStream,
    divvy: Arc<Divvy>,
    settings: &DivvySettings,
    stop: CancellationToken,
) {
    let (mut rd, wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Pending>(settings.max_in_flight.max(1));
    let writer = tokio::spawn(async move {
        let mut out = BufWriter::new(wr);
        while let Some(pending) = rx.recv().await {
            let Ok(reply) = pending.await else { break };
            let last = matches!(reply, Reply::Err(_));
            if out.write_all(reply.to_line().as_bytes()).await.is_err() {
                return;
            }
            if (last || rx.is_empty()) && out.flush().await.is_err() {
                return;
            }
            if last {
                break;
            }
        }
        let _ = out.flush().await;
        let _ = out.shutdown().await;
    });

    let ready = |reply: Reply| {
        let (t, r) = oneshot::channel();
        let _ = t.send(reply);
        r
    };
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let mut scanned = 0; // bytes of `buf` known to hold no '\n'
    'conn: loop {
        while let Some(i) = buf[scanned..].iter().position(|&b| b == b'\n') {
            let line = buf.split_to(scanned + i + 1);
            scanned = 0;
            let text = String::from_utf8_lossy(&line[..line.len() - 1]);
            match protocol::parse_line(&text) {
                Ok(Request::Empty) => {}
                Ok(Request::Hit(op)) => {
                    let (t, r) = oneshot::channel();
                    if tx.send(r).await.is_err() {
                        break 'conn;
                    }
                    let divvy = divvy.clone();
                    tokio::spawn(async move {
                        let _ = t.send(divvy.hit(&op).await);
                    });
                }
                Err(e) => {
                    let _ = tx.send(ready(Reply::Err(e))).await;
                    break 'conn;
                }
            }
        }
        scanned = buf.len();
        if buf.len() > settings.max_line_bytes {
            let reason = format!(
                "Line too long: more than {} bytes.",
                settings.max_line_bytes
            );
            let _ = tx
                .send(ready(Reply::Err(ProtoError::Unknown(reason))))
                .await;
            break;
        }
        buf.reserve(8 * 1024);
        let n = tokio::select! {
            r = rd.read_buf(&mut buf) => r,
            () = stop.cancelled() => break,
        };
        match n {
            Ok(0) => {
                // Half-closed: a last line without '\n' is still answered.
                if !buf.is_empty() {
                    let text = String::from_utf8_lossy(&buf).into_owned();
                    match protocol::parse_line(&text) {
                        Ok(Request::Hit(op)) => {
                            let _ = tx.send(ready(divvy.hit(&op).await)).await;
                        }
                        Ok(Request::Empty) => {}
                        Err(e) => {
                            let _ = tx.send(ready(Reply::Err(e))).await;
                        }
                    }
                }
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    drop(tx);
    let _ = writer.await;
}
