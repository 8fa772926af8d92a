//! load: a load generator for the Divvy port (`quotagate divvy-load`).
//!
//! Opens `connections` connections; each keeps `depth` pipelined `HIT`s in flight (a new one
//! whenever a reply comes back) until `duration` has passed. A share of the hits (`deny_percent`) go to `bench=deny`, the
//! rest to `bench=allow`; with the rule file `scripts/bench-divvy.sh` writes, the first are denied
//! and the others allowed. Latency is measured per hit, from its being written to its reply being
//! read. Only for servers you run yourself.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// What to send.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub addr: SocketAddr,
    pub connections: usize,
    pub depth: usize,
    pub duration: Duration,
    pub deny_percent: u64,
}

/// What happened.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub hits: u64,
    pub allowed: u64,
    pub denied: u64,
    pub errors: u64,
    pub elapsed: Duration,
    /// Latency percentiles in microseconds: p50, p99, p99.9.
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
}

impl LoadReport {
    pub fn hits_per_second(&self) -> f64 {
        self.hits as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

async fn one_connection(
    opts: LoadOptions,
    index: usize,
    deadline: Instant,
) -> std::io::Result<(Vec<u32>, u64, u64, u64)> {
    let stream = TcpStream::connect(opts.addr).await?;
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    // A window of `depth` hits in flight: a new one is sent as soon as a reply frees a place, as a
    // pipelining client does. (Sending batches and waiting for every reply of a batch would
    // measure the server's Nagle and the client's delayed ACKs as much as the server.)
    let depth = u32::try_from(opts.depth.max(1)).unwrap_or(u32::MAX);
    let window = Semaphore::new(depth as usize);
    let sent_at: Mutex<VecDeque<Instant>> = Mutex::new(VecDeque::new());
    let writer = async {
        let mut n = index as u64 * 7;
        let mut batch = String::new();
        while Instant::now() < deadline {
            let Ok(first) = window.acquire().await else {
                break;
            };
            first.forget();
            let mut k = 1;
            while let Ok(p) = window.try_acquire() {
                p.forget();
                k += 1;
            }
            batch.clear();
            for _ in 0..k {
                n += 1;
                batch.push_str(if n % 100 < opts.deny_percent {
                    "HIT bench=deny\n"
                } else {
                    "HIT bench=allow\n"
                });
            }
            let now = Instant::now();
            sent_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(std::iter::repeat_n(now, k));
            wr.write_all(batch.as_bytes()).await?;
        }
        // Done when every hit in flight has its reply (all places of the window are back).
        let _ = window.acquire_many(depth).await;
        Ok::<(), std::io::Error>(())
    };
    // allowed, denied, errors, latencies: the reader writes, the result reads when both stop.
    let stats = Mutex::new((0u64, 0u64, 0u64, Vec::new()));
    let reader = async {
        let mut line = String::new();
        loop {
            line.clear();
            if rd.read_line(&mut line).await? == 0 {
                return Err::<(), _>(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                ));
            }
            let sent = sent_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            let mut st = stats.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(sent) = sent {
                st.3.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
            }
            if line.starts_with("OK true ") {
                st.0 += 1;
            } else if line.starts_with("OK false ") {
                st.1 += 1;
            } else {
                st.2 += 1;
            }
            drop(st);
            window.add_permits(1);
        }
    };
    tokio::select! {
        r = reader => r?,
        w = writer => w?,
    }
    let (allowed, denied, errors, latencies) =
        stats.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok((latencies, allowed, denied, errors))
}

/// Runs the load and reports.
pub async fn run(opts: LoadOptions) -> std::io::Result<LoadReport> {
    let started = Instant::now();
    let deadline = started + opts.duration;
    let tasks: Vec<_> = (0..opts.connections)
        .map(|i| tokio::spawn(one_connection(opts.clone(), i, deadline)))
        .collect();
    let mut report = LoadReport::default();
    let mut all = Vec::new();
    for t in tasks {
        let (lat, a, d, e) = t.await.map_err(std::io::Error::other)??;
        all.extend(lat);
        report.allowed += a;
        report.denied += d;
        report.errors += e;
    }
    report.elapsed = started.elapsed();
    report.hits = all.len() as u64;
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as u64
    };
    report.p50_us = pct(0.50);
    report.p99_us = pct(0.99);
    report.p999_us = pct(0.999);
    Ok(report)
}
