//! The `quotagate` command: parses the command line, loads the configuration, starts logging and
//! the signal handlers, and hands over to `quotagate::app::commands`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use quotagate::app::settings::{Serve, Settings};
use quotagate::app::{commands, shutdown};
use quotagate::config::Config;
use quotagate::divvy::load::LoadOptions;
use quotagate::observe::telemetry;
use quotagate::start::StartError;

/// mimalloc rather than glibc's malloc: about 10% fewer instructions per proxied request (callgrind,
/// docs/benchmarks/).
#[global_allocator]
static ALLOCATOR: quotagate::alloc::Mimalloc = quotagate::alloc::Mimalloc;

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
    #[command(flatten)]
    Server(ServerCommand),
    #[command(flatten)]
    Tool(ToolCommand),
}

/// Commands that run servers: they load the configuration and run until a signal.
#[derive(Subcommand)]
enum ServerCommand {
    /// Run the gateway (the default).
    Run,
    /// Run the gateway with the built-in example catalog in front of the example upstream.
    Quickstart,
    /// Run the example upstream API alone (a JSON echo of every request) on `--listen`, by default
    /// 127.0.0.1:9000.
    ExampleUpstream,
    /// Serve catalogs to gateways (`--catalog FILE|DIR`, `--listen`, default 127.0.0.1:9100); see
    /// docs/catalog-protocol.md.
    CatalogServer,
    /// Run only the Divvy quota port, as a drop-in for Divvy: reads `PORT` (default 8321),
    /// `REDIS_HOST` and `REDIS_PORT` (memory store when neither is set), listens on all interfaces.
    Divvy { rules: PathBuf },
    /// Run only the Envoy rate-limit service, as a drop-in for envoyproxy/ratelimit's container:
    /// reads its variables (`RUNTIME_ROOT`, `GRPC_PORT`, `PORT`, `REDIS_URL`, ...; see
    /// docs/ratelimit.md), gRPC on 0.0.0.0:8081 and `/healthcheck`, `/metrics` on 0.0.0.0:8080.
    Ratelimit,
}

/// Commands that need no configuration.
#[derive(Subcommand)]
enum ToolCommand {
    /// Check catalog and Divvy rule files and report every problem; exit status 1 if any is invalid.
    /// Catalog fields quotagate does not know are warnings (errors with `--strict`).
    Validate {
        /// Refuse catalogs with fields quotagate does not know.
        #[arg(long)]
        strict: bool,
        /// The largest catalog accepted, in bytes (as `catalog.max_bytes`; default 64 MiB).
        #[arg(long, default_value_t = quotagate::catalog::MAX_CATALOG_BYTES)]
        max_bytes: u64,
        /// The secret file `hmac-sha256` key digests are made with (as
        /// `catalog.key_secret_file`); without it such digests are refused.
        #[arg(long)]
        key_secret_file: Option<PathBuf>,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the digest of each API key read on standard input (one a line), `sha256:<hex>`, or
    /// `hmac-sha256:<hex>` with `--secret-file`; with `--catalog IN`, write IN with every `key`
    /// replaced by its `key_digest` to standard output instead.
    KeyDigest {
        /// A key secret file (as `catalog.key_secret_file`): digests under its first secret.
        #[arg(long)]
        secret_file: Option<PathBuf>,
        /// The largest catalog read, in bytes (default 64 MiB).
        #[arg(long, default_value_t = quotagate::catalog::MAX_CATALOG_BYTES)]
        max_bytes: u64,
    },
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
    /// Exit 0 if `URL` answers 2xx within 2 s (the container image's health check).
    Health {
        #[arg(default_value = "http://127.0.0.1:8081/healthz")]
        url: String,
    },
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
    /// The configuration's layers (file, environment, flags), loaded once.
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
        Ok(Config::load(self.config.as_deref(), env, &sets)?)
    }
}

/// The process environment, for the configuration's layers and the drop-ins' variables.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn dispatch(cli: Cli) -> Result<ExitCode, StartError> {
    let command = match cli.command.unwrap_or(Command::Server(ServerCommand::Run)) {
        Command::Tool(tool) => return run_tool(tool, &cli.opts).await,
        Command::Server(server) => server,
    };
    let config = cli.opts.load()?;
    // Each command builds the settings of what it runs, once; the drop-ins first apply their
    // programs' variables as one more layer of the configuration.
    let (settings, divvy_redis) = match &command {
        ServerCommand::Run | ServerCommand::Quickstart => {
            (Settings::new(config, env, Serve::all())?, None)
        }
        ServerCommand::Divvy { rules } => {
            let d = quotagate::divvy::dropin::configure(config, rules, env)?;
            (
                Settings::new(d.config, env, Serve::divvy(d.admin))?,
                d.redis,
            )
        }
        ServerCommand::Ratelimit => {
            let (config, admin) = quotagate::rls::dropin::configure(config, env)?;
            (Settings::new(config, env, Serve::ratelimit(admin))?, None)
        }
        ServerCommand::ExampleUpstream | ServerCommand::CatalogServer => {
            (Settings::new(config, env, Serve::nothing())?, None)
        }
    };
    telemetry::init(&settings.log);
    let token = shutdown::on_signal();
    let opts = &cli.opts;
    match command {
        ServerCommand::Run => commands::gateway(&settings, false, token).await,
        ServerCommand::Quickstart => commands::gateway(&settings, true, token).await,
        ServerCommand::ExampleUpstream => {
            commands::example_upstream(opts.listen.as_deref(), token).await
        }
        ServerCommand::CatalogServer => {
            commands::catalog_server(
                &settings,
                opts.catalog.as_deref(),
                opts.listen.as_deref(),
                token,
            )
            .await
        }
        ServerCommand::Divvy { .. } => commands::divvy(&settings, divvy_redis, token).await,
        ServerCommand::Ratelimit => commands::ratelimit(&settings, token).await,
    }?;
    Ok(ExitCode::SUCCESS)
}

/// A key secret file named on the command line (`flag`), read.
fn key_secrets(
    flag: &str,
    file: Option<&std::path::Path>,
) -> Result<Option<std::sync::Arc<quotagate::catalog::KeySecrets>>, StartError> {
    let Some(file) = file else { return Ok(None) };
    let secrets = quotagate::catalog::read_key_secrets(file)
        .map_err(|e| quotagate::config::ConfigError::option(flag, e))?;
    Ok(Some(secrets))
}

/// `opts`: the shared flags; `key-digest --catalog IN` reads IN from them.
async fn run_tool(tool: ToolCommand, opts: &ConfigArgs) -> Result<ExitCode, StartError> {
    Ok(match tool {
        ToolCommand::Validate {
            strict,
            max_bytes,
            key_secret_file,
            files,
        } => {
            let secrets = key_secrets("--key-secret-file", key_secret_file.as_deref())?;
            exit(commands::validate(&files, strict, max_bytes, secrets))
        }
        ToolCommand::KeyDigest {
            secret_file,
            max_bytes,
        } => {
            let secrets = key_secrets("--secret-file", secret_file.as_deref())?;
            exit(match &opts.catalog {
                Some(catalog) => commands::key_digest_catalog(
                    std::path::Path::new(catalog),
                    secrets.as_deref(),
                    max_bytes,
                ),
                None => commands::key_digest_lines(
                    secrets.as_deref(),
                    std::io::stdin().lock(),
                    std::io::stdout().lock(),
                    std::io::stderr().lock(),
                )
                .unwrap_or(false),
            })
        }
        ToolCommand::Health { url } => exit(commands::health(&url).await),
        ToolCommand::DivvyLoad {
            addr,
            connections,
            depth,
            seconds,
            deny_percent,
        } => {
            commands::divvy_load(LoadOptions {
                addr,
                connections,
                depth,
                duration: std::time::Duration::from_secs(seconds),
                deny_percent: deny_percent.min(100),
            })
            .await?;
            ExitCode::SUCCESS
        }
    })
}

fn main() -> ExitCode {
    quotagate::alloc::configure();
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
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
