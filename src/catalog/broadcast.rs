//! broadcast: instances sharing a Redis tell each other about new catalog versions.
//!
//! An instance that applies a version publishes its hash on a Redis channel; every instance listens
//! and, on a hash it does not serve, wakes its poller to fetch at once instead of waiting for its
//! next poll. Losing the channel only means falling back to polling; the listener reconnects with
//! backoff and logs the loss and the return once each.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::live::Live;
use super::poller::Announce;
use crate::store::RedisStore;

/// Publishes applied versions through the Redis store's connection.
pub struct RedisAnnounce {
    pub store: Arc<RedisStore>,
    pub channel: String,
}

impl Announce for RedisAnnounce {
    fn announce(&self, hash: &str) {
        let (store, channel, hash) = (self.store.clone(), self.channel.clone(), hash.to_owned());
        tokio::spawn(async move {
            if let Err(e) = store.publish(&channel, &hash).await {
                tracing::debug!(error = %e, "could not announce the catalog version; other instances will poll");
            }
        });
    }
}

/// Listens on `channel` until `shutdown`, waking the poller for versions this instance lacks. The
/// subscription has a connection of its own, to the server, the master (sentinel) or a seed node
/// (cluster: a plain `PUBLISH` reaches every node).
pub async fn listen(
    store: Arc<RedisStore>,
    channel: String,
    live: Arc<Live>,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_millis(500);
    let mut lost = false;
    loop {
        let subscribed = async {
            let client = store.pubsub_client().await.map_err(|e| e.to_string())?;
            let mut pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
            pubsub
                .subscribe(&channel)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(pubsub)
        };
        let outcome = tokio::select! {
            r = subscribed => r,
            () = shutdown.cancelled() => return,
        };
        match outcome {
            Ok(mut pubsub) => {
                if lost {
                    tracing::info!(%channel, "catalog announcements: subscribed again");
                    lost = false;
                }
                backoff = Duration::from_millis(500);
                let mut messages = pubsub.on_message();
                loop {
                    let msg = tokio::select! {
                        m = messages.next() => m,
                        () = shutdown.cancelled() => return,
                    };
                    let Some(msg) = msg else { break };
                    let hash: String = msg.get_payload().unwrap_or_default();
                    if hash != live.snapshot().version.hash {
                        tracing::debug!(%hash, "another instance applied a catalog version; fetching");
                        live.wake();
                    }
                }
                if !lost {
                    tracing::warn!(%channel, "catalog announcements lost; polling only until they are back");
                    lost = true;
                }
            }
            Err(e) => {
                if !lost {
                    tracing::warn!(error = %e, %channel, "cannot subscribe to catalog announcements; polling only until it can");
                    lost = true;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shutdown.cancelled() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}
