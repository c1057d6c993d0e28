//! The server and client sides of TLS, built from PEM files.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use crate::Stream;

/// What can go wrong building a TLS configuration; each names the file concerned.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("cannot read {what} from {path}: {source}")]
    Pem {
        /// "certificates", "a private key".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls_pki_types::pem::Error,
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
    /// The certificate and key do not go together, or rustls refused the configuration.
    #[error("TLS configuration refused: {0}")]
    Config(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("cannot verify client certificates: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// A setting needs another that is unset.
    #[error("{what} is set but {missing} is not")]
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
        .map_err(|source| TlsError::Pem {
            what: "certificates",
            path: path.to_owned(),
            source,
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
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Pem {
        what: "a private key",
        path: path.to_owned(),
        source,
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
    let key = read_key(key)?;
    Ok(Arc::new(CertifiedKey::from_der(chain, key, &provider())?))
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
                what: "cert_file",
                missing: "key_file",
            }),
            (None, Some(_)) => Err(TlsError::Incomplete {
                what: "key_file",
                missing: "cert_file",
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
                    what: "client_auth",
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
                    what: "client_auth",
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
        let config = builder.with_cert_resolver(resolver.clone());
        Ok(Some(TlsAcceptor {
            inner: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
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
        Ok(self.client_config()?.map(|config| TlsConnector {
            inner: tokio_rustls::TlsConnector::from(config),
        }))
    }

    /// The rustls client configuration [`TlsFiles::connector`] wraps, for a client that
    /// drives rustls itself (a blocking one): `None` unless `ca` is set.
    ///
    /// # Errors
    /// As [`TlsFiles::connector`].
    pub fn client_config(&self) -> Result<Option<Arc<ClientConfig>>, TlsError> {
        let Some(ca) = &self.ca else {
            return Ok(None);
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(TLS13)?
            .with_root_certificates(read_roots(ca)?);
        let config = match self.identity()? {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                builder.with_client_auth_cert(read_certs(cert)?, read_key(key)?)?
            }
        };
        Ok(Some(Arc::new(config)))
    }
}

/// A server certificate that [`TlsAcceptor::reload`] replaces.
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

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = match self.current.read() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        Some(current.clone())
    }
}

/// The server side of TLS for one listener.
#[derive(Clone)]
pub struct TlsAcceptor {
    inner: tokio_rustls::TlsAcceptor,
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
    pub async fn accept(&self, tcp: TcpStream, timeout: Duration) -> io::Result<Stream> {
        match tokio::time::timeout(timeout, self.inner.accept(tcp)).await {
            Ok(Ok(s)) => Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(s)))),
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
        let fresh = certified_key(&self.resolver.cert, &self.resolver.key)?;
        let mut current = match self.resolver.current.write() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        *current = fresh;
        Ok(())
    }
}

/// The client side of TLS for outgoing connections.
#[derive(Clone)]
pub struct TlsConnector {
    inner: tokio_rustls::TlsConnector,
}

impl fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConnector").finish_non_exhaustive()
    }
}

/// The host part of `host:port` (`[::1]:7101` → `::1`).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

impl TlsConnector {
    /// Runs the client's handshake on a connected socket to `addr` (`host:port`, as
    /// dialled): the server's certificate must chain to the CA and name `host` (a DNS name
    /// or an IP address in its subject alternative names).
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] for a host that is no DNS name or IP address; the
    /// handshake's failure as rustls reports it (a certificate of another CA, or one that
    /// does not name the host; a server that wants a client certificate we do not have).
    pub async fn connect(&self, addr: &str, tcp: TcpStream) -> io::Result<Stream> {
        let name = ServerName::try_from(host_of(addr).to_owned()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{addr}: not a host name for TLS: {e}"),
            )
        })?;
        let s = self.inner.connect(name, tcp).await?;
        Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Client(s))))
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
