//! start: what every command that starts a server shares: the one error it may fail with, and
//! binding a listener so that the error names the address.

use std::net::SocketAddr;

use quotagate_engine::catalog::CatalogError;
use quotagate_store::StoreError;
use tokio::net::TcpListener;

use crate::config::ConfigError;

/// Why quotagate could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start {what}: {source}")]
    Runtime {
        what: &'static str,
        source: std::io::Error,
    },
}

/// An error and its causes on one line (`a: b: c`): reqwest's own message is often just
/// "builder error", its cause the useful part (say, no CA certificates on the system).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// Binds a listener, turning the OS error into a start-up error that names the address.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| StartError::Listen { addr, source })?;
    Ok((listener, local))
}
