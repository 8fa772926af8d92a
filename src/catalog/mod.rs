//! catalog: the DynLimits `APIIndexedLimits` JSON, its validation, and the immutable [`Snapshot`]
//! that the request path reads.
//!
//! A catalog is checked completely before anything is built from it: every index in range, no
//! duplicate keys or endpoints, no conflicting routes, no negative limits. All problems are reported
//! together in one [`CatalogError`]; nothing here panics on any input. A [`Snapshot`] holds routes,
//! limits and version together so that one `ArcSwap::store` replaces all of them at once.
//!
//! Extensions (additive, documented in `docs/catalog.md`): limits may carry a window `w` and
//! `shadow`; an endpoint may carry `default_rl` / `default_limits` (for catalog keys that have no
//! limit of their own there; never for unknown keys, so unknown keys never get counters) and a
//! `cost`; top-level `anonymous` limits apply per client address to requests without a key.
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

pub use doc::{
    ApiLimits, CatalogDiff, CatalogDoc, CatalogVersion, DefaultLimitDef, EndpointDef, LimitDef,
};
pub use error::{CatalogError, Problem};
pub use snapshot::{Endpoint, LimitLookup, MAX_COST, Snapshot};

/// Largest catalog file accepted. Default: 64 MiB.
pub const MAX_CATALOG_BYTES: u64 = 64 * 1024 * 1024;
