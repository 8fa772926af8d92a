//! Redis deployments for the store tests, started and stopped by the test itself on private ports:
//! a Redis Cluster (masters, and replicas for failover) and a TLS-only server with certificates
//! made by `openssl` for the test. Every process is killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::wait_until;

/// A free TCP port whose cluster bus port (+10000) is free too.
pub fn free_port_pair() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p < 55_000
            && std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok()
            && super::first_time(p)
        {
            return p;
        }
    }
}

fn cli(port: u16, extra: &[&str], args: &[&str]) -> Option<String> {
    super::run_cli(
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(extra)
            .args(args),
    )
}

/// redis-cli's arguments for a server that speaks TLS with `certs` (none without).
fn cli_tls_of(certs: Option<&Certs>) -> Vec<String> {
    certs.map_or_else(Vec::new, |c| {
        vec![
            "--tls".into(),
            "--cacert".into(),
            c.path("ca.pem"),
            "--cert".into(),
            c.path("client.pem"),
            "--key".into(),
            c.path("client.key"),
        ]
    })
}

/// `items` as `&str`s (redis-cli's TLS arguments).
fn strs(items: &[String]) -> Vec<&str> {
    items.iter().map(String::as_str).collect()
}

/// Comma-separated URLs of `ports` on 127.0.0.1: `rediss://` when redis-cli needs TLS arguments.
fn url_list(cli_tls: &[String], ports: impl Iterator<Item = u16>) -> String {
    let scheme = if cli_tls.is_empty() {
        "redis"
    } else {
        "rediss"
    };
    ports
        .map(|p| format!("{scheme}://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs one command through redis-cli on 127.0.0.1:`port`.
pub fn topology_cli(port: u16, args: &[&str]) -> Option<String> {
    cli(port, &[], args)
}

/// One redis-server on a TCP port of 127.0.0.1.
pub struct Node {
    pub port: u16,
    /// Behind a lock so that a test can kill a node while other code reads the topology.
    child: std::sync::Mutex<Option<Child>>,
}

impl Node {
    /// A redis-server with `args(port)` on a fresh port pair (data directory `dir`).
    fn spawn(dir: &Path, cli_tls: &[&str], args: impl Fn(u16) -> Vec<String>) -> Node {
        Node::start(cli_tls, |port| {
            let mut c = Command::new("redis-server");
            c.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir)
                .args(args(port));
            c
        })
    }

    /// Runs `command(port)` on a port pair that was free a moment ago, and returns once the
    /// server answering on that port is the process it started (`process_id` in `INFO server`).
    /// Another test's server can bind a port between our pick and our server's bind; ours then
    /// exits while the other answers. Seen once in CI: a "3-master" cluster made of two nodes,
    /// one listed twice. Such a start is retried on another port.
    fn start(cli_tls: &[&str], mut command: impl FnMut(u16) -> Command) -> Node {
        for _ in 0..10 {
            let port = free_port_pair();
            let mut child = command(port)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|_| super::missing("redis-server or redis-sentinel"));
            let ours = format!("process_id:{}", child.id());
            let start = std::time::Instant::now();
            let up = loop {
                if child.try_wait().ok().flatten().is_some() {
                    break false;
                }
                if let Some(info) = cli(port, cli_tls, &["INFO", "server"]) {
                    if info.lines().any(|l| l.trim() == ours) {
                        break true;
                    }
                    if info.contains("process_id:") {
                        break false;
                    }
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "redis-server on port {port} did not answer within 10s"
                );
                std::thread::sleep(Duration::from_millis(10));
            };
            if up {
                return Node::new(port, child);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server did not start on a free port in 10 tries");
    }

    fn new(port: u16, child: Child) -> Node {
        Node {
            port,
            child: std::sync::Mutex::new(Some(child)),
        }
    }

    /// Kills the node with SIGKILL (a crash, not a shutdown).
    pub fn kill(&self) {
        if let Some(mut c) = self.child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.lock().unwrap().is_some()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of `masters` masters with `replicas` replicas each.
pub struct RedisCluster {
    pub nodes: Vec<Node>,
    /// redis-cli's TLS arguments when the cluster speaks only TLS.
    cli_tls: Vec<String>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts the nodes, joins them with `redis-cli --cluster create` and waits until every node
    /// says the cluster is ok. A node timeout of 1 s makes failovers quick.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        RedisCluster::start_with(masters, replicas, None)
    }

    /// A cluster that speaks only TLS, clients and cluster bus alike, with `certs`.
    pub fn start_tls(masters: usize, certs: &Certs) -> RedisCluster {
        RedisCluster::start_with(masters, 0, Some(certs))
    }

    fn start_with(masters: usize, replicas: usize, certs: Option<&Certs>) -> RedisCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let cli_tls = cli_tls_of(certs);
        let tls_of = |port: u16| -> Vec<String> {
            certs.map_or_else(Vec::new, |c| {
                let mut args = c.server_args(port);
                let cluster = ["--tls-cluster", "yes", "--tls-replication", "yes"];
                args.extend(cluster.into_iter().map(String::from));
                args.extend(["--tls-auth-clients", "no"].map(String::from));
                args
            })
        };
        let count = masters * (1 + replicas);
        let tls = strs(&cli_tls);
        let nodes: Vec<Node> = (0..count)
            .map(|i| {
                let d = dir.path().join(format!("n{i}"));
                std::fs::create_dir(&d).unwrap();
                Node::spawn(&d, &tls, |port| {
                    let mut args: Vec<String> = [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-node-timeout",
                        "1000",
                        "--cluster-replica-validity-factor",
                        "0",
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                    // Later arguments win: with TLS, `--port 0` replaces the plain port.
                    args.extend(tls_of(port));
                    args
                })
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new("redis-cli")
            .args(&tls)
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = RedisCluster {
            nodes,
            cli_tls,
            _dir: dir,
        };
        cluster.wait_ok(Duration::from_secs(20));
        cluster
    }

    /// Every running node reports `cluster_state:ok` (none answers CLUSTERDOWN).
    pub fn is_ok(&self) -> bool {
        self.nodes.iter().filter(|n| n.is_running()).all(|n| {
            cli(n.port, &self.tls(), &["CLUSTER", "INFO"])
                .is_some_and(|info| info.contains("cluster_state:ok"))
        })
    }

    /// Waits until every running node reports `cluster_state:ok` and knows every node. Past
    /// `limit`, panics with what each node says of the cluster (a cluster that never formed
    /// was seen once in a full run; this tells why the next time).
    pub fn wait_ok(&self, limit: Duration) {
        let formed = |n: &Node| {
            let info = cli(n.port, &self.tls(), &["CLUSTER", "INFO"]).unwrap_or_default();
            info.contains("cluster_state:ok")
                && info.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
        };
        for n in self.nodes.iter().filter(|n| n.is_running()) {
            let start = std::time::Instant::now();
            while !formed(n) {
                if start.elapsed() >= limit {
                    let said: Vec<String> = self
                        .nodes
                        .iter()
                        .map(|m| {
                            let ask = |what: &str| {
                                cli(m.port, &self.tls(), &["CLUSTER", what]).unwrap_or_default()
                            };
                            format!(
                                "node {} (running: {}):\n{}\n{}",
                                m.port,
                                m.is_running(),
                                ask("INFO"),
                                ask("NODES")
                            )
                        })
                        .collect();
                    panic!(
                        "the cluster did not form within {limit:?}:\n{}",
                        said.join("\n")
                    );
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn tls(&self) -> Vec<&str> {
        strs(&self.cli_tls)
    }

    /// The seed list, every node.
    pub fn url(&self) -> String {
        url_list(&self.cli_tls, self.nodes.iter().map(|n| n.port))
    }

    /// The ports of the nodes that are masters now.
    pub fn masters(&self) -> Vec<u16> {
        let n = self.nodes.iter().find(|n| n.is_running()).expect("a node");
        let nodes = cli(n.port, &self.tls(), &["CLUSTER", "NODES"]).unwrap_or_default();
        nodes
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .filter_map(|l| {
                let addr = l.split(' ').nth(1)?; // 127.0.0.1:port@bus
                addr.split('@').next()?.rsplit(':').next()?.parse().ok()
            })
            .collect()
    }

    /// Number of keys held by the master on `port`.
    pub fn dbsize(&self, port: u16) -> u64 {
        cli(port, &self.tls(), &["DBSIZE"])
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// Runs a command on the node at `port`.
    pub fn cli(&self, port: u16, args: &[&str]) -> Option<String> {
        cli(port, &self.tls(), args)
    }
}

/// Certificates for a TLS test: a CA, a server certificate for 127.0.0.1, a client certificate,
/// and a second CA that signed nothing (a wrong CA).
pub struct Certs {
    pub dir: tempfile::TempDir,
}

impl Certs {
    /// redis-server's arguments to speak TLS only on `port`, with these certificates: `--port 0`
    /// comes after [`Node::spawn`]'s own `--port`, and the later one wins.
    fn server_args(&self, port: u16) -> Vec<String> {
        [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &self.path("server.pem"),
            "--tls-key-file",
            &self.path("server.key"),
            "--tls-ca-cert-file",
            &self.path("ca.pem"),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    }

    pub fn make() -> Certs {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let run = |args: &[&str]| {
            let ok = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap_or_else(|_| super::missing("openssl"))
                .success();
            assert!(ok, "openssl {args:?}");
        };
        for ca in ["ca", "other-ca"] {
            run(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=quotagate test {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ]);
        }
        // Extensions make X.509 v3 certificates (rustls refuses v1).
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        std::fs::write(
            d.join("client.ext"),
            "extendedKeyUsage=clientAuth\nsubjectAltName=DNS:client.test\n",
        )
        .unwrap();
        for name in ["server", "client"] {
            let (key, csr, pem, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.ext"),
            );
            let subj = format!("/CN={name}");
            run(&[
                "req", "-newkey", "rsa:2048", "-nodes", "-subj", &subj, "-keyout", &key, "-out",
                &csr,
            ]);
            run(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &pem,
                "-extfile",
                &ext,
            ]);
        }
        Certs { dir }
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// A redis-server that speaks only TLS on a TCP port, with `Certs`; `require_client_cert` makes it
/// demand a client certificate signed by the CA. Optionally an ACL user.
pub struct TlsRedis {
    pub port: u16,
    pub node: Node,
    pub certs: Certs,
    _dir: tempfile::TempDir,
}

impl TlsRedis {
    /// `login`: redis-cli's arguments to get past `extra`'s ACL (none without one).
    pub fn start(require_client_cert: bool, extra: &[&str], login: &[&str]) -> TlsRedis {
        let certs = Certs::make();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cli_args = cli_tls_of(Some(&certs));
        cli_args.extend(login.iter().map(|s| s.to_string()));
        // `--port 0` after `Node::spawn`'s own `--port`: the later one wins, TLS only.
        let node = Node::spawn(dir.path(), &strs(&cli_args), |port| {
            let mut args = certs.server_args(port);
            let auth = if require_client_cert { "yes" } else { "no" };
            args.extend(
                ["--tls-auth-clients", auth]
                    .iter()
                    .chain(extra)
                    .map(|a| a.to_string()),
            );
            args
        });
        TlsRedis {
            port: node.port,
            node,
            certs,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// Runs a command on it (with the client certificate).
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        cli(self.port, &strs(&cli_tls_of(Some(&self.certs))), args)
    }
}

/// A path for a file in `dir`, as a string.
pub fn file_in(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, contents).unwrap();
    p
}

/// One master, one replica and three sentinels watching them as `mymaster` (down after 1 s).
pub struct SentinelSet {
    pub master: Node,
    pub replica: Node,
    pub sentinels: Vec<Node>,
    /// redis-cli's TLS arguments when everything speaks only TLS.
    cli_tls: Vec<String>,
    _dir: tempfile::TempDir,
}

pub const SENTINEL_MASTER: &str = "mymaster";

impl SentinelSet {
    pub fn start() -> SentinelSet {
        SentinelSet::start_with(None)
    }

    /// Master, replica and sentinels all speaking only TLS (replication too), with `certs`.
    pub fn start_tls(certs: &Certs) -> SentinelSet {
        SentinelSet::start_with(Some(certs))
    }

    fn start_with(certs: Option<&Certs>) -> SentinelSet {
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = |name: &str| {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            d
        };
        let cli_tls = cli_tls_of(certs);
        // As arguments (data nodes) or config lines (sentinels).
        let tls_settings = |port: u16| -> Vec<(String, String)> {
            certs.map_or_else(Vec::new, |c| {
                vec![
                    ("port".into(), "0".into()),
                    ("tls-port".into(), port.to_string()),
                    ("tls-replication".into(), "yes".into()),
                    ("tls-auth-clients".into(), "no".into()),
                    ("tls-cert-file".into(), c.path("server.pem")),
                    ("tls-key-file".into(), c.path("server.key")),
                    ("tls-ca-cert-file".into(), c.path("ca.pem")),
                ]
            })
        };
        let as_args = |port: u16, mut extra: Vec<String>| {
            for (k, v) in tls_settings(port) {
                extra.push(format!("--{k}"));
                extra.push(v);
            }
            extra
        };
        let tls = strs(&cli_tls);
        let master = Node::spawn(&sub("master"), &tls, |port| as_args(port, vec![]));
        let replica = Node::spawn(&sub("replica"), &tls, |port| {
            as_args(
                port,
                vec![
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    master.port.to_string(),
                ],
            )
        });
        let sentinels = (0..3)
            .map(|i| {
                let d = sub(&format!("sentinel{i}"));
                let conf = d.join("sentinel.conf");
                Node::start(&tls, |port| {
                    let tls: String = tls_settings(port)
                        .into_iter()
                        .map(|(k, v)| format!("{k} {v}\n"))
                        .collect();
                    std::fs::write(
                        &conf,
                        format!(
                            "port {port}\nbind 127.0.0.1\ndir {}\n{tls}\
                         sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {} 2\n\
                         sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                         sentinel failover-timeout {SENTINEL_MASTER} 5000\n",
                            d.display(),
                            master.port
                        ),
                    )
                    .unwrap();
                    let mut c = Command::new("redis-server");
                    c.arg(&conf).arg("--sentinel");
                    c
                })
            })
            .collect::<Vec<_>>();
        let set = SentinelSet {
            master,
            replica,
            sentinels,
            cli_tls,
            _dir: dir,
        };
        let tls = set.tls();
        // Ready when the replica is in sync and every sentinel knows the master, the replica and
        // the other sentinels.
        wait_until(Duration::from_secs(20), || {
            cli(set.replica.port, &tls, &["INFO", "replication"])
                .is_some_and(|i| i.contains("master_link_status:up"))
        });
        for s in &set.sentinels {
            wait_until(Duration::from_secs(20), || {
                let m =
                    cli(s.port, &tls, &["SENTINEL", "MASTER", SENTINEL_MASTER]).unwrap_or_default();
                let lines: Vec<&str> = m.lines().collect();
                let field = |name: &str| {
                    lines
                        .iter()
                        .position(|l| *l == name)
                        .and_then(|i| lines.get(i + 1).copied())
                };
                field("num-slaves") == Some("1") && field("num-other-sentinels") == Some("2")
            });
        }
        set
    }

    fn tls(&self) -> Vec<&str> {
        strs(&self.cli_tls)
    }

    /// The sentinels' URLs, comma-separated.
    pub fn url(&self) -> String {
        url_list(&self.cli_tls, self.sentinels.iter().map(|s| s.port))
    }

    /// The port the sentinels name as master now.
    pub fn master_port(&self) -> Option<u16> {
        let s = self.sentinels.iter().find(|s| s.is_running())?;
        let out = cli(
            s.port,
            &self.tls(),
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER],
        )?;
        out.lines().nth(1)?.trim().parse().ok()
    }
}
