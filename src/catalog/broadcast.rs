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
use quotagate_store::Announcer;

/// Publishes applied versions on `channel`.
pub struct RedisAnnounce {
    pub announcer: Arc<Announcer>,
    pub channel: String,
}

impl Announce for RedisAnnounce {
    fn announce(&self, hash: &str) {
        let (announcer, channel, hash) = (
            self.announcer.clone(),
            self.channel.clone(),
            hash.to_owned(),
        );
        tokio::spawn(async move {
            if let Err(e) = announcer.publish(&channel, &hash).await {
                tracing::debug!(error = %e, "could not announce the catalog version; other instances will poll");
            }
        });
    }
}

/// Listens on `channel` until `shutdown`, waking the poller for versions this instance lacks.
pub async fn listen(
    announcer: Arc<Announcer>,
    channel: String,
    live: Arc<Live>,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_millis(500);
    let mut lost = false;
    loop {
        let outcome = tokio::select! {
            r = announcer.subscribe(&channel) => r,
            () = shutdown.cancelled() => return,
        };
        match outcome {
            Ok(messages) => {
                if lost {
                    tracing::info!(%channel, "catalog announcements: subscribed again");
                    lost = false;
                }
                backoff = Duration::from_millis(500);
                let mut messages = std::pin::pin!(messages);
                loop {
                    let msg = tokio::select! {
                        m = messages.next() => m,
                        () = shutdown.cancelled() => return,
                    };
                    let Some(hash) = msg else { break };
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
