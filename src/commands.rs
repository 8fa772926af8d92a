//! commands: what each `quotagate` subcommand does, once its configuration is loaded.
//!
//! `main.rs` parses the command line, loads the configuration, starts logging and the signal
//! handlers, and calls one of these. Every server here binds all its listeners before it says it is
//! listening, so whoever waits for that line can connect to any of them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::catalog::Snapshot;
use crate::catalog::server::CatalogServer;
use crate::clock::SystemClock;
use crate::config::{Config, ConfigError, StoreKind, UpstreamTarget};
use crate::divvy::Divvy;
use crate::divvy::load::LoadOptions;
use crate::divvy::metrics::Statsd;
use crate::divvy::rules::RuleSet;
use crate::divvy::server::DivvySettings;
use crate::gateway::{self, Gateway, StartError};
use crate::shutdown::Token;
use crate::{demo, server};

fn address(raw: &str, what: &str, example: &str) -> Result<SocketAddr, StartError> {
    raw.parse().map_err(|_| {
        ConfigError(format!("{what}: {raw:?} is not an address like {example}")).into()
    })
}

async fn bound(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    let listener = gateway::bind(addr).await?;
    let local = listener
        .local_addr()
        .map_err(|source| StartError::Listen { addr, source })?;
    Ok((listener, local))
}

/// `quotagate` / `quotagate run` / `quotagate quickstart`: the gateway, plus its admin listener and
/// Divvy port when configured; `quickstart` uses the built-in catalog (unless one is configured)
/// and also serves the example upstream on `upstream.url`'s address.
pub async fn gateway(config: &Config, quickstart: bool, token: Token) -> Result<(), StartError> {
    tracing::info!(config = %config.redacted_json(), "effective configuration");
    let clock = Arc::new(SystemClock::new());
    let gateway = if quickstart && config.catalog.file.is_empty() {
        let catalog = Snapshot::from_json(
            "catalogs/quickstart.json (built in)",
            demo::QUICKSTART_CATALOG,
        )?;
        Gateway::with_catalog(config, clock, Some(catalog))?
    } else {
        Gateway::build(config, clock)?
    };
    let gateway = Arc::new(gateway);

    let (listener, listen) = bound(config.listen_addr()).await?;
    if quickstart {
        let upstream = UpstreamTarget::parse(&config.upstream.url)?;
        let addr = tokio::net::lookup_host(upstream.authority.as_str())
            .await
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| ConfigError(format!("cannot resolve {}", upstream.authority)))?;
        let (up, up_addr) = bound(addr).await?;
        tracing::info!(listen = %up_addr, "example upstream listening");
        tokio::spawn(server::serve(
            up,
            Default::default(),
            demo::echo,
            token.clone().cancelled_owned(),
        ));
    }
    let admin = match config.admin.enabled {
        true => Some(
            bound(address(
                &config.admin.listen,
                "admin.listen",
                "127.0.0.1:8081",
            )?)
            .await?,
        ),
        false => None,
    };
    let divvy = match gateway.divvy.is_some() {
        true => Some(
            bound(address(
                &config.divvy.listen,
                "divvy.listen",
                "127.0.0.1:8321",
            )?)
            .await?,
        ),
        false => None,
    };

    let admin_addr = admin
        .as_ref()
        .map(|(_, a)| a.to_string())
        .unwrap_or_default();
    let divvy_addr = divvy
        .as_ref()
        .map(|(_, a)| a.to_string())
        .unwrap_or_default();
    if let Some((l, _)) = admin {
        let handler = gateway.admin();
        tokio::spawn(server::serve(
            l,
            Default::default(),
            move |peer, req| handler.clone().handle(peer, req),
            token.clone().cancelled_owned(),
        ));
    }
    if let Some((l, _)) = divvy {
        let (g, stop) = (gateway.clone(), token.clone());
        tokio::spawn(async move { g.serve_divvy(l, stop.cancelled_owned()).await });
    }
    gateway.spawn_background(&token);
    let snapshot = gateway.proxy.catalog.snapshot();
    tracing::info!(
        %listen,
        admin = %admin_addr,
        divvy = %divvy_addr,
        upstream = %config.upstream.url,
        store = gateway.proxy.store.kind(),
        catalog_version = %snapshot.version.semver,
        endpoints = snapshot.endpoints().len(),
        keys = snapshot.key_count(),
        "quotagate listening"
    );
    drop(snapshot);
    if gateway.serve(listener, token.cancelled()).await {
        tracing::info!("stopped");
    } else {
        tracing::warn!("stopped with requests still in flight after the drain timeout");
    }
    Ok(())
}

/// `quotagate example-upstream`: only the example upstream API.
pub async fn example_upstream(listen: Option<&str>, token: Token) -> Result<(), StartError> {
    let (listener, listen) = bound(address(
        listen.unwrap_or("127.0.0.1:9000"),
        "--listen",
        "127.0.0.1:9000",
    )?)
    .await?;
    tracing::info!(%listen, "example upstream listening");
    server::serve(
        listener,
        Default::default(),
        demo::echo,
        token.cancelled_owned(),
    )
    .await;
    Ok(())
}

/// `quotagate catalog-server`: serves `source` (a file or directory) to gateways.
pub async fn catalog_server(
    config: &Config,
    source: Option<&str>,
    listen: Option<&str>,
    token: Token,
) -> Result<(), StartError> {
    let source = source
        .ok_or_else(|| ConfigError("catalog-server needs --catalog FILE or DIRECTORY".into()))?;
    let addr = address(
        listen.unwrap_or("127.0.0.1:9100"),
        "--listen",
        "127.0.0.1:9100",
    )?;
    let header = http::HeaderName::from_bytes(config.catalog.server_auth_header.as_bytes())
        .map_err(|e| ConfigError(e.to_string()))?;
    let secret =
        (!config.catalog.server_secret.is_empty()).then(|| config.catalog.server_secret.clone());
    if secret.is_none() {
        tracing::warn!(
            "catalog.server_secret is not set: anyone who can reach this server can read the catalog"
        );
    }
    let server = Arc::new(CatalogServer::new(source.into(), header, secret));
    let (listener, listen) = bound(addr).await?;
    tracing::info!(%listen, "catalog server listening");
    server::serve(
        listener,
        Default::default(),
        move |peer, req| server.clone().handle(peer, req),
        token.cancelled_owned(),
    )
    .await;
    Ok(())
}

/// `quotagate divvy RULES`: only the Divvy port, as a drop-in for Divvy, configured by Divvy's
/// environment variables (`PORT`, `REDIS_HOST`, `REDIS_PORT`, `STATSD_*`, `HTTP_SERVICE_PORT`,
/// `PROMETHEUS_METRICS_PATH`).
pub async fn divvy(mut config: Config, rules: &Path, token: Token) -> Result<(), StartError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let port: u16 = match env("PORT") {
        Some(p) => p
            .parse()
            .map_err(|_| ConfigError(format!("PORT: {p:?} is not a port number")))?,
        None => 8321,
    };
    let redis = (env("REDIS_HOST").is_some() || env("REDIS_PORT").is_some()).then(|| {
        (
            env("REDIS_HOST").unwrap_or_else(|| "localhost".into()),
            env("REDIS_PORT").unwrap_or_else(|| "6379".into()),
        )
    });
    if let Some((host, rport)) = &redis {
        config.store.kind = StoreKind::Redis;
        config.store.redis_url = format!("redis://{host}:{rport}");
    }
    let rules = RuleSet::load(rules).map_err(|e| ConfigError(e.to_string()))?;
    let store = Arc::new(gateway::build_store(&config)?);
    let divvy = Arc::new(Divvy::new(
        rules,
        store,
        Arc::new(SystemClock::new()),
        Statsd::from_env(env),
    ));

    // Divvy's metrics server: HTTP_SERVICE_PORT and PROMETHEUS_METRICS_PATH, both needed.
    match (env("HTTP_SERVICE_PORT"), env("PROMETHEUS_METRICS_PATH")) {
        (Some(p), Some(path)) => {
            let hport: u16 = p.parse().map_err(|_| {
                ConfigError(format!("HTTP_SERVICE_PORT: {p:?} is not a port number"))
            })?;
            let (listener, _) = bound(SocketAddr::from(([0, 0, 0, 0], hport))).await?;
            let mut registry = prometheus_client::registry::Registry::default();
            divvy.metrics.register(&mut registry);
            let registry = Arc::new(registry);
            let path = if path.starts_with('/') {
                path
            } else {
                format!("/{path}")
            };
            tracing::info!(port = hport, %path, "serving Divvy metrics");
            tokio::spawn(server::serve(
                listener,
                Default::default(),
                move |_peer, req: http::Request<hyper::body::Incoming>| {
                    let (registry, path) = (registry.clone(), path.clone());
                    async move {
                        let mut resp =
                            http::Response::new(http_body_util::Full::new(bytes::Bytes::new()));
                        if req.uri().path() == path {
                            let mut text = String::new();
                            let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
                            *resp.body_mut() = http_body_util::Full::new(bytes::Bytes::from(text));
                        } else {
                            *resp.status_mut() = http::StatusCode::NOT_FOUND;
                        }
                        resp
                    }
                },
                token.clone().cancelled_owned(),
            ));
        }
        (None, None) => {}
        _ => tracing::warn!(
            "set both HTTP_SERVICE_PORT and PROMETHEUS_METRICS_PATH to serve metrics"
        ),
    }

    let (listener, local) = bound(SocketAddr::from(([0, 0, 0, 0], port))).await?;
    // Divvy's own start-up line, which deployment scripts may wait for.
    match &redis {
        Some((host, rport)) => println!(
            "Listening on port TCP port {}, Redis host {host}:{rport}",
            local.port()
        ),
        None => println!("Listening on port TCP port {}, memory store", local.port()),
    }
    let settings = DivvySettings {
        max_line_bytes: config.divvy.max_line_bytes,
        max_connections: config.divvy.max_connections,
        max_in_flight: config.divvy.max_in_flight,
        workers: Some(Arc::new(
            crate::workers::Workers::start(config.server.worker_count(), "divvy-worker")
                .map_err(|e| ConfigError(format!("cannot start the workers: {e}")))?,
        )),
    };
    crate::divvy::server::serve(listener, divvy, settings, token.cancelled_owned()).await;
    Ok(())
}

/// `quotagate divvy-load`: prints one line of `key=value` results.
pub async fn divvy_load(opts: LoadOptions) -> Result<(), StartError> {
    let addr = opts.addr;
    let r = crate::divvy::load::run(opts)
        .await
        .map_err(|e| ConfigError(format!("load against {addr} failed: {e}")))?;
    println!(
        "hits={} seconds={:.2} hits_per_s={:.0} p50_ms={:.3} p99_ms={:.3} p999_ms={:.3} allowed={} denied={} errors={}",
        r.hits,
        r.elapsed.as_secs_f64(),
        r.hits_per_second(),
        r.p50_us as f64 / 1000.0,
        r.p99_us as f64 / 1000.0,
        r.p999_us as f64 / 1000.0,
        r.allowed,
        r.denied,
        r.errors
    );
    Ok(())
}

/// `quotagate health URL`: does `url` answer 2xx within 2 s?
pub async fn health(url: &str) -> bool {
    match reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(2))
        .build()
    {
        Ok(c) => c
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success()),
        Err(_) => false,
    }
}

/// Rule files are `.ini`, or `.json` with Divvy's `overrides`/`default`; other files are catalogs.
fn is_rule_file(path: &Path) -> bool {
    match path.extension().and_then(|e| e.to_str()) {
        Some("ini") => true,
        Some("json") => std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v.get("overrides").is_some() || v.get("default").is_some()),
        _ => false,
    }
}

/// `quotagate validate FILE...`: prints a line per file; true when all are valid.
pub fn validate(files: &[PathBuf]) -> bool {
    let mut ok = true;
    for f in files {
        let report = if is_rule_file(f) {
            RuleSet::load(f)
                .map(|r| {
                    format!(
                        "{}: valid rule file ({} rules)",
                        f.display(),
                        r.rules().len()
                    )
                })
                .map_err(|e| e.to_string())
        } else {
            Snapshot::load_file(f)
                .map(|s| {
                    format!(
                        "{}: valid catalog ({} endpoints, {} API keys)",
                        f.display(),
                        s.endpoints().len(),
                        s.key_count()
                    )
                })
                .map_err(|e| e.to_string())
        };
        match report {
            Ok(line) => println!("{line}"),
            Err(e) => {
                ok = false;
                println!("{e}");
            }
        }
    }
    ok
}
