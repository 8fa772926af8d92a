//! gateway: builds the proxy from a configuration, serves it, and runs its background tasks (the
//! catalog poller and the catalog announcements).

use std::future::Future;
use std::sync::Arc;

use http::HeaderName;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::admin::Admin;
use crate::catalog::broadcast::{self, RedisAnnounce};
use crate::catalog::live::Live;
use crate::catalog::poller::{Announce, Poller, PollerOptions};
use crate::catalog::{CatalogError, MAX_CATALOG_BYTES, Snapshot};
use crate::clock::Clock;
use crate::config::{Config, ConfigError, StoreKind, ms};
use crate::divvy::rules::RuleSet;
use crate::divvy::server::DivvySettings;
use crate::divvy::{self, Divvy};
use crate::metrics::Metrics;
use crate::proxy::upstream::Upstream;
use crate::proxy::{Policy, Proxy, Refresh};
use crate::server::{self, HttpSettings};
use crate::store::{RedisOptions, RedisStore, Store, StoreError};
use crate::workers::Workers;
use std::sync::atomic::AtomicBool;

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
    poller: Option<Arc<Poller>>,
    /// Redis URL and channel of the catalog announcements, when counters are in Redis.
    announcements: Option<(String, String)>,
    /// The Divvy port's service, when a rule file is configured.
    pub divvy: Option<Arc<Divvy>>,
    divvy_settings: DivvySettings,
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
                connections: config.server.worker_count(),
            })?;
            Store::redis(redis, s.failure_policy, s.probe_interval())
        }
    })
}

impl Gateway {
    /// Builds the gateway, loading `catalog.file` when one is configured.
    pub fn build(config: &Config, clock: Arc<dyn Clock>) -> Result<Gateway, StartError> {
        if config.catalog.file.is_empty() && config.catalog.server_url.is_empty() {
            return Err(ConfigError(
                "no catalog: set catalog.file, catalog.server_url or both".into(),
            )
            .into());
        }
        let catalog = if config.catalog.file.is_empty() {
            None
        } else {
            Some(Snapshot::load_file(config.catalog.file.as_ref())?)
        };
        Gateway::with_catalog(config, clock, catalog)
    }

    /// Builds the gateway around an already loaded catalog (`None`: wait for the catalog server).
    pub fn with_catalog(
        config: &Config,
        clock: Arc<dyn Clock>,
        catalog: Option<Snapshot>,
    ) -> Result<Gateway, StartError> {
        config.validate()?;
        let c = &config.catalog;
        let store = Arc::new(build_store(config)?);
        let divvy = if config.divvy.rules.is_empty() {
            None
        } else {
            let rules = RuleSet::load(config.divvy.rules.as_ref())
                .map_err(|e| ConfigError(e.to_string()))?;
            let statsd = crate::divvy::metrics::Statsd::from_env(|k| std::env::var(k).ok());
            Some(Arc::new(Divvy::new(
                rules,
                store.clone(),
                clock.clone(),
                statsd,
            )))
        };
        let live = Live::new(catalog);
        let mut announcements = None;
        let poller = if c.server_url.is_empty() {
            None
        } else {
            let announce: Option<Arc<dyn Announce>> = store.redis_store().map(|r| {
                announcements = Some((config.store.redis_url.clone(), c.announce_channel.clone()));
                Arc::new(RedisAnnounce {
                    store: r,
                    channel: c.announce_channel.clone(),
                }) as Arc<dyn Announce>
            });
            let opts = PollerOptions {
                url: c.server_url.clone(),
                auth_header: c.server_auth_header.clone(),
                secret: c.server_secret.clone(),
                interval: ms(c.poll_interval_ms),
                jitter_percent: c.poll_jitter_percent,
                connect_timeout: ms(c.connect_timeout_ms),
                request_timeout: ms(c.request_timeout_ms),
                backoff_max: ms(c.backoff_max_ms),
                refresh_min_interval: ms(c.refresh_min_interval_ms),
                max_bytes: MAX_CATALOG_BYTES,
            };
            Some(Arc::new(
                Poller::new(opts, live.clone(), announce).map_err(ConfigError)?,
            ))
        };
        let refresh = Refresh {
            header: HeaderName::from_bytes(c.refresh_header.as_bytes())
                .map_err(|e| ConfigError(e.to_string()))?,
            // Without a catalog server there is nothing to fetch: the header is only removed.
            secret: (!c.refresh_secret.is_empty() && poller.is_some())
                .then(|| c.refresh_secret.clone().into_bytes()),
            wait: ms(c.refresh_wait_ms),
        };
        let mut metrics = Metrics::new(live.clone(), store.clone());
        if let Some(d) = &divvy {
            d.metrics.register(metrics.registry_mut());
        }
        let metrics = Arc::new(metrics);
        let mut policy = Policy::new(&config.limits, config.server.max_body_bytes);
        policy.access_log = config.log.access;
        let proxy = Proxy {
            metrics: metrics.clone(),
            upstream_failing: AtomicBool::new(false),
            catalog: live,
            refresh,
            store,
            clock,
            upstream: Upstream::new(
                &config.upstream,
                config.server.max_header_bytes,
                config.server.worker_count(),
            )?,
            policy,
        };
        let workers = Arc::new(
            Workers::start(config.server.worker_count(), "quotagate-worker")
                .map_err(|e| ConfigError(format!("cannot start the workers: {e}")))?,
        );
        let settings = HttpSettings {
            header_read_timeout: config.header_read_timeout(),
            max_header_bytes: config.server.max_header_bytes,
            max_connections: config.server.max_connections,
            drain_timeout: config.drain_timeout(),
            connections: Some(metrics.open_connections.clone()),
            workers: Some(workers.clone()),
        };
        Ok(Gateway {
            proxy: Arc::new(proxy),
            settings,
            poller,
            announcements,
            divvy,
            divvy_settings: DivvySettings {
                max_line_bytes: config.divvy.max_line_bytes,
                max_connections: config.divvy.max_connections,
                max_in_flight: config.divvy.max_in_flight,
                workers: Some(workers),
            },
        })
    }

    /// Starts the catalog poller and the announcement listener, which stop on `shutdown`.
    pub fn spawn_background(&self, shutdown: &CancellationToken) {
        if let Some(poller) = &self.poller {
            tokio::spawn(poller.clone().run(shutdown.clone()));
            if let Some((url, channel)) = &self.announcements {
                tokio::spawn(broadcast::listen(
                    url.clone(),
                    channel.clone(),
                    self.proxy.catalog.clone(),
                    shutdown.clone(),
                ));
            }
        }
        if !self.proxy.catalog.is_ready() {
            tracing::warn!("no catalog yet: answering 503 until the catalog server answers");
        }
    }

    /// The admin endpoints of this gateway.
    pub fn admin(&self) -> Arc<Admin> {
        Arc::new(Admin {
            metrics: self.proxy.metrics.clone(),
            catalog: self.proxy.catalog.clone(),
            store: self.proxy.store.clone(),
        })
    }

    /// Serves the Divvy port on `listener` until `shutdown` (when a rule file is configured).
    pub async fn serve_divvy(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        if let Some(divvy) = &self.divvy {
            divvy::server::serve(
                listener,
                divvy.clone(),
                self.divvy_settings.clone(),
                shutdown,
            )
            .await;
        }
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
