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
///
/// The socket has `SO_REUSEPORT`, so that each worker can listen on the address with a socket of
/// its own ([`crate::server::workers::accept`]). That option alone would also let another process of the
/// same user (a second quotagate started by mistake) bind the address and silently take a share
/// of the connections, so the address is first bound without it: anything already there makes
/// this fail, as a plain bind would.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let listen = |source| StartError::Listen { addr, source };
    let probe = crate::server::workers::socket(addr).map_err(listen)?;
    probe.bind(addr).map_err(listen)?;
    // With port 0 the probe picked the port; the listener takes the same one.
    let local = probe.local_addr().map_err(listen)?;
    drop(probe);
    let listener = crate::server::workers::listen(local).map_err(listen)?;
    Ok((listener, local))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_address_in_use_is_refused_even_by_another_shared_listener() {
        let (_first, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let err = bind(addr).await.unwrap_err();
        assert!(
            matches!(&err, StartError::Listen { addr: a, source } if *a == addr
                && source.kind() == std::io::ErrorKind::AddrInUse),
            "{err:?}"
        );
        // A plain listener is refused too.
        assert!(std::net::TcpListener::bind(addr).is_err());
    }
}
