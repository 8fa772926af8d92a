//! load: a load generator for the Divvy port (`quotagate divvy-load`).
//!
//! Opens `connections` connections; each sends batches of `depth` pipelined `HIT`s and reads their
//! replies, until `duration` has passed. A share of the hits (`deny_percent`) go to `bench=deny`, the
//! rest to `bench=allow`; with the rule file `scripts/bench-divvy.sh` writes, the first are denied
//! and the others allowed. Latency is measured per hit, from its batch being written to its reply
//! being read. Only for servers you run yourself.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

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
    let (mut allowed, mut denied, mut errors) = (0, 0, 0);
    let mut latencies = Vec::new();
    let mut line = String::new();
    let mut n = index as u64 * 7;
    let mut batch = String::new();
    while Instant::now() < deadline {
        batch.clear();
        for _ in 0..opts.depth {
            n += 1;
            batch.push_str(if n % 100 < opts.deny_percent {
                "HIT bench=deny\n"
            } else {
                "HIT bench=allow\n"
            });
        }
        let sent = Instant::now();
        wr.write_all(batch.as_bytes()).await?;
        for _ in 0..opts.depth {
            line.clear();
            if rd.read_line(&mut line).await? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                ));
            }
            latencies.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
            if line.starts_with("OK true ") {
                allowed += 1;
            } else if line.starts_with("OK false ") {
                denied += 1;
            } else {
                errors += 1;
            }
        }
    }
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
