//! app: the one place that builds quotagate from its [`Settings`] (store, metrics, workers,
//! gateway, Divvy port, admin listener) and serves it, for every command that runs a server.
//!
//! Every listener is bound before anything is served or announced, so whoever waits for the
//! "listening" line can connect to any of them.

pub mod commands;
pub mod demo;
pub mod settings;
pub mod shutdown;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::admin::Admin;
use crate::app::settings::Settings;
use crate::app::shutdown::Token;
use crate::catalog::Snapshot;
use crate::config::ConfigError;
use crate::divvy::Divvy;
use crate::divvy::metrics::Statsd;
use crate::divvy::rules::RuleSet;
use crate::divvy::server::ConnectionLimits;
use crate::gateway::Gateway;
use crate::observe::metrics::Metrics;
use crate::rls::Rls;
use crate::runtime::Runtime;
use crate::server::Executor;
use crate::server::workers::Workers;
use crate::start::{StartError, bind};
use crate::{divvy, server};
use quotagate_engine::clock::Clock;
use quotagate_store::{Announcer, Store, StoreSettings};

/// A built application, not yet listening.
pub struct App {
    pub store: Arc<Store>,
    pub gateway: Option<Arc<Gateway>>,
    pub divvy: Option<Arc<Divvy>>,
    pub admin: Option<Arc<Admin>>,
    /// The Envoy rate-limit service.
    pub rls: Option<Arc<Rls>>,
    /// Its rule files, as they were when loaded (the watcher starts from there).
    rls_files: Option<(std::path::PathBuf, crate::rls::load::Fingerprint)>,
    /// TLS on its gRPC port (`rls.tls_*`).
    rls_tls: Option<Arc<crate::server::tls::Tls>>,
    divvy_limits: ConnectionLimits,
    workers: Arc<Workers>,
    addrs: Addrs,
}

/// Where each part is to listen.
#[derive(Debug, Clone, Copy, Default)]
struct Addrs {
    gateway: Option<SocketAddr>,
    divvy: Option<SocketAddr>,
    rls: Option<SocketAddr>,
    admin: Option<SocketAddr>,
}

/// The bound listeners of an [`App`], with the addresses they got.
pub struct Listeners {
    gateway: Option<(TcpListener, SocketAddr)>,
    divvy: Option<(TcpListener, SocketAddr)>,
    rls: Option<(TcpListener, SocketAddr)>,
    admin: Option<(TcpListener, SocketAddr)>,
}

impl Listeners {
    pub fn gateway(&self) -> Option<SocketAddr> {
        self.gateway.as_ref().map(|(_, a)| *a)
    }
    pub fn divvy(&self) -> Option<SocketAddr> {
        self.divvy.as_ref().map(|(_, a)| *a)
    }
    pub fn rls(&self) -> Option<SocketAddr> {
        self.rls.as_ref().map(|(_, a)| *a)
    }
    pub fn admin(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|(_, a)| *a)
    }
}

impl App {
    /// Builds every part `settings` turns on. `catalog`: a catalog already loaded for the gateway
    /// (the quick start's); otherwise it loads `catalog.file` or waits for its catalog server.
    /// Starts the worker threads; call it inside a tokio runtime.
    pub fn build(
        settings: &Settings,
        clock: Arc<dyn Clock>,
        catalog: Option<Snapshot>,
    ) -> Result<App, StartError> {
        if let StoreSettings::Redis { redis, .. } = &settings.store
            && redis.target.is_insecure()
        {
            tracing::warn!(
                "store.tls_insecure_skip_verify is on: Redis server certificates are not checked"
            );
        }
        let store = Arc::new(Store::open(
            &settings.store,
            crate::server::workers::current,
            clock.clone(),
        )?);
        let workers = Arc::new(
            Workers::start(settings.workers, "quotagate-worker").map_err(|source| {
                StartError::Runtime {
                    what: "the workers",
                    source,
                }
            })?,
        );
        let metrics = Metrics::new(store.errors.clone(), settings.gateway.is_some());
        if let Some(stats) = store.stats() {
            metrics.register_store(stats);
        }
        if let Some(disk) = store.local().disk() {
            metrics.register_disk(disk.commits());
        }
        let announcer = match &settings.store {
            StoreSettings::Redis { redis, .. } => {
                Some(Arc::new(Announcer::new(&redis.target, redis.timeout)?))
            }
            StoreSettings::Memory { .. } => None,
        };
        let rt = Runtime {
            store: store.clone(),
            metrics: Arc::new(metrics),
            workers,
            clock,
            announcer,
        };
        let metrics = rt.metrics.clone();
        let divvy = match &settings.divvy {
            None => None,
            Some(d) => {
                let rules = RuleSet::load(&d.rules)
                    .map_err(|e| ConfigError::option("divvy.rules", e.to_string()))?;
                let statsd = d
                    .statsd
                    .clone()
                    .map(|s| Statsd::start(s.target, s.prefix, s.tcp));
                let divvy = Divvy::new(rules, store.clone(), rt.clock.clone(), statsd);
                metrics.register(|r| divvy.metrics.register(r));
                Some(Arc::new(divvy))
            }
        };
        let gateway = match &settings.gateway {
            Some(g) => Some(Arc::new(Gateway::build(g, &rt, catalog)?)),
            None => None,
        };
        let mut rls_files = None;
        let mut rls_tls = None;
        let rls = match &settings.rls {
            Some(r) => {
                if let Some(t) = &r.tls {
                    // Its certificates' expiry is not exported: the metric's names are the
                    // gateway listener's.
                    let tls = crate::server::tls::Tls::new(t, rt.clock.clone())
                        .map_err(|e| ConfigError::option("rls.tls_cert_file", e.to_string()))?;
                    rls_tls = Some(Arc::new(tls));
                }
                let rls_metrics = crate::rls::metrics::RlsMetrics::default();
                metrics.register(|reg| rls_metrics.register(reg));
                // Listed before reading: a change in between is seen by the watcher.
                let seen = crate::rls::load::list(&r.rules).unwrap_or_default();
                rls_files = Some((r.rules.clone(), seen));
                let rules = crate::rls::load::load(&r.rules, r.policy.merge_domains)
                    .map_err(|problems| ConfigError::option("rls.config", problems.to_string()))?;
                let catalog = gateway
                    .as_ref()
                    .map(|g| crate::rls::service::CatalogDomain {
                        live: g.catalog().clone(),
                        policy: g.proxy().policy().clone(),
                    });
                let rls = Rls::new(
                    rules,
                    store.clone(),
                    rt.clock.clone(),
                    catalog,
                    r.policy.clone(),
                    rls_metrics,
                );
                Some(Arc::new(rls))
            }
            _ => None,
        };
        let admin = settings.admin.as_ref().map(|a| {
            Arc::new(Admin::new(
                metrics.clone(),
                store.clone(),
                gateway.as_ref().map(|g| g.proxy().clone()),
                a.clone(),
                settings.config.redacted(),
                crate::admin::Parts {
                    gateway: gateway.is_some(),
                    divvy: divvy.is_some(),
                    rls: rls.is_some(),
                },
            ))
        });
        let divvy_limits = settings
            .divvy
            .as_ref()
            .map(|d| d.limits.clone())
            .unwrap_or_default();
        Ok(App {
            store,
            gateway,
            divvy,
            admin,
            rls,
            rls_files,
            rls_tls,
            divvy_limits,
            workers: rt.workers,
            addrs: Addrs {
                gateway: settings.gateway.as_ref().map(|g| g.listen),
                divvy: settings.divvy.as_ref().map(|d| d.listen),
                rls: settings.rls.as_ref().map(|r| r.listen),
                admin: settings.admin.as_ref().map(|a| a.listen),
            },
        })
    }

    /// Binds every listener the application needs.
    pub async fn bind(&self) -> Result<Listeners, StartError> {
        let bind_opt = async |addr: Option<SocketAddr>| match addr {
            Some(a) => bind(a).await.map(Some),
            None => Ok(None),
        };
        Ok(Listeners {
            gateway: bind_opt(self.addrs.gateway).await?,
            divvy: bind_opt(self.addrs.divvy).await?,
            rls: bind_opt(self.addrs.rls).await?,
            admin: bind_opt(self.addrs.admin).await?,
        })
    }

    /// Serves every part on its listener until `token` is cancelled. `false` if the proxy's drain
    /// timed out with requests in flight.
    pub async fn run(&self, listeners: Listeners, token: Token) -> bool {
        let store = self.store.clone();
        tokio::spawn(async move { store.check_at_start().await });
        if let (Some(admin), Some(_)) = (&self.admin, &self.gateway) {
            tokio::spawn(sample_history(admin.clone(), token.clone()));
        }
        if let (Some((l, _)), Some(admin)) = (listeners.admin, &self.admin) {
            let handler = admin.clone();
            tokio::spawn(server::serve(
                l,
                Default::default(),
                Default::default(),
                move |peer, req| handler.clone().handle(peer, req),
                token.clone().cancelled_owned(),
            ));
        }
        let divvy_port = match (listeners.divvy, &self.divvy) {
            (Some((l, _)), Some(d)) => Some(tokio::spawn(divvy::server::serve(
                l,
                d.clone(),
                self.divvy_limits.clone(),
                Some(self.workers.clone()),
                token.clone().cancelled_owned(),
            ))),
            _ => None,
        };
        let rls_port = match (listeners.rls, &self.rls) {
            (Some((l, _)), Some(rls)) => {
                let watcher = self.rls_files.clone().map(|(path, seen)| {
                    tokio::spawn(crate::rls::load::watch(rls.clone(), path, seen))
                });
                let (rls, token) = (rls.clone(), token.clone());
                let executor = Executor {
                    workers: Some(self.workers.clone()),
                    tls: self.rls_tls.as_ref().map(|t| t.acceptor.clone()),
                    ..Default::default()
                };
                // Certificate files that change (or a SIGHUP) are served from then on.
                let reload = self.rls_tls.clone().map(|tls| tokio::spawn(tls.watch()));
                Some(tokio::spawn(async move {
                    let drained = crate::rls::server::serve(
                        l,
                        rls,
                        Default::default(),
                        executor,
                        token.cancelled_owned(),
                    )
                    .await;
                    for task in [watcher, reload].into_iter().flatten() {
                        task.abort();
                    }
                    drained
                }))
            }
            _ => None,
        };
        let mut drained = true;
        let mut divvy_port_beside = None;
        if let (Some((l, _)), Some(g)) = (listeners.gateway, &self.gateway) {
            g.spawn_background(&token);
            drained = g.serve(l, token.cancelled()).await;
            divvy_port_beside = divvy_port;
        } else if let Some(port) = divvy_port {
            let _ = port.await;
        }
        if let Some(port) = rls_port {
            drained &= port.await.unwrap_or(false);
        }
        // The embedded store's directory holds the counts exactly once the last request is
        // answered: the Divvy port beside the gateway ends its connections on the same token.
        if self.store.local().disk().is_some() {
            if let Some(port) = divvy_port_beside {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(5), port).await;
            }
            let store = self.store.clone();
            let _ = tokio::task::spawn_blocking(move || store.local().close()).await;
        }
        drained
    }
}

/// Samples the dashboard's history every [`crate::observe::history::INTERVAL_MS`] until `token` is
/// cancelled (a start-up reading first, so the first point comes one interval in).
async fn sample_history(admin: Arc<Admin>, token: Token) {
    let period = std::time::Duration::from_millis(crate::observe::history::INTERVAL_MS);
    let mut every = tokio::time::interval(period);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = every.tick() => admin.sample(),
        }
    }
}
