//! catalog server: serves versioned catalogs to gateways, implementing `docs/catalog-protocol.md`.
//!
//! The source is a catalog file, or a directory whose alphabetically last `*.json` file is served
//! (drop `v0042.json` next to `v0041.json` to publish). Edits are picked up without a restart: the
//! source is checked at most every [`RECHECK`] when a request comes in. A version's hash is a hash of
//! the file's content, so it changes exactly when the content does. An invalid file is logged and
//! the last good version stays served. The last [`HISTORY`] versions are kept so that gateways can
//! ask for a diff.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::version::format_rfc3339;
use super::{CatalogDoc, CatalogVersion, Snapshot};
use crate::problem::problem;
use quotagate_engine::clock::Clock;

/// How often the source is checked for changes, at most.
pub const RECHECK: Duration = Duration::from_millis(200);
/// Versions kept for diffs.
pub const HISTORY: usize = 32;

/// One served version.
#[derive(Debug)]
struct Served {
    doc: CatalogDoc,
    body: Bytes,
    version: CatalogVersion,
}

#[derive(Debug, Default)]
struct State {
    /// Newest first.
    history: VecDeque<Arc<Served>>,
    /// What was last read from the source: (file, modified, length), to notice edits cheaply.
    seen: Option<(PathBuf, SystemTime, u64)>,
    checked: Option<Instant>,
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
    /// `std::sync::Mutex`: held to check the source and copy an `Arc` out, never across an await.
    state: Mutex<State>,
    pub stats: Stats,
}

/// A hash of a catalog's content, used as its version hash.
pub fn content_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
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
            stats: Stats::default(),
        }
    }

    /// Serves files of at most `bytes` (larger ones are logged and not served). Default: 64 MiB.
    pub fn max_bytes(mut self, bytes: u64) -> CatalogServer {
        self.max_bytes = bytes;
        self
    }

    /// The newest version, after picking up any edit of the source.
    fn current(&self) -> (Option<Arc<Served>>, Vec<Arc<Served>>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.checked.is_none_or(|t| t.elapsed() >= RECHECK) {
            st.checked = Some(Instant::now());
            self.reload(&mut st);
        }
        (
            st.history.front().cloned(),
            st.history.iter().cloned().collect(),
        )
    }

    /// Forces the next request to look at the source again (tests edit files faster than RECHECK).
    pub fn recheck(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).checked = None;
    }

    fn reload(&self, st: &mut State) {
        let Some(file) = newest_file(&self.source) else {
            return;
        };
        let Ok(meta) = std::fs::metadata(&file) else {
            return;
        };
        let stamp = (
            file.clone(),
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        if st.seen.as_ref() == Some(&stamp) {
            return;
        }
        st.seen = Some(stamp);
        if meta.len() > self.max_bytes {
            tracing::warn!(file = %file.display(), bytes = meta.len(), max_bytes = self.max_bytes, "catalog source is larger than catalog.max_bytes; still serving the last good version");
            return;
        }
        let Ok(bytes) = std::fs::read(&file) else {
            return;
        };
        let hash = content_hash(&bytes);
        if st.history.front().is_some_and(|s| s.version.hash == hash) {
            return;
        }
        let name = file.display().to_string();
        let mut doc = match CatalogDoc::parse(&name, &bytes) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "catalog source is invalid; still serving the last good version");
                return;
            }
        };
        let now = i64::try_from(self.clock.now()).unwrap_or(i64::MAX);
        let given = doc.version.take().unwrap_or_default();
        doc.version = Some(CatalogVersion {
            semver: given.semver,
            hash,
            released: Some(given.released.unwrap_or_else(|| format_rfc3339(now))),
        });
        if let Err(e) = Snapshot::build(&name, doc.clone()) {
            tracing::warn!(error = %e, "catalog source is invalid; still serving the last good version");
            return;
        }
        let body = Bytes::from(serde_json::to_vec(&doc).unwrap_or_default());
        let version = doc.version.clone().unwrap_or_default();
        tracing::info!(file = %name, hash = %version.hash, semver = %version.semver, "serving catalog version");
        st.history
            .push_front(Arc::new(Served { doc, body, version }));
        st.history.truncate(HISTORY);
    }

    fn authorized(&self, req: &Request<Incoming>) -> bool {
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
        req: Request<Incoming>,
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
        let (current, history) = self.current();
        let Some(current) = current else {
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
                json(
                    serde_json::to_vec(&current.version)
                        .unwrap_or_default()
                        .into(),
                    &etag,
                )
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
                let Some(old) = history.iter().find(|s| s.version.hash == from) else {
                    return problem(
                        StatusCode::NOT_FOUND,
                        None,
                        "unknown version: fetch /indexed_limits",
                        None,
                    );
                };
                match old.doc.diff_to(&current.doc) {
                    Some(diff) => json(serde_json::to_vec(&diff).unwrap_or_default().into(), &etag),
                    None => problem(
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
