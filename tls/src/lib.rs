//! TLS for every Quire link: client ↔ broker, broker ↔ store, broker ↔ broker.
//!
//! - [`TlsFiles`]: the PEM files a process is given (its certificate chain, its private key,
//!   the CA it trusts), turned into a [`TlsAcceptor`] (the server side of a listener) and a
//!   [`TlsConnector`] (the client side of outgoing connections). TLS 1.3 only, through
//!   rustls with the aws-lc-rs provider; no OpenSSL.
//! - [`ClientAuth`]: whether a server asks its clients for a certificate of its CA (mutual
//!   TLS, the way a cluster's own links prove they belong to it).
//! - [`Stream`], [`ReadHalf`], [`WriteHalf`]: one type for a plaintext or a TLS connection,
//!   so frame readers and writers do not care which it is. rustls runs the handshakes; the
//!   records after it are protected in the connection's own buffers with the keys rustls
//!   negotiated (`record`, through rustls's kernel-connection API).
//! - [`PeerAuth`], [`Role`]: what a verified client certificate says its holder is (a URI
//!   `quire:role:broker` in its subject alternative names), so that a store takes fences
//!   and appends only from brokers of its cluster.
//! - [`certs`]: a throw-away CA and certificates for a local cluster (`quire cluster up
//!   --tls`), made with rcgen.
//!
//! A server's certificate and key are read again by [`TlsAcceptor::reload`] (quire-node and
//! quire-broker call it on SIGHUP): handshakes after it present the new certificate, and
//! connections already open keep theirs.

pub mod certs;
mod config;
mod handshake;
mod identity;
mod record;
pub mod scram;
mod stream;

pub use config::{ClientAuth, TlsAcceptor, TlsConnector, TlsError, TlsFiles};
pub use identity::{certificate_identity, PeerAuth, Role, ROLE_URI_PREFIX};
pub use stream::{
    ReadHalf, Stream, TlsRead, TlsStream, TlsWrite, WriteHalf, READ_BUFFER_BYTES, WRITE_AHEAD_BYTES,
};
