//! announce: short messages between the instances that share a Redis (the catalog versions they
//! applied), over Redis pub/sub.
//!
//! Separate from [`RedisStore`](crate::RedisStore) on purpose: announcements use connections of
//! their own (one for publishing, opened on first use and again after it breaks; one per
//! subscription), so a slow subscriber or a burst of messages never queues behind, or in front of,
//! the counters' hot-path commands, and the counter store owes nothing to the catalog.

use std::time::Duration;

use futures_util::{Stream, StreamExt};

use crate::connect::{Conn, Connector, RedisTarget};
use crate::error::StoreError;

/// Publishes on and subscribes to Redis channels of the deployment `target` names.
pub struct Announcer {
    target: RedisTarget,
    connector: Connector,
    timeout: Duration,
    /// The publishing connection; `None` until first used and after it broke.
    publisher: tokio::sync::Mutex<Option<Conn>>,
}

impl std::fmt::Debug for Announcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Announcer")
            .field("target", &self.target.shown())
            .finish_non_exhaustive()
    }
}

impl Announcer {
    /// An announcer for `target`; `timeout` bounds each publish, connecting included. Nothing is
    /// sent until the first call.
    pub fn new(target: &RedisTarget, timeout: Duration) -> Result<Announcer, StoreError> {
        Ok(Announcer {
            target: target.clone(),
            connector: Connector::new(target, timeout).map_err(StoreError::config)?,
            timeout,
            publisher: tokio::sync::Mutex::new(None),
        })
    }

    /// Publishes `message` on `channel` (on a cluster, a plain `PUBLISH` reaches every node).
    pub async fn publish(&self, channel: &str, message: &str) -> Result<(), StoreError> {
        let publish = async {
            let mut slot = self.publisher.lock().await;
            let mut conn = match slot.take() {
                Some(c) => c,
                None => self
                    .connector
                    .connect(self.timeout)
                    .await
                    .map_err(|e| StoreError::connect(self.target.shown(), &e))?,
            };
            let mut cmd = redis::cmd("PUBLISH");
            cmd.arg(channel).arg(message);
            let sent = cmd
                .query_async::<i64>(&mut conn)
                .await
                .map_err(StoreError::redis);
            if sent.is_ok() {
                *slot = Some(conn);
            }
            sent.map(drop)
        };
        tokio::time::timeout(self.timeout, publish)
            .await
            .unwrap_or_else(|_| Err(StoreError::timeout()))
    }

    /// Subscribes to `channel` on a connection of its own, to the server, the master (sentinel) or
    /// the first seed node that answers (cluster). The stream yields each message's text and ends
    /// when the connection is lost; the caller subscribes again.
    pub async fn subscribe(
        &self,
        channel: &str,
    ) -> Result<impl Stream<Item = String> + Send + use<>, StoreError> {
        let unreachable = |e: redis::RedisError| StoreError::connect(self.target.shown(), &e);
        let client = self
            .connector
            .pubsub_client(&self.target)
            .await
            .map_err(unreachable)?;
        let mut pubsub = client.get_async_pubsub().await.map_err(unreachable)?;
        pubsub.subscribe(channel).await.map_err(StoreError::redis)?;
        Ok(pubsub
            .into_on_message()
            .map(|m| m.get_payload::<String>().unwrap_or_default()))
    }
}
