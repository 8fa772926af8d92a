//! At the edge: TLS on the gateway's listener, with real clients (curl, `openssl s_client`, a
//! rustls client holding a connection open) and certificates made by `openssl`.

mod support;

#[path = "edge/framing.rs"]
mod framing;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use quotagate::config::Config;
use quotagate_engine::clock::FakeClock;
use support::{TestGateway, Upstream, eventually, scrape};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T0: u64 = 1_700_000_040;

const CATALOG: &str = r#"{
  "version": {"semver": "1.0.0", "hash": "h1"},
  "methods": ["GET"],
  "paths": ["/users/{id}"],
  "endpoints": [{"p": 0, "m": 0}],
  "apilimits": [{"key": "K1", "limits": [{"ep": 0, "rl": 100}]},
                {"key": "ONCE", "limits": [{"ep": 0, "rl": 1}]},
                {"key": "LOAD", "limits": [{"ep": 0, "rl": 1000000000}]},
                {"key": "SLOT", "limits": [{"ep": 0, "concurrent": 1}]}]
}"#;

/// A self-signed P-256 certificate for `names` (subjectAltName DNS entries), common name `cn`:
/// (`<cn>.pem`, `<cn>.key`) in `dir`, written to temporary files first and renamed into place,
/// as a certificate manager would.
fn cert(dir: &Path, cn: &str, file: &str, names: &[&str]) -> (PathBuf, PathBuf) {
    let san: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
    let (pem, key) = (
        dir.join(format!("{file}.pem")),
        dir.join(format!("{file}.key")),
    );
    let (tmp_pem, tmp_key) = (dir.join(".new.pem"), dir.join(".new.key"));
    let ok = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .args(["-days", "2", "-subj", &format!("/CN={cn}")])
        .args(["-addext", &format!("subjectAltName={}", san.join(","))])
        // An end-entity certificate (rustls refuses a CA as one), trusted as itself by clients.
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&tmp_key)
        .arg("-out")
        .arg(&tmp_pem)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|_| support::missing("openssl"))
        .success();
    assert!(ok, "openssl req for {cn}");
    std::fs::rename(&tmp_key, &key).unwrap();
    std::fs::rename(&tmp_pem, &pem).unwrap();
    (pem, key)
}

async fn gateway(set: impl FnOnce(&mut Config)) -> (TestGateway, Upstream) {
    let up = Upstream::start().await;
    let mut c = Config::default();
    c.upstream.url = up.url();
    set(&mut c);
    (TestGateway::start(c, CATALOG, FakeClock::new(T0)).await, up)
}

/// The common name of the certificate the listener serves for `sni` (`None`: no SNI sent).
fn served_cn(port: u16, sni: Option<&str>) -> String {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect", &format!("127.0.0.1:{port}")]);
    match sni {
        Some(name) => cmd.args(["-servername", name]),
        None => cmd.arg("-noservername"),
    };
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("subject=").map(str::to_owned))
        .unwrap_or_else(|| panic!("no certificate in:\n{text}"))
        .rsplit("CN = ")
        .next()
        .unwrap()
        .trim()
        .to_owned()
}

/// curl's (status, HTTP version) for GET `path` on `name` (resolved to the gateway).
fn curl(port: u16, name: &str, ca: &Path, extra: &[&str]) -> (String, String) {
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version}",
        ])
        .args(["--resolve", &format!("{name}:{port}:127.0.0.1")])
        .arg("--cacert")
        .arg(ca)
        .args(["-H", "X-Api-Key: K1"])
        .args(extra)
        .arg(format!("https://{name}:{port}/users/42"))
        .output()
        .unwrap_or_else(|_| support::missing("curl"));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (code, version) = text.split_once(' ').unwrap_or((&text, ""));
    (code.to_owned(), version.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_http1_and_h2_picks_certificates_by_sni_and_reloads_them() {
    let dir = tempfile::tempdir().unwrap();
    let (a_pem, a_key) = cert(dir.path(), "a", "a", &["a.test"]);
    let (b_pem, b_key) = cert(dir.path(), "b", "b", &["*.b.test"]);
    let (gw, _up) = gateway(|c| {
        c.server.tls_cert_file = format!("{},{}", a_pem.display(), b_pem.display());
        c.server.tls_key_file = format!("{}, {}", a_key.display(), b_key.display());
    })
    .await;
    let port = gw.addr.port();

    // HTTP/1.1 and HTTP/2 chosen by ALPN, each verified against its own certificate.
    assert_eq!(
        curl(port, "a.test", &a_pem, &["--http1.1"]),
        ("200".into(), "1.1".into())
    );
    assert_eq!(
        curl(port, "a.test", &a_pem, &["--http2"]),
        ("200".into(), "2".into())
    );
    assert_eq!(curl(port, "x.b.test", &b_pem, &[]).0, "200");

    // SNI: the certificate whose names match; none or no SNI: the first.
    assert_eq!(served_cn(port, Some("x.b.test")), "b");
    assert_eq!(served_cn(port, Some("a.test")), "a");
    assert_eq!(served_cn(port, Some("nothing.test")), "a");
    assert_eq!(served_cn(port, None), "a");

    // Cleartext HTTP to the TLS port: a 400 that says so.
    let plain = support::get(&gw.url("/users/42"), &[("x-api-key", "K1")]).await;
    assert_eq!(plain.status, 400);
    assert!(String::from_utf8_lossy(&plain.body).contains("speaks TLS"));

    // Asked to close: the answer, TLS's close_notify, then the end (without the alert, a client
    // reading to the end gets an error: the answer may have been cut).
    let mut once = tls_connect(port, "a.test", &a_pem).await;
    once.write_all(
        b"GET /users/1 HTTP/1.1\r\nhost: a.test\r\nx-api-key: K1\r\nconnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), once.read_to_end(&mut all))
        .await
        .expect("the end")
        .expect("close_notify before the end");
    assert!(all.starts_with(b"HTTP/1.1 200"), "{all:?}");

    // A connection opened before a reload keeps working after it.
    let mut held = tls_connect(port, "a.test", &a_pem).await;
    assert!(request_on(&mut held).await.starts_with("HTTP/1.1 200"));

    // The certificate replaced on disk: new handshakes get the new one within seconds.
    cert(dir.path(), "a2", "a", &["a.test"]);
    eventually(Duration::from_secs(10), || async {
        tokio::task::spawn_blocking(move || served_cn(port, Some("a.test")))
            .await
            .unwrap()
            == "a2"
    })
    .await;
    assert!(
        request_on(&mut held).await.starts_with("HTTP/1.1 200"),
        "the held connection"
    );

    // A broken file keeps the certificate in service, and counts.
    std::fs::write(&a_pem, "not a certificate").unwrap();
    eventually(Duration::from_secs(10), || async {
        scrape(gw.admin)
            .await
            .get("quotagate_tls_reload_failures_total")
            == Some(&1.0)
    })
    .await;
    assert_eq!(served_cn(port, Some("a.test")), "a2");

    // Seconds until each certificate expires, by the gateway's clock (at T0): its end is two
    // days from the real now, less a few seconds.
    let m = scrape(gw.admin).await;
    let left = m[&format!(
        "quotagate_tls_certificate_expiry_seconds{{cert_file=\"{}\"}}",
        b_pem.display()
    )];
    let real_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let end = (real_now + 2 * 86_400 - T0) as f64;
    assert!((end - 600.0..=end).contains(&left), "{left}, {end}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_when_a_client_ca_is_set() {
    let certs = support::Certs::make();
    let (gw, _up) = gateway(|c| {
        c.server.tls_cert_file = certs.path("server.pem");
        c.server.tls_key_file = certs.path("server.key");
        c.server.tls_client_ca_file = certs.path("ca.pem");
    })
    .await;
    let port = gw.addr.port();
    let ca = PathBuf::from(certs.path("ca.pem"));
    let with_cert = [
        "--cert",
        &certs.path("client.pem"),
        "--key",
        &certs.path("client.key"),
    ];
    assert_eq!(curl(port, "localhost", &ca, &with_cert).0, "200");
    assert_eq!(
        curl(port, "localhost", &ca, &[]).0,
        "000",
        "no client certificate: no answer"
    );
    // `server.tls_client_san`: the certificate must also be valid for that name (this one has
    // subjectAltName DNS:client.test).
    for (san, answer) in [("client.test", "200"), ("other.test", "000")] {
        let (gw, _up) = gateway(|c| {
            c.server.tls_cert_file = certs.path("server.pem");
            c.server.tls_key_file = certs.path("server.key");
            c.server.tls_client_ca_file = certs.path("ca.pem");
            c.server.tls_client_san = san.into();
        })
        .await;
        let got = curl(gw.addr.port(), "localhost", &ca, &with_cert).0;
        assert_eq!(got, answer, "tls_client_san {san}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_settings_that_cannot_work_stop_the_start_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let (a_pem, _) = cert(dir.path(), "a", "a", &["a.test"]);
    let (_, b_key) = cert(dir.path(), "b", "b", &["b.test"]);
    let start = |cert: String, key: String| {
        let mut c = Config::default();
        c.server.tls_cert_file = cert;
        c.server.tls_key_file = key;
        match quotagate::app::settings::Settings::new(
            c,
            |_| None,
            quotagate::app::settings::Serve::all(),
        ) {
            Err(e) => e.to_string(),
            Ok(s) => match quotagate::app::App::build(&s, Arc::new(FakeClock::new(T0)), None) {
                Err(e) => e.to_string(),
                Ok(_) => "started".into(),
            },
        }
    };
    let e = start(a_pem.display().to_string(), b_key.display().to_string());
    assert!(e.contains("a.pem: does not match its key"), "{e}");
    let e = start(a_pem.display().to_string(), String::new());
    assert!(
        e.contains("server.tls_key_file: lists 0 keys for 1 certificate files"),
        "{e}"
    );
    let e = start("/nonexistent.pem".into(), b_key.display().to_string());
    assert!(e.contains("/nonexistent.pem"), "{e}");
    for (ca, san, said) in [
        (
            "",
            "client.test",
            "server.tls_client_san: needs server.tls_client_ca_file",
        ),
        (
            "ca.pem",
            "not a name!",
            "server.tls_client_san: \"not a name!\" is neither",
        ),
    ] {
        let mut c = Config::default();
        c.server.tls_cert_file = a_pem.display().to_string();
        c.server.tls_key_file = dir.path().join("a.key").display().to_string();
        c.server.tls_client_ca_file = ca.into();
        c.server.tls_client_san = san.into();
        let e = support::refused(c);
        assert!(e.contains(said), "{e}");
    }
}

/// A TLS connection to the listener (HTTP/1.1 by ALPN), verified against `ca`.
async fn tls_connect(
    port: u16,
    name: &str,
    ca: &Path,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    tls_connect_with(port, name, &tls_client(ca)).await
}

/// A TLS client of its own (its own session store: what it resumes is its own), verified
/// against `ca`, asking for HTTP/1.1 by ALPN.
fn tls_client(ca: &Path) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

async fn tls_connect_with(
    port: u16,
    name: &str,
    config: &Arc<rustls::ClientConfig>,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await
        .unwrap()
}

/// Whether `s`'s handshake resumed a session.
fn resumed(s: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> bool {
    s.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_resumes_a_returning_client_after_more_clients_than_a_session_cache_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (pem, key) = cert(dir.path(), "a", "a", &["a.test"]);
    let (gw, _up) = gateway(|c| {
        c.server.tls_cert_file = pem.display().to_string();
        c.server.tls_key_file = key.display().to_string();
    })
    .await;
    let port = gw.addr.port();
    let returning = tls_client(&pem);
    // The session it will come back with: its ticket comes with (before) the first answer.
    let mut first = tls_connect_with(port, "a.test", &returning).await;
    assert!(!resumed(&first));
    assert!(
        request_as(&mut first, "LOAD")
            .await
            .starts_with("HTTP/1.1 200")
    );
    drop(first);
    // More clients than rustls' default cache holds (256 sessions), each given a session.
    for _ in 0..300 {
        let mut other = tls_connect_with(port, "a.test", &tls_client(&pem)).await;
        assert!(
            request_as(&mut other, "LOAD")
                .await
                .starts_with("HTTP/1.1 200")
        );
    }
    let mut back = tls_connect_with(port, "a.test", &returning).await;
    assert!(resumed(&back), "a full handshake again");
    assert!(
        request_as(&mut back, "LOAD")
            .await
            .starts_with("HTTP/1.1 200")
    );
}

/// One keep-alive GET on an open connection; the response head and body as text.
async fn request_on(s: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> String {
    request_as(s, "K1").await
}

/// One keep-alive GET on an open connection with API key `key`; the response as text.
async fn request_as(
    s: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    key: &str,
) -> String {
    let head = format!("GET /users/1 HTTP/1.1\r\nhost: a.test\r\nx-api-key: {key}\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

// ---- upgrades (WebSocket) ----

/// An upstream that agrees to every upgrade (101) and then echoes what it receives, over raw TCP.
async fn echo_upstream() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let head = read_head(&mut s).await;
                assert!(
                    head.to_ascii_lowercase().contains("upgrade: websocket"),
                    "{head}"
                );
                s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n")
                    .await
                    .unwrap();
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Reads up to the end of an HTTP head.
async fn read_head(s: &mut tokio::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

async fn ask_upgrade(gw: std::net::SocketAddr, key: &str) -> (tokio::net::TcpStream, String) {
    let mut s = tokio::net::TcpStream::connect(gw).await.unwrap();
    let req = format!(
        "GET /users/1 HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\nx-api-key: {key}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(&mut s).await;
    (s, head)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_are_admitted_once_then_relayed_both_ways_until_idle() {
    let up = echo_upstream().await;
    let mut c = Config::default();
    c.upstream.url = format!("http://{up}");
    c.server.upgrade_idle_timeout_ms = 500;
    let gw = TestGateway::start(c, CATALOG, FakeClock::new(T0)).await;

    let (mut s, head) = ask_upgrade(gw.addr, "ONCE").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains("upgrade: websocket") && lower.contains("ratelimit-remaining: 0"),
        "{head}"
    );
    for msg in [&b"hello"[..], b"second frame"] {
        s.write_all(msg).await.unwrap();
        let mut buf = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
            .await
            .expect("echoed")
            .unwrap();
        assert_eq!(buf, msg);
    }
    // Counted once: the key's one request a minute is spent.
    let (_, refused) = ask_upgrade(gw.addr, "ONCE").await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    // Silent both ways for the idle timeout: closed.
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
}

/// An upgraded connection holds its concurrency slot until it closes.
#[tokio::test]
async fn an_upgraded_connection_holds_its_slot_until_it_closes() {
    let up = echo_upstream().await;
    let mut c = Config::default();
    c.upstream.url = format!("http://{up}");
    let gw = TestGateway::start(c, CATALOG, FakeClock::new(T0)).await;
    let (mut s, head) = ask_upgrade(gw.addr, "SLOT").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.unwrap();
    let (_, refused) = ask_upgrade(gw.addr, "SLOT").await;
    assert!(
        refused.starts_with("HTTP/1.1 429"),
        "held while open: {refused}"
    );
    drop(s);
    support::eventually(Duration::from_secs(5), || async {
        ask_upgrade(gw.addr, "SLOT")
            .await
            .1
            .starts_with("HTTP/1.1 101")
    })
    .await;
}

// ---- gRPC ----

/// Refusals of gRPC requests in the form gRPC clients read: HTTP 200, `grpc-status`,
/// `grpc-message`, no body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_requests_are_refused_with_grpc_statuses() {
    let (gw, _up) = gateway(|_| {}).await;
    let client = support::http2_client();
    let call = |path: &'static str, key: Option<&'static str>| {
        let client = client.clone();
        let url = gw.url(path);
        async move {
            let mut h = vec![("content-type", "application/grpc"), ("te", "trailers")];
            if let Some(k) = key {
                h.push(("x-api-key", k));
            }
            support::send(&client, "GET", &url, &h, bytes::Bytes::new()).await
        }
    };
    let status = |g: &support::Got| {
        assert_eq!(g.status, 200);
        assert!(g.body.is_empty());
        g.header("grpc-status").unwrap_or("none").to_owned()
    };
    assert_eq!(
        call("/users/1", Some("ONCE")).await.status,
        200,
        "forwarded"
    );
    let over = call("/users/1", Some("ONCE")).await;
    assert_eq!(status(&over), "8", "RESOURCE_EXHAUSTED");
    assert_eq!(over.header("ratelimit-remaining"), Some("0"));
    assert!(
        over.header("grpc-message").unwrap().contains("retry after"),
        "{:?}",
        over.header("grpc-message")
    );
    assert_eq!(
        status(&call("/users/1", None).await),
        "16",
        "no key: UNAUTHENTICATED"
    );
    assert_eq!(
        status(&call("/users/1", Some("nobody")).await),
        "16",
        "unknown key"
    );
    assert_eq!(
        status(&call("/nowhere", Some("K1")).await),
        "12",
        "no route: UNIMPLEMENTED"
    );
}

// ---- real peers in Python (tests/peers.py: grpcio, websockets, cryptography) ----

/// A child process killed on drop.
struct Peer(std::process::Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn peers_py() -> Command {
    support::need_python();
    let mut cmd = Command::new("python3");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers.py"));
    cmd
}

/// Starts a server of peers.py (`grpc-server`, `ws-server`) and waits for its port.
async fn peer_server(kind: &str, dir: &Path) -> (Peer, u16) {
    let port_file = dir.join(format!("{kind}.port"));
    let child = peers_py()
        .arg(kind)
        .arg(&port_file)
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|_| support::missing("python3"));
    let peer = Peer(child);
    eventually(Duration::from_secs(20), || {
        let f = port_file.clone();
        async move { f.exists() }
    })
    .await;
    let port = std::fs::read_to_string(&port_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (peer, port)
}

/// Runs a client of peers.py and parses the JSON line it prints.
async fn peer_client(args: &[&str]) -> serde_json::Value {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || peers_py().args(&args).output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "peers.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

const GRPC_CATALOG: &str = r#"{
  "version": {"semver": "1.0.0", "hash": "g1"},
  "methods": ["POST"],
  "paths": ["/test.Peer/Echo", "/test.Peer/Count"],
  "endpoints": [{"p": 0, "m": 0}, {"p": 1, "m": 0}],
  "apilimits": [{"key": "G", "limits": [{"ep": 0, "rl": 3}, {"ep": 1, "rl": 100}]}]
}"#;

/// grpcio's client and server with the gateway between them: unary calls with trailers, a
/// server-streaming call, and RESOURCE_EXHAUSTED (with Retry-After) past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_stream_end_to_end_with_trailers_and_the_limit_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, port) = peer_server("grpc-server", dir.path()).await;
    let mut c = Config::default();
    c.upstream.url = format!("http://127.0.0.1:{port}");
    let gw = TestGateway::start(c, GRPC_CATALOG, FakeClock::new(T0)).await;
    let got = peer_client(&["grpc-client", &gw.addr.to_string(), "G", "4"]).await;
    let unary = got["unary"].as_array().unwrap();
    for (i, call) in unary[..3].iter().enumerate() {
        assert_eq!(call["code"], "OK", "{got}");
        assert_eq!(call["reply"], format!("echo:hi{i}"));
        assert_eq!(call["trailer"], "kept", "the upstream's trailers arrive");
    }
    assert_eq!(unary[3]["code"], "RESOURCE_EXHAUSTED", "{got}");
    assert!(unary[3]["retry_after"].as_str().is_some(), "{got}");
    assert_eq!(got["stream"], serde_json::json!(["0", "1", "2", "3", "4"]));
}

/// Python's websockets through the gateway: the handshake is admitted once, then text, a
/// 100 kB message and binary frames echo back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_talks_to_its_server_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, port) = peer_server("ws-server", dir.path()).await;
    let mut c = Config::default();
    c.upstream.url = format!("http://127.0.0.1:{port}");
    let gw = TestGateway::start(c, CATALOG, FakeClock::new(T0)).await;
    let url = format!("ws://{}/users/ws", gw.addr);
    let got = peer_client(&["ws-client", &url, "K1"]).await;
    assert_eq!(got["echo"], serde_json::json!(["hello", 100000]), "{got}");
    assert_eq!(got["binary"], "000162696e617279");
    assert_eq!(got["remaining"], "99", "counted once");
    let got = peer_client(&["ws-client", &url, "nobody"]).await;
    assert_eq!(got["status"], 403, "an unknown key gets no upgrade: {got}");
}

// ---- TLS to the upstream ----

/// An upstream speaking TLS with `cert` (`<dir>/<cert>.pem` and `.key`), requiring client
/// certificates signed by `client_ca` when given.
async fn tls_upstream(dir: &Path, cert: &str, client_ca: Option<&str>) -> Upstream {
    let tls = quotagate::server::tls::Tls::new(
        &quotagate::server::tls::TlsSettings {
            pairs: vec![(
                dir.join(format!("{cert}.pem")),
                dir.join(format!("{cert}.key")),
            )],
            client_ca: client_ca.map(|c| dir.join(format!("{c}.pem"))),
            client_san: None,
        },
        std::sync::Arc::new(quotagate_engine::clock::SystemClock::new()),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    Upstream::serve(listener, Default::default(), Some(tls.acceptor.clone())).await
}

fn make_certs(dir: &Path) {
    let out = peers_py().arg("certs").arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_are_verified_and_may_ask_for_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certs(d);
    let ca = d.join("ca.pem").display().to_string();
    let good = tls_upstream(d, "server", None).await;
    let expired = tls_upstream(d, "expired", None).await;
    let mtls = tls_upstream(d, "server", Some("client-ca")).await;
    let https = |up: &Upstream| format!("https://localhost:{}", up.addr.port());
    let ask = |set: Box<dyn FnOnce(&mut Config)>| async move {
        let mut c = Config::default();
        set(&mut c);
        let gw = TestGateway::start(c, CATALOG, FakeClock::new(T0)).await;
        support::get(&gw.url("/users/1"), &[("x-api-key", "K1")]).await
    };

    // Verified against its CA; ALPN picks HTTP/2 (the upstream offers both), or HTTP/1.1 when told.
    let (url, ca2) = (https(&good), ca.clone());
    let r = ask(Box::new(move |c| {
        c.upstream.url = url;
        c.upstream.tls_ca_file = ca2;
    }))
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let seen = good.last();
    assert_eq!(seen.version, http::Version::HTTP_2);
    let (url, ca2) = (https(&good), ca.clone());
    let r = ask(Box::new(move |c| {
        c.upstream.url = url;
        c.upstream.tls_ca_file = ca2;
        c.upstream.protocol = quotagate::config::UpstreamProtocol::Http1;
    }))
    .await;
    assert_eq!(r.status, 200);
    let seen = good.last();
    assert_eq!(seen.version, http::Version::HTTP_11);
    assert_eq!(
        seen.headers["host"],
        format!("localhost:{}", good.addr.port()).as_str()
    );
    // By address, with the name to verify given.
    let (url, ca2) = (format!("https://{}", good.addr), ca.clone());
    let r = ask(Box::new(move |c| {
        c.upstream.url = url;
        c.upstream.tls_ca_file = ca2;
        c.upstream.tls_server_name = "localhost".into();
    }))
    .await;
    assert_eq!(r.status, 200);

    // Not signed by a trusted CA (the system's roots), and expired: 502 naming target and reason.
    let url = https(&good);
    let r = ask(Box::new(move |c| c.upstream.url = url)).await;
    assert_eq!(r.status, 502);
    let detail = r.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains(&https(&good)) && detail.contains("UnknownIssuer"),
        "{detail}"
    );
    let (url, ca2) = (https(&expired), ca.clone());
    let r = ask(Box::new(move |c| {
        c.upstream.url = url;
        c.upstream.tls_ca_file = ca2;
    }))
    .await;
    assert_eq!(r.status, 502);
    let detail = r.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains(&https(&expired)) && detail.contains("certificate expired"),
        "{detail}"
    );
    // ... unless told not to check (tests only).
    let url = https(&expired);
    let r = ask(Box::new(move |c| {
        c.upstream.url = url;
        c.upstream.tls_insecure_skip_verify = true;
    }))
    .await;
    assert_eq!(r.status, 200);

    // An upstream that requires a client certificate: refused without, served with.
    let (url, ca2) = (https(&mtls), ca.clone());
    let r = ask(Box::new(move |c| {
        c.upstream.url = url;
        c.upstream.tls_ca_file = ca2;
    }))
    .await;
    assert_eq!(r.status, 502, "no client certificate");
    assert!(mtls.requests().is_empty());
    let (url, ca2) = (https(&mtls), ca.clone());
    let (cert, key) = (
        d.join("client.pem").display().to_string(),
        d.join("client.key").display().to_string(),
    );
    let r = ask(Box::new(move |c| {
        c.upstream.url = url;
        c.upstream.tls_ca_file = ca2;
        c.upstream.tls_cert_file = cert;
        c.upstream.tls_key_file = key;
    }))
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(mtls.requests().len(), 1);
}

// ---- several targets ----

/// Requests from `tasks` concurrent clients until `stop`: each one's start and status.
fn load(
    url: String,
    tasks: usize,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<Vec<(std::time::Instant, u16)>> {
    tokio::spawn(async move {
        let runs: Vec<_> = (0..tasks)
            .map(|_| {
                let (url, stop) = (url.clone(), stop.clone());
                tokio::spawn(async move {
                    let client = support::http1_client();
                    let mut seen = Vec::new();
                    while !stop.is_cancelled() {
                        let started = std::time::Instant::now();
                        let r = support::send(
                            &client,
                            "GET",
                            &url,
                            &[("x-api-key", "LOAD")],
                            bytes::Bytes::new(),
                        )
                        .await;
                        seen.push((started, r.status));
                    }
                    seen
                })
            })
            .collect();
        let mut all = Vec::new();
        for r in runs {
            all.extend(r.await.unwrap());
        }
        all
    })
}

/// `quotagate example-upstream` on `addr`, as a process of its own (to be killed with -9), once
/// it answers.
async fn example_upstream(addr: std::net::SocketAddr) -> Peer {
    let child = Command::new(env!("CARGO_BIN_EXE_quotagate"))
        .args(["example-upstream", "--listen", &addr.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let peer = Peer(child);
    eventually(Duration::from_secs(20), || async move {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    peer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_share_the_load_and_one_killed_and_restarted_under_load() {
    let ups = [Upstream::start().await, Upstream::start().await];
    let third = std::net::SocketAddr::from(([127, 0, 0, 1], support::free_port()));
    let mut process = example_upstream(third).await;
    let mut c = Config::default();
    c.upstream.url = format!("{},{},http://{third}", ups[0].url(), ups[1].url());
    c.upstream.balance = quotagate::config::Balance::RoundRobin;
    c.upstream.eject_ms = 200;
    let gw = TestGateway::start(c, CATALOG, FakeClock::new(T0)).await;
    for _ in 0..30 {
        assert_eq!(
            support::get(&gw.url("/users/1"), &[("x-api-key", "LOAD")])
                .await
                .status,
            200
        );
    }
    let counts: Vec<usize> = ups.iter().map(|u| u.requests().len()).collect();
    assert_eq!(counts, [10, 10], "round robin (and 10 to the third)");

    let stop = tokio_util::sync::CancellationToken::new();
    let running = load(gw.url("/users/1"), 4, stop.clone());
    let served = || ups[0].requests().len() + ups[1].requests().len();
    let admin = gw.admin;
    let requests = format!("quotagate_upstream_target_requests_total{{target=\"http://{third}\"}}");
    let asked =
        |name: String| async move { scrape(admin).await.get(&name).copied().unwrap_or(0.0) };
    let before = asked(requests.clone()).await;
    eventually(Duration::from_secs(10), || {
        let r = requests.clone();
        async move { asked(r).await > before + 50.0 }
    })
    .await;
    // Killed mid-load: connections reset, requests in flight on them included.
    let _ = process.0.kill();
    let _ = process.0.wait();
    let others = served();
    eventually(Duration::from_secs(10), || {
        let n = served();
        async move { n > others + 200 }
    })
    .await;
    let up = format!("quotagate_upstream_target_up{{target=\"http://{third}\"}}");
    assert_eq!(asked(up.clone()).await, 0.0, "taken out");
    let out = std::time::Instant::now();
    // Restarted on its port: back after its time out, by a trial request.
    process = example_upstream(third).await;
    let back = asked(requests.clone()).await;
    eventually(Duration::from_secs(10), || {
        let r = requests.clone();
        async move { asked(r).await > back + 50.0 }
    })
    .await;
    stop.cancel();
    let seen = running.await.unwrap();
    let mut statuses = std::collections::BTreeMap::new();
    for (_, status) in &seen {
        *statuses.entry(*status).or_insert(0) += 1;
    }
    eprintln!("statuses under load: {statuses:?}");
    // Requests already sent to the target when it died get 502 (nothing sent is retried: it may
    // have been acted on); at most one per connection the gateway had to it (4 clients, 2
    // workers). A request that could not connect went to another target: once the target is out,
    // no client sees a 502.
    let failed: Vec<std::time::Instant> = seen
        .iter()
        .filter(|(_, s)| *s != 200)
        .map(|(t, _)| *t)
        .collect();
    assert!(
        statuses.keys().all(|s| [200, 502].contains(s)) && failed.len() <= 8,
        "{statuses:?}"
    );
    assert!(failed.iter().all(|t| *t < out), "no 502 once it was out");
    assert_eq!(asked(up).await, 1.0, "back in");
    let failures = format!("quotagate_upstream_target_failures_total{{target=\"http://{third}\"}}");
    assert!(asked(failures).await >= 1.0);
    let status = support::get(&format!("http://{}/status", gw.admin), &[])
        .await
        .json();
    let targets = status["upstream"]["targets"].as_array().unwrap().clone();
    assert_eq!(targets.len(), 3);
    assert!(targets.iter().all(|t| t["up"] == true), "{targets:?}");
    drop(process);
}

/// A target that answers its health check with 503 is taken out by the checks alone, and put back
/// when it passes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_health_checks_take_a_failing_target_out_until_it_passes() {
    let good = Upstream::start().await;
    let sick = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sick_addr = listener.local_addr().unwrap();
    let answers = sick.clone();
    // Answers 503 while sick, 200 otherwise, to every request (one per connection).
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let status = match answers.load(std::sync::atomic::Ordering::Relaxed) {
                true => "503 Service Unavailable",
                false => "200 OK",
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    let mut c = Config::default();
    c.upstream.url = format!("{},http://{sick_addr}", good.url());
    c.upstream.health_path = "/healthz".into();
    c.upstream.health_interval_ms = 100;
    let gw = TestGateway::start(c, CATALOG, FakeClock::new(T0)).await;
    let up = format!("quotagate_upstream_target_up{{target=\"http://{sick_addr}\"}}");
    let admin = gw.admin;
    eventually(Duration::from_secs(10), || {
        let up = up.clone();
        async move { scrape(admin).await.get(&up) == Some(&0.0) }
    })
    .await;
    for _ in 0..20 {
        let r = support::get(&gw.url("/users/1"), &[("x-api-key", "LOAD")]).await;
        assert_eq!(r.status, 200, "only the healthy target is asked");
    }
    assert_eq!(
        good.requests()
            .iter()
            .filter(|r| r.path_and_query == "/users/1")
            .count(),
        20
    );
    sick.store(false, std::sync::atomic::Ordering::Relaxed);
    eventually(Duration::from_secs(10), || {
        let up = up.clone();
        async move { scrape(admin).await.get(&up) == Some(&1.0) }
    })
    .await;
}
