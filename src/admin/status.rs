//! status: the admin listener's `GET /status`, one JSON document of what the dashboard shows, read
//! from the rendered metrics (one source of truth for numbers) and the live states.
//!
//! Counters are totals since start; a reader computes rates from two reads (the dashboard does).

use serde_json::{Map, Value, json};

use crate::observe::history::{Reading, quantile};

/// One sample of OpenMetrics text: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> &str {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// The samples of OpenMetrics text (comments and malformed lines are skipped).
pub fn parse_samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let Some((name, rest)) = series.split_once('{') else {
        return Some(Sample {
            name: series.to_owned(),
            labels: Vec::new(),
            value,
        });
    };
    let mut labels = Vec::new();
    let mut rest = rest.strip_suffix('}')?;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut v = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => v.push('\n'),
                    c => v.push(c),
                },
                (_, c) => v.push(c),
            }
        };
        labels.push((key.trim_start_matches(',').to_owned(), v));
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Decisions whose requests went upstream (the rest were answered by quotagate).
const FORWARDED: [&str; 4] = ["allowed", "shadow_limited", "unlimited", "store_open"];

/// A sample's `endpoint` label, `(no endpoint)` when none matched.
fn endpoint_of(s: &Sample) -> &str {
    match s.label("endpoint") {
        "" => "(no endpoint)",
        e => e,
    }
}

/// A sample's `le` label as a number (`+Inf` reads as infinity).
fn bound_of(s: &Sample) -> f64 {
    s.label("le").parse().unwrap_or(f64::INFINITY)
}

/// Adds `n` to the bucket of bound `le` in `all` (summing histograms by bound).
fn add_bucket(all: &mut Vec<(f64, f64)>, le: f64, n: f64) {
    match all.iter_mut().find(|(l, _)| *l == le) {
        Some(slot) => slot.1 += n,
        None => all.push((le, n)),
    }
}

/// What requests' decisions come to, as `/status` and the dashboard group them.
pub const OUTCOMES: [&str; 3] = ["allowed", "limited", "rejected"];

/// The index in [`OUTCOMES`] of a `decision` label.
pub fn outcome(decision: &str) -> usize {
    match decision {
        "limited" => 1,
        d if FORWARDED.contains(&d) => 0,
        _ => 2,
    }
}

/// The totals the dashboard's history samples, from the metrics' samples (the store's decisions
/// taken in memory are the caller's to add; here every decision counts as taken in memory, as on
/// the memory store).
pub fn reading(samples: &[Sample], at_ms: u64) -> Reading {
    let mut endpoints: std::collections::BTreeMap<&str, [f64; 3]> = Default::default();
    let mut latency: Vec<(f64, f64)> = Vec::new();
    let mut decided = 0.0;
    for s in samples {
        match s.name.as_str() {
            "quotagate_requests_total" => {
                endpoints.entry(endpoint_of(s)).or_default()[outcome(s.label("decision"))] +=
                    s.value;
            }
            "quotagate_request_duration_seconds_bucket" => {
                add_bucket(&mut latency, bound_of(s), s.value)
            }
            "quotagate_decision_duration_seconds_count" => decided = s.value,
            _ => {}
        }
    }
    latency.sort_by(|x, y| x.0.total_cmp(&y.0));
    Reading {
        at_ms,
        endpoints: endpoints
            .into_iter()
            .map(|(e, c)| (e.to_owned(), c))
            .collect(),
        latency,
        decisions: (decided, decided),
        targets: (0, 0),
    }
}

/// The request, upstream and Divvy parts of `/status`, from the metrics' samples.
pub fn traffic(samples: &[Sample]) -> Value {
    let mut endpoints: Map<String, Value> = Map::new();
    let mut decisions: Map<String, Value> = Map::new();
    let mut classes: Map<String, Value> = Map::new();
    let mut rules: Map<String, Value> = Map::new();
    let mut waits: Map<String, Value> = Map::new();
    let mut waiting = 0.0;
    let mut wait_buckets: Vec<(f64, f64)> = Vec::new();
    // Cumulative latency buckets, per endpoint and over all (summed by bound).
    let mut buckets: std::collections::BTreeMap<String, Vec<(f64, f64)>> = Default::default();
    for s in samples {
        match s.name.as_str() {
            "quotagate_requests_total" => {
                let d = s.label("decision");
                let e = endpoint_of(s);
                add(&mut decisions, d, s.value);
                let entry = endpoints.entry(e).or_insert_with(|| {
                    json!({"name": e, "allowed": 0.0, "limited": 0.0, "rejected": 0.0, "decisions": {}})
                });
                let group = OUTCOMES[outcome(d)];
                entry[group] = json!(entry[group].as_f64().unwrap_or(0.0) + s.value);
                if let Some(m) = entry["decisions"].as_object_mut() {
                    add(m, d, s.value);
                }
            }
            "quotagate_upstream_responses_total" => add(&mut classes, s.label("class"), s.value),
            "quotagate_requests_waiting" => waiting = s.value,
            "quotagate_waits_total" => add(&mut waits, s.label("outcome"), s.value),
            "quotagate_wait_duration_seconds_bucket" => {
                wait_buckets.push((bound_of(s), s.value));
            }
            "quotagate_request_duration_seconds_bucket" => {
                (buckets.entry(endpoint_of(s).to_owned()).or_default())
                    .push((bound_of(s), s.value));
            }
            "divvy_hits_total" => {
                let rule = s.label("rule_label");
                let rule = if rule.is_empty() { "(no label)" } else { rule };
                let entry = rules
                    .entry(rule)
                    .or_insert_with(|| json!({"rule": rule, "statuses": {}}));
                if let Some(m) = entry["statuses"].as_object_mut() {
                    add(m, s.label("status"), s.value);
                }
            }
            _ => {}
        }
    }
    let mut all: Vec<(f64, f64)> = Vec::new();
    for (name, b) in &mut buckets {
        b.sort_by(|x, y| x.0.total_cmp(&y.0));
        for &(le, n) in b.iter() {
            add_bucket(&mut all, le, n);
        }
        if let Some(e) = endpoints.get_mut(name) {
            let q = |p| quantile(b, p).filter(|v| v.is_finite());
            e["latency_seconds"] = json!({"p50": q(0.5), "p99": q(0.99)});
        }
    }
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    wait_buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
    let waited = |p| quantile(&wait_buckets, p).filter(|v| v.is_finite());
    let q = |p| quantile(&all, p).filter(|v| v.is_finite());
    json!({
        "requests": {
            "by_decision": decisions,
            "latency_seconds": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99)},
        },
        "endpoints": endpoints.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
        "upstream": {"responses": classes},
        "waits": {
            "waiting": waiting,
            "by_outcome": waits,
            "wait_seconds": {"p50": waited(0.5), "p99": waited(0.99)},
        },
        "divvy": rules.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
    })
}

fn add(m: &mut Map<String, Value>, key: &str, v: f64) {
    let now = m.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    m.insert(key.to_owned(), json!(now + v));
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP quotagate_requests Requests by decision and endpoint
# TYPE quotagate_requests counter
quotagate_requests_total{decision="allowed",endpoint="GET /users/{id}"} 7
quotagate_requests_total{decision="limited",endpoint="GET /users/{id}"} 2
quotagate_requests_total{decision="missing_key",endpoint=""} 1
quotagate_upstream_responses_total{class="2xx"} 7
quotagate_request_duration_seconds_bucket{endpoint="GET /users/{id}",le="0.001"} 6
quotagate_request_duration_seconds_bucket{endpoint="GET /users/{id}",le="0.01"} 9
quotagate_request_duration_seconds_bucket{endpoint="GET /users/{id}",le="+Inf"} 9
quotagate_request_duration_seconds_bucket{endpoint="",le="0.001"} 0
quotagate_request_duration_seconds_bucket{endpoint="",le="0.01"} 0
quotagate_request_duration_seconds_bucket{endpoint="",le="+Inf"} 1
divvy_hits_total{status="accepted",rule_label="say \"hi\""} 3
quotagate_requests_waiting 2
quotagate_waits_total{outcome="admitted"} 4
quotagate_wait_duration_seconds_bucket{le="0.1"} 3
quotagate_wait_duration_seconds_bucket{le="0.2"} 4
quotagate_wait_duration_seconds_bucket{le="+Inf"} 4
# EOF
"#;

    #[test]
    fn samples_and_their_escaped_labels() {
        let s = parse_samples(TEXT);
        assert_eq!(s.len(), 16);
        assert_eq!(s[0].label("endpoint"), "GET /users/{id}");
        assert_eq!(s[10].label("rule_label"), "say \"hi\"");
        assert_eq!(s[10].value, 3.0);
    }

    #[test]
    fn traffic_groups_decisions_per_endpoint() {
        let t = traffic(&parse_samples(TEXT));
        // Sorted by name: "(no endpoint)" first.
        let users = &t["endpoints"][1];
        assert_eq!(
            (
                &users["name"],
                &users["allowed"],
                &users["limited"],
                &users["rejected"]
            ),
            (
                &json!("GET /users/{id}"),
                &json!(7.0),
                &json!(2.0),
                &json!(0.0)
            )
        );
        assert_eq!(t["endpoints"][0]["rejected"], json!(1.0));
        assert_eq!(users["latency_seconds"]["p50"], json!(0.001));
        assert_eq!(users["latency_seconds"]["p99"], json!(0.01));
        assert_eq!(t["requests"]["latency_seconds"]["p50"], json!(0.001));
        assert_eq!(t["requests"]["latency_seconds"]["p90"], json!(0.01));
        assert_eq!(t["requests"]["latency_seconds"]["p99"], Value::Null);
        assert_eq!(t["upstream"]["responses"]["2xx"], json!(7.0));
        assert_eq!(t["divvy"][0]["statuses"]["accepted"], json!(3.0));
        assert_eq!(t["waits"]["waiting"], json!(2.0));
        assert_eq!(t["waits"]["by_outcome"]["admitted"], json!(4.0));
        assert_eq!(t["waits"]["wait_seconds"]["p50"], json!(0.1));
        assert_eq!(t["waits"]["wait_seconds"]["p99"], json!(0.2));
    }

    #[test]
    fn a_reading_sums_outcomes_per_endpoint_and_latency_over_all() {
        let r = reading(&parse_samples(TEXT), 5);
        assert_eq!(
            r.endpoints,
            [
                ("(no endpoint)".to_owned(), [0.0, 0.0, 1.0]),
                ("GET /users/{id}".to_owned(), [7.0, 2.0, 0.0]),
            ]
        );
        assert_eq!(
            r.latency,
            [(0.001, 6.0), (0.01, 9.0), (f64::INFINITY, 10.0)]
        );
    }
}
