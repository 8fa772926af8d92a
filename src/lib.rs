//! quotagate: a rate-limiting reverse proxy. This crate is the application: the configuration,
//! the runtime the doors share, and the doors themselves (HTTP proxy, Divvy port, admin).
//!
//! # Layout (one page: `docs/architecture.md`)
//! - [`settings`]: the configuration ([`config`]) turned into plain, checked values, once.
//! - [`app`]: builds the [`runtime::Runtime`] and serves every part, for every command.
//! - [`gateway`]: the HTTP side: [`proxy`] (the request path; [`proxy::admission`] decides, pure),
//!   its [`catalog`] and its listener ([`server`]).
//! - [`divvy`]: the Divvy-compatible quota port (`HIT` line protocol, Divvy rule files).
//! - [`admin`] and [`metrics`]: the operator's listener and what it reports.
//! - [`demo`]: the example upstream API.
//!
//! Owns what touches sockets, files and the configuration. Depends on `quotagate-engine` (the
//! catalog, routes, paths and the window arithmetic) and `quotagate-store` (the counters); neither
//! may depend on it.

pub mod admin;
pub mod alloc;
pub mod app;
pub mod catalog;
pub mod coarse;
pub mod cold;
pub mod commands;
pub mod config;
pub mod deadline;
pub mod demo;
pub mod divvy;
pub mod files;
pub mod gateway;
pub mod glob;
pub mod history;
pub mod http1;
pub mod metrics;
pub mod otel;
pub mod problem;
pub mod proxy;
pub mod rls;
pub mod runtime;
pub mod server;
pub mod settings;
pub mod shelf;
pub mod shutdown;
pub mod start;
pub mod status;
pub mod telemetry;
pub mod tls;
pub mod top;
pub mod workers;
