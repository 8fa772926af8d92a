//! config: every option as written (the schema), its default, and the small parsers the typed
//! settings use.
//!
//! Sources, later ones winning: built-in defaults, a TOML file (`--config`), `QUOTAGATE_<SECTION>_<KEY>`
//! environment variables (e.g. `QUOTAGATE_UPSTREAM_URL`), and command-line flags (`--set
//! section.key=value`, plus a few named shortcuts); see [`Config::load`]. Every option is listed with its
//! default in `docs/configuration.md`; the file is parsed strictly, so a misspelt key is an error.
//!
//! These structs hold text as written. Each module turns its section into its own typed settings
//! (`TryFrom`), checking the values there, and [`crate::app::settings::Settings`] does that once for
//! the whole application.

pub mod files;
mod load;
mod redact;

pub use load::{ENV_PREFIX, MAX_CONFIG_BYTES};

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use quotagate_engine::path::EscapedSlashes;
use quotagate_store::{FailurePolicy, TimeSource};
/// A configuration problem, said in one line that names the option at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    option: Option<String>,
    reason: String,
}

impl ConfigError {
    /// `option` (`store.timeout_ms`, an environment variable, `--set name`) is wrong: `reason`.
    pub fn option(option: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            option: Some(option.into()),
            reason: reason.into(),
        }
    }

    /// A problem with the configuration as a whole (a file that cannot be read, a missing part).
    pub fn general(reason: impl Into<String>) -> ConfigError {
        ConfigError {
            option: None,
            reason: reason.into(),
        }
    }

    /// The option at fault, when one is.
    pub fn option_name(&self) -> Option<&str> {
        self.option.as_deref()
    }

    /// What is wrong, without the option's name.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.option {
            Some(o) => write!(f, "{o}: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub catalog: CatalogConfig,
    pub limits: LimitsConfig,
    pub store: StoreConfig,
    pub divvy: DivvyConfig,
    pub rls: RlsConfig,
    pub admin: AdminConfig,
    pub log: LogConfig,
    pub telemetry: TelemetryConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Serve `/metrics`, `/healthz` and `/readyz`. Default: `true`.
    pub enabled: bool,
    /// Address of the admin listener. Default: `127.0.0.1:8081` (loopback only).
    pub listen: String,
    /// Needed to reset counters (`POST /limits/reset`) through a listener that is not on loopback.
    /// Default: none (resets only on loopback).
    pub secret: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            enabled: true,
            listen: "127.0.0.1:8081".into(),
            secret: String::new(),
        }
    }
}

/// How a rule's unit is counted (`rls.window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowKind {
    /// A sliding window of the unit's length. Default.
    #[default]
    Sliding,
    /// envoyproxy/ratelimit's window: from a multiple of the unit's length (Unix time) to the next.
    Fixed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RlsConfig {
    /// envoyproxy/ratelimit rule files: one YAML file, or a directory of them (`*.yaml`,
    /// `*.yml`), watched for changes; the Envoy rate-limit service runs when one is set. Default:
    /// none.
    pub config: String,
    /// Address of the gRPC port (`ShouldRateLimit` and `grpc.health.v1.Health`). Default:
    /// `127.0.0.1:8082`.
    pub listen: String,
    /// Domain whose descriptors with `api_key`, `method` and `path` entries are decided by the
    /// gateway's catalog, on the gateway's counters. Default: `quotagate`.
    pub catalog_domain: String,
    /// Send the RateLimit header fields in `response_headers_to_add`. Default: `false`.
    pub response_headers: bool,
    /// Answer OK overall even when a descriptor is over its limit (statuses still say so, and
    /// hits are counted as usual), as envoyproxy/ratelimit's `SHADOW_MODE`. Default: `false`.
    pub shadow_mode: bool,
    /// `sliding`: a rule's unit is a sliding window of that length; `fixed`: a window aligned to
    /// the clock, as envoyproxy/ratelimit counts (the catalog domain stays sliding). Default:
    /// `sliding`.
    pub window: WindowKind,
    /// A request with a descriptor over its limit is not counted in its other descriptors (their
    /// hits are given back), as envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
    /// Sliding windows only. Default: `false`.
    pub stop_counting_when_over_limit: bool,
    /// A domain's descriptors may be spread over several rule files, read as one tree (a
    /// descriptor defined twice is still refused), as envoyproxy/ratelimit's
    /// `MERGE_DOMAIN_CONFIG`. Default: `false` (a domain defined in two files is refused).
    pub merge_domains: bool,
    /// Answers carry `dynamic_metadata` for Envoy's next filters: the request's domain and
    /// descriptors, and the `metadata` of the rules of the descriptors not over their limit, as
    /// envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA`. Default: `false`.
    pub response_dynamic_metadata: bool,
    /// PEM certificate chain(s) of the gRPC port, comma-separated; with them it speaks TLS only
    /// (HTTP/2 by ALPN). Default: empty (cleartext).
    pub tls_cert_file: String,
    /// PEM private key(s), one per certificate file, in the same order. Default: empty.
    pub tls_key_file: String,
    /// PEM CA certificate(s): require client certificates signed by them (mTLS). Default: empty.
    pub tls_client_ca_file: String,
    /// A DNS name or IP address that client certificates must be valid for (their
    /// subjectAltName), besides being signed by `tls_client_ca_file`. Default: empty (any).
    pub tls_client_san: String,
}

impl Default for RlsConfig {
    fn default() -> Self {
        RlsConfig {
            config: String::new(),
            listen: "127.0.0.1:8082".into(),
            catalog_domain: "quotagate".into(),
            response_headers: false,
            shadow_mode: false,
            window: Default::default(),
            stop_counting_when_over_limit: false,
            merge_domains: false,
            response_dynamic_metadata: false,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_client_ca_file: String::new(),
            tls_client_san: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DivvyConfig {
    /// Divvy rule file (`.ini` or `.json`); the Divvy port runs when one is set. Default: none.
    pub rules: String,
    /// Address of the Divvy port. Default: `127.0.0.1:8321`.
    pub listen: String,
    /// Longest request line. Default: 1048576 bytes (1 MiB).
    pub max_line_bytes: usize,
    /// Open connections at most. Default: 10000.
    pub max_connections: usize,
    /// Requests per connection waiting for their reply, at most. Default: 1024.
    pub max_in_flight: usize,
}

impl Default for DivvyConfig {
    fn default() -> Self {
        DivvyConfig {
            rules: String::new(),
            listen: "127.0.0.1:8321".into(),
            max_line_bytes: 1024 * 1024,
            max_connections: 10_000,
            max_in_flight: 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the proxy listener. Default: `127.0.0.1:8080`.
    pub listen: String,
    /// On SIGTERM/SIGINT, how long in-flight requests may take to finish. Default: 10000 ms.
    pub drain_timeout_ms: u64,
    /// Time a new connection has to send its first request's headers (with TLS: its first byte,
    /// then the handshake), and an HTTP/1 request's headers from their first byte. Default: 10000 ms.
    pub header_read_timeout_ms: u64,
    /// A client connection with no request in flight that sends nothing for this long is closed.
    /// Default: 75000 ms.
    pub keep_alive_timeout_ms: u64,
    /// Largest request header section. Default: 65536 bytes (at least 8192).
    pub max_header_bytes: usize,
    /// Header lines a request may have; more get 431. Default: 100 (from 1 to 10000).
    pub max_headers: usize,
    /// Largest request body; larger ones get 413. Default: 10485760 bytes (10 MiB).
    pub max_body_bytes: u64,
    /// Open client connections at most; more wait in the accept queue. Default: 10000.
    pub max_connections: usize,
    /// Threads that serve proxy and Divvy connections, each with its own event loop, upstream pool
    /// and Redis connection. Default: 0, one per core.
    pub workers: usize,
    /// An upgraded connection (WebSocket) silent both ways for this long is closed. Default:
    /// 300000 ms.
    pub upgrade_idle_timeout_ms: u64,
    /// PEM certificate chain(s) of the listener, comma-separated; with them it speaks TLS only
    /// (HTTP/1.1 and HTTP/2 by ALPN). Default: empty (cleartext).
    pub tls_cert_file: String,
    /// PEM private key(s), one per certificate file, in the same order. Default: empty.
    pub tls_key_file: String,
    /// PEM CA certificate(s): require client certificates signed by them (mTLS). Default: empty.
    pub tls_client_ca_file: String,
    /// A DNS name or IP address that client certificates must be valid for (their
    /// subjectAltName), besides being signed by `tls_client_ca_file`. Default: empty (any).
    pub tls_client_san: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".into(),
            drain_timeout_ms: 10_000,
            header_read_timeout_ms: 10_000,
            keep_alive_timeout_ms: 75_000,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            max_body_bytes: 10 * 1024 * 1024,
            max_connections: 10_000,
            workers: 0,
            upgrade_idle_timeout_ms: 300_000,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_client_ca_file: String::new(),
            tls_client_san: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Base URL(s) of the upstream API (`http[s]://host:port[/base/path]`), comma-separated for
    /// several targets (same base path). Default: `http://127.0.0.1:9000`.
    pub url: String,
    /// How requests are spread over several targets. Default: `least_requests`.
    pub balance: Balance,
    /// Consecutive connect failures or timeouts that take a target out. Default: 3 (0: never).
    pub eject_after: u32,
    /// How long a target is out, doubling while it keeps failing (at most 5 minutes).
    /// Default: 10000 ms.
    pub eject_ms: u64,
    /// Path asked with GET on every target for active health checks. Default: empty (off).
    pub health_path: String,
    /// Time between active health checks. Default: 2000 ms.
    pub health_interval_ms: u64,
    /// A request whose connection failed before any byte was sent is tried again on another
    /// target, this many times. Default: 1.
    pub retries: u32,
    /// HTTP version towards the upstream. Default: `auto`.
    pub protocol: UpstreamProtocol,
    /// PEM CA certificate(s) that `https://` targets are verified against. Default: empty (the
    /// system's roots).
    pub tls_ca_file: String,
    /// PEM client certificate chain, for upstreams that require one. Default: empty.
    pub tls_cert_file: String,
    /// PEM key of `tls_cert_file`. Default: empty.
    pub tls_key_file: String,
    /// Name verified in the targets' certificates and sent as SNI. Default: empty (each URL's host).
    pub tls_server_name: String,
    /// Accept any upstream certificate (tests only; warns at start-up). Default: false.
    pub tls_insecure_skip_verify: bool,
    /// Connecting to the upstream; then 502. Default: 2000 ms.
    pub connect_timeout_ms: u64,
    /// Waiting for the upstream's response headers; then 504. Default: 30000 ms.
    pub response_timeout_ms: u64,
    /// Idle upstream connections are closed after this. Default: 30000 ms.
    pub pool_idle_timeout_ms: u64,
    /// Idle upstream connections kept open. Default: 256.
    pub pool_max_idle: usize,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            url: "http://127.0.0.1:9000".into(),
            balance: Balance::default(),
            eject_after: 3,
            eject_ms: 10_000,
            health_path: String::new(),
            health_interval_ms: 2_000,
            retries: 1,
            protocol: UpstreamProtocol::default(),
            tls_ca_file: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_server_name: String::new(),
            tls_insecure_skip_verify: false,
            connect_timeout_ms: 2_000,
            response_timeout_ms: 30_000,
            pool_idle_timeout_ms: 30_000,
            pool_max_idle: 256,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CatalogConfig {
    /// Catalog file loaded at start-up (DynLimits JSON), used until the catalog server answers.
    /// Default: none.
    pub file: String,
    /// Base URL of the catalog server to poll. Default: none (no polling).
    pub server_url: String,
    /// Header carrying `server_secret` to the catalog server. Default: `X-Api-Key` (DynLimits).
    pub server_auth_header: String,
    /// Secret sent to (and, for `quotagate catalog-server`, required by) the catalog server.
    /// Default: none.
    pub server_secret: String,
    /// Time between polls. Default: 10000 ms (DynLimits).
    pub poll_interval_ms: u64,
    /// Each wait varies by up to this share of the interval, so instances do not poll in step.
    /// Default: 10 (%), at most 50.
    pub poll_jitter_percent: u64,
    /// Connecting to the catalog server. Default: 2000 ms.
    pub connect_timeout_ms: u64,
    /// One request to the catalog server, body included. Default: 10000 ms.
    pub request_timeout_ms: u64,
    /// Longest wait between polls while the server fails (the interval doubles per failure).
    /// Default: 60000 ms.
    pub backoff_max_ms: u64,
    /// Request header that forces a catalog fetch when it carries `refresh_secret`.
    /// Default: `X-Quotagate-Refresh`.
    pub refresh_header: String,
    /// Secret of the refresh header. Default: none, which turns the feature off.
    pub refresh_secret: String,
    /// Forced fetches start at least this long after the previous fetch. Default: 1000 ms.
    pub refresh_min_interval_ms: u64,
    /// How long a request with a valid refresh header waits for the fetch. Default: 2000 ms.
    pub refresh_wait_ms: u64,
    /// Redis channel on which instances announce new catalog versions (with `store.kind = "redis"`).
    /// Default: `quotagate:catalog`.
    pub announce_channel: String,
    /// Largest catalog accepted from a file or a catalog server, and served by `quotagate
    /// catalog-server`, in bytes. Default: 67108864 (64 MiB).
    pub max_bytes: u64,
    /// File of the secret `hmac-sha256` key digests are made with (a second line: the previous
    /// secret, while keys are rotated), read at start. Default: none (such digests refused).
    pub key_secret_file: String,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        CatalogConfig {
            file: String::new(),
            server_url: String::new(),
            server_auth_header: "X-Api-Key".into(),
            server_secret: String::new(),
            poll_interval_ms: 10_000,
            poll_jitter_percent: 10,
            connect_timeout_ms: 2_000,
            request_timeout_ms: 10_000,
            backoff_max_ms: 60_000,
            refresh_header: "X-Quotagate-Refresh".into(),
            refresh_secret: String::new(),
            refresh_min_interval_ms: 1_000,
            refresh_wait_ms: 2_000,
            announce_channel: "quotagate:catalog".into(),
            max_bytes: quotagate_engine::catalog::MAX_CATALOG_BYTES,
            key_secret_file: String::new(),
        }
    }
}

/// What to do with a request the catalog does not cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Uncovered {
    /// Answer with an error (404 for unknown endpoints, 403 for keys without a limit).
    Reject,
    /// Forward it without limiting or counting.
    Forward,
}

/// Which rate-limit header fields to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeaderSet {
    /// `RateLimit-Policy`/`RateLimit` and `RateLimit-Limit`/`-Remaining`/`-Reset`.
    Both,
    /// The current IETF draft fields only: `RateLimit-Policy` and `RateLimit`.
    Ietf,
    /// The DynLimits-compatible `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` only.
    Legacy,
    /// None (`Retry-After` is still sent on 429).
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// `false` turns quotagate into a plain proxy: no key, route or limit checks. Default: `true`.
    pub enabled: bool,
    /// Header carrying the API key. Default: `X-Api-Key`.
    pub api_key_header: String,
    /// Where the API key is found: comma-separated sources tried in order, the first present
    /// deciding (`header:NAME`, `bearer`, `query:NAME`, `jwt:CLAIM`). Default: empty, `header:`
    /// `api_key_header`.
    pub api_key_from: String,
    /// Requests to endpoints not in the catalog: `reject` (404) or `forward` unlimited. Default: `reject`.
    pub unknown_endpoint: Uncovered,
    /// Keys with no limit for the endpoint, unknown keys included: `reject` (403) or `forward`
    /// unlimited. Default: `reject`.
    pub no_limit: Uncovered,
    /// Rate-limit header fields sent: `both`, `ietf`, `legacy` or `none`. Default: `both`.
    pub headers: HeaderSet,
    /// `%2F`, `%5C` and `\` in paths: `reject` (400) or `keep` as data. Default: `reject`.
    pub escaped_slashes: EscapedSlashes,
    /// Every limit of the catalog is a shadow limit: counted, reported, never refusing (a dry run).
    /// Default: `false`.
    pub shadow: bool,
    /// A request header whose whole number (1 to 1,000,000) replaces the endpoint's cost. Only for
    /// trusted callers: a client that can send it chooses its own cost. Default: empty (off).
    pub cost_header: String,
    /// Requests without an API key: `reject` (401) or `by_address` (the catalog's `anonymous`
    /// limits, per client address). Default: `reject`.
    pub anonymous: Anonymous,
    /// Peers whose `X-Forwarded-For` is believed, as comma-separated CIDRs
    /// (`10.0.0.0/8,127.0.0.1/32`). Default: empty (the peer is the client).
    pub trusted_proxies: String,
    /// IPv6 clients are counted per network of this prefix length. Default: 64.
    pub ipv6_prefix: u8,
    /// Bytes of a response body read for its `cost_from` report at most: a JSON body kept until
    /// it ends, an event stream's current event. Default: 1 MiB.
    pub cost_body_max_bytes: u64,
    /// Requests waiting for room (`wait_ms`) at once on this instance at most; more are refused
    /// at once. Default: 1000.
    pub wait_queue_max: u64,
    /// The `jwt:` source's key set, fetched over HTTP(S) (RS256, ES256, EdDSA keys). Default:
    /// empty.
    pub jwt_jwks_url: String,
    /// The `jwt:` source's key set, from a file read at start. Default: empty.
    pub jwt_jwks_file: String,
    /// How long a fetched key set is kept when its answer has no `Cache-Control: max-age`, in
    /// milliseconds (10 s at least). Default: 300000.
    pub jwt_jwks_refresh_ms: u64,
    /// A file holding an HS256 secret (32 bytes at least, a trailing newline dropped) for the
    /// `jwt:` source. Default: empty.
    pub jwt_secret_file: String,
    /// How long after its `exp` (and before its `nbf`) a token is still taken, in milliseconds
    /// (whole seconds count). Default: 30000.
    pub jwt_leeway_ms: u64,
    /// The `iss` a token must carry. Default: empty (any).
    pub jwt_issuer: String,
    /// An `aud` a token must carry. Default: empty (any).
    pub jwt_audience: String,
    /// Verified tokens remembered at most (0: none; each up to 4 KiB). Default: 10000.
    pub jwt_memo_max: u64,
}

/// How requests are spread over several upstream targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Each target in turn.
    RoundRobin,
    /// The less busy of two targets picked at random (in-flight requests).
    #[default]
    LeastRequests,
}

/// The HTTP version spoken to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    /// ALPN over TLS; HTTP/1.1 in cleartext, but gRPC over cleartext HTTP/2 (prior knowledge).
    #[default]
    Auto,
    Http1,
    H2,
}

/// What requests without an API key get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Anonymous {
    /// 401.
    #[default]
    Reject,
    /// The catalog's anonymous limits, per client address.
    ByAddress,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            enabled: true,
            api_key_header: "X-Api-Key".into(),
            api_key_from: String::new(),
            unknown_endpoint: Uncovered::Reject,
            no_limit: Uncovered::Reject,
            headers: HeaderSet::Both,
            escaped_slashes: EscapedSlashes::Reject,
            shadow: false,
            cost_header: String::new(),
            anonymous: Anonymous::Reject,
            trusted_proxies: String::new(),
            ipv6_prefix: 64,
            cost_body_max_bytes: 1024 * 1024,
            wait_queue_max: 1000,
            jwt_jwks_url: String::new(),
            jwt_jwks_file: String::new(),
            jwt_jwks_refresh_ms: 300_000,
            jwt_secret_file: String::new(),
            jwt_leeway_ms: 30_000,
            jwt_issuer: String::new(),
            jwt_audience: String::new(),
            jwt_memo_max: 10_000,
        }
    }
}

/// Where counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Memory,
    Redis,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `memory` (embedded, one instance) or `redis` (shared). Default: `memory`.
    pub kind: StoreKind,
    /// Redis URL, `redis://[user:password@]host:port/db`, `rediss://...` (TLS) or
    /// `redis+unix:///path`; in cluster and sentinel mode a comma-separated list (seed nodes,
    /// sentinels). Default: `redis://127.0.0.1:6379`.
    pub redis_url: String,
    /// `single`, `cluster` (Redis Cluster) or `sentinel`. Default: `single`.
    pub redis_mode: quotagate_store::RedisMode,
    /// The master's name in sentinel mode. Default: empty.
    pub sentinel_master: String,
    /// A file holding the Redis password (replaces the URL's; kept out of configs and process
    /// lists). Default: empty (none).
    pub redis_password_file: String,
    /// PEM file of the CA that signed the Redis servers' certificates (`rediss://`). Default:
    /// empty (the system's roots).
    pub tls_ca_file: String,
    /// PEM client certificate for TLS client authentication. Default: empty.
    pub tls_cert_file: String,
    /// PEM key of `tls_cert_file`. Default: empty.
    pub tls_key_file: String,
    /// Turns off the check of the servers' certificates (logged at start-up). Default: `false`.
    pub tls_insecure_skip_verify: bool,
    /// Bound on every Redis call, connecting included. Default: 250 ms.
    pub timeout_ms: u64,
    /// When Redis fails: `local` (limits enforced per instance in memory), `open` (unlimited) or
    /// `closed` (503). Default: `local`.
    pub failure_policy: FailurePolicy,
    /// How often a failed Redis is pinged to detect recovery. Default: 1000 ms.
    pub probe_interval_ms: u64,
    /// Hot-path Redis connections at most (one per proxy worker below that). Default: 16.
    pub pool_size: usize,
    /// Prefix of every Redis key. Default: `quotagate`.
    pub key_prefix: String,
    /// Whose clock places requests in seconds: `redis` (one clock for all instances) or `local`.
    /// Default: `redis`.
    pub time_source: TimeSource,
    /// `auto`: a busy counter takes a lease of units from Redis and decides in memory until its
    /// bucket ends, never admitting more than the limit ([stores](docs/stores.md)); `off`: one
    /// Redis call per decision. Default: `auto`.
    pub lease: quotagate_store::LeaseMode,
    /// Units one lease holds at most. Default: 1000.
    pub lease_max_units: u64,
    /// How long a concurrency limit's slot on Redis outlives the last renewal by the instance
    /// holding it (renewed every third of it while the instance lives): the slots of an instance
    /// that died are freed within this time. At least 1000 and 4 x `timeout_ms`. Default: 10000 ms.
    pub concurrency_hold_ms: u64,
    /// A directory where the embedded store (`kind = "memory"`) keeps its counters, so that a
    /// restart resumes them and a crash never admits over a limit (docs/stores.md); created
    /// when missing, one instance at a time. Default: empty (counters in memory only).
    pub path: String,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Memory,
            redis_url: "redis://127.0.0.1:6379".into(),
            redis_mode: quotagate_store::RedisMode::Single,
            sentinel_master: String::new(),
            redis_password_file: String::new(),
            tls_ca_file: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_insecure_skip_verify: false,
            timeout_ms: 250,
            failure_policy: FailurePolicy::Local,
            probe_interval_ms: 1_000,
            pool_size: 16,
            key_prefix: quotagate_store::keys::DEFAULT_PREFIX.into(),
            time_source: TimeSource::Redis,
            lease: quotagate_store::LeaseMode::Auto,
            lease_max_units: 1000,
            concurrency_hold_ms: 10_000,
            path: String::new(),
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`. Default: `text`.
    pub format: LogFormat,
    /// Level filter in `RUST_LOG` syntax; `RUST_LOG` itself wins when set. Default: `info`.
    pub level: String,
    /// One line per request (target `quotagate::access`). Default: `false`.
    pub access: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".into(),
            access: false,
        }
    }
}

/// `[telemetry]`: OpenTelemetry traces (see `crate::observe::otel`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP collector's base URL; spans go to `{base}/v1/traces`. Default: empty (off).
    pub otlp_endpoint: String,
    /// Share of requests without a sampled `traceparent` that are traced, 0 to 1 (a sampled
    /// incoming `traceparent` is always traced). Default: 0.01.
    pub sample_ratio: f64,
    /// `service.name` of the spans. Default: `quotagate`.
    pub service_name: String,
    /// Spans waiting for export at most; more are dropped and counted. Default: 2048.
    pub queue_max: usize,
    /// Exports start at most this often, unless a full batch waits. Default: 5000 ms (as
    /// `OTEL_BSP_SCHEDULE_DELAY`).
    pub export_interval_ms: u64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: String::new(),
            sample_ratio: 0.01,
            service_name: "quotagate".into(),
            queue_max: 2048,
            export_interval_ms: 5000,
        }
    }
}

/// A duration from an option's milliseconds, which must be above 0.
pub(crate) fn positive_ms(name: &str, v: u64) -> Result<Duration, ConfigError> {
    if v == 0 {
        return Err(ConfigError::option(name, "must be above 0"));
    }
    Ok(Duration::from_millis(v))
}

/// `catalog.max_bytes`, checked.
pub(crate) fn max_bytes(v: u64) -> Result<u64, ConfigError> {
    match v {
        0 => Err(ConfigError::option("catalog.max_bytes", "must be above 0")),
        v => Ok(v),
    }
}

/// A socket address option (`127.0.0.1:8080`).
pub(crate) fn address(name: &str, raw: &str, example: &str) -> Result<SocketAddr, ConfigError> {
    raw.parse()
        .map_err(|_| ConfigError::option(name, format!("{raw:?} is not an address like {example}")))
}

/// A header name option.
pub(crate) fn header_name(name: &str, raw: &str) -> Result<http::HeaderName, ConfigError> {
    http::HeaderName::from_bytes(raw.as_bytes())
        .map_err(|_| ConfigError::option(name, format!("{raw:?} is not a header name")))
}
