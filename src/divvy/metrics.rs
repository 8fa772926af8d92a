//! metrics: what the Divvy port counts, with Divvy's names, and optional statsd output.
//!
//! Counters are kept in-process (exposed on the admin endpoint as `divvy_hits_total{status,rule_label}`,
//! `divvy_errors_total{code}`, `divvy_tcp_connections_total`, `divvy_hit_duration_seconds`) and, when
//! `STATSD_HOST` and `STATSD_PORT` are set, also sent to statsd as Divvy does: counters
//! `hit.<status>` and `hit.<status>.<label>`, timer `hit`, gauge `connections`, counters
//! `error.unknown-command` and `error.unknown`, under `STATSD_PREFIX`. Sending never blocks a
//! request: metrics that do not fit the queue are dropped.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// Statuses of an evaluated rule, in Divvy's words.
pub const STATUSES: [&str; 4] = ["accepted", "rejected", "canary-accepted", "canary-rejected"];
/// Upper bounds (seconds) of the hit duration histogram: Divvy's buckets.
pub const DURATION_BUCKETS: [f64; 6] = [0.001, 0.002, 0.005, 0.01, 0.1, 0.5];

/// Where statsd metrics go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsdSettings {
    /// `host:port`.
    pub target: String,
    /// Prepended to every metric name, ending with `.` when not empty.
    pub prefix: String,
    pub tcp: bool,
}

impl StatsdSettings {
    /// From Divvy's variables: `STATSD_HOST` and `STATSD_PORT` (both needed), `STATSD_PREFIX`,
    /// `STATSD_USE_TCP` (any non-empty value).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<StatsdSettings> {
        let var = |k: &str| var(k).filter(|v| !v.is_empty());
        let target = format!("{}:{}", var("STATSD_HOST")?, var("STATSD_PORT")?);
        let mut prefix = var("STATSD_PREFIX").unwrap_or_default();
        if !prefix.is_empty() && !prefix.ends_with('.') {
            prefix.push('.');
        }
        Some(StatsdSettings {
            target,
            prefix,
            tcp: var("STATSD_USE_TCP").is_some(),
        })
    }
}

/// A statsd client: metrics go through a bounded queue to one sending task.
#[derive(Debug, Clone)]
pub struct Statsd {
    tx: mpsc::Sender<String>,
    prefix: String,
}

impl Statsd {
    /// From Divvy's variables (see [`StatsdSettings::from_env`]); `None` when they are not set.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<Statsd> {
        StatsdSettings::from_env(var).map(|s| Statsd::start(s.target, s.prefix, s.tcp))
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HitLabels {
    pub status: &'static str,
    pub rule_label: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub code: &'static str,
}

/// The Divvy port's counters, with Divvy's Prometheus names.
#[derive(Debug)]
pub struct DivvyMetrics {
    hits_family: Family<HitLabels, Counter>,
    /// Per rule (by index in the rule file), per status: handles into `hits_family`, resolved once
    /// so a hit costs no label hashing.
    hits: Vec<[Counter; 4]>,
    labels: Vec<String>,
    errors_family: Family<CodeLabels, Counter>,
    /// `unknown-command`, `unknown`.
    errors: [Counter; 2],
    connections: Gauge,
    durations: Histogram,
    statsd: Option<Statsd>,
}

impl DivvyMetrics {
    /// Counters for rules labelled `labels` (`""` for none), in rule-file order.
    pub fn new(labels: Vec<String>, statsd: Option<Statsd>) -> Self {
        let hits_family: Family<HitLabels, Counter> = Family::default();
        let hits = labels
            .iter()
            .map(|l| {
                std::array::from_fn(|i| {
                    hits_family.get_or_create_owned(&HitLabels {
                        status: STATUSES[i],
                        rule_label: l.clone(),
                    })
                })
            })
            .collect();
        let errors_family: Family<CodeLabels, Counter> = Family::default();
        let errors = [
            errors_family.get_or_create_owned(&CodeLabels {
                code: "unknown-command",
            }),
            errors_family.get_or_create_owned(&CodeLabels { code: "unknown" }),
        ];
        DivvyMetrics {
            hits_family,
            hits,
            labels,
            errors_family,
            errors,
            connections: Gauge::default(),
            durations: Histogram::new(DURATION_BUCKETS),
            statsd,
        }
    }

    /// Registers the metrics under Divvy's names.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "divvy_hits",
            "Evaluated Divvy rules by status and rule label",
            self.hits_family.clone(),
        );
        registry.register(
            "divvy_errors",
            "Divvy protocol errors by code",
            self.errors_family.clone(),
        );
        registry.register(
            "divvy_tcp_connections_total",
            "Open Divvy connections",
            self.connections.clone(),
        );
        registry.register(
            "divvy_hit_duration_seconds",
            "Time to answer a HIT",
            self.durations.clone(),
        );
    }

    pub fn hit(&self, rule: usize, canary: bool, allowed: bool) {
        let status = usize::from(!allowed) + if canary { 2 } else { 0 };
        if let Some(c) = self.hits.get(rule) {
            c[status].inc();
        }
        if let Some(s) = &self.statsd {
            s.send(format_args!("hit.{}:1|c", STATUSES[status]));
            if let Some(label) = self.labels.get(rule).filter(|l| !l.is_empty()) {
                s.send(format_args!("hit.{}.{label}:1|c", STATUSES[status]));
            }
        }
    }

    pub fn duration(&self, d: Duration) {
        self.durations.observe(d.as_secs_f64());
        if let Some(s) = &self.statsd {
            s.send(format_args!("hit:{:.3}|ms", d.as_secs_f64() * 1000.0));
        }
    }

    /// A protocol error: `unknown-command` or `unknown`.
    pub fn error(&self, unknown_command: bool) {
        self.errors[usize::from(!unknown_command)].inc();
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
            self.connections.inc() + 1
        } else {
            self.connections.dec() - 1
        };
        if let Some(s) = &self.statsd {
            s.send(format_args!("connections:{now}|g"));
        }
    }
}
