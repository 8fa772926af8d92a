//! connect: where the Redis store's connections come from, in each deployment mode.
//!
//! - `single`: one server (`redis://`, `rediss://` or `redis+unix://`); one multiplexed connection
//!   per worker.
//! - `cluster`: Redis Cluster from a comma-separated list of seed nodes; the redis crate's cluster
//!   connection routes each command by slot, follows `MOVED`/`ASK` and refreshes the topology.
//!   Every script call touches the keys of one API key, which share one hash tag and so one slot.
//! - `sentinel`: the URLs are the sentinels; the master named `store.sentinel_master` is asked for
//!   on every new connection, so after a failover the next connection goes to the new master.
//!
//! TLS (`rediss://`) works in every mode, with `store.tls_ca_file` and, for client certificates,
//! `store.tls_cert_file` + `store.tls_key_file`. Certificates are checked unless
//! `store.tls_insecure_skip_verify` says otherwise (logged at start-up). A password from
//! `store.redis_password_file` replaces the one in the URLs; it is never logged.

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, Pipeline, RedisError, RedisFuture,
    RedisResult, Value,
};

pub use crate::target::{OptionError, RedisMode, RedisTarget, TlsFiles, redact_url};

/// Opens connections of the configured mode.
pub enum Connector {
    Single(Client),
    Cluster(ClusterClient),
    /// `SentinelClient` asks the sentinels for the master on each new connection; it needs `&mut`.
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
}

impl Connector {
    /// A connector for `target`; `timeout` bounds connecting and each command.
    pub fn new(target: &RedisTarget, timeout: Duration) -> RedisResult<Connector> {
        Ok(match target.mode {
            RedisMode::Single => {
                let node = target.nodes[0].clone();
                match &target.tls {
                    Some(certs) => Connector::Single(Client::build_with_tls(node, certs.clone())?),
                    None => Connector::Single(Client::open(node)?),
                }
            }
            RedisMode::Cluster => {
                let mut b = ClusterClientBuilder::new(target.nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    // Our own timeout bounds every call; a few quick retries inside it follow
                    // MOVED/ASK and a changed topology.
                    .retries(3)
                    .min_retry_wait(10)
                    .max_retry_wait(100);
                if let Some(p) = &target.password {
                    b = b.password(p);
                }
                if let Some(u) = &target.username {
                    b = b.username(u);
                }
                if let Some(certs) = &target.tls {
                    b = b.certs(certs.clone());
                }
                Connector::Cluster(b.build()?)
            }
            RedisMode::Sentinel => {
                let addrs = target.nodes.iter().map(|n| n.addr().clone());
                let tls_mode = target.nodes.iter().find_map(|n| match n.addr() {
                    ConnectionAddr::TcpTls { insecure, .. } => Some(if *insecure {
                        redis::TlsMode::Insecure
                    } else {
                        redis::TlsMode::Secure
                    }),
                    _ => None,
                });
                let mut b =
                    SentinelClientBuilder::new(addrs, &target.master, SentinelServerType::Master)?;
                if let Some(mode) = tls_mode {
                    b = b
                        .set_client_to_redis_tls_mode(mode)
                        .set_client_to_sentinel_tls_mode(mode);
                }
                if let Some(certs) = &target.tls {
                    b = b
                        .set_client_to_redis_certificates(certs.clone())
                        .set_client_to_sentinel_certificates(certs.clone());
                }
                if let Some(u) = &target.username {
                    b = b.set_client_to_redis_username(u);
                }
                if let Some(p) = &target.password {
                    b = b.set_client_to_redis_password(p);
                }
                Connector::Sentinel(tokio::sync::Mutex::new(b.build()?))
            }
        })
    }

    /// A new connection (to the master, in sentinel mode).
    pub async fn connect(&self, timeout: Duration) -> RedisResult<Conn> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(None);
        Ok(match self {
            Connector::Single(c) => Conn::Single(
                c.get_multiplexed_async_connection_with_config(&config)
                    .await?,
            ),
            Connector::Cluster(c) => Conn::Cluster(c.get_async_connection().await?),
            Connector::Sentinel(s) => Conn::Single(
                s.lock()
                    .await
                    .get_async_connection_with_config(&config)
                    .await?,
            ),
        })
    }

    /// A client of one data node, for a pub/sub subscription: the server, the master, or the first
    /// seed node that answers (a cluster's `PUBLISH` reaches every node).
    pub async fn pubsub_client(&self, target: &RedisTarget) -> RedisResult<Client> {
        match self {
            Connector::Single(c) => Ok(c.clone()),
            Connector::Sentinel(s) => s.lock().await.async_get_client().await,
            Connector::Cluster(_) => {
                let mut last = None;
                for node in &target.nodes {
                    let client = match &target.tls {
                        Some(certs) => Client::build_with_tls(node.clone(), certs.clone()),
                        None => Client::open(node.clone()),
                    };
                    match client {
                        Ok(c) => match c.get_multiplexed_async_connection().await {
                            Ok(_) => return Ok(c),
                            Err(e) => last = Some(e),
                        },
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    redis::RedisError::from((redis::ErrorKind::Io, "no seed node"))
                }))
            }
        }
    }
}

/// One connection of any mode: multiplexed, cheap to clone.
#[derive(Clone)]
pub enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Runs `cmd` on the node that holds `slot_key`'s slot (a keyless command such as `SCAN` would
    /// otherwise go to any node of a cluster).
    pub async fn on_slot_of(&mut self, cmd: Cmd, slot_key: &str) -> RedisResult<Value> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => {
                let route = Route::with_key(slot_key, SlotAddr::Master);
                c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
            }
        }
    }
}

impl Conn {
    /// Whether every key can be decided: a single server answers `PING`; on a cluster, the master
    /// of every slot range answers `CLUSTER INFO` with `cluster_state:ok`. (The crate's `PING` to
    /// "all primaries" asks only the nodes it holds connections to, so a dead master still named
    /// in the slot map would pass it, and the store would flap between Redis and the failure
    /// policy until the replica takes over.)
    pub async fn check_every_master(&mut self) -> RedisResult<()> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let c = match self {
            Conn::Single(c) => return redis::cmd("PING").query_async(c).await,
            Conn::Cluster(c) => c,
        };
        let slots: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(c).await?;
        let masters = slot_masters(&slots).ok_or_else(|| {
            RedisError::from((
                redis::ErrorKind::Parse,
                "CLUSTER SLOTS answered an unexpected shape",
            ))
        })?;
        if masters.is_empty() {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "the cluster assigns no slots",
            )));
        }
        for (start, master) in masters {
            // By address: routing by slot falls back to a replica or any node when the master
            // cannot be reached, which is what must not pass. A master announced without a host
            // can only be reached by slot.
            let routing = match master {
                Some((host, port)) => SingleNodeRoutingInfo::ByAddress { host, port },
                None => SingleNodeRoutingInfo::SpecificNode(Route::new(start, SlotAddr::Master)),
            };
            let info = c
                .route_command(
                    redis::cmd("CLUSTER").arg("INFO").clone(),
                    RoutingInfo::SingleNode(routing),
                )
                .await?;
            let info: String = redis::from_redis_value(info)?;
            if !info.contains("cluster_state:ok") {
                return Err(RedisError::from((
                    redis::ErrorKind::Client,
                    "a master reports cluster_state other than ok",
                )));
            }
        }
        Ok(())
    }
}

type HostPort = (String, u16);

/// Each slot range of a `CLUSTER SLOTS` reply (`[[start, end, [host, port, ...], replicas...],
/// ...]`): its first slot, and its master's host and port when it names a host. `None` for
/// another shape.
fn slot_masters(slots: &Value) -> Option<Vec<(u16, Option<HostPort>)>> {
    let Value::Array(ranges) = slots else {
        return None;
    };
    ranges
        .iter()
        .map(|r| {
            let Value::Array(r) = r else { return None };
            let start = match r.first()? {
                Value::Int(start) => u16::try_from(*start).ok()?,
                _ => return None,
            };
            let master = match r.get(2)? {
                Value::Array(node) => match (node.first()?, node.get(1)?) {
                    (Value::BulkString(host), Value::Int(port)) if !host.is_empty() => Some((
                        String::from_utf8(host.clone()).ok()?,
                        u16::try_from(*port).ok()?,
                    )),
                    _ => None,
                },
                _ => return None,
            };
            Some((start, master))
        })
        .collect()
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_masters_are_read_from_cluster_slots() {
        let node = |host: &str, port| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range =
            |start, end, master| Value::Array(vec![Value::Int(start), Value::Int(end), master]);
        let mut first = match range(0, 5460, node("127.0.0.1", 7000)) {
            Value::Array(r) => r,
            _ => unreachable!(),
        };
        first.push(node("127.0.0.1", 7003));
        let reply = Value::Array(vec![
            Value::Array(first),
            range(5461, 16383, node("", 7001)),
        ]);
        assert_eq!(
            slot_masters(&reply),
            Some(vec![(0, Some(("127.0.0.1".into(), 7000))), (5461, None)])
        );
        assert_eq!(slot_masters(&Value::Array(vec![])), Some(vec![]));
        assert_eq!(slot_masters(&Value::Okay), None);
        assert_eq!(slot_masters(&Value::Array(vec![Value::Int(1)])), None);
        let too_far = range(70000, 70001, node("h", 1));
        assert_eq!(slot_masters(&Value::Array(vec![too_far])), None);
    }
}
