//! Who is at the other end of a connection: the role a peer's certificate names.
//!
//! A Quire certificate names its holder's role in its subject alternative names, as the URI
//! `quire:role:store`, `quire:role:broker` or `quire:role:client` (the way SPIFFE puts a
//! workload's identity in a URI SAN), and its holder's name as the subject's common name.
//! rustls has verified the chain to the CA before any of this is read; the role only says
//! what a verified holder may do.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::{ClientAuth, Stream};

/// The URI prefix of a role in a certificate's subject alternative names.
pub const ROLE_URI_PREFIX: &str = "quire:role:";

/// What a certificate holder is to the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An event store.
    Store,
    /// A broker: may fence and append to stores, and replicate to and hand over to brokers.
    Broker,
    /// A client or an operator's tool: reads, produces, consumes.
    Client,
}

impl Role {
    /// The role's word in the URI (`broker`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Store => "store",
            Role::Broker => "broker",
            Role::Client => "client",
        }
    }

    /// The URI naming this role (`quire:role:broker`).
    #[must_use]
    pub fn uri(self) -> String {
        format!("{ROLE_URI_PREFIX}{}", self.as_str())
    }

    fn from_uri(uri: &str) -> Option<Role> {
        match uri.strip_prefix(ROLE_URI_PREFIX)? {
            "store" => Some(Role::Store),
            "broker" => Some(Role::Broker),
            "client" => Some(Role::Client),
            _ => None,
        }
    }
}

/// The holder's name (the subject's common name) and role of a certificate (DER), as far
/// as it names them (a certificate naming two different roles names none); `None` for
/// bytes that are no certificate.
#[must_use]
pub fn certificate_identity(der: &[u8]) -> Option<(Option<String>, Option<Role>)> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned);
    // Every role URI counts: a certificate naming two roles names none, so that the
    // order in which a CA wrote them decides nothing.
    let mut roles = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(uri) => Role::from_uri(uri),
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    roles.dedup();
    let role = match roles.as_slice() {
        [one] => Some(*one),
        _ => None,
    };
    Some((name, role))
}

/// What a server knows of the peer of one connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerAuth {
    /// The listener asks for no client certificates (plaintext, or `client_auth =
    /// "none"`): nothing is known of the peer and nothing is refused on that ground.
    Unchecked,
    /// The listener checks client certificates: the verified certificate's holder name and
    /// role (`None` for a peer that showed none, or a certificate that names none).
    Checked {
        /// The subject's common name.
        name: Option<String>,
        /// The role its certificate names.
        role: Option<Role>,
    },
}

impl PeerAuth {
    /// The peer of `stream` on a listener whose client certificates are checked as `auth`
    /// says (`None`: a plaintext listener).
    #[must_use]
    pub fn of(stream: &Stream, auth: Option<ClientAuth>) -> PeerAuth {
        match auth {
            None | Some(ClientAuth::None) => PeerAuth::Unchecked,
            Some(_) => {
                let (name, role) = stream
                    .peer_certificate()
                    .and_then(certificate_identity)
                    .unwrap_or((None, None));
                PeerAuth::Checked { name, role }
            }
        }
    }

    /// Whether the peer may send what only a broker of the cluster sends (fences and
    /// appends to a store; replication and take-over requests to a broker).
    #[must_use]
    pub fn is_broker(&self) -> bool {
        matches!(
            self,
            PeerAuth::Unchecked
                | PeerAuth::Checked {
                    role: Some(Role::Broker),
                    ..
                }
        )
    }

    /// The peer as a refusal names it: `"client-7" (role client)`, `no certificate`.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            PeerAuth::Unchecked => "an unchecked peer".to_owned(),
            PeerAuth::Checked {
                name: None,
                role: None,
            } => "a peer without a certificate naming a role".to_owned(),
            PeerAuth::Checked { name, role } => format!(
                "{:?} (role {})",
                name.as_deref().unwrap_or("?"),
                role.map_or("none", Role::as_str)
            ),
        }
    }
}
