//! divvy: the Divvy-compatible quota port. Services that do not sit behind the proxy ask for quota
//! with `HIT key=value ...` lines over TCP and get `OK <allowed> <credit> <resetSeconds>`.
//!
//! - [`protocol`]: parsing and formatting lines (pure).
//! - [`rules`]: rule files and which rules a request matches (pure).
//! - [`server`]: the TCP server: framing, ordering, limits.
//! - [`quota`]: the service behind the port ([`Divvy`]); [`settings`]: its settings.
//!
//! Counting is Divvy's fixed window from the first hit, in the shared [`Store`] (memory or Redis,
//! with Divvy's own Redis keys), under the same failure policy as the gateway.

pub mod dropin;
pub mod load;
pub mod metrics;
pub mod protocol;
pub mod quota;
pub mod rules;
pub mod server;
pub mod settings;

pub use quota::Divvy;
pub use settings::DivvySettings;
