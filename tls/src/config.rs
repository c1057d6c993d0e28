//! The server and client sides of TLS, built from PEM files.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::client::UnbufferedClientConnection;
use rustls::crypto::CryptoProvider;
use rustls::server::{
    ClientHello, ResolvesServerCert, UnbufferedServerConnection, WebPkiClientVerifier,
};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use crate::handshake;
use crate::record::{tls_error, Kernel};
use crate::stream::TlsStream;
use crate::{Role, Stream};

/// What can go wrong building a TLS configuration; each names the file concerned.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed. (The reason is in the message, not chained
    /// as a source, so that a report of the chain does not say it twice.)
    #[error("cannot read {what} from {path}: {reason}")]
    Pem {
        /// "certificates", "a private key".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: rustls_pki_types::pem::Error,
    },
    /// A PEM file holds none of what it must.
    #[error("{path} holds no {what}")]
    Empty {
        /// "certificate".
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A CA certificate rustls will not trust as a root.
    #[error("the CA certificate in {path} cannot be used: {source}")]
    BadCa {
        /// The CA file.
        path: PathBuf,
        /// rustls's reason.
        #[source]
        source: rustls::Error,
    },
    /// The key does not go with the certificate.
    #[error("the key in {key} does not go with the certificate in {cert}: {reason}")]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's words.
        reason: rustls::Error,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration refused: {0}")]
    Config(rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("cannot verify client certificates: {0}")]
    Verifier(rustls::server::VerifierBuilderError),
    /// A setting needs another that is unset.
    #[error("{what} needs {missing}, which is not set")]
    Incomplete {
        /// The setting given.
        what: &'static str,
        /// The setting it needs.
        missing: &'static str,
    },
}

/// Whether a TLS server asks its clients for a certificate signed by its CA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// A client may show one; if it does, it must verify against the CA.
    Optional,
    /// Every client must show one that verifies against the CA (mutual TLS); a client
    /// without one, or with one of another CA, fails the handshake.
    Required,
}

impl ClientAuth {
    /// The setting's spellings: `none`, `optional`, `required`.
    pub const CHOICES: &'static [&'static str] = &["none", "optional", "required"];

    /// From a setting's text; `None` for anything but [`ClientAuth::CHOICES`].
    #[must_use]
    pub fn parse(text: &str) -> Option<ClientAuth> {
        match text {
            "none" => Some(ClientAuth::None),
            "optional" => Some(ClientAuth::Optional),
            "required" => Some(ClientAuth::Required),
            _ => None,
        }
    }

    /// The setting's spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ClientAuth::None => "none",
            ClientAuth::Optional => "optional",
            ClientAuth::Required => "required",
        }
    }
}

/// The PEM files of a process's TLS settings; each is optional on its own.
///
/// - A server serves TLS when `cert` and `key` are set (else plaintext), and checks client
///   certificates against `ca` as its [`ClientAuth`] says.
/// - A client speaks TLS when `ca` is set, trusting servers whose certificate chains to it
///   and names the host it dialled; it shows `cert` and `key` as its own identity if set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first (PEM `CERTIFICATE` blocks).
    pub cert: Option<PathBuf>,
    /// The private key of the leaf (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// The CA certificates trusted to sign peers' certificates.
    pub ca: Option<PathBuf>,
}

/// aws-lc-rs's provider with AES-128-GCM first among the TLS 1.3 suites (rustls puts
/// AES-256-GCM first): every payload byte is encrypted and decrypted on up to five links
/// (client → master → three stores and a slave), so the cipher is a visible part of a
/// message's CPU, and AES-128 runs 10 rounds to AES-256's 14. 128-bit keys are the level
/// TLS 1.3's mandatory suite (RFC 8446 §9.1) and Go's crypto/tls choose first.
fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::aws_lc_rs::cipher_suite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    p.cipher_suites = vec![
        TLS13_AES_128_GCM_SHA256,
        TLS13_AES_256_GCM_SHA384,
        TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

const TLS13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|reason| TlsError::Pem {
            what: "certificates",
            path: path.to_owned(),
            reason,
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what: "certificate",
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|reason| TlsError::Pem {
        what: "a private key",
        path: path.to_owned(),
        reason,
    })
}

fn read_roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|source| TlsError::BadCa {
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(Arc::new(roots))
}

fn certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = read_certs(cert)?;
    let der = read_key(key)?;
    CertifiedKey::from_der(chain, der, &provider())
        .map(Arc::new)
        .map_err(|reason| TlsError::KeyMismatch {
            cert: cert.to_owned(),
            key: key.to_owned(),
            reason,
        })
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        TlsError::Config(e)
    }
}

impl From<rustls::server::VerifierBuilderError> for TlsError {
    fn from(e: rustls::server::VerifierBuilderError) -> Self {
        TlsError::Verifier(e)
    }
}

impl TlsFiles {
    /// Whether any file is named.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.cert.is_none() && self.key.is_none() && self.ca.is_none()
    }

    /// The certificate and key, if both are set.
    ///
    /// # Errors
    /// One set without the other.
    fn identity(&self) -> Result<Option<(&Path, &Path)>, TlsError> {
        match (&self.cert, &self.key) {
            (None, None) => Ok(None),
            (Some(c), Some(k)) => Ok(Some((c, k))),
            (Some(_), None) => Err(TlsError::Incomplete {
                what: "cert_file (a certificate)",
                missing: "key_file (its private key)",
            }),
            (None, Some(_)) => Err(TlsError::Incomplete {
                what: "key_file (a private key)",
                missing: "cert_file (its certificate)",
            }),
        }
    }

    /// The server side of a listener: `None` (plaintext) unless `cert` and `key` are set.
    ///
    /// # Errors
    /// A file that cannot be read or holds nothing usable; `cert` without `key` or the
    /// reverse; client certificates asked for without a `ca`; a key that does not match.
    pub fn acceptor(&self, auth: ClientAuth) -> Result<Option<TlsAcceptor>, TlsError> {
        let Some((cert, key)) = self.identity()? else {
            if auth != ClientAuth::None {
                return Err(TlsError::Incomplete {
                    what: "client_auth (optional or required: client certificates)",
                    missing: "cert_file and key_file",
                });
            }
            return Ok(None);
        };
        let (cert, key) = (cert.to_owned(), key.to_owned());
        let resolver = Arc::new(Reloading {
            current: RwLock::new(certified_key(&cert, &key)?),
            cert,
            key,
        });
        let builder =
            ServerConfig::builder_with_provider(provider()).with_protocol_versions(TLS13)?;
        let builder = match (auth, &self.ca) {
            (ClientAuth::None, _) => builder.with_no_client_auth(),
            (_, None) => {
                return Err(TlsError::Incomplete {
                    what: if auth == ClientAuth::Required {
                        "client_auth = \"required\" (a TLS listener that asks clients for certificates of ca_file; \"none\" asks for none)"
                    } else {
                        "client_auth = \"optional\" (a TLS listener that checks the certificates clients show against ca_file; \"none\" asks for none)"
                    },
                    missing: "ca_file",
                })
            }
            (ClientAuth::Optional, Some(ca)) => builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(read_roots(ca)?, provider())
                    .allow_unauthenticated()
                    .build()?,
            ),
            (ClientAuth::Required, Some(ca)) => builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(read_roots(ca)?, provider()).build()?,
            ),
        };
        let mut config = builder.with_cert_resolver(resolver.clone());
        // The record layer after the handshake is Quire's (crate::record).
        config.enable_secret_extraction = true;
        Ok(Some(TlsAcceptor {
            config: Arc::new(config),
            resolver,
            auth,
        }))
    }

    /// The client side of outgoing connections: `None` (plaintext) unless `ca` is set.
    ///
    /// # Errors
    /// A file that cannot be read or holds nothing usable; `cert` without `key` or the
    /// reverse; a key that does not match its certificate.
    pub fn connector(&self) -> Result<Option<TlsConnector>, TlsError> {
        Ok(self.client_parts()?.map(|(config, resolver)| TlsConnector {
            config,
            resolver,
            server_role: None,
        }))
    }

    /// The rustls client configuration [`TlsFiles::connector`] wraps, for a client that
    /// drives rustls itself (a blocking one): `None` unless `ca` is set. It checks no
    /// server role ([`TlsConnector::expecting`] does that after the handshake).
    ///
    /// # Errors
    /// As [`TlsFiles::connector`].
    pub fn client_config(&self) -> Result<Option<Arc<ClientConfig>>, TlsError> {
        Ok(self.client_parts()?.map(|(config, _)| config))
    }

    fn client_parts(&self) -> Result<Option<ClientParts>, TlsError> {
        let Some(ca) = &self.ca else {
            return Ok(None);
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(TLS13)?
            .with_root_certificates(read_roots(ca)?);
        let (mut config, resolver) = match self.identity()? {
            None => (builder.with_no_client_auth(), None),
            Some((cert, key)) => {
                let resolver = Arc::new(Reloading {
                    current: RwLock::new(certified_key(cert, key)?),
                    cert: cert.to_owned(),
                    key: key.to_owned(),
                });
                (
                    builder.with_client_cert_resolver(resolver.clone()),
                    Some(resolver),
                )
            }
        };
        // The record layer after the handshake is Quire's (crate::record).
        config.enable_secret_extraction = true;
        Ok(Some((Arc::new(config), resolver)))
    }
}

/// A client configuration and the client certificate it shows, if any.
type ClientParts = (Arc<ClientConfig>, Option<Arc<Reloading>>);

/// A certificate and key that a reload replaces: a server's ([`TlsAcceptor::reload`]) or a
/// client's ([`TlsConnector::reload`]).
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl fmt::Debug for Reloading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Reloading {
    fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Reads the files again; the certificate in use stays if they cannot be used.
    fn reload(&self) -> Result<(), TlsError> {
        let fresh = certified_key(&self.cert, &self.key)?;
        let mut current = match self.current.write() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        *current = fresh;
        Ok(())
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl rustls::client::ResolvesClientCert for Reloading {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The server side of TLS for one listener.
#[derive(Clone)]
pub struct TlsAcceptor {
    config: Arc<ServerConfig>,
    resolver: Arc<Reloading>,
    auth: ClientAuth,
}

impl fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsAcceptor")
            .field("cert", &self.resolver.cert)
            .field("client_auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl TlsAcceptor {
    /// Whether client certificates are asked for.
    #[must_use]
    pub fn client_auth(&self) -> ClientAuth {
        self.auth
    }

    /// Runs the server's handshake on an accepted connection, within `timeout`.
    ///
    /// # Errors
    /// [`io::ErrorKind::TimedOut`] past `timeout`; the handshake's failure (a client that is
    /// not TLS, a client certificate missing or of another CA, ...), as rustls reports it.
    pub async fn accept(&self, mut tcp: TcpStream, timeout: Duration) -> io::Result<Stream> {
        let handshake = async {
            let mut conn =
                UnbufferedServerConnection::new(self.config.clone()).map_err(tls_error)?;
            let leftover = handshake::drive(&mut conn, &mut tcp).await?;
            let peer = leaf(conn.peer_certificates());
            let (secrets, kernel) = conn.dangerous_into_kernel_connection().map_err(tls_error)?;
            TlsStream::new(tcp, secrets, Kernel::Server(kernel), leftover, peer)
        };
        match tokio::time::timeout(timeout, handshake).await {
            Ok(Ok(s)) => Ok(Stream::Tls(Box::new(s))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the TLS handshake did not finish in time",
            )),
        }
    }

    /// Reads the certificate and key files again; later handshakes present them.
    ///
    /// # Errors
    /// As [`TlsFiles::acceptor`] for those files; the certificate in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        self.resolver.reload()
    }
}

/// The client side of TLS for outgoing connections.
#[derive(Clone)]
pub struct TlsConnector {
    config: Arc<ClientConfig>,
    /// The client certificate shown, if any (read again by [`TlsConnector::reload`]).
    resolver: Option<Arc<Reloading>>,
    /// The role the server's certificate must name ([`TlsConnector::expecting`]).
    server_role: Option<Role>,
}

impl fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConnector")
            .field("server_role", &self.server_role)
            .finish_non_exhaustive()
    }
}

/// The leaf of a peer's certificate chain, DER.
fn leaf(chain: Option<&[CertificateDer<'static>]>) -> Option<Vec<u8>> {
    chain.and_then(|c| c.first()).map(|c| c.as_ref().to_vec())
}

/// The host part of `host:port` (`[::1]:7101` → `::1`).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

impl TlsConnector {
    /// This connector, taking a server only if its certificate names `role` (a URI
    /// `quire:role:ROLE` in its subject alternative names, and no other role): a broker's
    /// links to stores expect [`Role::Store`], to brokers [`Role::Broker`]. Without it, any
    /// certificate of the CA that names the host would do — a client certificate of the
    /// cluster included.
    #[must_use]
    pub fn expecting(mut self, role: Role) -> TlsConnector {
        self.server_role = Some(role);
        self
    }

    /// Whether this connector shows a client certificate.
    #[must_use]
    pub fn has_certificate(&self) -> bool {
        self.resolver.is_some()
    }

    /// Reads the client certificate and key files again (a broker does on SIGHUP): later
    /// handshakes show them. Nothing to do without a client certificate.
    ///
    /// # Errors
    /// A file that cannot be read or used; the certificate in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        match &self.resolver {
            Some(r) => r.reload(),
            None => Ok(()),
        }
    }

    /// Runs the client's handshake on a connected socket to `addr` (`host:port`, as
    /// dialled): the server's certificate must chain to the CA and name `host` (a DNS name
    /// or an IP address in its subject alternative names).
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] for a host that is no DNS name or IP address;
    /// [`io::ErrorKind::PermissionDenied`] for a server whose certificate does not name the
    /// role [`TlsConnector::expecting`] asked for; the
    /// handshake's failure as rustls reports it (a certificate of another CA, or one that
    /// does not name the host; a server that wants a client certificate we do not have).
    pub async fn connect(&self, addr: &str, mut tcp: TcpStream) -> io::Result<Stream> {
        let name = ServerName::try_from(host_of(addr).to_owned()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{addr}: not a host name for TLS: {e}"),
            )
        })?;
        let mut conn =
            UnbufferedClientConnection::new(self.config.clone(), name).map_err(tls_error)?;
        let leftover = handshake::drive(&mut conn, &mut tcp).await?;
        let peer = leaf(conn.peer_certificates());
        let (secrets, kernel) = conn.dangerous_into_kernel_connection().map_err(tls_error)?;
        let stream = Stream::Tls(Box::new(TlsStream::new(
            tcp,
            secrets,
            Kernel::Client(kernel),
            leftover,
            peer,
        )?));
        if let Some(want) = self.server_role {
            let named = stream
                .peer_certificate()
                .and_then(crate::certificate_identity)
                .and_then(|(_, role)| role);
            if named != Some(want) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{addr}: the server's certificate names role {}, not {} ({} in its subject alternative names)",
                        named.map_or("none", Role::as_str),
                        want.as_str(),
                        want.uri()
                    ),
                ));
            }
        }
        Ok(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn the_host_of_an_address() {
        assert_eq!(host_of("127.0.0.1:7101"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7101"), "::1");
        assert_eq!(host_of("store-1.example:7101"), "store-1.example");
    }
}
