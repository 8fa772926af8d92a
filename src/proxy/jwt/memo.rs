//! memo: tokens already verified, so that a caller repeating its token pays a hash and a
//! comparison instead of a signature check (an RSA or ECDSA verification is tens of
//! microseconds; the request path without it is a few).
//!
//! Bounded in count (`limits.jwt_memo_max`) and in the size of a token remembered
//! ([`MAX_TOKEN_BYTES`]); only verified tokens enter, so a flood of bad tokens leaves it as it
//! was. An entry is taken until its token's `exp` (plus the leeway). A new key set empties it: a
//! key removed from the set must stop its tokens at once.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use super::Verified;

/// Longer tokens are verified each time, never remembered: the memo's memory is then at most
/// its count times this.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// Shards: requests on different workers rarely wait for one another's lock.
const SHARDS: usize = 16;

struct Entry {
    /// The whole token, compared on every hit: its hash only chooses where to look.
    token: Box<[u8]>,
    verified: Verified,
}

pub struct Memo {
    shards: [Mutex<HashMap<u64, Entry, NoHash>>; SHARDS],
    hasher: foldhash::fast::RandomState,
    per_shard: usize,
}

/// The map's keys are already hashes.
#[derive(Default, Clone, Copy)]
struct NoHash;

impl BuildHasher for NoHash {
    type Hasher = Passed;
    fn build_hasher(&self) -> Passed {
        Passed(0)
    }
}

#[derive(Default)]
struct Passed(u64);

impl std::hash::Hasher for Passed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl Memo {
    /// Remembers `max` tokens at most (0: none).
    pub fn new(max: usize) -> Memo {
        Memo {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::default())),
            hasher: foldhash::fast::RandomState::default(),
            per_shard: max.div_ceil(SHARDS),
        }
    }

    fn shard(&self, token: &[u8]) -> (u64, &Mutex<HashMap<u64, Entry, NoHash>>) {
        let h = self.hasher.hash_one(token);
        (h, &self.shards[(h >> 60) as usize % SHARDS])
    }

    /// `token`'s verification, if it was remembered and still holds at `now_s`.
    pub fn get(&self, token: &[u8], now_s: u64) -> Option<Verified> {
        if self.per_shard == 0 || token.len() > MAX_TOKEN_BYTES {
            return None;
        }
        let (h, shard) = self.shard(token);
        let map = shard.lock().unwrap_or_else(|p| p.into_inner());
        let e = map.get(&h)?;
        (*e.token == *token && now_s < e.verified.until_s).then(|| e.verified.clone())
    }

    /// Remembers `token`'s verification; at `now_s`, expired entries make room first, then any.
    pub fn put(&self, token: &[u8], verified: &Verified, now_s: u64) {
        if self.per_shard == 0 || token.len() > MAX_TOKEN_BYTES {
            return;
        }
        let (h, shard) = self.shard(token);
        let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= self.per_shard && !map.contains_key(&h) {
            map.retain(|_, e| now_s < e.verified.until_s);
            if map.len() >= self.per_shard
                && let Some(&any) = map.keys().next()
            {
                map.remove(&any);
            }
        }
        map.insert(
            h,
            Entry {
                token: token.into(),
                verified: Verified {
                    key: Arc::clone(&verified.key),
                    until_s: verified.until_s,
                },
            },
        );
    }

    /// Forgets every token (a new key set).
    pub fn clear(&self) {
        for shard in &self.shards {
            shard.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// Tokens remembered.
    pub fn len(&self) -> usize {
        let each = self.shards.iter();
        each.map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verified(key: &str, until_s: u64) -> Verified {
        Verified {
            key: Arc::from(key.as_bytes()),
            until_s,
        }
    }

    #[test]
    fn a_token_is_remembered_until_it_expires_and_only_that_token() {
        let m = Memo::new(100);
        m.put(b"a.b.c", &verified("k1", 100), 10);
        assert_eq!(m.get(b"a.b.c", 99), Some(verified("k1", 100)));
        assert_eq!(m.get(b"a.b.c", 100), None, "expired");
        assert_eq!(m.get(b"a.b.d", 50), None);
        m.clear();
        assert_eq!(m.get(b"a.b.c", 50), None, "a new key set forgets");
    }

    #[test]
    fn the_memo_stays_within_its_bound() {
        let m = Memo::new(64);
        for i in 0..10_000u32 {
            m.put(format!("t{i}").as_bytes(), &verified("k", 1_000), 0);
        }
        assert!(m.len() <= 64, "{}", m.len());
        let long = vec![b'x'; MAX_TOKEN_BYTES + 1];
        m.put(&long, &verified("k", 1_000), 0);
        assert_eq!(m.get(&long, 0), None, "too long to remember");
        let off = Memo::new(0);
        off.put(b"t", &verified("k", 1_000), 0);
        assert_eq!(off.get(b"t", 0), None);
    }
}
