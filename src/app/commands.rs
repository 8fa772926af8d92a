//! commands: what each `quotagate` subcommand does, once its configuration is loaded.
//!
//! `main.rs` parses the command line, loads the configuration, starts logging and the signal
//! handlers, and calls one of these. Every server here binds all its listeners before it says it is
//! listening, so whoever waits for that line can connect to any of them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::app::App;
use crate::app::demo;
use crate::app::settings::Settings;
use crate::app::shutdown::Token;
use crate::catalog::server::CatalogServer;
use crate::catalog::{KeySecrets, Snapshot};
use crate::config::{ConfigError, address, header_name};
use crate::divvy::load::LoadOptions;
use crate::divvy::rules::RuleSet;
use crate::server;
use crate::start::{StartError, bind};
use quotagate_engine::clock::SystemClock;
use quotagate_engine::text::plural;

/// `quotagate` / `quotagate run` / `quotagate quickstart`: the gateway, plus its admin listener and
/// Divvy port when configured; `quickstart` uses the built-in catalog (unless one is configured)
/// and also serves the example upstream on `upstream.url`'s address.
pub async fn gateway(
    settings: &Settings,
    quickstart: bool,
    token: Token,
) -> Result<(), StartError> {
    let Some(g) = &settings.gateway else {
        return Ok(());
    };
    let catalog = match quickstart && g.catalog_file.is_none() {
        true => Some(Snapshot::from_json(
            "catalogs/quickstart.json (built in)",
            demo::QUICKSTART_CATALOG,
        )?),
        false => None,
    };
    let app = App::build(settings, Arc::new(SystemClock::new()), catalog)?;
    let listeners = app.bind().await?;
    if quickstart {
        let authority = &g.upstream.targets[0].authority;
        let addr = tokio::net::lookup_host(authority.as_str())
            .await
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                ConfigError::option("upstream.url", format!("cannot resolve {authority}"))
            })?;
        let (up, up_addr) = bind(addr).await?;
        tracing::info!(listen = %up_addr, "example upstream listening");
        tokio::spawn(server::serve(
            up,
            Default::default(),
            Default::default(),
            demo::echo,
            token.clone().cancelled_owned(),
        ));
    }
    // Only once everything started: a start-up error is then the one line it should be. The
    // whole configuration (1.5 kB) is for debugging, and in /status; the line below says what
    // runs.
    tracing::debug!(config = %settings.config.redacted_json(), "effective configuration");
    // Parts that are off are left out of the line rather than shown empty.
    let shown = |a: Option<SocketAddr>| a.map(tracing::field::display);
    if let Some(gateway) = &app.gateway {
        let snapshot = gateway.catalog().snapshot();
        tracing::info!(
            listen = shown(listeners.gateway()),
            admin = shown(listeners.admin()),
            divvy = shown(listeners.divvy()),
            rls = shown(listeners.rls()),
            upstream = %settings.config.upstream.url,
            store = app.store.kind(),
            catalog_version = %snapshot.version.semver,
            endpoints = snapshot.endpoints().len(),
            keys = snapshot.key_count(),
            "quotagate listening"
        );
    }
    if app.run(listeners, token).await {
        tracing::info!("stopped");
    } else {
        tracing::warn!("stopped with requests still in flight after the drain timeout");
    }
    Ok(())
}

/// `quotagate example-upstream`: only the example upstream API.
pub async fn example_upstream(listen: Option<&str>, token: Token) -> Result<(), StartError> {
    let (listener, listen) = bind(address(
        "--listen",
        listen.unwrap_or("127.0.0.1:9000"),
        "127.0.0.1:9000",
    )?)
    .await?;
    tracing::info!(%listen, "example upstream listening");
    server::serve(
        listener,
        Default::default(),
        Default::default(),
        demo::echo,
        token.cancelled_owned(),
    )
    .await;
    Ok(())
}

/// `quotagate catalog-server`: serves `source` (a file or directory) to gateways.
pub async fn catalog_server(
    settings: &Settings,
    source: Option<&str>,
    listen: Option<&str>,
    token: Token,
) -> Result<(), StartError> {
    let source = source.ok_or_else(|| {
        ConfigError::option("--catalog", "catalog-server needs a FILE or DIRECTORY")
    })?;
    let addr = address(
        "--listen",
        listen.unwrap_or("127.0.0.1:9100"),
        "127.0.0.1:9100",
    )?;
    let catalog = &settings.config.catalog;
    let header = header_name("catalog.server_auth_header", &catalog.server_auth_header)?;
    let secret = (!catalog.server_secret.is_empty()).then(|| catalog.server_secret.clone());
    if secret.is_none() {
        tracing::warn!(
            "catalog.server_secret is not set: anyone who can reach this server can read the catalog"
        );
    }
    let clock = Arc::new(SystemClock::new());
    let max_bytes = crate::config::max_bytes(catalog.max_bytes)?;
    let server =
        Arc::new(CatalogServer::new(source.into(), header, secret, clock).max_bytes(max_bytes));
    let (listener, listen) = bind(addr).await?;
    tracing::info!(%listen, "catalog server listening");
    tokio::spawn(server.clone().watch(token.clone().cancelled_owned()));
    server::serve(
        listener,
        Default::default(),
        Default::default(),
        move |peer, req| server.clone().handle(peer, req),
        token.cancelled_owned(),
    )
    .await;
    Ok(())
}

/// `quotagate divvy RULES`: only the Divvy port, as a drop-in for Divvy, configured by Divvy's
/// environment variables (see [`crate::divvy::dropin`]); `redis`: the `host:port` they named.
pub async fn divvy(
    settings: &Settings,
    redis: Option<String>,
    token: Token,
) -> Result<(), StartError> {
    let app = App::build(settings, Arc::new(SystemClock::new()), None)?;
    let listeners = app.bind().await?;
    if let Some(metrics) = listeners.admin() {
        tracing::info!(port = metrics.port(), "serving Divvy metrics");
    }
    let port = listeners.divvy().map_or(0, |a| a.port());
    // Divvy's own start-up line, which deployment scripts may wait for.
    match &redis {
        Some(redis) => println!("Listening on port TCP port {port}, Redis host {redis}"),
        None => println!("Listening on port TCP port {port}, memory store"),
    }
    app.run(listeners, token).await;
    Ok(())
}

/// `quotagate ratelimit`: only the Envoy rate-limit service, as a drop-in for envoyproxy/ratelimit
/// (`settings` from its variables, see [`crate::rls::dropin`]).
pub async fn ratelimit(settings: &Settings, token: Token) -> Result<(), StartError> {
    for (var, why) in crate::rls::dropin::ignored(|k| std::env::var(k).ok()) {
        tracing::warn!(variable = var, "ignored: {why}");
    }
    let app = App::build(settings, Arc::new(SystemClock::new()), None)?;
    if let Some(redis) = app.store.shared() {
        reach_at_start(redis.as_ref()).await?;
    }
    let listeners = app.bind().await?;
    let shown = |a: Option<SocketAddr>| a.map(tracing::field::display);
    tracing::info!(
        grpc = shown(listeners.rls()),
        tls = settings.rls.as_ref().is_some_and(|r| r.tls.is_some()),
        http = shown(listeners.admin()),
        store = app.store.kind(),
        "rate-limit service listening"
    );
    app.run(listeners, token).await;
    Ok(())
}

/// How long the drop-in tries its Redis at start before it stops.
const REACH_AT_START: std::time::Duration = std::time::Duration::from_secs(5);

/// The drop-in's Redis answers, or the start stops naming `REDIS_URL`, as envoyproxy/ratelimit
/// stops when it cannot connect: variables that name a Redis this process cannot use (its
/// address, TLS files, password) must not leave it answering from its own memory
/// (`store.failure_policy`) while nothing is shared. Tried for [`REACH_AT_START`]; once
/// started, the failure policy applies as in the gateway.
async fn reach_at_start(redis: &quotagate_store::RedisStore) -> Result<(), StartError> {
    use quotagate_store::CounterStore;
    let deadline = tokio::time::Instant::now() + REACH_AT_START;
    loop {
        match redis.check_reachable().await {
            Ok(()) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(ConfigError::option(
                    "REDIS_URL",
                    format!("Redis did not answer within {REACH_AT_START:?}: {e}"),
                )
                .into());
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
}

/// `quotagate divvy-load`: prints one line of `key=value` results.
pub async fn divvy_load(opts: LoadOptions) -> Result<(), StartError> {
    let addr = opts.addr;
    let r = crate::divvy::load::run(opts)
        .await
        .map_err(|e| ConfigError::general(format!("load against {addr} failed: {e}")))?;
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

/// `quotagate health URL`: does `url` answer 2xx within 2 s? Says why not on stderr.
pub async fn health(url: &str) -> bool {
    let client = match reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(2))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("health: {}", crate::start::with_causes(&e));
            return false;
        }
    };
    match client.get(url).send().await {
        Ok(r) if r.status().is_success() => true,
        Ok(r) => {
            eprintln!("health: {url} answered {}", r.status());
            false
        }
        Err(e) if e.is_connect() => {
            eprintln!("health: nothing answers at {url}");
            false
        }
        Err(e) if e.is_timeout() => {
            eprintln!("health: {url} did not answer within 2 s");
            false
        }
        Err(e) => {
            eprintln!("health: {url}: {e}");
            false
        }
    }
}

/// Rule files are `.ini`, or `.json` with Divvy's `overrides`/`default`; other files are catalogs.
fn is_rule_file(path: &Path) -> bool {
    match path.extension().and_then(|e| e.to_str()) {
        Some("ini") => true,
        Some("json") => {
            // Only the top-level names are looked at: a catalog of a million keys read as a
            // `serde_json::Value` took 2 GB.
            #[derive(serde::Deserialize)]
            struct Top {
                overrides: Option<serde::de::IgnoredAny>,
                default: Option<serde::de::IgnoredAny>,
            }
            std::fs::read(path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Top>(&b).ok())
                .is_some_and(|t| t.overrides.is_some() || t.default.is_some())
        }
        _ => false,
    }
}

/// `quotagate validate [--strict] FILE...`: prints a line per file, and a warning per catalog field
/// quotagate does not know; true when all are valid (with `strict`, also without such fields).
/// `secrets`: those the catalogs' `hmac-sha256` digests are made with (`--key-secret-file`).
pub fn validate(
    files: &[PathBuf],
    strict: bool,
    max_bytes: u64,
    secrets: Option<Arc<KeySecrets>>,
) -> bool {
    let mut ok = true;
    for f in files {
        let name = f.display();
        if is_rule_file(f) {
            match RuleSet::load(f) {
                Ok(r) => println!(
                    "{name}: valid rule file ({})",
                    plural(r.rules().len() as u64, "rule", "rules")
                ),
                Err(e) => {
                    ok = false;
                    println!("{e}");
                }
            }
            continue;
        }
        match crate::catalog::load_file(f, max_bytes, secrets.clone()) {
            Ok(s) => {
                let unknown = s.unknown_fields();
                let refused = strict && !unknown.is_empty();
                println!(
                    "{name}: {} catalog ({}, {})",
                    if refused {
                        "refused (--strict)"
                    } else {
                        "valid"
                    },
                    plural(s.endpoints().len() as u64, "endpoint", "endpoints"),
                    plural(s.key_count() as u64, "API key", "API keys")
                );
                for field in unknown {
                    println!("{name}: warning: unknown field `{field}` (ignored)");
                }
                ok &= !refused;
            }
            Err(e) => {
                ok = false;
                println!("{e}");
            }
        }
    }
    ok
}

/// The longest line `key-digest` reads as one key.
pub const MAX_KEY_LINE_BYTES: u64 = 64 * 1024;

/// `quotagate key-digest [--secret-file F]`: a digest per key read from `input`, one key a
/// line, written to `out` a line each (`sha256:`, or with `secrets` `hmac-sha256:` under the
/// current secret). An empty or over-long line is named on `err` by its number (never its
/// bytes) and gets an empty line, so that lines still pair up; false if there was one.
pub fn key_digest_lines(
    secrets: Option<&KeySecrets>,
    mut input: impl std::io::BufRead,
    mut out: impl std::io::Write,
    mut err: impl std::io::Write,
) -> std::io::Result<bool> {
    use std::io::{BufRead, Read};
    let mut ok = true;
    let mut line = Vec::new();
    for n in 1.. {
        line.clear();
        let read = (&mut input)
            .take(MAX_KEY_LINE_BYTES + 1)
            .read_until(b'\n', &mut line)?;
        if read == 0 {
            break;
        }
        let full = line.last() == Some(&b'\n');
        if !full && line.len() as u64 > MAX_KEY_LINE_BYTES {
            writeln!(err, "line {n}: longer than {MAX_KEY_LINE_BYTES} bytes")?;
            // The rest of the line is skipped.
            let mut rest = Vec::new();
            while !rest.ends_with(b"\n") {
                rest.clear();
                if (&mut input)
                    .take(MAX_KEY_LINE_BYTES)
                    .read_until(b'\n', &mut rest)?
                    == 0
                {
                    break;
                }
            }
            writeln!(out)?;
            ok = false;
            continue;
        }
        let key = line.strip_suffix(b"\n").unwrap_or(&line);
        let key = key.strip_suffix(b"\r").unwrap_or(key);
        if key.is_empty() {
            writeln!(err, "line {n}: an empty key")?;
            writeln!(out)?;
            ok = false;
            continue;
        }
        let digest = match secrets.and_then(|s| s.hmac(0, key)) {
            Some(h) => h.display(crate::catalog::Form::HmacSha256),
            None => crate::catalog::KeyDigest::sha256(key).display(crate::catalog::Form::Sha256),
        };
        writeln!(out, "{digest}")?;
    }
    Ok(ok)
}

/// `quotagate key-digest --catalog IN [--secret-file F]`: `IN` with every `key` replaced by its
/// `key_digest`, on standard output; false (the reason on standard error) if it cannot be.
pub fn key_digest_catalog(file: &Path, secrets: Option<&KeySecrets>, max_bytes: u64) -> bool {
    let read = std::fs::metadata(file).and_then(|m| match m.len() > max_bytes {
        true => Err(std::io::Error::other(format!(
            "it is {} bytes; at most {max_bytes} are accepted (--max-bytes)",
            m.len()
        ))),
        false => std::fs::read(file),
    });
    let written = read
        .map_err(|e| e.to_string())
        .and_then(|json| crate::catalog::digest_keys(&json, secrets));
    match written {
        Ok(json) => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            out.write_all(&json).and_then(|()| out.flush()).is_ok()
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            false
        }
    }
}
