//! shutdown: one signal fanned out to every server and background task.

use tokio_util::sync::CancellationToken;

/// Cancelled once, on SIGTERM or SIGINT (or by a test); clones share it.
pub type Token = CancellationToken;

/// Installs the SIGTERM and SIGINT handlers now, before anything says it is listening (a signal
/// that arrives before its handler would kill the process with the default action), and returns a
/// token that is cancelled when one of them arrives. Call it inside the runtime.
pub fn on_signal() -> Token {
    let token = Token::new();
    let cancel = token.clone();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        tokio::spawn(async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
            announce(&cancel);
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        announce(&cancel);
    });
    token
}

fn announce(token: &Token) {
    tracing::info!("shutdown signal received: no new connections, draining in-flight requests");
    token.cancel();
}
