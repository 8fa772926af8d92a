//! catalog: the catalog being served (the engine's [`Snapshot`], re-exported here with the rest of
//! `quotagate_engine::catalog`) and its I/O: reading a catalog file ([`load_file`]), the live
//! snapshot and its refresh ([`live`]), polling a catalog server ([`poller`]), announcements
//! between instances ([`broadcast`]) and serving catalogs ([`server`]).

pub mod broadcast;
pub mod live;
pub mod poller;
pub mod server;

use std::path::Path;
use std::sync::Arc;

pub use quotagate_engine::catalog::*;

/// The largest key secret file read: a secret and the previous one fit in far less.
pub const MAX_KEY_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// Reads a key secret file (`catalog.key_secret_file`): its first line the secret, a second the
/// previous one. The `Err` names the file and what is wrong, never a secret.
pub fn read_key_secrets(path: &Path) -> Result<Arc<KeySecrets>, String> {
    let text = crate::config::files::read_capped(path, MAX_KEY_SECRET_FILE_BYTES)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    KeySecrets::from_file_text(text.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads, parses and validates a catalog file of at most `max_bytes`; `secrets`: those its
/// `hmac-sha256` digests are made with.
pub fn load_file(
    path: &Path,
    max_bytes: u64,
    secrets: Option<Arc<KeySecrets>>,
) -> Result<Snapshot, CatalogError> {
    let source = path.display().to_string();
    let one = |reason: String| CatalogError {
        source: source.clone(),
        problems: vec![Problem {
            at: String::new(),
            reason,
        }],
    };
    let meta = std::fs::metadata(path).map_err(|e| CatalogError::unreadable(&source, &e))?;
    if meta.len() > max_bytes {
        return Err(one(format!(
            "it is {} bytes; the largest catalog accepted is {max_bytes} bytes (catalog.max_bytes)",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| CatalogError::unreadable(&source, &e))?;
    let snapshot = Snapshot::from_json_with(&source, &bytes, secrets);
    drop(bytes);
    crate::alloc::release();
    snapshot
}
