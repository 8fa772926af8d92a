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
//! `cost`; top-level `anonymous` limits apply per client address to requests without a key; an entry
//! may name its key by a digest (`key_digest`), and the key table holds digests only.
//!
//! Pure: parsing and building only. Reading a catalog file, fetching one and serving one are the
//! application's (`quotagate::catalog`).

mod digest;
mod doc;
mod error;
mod keys;
mod read;
mod rewrite;
mod snapshot;
pub mod version;

pub use digest::{Digests, Form, KeyDigest, KeyId, KeySecrets, MAX_DIGESTS, digests};
pub use doc::{
    ApiLimits, CatalogDiff, CatalogDoc, CatalogVersion, CostFromDef, DefaultLimitDef, EndpointDef,
    EntryName, LimitDef, UnknownFields,
};
pub use error::{CatalogError, Problem};
pub use read::{Counted, each_key};
pub use rewrite::digest_keys;
pub use snapshot::{Applied, Endpoint, LimitLookup, MAX_COST, Snapshot};

/// Largest catalog accepted, from a file or from a catalog server, unless `catalog.max_bytes`
/// says otherwise: 64 MiB.
pub const MAX_CATALOG_BYTES: u64 = 64 * 1024 * 1024;
