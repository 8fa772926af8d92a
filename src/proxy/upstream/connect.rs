//! connect: opening a connection to one target: TCP, TLS when the target is `https://` (ALPN
//! choosing the HTTP version when allowed), and the HTTP/1.1 or HTTP/2 handshake, whose task then
//! runs on the current worker.

use std::sync::Arc;
use std::time::Duration;

use http_body::Body;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::raw::RawConn;
use super::settings::{ClientTlsSettings, TargetUrl};
use crate::server::tls::TlsFileError;

/// Which HTTP versions a new connection may speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speak {
    Http1,
    H2,
    /// Whatever ALPN agrees on (TLS only; cleartext is HTTP/1.1).
    Either,
}

/// A connection ready for requests.
pub enum Sender<B> {
    Http1(http1::SendRequest<B>),
    H2(http2::SendRequest<B>),
}

/// Why a connection could not be made; nothing was sent.
#[derive(Debug)]
pub struct ConnectError {
    /// The connect timeout passed (a timeout for passive health, as a refusal is).
    pub timed_out: bool,
    /// For the log and the client's problem detail: "connection refused", "invalid peer
    /// certificate: Expired".
    pub reason: String,
}

impl ConnectError {
    fn new(reason: impl std::fmt::Display) -> ConnectError {
        ConnectError {
            timed_out: false,
            reason: reason.to_string(),
        }
    }
}

/// The TLS client configurations, one per set of ALPN protocols offered.
#[derive(Clone)]
pub struct ClientTls {
    http1: Arc<rustls::ClientConfig>,
    h2: Arc<rustls::ClientConfig>,
    either: Arc<rustls::ClientConfig>,
    /// `upstream.tls_server_name`, parsed.
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Reads the CA and client certificate files (a problem names the file).
    pub fn new(s: &ClientTlsSettings) -> Result<ClientTls, TlsFileError> {
        let provider = crate::server::tls::provider();
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| {
                crate::server::tls::problem(std::path::Path::new("upstream"), e.to_string())
            })?;
        let builder = if s.insecure_skip_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        } else {
            let roots = match &s.ca {
                Some(ca) => crate::server::tls::read_roots(ca)?,
                None => system_roots(),
            };
            builder.with_root_certificates(roots)
        };
        let config = match &s.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    crate::server::tls::read_chain(cert)?,
                    crate::server::tls::read_key(key)?,
                )
                .map_err(|e| {
                    crate::server::tls::problem(cert, format!("unusable with its key: {e}"))
                })?,
        };
        let with = |alpn: &[&[u8]]| {
            let mut c = config.clone();
            c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Arc::new(c)
        };
        Ok(ClientTls {
            http1: with(&[b"http/1.1"]),
            h2: with(&[b"h2"]),
            either: with(&[b"h2", b"http/1.1"]),
            server_name: s
                .server_name
                .as_deref()
                .and_then(|n| ServerName::try_from(n.to_owned()).ok()),
        })
    }
}

/// The system's trust roots (rustls-native-certs); unreadable ones are skipped.
fn system_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!(error = %e, "a system CA certificate could not be read");
    }
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        tracing::warn!(
            "no system CA certificates found: https:// upstreams cannot be verified (set upstream.tls_ca_file)"
        );
    }
    roots
}

/// `upstream.tls_insecure_skip_verify`: any certificate, any name. The handshake's own signature
/// is still checked, so the peer holds the key of the certificate it sent.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// How connections are opened.
#[derive(Debug, Clone)]
pub struct Connector {
    pub tls: Option<ClientTls>,
    pub timeout: Duration,
    /// Largest response header section (HTTP/1.1) or header list (HTTP/2).
    pub max_header_bytes: usize,
}

impl Connector {
    /// Opens a connection to `target` speaking `speak`, and starts its task.
    pub async fn connect<B>(
        &self,
        target: &TargetUrl,
        speak: Speak,
    ) -> Result<Sender<B>, ConnectError>
    where
        B: Body + Send + Unpin + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let opened = async {
            let tcp = tcp(target.authority.as_str()).await?;
            if !target.tls {
                return self.handshake(tcp, speak == Speak::H2).await;
            }
            let tls = self.tls_to(target, tcp, speak).await?;
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            self.handshake(tls, h2).await
        };
        tokio::time::timeout(self.timeout, opened)
            .await
            .unwrap_or_else(|_| Err(self.timed_out()))
    }

    /// A cleartext TCP connection to `target` for the gateway's own HTTP/1.1 exchange.
    pub async fn connect_raw(&self, target: &TargetUrl) -> Result<RawConn, ConnectError> {
        match tokio::time::timeout(self.timeout, tcp(target.authority.as_str())).await {
            Ok(tcp) => tcp.map(RawConn::new),
            Err(_) => Err(self.timed_out()),
        }
    }

    fn timed_out(&self) -> ConnectError {
        ConnectError {
            timed_out: true,
            reason: format!("no connection within {} ms", self.timeout.as_millis()),
        }
    }

    /// The TLS handshake over `tcp`, offering the ALPN protocols of `speak`.
    async fn tls_to(
        &self,
        target: &TargetUrl,
        tcp: TcpStream,
        speak: Speak,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ConnectError> {
        let tls = self
            .tls
            .as_ref()
            .ok_or_else(|| ConnectError::new("TLS is not configured"))?;
        let config = match speak {
            Speak::Http1 => &tls.http1,
            Speak::H2 => &tls.h2,
            Speak::Either => &tls.either,
        };
        let name = match &tls.server_name {
            Some(n) => n.clone(),
            None => ServerName::try_from(target.hostname().to_owned())
                .map_err(|_| ConnectError::new("the host is not a valid TLS name"))?,
        };
        tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| ConnectError::new(format!("TLS handshake failed: {e}")))
    }

    /// The HTTP handshake; the connection's task runs on the current worker. Generic over the
    /// stream so that cleartext connections pay no dynamic dispatch per read and write.
    async fn handshake<B, T>(&self, io: T, h2: bool) -> Result<Sender<B>, ConnectError>
    where
        B: Body + Send + Unpin + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let io = TokioIo::new(io);
        if h2 {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .max_header_list_size(self.max_header_bytes.min(u32::MAX as usize) as u32)
                .handshake(io)
                .await
                .map_err(|e| ConnectError::new(format!("HTTP/2 handshake failed: {e}")))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "upstream HTTP/2 connection closed");
                }
            });
            return Ok(Sender::H2(sender));
        }
        let (sender, conn) = http1::Builder::new()
            .max_buf_size(self.max_header_bytes.max(8192))
            .handshake(io)
            .await
            .map_err(ConnectError::new)?;
        tokio::spawn(async move {
            // With upgrades: a 101 hands the connection over (`crate::proxy::upgrade`).
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection closed");
            }
        });
        Ok(Sender::Http1(sender))
    }
}

/// The first address of `authority` that accepts a connection.
async fn tcp(authority: &str) -> Result<TcpStream, ConnectError> {
    let mut last = ConnectError::new("the name resolves to no address");
    let addrs = tokio::net::lookup_host(authority)
        .await
        .map_err(|e| ConnectError::new(format!("cannot resolve the name: {e}")))?;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = ConnectError::new(e),
        }
    }
    Err(last)
}
