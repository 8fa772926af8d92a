//! metrics: what the Divvy port counts, with Divvy's names, and optional statsd output.
//!
//! Counters are kept in-process (exposed on the admin endpoint as `divvy_hits_total{status,rule_label}`,
//! `divvy_errors_total{code}`, `divvy_tcp_connections_total`, `divvy_hit_duration_seconds`) and, when
//! `STATSD_HOST` and `STATSD_PORT` are set, also sent to statsd as Divvy does: counters
//! `hit.<status>` and `hit.<status>.<label>`, timer `hit`, gauge `connections`, counters
//! `error.unknown-command` and `error.unknown`, under `STATSD_PREFIX`. Sending never blocks a
//! request: metrics that do not fit the queue are dropped.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// Statuses of an evaluated rule, in Divvy's words.
pub const STATUSES: [&str; 4] = ["accepted", "rejected", "canary-accepted", "canary-rejected"];
/// Upper bounds (seconds) of the hit duration histogram: Divvy's buckets.
pub const DURATION_BUCKETS: [f64; 6] = [0.001, 0.002, 0.005, 0.01, 0.1, 0.5];

/// A statsd client: metrics go through a bounded queue to one sending task.
#[derive(Debug, Clone)]
pub struct Statsd {
    tx: mpsc::Sender<String>,
    prefix: String,
}

impl Statsd {
    /// From Divvy's variables: `STATSD_HOST` and `STATSD_PORT` (both needed), `STATSD_PREFIX`,
    /// `STATSD_USE_TCP` (any non-empty value).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<Statsd> {
        let var = |k: &str| var(k).filter(|v| !v.is_empty());
        let target = format!("{}:{}", var("STATSD_HOST")?, var("STATSD_PORT")?);
        let mut prefix = var("STATSD_PREFIX").unwrap_or_default();
        if !prefix.is_empty() && !prefix.ends_with('.') {
            prefix.push('.');
        }
        Some(Statsd::start(
            target,
            prefix,
            var("STATSD_USE_TCP").is_some(),
        ))
    }

    /// Starts the sender for `target` (`host:port`).
    pub fn start(target: String, prefix: String, tcp: bool) -> Statsd {
        let (tx, mut rx) = mpsc::channel::<String>(10_000);
        tokio::spawn(async move {
            let udp = if tcp {
                None
            } else {
                tokio::net::UdpSocket::bind("0.0.0.0:0").await.ok()
            };
            let mut stream: Option<tokio::net::TcpStream> = None;
            while let Some(metric) = rx.recv().await {
                if let Some(sock) = &udp {
                    let _ = sock.send_to(metric.as_bytes(), &target).await;
                    continue;
                }
                if stream.is_none() {
                    stream = tokio::time::timeout(
                        Duration::from_secs(1),
                        tokio::net::TcpStream::connect(&target),
                    )
                    .await
                    .ok()
                    .and_then(Result::ok);
                }
                if let Some(s) = &mut stream
                    && s.write_all(format!("{metric}\n").as_bytes()).await.is_err()
                {
                    stream = None;
                }
            }
        });
        Statsd { tx, prefix }
    }

    fn send(&self, metric: std::fmt::Arguments<'_>) {
        let _ = self.tx.try_send(format!("{}{metric}", self.prefix));
    }
}

/// The Divvy port's counters.
#[derive(Debug)]
pub struct DivvyMetrics {
    /// Per rule (by index in the rule file), per status.
    hits: Vec<[AtomicU64; 4]>,
    labels: Vec<String>,
    /// `unknown-command`, `unknown`.
    errors: [AtomicU64; 2],
    connections: AtomicI64,
    /// Cumulative counts per bucket of [`DURATION_BUCKETS`], then +Inf.
    durations: [AtomicU64; 7],
    duration_sum_us: AtomicU64,
    statsd: Option<Statsd>,
}

/// A snapshot, for the admin endpoint.
#[derive(Debug, Clone, Default)]
pub struct DivvyCounts {
    /// (status, rule label, count), only non-zero ones.
    pub hits: Vec<(&'static str, String, u64)>,
    pub errors_unknown_command: u64,
    pub errors_unknown: u64,
    pub connections: i64,
    /// Cumulative bucket counts (last is +Inf), sum in seconds.
    pub duration_buckets: [u64; 7],
    pub duration_sum: f64,
}

impl DivvyMetrics {
    /// Counters for rules labelled `labels` (`""` for none), in rule-file order.
    pub fn new(labels: Vec<String>, statsd: Option<Statsd>) -> Self {
        DivvyMetrics {
            hits: labels.iter().map(|_| Default::default()).collect(),
            labels,
            errors: Default::default(),
            connections: AtomicI64::new(0),
            durations: Default::default(),
            duration_sum_us: AtomicU64::new(0),
            statsd,
        }
    }

    pub fn hit(&self, rule: usize, canary: bool, allowed: bool) {
        let status = usize::from(!allowed) + if canary { 2 } else { 0 };
        if let Some(c) = self.hits.get(rule) {
            c[status].fetch_add(1, Ordering::Relaxed);
        }
        if let Some(s) = &self.statsd {
            s.send(format_args!("hit.{}:1|c", STATUSES[status]));
            if let Some(label) = self.labels.get(rule).filter(|l| !l.is_empty()) {
                s.send(format_args!("hit.{}.{label}:1|c", STATUSES[status]));
            }
        }
    }

    pub fn duration(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, le) in DURATION_BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.durations[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.durations[6].fetch_add(1, Ordering::Relaxed);
        self.duration_sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        if let Some(s) = &self.statsd {
            s.send(format_args!("hit:{:.3}|ms", secs * 1000.0));
        }
    }

    /// A protocol error: `unknown-command` or `unknown`.
    pub fn error(&self, unknown_command: bool) {
        self.errors[usize::from(!unknown_command)].fetch_add(1, Ordering::Relaxed);
        if let Some(s) = &self.statsd {
            let code = if unknown_command {
                "unknown-command"
            } else {
                "unknown"
            };
            s.send(format_args!("error.{code}:1|c"));
        }
    }

    pub fn connection(&self, opened: bool) {
        let now = if opened {
            self.connections.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.connections.fetch_sub(1, Ordering::Relaxed) - 1
        };
        if let Some(s) = &self.statsd {
            s.send(format_args!("connections:{now}|g"));
        }
    }

    pub fn counts(&self) -> DivvyCounts {
        let mut hits = Vec::new();
        for (rule, per_status) in self.hits.iter().enumerate() {
            for (i, c) in per_status.iter().enumerate() {
                let n = c.load(Ordering::Relaxed);
                if n > 0 {
                    hits.push((STATUSES[i], self.labels[rule].clone(), n));
                }
            }
        }
        DivvyCounts {
            hits,
            errors_unknown_command: self.errors[0].load(Ordering::Relaxed),
            errors_unknown: self.errors[1].load(Ordering::Relaxed),
            connections: self.connections.load(Ordering::Relaxed),
            duration_buckets: std::array::from_fn(|i| self.durations[i].load(Ordering::Relaxed)),
            duration_sum: self.duration_sum_us.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}
