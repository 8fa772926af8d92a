//! catalog: the catalog being served (the engine's [`Snapshot`], re-exported here with the rest of
//! `quotagate_engine::catalog`) and its I/O: reading a catalog file ([`load_file`]), the live
//! snapshot and its refresh ([`live`]), polling a catalog server ([`poller`]), announcements
//! between instances ([`broadcast`]) and serving catalogs ([`server`]).

pub mod broadcast;
pub mod live;
pub mod poller;
pub mod server;

use std::path::Path;

pub use quotagate_engine::catalog::*;

/// Reads, parses and validates a catalog file of at most `max_bytes`.
pub fn load_file(path: &Path, max_bytes: u64) -> Result<Snapshot, CatalogError> {
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
    let snapshot = Snapshot::from_json(&source, &bytes);
    drop(bytes);
    crate::alloc::release();
    snapshot
}
