//! quotagate: a rate-limiting reverse proxy.
//!
//! # Layout (one page: `docs/architecture.md`)
//! - [`settings`]: the configuration ([`config`]) turned into typed, checked values, once.
//! - [`app`]: builds and serves every part from the settings, for every command.
//! - [`gateway`]: the HTTP side: [`proxy`] (the request path; [`proxy::admission`] decides, pure),
//!   its [`catalog`] and its listener ([`server`]).
//! - [`path`] and [`router`]: the normal form of request paths and the per-method route tables.
//! - [`limiter`]: the sliding-window arithmetic (pure, `now` injected by a [`clock::Clock`]).
//! - [`store`]: the counter-store trait, its memory and Redis backends, and the failure policy.
//! - [`divvy`]: the Divvy-compatible quota port (`HIT` line protocol, Divvy rule files).
//! - [`admin`] and [`metrics`]: the operator's listener and what it reports.
//! - [`demo`]: the example upstream API.

pub mod admin;
pub mod alloc;
pub mod app;
pub mod catalog;
pub mod commands;
pub mod config;
pub mod demo;
pub mod divvy;
pub mod files;
pub mod gateway;
pub mod metrics;
pub mod problem;
pub mod proxy;
pub mod runtime;
pub mod server;
pub mod settings;
pub mod shutdown;
pub mod start;
pub mod status;
pub mod telemetry;
pub mod workers;
