//! catalog: the DynLimits `APIIndexedLimits` JSON, its validation, and the immutable [`Snapshot`]
//! that the request path reads.
//!
//! A catalog is checked completely before anything is built from it: every index in range, no
//! duplicate keys or endpoints, no conflicting routes, no negative limits. All problems are reported
//! together in one [`CatalogError`]; nothing here panics on any input. A [`Snapshot`] holds routes,
//! limits and version together so that one `ArcSwap::store` replaces all of them at once.
//!
//! Extension (additive, documented in `docs/catalog.md`): an endpoint may carry `default_rl`, the
//! limit for catalog keys that have no limit of their own for that endpoint. It never applies to
//! unknown keys, so unknown keys never get counters.
//!
//! Pure: parsing and building only; reading files is `load_file`'s one I/O call.

mod doc;
mod error;
mod snapshot;

pub mod broadcast;
pub mod live;
pub mod poller;
pub mod server;
pub mod version;

pub use doc::{ApiLimits, CatalogDiff, CatalogDoc, CatalogVersion, EndpointDef, LimitDef};
pub use error::{CatalogError, Problem};
pub use snapshot::{Endpoint, LimitLookup, Snapshot};

/// Largest catalog file accepted. Default: 64 MiB.
pub const MAX_CATALOG_BYTES: u64 = 64 * 1024 * 1024;
