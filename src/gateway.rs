//! gateway: builds the proxy from a configuration and serves it.

use std::future::Future;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;

use crate::catalog::{CatalogError, Snapshot};
use crate::clock::Clock;
use crate::config::{Config, ConfigError, StoreKind};
use crate::proxy::upstream::Upstream;
use crate::proxy::{Policy, Proxy};
use crate::server::{self, HttpSettings};
use crate::store::{RedisOptions, RedisStore, Store, StoreError};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// A built gateway, ready to serve on a listener.
pub struct Gateway {
    pub proxy: Arc<Proxy>,
    settings: HttpSettings,
}

/// Builds the configured store.
pub fn build_store(config: &Config) -> Result<Store, StoreError> {
    let s = &config.store;
    Ok(match s.kind {
        StoreKind::Memory => Store::memory(),
        StoreKind::Redis => {
            let redis = RedisStore::connect(&RedisOptions {
                url: s.redis_url.clone(),
                timeout: s.timeout(),
                pool_size: s.pool_size,
                prefix: s.key_prefix.clone(),
                time_source: s.time_source,
            })?;
            Store::redis(redis, s.failure_policy, s.probe_interval())
        }
    })
}

impl Gateway {
    /// Builds the gateway, loading `catalog.file` when one is configured.
    pub fn build(config: &Config, clock: Arc<dyn Clock>) -> Result<Gateway, StartError> {
        let catalog = if config.catalog.file.is_empty() {
            tracing::warn!(
                "no catalog file configured: every request gets 404 until a catalog is loaded"
            );
            Snapshot::default()
        } else {
            Snapshot::load_file(config.catalog.file.as_ref())?
        };
        Gateway::with_catalog(config, clock, catalog)
    }

    /// Builds the gateway around an already loaded catalog.
    pub fn with_catalog(
        config: &Config,
        clock: Arc<dyn Clock>,
        catalog: Snapshot,
    ) -> Result<Gateway, StartError> {
        config.validate()?;
        let proxy = Proxy {
            catalog: ArcSwap::from_pointee(catalog),
            store: build_store(config)?,
            clock,
            upstream: Upstream::new(&config.upstream, config.server.max_header_bytes)?,
            policy: Policy::new(&config.limits, config.server.max_body_bytes),
        };
        let settings = HttpSettings {
            header_read_timeout: config.header_read_timeout(),
            max_header_bytes: config.server.max_header_bytes,
            max_connections: config.server.max_connections,
            drain_timeout: config.drain_timeout(),
        };
        Ok(Gateway {
            proxy: Arc::new(proxy),
            settings,
        })
    }

    /// Serves the proxy on `listener` until `shutdown`, then drains. `false` if draining timed out.
    pub async fn serve(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) -> bool {
        let proxy = self.proxy.clone();
        server::serve(
            listener,
            self.settings.clone(),
            move |peer, req| proxy.clone().handle(peer, req),
            shutdown,
        )
        .await
    }
}

/// Binds a listener, turning the OS error into a start-up error that names the address.
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen { addr, source })
}
