//! quotagate: a rate-limiting reverse proxy.
//!
//! # Layout
//! - [`gateway`]: builds the proxy from a [`config::Config`] and serves it ([`server`]).
//! - [`proxy`]: the request path: API key, route, limit, decision, forward; header rules.
//! - [`catalog`]: the DynLimits catalog, its validation, and the immutable snapshot requests read.
//! - [`path`] and [`router`]: the normal form of request paths and the per-method route tables.
//! - [`limiter`]: the sliding-window arithmetic (pure, `now` injected by a [`clock::Clock`]).
//! - [`store`]: counters in memory or in Redis, and the failure policy.
//! - [`divvy`]: the Divvy-compatible quota port (`HIT` line protocol, Divvy rule files).
//! - [`demo`]: the example upstream API.

pub mod admin;
pub mod app;
pub mod catalog;
pub mod clock;
pub mod commands;
pub mod config;
pub mod demo;
pub mod divvy;
pub mod files;
pub mod gateway;
pub mod limiter;
pub mod metrics;
pub mod path;
pub mod proxy;
pub mod router;
pub mod server;
pub mod settings;
pub mod shutdown;
pub mod store;
pub mod telemetry;
pub mod workers;
