//! gateway: the HTTP side of quotagate: the proxy, its catalog (file, poller, announcements) and
//! its listener's settings. [`crate::app`] builds it with the store and the metrics it shares
//! with the Divvy port.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::catalog::broadcast::{self, RedisAnnounce};
use crate::catalog::live::Live;
use crate::catalog::poller::{Announce, Poller, PollerOptions};
use crate::catalog::{KeySecrets, Snapshot};
use crate::config::{CatalogConfig, Config, ConfigError, address};
use crate::observe::metrics::Metrics;
use crate::proxy::upstream::{Upstream, UpstreamSettings};
use crate::proxy::{Policy, Proxy, ProxySettings, Refresh};
use crate::runtime::Runtime;
use crate::server::{self, Executor, HttpSettings};
use crate::start::StartError;
use quotagate_store::{Announcer, Store};

/// The gateway's settings, checked.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// The proxy listener (`server.listen`).
    pub listen: SocketAddr,
    pub http: HttpSettings,
    pub proxy: ProxySettings,
    pub upstream: UpstreamSettings,
    /// Catalog loaded at start-up (`catalog.file`).
    pub catalog_file: Option<PathBuf>,
    /// The largest catalog accepted (`catalog.max_bytes`).
    pub catalog_max_bytes: u64,
    /// The secrets `hmac-sha256` key digests are made with (`catalog.key_secret_file`).
    pub key_secrets: Option<Arc<KeySecrets>>,
    /// The catalog server to poll (`catalog.server_url`).
    pub poller: Option<PollerOptions>,
    /// Redis channel of the catalog announcements (used with the Redis store).
    pub announce_channel: String,
}

impl TryFrom<&Config> for GatewaySettings {
    type Error = ConfigError;

    fn try_from(c: &Config) -> Result<Self, ConfigError> {
        let key_secrets = key_secrets(&c.catalog)?;
        let poller = match c.catalog.server_url.is_empty() {
            true => None,
            false => Some(PollerOptions {
                secrets: key_secrets.clone(),
                ..PollerOptions::try_from(&c.catalog)?
            }),
        };
        let refresh = Refresh::try_from(&c.catalog)?;
        Ok(GatewaySettings {
            listen: address("server.listen", &c.server.listen, "127.0.0.1:8080")?,
            http: HttpSettings::try_from(&c.server)?,
            proxy: ProxySettings {
                policy: Policy::try_from(c)?,
                refresh,
                trace: crate::observe::otel::TraceSettings::from_config(&c.telemetry)?,
            },
            upstream: UpstreamSettings::try_from(c)?,
            catalog_file: (!c.catalog.file.is_empty()).then(|| PathBuf::from(&c.catalog.file)),
            catalog_max_bytes: crate::config::max_bytes(c.catalog.max_bytes)?,
            key_secrets,
            poller,
            announce_channel: c.catalog.announce_channel.clone(),
        })
    }
}

/// The key secrets of `catalog.key_secret_file`, read now: a file named that cannot be read or
/// holds no secret stops the start.
pub fn key_secrets(c: &CatalogConfig) -> Result<Option<Arc<KeySecrets>>, ConfigError> {
    if c.key_secret_file.is_empty() {
        return Ok(None);
    }
    crate::catalog::read_key_secrets(std::path::Path::new(&c.key_secret_file))
        .map(Some)
        .map_err(|e| ConfigError::option("catalog.key_secret_file", e))
}

/// A built gateway, ready to serve on a listener.
pub struct Gateway {
    proxy: Arc<Proxy>,
    http: HttpSettings,
    executor: Executor,
    poller: Option<Arc<Poller>>,
    /// Channel of the catalog announcements, when counters are in Redis and a poller runs.
    announcements: Option<(Arc<Announcer>, String)>,
    /// The listener's TLS, when configured (its watcher runs in the background).
    tls: Option<Arc<crate::server::tls::Tls>>,
    /// What the trace exporter needs, until [`Gateway::spawn_background`] starts it.
    exporter: std::sync::Mutex<Option<crate::observe::otel::Exporter>>,
}

/// The upstream the gateway forwards to, its metrics registered.
fn edge_upstream(s: &UpstreamSettings, rt: &Runtime) -> Result<Upstream, StartError> {
    if s.tls.insecure_skip_verify && s.any_tls() {
        tracing::warn!(
            "upstream.tls_insecure_skip_verify is on: upstream certificates are not checked"
        );
    }
    let upstream = Upstream::new(s, rt.workers.len()).map_err(|e| {
        let option = match &s.tls.client_cert {
            Some((cert, _)) if *cert == e.file => "upstream.tls_cert_file",
            Some((_, key)) if *key == e.file => "upstream.tls_key_file",
            _ => "upstream.tls_ca_file",
        };
        ConfigError::option(option, e.to_string())
    })?;
    rt.metrics.register(|r| upstream.register(r));
    Ok(upstream)
}

impl Gateway {
    /// Builds the gateway on the shared runtime `rt`. `catalog`: a catalog already loaded (the
    /// quick start's); otherwise `catalog_file` is loaded, or the gateway waits for its catalog
    /// server.
    pub fn build(
        s: &GatewaySettings,
        rt: &Runtime,
        catalog: Option<Snapshot>,
    ) -> Result<Gateway, StartError> {
        let tls = match &s.http.tls {
            None => None,
            Some(t) => {
                let tls = crate::server::tls::Tls::new(t, rt.clock.clone())
                    .map_err(|e| ConfigError::option("server.tls_cert_file", e.to_string()))?;
                rt.metrics.register(|r| tls.register(r));
                Some(Arc::new(tls))
            }
        };
        let upstream = Arc::new(edge_upstream(&s.upstream, rt)?);
        let catalog = match (catalog, &s.catalog_file) {
            (Some(c), _) => Some(c),
            (None, Some(file)) => Some(crate::catalog::load_file(
                file,
                s.catalog_max_bytes,
                s.key_secrets.clone(),
            )?),
            (None, None) if s.poller.is_none() => {
                return Err(ConfigError::general(
                    "no catalog: set catalog.file, catalog.server_url or both",
                )
                .into());
            }
            (None, None) => None,
        };
        let live = Live::new(catalog);
        let (mut poller, mut announcements) = (None, None);
        if let Some(opts) = &s.poller {
            let announce = rt.announcer.clone().map(|announcer| {
                Arc::new(RedisAnnounce {
                    announcer,
                    channel: s.announce_channel.clone(),
                }) as Arc<dyn Announce>
            });
            announcements = rt
                .announcer
                .clone()
                .map(|a| (a, s.announce_channel.clone()));
            let p = Poller::new(
                opts.clone(),
                live.clone(),
                announce,
                rt.metrics.catalog_polls.clone(),
            )
            .map_err(|e| {
                ConfigError::option(
                    "catalog.server_url",
                    format!(
                        "cannot build the catalog client: {}",
                        crate::start::with_causes(&e)
                    ),
                )
            })?;
            poller = Some(Arc::new(p));
        }
        let executor = Executor {
            workers: Some(rt.workers.clone()),
            open_connections: Some(rt.metrics.open_connections.clone()),
            tls: tls.as_ref().map(|t| t.acceptor.clone()),
        };
        let mut exporter = None;
        let tracer = s.proxy.trace.as_ref().map(|t| {
            let (counts, c) = crate::observe::otel::SpanCounts::new();
            rt.metrics.register(|r| {
                r.register(
                    "quotagate_trace_spans",
                    "Spans by what became of them: exported, dropped (the export queue was full), failed (the collector refused them or did not answer)",
                    c,
                )
            });
            let (tracer, queue) = crate::observe::otel::Tracer::new(t, counts.clone());
            exporter = Some((t.clone(), queue, counts));
            tracer
        });
        Ok(Gateway {
            proxy: Arc::new(Proxy::new(&s.proxy, live, upstream, rt, tracer)),
            exporter: std::sync::Mutex::new(exporter),
            http: s.http.clone(),
            executor,
            poller,
            announcements,
            tls,
        })
    }

    /// The request path.
    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// The live catalog.
    pub fn catalog(&self) -> &Arc<Live> {
        self.proxy.catalog()
    }

    /// The metrics it counts in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.proxy.metrics()
    }

    /// The counter store.
    pub fn store(&self) -> &Arc<Store> {
        self.proxy.store()
    }

    /// Starts the certificate watcher, the upstream health checks, the catalog poller and the
    /// announcement listener, which stop on `shutdown`.
    pub fn spawn_background(&self, shutdown: &CancellationToken) {
        let exporter = self
            .exporter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((settings, queue, counts)) = exporter {
            tokio::spawn(crate::observe::otel::export::run(
                settings,
                queue,
                counts,
                shutdown.clone(),
            ));
        }
        let (upstream, stop) = (self.proxy.upstream().clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = upstream.check_health() => {}
                () = stop.cancelled() => {}
            }
        });
        if let Some(tls) = &self.tls {
            let (tls, stop) = (tls.clone(), shutdown.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = tls.watch() => {}
                    () = stop.cancelled() => {}
                }
            });
        }
        if let Some(jwt) = self.proxy.jwt() {
            tokio::spawn(jwt.clone().run(shutdown.clone()));
        }
        if let Some(poller) = &self.poller {
            tokio::spawn(poller.clone().run(shutdown.clone()));
            if let Some((redis, channel)) = &self.announcements {
                tokio::spawn(broadcast::listen(
                    redis.clone(),
                    channel.clone(),
                    self.catalog().clone(),
                    shutdown.clone(),
                ));
            }
        }
    }

    /// Serves the proxy on `listener` until `shutdown`, then drains. `false` if draining timed out.
    pub async fn serve(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) -> bool {
        let proxy = self.proxy.clone();
        let http = HttpSettings {
            passes: Some(Arc::new(proxy.passes())),
            ..self.http.clone()
        };
        server::serve(
            listener,
            http,
            self.executor.clone(),
            move |peer, req| proxy.clone().handle(peer, req),
            shutdown,
        )
        .await
    }
}
