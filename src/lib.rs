//! quotagate: a rate-limiting reverse proxy.
//!
//! # Layout
//! - [`catalog`]: the DynLimits catalog, its validation, and the immutable snapshot requests read.
//! - [`path`] and [`router`]: the normal form of request paths and the per-method route tables.
//! - [`limiter`]: the sliding-window arithmetic (pure, `now` injected).
//! - [`store`]: counters in memory or in Redis, and the failure policy.
//! - [`clock`]: where `now` comes from.

pub mod catalog;
pub mod clock;
pub mod limiter;
pub mod path;
pub mod router;
pub mod store;
