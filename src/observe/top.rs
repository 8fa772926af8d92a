//! top: the API keys refused most over the last 15 minutes, in memory that does not grow with the
//! number of keys (`/status` `top_limited`, the dashboard).
//!
//! One Space-Saving sketch (Metwally, Agrawal, El Abbadi, 2005) of [`CAPACITY`] entries per minute,
//! the last [`MINUTES`] kept. A sketch counts exactly until it holds `CAPACITY` keys; then a new key
//! takes the place of the least counted one and inherits its count (so counts only ever err
//! upwards, by at most that inherited count). Summed over the minutes, a key's estimate is its
//! count in each minute, or that minute's least count when the minute is full and the key not in it
//! (it may have been evicted), or 0: never under the true number, over by at most the sum of the
//! inherited counts ([`Limited::over_by_at_most`]), itself at most the refusals of the window
//! divided by `CAPACITY`.
//!
//! Keys are held as a 64-bit hash (their identity here, seeded per process) and the 48 bits of
//! their log fingerprint ([`crate::observe::telemetry::fingerprint_bits`], taken when a key enters a
//! minute's sketch, not per refusal), never as themselves.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Mutex;

type Hasher = foldhash::fast::RandomState;

/// Keys counted per minute before the least counted ones are replaced.
pub const CAPACITY: usize = 1000;
/// Minutes kept: the window is the current minute and the 14 before it (14 to 15 minutes).
pub const MINUTES: u64 = 15;
/// Entries `/status` lists at most.
pub const SHOWN: usize = 20;

const MINUTE_MS: u64 = 60_000;

/// One key's estimate over the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    /// The key's fingerprint bits ([`crate::observe::telemetry::fingerprint_of`] shows them).
    pub key: u64,
    /// Refusals counted: never fewer than the true number.
    pub limited: u64,
    /// How far `limited` may be above the true number.
    pub over_by_at_most: u64,
    /// The endpoint of its latest refusal.
    pub endpoint: String,
}

/// The refused keys of the last [`MINUTES`] minutes, shared by the request path (one short lock
/// per refusal) and `/status`.
#[derive(Debug, Default)]
pub struct TopLimited {
    minutes: Mutex<VecDeque<(u64, Sketch)>>,
    ids: Hasher,
}

impl TopLimited {
    /// Counts one refusal of `key` (the API key as sent) on `endpoint` at `now_ms`.
    pub fn count(&self, now_ms: u64, key: &[u8], endpoint: &str) {
        let id = self.ids.hash_one(key);
        self.count_id(now_ms, id, endpoint, || {
            crate::observe::telemetry::fingerprint_bits(key)
        });
    }

    fn count_id(&self, now_ms: u64, id: u64, endpoint: &str, fingerprint: impl FnOnce() -> u64) {
        let minute = now_ms / MINUTE_MS;
        let mut minutes = self.minutes.lock().unwrap_or_else(|e| e.into_inner());
        if minutes.back().is_none_or(|(m, _)| *m < minute) {
            while minutes.front().is_some_and(|(m, _)| *m + MINUTES <= minute) {
                minutes.pop_front();
            }
            minutes.push_back((minute, Sketch::default()));
        }
        // A clock read before another thread's later one lands in the newest minute.
        if let Some((_, sketch)) = minutes.back_mut() {
            sketch.count(id, endpoint, fingerprint);
        }
    }

    /// The `n` keys refused most in the window that ends at `now_ms`, most first (ties by key).
    pub fn top(&self, now_ms: u64, n: usize) -> Vec<Limited> {
        let minute = now_ms / MINUTE_MS;
        let minutes = self.minutes.lock().unwrap_or_else(|e| e.into_inner());
        let live: Vec<&Sketch> = minutes
            .iter()
            .filter(|(m, _)| *m + MINUTES > minute && *m <= minute)
            .map(|(_, s)| s)
            .collect();
        let mut all: HashMap<u64, Limited> = HashMap::new();
        // Newest first, so a key's endpoint is that of its latest refusal.
        for s in live.iter().rev() {
            for e in &s.heap {
                all.entry(e.id).or_insert_with(|| Limited {
                    key: e.fingerprint,
                    limited: 0,
                    over_by_at_most: 0,
                    endpoint: e.endpoint.to_string(),
                });
            }
        }
        for (id, l) in all.iter_mut() {
            for s in &live {
                match s.at.get(id) {
                    Some(&i) => {
                        l.limited += s.heap[i].count;
                        l.over_by_at_most += s.heap[i].inherited;
                    }
                    None => {
                        let floor = s.floor();
                        l.limited += floor;
                        l.over_by_at_most += floor;
                    }
                }
            }
        }
        let mut all: Vec<Limited> = all.into_values().collect();
        all.sort_by(|a, b| b.limited.cmp(&a.limited).then(a.key.cmp(&b.key)));
        all.truncate(n);
        all
    }
}

#[derive(Debug)]
struct Entry {
    id: u64,
    fingerprint: u64,
    count: u64,
    /// The count it took over from the key it replaced (0: counted exactly).
    inherited: u64,
    endpoint: Box<str>,
}

/// A Space-Saving sketch: a min-heap on `count` with each key's place in it.
#[derive(Debug, Default)]
struct Sketch {
    heap: Vec<Entry>,
    at: HashMap<u64, usize, Hasher>,
}

impl Sketch {
    fn count(&mut self, id: u64, endpoint: &str, fingerprint: impl FnOnce() -> u64) {
        let i = match self.at.get(&id) {
            Some(&i) => {
                self.heap[i].count += 1;
                i
            }
            None if self.heap.len() < CAPACITY => {
                self.heap.push(Entry {
                    id,
                    fingerprint: fingerprint(),
                    count: 1,
                    inherited: 0,
                    endpoint: endpoint.into(),
                });
                let i = self.heap.len() - 1;
                self.at.insert(id, i);
                // A count of 1 is the least there is: it stays a leaf below equal counts.
                self.sift_up(i);
                return;
            }
            None => {
                let least = &mut self.heap[0];
                self.at.remove(&least.id);
                least.id = id;
                least.fingerprint = fingerprint();
                least.inherited = least.count;
                least.count += 1;
                self.at.insert(id, 0);
                0
            }
        };
        if *self.heap[i].endpoint != *endpoint {
            self.heap[i].endpoint = endpoint.into();
        }
        self.sift_down(i);
    }

    /// What a key not held may have had: the least count once the sketch is full, else 0.
    fn floor(&self) -> u64 {
        match self.heap.len() < CAPACITY {
            true => 0,
            false => self.heap.first().map_or(0, |e| e.count),
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[parent].count <= self.heap[i].count {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut least = i;
            if l < self.heap.len() && self.heap[l].count < self.heap[least].count {
                least = l;
            }
            if r < self.heap.len() && self.heap[r].count < self.heap[least].count {
                least = r;
            }
            if least == i {
                return;
            }
            self.swap(i, least);
            i = least;
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.at.insert(self.heap[a].id, a);
        self.at.insert(self.heap[b].id, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_800_000_000_000;

    #[test]
    fn few_keys_are_counted_exactly_with_their_latest_endpoint() {
        let top = TopLimited::default();
        for _ in 0..3 {
            top.count_id(T0, 7, "GET /a", || 7);
        }
        top.count_id(T0, 9, "GET /a", || 9);
        top.count_id(T0 + 1000, 7, "GET /b", || 7);
        let got = top.top(T0 + 1000, SHOWN);
        assert_eq!(
            got,
            [
                Limited {
                    key: 7,
                    limited: 4,
                    over_by_at_most: 0,
                    endpoint: "GET /b".into()
                },
                Limited {
                    key: 9,
                    limited: 1,
                    over_by_at_most: 0,
                    endpoint: "GET /a".into()
                },
            ]
        );
    }

    #[test]
    fn keys_are_shown_by_their_fingerprint() {
        let top = TopLimited::default();
        top.count(T0, b"demo-key", "GET /a");
        top.count(T0, b"demo-key", "GET /a");
        let got = top.top(T0, SHOWN);
        assert_eq!(got.len(), 1);
        assert_eq!(
            crate::observe::telemetry::fingerprint_of(got[0].key),
            crate::observe::telemetry::fingerprint(b"demo-key")
        );
        assert_eq!(got[0].limited, 2);
    }

    #[test]
    fn minutes_older_than_the_window_are_forgotten() {
        let top = TopLimited::default();
        top.count_id(T0, 1, "e", || 1);
        top.count_id(T0 + 60_000, 2, "e", || 2);
        let later = T0 + (MINUTES - 1) * 60_000;
        assert_eq!(
            top.top(later, SHOWN).len(),
            2,
            "the 15th minute still counts"
        );
        let gone = top.top(later + 60_000, SHOWN);
        assert_eq!(gone.iter().map(|l| l.key).collect::<Vec<_>>(), [2]);
        // Counting drops them for good: the memory is that of MINUTES sketches at most.
        for m in 0..3 * MINUTES {
            top.count_id(T0 + m * 60_000, m, "e", || m);
        }
        assert_eq!(top.minutes.lock().unwrap().len(), MINUTES as usize);
    }

    /// The property: on skewed streams of many more keys than the sketch holds, over several
    /// minutes, every key's estimate is at least its true count and at most the true count plus
    /// the stated bound, the bound is at most the window's refusals / CAPACITY per minute, and every
    /// key refused more than that bound in the window is listed.
    #[test]
    fn estimates_bound_the_exact_counts_on_skewed_streams() {
        for seed in 0..12u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let top = TopLimited::default();
            let mut exact: HashMap<u64, u64> = HashMap::new();
            let keys = [50u64, 2_000, 20_000][seed as usize % 3];
            let minutes = 1 + seed % 4;
            let mut per_minute_bound = 0;
            for m in 0..minutes {
                let n = 4_000 + rng.u64(..8_000);
                per_minute_bound += n.div_ceil(CAPACITY as u64);
                for _ in 0..n {
                    // Skewed: the cube of a uniform draw favours small key numbers.
                    let u = rng.f64();
                    let key = ((u * u * u) * keys as f64) as u64;
                    *exact.entry(key).or_default() += 1;
                    top.count_id(T0 + m * 60_000 + rng.u64(..60_000), key, "e", || key);
                }
            }
            let now = T0 + (minutes - 1) * 60_000;
            let all = top.top(now, usize::MAX);
            for l in &all {
                let truth = exact.get(&l.key).copied().unwrap_or(0);
                assert!(l.limited >= truth, "seed {seed}: {l:?} under {truth}");
                assert!(
                    l.limited - truth <= l.over_by_at_most,
                    "seed {seed}: {l:?} over {truth} by more than it says"
                );
                assert!(l.over_by_at_most <= per_minute_bound, "seed {seed}: {l:?}");
                if keys < CAPACITY as u64 {
                    assert_eq!(l.limited, truth, "fewer keys than the sketch holds: exact");
                }
            }
            let listed: std::collections::HashSet<u64> = all.iter().map(|l| l.key).collect();
            for (key, n) in &exact {
                if *n > per_minute_bound {
                    assert!(listed.contains(key), "seed {seed}: key {key} ({n}) missing");
                }
            }
            // The first SHOWN are the most counted.
            let shown = top.top(now, SHOWN);
            assert_eq!(shown[..], all[..SHOWN.min(all.len())]);
        }
    }
}
