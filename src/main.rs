//! The `quotagate` command: parses the command line and hands over to the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use quotagate::catalog::Snapshot;
use quotagate::catalog::server::CatalogServer;
use quotagate::clock::SystemClock;
use quotagate::config::{Config, ConfigError, UpstreamTarget};
use quotagate::divvy::Divvy;
use quotagate::divvy::rules::RuleSet;
use quotagate::divvy::server::DivvySettings;
use quotagate::gateway::{self, Gateway, StartError};
use quotagate::{demo, server, shutdown, telemetry};

/// A rate-limiting reverse proxy: per-key, per-endpoint sliding-window limits shared through Redis.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    opts: ConfigArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Run,
    /// Run the gateway with the built-in example catalog in front of the example upstream.
    Quickstart,
    /// Run only the Divvy quota port, as a drop-in for Divvy: reads `PORT` (default 8321),
    /// `REDIS_HOST` and `REDIS_PORT` (memory store when neither is set), listens on all interfaces.
    Divvy { rules: PathBuf },
    /// Load a Divvy port you run: N connections, D pipelined hits each, a mix of allowed and denied.
    DivvyLoad {
        #[arg(long, default_value = "127.0.0.1:8321")]
        addr: std::net::SocketAddr,
        #[arg(long, default_value_t = 50)]
        connections: usize,
        #[arg(long, default_value_t = 16)]
        depth: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Share of hits sent to `bench=deny` (0 to 100).
        #[arg(long, default_value_t = 30)]
        deny_percent: u64,
    },
    /// Exit 0 if `URL` answers 200 within 2 s (the container image's health check).
    Health {
        #[arg(default_value = "http://127.0.0.1:8081/healthz")]
        url: String,
    },
    /// Check catalog files and report every problem; exit status 1 if any is invalid.
    Validate {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Serve catalogs to gateways (`--catalog FILE|DIR`, `--listen`, default 127.0.0.1:9100); see
    /// docs/catalog-protocol.md.
    CatalogServer,
    /// Run the example upstream API alone (a JSON echo of every request) on `--listen`, by default
    /// 127.0.0.1:9000.
    ExampleUpstream,
}

#[derive(Args)]
struct ConfigArgs {
    /// TOML configuration file.
    #[arg(short, long, global = true, env = "QUOTAGATE_CONFIG")]
    config: Option<PathBuf>,
    /// Set any option, e.g. `--set store.kind=redis` (repeatable; wins over file and environment).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE", global = true)]
    sets: Vec<String>,
    /// Shortcut for `--set server.listen=ADDR`.
    #[arg(long, global = true)]
    listen: Option<String>,
    /// Shortcut for `--set upstream.url=URL`.
    #[arg(long, global = true)]
    upstream: Option<String>,
    /// Shortcut for `--set catalog.file=FILE`.
    #[arg(long, global = true)]
    catalog: Option<String>,
    /// Shortcut for `--set store.kind=KIND` (`memory` or `redis`).
    #[arg(long, global = true)]
    store: Option<String>,
    /// Shortcut for `--set store.redis_url=URL`.
    #[arg(long, global = true)]
    redis_url: Option<String>,
}

impl ConfigArgs {
    fn load(&self) -> Result<Config, StartError> {
        let mut sets = Vec::new();
        for (key, value) in [
            ("server.listen", &self.listen),
            ("upstream.url", &self.upstream),
            ("catalog.file", &self.catalog),
            ("store.kind", &self.store),
            ("store.redis_url", &self.redis_url),
        ] {
            if let Some(v) = value {
                sets.push(format!("{key}={v}"));
            }
        }
        sets.extend(self.sets.iter().cloned());
        Ok(Config::load(
            self.config.as_deref(),
            |k| std::env::var(k).ok(),
            &sets,
        )?)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command.unwrap_or(Command::Run) {
            Command::Run => run(&cli.opts, false).await,
            Command::Quickstart => run(&cli.opts, true).await,
                        Command::Validate { files } => return validate(&files),
            Command::Health { url } => {
                let client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(2)).build();
                let ok = match client {
                    Ok(c) => c.get(&url).send().await.is_ok_and(|r| r.status().is_success()),
                    Err(_) => false,
                };
                return Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE });
            }
            Command::ExampleUpstream => example_upstream(&cli.opts).await,
            Command::CatalogServer => catalog_server(&cli.opts).await,
                        Command::Divvy { rules } => divvy_alone(&cli.opts, &rules).await,
            Command::DivvyLoad { addr, connections, depth, seconds, deny_percent } => {
                let opts = quotagate::divvy::load::LoadOptions {
                    addr,
                    connections,
                    depth,
                    duration: std::time::Duration::from_secs(seconds),
                    deny_percent: deny_percent.min(100),
                };
                let r = quotagate::divvy::load::run(opts)
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
        }
        .map(|()| ExitCode::SUCCESS)
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(opts: &ConfigArgs, quickstart: bool) -> Result<(), StartError> {
    let config = opts.load()?;
    telemetry::init(&config.log);
    let token = shutdown::on_signal();
    tracing::info!(config = %config.redacted_json(), "effective configuration");
    let clock = Arc::new(SystemClock::new());
    let gateway = if quickstart && config.catalog.file.is_empty() {
        let catalog = Snapshot::from_json(
            "catalogs/quickstart.json (built in)",
            demo::QUICKSTART_CATALOG,
        )?;
        Gateway::with_catalog(&config, clock, Some(catalog))?
    } else {
        Gateway::build(&config, clock)?
    };
    let listener = gateway::bind(config.listen_addr()).await?;
    if quickstart {
        let upstream = UpstreamTarget::parse(&config.upstream.url)?;
        let addr = tokio::net::lookup_host(upstream.authority.as_str())
            .await
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| ConfigError(format!("cannot resolve {}", upstream.authority)))?;
        let up = gateway::bind(addr).await?;
        tracing::info!(%addr, "example upstream listening");
        tokio::spawn(server::serve(
            up,
            Default::default(),
            demo::echo,
            token.clone().cancelled_owned(),
        ));
    }
    let snapshot = gateway.proxy.catalog.snapshot();
    tracing::info!(
        listen = %listener.local_addr().map_err(|source| StartError::Listen { addr: config.listen_addr(), source })?,
        upstream = %config.upstream.url,
        store = gateway.proxy.store.kind(),
        catalog_version = %snapshot.version.semver,
        endpoints = snapshot.endpoints().len(),
        keys = snapshot.key_count(),
        "quotagate listening"
    );
    drop(snapshot);
    gateway.spawn_background(&token);
    let gateway = Arc::new(gateway);
    if config.admin.enabled {
        let addr: std::net::SocketAddr = config
            .admin
            .listen
            .parse()
            .map_err(|_| ConfigError("admin.listen".into()))?;
        let admin_listener = gateway::bind(addr).await?;
        tracing::info!(listen = %addr, "admin listening: /metrics /healthz /readyz");
        let (admin, stop) = (gateway.admin(), token.clone());
        tokio::spawn(server::serve(
            admin_listener,
            Default::default(),
            move |peer, req| admin.clone().handle(peer, req),
            stop.cancelled_owned(),
        ));
    }
    if gateway.divvy.is_some() {
        let addr: std::net::SocketAddr = config
            .divvy
            .listen
            .parse()
            .map_err(|_| ConfigError("divvy.listen".into()))?;
        let divvy_listener = gateway::bind(addr).await?;
        tracing::info!(listen = %addr, rules = %config.divvy.rules, "divvy port listening");
        let (g, stop) = (gateway.clone(), token.clone());
        tokio::spawn(async move { g.serve_divvy(divvy_listener, stop.cancelled_owned()).await });
    }
    let drained = gateway.serve(listener, token.cancelled()).await;
    if drained {
        tracing::info!("stopped");
    } else {
        tracing::warn!("stopped with requests still in flight after the drain timeout");
    }
    Ok(())
}

async fn example_upstream(opts: &ConfigArgs) -> Result<(), StartError> {
    let config = opts.load()?;
    telemetry::init(&config.log);
    let token = shutdown::on_signal();
    let raw = opts.listen.as_deref().unwrap_or("127.0.0.1:9000");
    let addr = raw.parse().map_err(|_| {
        ConfigError(format!(
            "--listen: {raw:?} is not an address like 127.0.0.1:9000"
        ))
    })?;
    let listener = gateway::bind(addr).await?;
    let listen = listener
        .local_addr()
        .map_err(|source| StartError::Listen { addr, source })?;
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

async fn catalog_server(opts: &ConfigArgs) -> Result<(), StartError> {
    let config = opts.load()?;
    telemetry::init(&config.log);
    let token = shutdown::on_signal();
    let source = opts
        .catalog
        .clone()
        .ok_or_else(|| ConfigError("catalog-server needs --catalog FILE or DIRECTORY".into()))?;
    let raw = opts.listen.as_deref().unwrap_or("127.0.0.1:9100");
    let addr = raw.parse().map_err(|_| {
        ConfigError(format!(
            "--listen: {raw:?} is not an address like 127.0.0.1:9100"
        ))
    })?;
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
    let listener = gateway::bind(addr).await?;
    let listen = listener
        .local_addr()
        .map_err(|source| StartError::Listen { addr, source })?;
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

async fn divvy_alone(opts: &ConfigArgs, rules: &std::path::Path) -> Result<(), StartError> {
    let mut config = opts.load()?;
    telemetry::init(&config.log);
    let token = shutdown::on_signal();
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let port: u16 = match env("PORT") {
        Some(p) => p
            .parse()
            .map_err(|_| ConfigError(format!("PORT: {p:?} is not a port number")))?,
        None => 8321,
    };
    let redis = (env("REDIS_HOST").is_some() || env("REDIS_PORT").is_some()).then(|| {
        let host = env("REDIS_HOST").unwrap_or_else(|| "localhost".into());
        let rport = env("REDIS_PORT").unwrap_or_else(|| "6379".into());
        (host, rport)
    });
    if let Some((host, rport)) = &redis {
        config.store.kind = quotagate::config::StoreKind::Redis;
        config.store.redis_url = format!("redis://{host}:{rport}");
    }
    let rules = RuleSet::load(rules).map_err(|e| ConfigError(e.to_string()))?;
    let store = Arc::new(gateway::build_store(&config)?);
    let statsd = quotagate::divvy::metrics::Statsd::from_env(env);
    let divvy = Arc::new(Divvy::new(
        rules,
        store,
        Arc::new(SystemClock::new()),
        statsd,
    ));
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
    let listener = gateway::bind(addr).await?;
    let port = listener
        .local_addr()
        .map_err(|source| StartError::Listen { addr, source })?
        .port();
    // Divvy's own start-up line, which deployment scripts may wait for.
    match &redis {
        Some((host, rport)) => {
            println!("Listening on port TCP port {port}, Redis host {host}:{rport}")
        }
        None => println!("Listening on port TCP port {port}, memory store"),
    }
    // Divvy's metrics server: HTTP_SERVICE_PORT and PROMETHEUS_METRICS_PATH, both needed.
    match (env("HTTP_SERVICE_PORT"), env("PROMETHEUS_METRICS_PATH")) {
        (Some(p), Some(path)) => {
            let hport: u16 = p.parse().map_err(|_| {
                ConfigError(format!("HTTP_SERVICE_PORT: {p:?} is not a port number"))
            })?;
            let haddr = std::net::SocketAddr::from(([0, 0, 0, 0], hport));
            let hlistener = gateway::bind(haddr).await?;
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
                hlistener,
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
    let settings = DivvySettings {
        max_line_bytes: config.divvy.max_line_bytes,
        max_connections: config.divvy.max_connections,
        max_in_flight: config.divvy.max_in_flight,
    };
    quotagate::divvy::server::serve(listener, divvy, settings, token.cancelled_owned()).await;
    Ok(())
}

/// Rule files are `.ini`, or `.json` with Divvy's `overrides`/`default`; other files are catalogs.
fn is_rule_file(path: &std::path::Path) -> bool {
    match path.extension().and_then(|e| e.to_str()) {
        Some("ini") => true,
        Some("json") => std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v.get("overrides").is_some() || v.get("default").is_some()),
        _ => false,
    }
}

fn validate(files: &[PathBuf]) -> Result<ExitCode, StartError> {
    let mut ok = true;
    for f in files {
        if is_rule_file(f) {
            match RuleSet::load(f) {
                Ok(r) => println!(
                    "{}: valid rule file ({} rules)",
                    f.display(),
                    r.rules().len()
                ),
                Err(e) => {
                    ok = false;
                    println!("{e}");
                }
            }
            continue;
        }
        match Snapshot::load_file(f) {
            Ok(s) => println!(
                "{}: valid catalog ({} endpoints, {} API keys)",
                f.display(),
                s.endpoints().len(),
                s.key_count()
            ),
            Err(e) => {
                ok = false;
                println!("{e}");
            }
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
