//! snapshot: a validated catalog built into what the request path reads (routes, limits,
//! version), swapped in whole. Building checks everything first and reports every problem.

use std::collections::HashMap;
use std::sync::Arc;

use super::CatalogVersion;
use super::digest::{self, Form, KeyDigest, KeyId, KeySecrets};
use super::keys::{GROUP, KeyTable, Named, Plan, Plans};
use super::read::{self, Counted};
use super::{ApiLimits, CatalogDiff, CatalogDoc, CatalogError, LimitDef, Problem, UnknownFields};
use crate::limiter::{Limit, MAX_LIMITS, MAX_WINDOW_SECONDS, Period, WINDOW_SECONDS, ZoneId};
use crate::router::{RouteMatch, RouteTable, Template};

/// One endpoint of a snapshot, with what the request path needs precomputed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `METHOD /template`, as in the catalog (method upper-cased). Used as the policy name in
    /// rate-limit headers and as the endpoint part of counter keys.
    pub name: String,
    /// The upper-cased method, forwarded instead of the client's spelling.
    pub method: http::Method,
    /// For catalog keys with no limit of their own here (`default_rl`, `default_limits`).
    pub default_limits: Box<[Limit]>,
    /// For requests without an API key, per client address (`anonymous`).
    pub anonymous: Box<[Limit]>,
    /// Units of every limit one request uses.
    pub cost: u64,
    /// The groups that cover it and that some key pools ([`Snapshot::group_name`]), ascending.
    pub pools: Box<[u32]>,
    /// Where its responses report what a request cost (`None`: its `cost` is what it costs).
    pub cost_from: Option<crate::report::CostFrom>,
}

/// What the catalog says about one (API key, endpoint) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitLookup<'s> {
    /// The key is not in the catalog.
    UnknownKey,
    /// The key is known but has no limit (the endpoint no default, no pool of the key covers
    /// it) here.
    NoLimit,
    /// Its limits: its own (or the endpoint's defaults), and its pools'.
    Limits(Applied<'s>),
}

/// The limits one request of a key is held to on an endpoint: its own there (one per window
/// length or period; the endpoint's defaults when it has none, possibly none when a pool
/// applies), and those of each of its pools that covers the endpoint, counted apart.
#[derive(Debug, Clone, Copy)]
pub struct Applied<'s> {
    pub own: &'s [Limit],
    /// The key's plan (for its pools) and the endpoint's pooled groups.
    entry: Option<&'s Plan>,
    /// What the key's counters are named by (`None`: no key's limits).
    id: Option<KeyId>,
    groups: &'s [u32],
    names: &'s [Box<str>],
}

impl<'s> Applied<'s> {
    /// Limits of one counter, no pool.
    pub fn own(own: &'s [Limit]) -> Applied<'s> {
        Applied {
            own,
            entry: None,
            id: None,
            groups: &[],
            names: &[],
        }
    }

    /// What the key's counters are named by: from the digest it was found by, never the key.
    /// `None` for limits that are no key's ([`Applied::own`]).
    pub fn key_id(&self) -> Option<KeyId> {
        self.id
    }

    /// Each pool of the key that covers the endpoint: its group's name and its limits.
    pub fn pools(&self) -> impl Iterator<Item = (&'s str, &'s [Limit])> + 's {
        let (entry, names) = (self.entry, self.names);
        self.groups.iter().filter_map(move |&g| {
            let limits = entry?.on(GROUP | g);
            let name = names.get(usize::try_from(g).ok()?)?;
            (!limits.is_empty()).then_some((&**name, limits))
        })
    }

    pub fn has_pools(&self) -> bool {
        self.pools().next().is_some()
    }
}

/// The same limits (the key they were found for aside).
impl PartialEq for Applied<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.own == other.own && self.pools().eq(other.pools())
    }
}

impl Eq for Applied<'_> {}

/// The longest a request may wait for room (`wait_ms`), in milliseconds.
pub const MAX_WAIT_MS: u64 = 60_000;

/// An immutable, validated catalog version: routes, limits and version, swapped in as one.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub version: CatalogVersion,
    routes: Arc<RouteTable>,
    endpoints: Vec<Endpoint>,
    keys: KeyTable,
    /// The catalog's groups, by number: its `groups` in order, then `*`.
    groups: Arc<Groups>,
    /// Which groups some key pools, by number.
    pooled: Vec<bool>,
    /// The zone of calendar limits that name none (the catalog's `tz`).
    tz: ZoneId,
    /// Fields of the document quotagate does not know (ignored; logged once when served).
    unknown_fields: Vec<String>,
    /// The key secrets `hmac-sha256` digests are made with (`catalog.key_secret_file`).
    secrets: Option<Arc<KeySecrets>>,
    /// Whether some entry is named by a digest (only then is a request's key that is not among
    /// the plain ones digested), and by an `hmac-sha256` one (only then under the secrets).
    digest_entries: bool,
    hmac_entries: bool,
}

impl Snapshot {
    /// Parses and validates a DynLimits catalog. `source` names it in errors.
    pub fn from_json(source: &str, json: &[u8]) -> Result<Snapshot, CatalogError> {
        Snapshot::from_json_with(source, json, None)
    }

    /// [`Snapshot::from_json`] with the key secrets its `hmac-sha256` digests are made with.
    pub fn from_json_with(
        source: &str,
        json: &[u8],
        secrets: Option<Arc<KeySecrets>>,
    ) -> Result<Snapshot, CatalogError> {
        let mut unknown = UnknownFields::default();
        let head = CatalogDoc::parse_head(source, json, &mut unknown)?;
        Snapshot::from_head(source, head, unknown, json, secrets)
    }

    /// Validates the catalog `json` and builds its snapshot, given its first pass: `head` (whose
    /// version the caller may have set) and the unknown fields that pass met. The keys are read
    /// from `json` one at a time into the key table, in memory in proportion to the table. A
    /// catalog with a problem in its keys is read again whole, so that every problem is reported
    /// as [`Snapshot::build`] reports it.
    pub fn from_head(
        source: &str,
        head: CatalogDoc<Counted>,
        mut unknown: UnknownFields,
        json: &[u8],
        secrets: Option<Arc<KeySecrets>>,
    ) -> Result<Snapshot, CatalogError> {
        let version = head.version.clone();
        let mut streamed = true;
        let keying = secrets.clone();
        let built = build(head, secrets, |ctx, count, problems| {
            let mut keys = KeyTable::with_capacity(count.0);
            let mut pooled = vec![false; ctx.groups.names.len()];
            let mut plans = Plans::default();
            let mut seen = Seen::default();
            // Any problem stops the read: the whole read below then reports every one.
            streamed = read::each_key(json, Some(&mut unknown), |k, entry| {
                let known = |named: Named, _: &KeyDigest| keys.get(named).map(|_| None);
                match seen.name(ctx, k, &entry, known) {
                    Ok(digest) => add_key(
                        k,
                        digest,
                        &entry,
                        ctx,
                        &mut keys,
                        &mut pooled,
                        &mut plans,
                        problems,
                    ),
                    Err(_) => false,
                }
            });
            // A key named in plain and by its SHA-256 too: told only with both read.
            streamed = streamed && !(ctx.digest_entries.get() && plain_twice(&keys));
            keys.shrink();
            (keys, pooled)
        });
        match built {
            Ok(s) if streamed => Ok(s.with_unknown_fields(unknown.into_list())),
            Err(problems) if streamed => Err(CatalogError {
                source: source.to_owned(),
                problems,
            }),
            _ => {
                let (mut doc, unknown) = CatalogDoc::parse_reporting(source, json)?;
                doc.version = version;
                Ok(Snapshot::build_with(source, doc, keying)?.with_unknown_fields(unknown))
            }
        }
    }

    /// Records the fields of the document that quotagate does not know.
    pub fn with_unknown_fields(mut self, unknown: Vec<String>) -> Snapshot {
        self.unknown_fields = unknown;
        self
    }

    /// The fields of the document quotagate does not know, by path (`apilimit`).
    pub fn unknown_fields(&self) -> &[String] {
        &self.unknown_fields
    }

    /// Validates a document and builds its snapshot. `source` names it in errors.
    pub fn build(source: &str, doc: CatalogDoc) -> Result<Snapshot, CatalogError> {
        Snapshot::build_with(source, doc, None)
    }

    /// [`Snapshot::build`] with the key secrets its `hmac-sha256` digests are made with.
    pub fn build_with(
        source: &str,
        doc: CatalogDoc,
        secrets: Option<Arc<KeySecrets>>,
    ) -> Result<Snapshot, CatalogError> {
        build(doc, secrets, |ctx, entries, problems| {
            key_limits(ctx, entries, problems)
        })
        .map_err(|problems| CatalogError {
            source: source.to_owned(),
            problems,
        })
    }

    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Finds the endpoint of a request; `Err` gives the path back when none matches.
    pub fn route<'p>(
        &self,
        method: &str,
        path: crate::path::NormalPath<'p>,
    ) -> Result<RouteMatch, crate::path::NormalPath<'p>> {
        self.routes.lookup(method, path)
    }

    /// The key secrets its `hmac-sha256` digests are made with.
    pub fn secrets(&self) -> Option<&Arc<KeySecrets>> {
        self.secrets.as_ref()
    }

    /// What the counters of `key` are named by, `None` when the catalog does not know it.
    pub fn find(&self, key: &[u8]) -> Option<KeyId> {
        self.found(key).map(|(id, _)| id)
    }

    /// The id and plan of `key`: among the keys named in plain, as sent; else, when the catalog
    /// names some by a digest, by its digests (its SHA-256, then its HMAC under each secret).
    fn found(&self, key: &[u8]) -> Option<(KeyId, &Plan)> {
        if let Some(found) = self.keys.get(Named::Plain(key)) {
            return Some(found);
        }
        if !self.digest_entries {
            return None;
        }
        let secrets = self.secrets.as_deref().filter(|_| self.hmac_entries);
        let digests = digest::digests(key, secrets);
        let mut all = digests.as_slice().iter();
        all.find_map(|d| self.keys.get(Named::Digest(d)))
    }

    /// The limits of `key` on `endpoint`: its own, else the endpoint's defaults; and its pools
    /// that cover the endpoint.
    pub fn limit(&self, key: &[u8], endpoint: usize) -> LimitLookup<'_> {
        match self.found(key) {
            Some((id, entry)) => self.limit_in(entry, id, endpoint),
            None => LimitLookup::UnknownKey,
        }
    }

    /// [`Snapshot::limit`] of the key the catalog names by `digest` (a key it names in plain is
    /// not found by its digest).
    pub fn limit_of(&self, digest: &KeyDigest, endpoint: usize) -> LimitLookup<'_> {
        match self.keys.get(Named::Digest(digest)) {
            Some((id, entry)) => self.limit_in(entry, id, endpoint),
            None => LimitLookup::UnknownKey,
        }
    }

    /// The limits on `endpoint` of the key of plan `entry`, whose counters `id` names.
    fn limit_in<'s>(&'s self, entry: &'s Plan, id: KeyId, endpoint: usize) -> LimitLookup<'s> {
        let Some(e) = self.endpoints.get(endpoint) else {
            return LimitLookup::NoLimit;
        };
        let own = entry.on(u32::try_from(endpoint).unwrap_or(u32::MAX));
        let applied = Applied {
            own: if own.is_empty() {
                &e.default_limits
            } else {
                own
            },
            entry: Some(entry),
            id: Some(id),
            groups: &e.pools,
            names: &self.groups.names,
        };
        if applied.own.is_empty() && !applied.has_pools() {
            LimitLookup::NoLimit
        } else {
            LimitLookup::Limits(applied)
        }
    }

    /// How long a request on `endpoint` may wait for room, per limit of `applied` (its key's
    /// lookup there: its own limits, then each pool's, as [`crate::limiter::Limits::pooled`]
    /// orders them), in milliseconds; `None` when no limit of the key waits (the key's plan says
    /// so: no lookup).
    pub fn waits(&self, endpoint: usize, applied: &Applied<'_>) -> Option<[u16; MAX_LIMITS]> {
        let entry = applied.entry?;
        let waits = &entry.waits;
        if waits.is_empty() {
            return None;
        }
        // The endpoint's defaults (when the key has no limit of its own there) never wait.
        let own = entry.range(u32::try_from(endpoint).unwrap_or(u32::MAX));
        let own_waits: &[u16] = if own.is_empty() {
            &[0; MAX_LIMITS][..applied.own.len().min(MAX_LIMITS)]
        } else {
            &waits[own]
        };
        let pools = applied
            .groups
            .iter()
            .flat_map(|&g| &waits[entry.range(GROUP | g)]);
        let mut out = [0u16; MAX_LIMITS];
        for (o, w) in out.iter_mut().zip(own_waits.iter().chain(pools)) {
            *o = *w;
        }
        Some(out)
    }

    /// The name of group number `g` (`*` for every endpoint).
    pub fn group_name(&self, g: u32) -> Option<&str> {
        self.groups
            .names
            .get(usize::try_from(g).ok()?)
            .map(|n| &**n)
    }

    /// This version with `diff` applied (the caller checks that `diff.from` is this version):
    /// each key it names checked as in a whole catalog (problems located in the diff, as
    /// `apilimits[i]...`), in time and memory in proportion to the keys it names: the new version
    /// shares every part of this one that the diff does not change.
    pub fn apply(&self, source: &str, diff: &CatalogDiff) -> Result<Snapshot, CatalogError> {
        let ((), applied) = self.apply_with(source, |ctx, keys, pooled, problems| {
            for k in &diff.removed_keys {
                keys.remove(Named::Plain(k.as_bytes()));
            }
            for (i, d) in diff.removed_key_digests.iter().enumerate() {
                match KeyDigest::parse(d) {
                    Ok((_, d)) => keys.remove(Named::Digest(&d)),
                    Err(r) => problems.add(format!("removed_key_digests[{i}]"), r),
                }
            }
            add_keys(&diff.apilimits, ctx, keys, pooled, problems);
        });
        applied.map(|s| Snapshot {
            version: diff.version.clone(),
            ..s
        })
    }

    /// [`Snapshot::apply`] for a diff as it arrives (`json`: the answer's body), read in one
    /// pass, each key checked and applied as soon as it is read: neither the diff nor its bytes
    /// are held whole (a diff of every key of a million would take more than the catalog). Its
    /// removed keys may come before or after its keys: a key it both removes and sets is set, as
    /// in [`Snapshot::apply`]. `Ok(None)`: the diff is not from this version.
    pub fn apply_read(
        &self,
        source: &str,
        json: impl std::io::Read,
    ) -> Result<Option<Snapshot>, CatalogError> {
        let (read, applied) = self.apply_with(source, |ctx, keys, pooled, problems| {
            let mut sink = Applying {
                ctx,
                keys,
                pooled,
                plans: Plans::default(),
                problems,
            };
            read::read_diff(json, &mut sink)
        });
        match read {
            Ok((from, _)) if from != self.version.hash => Ok(None),
            Ok((_, version)) => applied.map(|s| Some(Snapshot { version, ..s })),
            Err(problem) => Err(CatalogError {
                source: source.to_owned(),
                problems: vec![problem],
            }),
        }
    }

    /// This version with its keys changed by `change` (and its pools as they then are); see
    /// [`Snapshot::apply`]. The version is this one's: the caller sets the diff's.
    fn apply_with<T>(
        &self,
        source: &str,
        change: impl FnOnce(&KeyContext, &mut KeyTable, &mut [bool], &mut Problems) -> T,
    ) -> (T, Result<Snapshot, CatalogError>) {
        let mut problems = Problems::default();
        let defaults: Vec<usize> = self
            .endpoints
            .iter()
            .map(|e| e.default_limits.len())
            .collect();
        let ctx = KeyContext {
            endpoints: self.endpoints.len(),
            tz: self.tz,
            groups: &self.groups,
            defaults: &defaults,
            secrets: self.secrets.as_deref(),
            digest_entries: std::cell::Cell::new(self.digest_entries),
            hmac_entries: std::cell::Cell::new(self.hmac_entries),
        };
        let mut keys = self.keys.clone();
        let mut pooled = self.pooled.clone();
        let done = change(&ctx, &mut keys, &mut pooled, &mut problems);
        keys.shrink();
        if !problems.0.is_empty() {
            let e = CatalogError {
                source: source.to_owned(),
                problems: problems.0,
            };
            return (done, Err(e));
        }
        let mut endpoints = self.endpoints.clone();
        if pooled != self.pooled {
            set_pools(&mut endpoints, &self.groups, &pooled);
        }
        let applied = Snapshot {
            version: self.version.clone(),
            routes: self.routes.clone(),
            endpoints,
            keys,
            groups: self.groups.clone(),
            pooled,
            tz: self.tz,
            unknown_fields: self.unknown_fields.clone(),
            secrets: self.secrets.clone(),
            digest_entries: ctx.digest_entries.get(),
            hmac_entries: ctx.hmac_entries.get(),
        };
        (done, Ok(applied))
    }
}

/// A diff's keys applied to a copy of the key table as they are read.
struct Applying<'a> {
    ctx: &'a KeyContext<'a>,
    keys: &'a mut KeyTable,
    pooled: &'a mut [bool],
    /// The plans of the keys this diff set (so a key set by it is told from one it did not).
    plans: Plans,
    problems: &'a mut Problems,
}

impl Applying<'_> {
    /// Whether this diff set the key named `key` already.
    fn set_here(&self, key: Named) -> bool {
        self.keys.get(key).is_some_and(|(_, p)| self.plans.made(p))
    }
}

impl read::DiffSink for Applying<'_> {
    fn set(&mut self, k: usize, entry: ApiLimits) {
        let set_here = |named: Named, _: &KeyDigest| self.set_here(named).then_some(None);
        match Seen::default().name(self.ctx, k, &entry, set_here) {
            Err((field, reason)) => self.problems.add(format!("apilimits[{k}].{field}"), reason),
            Ok(digest) => {
                let (ctx, plans) = (self.ctx, &mut self.plans);
                add_key(
                    k,
                    digest,
                    &entry,
                    ctx,
                    self.keys,
                    self.pooled,
                    plans,
                    self.problems,
                );
            }
        }
    }

    fn remove(&mut self, key: Named) {
        if !self.set_here(key) {
            self.keys.remove(key);
        }
    }
}

const EMPTY_KEY: &str =
    "the API key is empty (an entry names its key by \"key\" or \"key_digest\")";

/// The keys a document named so far, to find one named twice in any of its forms: a `key`, its
/// `sha256:` digest (one SHA-256, met twice), or its `hmac-sha256:` digest (told only with the
/// secrets: a `key`'s HMACs are remembered here). A `sha256:` and an `hmac-sha256:` digest of one
/// key cannot be told to be one key.
#[derive(Default)]
struct Seen {
    /// Each `key`'s HMAC under each secret, and where the key was (its entry's index).
    hmacs_of_keys: HashMap<KeyDigest, usize>,
    /// The `hmac-sha256:` entries' digests, and where.
    hmac_entries: HashMap<KeyDigest, usize>,
}

impl Seen {
    /// The digest `entry` is held by, once checked: named one way, in a well-formed digest, and
    /// not a key already named (`known`, given how the entry names its key and the key's digest:
    /// where it was met before, `Some(None)` when where is not known). `Err`: the entry's field at
    /// fault and why.
    fn name(
        &mut self,
        ctx: &KeyContext,
        k: usize,
        entry: &ApiLimits,
        known: impl Fn(Named, &KeyDigest) -> Option<Option<usize>>,
    ) -> Result<KeyDigest, (&'static str, String)> {
        let (digest, form) = match (entry.key.is_empty(), entry.key_digest.as_deref()) {
            (false, Some(_)) => {
                return Err((
                    "key_digest",
                    "an entry names its key by \"key\" or by \"key_digest\", not both".into(),
                ));
            }
            (true, None) => return Err(("key", EMPTY_KEY.into())),
            (false, None) => (KeyDigest::sha256(entry.key.as_bytes()), None),
            (true, Some(d)) => match KeyDigest::parse(d) {
                Ok((form, d)) => (d, Some(form)),
                Err(reason) => return Err(("key_digest", reason)),
            },
        };
        let field = match form {
            None => "key",
            Some(_) => "key_digest",
        };
        if form == Some(Form::HmacSha256) && ctx.secrets.is_none() {
            return Err((
                field,
                "an hmac-sha256 digest needs the gateway's key secret (catalog.key_secret_file), \
                 which is not set"
                    .into(),
            ));
        }
        let named = match form {
            None => Named::Plain(entry.key.as_bytes()),
            Some(_) => Named::Digest(&digest),
        };
        if let Some(first) = known(named, &digest) {
            return Err((field, duplicate_key(first)));
        }
        // Recorded as soon as checked: an entry with a problem fails its catalog anyway.
        match (form, ctx.secrets) {
            (Some(Form::HmacSha256), _) => {
                let first = self.hmac_entries.get(&digest);
                if let Some(&first) = first.or_else(|| self.hmacs_of_keys.get(&digest)) {
                    return Err((field, duplicate_key(Some(first))));
                }
                self.hmac_entries.insert(digest, k);
                ctx.hmac_entries.set(true);
                ctx.digest_entries.set(true);
            }
            (Some(Form::Sha256), _) => ctx.digest_entries.set(true),
            (None, Some(secrets)) => {
                for i in 0..secrets.len() {
                    let Some(h) = secrets.hmac(i, entry.key.as_bytes()) else {
                        continue;
                    };
                    if let Some(&first) = self.hmac_entries.get(&h) {
                        return Err((field, duplicate_key(Some(first))));
                    }
                    self.hmacs_of_keys.entry(h).or_insert(k);
                }
            }
            (None, None) => {}
        }
        Ok(digest)
    }
}

/// Whether a key is named in plain and by its SHA-256 in `keys` (one caller twice).
fn plain_twice(keys: &KeyTable) -> bool {
    (keys.plain_keys()).any(|k| keys.get(Named::Digest(&KeyDigest::sha256(k))).is_some())
}

/// Why a key met twice cannot be used; `first`: where it was met first, when known.
fn duplicate_key(first: Option<usize>) -> String {
    match first {
        Some(first) => format!("duplicate API key (also apilimits[{first}])"),
        None => "duplicate API key (also earlier in apilimits)".to_owned(),
    }
}

/// Why one value of a catalog cannot be used; the caller adds where it is.
struct Reason(String);

fn index(i: i64, len: usize, what: &str) -> Result<usize, Reason> {
    match usize::try_from(i) {
        Ok(u) if u < len => Ok(u),
        _ => Err(Reason(format!(
            "index {i} is out of range ({what} has {len} entries)"
        ))),
    }
}

fn limit_value(rl: i64) -> Result<u64, Reason> {
    u64::try_from(rl).map_err(|_| Reason(format!("limit {rl} is negative")))
}

fn window_value(w: Option<&serde_json::Number>) -> Result<u32, Reason> {
    let Some(w) = w else {
        return Ok(WINDOW_SECONDS as u32);
    };
    w.as_u64()
        .and_then(|w| u32::try_from(w).ok())
        .filter(|w| (1..=MAX_WINDOW_SECONDS).contains(w))
        .ok_or_else(|| {
            Reason(format!(
                "window {w} must be a whole number of seconds from 1 to {MAX_WINDOW_SECONDS}"
            ))
        })
}

fn cost_value(c: Option<&serde_json::Number>) -> Result<u64, Reason> {
    let Some(c) = c else { return Ok(1) };
    c.as_u64()
        .filter(|c| (1..=MAX_COST).contains(c))
        .ok_or_else(|| {
            Reason(format!(
                "cost {c} must be a whole number from 1 to {MAX_COST}"
            ))
        })
}

/// An endpoint's `cost_from`, or what is wrong with it (`Err((field suffix, reason))`).
fn cost_from_value(
    c: &super::CostFromDef,
) -> Result<crate::report::CostFrom, (&'static str, String)> {
    use crate::report::CostFrom;
    match (&c.header, &c.json) {
        (Some(h), None) => match http::HeaderName::from_bytes(h.as_bytes()) {
            Ok(name) => Ok(CostFrom::Header(name.as_str().to_owned())),
            Err(_) => Err((".header", format!("{h:?} is not a header name"))),
        },
        (None, Some(path)) => CostFrom::json_path(path).map_err(|r| (".json", r)),
        _ => Err((
            "",
            "cost_from names a response header (\"header\") or a field of its JSON body (\"json\"), one of them".into(),
        )),
    }
}

/// Largest cost of one request (an endpoint's `cost`, or the cost header).
pub const MAX_COST: u64 = 1_000_000;

/// The zone called `name`, or why there is none.
fn zone_value(name: &str) -> Result<ZoneId, Reason> {
    ZoneId::of(name).ok_or_else(|| {
        Reason(format!(
            "unknown time zone {name:?} (an IANA name such as \"Europe/Berlin\", or \"UTC\")"
        ))
    })
}

fn period_value(name: &str) -> Result<Period, Reason> {
    serde_json::from_value(serde_json::Value::String(name.to_owned())).map_err(|_| {
        Reason(format!(
            "unknown period {name:?} (one of \"hour\", \"day\", \"week\", \"month\")"
        ))
    })
}

/// One limit as a catalog writes it (a key's, an endpoint's default, an anonymous one).
#[derive(Clone, Copy, Default)]
struct Spec<'a> {
    rl: Option<i64>,
    concurrent: Option<i64>,
    wait_ms: Option<i64>,
    w: Option<&'a serde_json::Number>,
    shadow: Option<bool>,
    period: Option<&'a str>,
    tz: Option<&'a str>,
}

impl<'a> Spec<'a> {
    fn of(l: &'a LimitDef) -> Spec<'a> {
        Spec {
            rl: l.rl,
            concurrent: l.concurrent,
            wait_ms: l.wait_ms,
            w: l.w.as_ref(),
            shadow: l.shadow,
            period: l.period.as_deref(),
            tz: l.tz.as_deref(),
        }
    }

    fn of_default(d: &'a super::DefaultLimitDef) -> Spec<'a> {
        Spec {
            rl: Some(d.rl),
            concurrent: None,
            wait_ms: None,
            w: d.w.as_ref(),
            shadow: d.shadow,
            period: d.period.as_deref(),
            tz: d.tz.as_deref(),
        }
    }
}

/// Checks one list of limits (a key's on one endpoint, an endpoint's defaults, the anonymous
/// limits of one endpoint): each `rl` and `w` or `period`, no window length or period twice, at
/// most [`MAX_LIMITS`].
struct LimitList {
    limits: Vec<Limit>,
    /// Each limit's wait in milliseconds (0: none).
    waits: Vec<u16>,
    /// The zone of calendar limits that name none (the catalog's `tz`).
    tz: ZoneId,
}

impl LimitList {
    fn new(tz: ZoneId) -> Self {
        LimitList {
            limits: Vec::new(),
            waits: Vec::new(),
            tz,
        }
    }

    /// The limits, shortest window first, then the calendar periods from the hour to the month
    /// (the order of the rate-limit fields).
    fn sorted(self) -> Box<[Limit]> {
        self.sorted_with_waits().0
    }

    /// [`LimitList::sorted`], each limit's wait beside it.
    fn sorted_with_waits(self) -> (Box<[Limit]>, Vec<u16>) {
        let mut both: Vec<(Limit, u16)> = self.limits.into_iter().zip(self.waits).collect();
        both.sort_unstable_by_key(|(l, _)| (l.period().map_or(0, |p| p as u8 + 1), l.w));
        let (limits, waits): (Vec<Limit>, Vec<u16>) = both.into_iter().unzip();
        (limits.into(), waits)
    }

    /// Adds one entry, or says what is wrong with it (`Err((field, reason))`).
    fn add(&mut self, spec: Spec, what: &str) -> Result<(), (&'static str, String)> {
        let rl = match (spec.rl, spec.concurrent) {
            (Some(_), Some(_)) => {
                return Err((
                    "concurrent",
                    "a concurrency limit has no \"rl\" (it counts requests in flight)".into(),
                ));
            }
            (None, Some(n)) => return self.add_concurrent(n, spec, what),
            (None, None) => {
                return Err((
                    "rl",
                    "missing: a limit has \"rl\" (or \"concurrent\")".into(),
                ));
            }
            (Some(rl), None) => limit_value(rl).map_err(|r| ("rl", r.0))?,
        };
        let limit = match spec.period {
            Some(_) if spec.w.is_some() => {
                return Err((
                    "period",
                    "a limit has a window (\"w\") or a calendar period (\"period\"), not both"
                        .into(),
                ));
            }
            Some(name) => {
                let period = period_value(name).map_err(|r| ("period", r.0))?;
                let zone = match spec.tz {
                    Some(tz) => zone_value(tz).map_err(|r| ("tz", r.0))?,
                    None => self.tz,
                };
                if self.limits.iter().any(|l| l.period() == Some(period)) {
                    return Err((
                        "period",
                        format!("{what} already has a limit per {}", period.as_str()),
                    ));
                }
                Limit::calendar(rl, period, zone)
            }
            None if spec.tz.is_some() => {
                return Err((
                    "tz",
                    "a time zone applies only to a calendar limit (one with \"period\")".into(),
                ));
            }
            None => {
                let w = window_value(spec.w).map_err(|r| ("w", r.0))?;
                if self.limits.iter().any(|l| l.period().is_none() && l.w == w) {
                    return Err((
                        "w",
                        format!("{what} already has a limit with a window of {w} s"),
                    ));
                }
                Limit::sliding(rl, w)
            }
        };
        let field = if spec.period.is_some() { "period" } else { "w" };
        self.push(limit, spec, what, field)
    }

    /// Adds a concurrency limit of `n` requests in flight.
    fn add_concurrent(
        &mut self,
        n: i64,
        spec: Spec,
        what: &str,
    ) -> Result<(), (&'static str, String)> {
        let field = match (spec.w, spec.period, spec.tz) {
            (Some(_), _, _) => Some("w"),
            (_, Some(_), _) => Some("period"),
            (_, _, Some(_)) => Some("tz"),
            _ => None,
        };
        if let Some(field) = field {
            return Err((
                field,
                "a concurrency limit has no window, period or time zone".into(),
            ));
        }
        let n = match u64::try_from(n) {
            Ok(n) if n >= 1 => n,
            _ => {
                return Err((
                    "concurrent",
                    format!("{n} requests in flight: a concurrency limit allows at least 1"),
                ));
            }
        };
        if self.limits.iter().any(Limit::is_concurrent) {
            return Err((
                "concurrent",
                format!("{what} already has a concurrency limit"),
            ));
        }
        self.push(Limit::concurrent(n), spec, what, "concurrent")
    }

    /// Adds `limit` (shadow as `spec` says) if there is room for it; `field` names it if not.
    fn push(
        &mut self,
        limit: Limit,
        spec: Spec,
        what: &str,
        field: &'static str,
    ) -> Result<(), (&'static str, String)> {
        if self.limits.len() == MAX_LIMITS {
            return Err((
                field,
                format!(
                    "{what} has more than {MAX_LIMITS} limits (one per window length or period)"
                ),
            ));
        }
        let shadow = spec.shadow.unwrap_or(false);
        let wait = match spec.wait_ms {
            None => 0,
            Some(_) if shadow => {
                return Err((
                    "wait_ms",
                    "a shadow limit never refuses: it has nothing to wait for".into(),
                ));
            }
            Some(ms) => match u16::try_from(ms) {
                Ok(ms) if u64::from(ms) <= MAX_WAIT_MS => ms,
                _ => {
                    return Err((
                        "wait_ms",
                        format!("{ms} ms: a wait is from 0 to {MAX_WAIT_MS} ms"),
                    ));
                }
            },
        };
        self.limits.push(limit.shadowed(shadow));
        self.waits.push(wait);
        Ok(())
    }
}

/// Everything wrong found so far, each with its location.
#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn add(&mut self, at: String, reason: String) {
        self.0.push(Problem { at, reason });
    }
}

/// Checks every part of `raw` (all problems, not the first) and builds the snapshot from it;
/// `keys` checks and builds its keys' table.
fn build<K>(
    raw: CatalogDoc<K>,
    secrets: Option<Arc<KeySecrets>>,
    keys: impl FnOnce(&KeyContext, &K, &mut Problems) -> (KeyTable, Vec<bool>),
) -> Result<Snapshot, Vec<Problem>> {
    let mut problems = Problems::default();
    let tz = match raw.tz.as_deref().map(zone_value) {
        None => ZoneId::UTC,
        Some(Ok(tz)) => tz,
        Some(Err(r)) => {
            problems.add("tz".into(), r.0);
            ZoneId::UTC
        }
    };
    let (mut endpoints, templates) = build_endpoints(&raw, tz, &mut problems);
    // Anonymous limits go to their endpoints only when every endpoint parsed, so that indices
    // into `endpoints` are the catalog's.
    let anonymous = anonymous_limits(&raw, tz, &mut problems);
    if endpoints.len() == raw.endpoints.len() {
        for (e, a) in endpoints.iter_mut().zip(anonymous) {
            e.anonymous = a.sorted();
        }
    }
    let groups = build_groups(&raw, &mut problems);
    let defaults: Vec<usize> = match endpoints.len() == raw.endpoints.len() {
        true => endpoints.iter().map(|e| e.default_limits.len()).collect(),
        false => vec![0; raw.endpoints.len()],
    };
    let ctx = KeyContext {
        endpoints: raw.endpoints.len(),
        tz,
        groups: &groups,
        defaults: &defaults,
        secrets: secrets.as_deref(),
        digest_entries: std::cell::Cell::new(false),
        hmac_entries: std::cell::Cell::new(false),
    };
    let (keys, pooled) = keys(&ctx, &raw.apilimits, &mut problems);
    let (digest_entries, hmac_entries) = (ctx.digest_entries.get(), ctx.hmac_entries.get());
    if endpoints.len() == raw.endpoints.len() {
        set_pools(&mut endpoints, &groups, &pooled);
    }
    // Route conflicts are only meaningful once every endpoint parsed.
    let routes = match templates.len() == raw.endpoints.len() {
        true => build_routes(templates, &mut problems),
        false => RouteTable::default(),
    };
    if !problems.0.is_empty() {
        return Err(problems.0);
    }
    Ok(Snapshot {
        version: raw.version.unwrap_or_default(),
        routes: Arc::new(routes),
        endpoints,
        keys,
        groups: Arc::new(groups),
        pooled,
        tz,
        unknown_fields: Vec::new(),
        secrets,
        digest_entries,
        hmac_entries,
    })
}

/// Each endpoint's pools: the groups that cover it and that some key pools.
fn set_pools(endpoints: &mut [Endpoint], groups: &Groups, pooled: &[bool]) {
    for (e, endpoint) in endpoints.iter_mut().enumerate() {
        endpoint.pools = (0..groups.names.len() as u32)
            .filter(|&g| pooled[g as usize] && groups.covers(g, e as u32))
            .collect();
    }
}

/// What checking one key's limits needs to know of its catalog.
struct KeyContext<'a> {
    /// How many endpoints the catalog has.
    endpoints: usize,
    tz: ZoneId,
    groups: &'a Groups,
    /// `defaults[e]`: how many default limits endpoint `e` has.
    defaults: &'a [usize],
    /// The key secrets `hmac-sha256` digests are made with.
    secrets: Option<&'a KeySecrets>,
    /// Set when an entry named by a digest, and by an `hmac-sha256` one, is met.
    digest_entries: std::cell::Cell<bool>,
    hmac_entries: std::cell::Cell<bool>,
}

/// The catalog's groups, checked, by number: its `groups` in order, then `*`.
#[derive(Debug, Default)]
struct Groups {
    names: Vec<Box<str>>,
    /// Each group's endpoints, ascending (`*`: empty, standing for all).
    members: Vec<Vec<u32>>,
}

impl Groups {
    fn number(&self, name: &str) -> Option<u32> {
        self.names
            .iter()
            .position(|n| &**n == name)
            .map(|g| g as u32)
    }

    fn is_all(&self, g: u32) -> bool {
        g as usize + 1 == self.names.len()
    }

    fn covers(&self, g: u32, endpoint: u32) -> bool {
        self.is_all(g) || self.members[g as usize].binary_search(&endpoint).is_ok()
    }
}

/// A group's name: 1 to 64 letters, digits, `-`, `_` or `.` (it names a counter and a policy).
fn group_name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn build_groups<K>(raw: &CatalogDoc<K>, problems: &mut Problems) -> Groups {
    let mut groups = Groups {
        names: Vec::with_capacity(raw.groups.len() + 1),
        members: Vec::with_capacity(raw.groups.len() + 1),
    };
    for (name, eps) in &raw.groups {
        let at = format!("groups.{name}");
        if !group_name_ok(name) {
            problems.add(
                at.clone(),
                "a group's name is 1 to 64 letters, digits, '-', '_' or '.' (\"*\", every endpoint, needs no entry)".into(),
            );
        }
        if eps.is_empty() {
            problems.add(at.clone(), "the group has no endpoint".into());
        }
        let mut members = Vec::with_capacity(eps.len());
        for (i, &ep) in eps.iter().enumerate() {
            match index(ep, raw.endpoints.len(), "endpoints") {
                Ok(ep) if members.contains(&(ep as u32)) => problems.add(
                    format!("{at}[{i}]"),
                    format!("endpoint {ep} is listed twice"),
                ),
                Ok(ep) => members.push(ep as u32),
                Err(r) => problems.add(format!("{at}[{i}]"), r.0),
            }
        }
        members.sort_unstable();
        groups.names.push(name.as_str().into());
        groups.members.push(members);
    }
    groups.names.push("*".into());
    groups.members.push(Vec::new());
    groups
}

/// The endpoints that check out, and their templates with their index in the catalog.
fn build_endpoints<K>(
    raw: &CatalogDoc<K>,
    tz: ZoneId,
    problems: &mut Problems,
) -> (Vec<Endpoint>, Vec<(usize, Template)>) {
    let mut templates = Vec::with_capacity(raw.endpoints.len());
    let mut endpoints = Vec::with_capacity(raw.endpoints.len());
    for (i, ep) in raw.endpoints.iter().enumerate() {
        let m = index(ep.m, raw.methods.len(), "methods")
            .map_err(|r| problems.add(format!("endpoints[{i}].m"), r.0));
        let p = index(ep.p, raw.paths.len(), "paths")
            .map_err(|r| problems.add(format!("endpoints[{i}].p"), r.0));
        let mut defaults = LimitList::new(tz);
        if let Some(rl) = ep.default_rl
            && let Err((_, r)) = defaults.add(
                Spec {
                    rl: Some(rl),
                    ..Spec::default()
                },
                "this endpoint",
            )
        {
            problems.add(format!("endpoints[{i}].default_rl"), r);
        }
        for (j, d) in ep.default_limits.iter().enumerate() {
            if let Err((field, r)) = defaults.add(Spec::of_default(d), "this endpoint") {
                problems.add(format!("endpoints[{i}].default_limits[{j}].{field}"), r);
            }
        }
        let cost = cost_value(ep.cost.as_ref()).unwrap_or_else(|r| {
            problems.add(format!("endpoints[{i}].cost"), r.0);
            1
        });
        let cost_from = ep.cost_from.as_ref().and_then(|c| {
            cost_from_value(c)
                .map_err(|(field, r)| problems.add(format!("endpoints[{i}].cost_from{field}"), r))
                .ok()
        });
        let (Ok(m), Ok(p)) = (m, p) else { continue };
        let parsed = Template::parse(&raw.methods[m], &raw.paths[p])
            .map_err(|e| e.to_string())
            .and_then(|t| {
                http::Method::from_bytes(t.method.as_bytes())
                    .map(|m| (t, m))
                    .map_err(|e| e.to_string())
            });
        match parsed {
            Ok((t, method)) => {
                endpoints.push(Endpoint {
                    name: format!("{} {}", t.method, t.path),
                    method,
                    default_limits: defaults.sorted(),
                    anonymous: Box::default(),
                    cost,
                    pools: Box::default(),
                    cost_from,
                });
                templates.push((i, t));
            }
            Err(r) => problems.add(format!("endpoints[{i}]"), r),
        }
    }
    (endpoints, templates)
}

/// The anonymous limits of each endpoint, by the catalog's endpoint index.
fn anonymous_limits<K>(raw: &CatalogDoc<K>, tz: ZoneId, problems: &mut Problems) -> Vec<LimitList> {
    let mut anonymous: Vec<LimitList> = (0..raw.endpoints.len())
        .map(|_| LimitList::new(tz))
        .collect();
    for (j, l) in raw.anonymous.iter().enumerate() {
        let at = format!("anonymous[{j}]");
        if l.group.is_some() {
            problems.add(
                format!("{at}.group"),
                "anonymous limits are per endpoint (\"ep\"): pools are for API keys".into(),
            );
            continue;
        }
        let Some(ep) = l.ep else {
            problems.add(at, "an anonymous limit names its endpoint (\"ep\")".into());
            continue;
        };
        if l.wait_ms.is_some() {
            problems.add(
                format!("{at}.wait_ms"),
                "only an API key's limits wait for room".into(),
            );
            continue;
        }
        match index(ep, raw.endpoints.len(), "endpoints") {
            Ok(ep) => {
                let what = format!("endpoint {ep}");
                if let Err((field, r)) = anonymous[ep].add(Spec::of(l), &what) {
                    problems.add(format!("{at}.{field}"), r);
                }
            }
            Err(r) => problems.add(format!("{at}.ep"), r.0),
        }
    }
    anonymous
}

/// Every API key's limits, by endpoint and pool; and which groups some key pools, by number.
fn key_limits(
    ctx: &KeyContext,
    entries: &[ApiLimits],
    problems: &mut Problems,
) -> (KeyTable, Vec<bool>) {
    let mut pooled = vec![false; ctx.groups.names.len()];
    let mut keys = KeyTable::with_capacity(entries.len());
    add_keys(entries, ctx, &mut keys, &mut pooled, problems);
    keys.shrink();
    (keys, pooled)
}

/// Checks `entries` (a catalog's `apilimits`, or a diff's) and sets each key's plan in `keys`,
/// marking the groups they pool in `pooled`.
fn add_keys(
    entries: &[ApiLimits],
    ctx: &KeyContext,
    keys: &mut KeyTable,
    pooled: &mut [bool],
    problems: &mut Problems,
) {
    let mut plans = Plans::default();
    let mut first_seen: HashMap<KeyDigest, usize> = HashMap::with_capacity(entries.len());
    let mut seen = Seen::default();
    for (k, entry) in entries.iter().enumerate() {
        let digest = match seen.name(ctx, k, entry, |_, d| first_seen.get(d).map(|&f| Some(f))) {
            Ok(digest) => digest,
            Err((field, reason)) => {
                problems.add(format!("apilimits[{k}].{field}"), reason);
                continue;
            }
        };
        first_seen.insert(digest, k);
        add_key(k, digest, entry, ctx, keys, pooled, &mut plans, problems);
    }
}

/// Checks `entry` (`apilimits[k]`, named once in its document, held by `digest`) and sets its
/// plan in `keys`; `false`, with its problems added, if it cannot be used.
#[allow(clippy::too_many_arguments)]
fn add_key(
    k: usize,
    digest: KeyDigest,
    entry: &ApiLimits,
    ctx: &KeyContext,
    keys: &mut KeyTable,
    pooled: &mut [bool],
    plans: &mut Plans,
    problems: &mut Problems,
) -> bool {
    match key_plan(k, entry, ctx, pooled, problems) {
        Some(plan) => {
            let named = match entry.key_digest {
                None => Named::Plain(entry.key.as_bytes()),
                Some(_) => Named::Digest(&digest),
            };
            keys.insert(named, digest.id(), plans.share(plan));
            true
        }
        None => false,
    }
}

/// `apilimits[k]`'s plan, or `None` with its problems added; marks the groups it pools.
fn key_plan(
    k: usize,
    entry: &ApiLimits,
    ctx: &KeyContext,
    pooled: &mut [bool],
    problems: &mut Problems,
) -> Option<Plan> {
    let before = problems.0.len();
    let mut per_ep: Vec<(u32, LimitList)> = Vec::new();
    for (j, l) in entry.limits.iter().enumerate() {
        let at = format!("apilimits[{k}].limits[{j}]");
        let ep = match (l.ep, l.group.as_deref()) {
            (Some(_), Some(_)) => {
                problems.add(
                    format!("{at}.group"),
                    "a limit names an endpoint (\"ep\") or a group (\"group\"), not both".into(),
                );
                continue;
            }
            (None, None) => {
                problems.add(
                    at,
                    "a limit names an endpoint (\"ep\") or a group (\"group\")".into(),
                );
                continue;
            }
            (Some(ep), None) => match index(ep, ctx.endpoints, "endpoints") {
                Ok(ep) => ep as u32,
                Err(r) => {
                    problems.add(format!("{at}.ep"), r.0);
                    continue;
                }
            },
            (None, Some(name)) => match ctx.groups.number(name) {
                Some(g) => GROUP | g,
                None => {
                    problems.add(
                        format!("{at}.group"),
                        format!("unknown group {name:?} (not in \"groups\", nor \"*\")"),
                    );
                    continue;
                }
            },
        };
        let list = match per_ep.iter().position(|(e, _)| *e == ep) {
            Some(i) => &mut per_ep[i].1,
            None => {
                per_ep.push((ep, LimitList::new(ctx.tz)));
                &mut per_ep.last_mut().expect("just pushed").1
            }
        };
        let what = match ep & GROUP {
            0 => format!("endpoint {ep}"),
            _ => format!("the pool of group {:?}", l.group.as_deref().unwrap_or("")),
        };
        if let Err((field, r)) = list.add(Spec::of(l), &what) {
            problems.add(format!("{at}.{field}"), r);
        }
    }
    per_ep.sort_unstable_by_key(|(ep, _)| *ep);
    check_pooled_totals(k, &per_ep, ctx.groups, ctx.defaults, problems);
    if problems.0.len() > before {
        return None;
    }
    for (ep, list) in &per_ep {
        if ep & GROUP != 0 && !list.limits.is_empty() {
            pooled[(ep & !GROUP) as usize] = true;
        }
    }
    let mut eps = Vec::with_capacity(entry.limits.len());
    let mut limits = Vec::with_capacity(entry.limits.len());
    let mut waits = Vec::new();
    for (ep, list) in per_ep {
        let (list, list_waits) = list.sorted_with_waits();
        eps.extend(std::iter::repeat_n(ep, list.len()));
        limits.extend(list);
        waits.extend(list_waits);
    }
    if waits.iter().all(|w| *w == 0) {
        waits.clear();
    }
    Some(Plan {
        eps: eps.into(),
        limits: limits.into(),
        waits: waits.into(),
    })
}

/// Every endpoint a key's pools cover is held to at most [`MAX_LIMITS`] limits in all: its own
/// there (or the endpoint's defaults) and each pool's. (`per_ep`: the key's lists, sorted.)
fn check_pooled_totals(
    k: usize,
    per_ep: &[(u32, LimitList)],
    groups: &Groups,
    defaults: &[usize],
    problems: &mut Problems,
) {
    let pools: Vec<(u32, usize)> = per_ep
        .iter()
        .filter(|(ep, _)| ep & GROUP != 0)
        .map(|(ep, list)| (ep & !GROUP, list.limits.len()))
        .collect();
    if pools.is_empty() {
        return;
    }
    for e in 0..defaults.len() as u32 {
        let pooled: usize = pools
            .iter()
            .filter(|(g, _)| groups.covers(*g, e))
            .map(|(_, n)| n)
            .sum();
        if pooled == 0 {
            continue;
        }
        let own = match per_ep.iter().find(|(ep, _)| *ep == e) {
            Some((_, list)) => list.limits.len(),
            None => defaults[e as usize],
        };
        if own + pooled > MAX_LIMITS {
            problems.add(
                format!("apilimits[{k}]"),
                format!(
                    "endpoint {e} would be held to {} limits, its own and its pools' (at most {MAX_LIMITS})",
                    own + pooled
                ),
            );
            return;
        }
    }
}

/// The route table of every endpoint's template; conflicts are located at the catalog's index.
fn build_routes(templates: Vec<(usize, Template)>, problems: &mut Problems) -> RouteTable {
    let raw_index: Vec<usize> = templates.iter().map(|(i, _)| *i).collect();
    match RouteTable::build(templates.into_iter().map(|(_, t)| t).collect()) {
        Ok(t) => t,
        Err(conflicts) => {
            for (i, reason) in conflicts {
                problems.add(format!("endpoints[{}]", raw_index[i]), reason);
            }
            RouteTable::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{ApiLimits, LimitDef};
    use crate::path::{EscapedSlashes, normalize};

    const GOOD: &str = r#"{
        "version": {"semver": "v1", "hash": "h1", "released": "2020-04-12T23:20:50.52Z"},
        "methods": ["GET", "post"],
        "paths": ["/users/{id}/prefs", "/users"],
        "endpoints": [{"p": 0, "m": 0}, {"p": 1, "m": 1, "default_rl": 7}],
        "apilimits": [
            {"key": "k1", "limits": [{"ep": 0, "rl": 20}, {"ep": 1, "rl": 5}]},
            {"key": "k2", "limits": [{"ep": 0, "rl": 0}]}
        ]
    }"#;

    fn problems(json: &str) -> Vec<String> {
        Snapshot::from_json("t.json", json.as_bytes())
            .unwrap_err()
            .problems
            .into_iter()
            .map(|p| format!("{}: {}", p.at, p.reason))
            .collect()
    }

    #[test]
    fn loads_a_good_catalog_and_answers_limits() {
        let s = Snapshot::from_json("t.json", GOOD.as_bytes()).unwrap();
        assert_eq!(s.version.hash, "h1");
        let path = normalize("/users/9/prefs", EscapedSlashes::Reject).unwrap();
        let r = s.route("GET", path).unwrap();
        assert_eq!(s.endpoints()[r.endpoint].name, "GET /users/{id}/prefs");
        let per_minute =
            |rl| LimitLookup::Limits(Applied::own(Box::leak(Box::new([Limit::per_minute(rl)]))));
        assert_eq!(s.limit(b"k1", 0), per_minute(20));
        assert_eq!(s.limit(b"k2", 0), per_minute(0));
        assert_eq!(s.limit(b"k2", 1), per_minute(7), "endpoint default");
        assert_eq!(
            s.limit(b"nobody", 1),
            LimitLookup::UnknownKey,
            "defaults never apply to unknown keys"
        );
        let s2 = Snapshot::from_json("t", br#"{"methods":["GET"],"paths":["/a"],"endpoints":[{"p":0,"m":0}],"apilimits":[{"key":"k","limits":[]}]}"#).unwrap();
        assert_eq!(s2.limit(b"k", 0), LimitLookup::NoLimit);
    }

    #[test]
    fn every_problem_is_reported_with_its_location() {
        let got = problems(
            r#"{
            "methods": ["GET"],
            "paths": ["/a", "/b/{x}"],
            "endpoints": [{"p": 2, "m": 0}, {"p": 0, "m": -1}, {"p": 1, "m": 0, "default_rl": -3}],
            "apilimits": [
                {"key": "k", "limits": [{"ep": 3, "rl": 1}, {"ep": 2, "rl": -5}]},
                {"key": "k", "limits": []},
                {"key": "", "limits": []},
                {"key": "j", "limits": [{"ep": 2, "rl": 1}, {"ep": 2, "rl": 2}]}
            ]
        }"#,
        );
        let want = [
            "endpoints[0].p: index 2 is out of range (paths has 2 entries)",
            "endpoints[1].m: index -1 is out of range (methods has 1 entries)",
            "endpoints[2].default_rl: limit -3 is negative",
            "apilimits[0].limits[0].ep: index 3 is out of range (endpoints has 3 entries)",
            "apilimits[0].limits[1].rl: limit -5 is negative",
            "apilimits[1].key: duplicate API key (also apilimits[0])",
            "apilimits[2].key: the API key is empty (an entry names its key by \"key\" or \"key_digest\")",
            "apilimits[3].limits[1].w: endpoint 2 already has a limit with a window of 60 s",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn the_extension_fields_load_and_bad_values_name_their_field() {
        let s = Snapshot::from_json(
            "t",
            br#"{"methods":["GET"],"paths":["/a","/b"],
                "endpoints":[{"p":0,"m":0,"cost":2,"default_limits":[{"rl":10,"w":1},{"rl":600}]},
                             {"p":1,"m":0,"default_rl":5,"default_limits":[{"rl":100,"w":3600,"shadow":true}]}],
                "apilimits":[{"key":"k","limits":[{"ep":0,"rl":1000,"w":86400},{"ep":0,"rl":20,"w":1},{"ep":0,"rl":50}]}],
                "anonymous":[{"ep":0,"rl":30,"w":60},{"ep":0,"rl":2,"w":1}]}"#,
        )
        .unwrap();
        let l = |rl, w, shadow| Limit::sliding(rl, w).shadowed(shadow);
        assert_eq!(
            s.limit(b"k", 0),
            LimitLookup::Limits(Applied::own(&[
                l(20, 1, false),
                l(50, 60, false),
                l(1000, 86400, false)
            ])),
            "sorted by window"
        );
        let e = &s.endpoints()[0];
        assert_eq!(e.cost, 2);
        assert_eq!(&*e.anonymous, &[l(2, 1, false), l(30, 60, false)]);
        assert_eq!(&*e.default_limits, &[l(10, 1, false), l(600, 60, false)]);
        assert_eq!(
            &*s.endpoints()[1].default_limits,
            &[l(5, 60, false), l(100, 3600, true)],
            "default_rl and default_limits together"
        );
        assert_eq!(s.endpoints()[1].cost, 1);

        let got = problems(
            r#"{"methods":["GET"],"paths":["/a"],
                "endpoints":[{"p":0,"m":0,"cost":0,"default_rl":1,"default_limits":[{"rl":2}]}],
                "apilimits":[{"key":"k","limits":[{"ep":0,"rl":1,"w":0},{"ep":0,"rl":1,"w":86401},
                    {"ep":0,"rl":1,"w":1.5},{"ep":0,"rl":1,"w":-2},{"ep":0,"rl":1,"w":5},{"ep":0,"rl":2,"w":5}]}],
                "anonymous":[{"ep":4,"rl":1},{"ep":0,"rl":-1}]}"#,
        );
        let want = [
            "endpoints[0].default_limits[0].w: this endpoint already has a limit with a window of 60 s",
            "endpoints[0].cost: cost 0 must be a whole number from 1 to 1000000",
            "anonymous[0].ep: index 4 is out of range (endpoints has 1 entries)",
            "anonymous[1].rl: limit -1 is negative",
            "apilimits[0].limits[0].w: window 0 must be a whole number of seconds from 1 to 86400",
            "apilimits[0].limits[1].w: window 86401 must be a whole number of seconds from 1 to 86400",
            "apilimits[0].limits[2].w: window 1.5 must be a whole number of seconds from 1 to 86400",
            "apilimits[0].limits[3].w: window -2 must be a whole number of seconds from 1 to 86400",
            "apilimits[0].limits[5].w: endpoint 0 already has a limit with a window of 5 s",
        ];
        assert_eq!(got, want);
        let seven: Vec<String> = (1..=7)
            .map(|w| format!(r#"{{"ep":0,"rl":1,"w":{w}}}"#))
            .collect();
        let got = problems(&format!(
            r#"{{"methods":["GET"],"paths":["/a"],"endpoints":[{{"p":0,"m":0}}],
                "apilimits":[{{"key":"k","limits":[{}]}}]}}"#,
            seven.join(",")
        ));
        assert_eq!(
            got,
            [
                "apilimits[0].limits[6].w: endpoint 0 has more than 6 limits (one per window length or period)"
            ]
        );
    }

    #[test]
    fn pools_apply_to_every_endpoint_of_their_group_beside_its_own_limits() {
        let s = Snapshot::from_json(
            "t",
            br#"{"methods":["GET"],"paths":["/a","/b","/c"],
                "groups":{"search":[0,1]},
                "endpoints":[{"p":0,"m":0},{"p":1,"m":0,"default_rl":9},{"p":2,"m":0}],
                "apilimits":[
                    {"key":"k","limits":[{"ep":0,"rl":10,"w":1},{"group":"search","rl":100,"period":"day"},
                                         {"group":"*","rl":1000}]},
                    {"key":"plain","limits":[{"ep":2,"rl":5}]}]}"#,
        )
        .unwrap();
        let look = |key: &[u8], ep| match s.limit(key, ep) {
            LimitLookup::Limits(a) => (a.own.to_vec(), a.pools().collect::<Vec<_>>()),
            other => panic!("{other:?}"),
        };
        let day = Limit::calendar(100, Period::Day, ZoneId::UTC);
        let all = Limit::per_minute(1000);
        assert_eq!(
            look(b"k", 0),
            (
                vec![Limit::sliding(10, 1)],
                vec![("search", &[day][..]), ("*", &[all][..])]
            )
        );
        assert_eq!(
            look(b"k", 1),
            (
                vec![Limit::per_minute(9)],
                vec![("search", &[day][..]), ("*", &[all][..])]
            ),
            "the endpoint's default beside the pools"
        );
        assert_eq!(
            look(b"k", 2),
            (vec![], vec![("*", &[all][..])]),
            "limited by a pool alone"
        );
        assert_eq!(look(b"plain", 2), (vec![Limit::per_minute(5)], vec![]));
        assert_eq!(s.limit(b"plain", 0), LimitLookup::NoLimit);

        let got = problems(
            r#"{"methods":["GET"],"paths":["/a"],
                "groups":{"":[0],"*":[0],"empty":[],"far":[3,0,0]},
                "endpoints":[{"p":0,"m":0}],
                "apilimits":[{"key":"k","limits":[{"rl":1},{"ep":0,"group":"far","rl":1},
                    {"group":"nope","rl":1},{"group":"far","rl":1},{"group":"far","rl":2}]},
                  {"key":"many","limits":[{"ep":0,"rl":1,"w":1},{"ep":0,"rl":1,"w":2},{"ep":0,"rl":1,"w":3},
                    {"ep":0,"rl":1,"w":4},{"group":"*","rl":1,"w":5},{"group":"far","rl":1,"w":6},{"group":"far","rl":1}]}],
                "anonymous":[{"group":"far","rl":1},{"rl":1}]}"#,
        );
        let want = [
            r#"anonymous[0].group: anonymous limits are per endpoint ("ep"): pools are for API keys"#,
            r#"anonymous[1]: an anonymous limit names its endpoint ("ep")"#,
            r#"groups.: a group's name is 1 to 64 letters, digits, '-', '_' or '.' ("*", every endpoint, needs no entry)"#,
            r#"groups.*: a group's name is 1 to 64 letters, digits, '-', '_' or '.' ("*", every endpoint, needs no entry)"#,
            "groups.empty: the group has no endpoint",
            "groups.far[0]: index 3 is out of range (endpoints has 1 entries)",
            "groups.far[2]: endpoint 0 is listed twice",
            r#"apilimits[0].limits[0]: a limit names an endpoint ("ep") or a group ("group")"#,
            r#"apilimits[0].limits[1].group: a limit names an endpoint ("ep") or a group ("group"), not both"#,
            r#"apilimits[0].limits[2].group: unknown group "nope" (not in "groups", nor "*")"#,
            r#"apilimits[0].limits[4].w: the pool of group "far" already has a limit with a window of 60 s"#,
            "apilimits[1]: endpoint 0 would be held to 7 limits, its own and its pools' (at most 6)",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn cost_from_names_a_header_or_a_json_field_and_bad_ones_name_their_value() {
        use crate::report::CostFrom;
        let s = Snapshot::from_json(
            "t",
            br#"{"methods":["POST"],"paths":["/a","/b","/c"],
                "endpoints":[{"p":0,"m":0,"cost_from":{"header":"X-Usage-Tokens"}},
                             {"p":1,"m":0,"cost":100,"cost_from":{"json":"usage.total_tokens"}},{"p":2,"m":0}],
                "apilimits":[]}"#,
        )
        .unwrap();
        let from: Vec<_> = s.endpoints().iter().map(|e| e.cost_from.clone()).collect();
        assert_eq!(
            from,
            [
                Some(CostFrom::Header("x-usage-tokens".into())),
                Some(CostFrom::Json(
                    vec!["usage".into(), "total_tokens".into()].into()
                )),
                None
            ]
        );
        let got = problems(
            r#"{"methods":["POST"],"paths":["/a","/b","/c","/d"],
                "endpoints":[{"p":0,"m":0,"cost_from":{}},{"p":1,"m":0,"cost_from":{"header":"x","json":"a"}},
                             {"p":2,"m":0,"cost_from":{"header":"bad header"}},{"p":3,"m":0,"cost_from":{"json":"usage..n"}}],
                "apilimits":[]}"#,
        );
        let neither = r#"cost_from names a response header ("header") or a field of its JSON body ("json"), one of them"#;
        let want = [
            format!("endpoints[0].cost_from: {neither}"),
            format!("endpoints[1].cost_from: {neither}"),
            r#"endpoints[2].cost_from.header: "bad header" is not a header name"#.to_owned(),
            r#"endpoints[3].cost_from.json: "usage..n" is not a JSON path (keys separated by dots, such as "usage.total_tokens", at most 256 bytes)"#.to_owned(),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn calendar_limits_load_in_their_zone_and_bad_ones_name_their_field() {
        let s = Snapshot::from_json(
            "t",
            br#"{"methods":["GET"],"paths":["/a","/b"],"tz":"Europe/Berlin",
                "endpoints":[{"p":0,"m":0,"default_limits":[{"rl":100,"period":"day"}]},{"p":1,"m":0}],
                "apilimits":[{"key":"k","limits":[
                    {"ep":0,"rl":10000,"period":"month","tz":"America/Los_Angeles"},
                    {"ep":0,"rl":1000,"period":"day"},{"ep":0,"rl":10,"w":1},{"ep":0,"rl":50}]}],
                "anonymous":[{"ep":1,"rl":5,"period":"hour","shadow":true}]}"#,
        )
        .unwrap();
        let berlin = ZoneId::of("Europe/Berlin").unwrap();
        let la = ZoneId::of("America/Los_Angeles").unwrap();
        assert_eq!(
            s.limit(b"k", 0),
            LimitLookup::Limits(Applied::own(&[
                Limit::sliding(10, 1),
                Limit::per_minute(50),
                Limit::calendar(1000, Period::Day, berlin),
                Limit::calendar(10000, Period::Month, la),
            ])),
            "windows, then periods from the shortest"
        );
        assert_eq!(
            &*s.endpoints()[0].default_limits,
            &[Limit::calendar(100, Period::Day, berlin)]
        );
        assert_eq!(
            &*s.endpoints()[1].anonymous,
            &[Limit::calendar(5, Period::Hour, berlin).shadowed(true)]
        );

        let got = problems(
            r#"{"methods":["GET"],"paths":["/a"],"tz":"Europe/Atlantis",
                "endpoints":[{"p":0,"m":0,"default_limits":[{"rl":2,"period":"fortnight"}]}],
                "apilimits":[{"key":"k","limits":[{"ep":0,"rl":1,"period":"day","w":60},
                    {"ep":0,"rl":1,"period":"week","tz":"Mars/Olympus_Mons"},{"ep":0,"rl":1,"w":5,"tz":"UTC"},
                    {"ep":0,"rl":1,"period":"day"},{"ep":0,"rl":2,"period":"day","tz":"Asia/Tokyo"}]}]}"#,
        );
        let want = [
            r#"tz: unknown time zone "Europe/Atlantis" (an IANA name such as "Europe/Berlin", or "UTC")"#,
            r#"endpoints[0].default_limits[0].period: unknown period "fortnight" (one of "hour", "day", "week", "month")"#,
            r#"apilimits[0].limits[0].period: a limit has a window ("w") or a calendar period ("period"), not both"#,
            r#"apilimits[0].limits[1].tz: unknown time zone "Mars/Olympus_Mons" (an IANA name such as "Europe/Berlin", or "UTC")"#,
            r#"apilimits[0].limits[2].tz: a time zone applies only to a calendar limit (one with "period")"#,
            "apilimits[0].limits[4].period: endpoint 0 already has a limit per day",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn concurrency_limits_load_beside_rates_and_bad_ones_name_their_field() {
        let s = Snapshot::from_json(
            "t",
            br#"{"methods":["GET"],"paths":["/a","/b"],"groups":{"g":[0,1]},
                "endpoints":[{"p":0,"m":0},{"p":1,"m":0}],
                "apilimits":[{"key":"k","limits":[
                    {"ep":0,"rl":10,"w":1},{"ep":0,"concurrent":3},{"group":"g","concurrent":8}]}]}"#,
        )
        .unwrap();
        let LimitLookup::Limits(a) = s.limit(b"k", 0) else {
            panic!("limited")
        };
        assert_eq!(a.own, &[Limit::concurrent(3), Limit::sliding(10, 1)]);
        assert_eq!(
            a.pools().collect::<Vec<_>>(),
            [("g", &[Limit::concurrent(8)][..])]
        );

        let got = problems(
            r#"{"methods":["GET"],"paths":["/a"],
                "endpoints":[{"p":0,"m":0}],
                "apilimits":[{"key":"k","limits":[{"ep":0,"concurrent":0},
                    {"ep":0,"concurrent":2,"rl":5},{"ep":0,"concurrent":2,"w":1},
                    {"ep":0,"concurrent":2,"period":"day"},{"ep":0},
                    {"ep":0,"concurrent":2},{"ep":0,"concurrent":3}]}]}"#,
        );
        let want = [
            "apilimits[0].limits[0].concurrent: 0 requests in flight: a concurrency limit allows at least 1",
            r#"apilimits[0].limits[1].concurrent: a concurrency limit has no "rl" (it counts requests in flight)"#,
            "apilimits[0].limits[2].w: a concurrency limit has no window, period or time zone",
            "apilimits[0].limits[3].period: a concurrency limit has no window, period or time zone",
            r#"apilimits[0].limits[4].rl: missing: a limit has "rl" (or "concurrent")"#,
            "apilimits[0].limits[6].concurrent: endpoint 0 already has a concurrency limit",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn waits_follow_their_limits_and_bad_ones_name_their_field() {
        let s = Snapshot::from_json(
            "t",
            br#"{"methods":["GET"],"paths":["/a","/b"],"groups":{"g":[0,1]},
                "endpoints":[{"p":0,"m":0},{"p":1,"m":0,"default_rl":5}],
                "apilimits":[{"key":"k","limits":[
                    {"ep":0,"rl":100,"w":60,"wait_ms":250},{"ep":0,"rl":10,"w":1},
                    {"group":"g","concurrent":2,"wait_ms":60000}]},
                    {"key":"plain","limits":[{"ep":0,"rl":1}]}]}"#,
        )
        .unwrap();
        let waits = |key: &[u8], ep| {
            let LimitLookup::Limits(a) = s.limit(key, ep) else {
                panic!("limited")
            };
            s.waits(ep, &a)
        };
        assert_eq!(
            waits(b"k", 0),
            Some([0, 250, 60_000, 0, 0, 0]),
            "the 1 s window, the 60 s one, then the pool's slots"
        );
        assert_eq!(
            waits(b"k", 1),
            Some([0, 60_000, 0, 0, 0, 0]),
            "defaults never wait"
        );
        assert_eq!(waits(b"plain", 0), None);
        let none = Snapshot::from_json("t", GOOD.as_bytes()).unwrap();
        let LimitLookup::Limits(a) = none.limit(b"k1", 0) else {
            panic!("limited")
        };
        assert_eq!(none.waits(0, &a), None);

        let got = problems(
            r#"{"methods":["GET"],"paths":["/a"],"endpoints":[{"p":0,"m":0}],
                "apilimits":[{"key":"k","limits":[{"ep":0,"rl":1,"wait_ms":60001},
                    {"ep":0,"rl":1,"w":1,"wait_ms":-1},{"ep":0,"rl":1,"w":2,"shadow":true,"wait_ms":5}]}],
                "anonymous":[{"ep":0,"rl":1,"wait_ms":5}]}"#,
        );
        let want = [
            "anonymous[0].wait_ms: only an API key's limits wait for room",
            "apilimits[0].limits[0].wait_ms: 60001 ms: a wait is from 0 to 60000 ms",
            "apilimits[0].limits[1].wait_ms: -1 ms: a wait is from 0 to 60000 ms",
            "apilimits[0].limits[2].wait_ms: a shadow limit never refuses: it has nothing to wait for",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn off_by_one_index_is_an_error_not_a_panic() {
        // DynLimits checks `p > len` and crashes on `p == len`.
        let got = problems(
            r#"{"methods":["GET"],"paths":["/a"],"endpoints":[{"p":1,"m":0}],"apilimits":[]}"#,
        );
        assert_eq!(
            got,
            ["endpoints[0].p: index 1 is out of range (paths has 1 entries)"]
        );
    }

    #[test]
    fn duplicate_and_conflicting_routes_are_refused() {
        let got = problems(
            r#"{"methods":["GET","get"],"paths":["/a/{x}","/A/{y}/"],
                "endpoints":[{"p":0,"m":0},{"p":1,"m":1}],"apilimits":[]}"#,
        );
        assert_eq!(got.len(), 1);
        assert!(
            got[0].starts_with("endpoints[1]: GET /A/{y}/ is the same route as endpoint 0"),
            "{got:?}"
        );
    }

    #[test]
    fn bad_templates_and_methods_are_refused() {
        let got = problems(
            r#"{"methods":["GET","B AD"],"paths":["nope","/ok"],"endpoints":[{"p":0,"m":0},{"p":1,"m":1}],"apilimits":[]}"#,
        );
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("endpoints[0]: path \"nope\" must start with '/'"));
        assert!(got[1].contains("not a valid HTTP method"));
    }

    #[test]
    fn syntax_errors_and_wrong_types_are_problems() {
        let got = problems(r#"{"methods": ["GET"],}"#);
        assert!(
            got[0].starts_with(": not a valid catalog document"),
            "{got:?}"
        );
        let got = problems(r#"{"endpoints": [{"p": "x", "m": 0}]}"#);
        assert!(got[0].contains("not a valid catalog document"));
        let got = problems(r#"[1, 2]"#);
        assert!(got[0].contains("not a valid catalog document"));
    }

    #[test]
    fn a_parse_error_names_the_json_path_of_the_value_at_fault() {
        let got = problems(
            r#"{"methods": ["GET"], "paths": ["/a"], "endpoints": [{"p": 0, "m": 0}],
                "apilimits": [{"key": "k", "limits": [{"ep": 0, "rl": 5, "w": "abc"}]}]}"#,
        );
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with(
                "apilimits[0].limits[0].w: not a valid catalog document: invalid type: string \"abc\", expected"
            ),
            "{got:?}"
        );
    }

    #[test]
    fn a_misspelt_field_is_named_beside_the_missing_one() {
        let got = problems(
            r#"{"methods": ["GET"], "paths": ["/a"], "endpoints": [{"p": 0, "m": 0}],
                "apilimits": [{"key": "k", "limit": [{"ep": 0, "rl": 5}]}]}"#,
        );
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            got[0]
                .starts_with("apilimits[0]: not a valid catalog document: missing field `limits`"),
            "{got:?}"
        );
        assert_eq!(got[1], "apilimits[0].limit: unknown field (a misspelling?)");
    }

    #[test]
    fn a_diff_applied_to_a_snapshot_answers_as_the_newer_catalog_built_whole() {
        let old = r#"{"version": {"hash": "a"}, "methods": ["GET"], "paths": ["/a", "/b", "/c"],
            "endpoints": [{"p": 0, "m": 0}, {"p": 1, "m": 0, "default_rl": 3}, {"p": 2, "m": 0}],
            "groups": {"ab": [0, 1]},
            "apilimits": [
                {"key": "k1", "limits": [{"ep": 0, "rl": 5, "wait_ms": 100}, {"ep": 1, "rl": 6}]},
                {"key": "k2", "limits": [{"ep": 0, "rl": 7}]},
                {"key": "k3", "limits": [{"ep": 2, "rl": 8}]}]}"#;
        let new = r#"{"version": {"hash": "b"}, "methods": ["GET"], "paths": ["/a", "/b", "/c"],
            "endpoints": [{"p": 0, "m": 0}, {"p": 1, "m": 0, "default_rl": 3}, {"p": 2, "m": 0}],
            "groups": {"ab": [0, 1]},
            "apilimits": [
                {"key": "k1", "limits": [{"ep": 0, "rl": 9}, {"ep": 1, "rl": 6}]},
                {"key": "k3", "limits": [{"ep": 2, "rl": 8}]},
                {"key": "k4", "limits": [{"group": "ab", "rl": 50}, {"ep": 1, "rl": 2}]},
                {"key": "k5", "limits": [{"ep": 2, "rl": 1, "wait_ms": 250}]}]}"#;
        let (old_doc, new_doc) = (
            CatalogDoc::parse("old", old.as_bytes()).unwrap(),
            CatalogDoc::parse("new", new.as_bytes()).unwrap(),
        );
        let diff = old_doc.diff_to(&new_doc).unwrap();
        let before = Snapshot::build("old", old_doc).unwrap();
        // A diff as received: read as it arrives, its keys applied one at a time.
        let apply_read = |diff: &CatalogDiff| {
            let json = serde_json::to_vec(diff).unwrap();
            before.apply_read("diff", &json[..]).map(Option::unwrap)
        };
        let whole = Snapshot::from_json("new", new.as_bytes()).unwrap();
        assert_eq!(
            whole.endpoints(),
            Snapshot::build("new", new_doc).unwrap().endpoints()
        );
        for applied in [before.apply("diff", &diff), apply_read(&diff)] {
            check_applied(&before, &applied.unwrap(), &whole);
        }

        // A diff is checked as a whole catalog is, its problems located in the diff.
        let mut bad = diff.clone();
        bad.apilimits[0].limits[0].ep = Some(9);
        bad.apilimits.push(bad.apilimits[1].clone());
        let mut twice = diff.clone();
        twice.apilimits.push(twice.apilimits[0].clone());
        let problems = |r: Result<Snapshot, CatalogError>| -> Vec<String> {
            let err = r.unwrap_err();
            err.problems
                .iter()
                .map(|p| format!("{}: {}", p.at, p.reason))
                .collect()
        };
        let out_of_range =
            "apilimits[0].limits[0].ep: index 9 is out of range (endpoints has 3 entries)";
        assert_eq!(
            problems(before.apply("diff", &bad)),
            [
                out_of_range,
                "apilimits[3].key: duplicate API key (also apilimits[1])"
            ]
        );
        // Read as it arrives, a diff does not keep where each key was.
        assert_eq!(
            problems(apply_read(&bad)),
            [
                out_of_range,
                "apilimits[3].key: duplicate API key (also earlier in apilimits)"
            ]
        );
        assert_eq!(
            problems(apply_read(&twice)),
            ["apilimits[3].key: duplicate API key (also earlier in apilimits)"]
        );

        // Removed keys before or after the keys set: a key both removed and set is set.
        for json in [
            r#"{"from": "a", "version": {"hash": "c"}, "removed_keys": ["k1", "k2"],
                "apilimits": [{"key": "k1", "limits": [{"ep": 2, "rl": 4}]}]}"#,
            r#"{"apilimits": [{"key": "k1", "limits": [{"ep": 2, "rl": 4}]}],
                "removed_keys": ["k1", "k2"], "version": {"hash": "c"}, "from": "a"}"#,
        ] {
            let s = before.apply_read("diff", json.as_bytes()).unwrap().unwrap();
            assert_eq!(s.version.hash, "c");
            assert_eq!(
                s.limit(b"k1", 2),
                LimitLookup::Limits(Applied::own(&[Limit::per_minute(4)]))
            );
            assert_eq!(s.limit(b"k2", 0), LimitLookup::UnknownKey);
            assert_eq!(s.key_count(), 2);
        }
        let other = r#"{"from": "z", "version": {"hash": "c"}, "apilimits": []}"#;
        assert!(
            before
                .apply_read("diff", other.as_bytes())
                .unwrap()
                .is_none()
        );
        let wrong = r#"{"from": "a", "version": {"hash": "c"},
            "apilimits": [{"key": "k1", "limits": [{"ep": "x"}]}]}"#;
        let got = problems(
            before
                .apply_read("diff", wrong.as_bytes())
                .map(Option::unwrap),
        );
        assert!(
            got[0].starts_with("apilimits[0].limits[0].ep: not a valid catalog diff: invalid type"),
            "{got:?}"
        );
    }

    /// `applied` (`before` and a diff) answers as `whole`, and `before` is as it was.
    fn check_applied(before: &Snapshot, applied: &Snapshot, whole: &Snapshot) {
        assert_eq!(applied.version.hash, "b");
        assert_eq!(applied.key_count(), 4);
        assert_eq!(
            applied.endpoints(),
            whole.endpoints(),
            "the pool of ab now covers 0 and 1"
        );
        for key in ["k1", "k2", "k3", "k4", "k5", "nobody"] {
            for ep in 0..4 {
                let (got, want) = (
                    applied.limit(key.as_bytes(), ep),
                    whole.limit(key.as_bytes(), ep),
                );
                assert_eq!(got, want, "{key} on {ep}");
                if let (LimitLookup::Limits(g), LimitLookup::Limits(w)) = (got, want) {
                    assert_eq!(applied.waits(ep, &g), whole.waits(ep, &w), "{key} on {ep}");
                }
            }
        }
        assert_ne!(
            before.limit(b"k2", 0),
            LimitLookup::UnknownKey,
            "the old version unchanged"
        );
        assert_eq!(before.limit(b"k4", 0), LimitLookup::UnknownKey);
    }

    /// A catalog of one endpoint whose entries are `entries` (JSON objects without their limits),
    /// each given 5 requests a minute there.
    fn keyed(entries: &[&str]) -> String {
        let entries: Vec<String> = entries
            .iter()
            .map(|e| format!(r#"{{{e}, "limits": [{{"ep": 0, "rl": 5}}]}}"#))
            .collect();
        format!(
            r#"{{"methods": ["GET"], "paths": ["/a"], "endpoints": [{{"p": 0, "m": 0}}],
                "apilimits": [{}]}}"#,
            entries.join(",")
        )
    }

    fn sha(key: &str) -> String {
        KeyDigest::sha256(key.as_bytes()).display(Form::Sha256)
    }

    fn hmac(secrets: &KeySecrets, i: usize, key: &str) -> String {
        secrets
            .hmac(i, key.as_bytes())
            .unwrap()
            .display(Form::HmacSha256)
    }

    fn both_ways(json: &str, secrets: Option<&Arc<KeySecrets>>) -> Result<Snapshot, Vec<String>> {
        let listed = |e: CatalogError| -> Vec<String> {
            e.problems
                .into_iter()
                .map(|p| format!("{}: {}", p.at, p.reason))
                .collect()
        };
        let streamed = Snapshot::from_json_with("t", json.as_bytes(), secrets.cloned());
        let doc = CatalogDoc::parse("t", json.as_bytes()).unwrap();
        let whole = Snapshot::build_with("t", doc, secrets.cloned());
        match (streamed, whole) {
            (Ok(s), Ok(_)) => Ok(s),
            (Err(a), Err(b)) => {
                let (a, b) = (listed(a), listed(b));
                assert_eq!(a, b, "read one key at a time or whole, the same problems");
                Err(a)
            }
            (a, b) => panic!("{:?} / {:?}", a.map(|_| ()), b.map(|_| ())),
        }
    }

    #[test]
    fn keys_named_by_their_digests_get_their_limits_and_counters() {
        let secrets = KeySecrets::from_file_text(b"current\nprevious").unwrap();
        let json = keyed(&[
            r#""key": "plain""#,
            &format!(r#""key_digest": "{}""#, sha("hashed")),
            &format!(r#""key_digest": "{}""#, hmac(&secrets, 0, "keyed-now")),
            &format!(r#""key_digest": "{}""#, hmac(&secrets, 1, "keyed-before")),
        ]);
        let s = both_ways(&json, Some(&secrets)).unwrap();
        assert_eq!(s.key_count(), 4);
        for key in ["plain", "hashed", "keyed-now", "keyed-before"] {
            let LimitLookup::Limits(l) = s.limit(key.as_bytes(), 0) else {
                panic!("{key}")
            };
            assert_eq!(l.own[0].rl, 5, "{key}");
            let id = l.key_id().unwrap();
            assert_eq!(Some(id), s.find(key.as_bytes()));
            assert!(!id.to_string().contains(key));
        }
        for stranger in ["", "Plain", "hashed ", "current", "keyed-now\n"] {
            assert_eq!(
                s.limit(stranger.as_bytes(), 0),
                LimitLookup::UnknownKey,
                "{stranger:?}"
            );
        }
        // A plain key and its sha256: form are one caller, counted under one name: the first
        // half of its SHA-256 (printf %s plain | sha256sum).
        let as_digest = both_ways(
            &keyed(&[&format!(r#""key_digest": "{}""#, sha("plain"))]),
            None,
        )
        .unwrap();
        let id = |s: &Snapshot| match s.limit(b"plain", 0) {
            LimitLookup::Limits(l) => l.key_id().unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(id(&s), id(&as_digest));
        assert_eq!(id(&s).to_string(), sha("plain")[7..39]);
        // Without the previous secret, a key digested under it is a stranger.
        let rotated = KeySecrets::from_file_text(b"current").unwrap();
        let s = both_ways(&json, Some(&rotated)).unwrap();
        assert_eq!(s.limit(b"keyed-before", 0), LimitLookup::UnknownKey);
        assert!(matches!(s.limit(b"keyed-now", 0), LimitLookup::Limits(_)));
    }

    #[test]
    fn badly_named_entries_are_refused_where_they_are() {
        let secrets = KeySecrets::from_file_text(b"s").unwrap();
        let d = sha("k");
        let h = hmac(&secrets, 0, "k");
        type Case<'a> = (Vec<String>, Option<&'a Arc<KeySecrets>>, &'a str);
        let cases: Vec<Case> = vec![
            (
                vec![r#""key_digest": "sha256:abc""#.into()],
                None,
                "apilimits[0].key_digest: \"sha256:abc\" is not a key digest: after \"sha256:\" \
                 come exactly 64 lowercase hex digits (it has 3 characters)",
            ),
            (
                vec![r#""key_digest": "md5:abc""#.into()],
                None,
                "apilimits[0].key_digest: \"md5:abc\" is not a key digest: expected \
                 sha256:<64 hex digits> or hmac-sha256:<64 hex digits> (quotagate key-digest \
                 prints them)",
            ),
            (
                vec![format!(r#""key": "k", "key_digest": "{d}""#)],
                None,
                "apilimits[0].key_digest: an entry names its key by \"key\" or by \
                 \"key_digest\", not both",
            ),
            (
                vec![format!(r#""key_digest": "{h}""#)],
                None,
                "apilimits[0].key_digest: an hmac-sha256 digest needs the gateway's key secret \
                 (catalog.key_secret_file), which is not set",
            ),
            (
                vec![r#""key": "k""#.into(), format!(r#""key_digest": "{d}""#)],
                None,
                "apilimits[1].key_digest: duplicate API key (also apilimits[0])",
            ),
            (
                vec![format!(r#""key_digest": "{d}""#), r#""key": "k""#.into()],
                None,
                "apilimits[1].key: duplicate API key (also apilimits[0])",
            ),
            (
                vec![r#""key": "k""#.into(), format!(r#""key_digest": "{h}""#)],
                Some(&secrets),
                "apilimits[1].key_digest: duplicate API key (also apilimits[0])",
            ),
            (
                vec![format!(r#""key_digest": "{h}""#), r#""key": "k""#.into()],
                Some(&secrets),
                "apilimits[1].key: duplicate API key (also apilimits[0])",
            ),
            (
                vec![
                    format!(r#""key_digest": "{h}""#),
                    format!(r#""key_digest": "{h}""#),
                ],
                Some(&secrets),
                "apilimits[1].key_digest: duplicate API key (also apilimits[0])",
            ),
        ];
        for (entries, secrets, want) in cases {
            let entries: Vec<&str> = entries.iter().map(String::as_str).collect();
            let got = both_ways(&keyed(&entries), secrets)
                .map(|_| ())
                .unwrap_err();
            let want = want.split_whitespace().collect::<Vec<_>>().join(" ");
            assert_eq!(got, [want], "{entries:?}");
        }
    }

    #[test]
    fn diffs_remove_keys_by_the_digests_they_were_named_by() {
        let base = Snapshot::from_json(
            "t",
            keyed(&[r#""key": "a""#, &format!(r#""key_digest": "{}""#, sha("b"))]).as_bytes(),
        )
        .unwrap();
        let diff = format!(
            r#"{{"from": "", "version": {{"hash": "2"}}, "removed_keys": ["a"],
                "removed_key_digests": ["{}"]}}"#,
            sha("b")
        );
        let after = base.apply_read("d", diff.as_bytes()).unwrap().unwrap();
        assert_eq!(after.key_count(), 0);
        let parsed: CatalogDiff = serde_json::from_str(&diff).unwrap();
        assert_eq!(base.apply("d", &parsed).unwrap().key_count(), 0);
        let bad = r#"{"from": "", "version": {"hash": "2"}, "removed_key_digests": ["b"]}"#;
        let e = base.apply_read("d", bad.as_bytes()).unwrap_err();
        // Read as it streams: located at the list, the value named in the reason.
        assert_eq!(e.problems[0].at, "removed_key_digests");
        assert!(
            e.problems[0].reason.contains(r#""b" is not a key digest"#),
            "{e}"
        );
    }

    #[test]
    fn diffs_carry_key_changes_and_apply_back() {
        let a = CatalogDoc::parse("a", GOOD.as_bytes()).unwrap();
        let mut b = a.clone();
        b.version = Some(CatalogVersion {
            semver: "v2".into(),
            hash: "h2".into(),
            released: None,
        });
        b.apilimits[0].limits[0].rl = Some(99); // k1 changed
        b.apilimits.remove(1); // k2 removed
        b.apilimits.push(ApiLimits {
            key: "k3".into(),
            limits: vec![LimitDef {
                ep: Some(1),
                rl: Some(4),
                ..LimitDef::default()
            }],
            ..ApiLimits::default()
        });
        let d = a.diff_to(&b).unwrap();
        assert_eq!(d.from, "h1");
        assert_eq!(
            d.apilimits
                .iter()
                .map(|k| k.key.as_str())
                .collect::<Vec<_>>(),
            ["k1", "k3"]
        );
        assert_eq!(d.removed_keys, ["k2"]);
        assert_eq!(a.apply(&d), b);
        let mut c = a.clone();
        c.paths.push("/more".into());
        assert!(a.diff_to(&c).is_none(), "endpoints changed: no diff");
        // The extension's fields travel in diffs like the rest.
        let mut e = a.clone();
        e.apilimits[0].limits[0].w = Some(1.into());
        e.apilimits[0].limits[0].shadow = Some(true);
        let d = a.diff_to(&e).unwrap();
        assert_eq!(d.apilimits, [e.apilimits[0].clone()]);
        let json = serde_json::to_string(&d).unwrap();
        assert!(json.contains(r#""w":1,"shadow":true"#), "{json}");
        assert_eq!(a.apply(&serde_json::from_str(&json).unwrap()), e);
        let mut f = a.clone();
        f.anonymous.push(LimitDef {
            ep: Some(0),
            rl: Some(5),
            ..LimitDef::default()
        });
        assert!(a.diff_to(&f).is_none(), "anonymous limits changed: no diff");
        let mut g = a.clone();
        g.tz = Some("Europe/Berlin".into());
        assert!(a.diff_to(&g).is_none(), "the default zone changed: no diff");
    }

    #[test]
    fn empty_catalog_is_valid() {
        let s = Snapshot::from_json(
            "t",
            br#"{"methods": [], "paths": [], "endpoints": [], "apilimits": []}"#,
        )
        .unwrap();
        assert_eq!(s.key_count(), 0);
    }

    #[test]
    fn required_fields_are_required_and_unknown_ones_reported() {
        // A typo of a field every DynLimits catalog has is an error, not an empty catalog.
        let typo = br#"{"methods": ["GET"], "paths": ["/a"], "endpoints": [{"p": 0, "m": 0}], "apilimit": []}"#;
        let e = Snapshot::from_json("t", typo).unwrap_err();
        assert!(e.to_string().contains("missing field `apilimits`"), "{e}");
        let extra = br#"{"methods": ["GET"], "paths": ["/a"], "endpoints": [{"p": 0, "m": 0, "defualt_rl": 3}],
            "apilimits": [{"key": "k", "limits": [], "note": "x"}], "owner": "team"}"#;
        let s = Snapshot::from_json("t", extra).unwrap();
        // The keys are read in a second pass: their unknown fields come after the others.
        assert_eq!(
            s.unknown_fields(),
            ["endpoints[0].defualt_rl", "owner", "apilimits[0].note"]
        );
    }

    #[test]
    fn display_lists_every_problem() {
        let e = Snapshot::from_json(
            "cat.json",
            br#"{"methods":[],"paths":[],"endpoints":[{"p":0,"m":0}],"apilimits":[]}"#,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "catalog cat.json is invalid (2 problems):\n  endpoints[0].m: index 0 is out of range (methods has 0 entries)\n  endpoints[0].p: index 0 is out of range (paths has 0 entries)"
        );
    }
}
