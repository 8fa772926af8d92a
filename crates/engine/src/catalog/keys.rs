//! keys: every API key of a catalog and its limits, held for a million keys and changed in
//! proportion to what changed.
//!
//! The keys are spread over shards by their hash, each shard behind an `Arc`: a version made from
//! the previous one by a diff shares every shard the diff does not touch, and copies only those
//! it does. Keys with the same limits share one [`Plan`] (a catalog's keys mostly follow a few
//! plans), so a key costs a table slot of its digest (32 bytes) and its plan's `Arc`. One hash per
//! lookup: it picks the shard (middle bits) and the slot within it (`hashbrown::HashTable`, which
//! takes the hash as given).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

use super::digest::KeyDigest;
use crate::limiter::Limit;

/// One key's limits: `limits[i]` is on endpoint `eps[i]` (or, with [`GROUP`] set, in the pool of
/// group `eps[i] & !GROUP`), sorted by endpoint then window; `waits[i]` is its wait in
/// milliseconds (empty when none of them waits).
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct Plan {
    pub eps: Box<[u32]>,
    pub limits: Box<[Limit]>,
    pub waits: Box<[u16]>,
}

/// Marks a pool's limits in [`Plan::eps`] (no catalog has 2^31 endpoints).
pub(super) const GROUP: u32 = 1 << 31;

impl Plan {
    /// The limits on `ep` (an endpoint, or `GROUP | g`).
    pub fn on(&self, ep: u32) -> &[Limit] {
        &self.limits[self.range(ep)]
    }

    /// Where the limits on `ep` are in `limits`.
    pub fn range(&self, ep: u32) -> std::ops::Range<usize> {
        let from = self.eps.partition_point(|&e| e < ep);
        let to = from + self.eps[from..].partition_point(|&e| e == ep);
        from..to
    }
}

/// A key of a shard: its digest, and its plan.
#[derive(Debug, Clone)]
struct Slot {
    digest: KeyDigest,
    plan: Arc<Plan>,
}

/// The keys that hash to one shard.
#[derive(Debug, Clone, Default)]
struct Shard {
    slots: HashTable<Slot>,
}

impl Shard {
    fn find(&self, hash: u64, digest: &KeyDigest) -> Option<&Slot> {
        self.slots.find(hash, |s| s.digest == *digest)
    }
}

/// Keys per shard aimed at: 70% of a 1024-slot table (hashbrown fills at most 7/8 of its slots
/// and doubles them when full), so a shard holds a key in about 1.4 slots; a diff of one key
/// copies one shard, about this many entries.
const KEYS_PER_SHARD: usize = 717;

/// An API key's digest ([`KeyDigest`]) -> its plan.
///
/// foldhash, seeded per process, rather than SipHash: looked up on every request, and only the
/// catalog inserts into it, so a client cannot grow it; seeded, so that a catalog cannot choose
/// digests that share slots to slow its own loading down.
#[derive(Debug, Clone)]
pub(super) struct KeyTable {
    hasher: foldhash::fast::RandomState,
    shards: Box<[Arc<Shard>]>,
    len: usize,
}

impl Default for KeyTable {
    fn default() -> Self {
        KeyTable::with_capacity(0)
    }
}

impl KeyTable {
    /// An empty table sized for `keys` keys.
    pub fn with_capacity(keys: usize) -> KeyTable {
        let shards = keys.div_ceil(KEYS_PER_SHARD).max(1);
        let per_shard = keys.div_ceil(shards);
        KeyTable {
            hasher: foldhash::fast::RandomState::default(),
            shards: (0..shards)
                .map(|_| {
                    Arc::new(Shard {
                        slots: HashTable::with_capacity(per_shard),
                    })
                })
                .collect(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    fn hash(&self, digest: &KeyDigest) -> u64 {
        self.hasher.hash_one(digest.0)
    }

    /// Bits 16 to 47 of the hash, scaled to the shard count (a multiply, not a division): a
    /// shard's table takes its slot from the low bits and its tags from the top seven, which
    /// therefore still vary within a shard.
    fn shard_of(&self, hash: u64) -> usize {
        let middle = (hash >> 16) & 0xFFFF_FFFF;
        ((middle * self.shards.len() as u64) >> 32) as usize
    }

    /// The plan of the key of `digest`, and the digest as the table holds it.
    pub fn get(&self, digest: &KeyDigest) -> Option<&Plan> {
        let hash = self.hash(digest);
        let shard = &self.shards[self.shard_of(hash)];
        shard.find(hash, digest).map(|s| &*s.plan)
    }

    /// Sets the plan of the key of `digest`; copies its shard first if another version shares it.
    pub fn insert(&mut self, digest: KeyDigest, plan: Arc<Plan>) {
        let hash = self.hash(&digest);
        let hasher = self.hasher.clone();
        let at = self.shard_of(hash);
        let shard = Arc::make_mut(&mut self.shards[at]);
        if let Some(slot) = shard.slots.find_mut(hash, |s| s.digest == digest) {
            slot.plan = plan;
            return;
        }
        let slot = Slot { digest, plan };
        (shard.slots).insert_unique(hash, slot, |s| hasher.hash_one(s.digest.0));
        self.len += 1;
    }

    /// Removes the key of `digest` (nothing if absent); copies its shard first if another
    /// version shares it.
    pub fn remove(&mut self, digest: &KeyDigest) {
        let hash = self.hash(digest);
        let at = self.shard_of(hash);
        if self.shards[at].find(hash, digest).is_none() {
            return;
        }
        let shard = Arc::make_mut(&mut self.shards[at]);
        if let Ok(entry) = shard.slots.find_entry(hash, |s| s.digest == *digest) {
            entry.remove();
            self.len -= 1;
        }
    }
}

/// Gives keys with the same limits one [`Plan`].
#[derive(Default)]
pub(super) struct Plans(HashMap<Arc<Plan>, (), foldhash::fast::RandomState>);

impl Plans {
    pub fn share(&mut self, plan: Plan) -> Arc<Plan> {
        if let Some((shared, _)) = self.0.get_key_value(&plan) {
            return shared.clone();
        }
        let plan = Arc::new(plan);
        self.0.insert(plan.clone(), ());
        plan
    }

    /// Whether `plan` is one of these (the very one, not an equal one).
    pub fn made(&self, plan: &Plan) -> bool {
        self.0
            .get_key_value(plan)
            .is_some_and(|(ours, _)| std::ptr::eq(&**ours, plan))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(key: impl AsRef<[u8]>) -> KeyDigest {
        KeyDigest::sha256(key.as_ref())
    }

    fn plan(rl: u64) -> Plan {
        Plan {
            eps: [0].into(),
            limits: [Limit::per_minute(rl)].into(),
            waits: Box::default(),
        }
    }

    #[test]
    fn a_changed_copy_shares_what_it_did_not_change() {
        let mut plans = Plans::default();
        let mut old = KeyTable::with_capacity(10_000);
        for i in 0..10_000u32 {
            old.insert(d(format!("key{i}")), plans.share(plan(u64::from(i % 3))));
        }
        assert_eq!(old.len(), 10_000);
        assert_eq!(old.shards.len(), 14, "10,000 keys at 717 a shard");
        let mut new = old.clone();
        new.insert(d("key7"), Arc::new(plan(99)));
        new.insert(d("fresh"), Arc::new(plan(5)));
        new.remove(&d("key8"));
        new.remove(&d("absent"));
        assert_eq!(new.len(), 10_000);
        assert_eq!(new.get(&d("key7")).unwrap().limits[0].rl, 99);
        assert_eq!(
            old.get(&d("key7")).unwrap().limits[0].rl,
            1,
            "the old version unchanged"
        );
        assert!(new.get(&d("key8")).is_none() && old.get(&d("key8")).is_some());
        assert!(new.get(&d("fresh")).is_some() && old.get(&d("fresh")).is_none());
        for i in (0..10_000u32).filter(|i| ![7, 8].contains(i)) {
            let k = format!("key{i}");
            assert_eq!(new.get(&d(&k)).unwrap().limits[0].rl, u64::from(i % 3));
        }
        let shared = (old.shards.iter().zip(new.shards.iter()))
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        assert!(
            shared >= old.shards.len() - 3,
            "at most three shards copied: {shared} of {} shared",
            old.shards.len()
        );
    }

    #[test]
    fn keys_with_the_same_limits_share_a_plan() {
        let mut plans = Plans::default();
        let a = plans.share(plan(1));
        let b = plans.share(plan(1));
        let c = plans.share(plan(2));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
    }
}
