//! shutdown: one signal fanned out to every server and background task.

use tokio_util::sync::CancellationToken;

/// Cancelled once, on SIGTERM or SIGINT (or by a test); clones share it.
pub type Token = CancellationToken;

/// Waits for SIGTERM or SIGINT, then cancels `token`.
pub async fn on_signal(token: Token) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown signal received: no new connections, draining in-flight requests");
    token.cancel();
}
