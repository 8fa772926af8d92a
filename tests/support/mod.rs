//! Test harness shared by the integration tests: a private redis-server per test, and polling with a
//! deadline instead of sleeping and hoping.
#![allow(dead_code)]

mod topology;
#[allow(unused_imports)]
pub use topology::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Stops this test binary when `program` (a name on the `PATH`, or a path) is missing: the lines
/// of `scripts/test-deps.sh --check` (one per missing program, and where it comes from), then
/// exit status 1, not a panic trace in every test that needed it.
pub fn need(program: &str) {
    let found = if program.contains('/') {
        Path::new(program).is_file()
    } else {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
    };
    if !found {
        missing(program);
    }
}

/// [`need`] for Python 3 and the modules of tests/peers.py.
pub fn need_python() {
    need("python3");
    let ok = Command::new("python3")
        .args(["-c", "import grpc, websockets, cryptography"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        missing("Python's grpcio, websockets or cryptography");
    }
}

/// Says what is missing (all of it, by `scripts/test-deps.sh --check`) once, and exits.
pub fn missing(what: &str) -> ! {
    static SAYING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = SAYING.lock();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/test-deps.sh");
    let listed = Command::new("bash")
        .args([script, "--check"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let said = match listed.trim().is_empty() {
        true => format!("missing: {what}\n"),
        false => listed,
    };
    // Written to the descriptor, not with `eprint!`: the test harness keeps what those print,
    // and an exit loses it.
    use std::io::Write;
    let _ = std::io::stderr().write_all(said.as_bytes());
    std::process::exit(1);
}

/// A redis-server of this test's own, listening only on a unix socket in a temporary directory
/// (`--port 0`: no TCP port that other tests could disturb). Killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut server = RedisServer { child: None, dir };
        server.spawn();
        server
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// A TCP proxy to this server that holds every chunk, each way, for a delay that can change while
    /// it runs (added network latency). Stops with the returned token.
    pub async fn delayed(
        &self,
        delay: Arc<std::sync::atomic::AtomicU64>,
    ) -> (String, CancellationToken) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (socket, stop) = (self.socket(), CancellationToken::new());
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    c = listener.accept() => match c { Ok((c, _)) => c, Err(_) => return },
                    () = stopped.cancelled() => return,
                };
                let Ok(server) = tokio::net::UnixStream::connect(&socket).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(relay(cr, sw, delay.clone(), stopped.clone()));
                tokio::spawn(relay(sr, cw, delay.clone(), stopped.clone()));
            }
        });
        (format!("redis://{addr}"), stop)
    }

    /// `redis+unix://` URL of the server.
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }

    fn spawn(&mut self) {
        let _ = std::fs::remove_file(self.socket());
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--save",
                "",
                "--appendonly",
                "no",
                "--unixsocketperm",
                "700",
            ])
            .arg("--unixsocket")
            .arg(self.socket())
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|_| missing("redis-server"));
        self.child = Some(child);
        let sock = self.socket();
        wait_until(Duration::from_secs(10), || {
            redis_cli(&sock, &["PING"]).as_deref() == Some("PONG")
        });
    }

    /// Runs one command through redis-cli and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(&self.socket(), args).unwrap_or_default()
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill {sig} {pid}");
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the server: connections are refused until [`restart`](Self::restart).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a fresh, empty server on the same socket.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

/// Copies `from` to `to`, holding each chunk for the current delay (ms).
async fn relay(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    delay: Arc<std::sync::atomic::AtomicU64>,
    stop: CancellationToken,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
            () = stop.cancelled() => return,
        };
        let ms = delay.load(std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
        }
        self.kill();
    }
}

fn redis_cli(sock: &Path, args: &[&str]) -> Option<String> {
    run_cli(Command::new("redis-cli").arg("-s").arg(sock).args(args))
}

/// Runs a redis-cli `command`: its trimmed output if it succeeded.
fn run_cli(command: &mut Command) -> Option<String> {
    let out = command.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Why `config` cannot start: the error its settings stop at, as printed.
pub fn refused(config: quotagate::config::Config) -> String {
    quotagate::app::settings::Settings::new(
        config,
        |_| None,
        quotagate::app::settings::Serve::all(),
    )
    .unwrap_err()
    .to_string()
}

/// Polls `cond` until it holds; panics after `limit`.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "condition not met within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A port nothing listens on now (bound, then released: for a child process to bind), and never
/// handed out before in this test process: released, a port may come back from the next bind, so
/// `(free_port(), free_port())` could name one port twice.
pub fn free_port() -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if first_time(port) {
            return port;
        }
    }
}

/// `port` was not handed out before in this process (and is now).
pub fn first_time(port: u16) -> bool {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    if given.contains(&port) {
        return false;
    }
    given.push(port);
    true
}

/// Async twin of [`wait_until`].
pub async fn eventually<F, Fut>(limit: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < limit,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---- HTTP: a recording upstream, a gateway on port 0, and clients ----

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use quotagate::app::App;
use quotagate::app::settings::Settings;
use quotagate::catalog::Snapshot;
use quotagate::config::Config;
use quotagate::gateway::Gateway;
use quotagate::server::RequestBody;
use quotagate_engine::clock::FakeClock;
use tokio_util::sync::CancellationToken;

/// What the upstream received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path_and_query: String,
    pub version: http::Version,
    pub headers: HeaderMap,
    pub body_len: usize,
    /// When its head arrived.
    pub at: std::time::SystemTime,
}

type UpBody = http_body_util::Either<Full<Bytes>, Chunks>;

/// A real HTTP upstream on port 0 that records every request. Paths with special behaviour:
/// `/slow/..` answers after 2 s, `/hold/<ms>` after ms milliseconds; `/redirect` answers 302;
/// `/hop[?status=N]` answers (200 or N) with hop-by-hop, rate-limit and `Retry-After`
/// fields and fields of its own (a `Date`, two `Set-Cookie`s); `/big/<n>` streams n bytes; `/tokens/{header,json,sse}/<n>`
/// report a cost of n in a header, a JSON body (about 1 kB) or at the end of an event stream,
/// `/tokens/cut/<n>` breaks its event stream before the report, `/tokens/slow/<n>` pauses 300 ms
/// before it, `/tokens/none` reports nothing.
/// Everything else: 200 `ok`.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Connections open to it now.
    pub open: prometheus_client::metrics::gauge::Gauge,
    token: CancellationToken,
}

impl Upstream {
    pub async fn start() -> Upstream {
        Upstream::start_with(Default::default()).await
    }

    /// An upstream with these connection settings (`keep_alive_timeout` closes idle keep-alive
    /// connections).
    pub async fn start_with(settings: quotagate::server::HttpSettings) -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Upstream::serve(listener, settings, None).await
    }

    /// An upstream on `listener` (a port of a stopped one: a restart), over TLS with `tls`
    /// (HTTP/1.1 and HTTP/2 by ALPN).
    pub async fn serve(
        listener: tokio::net::TcpListener,
        settings: quotagate::server::HttpSettings,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Upstream {
        let open = prometheus_client::metrics::gauge::Gauge::default();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let token = CancellationToken::new();
        let log = seen.clone();
        let handler = move |_peer: SocketAddr, req: Request<RequestBody>| {
            let log = log.clone();
            async move { upstream_answer(log, req).await }
        };
        tokio::spawn(quotagate::server::serve(
            listener,
            settings,
            quotagate::server::Executor {
                open_connections: Some(open.clone()),
                tls,
                ..Default::default()
            },
            handler,
            token.clone().cancelled_owned(),
        ));
        Upstream {
            addr,
            seen,
            open,
            token,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn last(&self) -> Seen {
        self.requests()
            .pop()
            .expect("the upstream received a request")
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

async fn upstream_answer(
    log: Arc<Mutex<Vec<Seen>>>,
    req: Request<RequestBody>,
) -> Response<UpBody> {
    let at = std::time::SystemTime::now();
    let (parts, body) = req.into_parts();
    let body_len = body
        .collect()
        .await
        .map(|b| b.to_bytes().len())
        .unwrap_or(0);
    let path = parts.uri.path().to_owned();
    log.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        version: parts.version,
        headers: parts.headers.clone(),
        body_len,
        at,
    });
    let full = |status: u16, body: &str| {
        let mut r = Response::new(http_body_util::Either::Left(Full::new(Bytes::from(
            body.to_owned(),
        ))));
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        r
    };
    if let Some(ms) = path.strip_prefix("/hold/") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
        return full(200, "held");
    }
    if path.starts_with("/slow/") {
        tokio::time::sleep(Duration::from_secs(2)).await;
        return full(200, "slow");
    }
    if path == "/redirect" {
        let mut r = full(302, "");
        r.headers_mut()
            .insert("location", "/elsewhere".parse().unwrap());
        return r;
    }
    if path == "/hop" {
        // `?status=N` answers N.
        let status = parts.uri.query().and_then(|q| q.strip_prefix("status="));
        let mut r = full(status.map_or(200, |s| s.parse().unwrap()), "hop");
        for (k, v) in [
            ("connection", "x-up-secret"),
            ("x-up-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("ratelimit-limit", "999"),
            ("ratelimit", "\"up\";r=1"),
            ("retry-after", "5"),
            ("x-kept", "yes"),
            ("date", "Sat, 01 Jan 2000 00:00:00 GMT"),
        ] {
            r.headers_mut().insert(k, v.parse().unwrap());
        }
        for v in ["a=1", "b=2"] {
            r.headers_mut().append("set-cookie", v.parse().unwrap());
        }
        return r;
    }
    if let Some(n) = path.strip_prefix("/big/") {
        let n: usize = n.parse().unwrap();
        return Response::new(http_body_util::Either::Right(Chunks {
            left: n,
            ..Chunks::default()
        }));
    }
    if let Some(rest) = path.strip_prefix("/tokens/") {
        return tokens(rest);
    }
    full(200, "ok")
}

/// A response reporting what it cost (`/tokens/...`).
fn tokens(rest: &str) -> Response<UpBody> {
    let (how, n) = rest.split_once('/').unwrap_or((rest, ""));
    let frames = |frames: Vec<String>, cut: bool| Chunks {
        frames: frames.into_iter().map(Bytes::from).collect(),
        cut,
        ..Chunks::default()
    };
    let slow = |frames: Vec<String>| Chunks {
        frames: frames.into_iter().map(Bytes::from).collect(),
        slow_before: 2,
        ..Chunks::default()
    };
    let events = |n: &str| {
        vec![
            "data: {\"choices\": [{\"delta\": \"Hel\"}]}\n\n".to_owned(),
            "data: {\"choices\": [{\"delta\": \"lo\"}]}\n\n".to_owned(),
            format!("data: {{\"usage\": {{\"total_tokens\": {n}}}}}\n\n"),
            "data: [DONE]\n\n".to_owned(),
        ]
    };
    let (kind, body) = match how {
        "json" => {
            let text = "x".repeat(900);
            let json =
                format!(r#"{{"id": "r1", "text": "{text}", "usage": {{"total_tokens": {n}}}}}"#);
            let (a, b) = json.split_at(500);
            (
                "application/json",
                frames(vec![a.to_owned(), b.to_owned()], false),
            )
        }
        "sse" => ("text/event-stream", frames(events(n), false)),
        "cut" => ("text/event-stream", frames(events(n)[..2].to_vec(), true)),
        "slow" => ("text/event-stream", slow(events(n))),
        "none" => (
            "application/json",
            frames(vec![r#"{"id": "r2"}"#.to_owned()], false),
        ),
        _ => ("text/plain", frames(vec!["ok".to_owned()], false)),
    };
    let mut r = Response::new(http_body_util::Either::Right(body));
    r.headers_mut()
        .insert("content-type", kind.parse().unwrap());
    if how == "header" {
        r.headers_mut().insert("x-usage-tokens", n.parse().unwrap());
    }
    r
}

/// A body sent in frames: `frames` first, then `left` bytes in 64 KiB frames (to check that
/// responses stream); with `cut`, an error in place of its end (a connection broken mid-body).
#[derive(Default)]
pub struct Chunks {
    frames: std::collections::VecDeque<Bytes>,
    left: usize,
    cut: bool,
    /// Before the cut: a pause, so that what was sent goes out first.
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// A pause of 300 ms when this many frames are left (0: none).
    slow_before: usize,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.slow_before > 0 && self.frames.len() == self.slow_before {
            let pause = self
                .pause
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(300))));
            std::task::ready!(pause.as_mut().poll(_cx));
            self.pause = None;
            self.slow_before = 0;
        }
        if let Some(f) = self.frames.pop_front() {
            return std::task::Poll::Ready(Some(Ok(Frame::data(f))));
        }
        if self.left == 0 && self.cut {
            let pause = self
                .pause
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(50))));
            std::task::ready!(pause.as_mut().poll(_cx));
            self.cut = false;
            return std::task::Poll::Ready(Some(Err(std::io::Error::other("cut short"))));
        }
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        let n = self.left.min(64 * 1024);
        self.left -= n;
        std::task::Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; n])))))
    }
}

/// A gateway on port 0 with a fake clock, stopped on drop.
pub struct TestGateway {
    pub addr: SocketAddr,
    /// The admin listener (`/metrics`, `/healthz`, `/readyz`).
    pub admin: SocketAddr,
    /// The Envoy rate-limit service's port, when `rls.config` is set.
    pub rls: Option<SocketAddr>,
    pub rls_service: Option<Arc<quotagate::rls::Rls>>,
    pub clock: FakeClock,
    pub gateway: Arc<Gateway>,
    pub token: CancellationToken,
    pub done: tokio::task::JoinHandle<bool>,
}

impl TestGateway {
    pub async fn start(config: Config, catalog_json: &str, clock: FakeClock) -> TestGateway {
        TestGateway::start_with(config, Some(catalog_json), clock).await
    }

    /// A gateway with a start-up catalog, or none (it then waits for its catalog server).
    pub async fn start_with(
        config: Config,
        catalog_json: Option<&str>,
        clock: FakeClock,
    ) -> TestGateway {
        // Read with the key secrets the configuration names, as the gateway reads its file.
        let secrets = quotagate::gateway::key_secrets(&config.catalog).unwrap();
        let catalog = catalog_json
            .map(|j| Snapshot::from_json_with("test catalog", j.as_bytes(), secrets).unwrap());
        let mut config = config;
        config.server.listen = "127.0.0.1:0".into();
        // Port 0; a test may ask for another interface (0.0.0.0:0: not loopback).
        if config.admin.listen == quotagate::config::Config::default().admin.listen {
            config.admin.listen = "127.0.0.1:0".into();
        }
        config.admin.enabled = true;
        config.rls.listen = "127.0.0.1:0".into();
        let settings =
            Settings::new(config, |_| None, quotagate::app::settings::Serve::all()).unwrap();
        let app = Arc::new(App::build(&settings, Arc::new(clock.clone()), catalog).unwrap());
        let listeners = app.bind().await.unwrap();
        let addr = listeners.gateway().unwrap();
        let admin = listeners.admin().unwrap();
        let rls = listeners.rls();
        let rls_service = app.rls.clone();
        let gateway = app.gateway.clone().unwrap();
        let token = CancellationToken::new();
        let stop = token.clone();
        let done = tokio::spawn(async move { app.run(listeners, stop).await });
        TestGateway {
            addr,
            admin,
            rls,
            rls_service,
            clock,
            gateway,
            token,
            done,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// A response, read whole.
#[derive(Debug)]
pub struct Got {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Got {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

type TestClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

pub fn http1_client() -> TestClient {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

pub fn http2_client() -> TestClient {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// Sends one request; `headers` are (name, value) pairs.
pub async fn send(
    client: &TestClient,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Got {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(body)).unwrap())
        .await
        .expect("request sent");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body read").to_bytes();
    Got {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    }
}

pub async fn get(url: &str, headers: &[(&str, &str)]) -> Got {
    send(&http1_client(), "GET", url, headers, Bytes::new()).await
}

// ---- catalog servers ----

/// The real catalog server (`quotagate catalog-server`) on port 0, serving a file in a temp dir.
pub struct CatalogFixture {
    pub server: Arc<quotagate::catalog::server::CatalogServer>,
    pub addr: SocketAddr,
    pub file: std::path::PathBuf,
    _dir: tempfile::TempDir,
    token: CancellationToken,
    edits: std::sync::atomic::AtomicU64,
}

pub const CATALOG_SECRET: &str = "catalog-secret";

impl CatalogFixture {
    pub async fn start(catalog_json: &str) -> CatalogFixture {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("catalog.json");
        std::fs::write(&file, catalog_json).unwrap();
        let server = Arc::new(quotagate::catalog::server::CatalogServer::new(
            file.clone(),
            http::HeaderName::from_static("x-api-key"),
            Some(CATALOG_SECRET.into()),
            Arc::new(quotagate_engine::clock::SystemClock::new()),
        ));
        server.reload();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let token = CancellationToken::new();
        let s = server.clone();
        tokio::spawn(quotagate::server::serve(
            listener,
            Default::default(),
            Default::default(),
            move |peer, req| s.clone().handle(peer, req),
            token.clone().cancelled_owned(),
        ));
        CatalogFixture {
            server,
            addr,
            file,
            _dir: dir,
            token,
            edits: Default::default(),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the served catalog; served from the return on (the server loads it here, as
    /// its watch would within `RECHECK`).
    pub fn publish(&self, catalog_json: &str) {
        std::fs::write(&self.file, catalog_json).unwrap();
        // A distinct modification time per edit, whatever the file system's timestamp granularity.
        let n = self.edits.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let when = std::time::SystemTime::now() + Duration::from_secs(n);
        std::fs::File::options()
            .write(true)
            .open(&self.file)
            .unwrap()
            .set_modified(when)
            .unwrap();
        self.server.reload();
    }

    pub fn count(&self, which: &str) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        let s = &self.server.stats;
        match which {
            "latest" => s.latest.load(SeqCst),
            "indexed_limits" => s.indexed_limits.load(SeqCst),
            "catalog_diff" => s.catalog_diff.load(SeqCst),
            "unauthorized" => s.unauthorized.load(SeqCst),
            other => panic!("no counter {other}"),
        }
    }
}

impl Drop for CatalogFixture {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// How the scripted catalog server misbehaves.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Serves this catalog like a DynLimits server: `/indexed_limits` only, no versions, no ETag.
    DynLimits(String),
    /// Answers every request with this status.
    Status(u16),
    /// Never answers.
    Hang,
    /// Promises more body than it sends, then closes.
    Truncated,
    /// Serves this text as the catalog (`/latest` says a new version).
    Body(String),
    /// `/latest` says a new version and `/catalog_diff` answers with this fault (anything else:
    /// 404).
    Diff(Box<Fault>),
}

/// A catalog server whose behaviour a test switches at will.
pub struct FaultyCatalogServer {
    pub addr: SocketAddr,
    pub mode: Arc<Mutex<Fault>>,
    token: CancellationToken,
}

impl FaultyCatalogServer {
    pub async fn start(mode: Fault) -> FaultyCatalogServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(mode));
        let token = CancellationToken::new();
        let m = mode.clone();
        let handler = move |_peer: SocketAddr, req: Request<RequestBody>| {
            let fault = m.lock().unwrap().clone();
            async move { fault_answer(fault, req.uri().path().to_owned()).await }
        };
        tokio::spawn(quotagate::server::serve(
            listener,
            Default::default(),
            Default::default(),
            handler,
            token.clone().cancelled_owned(),
        ));
        FaultyCatalogServer { addr, mode, token }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, fault: Fault) {
        *self.mode.lock().unwrap() = fault;
    }
}

impl Drop for FaultyCatalogServer {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// A body that sends one chunk and then fails, so the connection is cut mid-body.
pub struct Cut {
    sent: bool,
    /// A pause after the chunk, so the headers and the chunk are on the wire before the cut.
    pause: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Cut {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.sent {
            std::task::ready!(std::future::Future::poll(self.pause.as_mut(), cx));
            return std::task::Poll::Ready(Some(Err(std::io::Error::other("cut"))));
        }
        self.sent = true;
        std::task::Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            br#"{"methods": ["GET"], "paths": ["#,
        )))))
    }
}

async fn fault_answer(
    fault: Fault,
    path: String,
) -> Response<http_body_util::Either<Full<Bytes>, Cut>> {
    let reply = |status: u16, body: String| {
        let mut r = Response::new(http_body_util::Either::Left(Full::new(Bytes::from(body))));
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        r
    };
    match fault {
        Fault::DynLimits(c) if path == "/indexed_limits" => reply(200, c),
        Fault::DynLimits(_) => reply(404, String::new()),
        Fault::Status(s) => reply(s, "{}".into()),
        Fault::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            reply(200, String::new())
        }
        Fault::Truncated => Response::new(http_body_util::Either::Right(Cut {
            sent: false,
            pause: Box::pin(tokio::time::sleep(Duration::from_millis(20))),
        })),
        Fault::Body(_) if path == "/catalog_diff" => reply(404, String::new()),
        Fault::Body(b) if path == "/latest" => reply(
            200,
            format!(r#"{{"hash": "{:x}"}}"#, b.len() as u64 * 7919 + 1),
        ),
        Fault::Body(b) => reply(200, b),
        Fault::Diff(f) if path == "/catalog_diff" => match *f {
            Fault::Body(b) => reply(200, b),
            f => Box::pin(fault_answer(f, path)).await,
        },
        Fault::Diff(_) if path == "/latest" => reply(200, r#"{"hash": "diff-fault"}"#.into()),
        Fault::Diff(_) => reply(404, String::new()),
    }
}

/// Reads `/metrics` from an admin listener: sample (`name{labels}`) to value.
pub async fn scrape(admin: SocketAddr) -> std::collections::HashMap<String, f64> {
    let got = get(&format!("http://{admin}/metrics"), &[]).await;
    assert_eq!(got.status, 200);
    assert!(
        got.header("content-type")
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = String::from_utf8(got.body.to_vec()).unwrap();
    assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (sample, value) = l.rsplit_once(' ').expect("sample value");
            (sample.to_owned(), value.parse().expect("a number"))
        })
        .collect()
}
