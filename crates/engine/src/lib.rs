//! quotagate-engine: what quotagate decides, with no I/O and no tokio.
//!
//! Owns: the catalog document, its validation and the [`catalog::Snapshot`] the doors read; the
//! per-method route tables ([`router`]) and the normal form of request paths ([`path`]); the
//! sliding-window arithmetic ([`limiter`]: every rule of the window lives there once); the
//! [`clock::Clock`] seam through which `now` is handed in (`SystemClock` is the one reading of the
//! system time, and nothing here reads a clock but through it).
//!
//! Must not depend on: any other quotagate crate, tokio, hyper, sockets or files. Everything here
//! is a function of its arguments, so it is unit-tested beside the code and fuzzed.

pub mod ascii;
pub mod catalog;
pub mod clock;
pub mod glob;
pub mod limiter;
pub mod path;
pub mod report;
pub mod router;
pub mod text;
