//! quotagate: a rate-limiting reverse proxy. This crate is the application: the configuration,
//! the runtime the doors share, and the doors themselves (HTTP proxy, Divvy port, rate-limit
//! service, admin).
//!
//! # Layout (one page: `docs/architecture.md`)
//! - [`app`]: the commands, the configuration turned into plain checked values
//!   ([`app::settings`], from [`config`]), building the [`runtime::Runtime`] and serving every
//!   part; the example upstream ([`app::demo`]). [`start`]: the one error a start fails with.
//! - The doors: [`gateway`] (the HTTP side: [`proxy`], the request path, whose
//!   [`proxy::admission`] decides, pure; its [`catalog`]), [`divvy`] (the `HIT` line protocol),
//!   [`rls`] (Envoy's rate-limit service).
//! - [`admin`]: the operator's listener, `/status` and the dashboard.
//! - [`observe`]: metrics, logs, traces, the dashboard's history, the keys refused most.
//! - [`server`]: the serving plumbing: listeners, workers, TLS, HTTP/1, idle time and drain.
//!
//! Owns what touches sockets, files and the configuration. Depends on `quotagate-engine` (the
//! catalog, routes, paths and the window arithmetic) and `quotagate-store` (the counters); neither
//! may depend on it.

pub mod admin;
pub mod alloc;
pub mod app;
pub mod catalog;
pub mod config;
pub mod divvy;
pub mod gateway;
pub mod observe;
pub mod proxy;
pub mod rls;
pub mod runtime;
pub mod server;
pub mod start;
