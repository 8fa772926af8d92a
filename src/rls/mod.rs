//! rls: Envoy's rate-limit service (`envoy.service.ratelimit.v3.RateLimitService`), a third door
//! onto the same counters as the HTTP proxy and the Divvy port.
//!
//! - [`proto`]: the messages, wire-compatible with Envoy's protos (pure).
//! - [`rules`]: envoyproxy/ratelimit's YAML rule files and which rule a descriptor matches (pure).
//! - [`service`]: one `ShouldRateLimit` call decided on the store ([`Rls`]).
//! - [`load`]: reading the rule files, and applying changes to them while serving.
//! - [`metrics`]: per-rule counts with envoyproxy/ratelimit's names.
//! - [`server`]: the gRPC port (with `grpc.health.v1.Health`).
//!
//! Limits are sliding windows of the unit's length in the shared store; the catalog domain is
//! decided by the gateway's catalog on the gateway's own counters (`docs/ratelimit.md`).

pub mod dropin;
pub mod load;
pub mod metrics;
pub mod proto;
pub mod rules;
pub mod server;
pub mod service;

pub use crate::config::WindowKind;
pub use service::{Rls, RlsPolicy};

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::{ConfigError, RlsConfig, address};

/// The service's settings (`[rls]`), checked.
#[derive(Debug, Clone)]
pub struct RlsSettings {
    /// `rls.listen`.
    pub listen: SocketAddr,
    /// `rls.config`: a rule file or a directory of them.
    pub rules: PathBuf,
    pub policy: RlsPolicy,
    /// `rls.tls_*`: TLS on the gRPC port. `None`: cleartext.
    pub tls: Option<crate::server::tls::TlsSettings>,
}

impl TryFrom<&RlsConfig> for RlsSettings {
    type Error = ConfigError;

    fn try_from(c: &RlsConfig) -> Result<Self, ConfigError> {
        if c.catalog_domain.is_empty() {
            return Err(ConfigError::option(
                "rls.catalog_domain",
                "must not be empty",
            ));
        }
        if c.stop_counting_when_over_limit && c.window == WindowKind::Fixed {
            return Err(ConfigError::option(
                "rls.stop_counting_when_over_limit",
                "needs rls.window = \"sliding\": hits in a fixed window cannot be given back",
            ));
        }
        Ok(RlsSettings {
            listen: address("rls.listen", &c.listen, "127.0.0.1:8082")?,
            rules: PathBuf::from(&c.config),
            policy: RlsPolicy {
                catalog_domain: c.catalog_domain.clone(),
                response_headers: c.response_headers,
                shadow_mode: c.shadow_mode,
                window: c.window,
                stop_counting_when_over_limit: c.stop_counting_when_over_limit,
                merge_domains: c.merge_domains,
                response_dynamic_metadata: c.response_dynamic_metadata,
            },
            tls: crate::server::listener_tls(
                "rls",
                &c.tls_cert_file,
                &c.tls_key_file,
                &c.tls_client_ca_file,
                &c.tls_client_san,
            )?,
        })
    }
}
