//! history: what the dashboard plots: the gateway's last 15 minutes, one point every 2 seconds,
//! each point the rates between two readings of its totals. Memory is bounded: [`POINTS`] points of
//! at most [`NAMED_ENDPOINTS`] + 1 endpoints each (about 400 kB at most, 30 kB for a catalog of a
//! few endpoints).

use std::collections::{HashMap, VecDeque};

use serde_json::{Value, json};

/// Between two points, in milliseconds.
pub const INTERVAL_MS: u64 = 2_000;
/// Points kept: 15 minutes.
pub const POINTS: usize = 450;
/// Endpoints plotted by name; traffic of any other is summed under [`OTHER`].
pub const NAMED_ENDPOINTS: usize = 50;
/// The name of the endpoints past the first [`NAMED_ENDPOINTS`].
pub const OTHER: &str = "(other endpoints)";

/// The value below which a share `q` of a histogram's observations fall, from its cumulative
/// `(upper bound, count)` buckets (the bound of the bucket that holds it).
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, n)| *n >= q * total)
        .map(|(le, _)| *le)
}

/// The gateway's totals since start, read at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// Wall-clock time of the reading (ms since the Unix epoch).
    pub at_ms: u64,
    /// Requests per endpoint name, as `[allowed, limited, rejected]`.
    pub endpoints: Vec<(String, [f64; 3])>,
    /// Latency of all requests: cumulative `(upper bound, count)` buckets.
    pub latency: Vec<(f64, f64)>,
    /// Limit decisions taken in memory, and all limit decisions.
    pub decisions: (f64, f64),
    /// Upstream targets up now, and all targets.
    pub targets: (usize, usize),
}

/// What happened between two readings, per second.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub at_ms: u64,
    /// Requests per second: allowed (forwarded), limited (429), rejected (any other answer).
    pub rates: [f32; 3],
    /// The same per endpoint with traffic, by index in the history's names.
    pub endpoints: Vec<(u16, [f32; 3])>,
    /// The 99th percentile of the interval's latency (a bucket bound); `None` without requests.
    pub p99_seconds: Option<f32>,
    /// The share of the interval's limit decisions taken in memory; `None` without decisions.
    pub local_share: Option<f32>,
    pub targets_up: u16,
    pub targets: u16,
}

/// The last [`POINTS`] points.
#[derive(Debug, Default)]
pub struct History {
    names: Vec<String>,
    index: HashMap<String, u16>,
    points: VecDeque<Point>,
    last: Option<Reading>,
}

impl History {
    /// Adds the point between the previous reading and `r` (the first reading only starts).
    pub fn record(&mut self, r: Reading) {
        if let Some(prev) = self.last.take()
            && r.at_ms > prev.at_ms
        {
            let point = self.point(&prev, &r);
            if self.points.len() == POINTS {
                self.points.pop_front();
            }
            self.points.push_back(point);
        }
        self.last = Some(r);
    }

    fn point(&mut self, prev: &Reading, r: &Reading) -> Point {
        let seconds = (r.at_ms - prev.at_ms) as f64 / 1000.0;
        let before: HashMap<&str, &[f64; 3]> = prev
            .endpoints
            .iter()
            .map(|(n, c)| (n.as_str(), c))
            .collect();
        let mut rates = [0.0f64; 3];
        let mut endpoints: Vec<(u16, [f32; 3])> = Vec::new();
        for (name, now) in &r.endpoints {
            let then = before.get(name.as_str()).copied().unwrap_or(&[0.0; 3]);
            let delta: [f64; 3] = std::array::from_fn(|i| (now[i] - then[i]).max(0.0));
            if delta.iter().all(|d| *d == 0.0) {
                continue;
            }
            let i = self.name_index(name);
            let per_second = delta.map(|d| (d / seconds) as f32);
            match endpoints.iter_mut().find(|(j, _)| *j == i) {
                Some((_, sum)) => (0..3).for_each(|k| sum[k] += per_second[k]),
                None => endpoints.push((i, per_second)),
            }
            (0..3).for_each(|k| rates[k] += delta[k]);
        }
        let latency: Vec<(f64, f64)> = match prev.latency.len() == r.latency.len() {
            true => (r.latency.iter().zip(&prev.latency))
                .map(|((le, n), (_, m))| (*le, (n - m).max(0.0)))
                .collect(),
            false => r.latency.clone(),
        };
        let (local, all) = (
            r.decisions.0 - prev.decisions.0,
            r.decisions.1 - prev.decisions.1,
        );
        Point {
            at_ms: r.at_ms,
            rates: rates.map(|n| (n / seconds) as f32),
            endpoints,
            p99_seconds: quantile(&latency, 0.99)
                .filter(|v| v.is_finite())
                .map(|v| v as f32),
            local_share: (all > 0.0).then(|| (local / all).clamp(0.0, 1.0) as f32),
            targets_up: r.targets.0.min(u16::MAX as usize) as u16,
            targets: r.targets.1.min(u16::MAX as usize) as u16,
        }
    }

    fn name_index(&mut self, name: &str) -> u16 {
        if let Some(i) = self.index.get(name) {
            return *i;
        }
        let name = match self.names.len() < NAMED_ENDPOINTS {
            true => name,
            false => OTHER,
        };
        if let Some(i) = self.index.get(name) {
            return *i;
        }
        let i = self.names.len() as u16;
        self.names.push(name.to_owned());
        self.index.insert(name.to_owned(), i);
        i
    }

    /// `GET /status/history`: the points after `since_ms` (0: all), with the endpoints' names.
    pub fn to_json(&self, since_ms: u64) -> Value {
        let points: Vec<Value> = self
            .points
            .iter()
            .filter(|p| p.at_ms > since_ms)
            .map(|p| {
                json!({
                    "t": p.at_ms,
                    "allowed": plain(p.rates[0]),
                    "limited": plain(p.rates[1]),
                    "rejected": plain(p.rates[2]),
                    "by_endpoint": p.endpoints.iter()
                        .map(|(i, r)| json!([i, plain(r[0]), plain(r[1]), plain(r[2])]))
                        .collect::<Vec<_>>(),
                    "p99_seconds": p.p99_seconds.map(plain),
                    "local_share": p.local_share.map(plain),
                    "targets_up": p.targets_up,
                    "targets": p.targets,
                })
            })
            .collect();
        json!({
            "interval_seconds": INTERVAL_MS / 1000,
            "points_kept": POINTS,
            "endpoints": self.names,
            "points": points,
        })
    }
}

/// `v` as the f64 its shortest decimal form reads as (0.0064, not 0.006399999838322401).
fn plain(v: f32) -> f64 {
    v.to_string().parse().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(at_ms: u64, users: [f64; 3], fast: f64, slow: f64, decided: (f64, f64)) -> Reading {
        Reading {
            at_ms,
            endpoints: vec![("GET /users/{id}".into(), users)],
            latency: vec![
                (0.001, fast),
                (0.1, fast + slow),
                (f64::INFINITY, fast + slow),
            ],
            decisions: decided,
            targets: (1, 2),
        }
    }

    #[test]
    fn points_are_rates_between_readings() {
        let mut h = History::default();
        h.record(reading(10_000, [4.0, 0.0, 0.0], 4.0, 0.0, (0.0, 4.0)));
        assert_eq!(
            h.to_json(0)["points"],
            json!([]),
            "one reading has no rate yet"
        );
        h.record(reading(12_000, [24.0, 6.0, 2.0], 30.0, 2.0, (12.0, 36.0)));
        let p = &h.points[0];
        assert_eq!(p.rates, [10.0, 3.0, 1.0]);
        assert_eq!(p.endpoints, [(0, [10.0, 3.0, 1.0])]);
        // 26 fast and 2 slow requests in the interval: 2/28 > 1%, so p99 is the slow bucket.
        assert_eq!(p.p99_seconds, Some(0.1));
        assert_eq!(p.local_share, Some(12.0 / 32.0));
        assert_eq!((p.targets_up, p.targets), (1, 2));
        let j = h.to_json(0);
        assert_eq!(j["endpoints"], json!(["GET /users/{id}"]));
        assert_eq!(j["points"][0]["by_endpoint"], json!([[0, 10.0, 3.0, 1.0]]));
        assert_eq!(
            h.to_json(12_000)["points"],
            json!([]),
            "nothing after the last"
        );
        // A quiet interval: no endpoint listed, no latency, no decisions.
        h.record(reading(14_000, [24.0, 6.0, 2.0], 30.0, 2.0, (12.0, 36.0)));
        let quiet = &h.points[1];
        assert_eq!(
            (&quiet.endpoints, quiet.p99_seconds, quiet.local_share),
            (&vec![], None, None)
        );
    }

    #[test]
    fn memory_is_bounded_in_points_and_names() {
        let mut h = History::default();
        for i in 0..(POINTS as u64 + 20) {
            let n = i as f64;
            h.record(Reading {
                at_ms: i * INTERVAL_MS,
                endpoints: (0..NAMED_ENDPOINTS + 30)
                    .map(|e| (format!("GET /e{e}"), [n, 0.0, 0.0]))
                    .collect(),
                ..Reading::default()
            });
        }
        assert_eq!(h.points.len(), POINTS);
        assert_eq!(h.names.len(), NAMED_ENDPOINTS + 1);
        assert_eq!(h.names[NAMED_ENDPOINTS], OTHER);
        // The 30 endpoints past the named ones are summed under OTHER.
        let last = h.points.back().unwrap();
        assert_eq!(last.endpoints.len(), NAMED_ENDPOINTS + 1);
        assert_eq!(last.endpoints[NAMED_ENDPOINTS], (50, [15.0, 0.0, 0.0]));
    }
}
