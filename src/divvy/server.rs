//! server: the Divvy TCP port.
//!
//! Each connection frames lines and starts each request at once: requests overlap (a slow store call
//! does not hold up the ones behind it), are executed in request order, and are answered strictly
//! in request order. At most `max_in_flight` requests per connection are pending: a client that
//! does not read its replies stops being read, so its memory stays bounded and other connections
//! are unaffected. After an
//! `ERR` reply the connection closes and later lines are not executed. A line longer than
//! `max_line_bytes` is answered with an `ERR` as soon as it passes the limit, without buffering it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::BytesMut;
use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::Divvy;
use super::protocol::{self, ProtoError, Reply, Request};
use crate::config::{ConfigError, DivvyConfig};
use crate::server::workers::{self, Workers};
use quotagate_store::Sequence;

/// Limits of the Divvy port's connections.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Longest request line in bytes. Default: 1 MiB.
    pub max_line_bytes: usize,
    /// Open connections at most; more wait in the kernel's accept queue. Default: 10000.
    pub max_connections: usize,
    /// Requests per connection whose replies are not yet written, at most. Default: 1024.
    pub max_in_flight: usize,
}

/// The defaults are `[divvy]`'s, written once in `config/mod.rs`.
impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits::try_from(&DivvyConfig::default()).expect("the [divvy] defaults are valid")
    }
}

impl TryFrom<&DivvyConfig> for ConnectionLimits {
    type Error = ConfigError;

    /// The port's limits (`[divvy]`).
    fn try_from(c: &DivvyConfig) -> Result<Self, ConfigError> {
        if c.max_line_bytes < 1024 || c.max_connections == 0 || c.max_in_flight == 0 {
            return Err(ConfigError::general(
                "divvy.max_line_bytes must be at least 1024, and divvy.max_connections and divvy.max_in_flight at least 1",
            ));
        }
        Ok(ConnectionLimits {
            max_line_bytes: c.max_line_bytes,
            max_connections: c.max_connections,
            max_in_flight: c.max_in_flight,
        })
    }
}

/// Serves the Divvy protocol on `listener` until `shutdown`; open connections then stop reading,
/// send the replies they owe, and close.
pub async fn serve(
    listener: TcpListener,
    divvy: Arc<Divvy>,
    settings: ConnectionLimits,
    workers: Option<Arc<Workers>>,
    shutdown: impl Future<Output = ()>,
) {
    let stop = CancellationToken::new();
    let max_connections = settings.max_connections;
    let settings = Arc::new(settings);
    // Each worker accepts its own connections, and a connection's hits use that worker's Redis
    // connection: no request of the connection crosses threads.
    let serve_one = {
        let stop = stop.clone();
        move |stream: std::net::TcpStream, _, permit| {
            let (divvy, settings, stop) = (divvy.clone(), settings.clone(), stop.clone());
            async move {
                // A Divvy client keeps its connection: registered at once.
                match TcpStream::from_std(stream) {
                    Ok(stream) => connection(stream, divvy, &settings, stop).await,
                    Err(e) => tracing::warn!(error = %e, "cannot serve a Divvy connection"),
                }
                drop(permit);
            }
        }
    };
    workers::accept(
        listener,
        workers.as_deref(),
        max_connections,
        shutdown,
        serve_one,
    )
    .await;
    stop.cancel();
}

type Pending = Pin<Box<dyn Future<Output = Reply> + Send>>;

fn ready(reply: Reply) -> Pending {
    Box::pin(std::future::ready(reply))
}

/// One connection, driven by one task. Each request's future is pushed in request order and first
/// polled in that order, so its store command is queued (to Redis, on the shared multiplexed
/// connection) in request order and executed in that order, while the requests still overlap;
/// `FuturesOrdered` hands the replies back in request order. A Redis Cluster connection does not
/// keep its commands in order, and with leases a hit may be decided in memory while an earlier one
/// is on its way to Redis, so there a connection's hits run one after another (a fair lock, taken
/// in request order): pipelining then saves the client round trips, not Redis ones.
async fn connection(
    stream: TcpStream,
    divvy: Arc<Divvy>,
    settings: &ConnectionLimits,
    stop: CancellationToken,
) {
    divvy.metrics.connection(true);
    serve_connection(stream, &divvy, settings, stop).await;
    divvy.metrics.connection(false);
}

async fn serve_connection(
    stream: TcpStream,
    divvy: &Arc<Divvy>,
    settings: &ConnectionLimits,
    stop: CancellationToken,
) {
    let (mut rd, wr) = stream.into_split();
    let mut out = BufWriter::new(wr);
    let mut pending: FuturesOrdered<Pending> = FuturesOrdered::new();
    let sequence = divvy.store.sequence();
    let request = |divvy: &Arc<Divvy>, text: &str| request(divvy, text, &sequence);
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let mut scanned = 0; // bytes at the start of `buf` known to hold no '\n'
    let mut reading = true; // false after EOF, an error, or shutdown: only replies are left to send
    loop {
        // Turn complete lines into requests, as long as there is room in flight.
        while reading && pending.len() < settings.max_in_flight {
            let Some(i) = buf[scanned..].iter().position(|&b| b == b'\n') else {
                scanned = buf.len();
                if buf.len() > settings.max_line_bytes {
                    let reason = format!(
                        "Line too long: more than {} bytes.",
                        settings.max_line_bytes
                    );
                    divvy.metrics.error(false);
                    pending.push_back(ready(Reply::Err(ProtoError::Unknown(reason))));
                    reading = false;
                }
                break;
            };
            let line = buf.split_to(scanned + i + 1);
            scanned = 0;
            let text = String::from_utf8_lossy(&line[..line.len() - 1]);
            if let Some(request) = request(divvy, &text) {
                reading = !matches!(request.1, Kind::Error);
                pending.push_back(request.0);
            }
        }
        if !reading && pending.is_empty() {
            break;
        }
        let may_read = reading && pending.len() < settings.max_in_flight;
        if may_read {
            buf.reserve(8 * 1024);
        }
        tokio::select! {
            r = rd.read_buf(&mut buf), if may_read => match r {
                Ok(0) => {
                    // Half-closed: a last line without '\n' is still answered.
                    reading = false;
                    if !buf.is_empty() {
                        let text = String::from_utf8_lossy(&buf).into_owned();
                        if let Some(request) = request(divvy, &text) {
                            pending.push_back(request.0);
                        }
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            },
            Some(reply) = pending.next(), if !pending.is_empty() => {
                let last = matches!(reply, Reply::Err(_));
                if out.write_all(reply.to_line().as_bytes()).await.is_err() {
                    return;
                }
                if last {
                    break;
                }
                if pending.is_empty() && out.flush().await.is_err() {
                    return;
                }
            }
            () = stop.cancelled(), if reading => reading = false,
        }
    }
    let _ = out.flush().await;
    let _ = out.shutdown().await;
}

enum Kind {
    Hit,
    Error,
}

/// The future answering one line, or `None` for an empty line. The hit applies after the
/// connection's earlier hits (`sequence`).
fn request(divvy: &Arc<Divvy>, text: &str, sequence: &Sequence) -> Option<(Pending, Kind)> {
    match protocol::parse_line(text) {
        Ok(Request::Empty) => None,
        Ok(Request::Hit(op)) => {
            let divvy = divvy.clone();
            let turn = sequence.turn();
            Some((
                Box::pin(async move {
                    let _turn = turn.await;
                    divvy.hit(&op).await
                }),
                Kind::Hit,
            ))
        }
        Err(e) => {
            divvy
                .metrics
                .error(matches!(e, ProtoError::UnknownCommand(_)));
            Some((ready(Reply::Err(e)), Kind::Error))
        }
    }
}
