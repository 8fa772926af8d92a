//! settings: a listener's limits, and where its connections run.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{ConfigError, ServerConfig, positive_ms};
use crate::server::workers::Workers;

/// Connection-level limits of an HTTP listener.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Time a new connection has to send its first request's headers (with TLS: its first byte,
    /// then the handshake), and each HTTP/1 request's headers from their first byte. Default: 10 s.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight and nothing sent. Default:
    /// 75 s.
    pub keep_alive_timeout: Duration,
    /// Largest request header section, in bytes (HTTP/1 read buffer, HTTP/2 header list). Default: 64 KiB.
    pub max_header_bytes: usize,
    /// Header lines a request may have (HTTP/1; HTTP/2 is bounded by its header list's bytes).
    /// Default: 100.
    pub max_headers: usize,
    /// Open connections at most; more wait in the kernel's accept queue. Default: 10000.
    pub max_connections: usize,
    /// How long in-flight requests may take to finish after shutdown begins. Default: 10 s.
    pub drain_timeout: Duration,
    /// TLS on this listener (`server.tls_*`). Default: none, cleartext.
    pub tls: Option<crate::server::tls::TlsSettings>,
    /// Fields the handler hands on unread: the own HTTP/1.1 server gives them to it as lines
    /// beside the body, not in the request's map ([`crate::server::passed::Passes`]). Default: none,
    /// every field in the map. Not a setting: the proxy sets its own ([`crate::proxy`]).
    pub passes: Option<Arc<crate::server::passed::Passes>>,
}

/// Where a listener's connections run and what counts them: runtime objects, handed to
/// [`serve`] beside the settings. The default serves on the caller's runtime, uncounted.
#[derive(Clone, Default)]
pub struct Executor {
    /// Serve connections on these single-threaded workers (see [`crate::server::workers`]); `None`: on
    /// the caller's runtime. The gateway uses `server.workers`, one per core by default.
    pub workers: Option<Arc<Workers>>,
    /// Counts open connections, when given (a metric).
    pub open_connections: Option<prometheus_client::metrics::gauge::Gauge>,
    /// Speak TLS on every connection, with these certificates ([`crate::server::tls::Tls`]).
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("workers", &self.workers)
            .field("open_connections", &self.open_connections)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// The defaults are `[server]`'s, written once in `config/mod.rs`.
impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings::try_from(&ServerConfig::default()).expect("the [server] defaults are valid")
    }
}

impl TryFrom<&ServerConfig> for HttpSettings {
    type Error = ConfigError;

    /// The proxy listener's limits (`[server]`).
    fn try_from(c: &ServerConfig) -> Result<Self, ConfigError> {
        if c.max_header_bytes < 8192 {
            return Err(ConfigError::option(
                "server.max_header_bytes",
                "must be at least 8192",
            ));
        }
        if !(1..=10_000).contains(&c.max_headers) {
            return Err(ConfigError::option(
                "server.max_headers",
                "must be from 1 to 10000",
            ));
        }
        if c.max_connections == 0 {
            return Err(ConfigError::option(
                "server.max_connections",
                "must be at least 1",
            ));
        }
        Ok(HttpSettings {
            header_read_timeout: positive_ms(
                "server.header_read_timeout_ms",
                c.header_read_timeout_ms,
            )?,
            keep_alive_timeout: positive_ms(
                "server.keep_alive_timeout_ms",
                c.keep_alive_timeout_ms,
            )?,
            max_header_bytes: c.max_header_bytes,
            max_headers: c.max_headers,
            max_connections: c.max_connections,
            drain_timeout: positive_ms("server.drain_timeout_ms", c.drain_timeout_ms)?,
            tls: tls_settings(c)?,
            passes: None,
        })
    }
}

/// `server.tls_*`.
fn tls_settings(c: &ServerConfig) -> Result<Option<crate::server::tls::TlsSettings>, ConfigError> {
    listener_tls(
        "server",
        &c.tls_cert_file,
        &c.tls_key_file,
        &c.tls_client_ca_file,
        &c.tls_client_san,
    )
}

/// A listener's `<section>.tls_cert_file`, `tls_key_file`, `tls_client_ca_file` and
/// `tls_client_san`: comma-separated lists of equal length, or all empty (cleartext).
pub fn listener_tls(
    section: &str,
    cert_files: &str,
    key_files: &str,
    client_ca_file: &str,
    client_san: &str,
) -> Result<Option<crate::server::tls::TlsSettings>, ConfigError> {
    let list = |s: &str| -> Vec<std::path::PathBuf> {
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(Into::into)
            .collect()
    };
    let (certs, keys) = (list(cert_files), list(key_files));
    let client_ca = (!client_ca_file.trim().is_empty())
        .then(|| std::path::PathBuf::from(client_ca_file.trim()));
    let client_san = match client_san.trim() {
        "" => None,
        _ if client_ca.is_none() => {
            return Err(ConfigError::option(
                format!("{section}.tls_client_san"),
                format!(
                    "needs {section}.tls_client_ca_file (the CA that signs the client certificates)"
                ),
            ));
        }
        name => Some(
            rustls::pki_types::ServerName::try_from(name.to_owned()).map_err(|_| {
                ConfigError::option(
                    format!("{section}.tls_client_san"),
                    format!("{name:?} is neither a DNS name nor an IP address"),
                )
            })?,
        ),
    };
    if certs.is_empty() && keys.is_empty() {
        return match client_ca {
            None => Ok(None),
            Some(_) => Err(ConfigError::option(
                format!("{section}.tls_client_ca_file"),
                format!("needs {section}.tls_cert_file and {section}.tls_key_file"),
            )),
        };
    }
    if certs.len() != keys.len() {
        return Err(ConfigError::option(
            format!("{section}.tls_key_file"),
            format!(
                "lists {} keys for {} certificate files ({section}.tls_cert_file); give one key per certificate, in the same order",
                keys.len(),
                certs.len()
            ),
        ));
    }
    Ok(Some(crate::server::tls::TlsSettings {
        pairs: certs.into_iter().zip(keys).collect(),
        client_ca,
        client_san,
    }))
}
