//! catalog server: serves versioned catalogs to gateways, implementing `docs/catalog-protocol.md`.
//!
//! The source is a catalog file, or a directory whose alphabetically last `*.json` file is served
//! (drop `v0042.json` next to `v0041.json` to publish). Edits are picked up without a restart: a
//! task checks the source every [`RECHECK`], and every answer first, and a change is loaded on a
//! blocking thread; an answer waits for it at most [`LOAD_WAIT`] (a small catalog is served from
//! the next answer on; a million keys take seconds, and answers do not wait for them). A
//! version's hash is a hash of the file's content, so it changes exactly when the content does.
//! An invalid file is logged and the last good version stays served.
//!
//! Diffs are computed when a version is loaded, not per request: for each of the last
//! [`HISTORY`] versions, what changed from it to the current one is kept (composed step by step,
//! so no old catalog is held) and its answer serialized once. Only the current version's keys
//! are held, each with a hash of its limits, to find the next step's changes. A load reads the
//! keys one at a time (`quotagate_engine::catalog::each_key`), never the whole document as
//! values: a million keys parsed whole took 2 GB.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::server::RequestBody;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::version::format_rfc3339;
use super::{CatalogDoc, CatalogVersion, Snapshot};
use crate::server::problem::problem;
use quotagate_engine::clock::Clock;
use serde_json::value::RawValue;

/// How long a request that finds the source changed waits for its load before it is answered
/// with the version served until then: a small catalog loads well within it, so a file edited
/// and then asked for is served at once; a million keys take seconds, and answers do not wait
/// for them.
pub const LOAD_WAIT: Duration = Duration::from_millis(250);
/// How often the source is checked for changes, at most.
pub const RECHECK: Duration = Duration::from_millis(200);
/// Versions kept for diffs.
pub const HISTORY: usize = 32;

/// The version served, with every answer about it ready.
#[derive(Debug)]
struct Served {
    version: CatalogVersion,
    /// `/latest`'s answer.
    latest: Bytes,
    /// `/indexed_limits`' answer.
    body: Bytes,
    /// `/catalog_diff?from=<hash>`'s answer by hash: a diff, or `None` when the endpoints changed
    /// since (409). A hash not here is unknown (404).
    diffs: HashMap<String, Option<Bytes>>,
}

/// What changed from an earlier version to the current one, key by key (`None`: its endpoints
/// changed, no diff can say it).
type Changes = Option<KeyChanges>;

/// Entries are known by what they are named by ([`named`]): `k` and the key, or `d` and the
/// digest, so that a key spelt like a digest is not taken for one.
#[derive(Debug, Default, Clone)]
struct KeyChanges {
    /// Keys new or changed since, with their entry now (`{"key": .., "limits": ..}`, as JSON:
    /// a tenth of its size parsed).
    changed: HashMap<String, Box<RawValue>>,
    removed: HashSet<String>,
}

/// What an entry is named by, in one string: `k<key>` or `d<key digest>`.
fn named(entry: &super::ApiLimits) -> String {
    match entry.name() {
        super::EntryName::Key(k) => format!("k{k}"),
        super::EntryName::Digest(d) => format!("d{d}"),
    }
}

impl KeyChanges {
    /// These changes followed by `next`'s.
    fn then(&mut self, next: &KeyChanges) {
        for k in &next.removed {
            self.changed.remove(k);
            self.removed.insert(k.clone());
        }
        for (k, limits) in &next.changed {
            self.removed.remove(k);
            self.changed.insert(k.clone(), limits.clone());
        }
    }

    /// The diff's answer, keys in order (so that an answer does not depend on hashing).
    fn answer(&self, from: &str, version: &CatalogVersion) -> Bytes {
        let mut apilimits: Vec<(&String, &RawValue)> =
            self.changed.iter().map(|(k, e)| (k, &**e)).collect();
        apilimits.sort_unstable_by_key(|(k, _)| *k);
        let apilimits: Vec<&RawValue> = apilimits.into_iter().map(|(_, e)| e).collect();
        let removed = |tag: char| {
            let mut names: Vec<String> = (self.removed.iter())
                .filter_map(|n| n.strip_prefix(tag).map(str::to_owned))
                .collect();
            names.sort_unstable();
            names
        };
        let diff = super::CatalogDiff {
            from: from.to_owned(),
            version: version.clone(),
            apilimits,
            removed_keys: removed('k'),
            removed_key_digests: removed('d'),
        };
        Bytes::from(serde_json::to_vec(&diff).unwrap_or_default())
    }
}

/// The current version's content, as far as the next diff needs it.
#[derive(Debug, Default)]
struct Index {
    /// Methods, paths, endpoints, anonymous limits, zone and groups: a diff needs them equal.
    shape: Vec<u8>,
    /// Each entry, by what it is named by ([`named`]), and a hash of its limits as written.
    keys: HashMap<Box<str>, u64, foldhash::fast::FixedState>,
}

impl Index {
    /// `doc`'s shape, with no keys yet.
    fn shape_of<K>(doc: &CatalogDoc<K>) -> Index {
        let shape = serde_json::to_vec(&(
            &doc.methods,
            &doc.paths,
            &doc.endpoints,
            &doc.anonymous,
            &doc.tz,
            &doc.groups,
        ))
        .unwrap_or_default();
        Index {
            shape,
            keys: HashMap::default(),
        }
    }

    /// Reads the keys of `json` (a valid catalog of this shape) into this index, and what changed
    /// since `earlier` (`None`: its shape differs).
    fn read_keys(&mut self, json: &[u8], keys: usize, earlier: Option<&Index>) -> Changes {
        let mut changes = earlier
            .filter(|e| e.shape == self.shape)
            .map(|_| KeyChanges::default());
        self.keys.reserve(keys);
        quotagate_engine::catalog::each_key(json, None, |_, entry| {
            let hash = limits_hash(&entry.limits);
            let name = named(&entry);
            if let (Some(c), Some(e)) = (changes.as_mut(), earlier)
                && e.keys.get(name.as_str()) != Some(&hash)
            {
                let raw = serde_json::value::to_raw_value(&entry);
                c.changed.insert(name.clone(), raw.unwrap_or_default());
            }
            self.keys.insert(name.into_boxed_str(), hash);
            true
        });
        if let (Some(c), Some(e)) = (changes.as_mut(), earlier) {
            c.removed = (e.keys.keys())
                .filter(|k| !self.keys.contains_key(&**k))
                .map(|k| k.to_string())
                .collect();
        }
        changes
    }
}

/// A hash of a key's limits as serialized: a change of any field changes it (64 bits: two
/// different lists of a million keys collide with a chance of about 1 in 10^13).
fn limits_hash(limits: &[super::LimitDef]) -> u64 {
    use std::hash::BuildHasher;
    let bytes = serde_json::to_vec(limits).unwrap_or_default();
    foldhash::quality::FixedState::with_seed(0x5157_4f54_4147_4154).hash_one(bytes)
}

/// A version loaded, to be swapped in.
struct Loaded {
    served: Arc<Served>,
    index: Index,
    earlier: VecDeque<(String, Changes)>,
}

#[derive(Debug, Default)]
struct State {
    current: Option<Arc<Served>>,
    index: Index,
    /// Earlier versions, newest first: each one's hash and its changes to the current.
    earlier: VecDeque<(String, Changes)>,
    /// What was last read from the source, to notice edits cheaply.
    seen: Option<Stamp>,
}

/// Requests served, by endpoint (for tests and logs).
#[derive(Debug, Default)]
pub struct Stats {
    pub latest: AtomicU64,
    pub indexed_limits: AtomicU64,
    pub catalog_diff: AtomicU64,
    pub unauthorized: AtomicU64,
}

/// A catalog server.
pub struct CatalogServer {
    clock: Arc<dyn Clock>,
    source: PathBuf,
    auth_header: HeaderName,
    /// `None`: no authentication.
    secret: Option<Vec<u8>>,
    /// The largest file served.
    max_bytes: u64,
    /// `std::sync::Mutex`: held to copy an `Arc` out or to swap a loaded version in, never
    /// across an await or a load.
    state: Mutex<State>,
    /// Held while a change of the source is loaded (one load at a time).
    loading: Mutex<()>,
    /// A load runs on a blocking thread.
    busy: std::sync::atomic::AtomicBool,
    /// Counts the loads ended (to wait for one).
    loads: tokio::sync::watch::Sender<u64>,
    pub stats: Stats,
}

/// A hash of a catalog's content, used as its version hash.
pub fn content_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// What identifies the source's content cheaply: its newest file, modified, length.
type Stamp = (PathBuf, SystemTime, u64);

fn stamp_of(source: &Path) -> Option<Stamp> {
    let file = newest_file(source)?;
    let meta = std::fs::metadata(&file).ok()?;
    let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    Some((file, modified, meta.len()))
}

fn newest_file(source: &Path) -> Option<PathBuf> {
    if !source.is_dir() {
        return Some(source.to_owned());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(source)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
        .collect();
    files.sort();
    files.pop()
}

impl std::fmt::Debug for CatalogServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogServer")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl CatalogServer {
    /// A server for `source` (file or directory). With a `secret`, every request must carry it in
    /// `auth_header`.
    /// Serves `source`; `clock` dates the versions whose file gives no release time.
    pub fn new(
        source: PathBuf,
        auth_header: HeaderName,
        secret: Option<String>,
        clock: Arc<dyn Clock>,
    ) -> CatalogServer {
        CatalogServer {
            clock,
            source,
            auth_header,
            secret: secret.filter(|s| !s.is_empty()).map(String::into_bytes),
            max_bytes: super::MAX_CATALOG_BYTES,
            state: Mutex::default(),
            loading: Mutex::default(),
            busy: Default::default(),
            loads: tokio::sync::watch::Sender::new(0),
            stats: Stats::default(),
        }
    }

    /// Serves files of at most `bytes` (larger ones are logged and not served). Default: 64 MiB.
    pub fn max_bytes(mut self, bytes: u64) -> CatalogServer {
        self.max_bytes = bytes;
        self
    }

    /// The version served now.
    fn current(&self) -> Option<Arc<Served>> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.current.clone()
    }

    /// Checks the source every [`RECHECK`] until `shutdown`, loading each change on a blocking
    /// thread; the first check at once.
    pub async fn watch(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            self.catch_up(Duration::ZERO).await;
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(RECHECK) => {}
            }
        }
    }

    /// Starts loading the source if it changed (or waits for the load running), and waits for
    /// that load at most `wait`.
    async fn catch_up(self: &Arc<Self>, wait: Duration) {
        let mut loads = self.loads.subscribe();
        if !self.busy.load(Ordering::Acquire) && !self.changed() {
            return;
        }
        if !self.busy.swap(true, Ordering::AcqRel) {
            let server = self.clone();
            tokio::task::spawn_blocking(move || {
                // A panic in a load must not leave it marked as running.
                let loaded =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.reload()));
                if loaded.is_err() {
                    tracing::error!("loading the catalog source failed");
                }
                server.busy.store(false, Ordering::Release);
                server.loads.send_modify(|n| *n += 1);
            });
        }
        if !wait.is_zero() {
            let _ = tokio::time::timeout(wait, loads.changed()).await;
        }
    }

    /// Whether the source is not what was last loaded (a `stat`, or a directory listing).
    fn changed(&self) -> bool {
        let stamp = stamp_of(&self.source);
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        stamp.is_some() && st.seen != stamp
    }

    /// Looks at the source now and, if it changed, loads it: reads, parses and checks it,
    /// computes the diffs to it and swaps it in. Blocks for as long as that takes (seconds for a
    /// million keys): call it off the runtime's workers ([`CatalogServer::watch`] does).
    pub fn reload(&self) {
        let _one = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        let Some(stamp) = stamp_of(&self.source) else {
            return;
        };
        let (file, len) = (stamp.0.clone(), stamp.2);
        {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.seen.as_ref() == Some(&stamp) {
                return;
            }
            st.seen = Some(stamp);
        }
        if len > self.max_bytes {
            tracing::warn!(file = %file.display(), bytes = len, max_bytes = self.max_bytes, "catalog source is larger than catalog.max_bytes; still serving the last good version");
            return;
        }
        let Ok(bytes) = std::fs::read(&file) else {
            return;
        };
        let hash = content_hash(&bytes);
        if self.current().is_some_and(|s| s.version.hash == hash) {
            return;
        }
        let name = file.display().to_string();
        let loaded = self.load(&name, &bytes, hash);
        drop(bytes);
        crate::alloc::release();
        let Some(loaded) = loaded else {
            return;
        };
        let v = &loaded.served.version;
        tracing::info!(file = %name, hash = %v.hash, semver = %v.semver, "serving catalog version");
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.current = Some(loaded.served);
        st.index = loaded.index;
        st.earlier = loaded.earlier;
    }

    /// The version in `bytes`, checked, with its answers ready; `None` (logged) when it is not
    /// a valid catalog.
    fn load(&self, name: &str, bytes: &[u8], hash: String) -> Option<Loaded> {
        let invalid = |e: &dyn std::fmt::Display| {
            tracing::warn!(error = %e, "catalog source is invalid; still serving the last good version");
        };
        // Checked first, as a gateway reads it (its keys one at a time); `hmac-sha256` digests
        // are the gateways' to match, under a secret this server need not hold.
        let unknown = Some(quotagate_engine::catalog::KeySecrets::unknown());
        let keys = Snapshot::from_json_with(name, bytes, unknown)
            .map_err(|e| invalid(&e))
            .ok()?
            .key_count();
        // Served as read, but for the version: `apilimits` copied as written.
        let mut doc: CatalogDoc<&RawValue> = serde_json::from_slice(bytes)
            .map_err(|e| invalid(&e))
            .ok()?;
        let now = i64::try_from(self.clock.now()).unwrap_or(i64::MAX);
        let given = doc.version.take().unwrap_or_default();
        let version = CatalogVersion {
            semver: given.semver,
            hash,
            released: Some(given.released.unwrap_or_else(|| format_rfc3339(now))),
        };
        doc.version = Some(version.clone());
        let body = Bytes::from(serde_json::to_vec(&doc).unwrap_or_default());
        let mut index = Index::shape_of(&doc);
        // The earlier versions and their changes up to this one, taken from the state: loads are
        // one at a time and nothing else reads them (answers are ready in `current`).
        let (from, old, mut earlier) = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            (
                st.current.as_ref().map(|c| c.version.hash.clone()),
                std::mem::take(&mut st.index),
                std::mem::take(&mut st.earlier),
            )
        };
        let step = index.read_keys(bytes, keys, from.as_ref().map(|_| &old));
        drop(old);
        if let Some(from) = from {
            // The diffs kept hold at most as many key changes as the catalog has keys (or 4096),
            // newest first: older versions fetch the whole catalog, no dearer than their diff,
            // and are not composed.
            let budget = index.keys.len().max(4096);
            let size = |c: &Changes| c.as_ref().map_or(0, |c| c.changed.len() + c.removed.len());
            let mut held = size(&step);
            let mut kept = 0;
            for (i, (_, changes)) in earlier.iter_mut().enumerate().take(HISTORY - 2) {
                // Composed, they name every key either names: not composed when that is over.
                let at_least = match (changes.as_ref(), step.as_ref()) {
                    (Some(_), Some(_)) => size(changes).max(size(&step)),
                    _ => 0,
                };
                if held + at_least > budget {
                    break;
                }
                match (changes.as_mut(), &step) {
                    (Some(c), Some(s)) => c.then(s),
                    _ => *changes = None,
                }
                held += size(changes);
                if held <= budget {
                    kept = i + 1;
                }
            }
            earlier.truncate(kept);
            if size(&step) <= budget {
                earlier.push_front((from, step));
            }
        }
        let diffs = earlier
            .iter()
            .map(|(from, c)| (from.clone(), c.as_ref().map(|c| c.answer(from, &version))))
            .collect();
        let served = Served {
            latest: Bytes::from(serde_json::to_vec(&version).unwrap_or_default()),
            version,
            body,
            diffs,
        };
        Some(Loaded {
            served: Arc::new(served),
            index,
            earlier,
        })
    }

    fn authorized(&self, req: &Request<RequestBody>) -> bool {
        let Some(secret) = &self.secret else {
            return true;
        };
        let mut values = req.headers().get_all(&self.auth_header).iter();
        match (values.next(), values.next()) {
            (Some(v), None) => bool::from(v.as_bytes().ct_eq(secret)),
            _ => false,
        }
    }

    /// Answers one request.
    pub async fn handle(
        self: Arc<Self>,
        _peer: SocketAddr,
        req: Request<RequestBody>,
    ) -> Response<Full<Bytes>> {
        if !self.authorized(&req) {
            self.stats.unauthorized.fetch_add(1, Ordering::Relaxed);
            let detail = format!(
                "send the catalog server secret in the {} header",
                self.auth_header
            );
            return problem(StatusCode::UNAUTHORIZED, None, &detail, None);
        }
        if req.method() != Method::GET {
            return problem(
                StatusCode::METHOD_NOT_ALLOWED,
                None,
                "only GET is served",
                None,
            );
        }
        // An edit of the source is served from the next answer on when it loads quickly.
        self.catch_up(LOAD_WAIT).await;
        let Some(current) = self.current() else {
            return problem(
                StatusCode::SERVICE_UNAVAILABLE,
                None,
                "no valid catalog to serve yet",
                None,
            );
        };
        let etag = format!("\"{}\"", current.version.hash);
        let not_modified = req
            .headers()
            .get(IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
        match req.uri().path() {
            "/latest" => {
                self.stats.latest.fetch_add(1, Ordering::Relaxed);
                if not_modified {
                    return empty(StatusCode::NOT_MODIFIED, &etag);
                }
                json(current.latest.clone(), &etag)
            }
            "/indexed_limits" => {
                self.stats.indexed_limits.fetch_add(1, Ordering::Relaxed);
                if not_modified {
                    return empty(StatusCode::NOT_MODIFIED, &etag);
                }
                json(current.body.clone(), &etag)
            }
            "/catalog_diff" => {
                self.stats.catalog_diff.fetch_add(1, Ordering::Relaxed);
                let from = req
                    .uri()
                    .query()
                    .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("from=")))
                    .unwrap_or("");
                if from == current.version.hash {
                    return empty(StatusCode::NOT_MODIFIED, &etag);
                }
                match current.diffs.get(from) {
                    None => problem(
                        StatusCode::NOT_FOUND,
                        None,
                        "unknown version: fetch /indexed_limits",
                        None,
                    ),
                    Some(Some(diff)) => json(diff.clone(), &etag),
                    Some(None) => problem(
                        StatusCode::CONFLICT,
                        None,
                        "endpoints changed: fetch /indexed_limits",
                        None,
                    ),
                }
            }
            _ => problem(StatusCode::NOT_FOUND, None, "no such endpoint", None),
        }
    }
}

fn json(body: Bytes, etag: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        r.headers_mut().insert(ETAG, v);
    }
    r
}

fn empty(status: StatusCode, etag: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(etag) {
        r.headers_mut().insert(ETAG, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotagate_engine::clock::FakeClock;

    fn catalog(keys: &[(&str, u64)], path: &str) -> String {
        let apilimits: Vec<String> = keys
            .iter()
            .map(|(k, rl)| format!(r#"{{"key": "{k}", "limits": [{{"ep": 0, "rl": {rl}}}]}}"#))
            .collect();
        format!(
            r#"{{"methods": ["GET"], "paths": ["{path}"], "endpoints": [{{"p": 0, "m": 0}}],
                "apilimits": [{}]}}"#,
            apilimits.join(",")
        )
    }

    /// The keys and limits of a document, in key order.
    fn keys(doc: &CatalogDoc) -> Vec<(String, Option<i64>)> {
        let mut k: Vec<_> = (doc.apilimits.iter())
            .map(|a| (a.key.clone(), a.limits[0].rl))
            .collect();
        k.sort();
        k
    }

    #[test]
    fn diffs_from_every_earlier_version_are_composed_when_a_version_loads() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("catalog.json");
        let server = CatalogServer::new(
            dir.path().to_owned(),
            HeaderName::from_static("x-api-key"),
            None,
            Arc::new(FakeClock::new(1_700_000_000)),
        );
        let versions = [
            catalog(&[("a", 1), ("b", 2), ("c", 3)], "/x"),
            catalog(&[("a", 1), ("b", 20), ("d", 4)], "/x"), // b changed, c gone, d new
            catalog(&[("a", 1), ("c", 30), ("d", 4)], "/x"), // b gone, c back
            catalog(&[("a", 1), ("c", 30), ("d", 5)], "/x"),
        ];
        let mut docs = Vec::new();
        for (i, json) in versions.iter().enumerate() {
            std::fs::write(&file, json).unwrap();
            let stamp = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + i as u64);
            std::fs::File::options()
                .write(true)
                .open(&file)
                .unwrap()
                .set_modified(stamp)
                .unwrap();
            server.reload();
            let current = server.current().unwrap();
            docs.push(CatalogDoc::parse("v", &current.body).unwrap());
            // Every earlier version's diff, applied to it, gives this one.
            assert_eq!(current.diffs.len(), i);
            for old in &docs[..i] {
                let answer = current.diffs[old.hash()].as_ref().unwrap();
                let diff: crate::catalog::CatalogDiff = serde_json::from_slice(answer).unwrap();
                assert_eq!(diff.from, old.hash());
                assert_eq!(
                    keys(&old.apply(&diff)),
                    keys(&docs[i]),
                    "from {}",
                    old.hash()
                );
            }
        }
        let last = server.current().unwrap();
        let one_step: crate::catalog::CatalogDiff =
            serde_json::from_slice(last.diffs[docs[2].hash()].as_ref().unwrap()).unwrap();
        assert_eq!(
            (one_step.apilimits.len(), one_step.removed_keys.len()),
            (1, 0),
            "only d changed in the last step"
        );

        // A request finds an edit and waits for its load (the wait is long here: the test is of
        // the waiting, not of how long a load takes).
        let server = Arc::new(server);
        std::fs::write(&file, catalog(&[("a", 1), ("c", 30), ("d", 6)], "/x")).unwrap();
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(server.catch_up(Duration::from_secs(30)));
        let current = server.current().unwrap();
        let doc = CatalogDoc::parse("v", &current.body).unwrap();
        assert_eq!(keys(&doc)[2], ("d".to_owned(), Some(6)));
        assert!(!server.busy.load(Ordering::Acquire));

        // New endpoints: no earlier version can be diffed to it.
        std::fs::write(&file, catalog(&[("a", 1)], "/y")).unwrap();
        server.reload();
        let current = server.current().unwrap();
        assert_eq!(current.diffs.len(), 5);
        assert!(current.diffs.values().all(Option::is_none));
    }
}
