//! keys: every API key of a catalog and its limits, held for a million keys and changed in
//! proportion to what changed.
//!
//! The keys are spread over shards by their hash, each shard behind an `Arc`: a version made from
//! the previous one by a diff shares every shard the diff does not touch, and copies only those
//! it does. Keys with the same limits share one [`Plan`] (a catalog's keys mostly follow a few
//! plans), so a key costs its bytes and a table slot. One hash per lookup: it picks the shard
//! (middle bits) and the slot within it (`hashbrown::HashTable`, which takes the hash as given).
//!
//! A key is held as the catalog names it: in plain, by its bytes (looked up as sent, no digest
//! a request), or by a digest, by the digest's 32 bytes (a request's key is digested to be found
//! among them: `super::digest`). Each carries the [`KeyId`] its counters are named by.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

use super::digest::{KeyDigest, KeyId};
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

/// How a catalog names a key: its bytes, or a digest of them.
#[derive(Debug, Clone, Copy)]
pub(super) enum Named<'a> {
    Plain(&'a [u8]),
    Digest(&'a KeyDigest),
}

impl<'a> Named<'a> {
    fn parts(self) -> (&'a [u8], u32) {
        match self {
            Named::Plain(key) => (key, 0),
            Named::Digest(d) => (&d.0, DIGESTED),
        }
    }
}

/// Marks a digest's slot in [`Slot::len`] (no key is 2 GiB long).
const DIGESTED: u32 = 1 << 31;

/// A key of a shard: where its record is in the shard's arena (and whether it is a digest's),
/// and its plan. A plain key's record is its [`KeyId`] (16 bytes), then its bytes; a digest's is
/// the digest, whose first 16 bytes are its id. So the id costs a slot nothing, and a diff that
/// changes only limits shares it with the key's bytes.
#[derive(Debug, Clone)]
struct Slot {
    at: u32,
    /// Its key's length, with [`DIGESTED`] set for a digest.
    len: u32,
    plan: Arc<Plan>,
}

/// The bytes of an id, before a plain key's bytes in its record.
const ID_BYTES: usize = 16;

impl Slot {
    /// Bytes of its record before the key's.
    fn before(&self) -> usize {
        if self.len & DIGESTED == 0 {
            ID_BYTES
        } else {
            0
        }
    }

    fn record<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &bytes[self.at as usize..][..self.before() + (self.len & !DIGESTED) as usize]
    }

    fn key<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &self.record(bytes)[self.before()..]
    }

    fn id(&self, bytes: &[u8]) -> KeyId {
        let mut id = [0u8; ID_BYTES];
        id.copy_from_slice(&self.record(bytes)[..ID_BYTES]);
        KeyId(id)
    }

    fn is(&self, bytes: &[u8], key: &[u8], kind: u32) -> bool {
        self.len & DIGESTED == kind && self.key(bytes) == key
    }
}

/// The keys that hash to one shard. Their bytes are in one arena, shared by the copies that
/// diffs make of the shard until one adds a key: a diff that only changes keys' limits (a new plan
/// for every key, say) copies the slots and not the bytes, so the old and the new version hold
/// one set of key bytes between them. An arena copied or grown keeps only the bytes of keys still
/// there, so the bytes of removed keys are never more than the live ones.
#[derive(Debug, Clone, Default)]
struct Shard {
    slots: HashTable<Slot>,
    bytes: Arc<Vec<u8>>,
    /// Bytes of `bytes` whose keys were removed.
    dead: usize,
}

impl Shard {
    fn find(&self, hash: u64, key: &[u8], kind: u32) -> Option<&Slot> {
        let bytes = &self.bytes[..];
        self.slots.find(hash, |s| s.is(bytes, key, kind))
    }

    /// Room for `key` at the end of the arena, made this shard's own first; the arena is
    /// rewritten without the removed keys' bytes when it is shared (a copy is made anyway) or
    /// when they are most of it.
    fn append(&mut self, before: &[u8], key: &[u8]) -> Result<(u32, u32), TooLarge> {
        let shared = Arc::get_mut(&mut self.bytes).is_none();
        let live = self.bytes.len() - self.dead;
        let compact = shared || self.dead > self.bytes.len() / 2;
        let end = if compact { live } else { self.bytes.len() } + before.len() + key.len();
        // Checked before anything changes: every offset below then fits, and no length reaches
        // the flag bit.
        let (Ok(len), Ok(_)) = (u32::try_from(key.len()), u32::try_from(end)) else {
            return Err(TooLarge);
        };
        if len & DIGESTED != 0 {
            return Err(TooLarge);
        }
        if compact {
            let mut fresh = Vec::with_capacity(end);
            for slot in self.slots.iter_mut() {
                let from = slot.record(&self.bytes);
                slot.at = fresh.len() as u32;
                fresh.extend_from_slice(from);
            }
            (self.bytes, self.dead) = (Arc::new(fresh), 0);
        }
        // This shard's own by now (never a copy here).
        let bytes = Arc::make_mut(&mut self.bytes);
        let at = bytes.len() as u32;
        bytes.extend_from_slice(before);
        bytes.extend_from_slice(key);
        Ok((at, len))
    }
}

/// A shard's arena would pass 4 GiB (u32 offsets): not reachable by a catalog within
/// `catalog.max_bytes`.
#[derive(Debug)]
struct TooLarge;

/// Keys per shard aimed at: 70% of a 1024-slot table (hashbrown fills at most 7/8 of its slots
/// and doubles them when full), so a shard holds a key in about 1.4 slots; a diff of one key
/// copies one shard, about this many entries.
const KEYS_PER_SHARD: usize = 717;

/// API key bytes -> its plan.
///
/// foldhash, seeded per process, rather than SipHash: looked up on every request, and only the
/// catalog inserts into it, so a client cannot grow it or choose colliding keys to slow it down.
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
                        ..Shard::default()
                    })
                })
                .collect(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Bits 16 to 47 of the hash, scaled to the shard count (a multiply, not a division): a
    /// shard's table takes its slot from the low bits and its tags from the top seven, which
    /// therefore still vary within a shard.
    fn shard_of(&self, hash: u64) -> usize {
        let middle = (hash >> 16) & 0xFFFF_FFFF;
        ((middle * self.shards.len() as u64) >> 32) as usize
    }

    /// The id and plan of the key named `key`.
    pub fn get(&self, key: Named) -> Option<(KeyId, &Plan)> {
        let (key, kind) = key.parts();
        let hash = self.hash(key);
        let shard = &self.shards[self.shard_of(hash)];
        shard
            .find(hash, key, kind)
            .map(|s| (s.id(&shard.bytes), &*s.plan))
    }

    /// The keys named in plain (for a check across a whole catalog).
    pub fn plain_keys(&self) -> impl Iterator<Item = &[u8]> {
        self.shards.iter().flat_map(|s| {
            (s.slots.iter())
                .filter(|slot| slot.len & DIGESTED == 0)
                .map(|slot| slot.key(&s.bytes))
        })
    }

    /// Sets the plan of the key named `key` (and, when it is new and named in plain, its id: a
    /// digest's is its first half); copies its shard first if another version shares it.
    pub fn insert(&mut self, key: Named, id: KeyId, plan: Arc<Plan>) {
        let (key, kind) = key.parts();
        let hash = self.hash(key);
        let hasher = self.hasher.clone();
        let at = self.shard_of(hash);
        let shard = Arc::make_mut(&mut self.shards[at]);
        let bytes = &shard.bytes[..];
        if let Some(slot) = shard.slots.find_mut(hash, |s| s.is(bytes, key, kind)) {
            slot.plan = plan;
            return;
        }
        let before: &[u8] = if kind == DIGESTED { &[] } else { &id.0 };
        let Ok((at, len)) = shard.append(before, key) else {
            // Unreachable (see `TooLarge`); the key is then not there, never another's.
            return;
        };
        let bytes = &shard.bytes[..];
        let slot = Slot {
            at,
            len: len | kind,
            plan,
        };
        (shard.slots).insert_unique(hash, slot, |s| hasher.hash_one(s.key(bytes)));
        self.len += 1;
    }

    /// Removes the key named `key` (nothing if absent); copies its shard first if another version
    /// shares it.
    pub fn remove(&mut self, key: Named) {
        let (key, kind) = key.parts();
        let hash = self.hash(key);
        let at = self.shard_of(hash);
        if self.shards[at].find(hash, key, kind).is_none() {
            return;
        }
        let shard = Arc::make_mut(&mut self.shards[at]);
        let bytes = &shard.bytes[..];
        if let Ok(entry) = shard.slots.find_entry(hash, |s| s.is(bytes, key, kind)) {
            let (slot, _) = entry.remove();
            shard.dead += slot.before() + (slot.len & !DIGESTED) as usize;
            self.len -= 1;
        }
    }

    /// Gives back what the arenas grown since the last call hold beyond their bytes (an arena
    /// doubles as keys are added): called when a version is complete.
    pub fn shrink(&mut self) {
        for shard in self.shards.iter_mut() {
            if let Some(bytes) = Arc::get_mut(shard).and_then(|s| Arc::get_mut(&mut s.bytes)) {
                bytes.shrink_to_fit();
            }
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

    const ID: KeyId = KeyId([7; 16]);

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
            old.insert(
                Named::Plain(format!("key{i}").as_bytes()),
                ID,
                plans.share(plan(u64::from(i % 3))),
            );
        }
        assert_eq!(old.len(), 10_000);
        assert_eq!(old.shards.len(), 14, "10,000 keys at 717 a shard");
        let mut new = old.clone();
        new.insert(Named::Plain(b"key7"), ID, Arc::new(plan(99)));
        new.insert(Named::Plain(b"fresh"), ID, Arc::new(plan(5)));
        new.remove(Named::Plain(b"key8"));
        new.remove(Named::Plain(b"absent"));
        assert_eq!(new.len(), 10_000);
        assert_eq!(new.get(Named::Plain(b"key7")).unwrap().1.limits[0].rl, 99);
        assert_eq!(
            old.get(Named::Plain(b"key7")).unwrap().1.limits[0].rl,
            1,
            "the old version unchanged"
        );
        assert!(
            new.get(Named::Plain(b"key8")).is_none() && old.get(Named::Plain(b"key8")).is_some()
        );
        assert!(
            new.get(Named::Plain(b"fresh")).is_some() && old.get(Named::Plain(b"fresh")).is_none()
        );
        for i in (0..10_000u32).filter(|i| ![7, 8].contains(i)) {
            let k = format!("key{i}");
            assert_eq!(
                new.get(Named::Plain(k.as_bytes())).unwrap().1.limits[0].rl,
                u64::from(i % 3)
            );
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
    fn a_copy_that_changes_only_limits_shares_the_key_bytes() {
        let mut plans = Plans::default();
        let mut old = KeyTable::with_capacity(2_000);
        for i in 0..2_000u32 {
            old.insert(
                Named::Plain(format!("key{i}").as_bytes()),
                ID,
                plans.share(plan(1)),
            );
        }
        old.shrink();
        let mut new = old.clone();
        let other = plans.share(plan(2));
        for i in 0..2_000u32 {
            new.insert(
                Named::Plain(format!("key{i}").as_bytes()),
                ID,
                other.clone(),
            );
        }
        new.shrink();
        for (a, b) in old.shards.iter().zip(new.shards.iter()) {
            assert!(!Arc::ptr_eq(a, b), "every shard copied (its plans changed)");
            assert!(Arc::ptr_eq(&a.bytes, &b.bytes), "the key bytes shared");
        }
        assert_eq!(new.get(Named::Plain(b"key1999")).unwrap().1.limits[0].rl, 2);
        assert_eq!(old.get(Named::Plain(b"key1999")).unwrap().1.limits[0].rl, 1);
    }

    #[test]
    fn removed_keys_bytes_are_dropped_when_the_arena_is_copied_or_mostly_dead() {
        let mut t = KeyTable::with_capacity(1);
        let p = Arc::new(plan(1));
        for i in 0..100u32 {
            t.insert(Named::Plain(format!("key{i:03}").as_bytes()), ID, p.clone());
        }
        let full = t.shards[0].bytes.len();
        assert_eq!(full, 100 * (16 + 6), "each key after its id");
        for i in 0..60u32 {
            t.remove(Named::Plain(format!("key{i:03}").as_bytes()));
        }
        assert_eq!(
            t.shards[0].bytes.len(),
            full,
            "removal alone leaves the bytes"
        );
        // Mostly dead: the next key added rewrites the arena with the live keys.
        t.insert(Named::Plain(b"fresh!"), ID, p.clone());
        assert_eq!(t.shards[0].bytes.len(), 41 * 22);
        // Shared with another version: the copy keeps only the live keys.
        let old = t.clone();
        t.remove(Named::Plain(b"key099"));
        t.insert(Named::Plain(b"other!"), ID, p.clone());
        assert_eq!(t.shards[0].bytes.len(), 41 * 22);
        assert_eq!(
            old.shards[0].bytes.len(),
            41 * 22,
            "the old version untouched"
        );
        for i in 60..99u32 {
            let k = format!("key{i:03}");
            assert!(
                t.get(Named::Plain(k.as_bytes())).is_some()
                    && old.get(Named::Plain(k.as_bytes())).is_some(),
                "{k}"
            );
        }
        assert!(
            t.get(Named::Plain(b"key099")).is_none() && old.get(Named::Plain(b"key099")).is_some()
        );
        assert!(
            t.get(Named::Plain(b"other!")).is_some() && old.get(Named::Plain(b"other!")).is_none()
        );
        assert!(
            t.get(Named::Plain(b"fresh!")).is_some() && old.get(Named::Plain(b"fresh!")).is_some()
        );
        assert!(t.get(Named::Plain(b"key000")).is_none());
        assert_eq!((t.len(), old.len()), (41, 41));
    }

    #[test]
    fn a_key_named_in_plain_is_not_a_digest_of_the_same_bytes() {
        let mut t = KeyTable::with_capacity(2);
        let d = KeyDigest([b'x'; 32]);
        let other = KeyId([9; 16]);
        t.insert(Named::Plain(&d.0), ID, Arc::new(plan(1)));
        assert!(t.get(Named::Digest(&d)).is_none());
        t.insert(Named::Digest(&d), other, Arc::new(plan(2)));
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(Named::Plain(&d.0)).unwrap().0, ID);
        assert_eq!(
            t.get(Named::Digest(&d)).unwrap().0,
            KeyId([b'x'; 16]),
            "a digest's id is its first half"
        );
        assert_eq!(t.plain_keys().collect::<Vec<_>>(), [&d.0[..]]);
        t.remove(Named::Digest(&d));
        assert!(t.get(Named::Digest(&d)).is_none() && t.get(Named::Plain(&d.0)).is_some());
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
