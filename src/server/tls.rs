//! tls: the gateway listener's TLS (rustls): several certificates chosen by the client's SNI,
//! replaced without a restart when their files change, and client certificates when asked.
//!
//! A certificate is served for the names in its subjectAltName (`*.example.com` covers one label);
//! a client whose SNI matches none, or sends none, gets the first. The watcher looks at the files
//! every [`WATCH_INTERVAL`] and on SIGHUP; a pair that no longer loads keeps the certificate in
//! service, logs one line naming the file and the problem, and counts in
//! `quotagate_tls_reload_failures_total`. Connections already open keep the session they have: a
//! reload only changes what new handshakes get.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use quotagate_engine::clock::Clock;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

/// How often certificate files are looked at. Default: 1 s.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// Largest certificate or key file read. Default: 1 MiB.
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// The listener's TLS settings (`server.tls_*`), checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// (certificate chain, key) pairs, in the order given; the first is the default.
    pub pairs: Vec<(PathBuf, PathBuf)>,
    /// Require client certificates signed by these CAs (`server.tls_client_ca_file`).
    pub client_ca: Option<PathBuf>,
    /// ... and valid for this name (`server.tls_client_san`): a DNS name or an IP address.
    pub client_san: Option<ServerName<'static>>,
}

/// Why a certificate pair (or the client CA file) could not be used: the file and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", file.display())]
pub struct TlsFileError {
    pub file: PathBuf,
    pub reason: String,
}

pub(crate) fn problem(file: &Path, reason: impl Into<String>) -> TlsFileError {
    TlsFileError {
        file: file.to_owned(),
        reason: reason.into(),
    }
}

/// One certificate in service.
#[derive(Debug)]
struct Served {
    /// DNS names from its subjectAltName, lowercase; `*.` prefixes are wildcards.
    names: Vec<String>,
    key: Arc<CertifiedKey>,
    /// Unix seconds.
    not_after: i64,
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    // The suites hashed with SHA-256 first (the server's order wins, see `Tls::new`): a TLS 1.3
    // handshake runs some thirty HMACs in its key schedule, and HMAC-SHA-384 cost a fifth of the
    // CPU of a handshake here (SHA-512 has no instruction of its own; SHA-256 has SHA-NI).
    p.cipher_suites
        .sort_by_key(|s| s.suite().as_str().is_some_and(|n| n.contains("SHA384")));
    Arc::new(p)
}

/// The certificates of a PEM file, at least one.
pub(crate) fn read_chain(file: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let pem = crate::config::files::read_capped(file, MAX_PEM_BYTES)
        .map_err(|e| problem(file, e.to_string()))?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| problem(file, format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(problem(file, "holds no certificate"));
    }
    Ok(chain)
}

/// The private key of a PEM file.
pub(crate) fn read_key(file: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    let pem = crate::config::files::read_capped(file, MAX_PEM_BYTES)
        .map_err(|e| problem(file, e.to_string()))?;
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| problem(file, format!("not a PEM private key: {e}")))
}

/// The CA certificates of a PEM file, as trust roots.
pub(crate) fn read_roots(file: &Path) -> Result<rustls::RootCertStore, TlsFileError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_chain(file)? {
        roots
            .add(c)
            .map_err(|e| problem(file, format!("not a CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// Loads one pair: the chain, the key, that they match, and the leaf's names and expiry.
fn load_pair(cert: &Path, key: &Path) -> Result<Served, TlsFileError> {
    let chain = read_chain(cert)?;
    let leaf = &chain[0];
    let signing = provider()
        .key_provider
        .load_private_key(read_key(key)?)
        .map_err(|e| problem(key, format!("unusable private key: {e}")))?;
    let certified = CertifiedKey::new(chain.clone(), signing);
    certified
        .keys_match()
        .map_err(|_| problem(cert, format!("does not match its key {}", key.display())))?;
    let (_, x509) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| problem(cert, format!("unreadable certificate: {e}")))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = x509.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                names.push(d.to_ascii_lowercase());
            }
        }
    }
    Ok(Served {
        names,
        key: Arc::new(certified),
        not_after: x509.validity().not_after.timestamp(),
    })
}

/// Does `sni` (lowercase) fall under `name` (`*.x` covers exactly one label)?
fn covers(name: &str, sni: &str) -> bool {
    match name.strip_prefix("*.") {
        Some(base) => sni
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == base),
        None => name == sni,
    }
}

/// The certificates in service, chosen per handshake by SNI.
#[derive(Debug)]
struct Resolver {
    served: ArcSwap<Vec<Served>>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let served = self.served.load();
        let chosen = hello.server_name().and_then(|sni| {
            let sni = sni.to_ascii_lowercase();
            served
                .iter()
                .find(|s| s.names.iter().any(|n| covers(n, &sni)))
        });
        chosen.or_else(|| served.first()).map(|s| s.key.clone())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertLabels {
    cert_file: String,
}

/// The TLS side of the listener: what accepts handshakes, and what reloads its certificates.
pub struct Tls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    resolver: Arc<Resolver>,
    settings: TlsSettings,
    expiry: Family<CertLabels, Gauge>,
    failures: Counter,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("settings", &self.settings)
            .finish()
    }
}

/// Client certificates that the CA signed and that are valid for one name, as envoyproxy/ratelimit's
/// `GRPC_CLIENT_TLS_SAN` asks (Go's `x509.VerifyOptions.DNSName`): the chain is checked first,
/// then the end certificate's subjectAltName against the name (webpki's own matching, wildcards
/// as in server certificates).
#[derive(Debug)]
struct NamedClient {
    chain: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for NamedClient {
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .chain
            .verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        cert.verify_is_valid_for_subject_name(&self.name)
            .map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            })?;
        Ok(verified)
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.chain.supported_verify_schemes()
    }

    fn offer_client_auth(&self) -> bool {
        self.chain.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.chain.client_auth_mandatory()
    }
}

impl Tls {
    /// Loads every pair (any problem refuses the start, naming the file) and the client CA.
    /// The listener's TLS from `settings`; `clock` tells the certificates' expiry metric now.
    pub fn new(settings: &TlsSettings, clock: Arc<dyn Clock>) -> Result<Tls, TlsFileError> {
        let served = settings
            .pairs
            .iter()
            .map(|(c, k)| load_pair(c, k))
            .collect::<Result<Vec<_>, _>>()?;
        let resolver = Arc::new(Resolver {
            served: ArcSwap::from_pointee(served),
        });
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| problem(&settings.pairs[0].0, e.to_string()))?;
        let builder = match &settings.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let roots = read_roots(ca)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|e| problem(ca, e.to_string()))?;
                match &settings.client_san {
                    None => builder.with_client_cert_verifier(verifier),
                    Some(name) => builder.with_client_cert_verifier(Arc::new(NamedClient {
                        chain: verifier,
                        name: name.clone(),
                    })),
                }
            }
        };
        let mut config = builder.with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config.ignore_client_order = true;
        // One ticket per handshake, as OpenSSL sends after a resumption (rustls: 2 by default):
        // each costs an encryption and a record on every new connection.
        config.send_tls13_tickets = 1;
        // Resumption by stateless tickets (AES-256 and HMAC-SHA256 under keys made at start and
        // rotated every 6 hours, a ticket good for 12), as nginx resumes by default: rustls'
        // default is a cache of 256 sessions, so with more clients than that coming and going a
        // returning one mostly paid a full handshake (a signature, the certificate) again.
        config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()
            .map_err(|e| problem(&settings.pairs[0].0, format!("session tickets: {e}")))?;
        let tls = Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            resolver,
            settings: settings.clone(),
            expiry: Family::default(),
            failures: Counter::default(),
            clock,
        };
        tls.update_expiry();
        Ok(tls)
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "quotagate_tls_certificate_expiry_seconds",
            "Seconds until each served certificate expires (negative: expired)",
            self.expiry.clone(),
        );
        registry.register(
            "quotagate_tls_reload_failures",
            "Certificate files that changed but could not be loaded (the old certificate stays)",
            self.failures.clone(),
        );
    }

    fn update_expiry(&self) {
        let now = i64::try_from(self.clock.now()).unwrap_or(i64::MAX);
        for ((cert, _), s) in self
            .settings
            .pairs
            .iter()
            .zip(self.resolver.served.load().iter())
        {
            let labels = CertLabels {
                cert_file: cert.display().to_string(),
            };
            self.expiry.get_or_create(&labels).set(s.not_after - now);
        }
    }

    /// Reloads every pair; one that fails keeps what it served, logged and counted.
    pub fn reload(&self) {
        let old = self.resolver.served.load();
        let mut next = Vec::with_capacity(old.len());
        for ((cert, key), previous) in self.settings.pairs.iter().zip(old.iter()) {
            match load_pair(cert, key) {
                Ok(s) => next.push(s),
                Err(e) => {
                    tracing::warn!(file = %e.file.display(), problem = %e.reason, "certificate not reloaded; the one in service stays");
                    self.failures.inc();
                    next.push(Served {
                        names: previous.names.clone(),
                        key: previous.key.clone(),
                        not_after: previous.not_after,
                    });
                }
            }
        }
        self.resolver.served.store(Arc::new(next));
        self.update_expiry();
    }

    /// Reloads when a certificate or key file changes (looked at every [`WATCH_INTERVAL`]) and on
    /// SIGHUP, until dropped.
    pub async fn watch(self: Arc<Self>) {
        let files: Vec<PathBuf> = self
            .settings
            .pairs
            .iter()
            .flat_map(|(c, k)| [c.clone(), k.clone()])
            .collect();
        let mut seen = fingerprint(&files);
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut tick = tokio::time::interval(WATCH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let signalled = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = async { match &mut hangup { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            };
            let now = fingerprint(&files);
            if signalled || now != seen {
                seen = now;
                self.reload();
            } else {
                self.update_expiry();
            }
        }
    }
}

/// Each file's size, modification time and inode: a change in any is a change.
fn fingerprint(files: &[PathBuf]) -> Vec<Option<(u64, Option<SystemTime>, u64)>> {
    use std::os::unix::fs::MetadataExt;
    files
        .iter()
        .map(|f| {
            std::fs::metadata(f)
                .ok()
                .map(|m| (m.len(), m.modified().ok(), m.ino()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::covers;

    #[test]
    fn wildcards_cover_one_label() {
        assert!(covers("a.test", "a.test"));
        assert!(!covers("a.test", "b.a.test"));
        assert!(covers("*.b.test", "x.b.test"));
        assert!(!covers("*.b.test", "b.test"));
        assert!(!covers("*.b.test", "y.x.b.test"));
        assert!(!covers("*.b.test", ".b.test"));
    }
}
