//! Users, ACLs and client authentication: the event bodies that make them replicated
//! cluster state, and the client ↔ broker requests that read and change them.
//!
//! | request | responses |
//! | --- | --- |
//! | [`AuthenticateRequest`] | [`AuthenticateResponse`] (any broker; a SASL exchange step) |
//! | [`UserAdminRequest`] | [`AdminResponse`] (the master, once the change is stabilized) |
//! | [`AclAdminRequest`] | [`AdminResponse`] (likewise) |
//! | [`DescribeSecurityRequest`] | [`DescribeSecurityResponse`] (any broker) |
//!
//! A user's password never travels or rests in clear: `quire user add` salts and iterates
//! it on the operator's machine and sends the SCRAM-SHA-256 keys derived from it
//! ([`ScramCredential`], RFC 5802 §3); the broker keeps those, as Kafka does.

use bytes::Bytes;

use crate::codec::{BodyWriter, Reader};
use crate::error::WireError;
use crate::limits::TOPIC_BYTES_MAX;

/// Longest user or principal name, in bytes of UTF-8 (non-empty).
pub const PRINCIPAL_BYTES_MAX: usize = 255;
/// Longest SCRAM salt, in bytes.
pub const SCRAM_SALT_BYTES_MAX: usize = 64;
/// Length of a SCRAM-SHA-256 key (StoredKey, ServerKey), in bytes.
pub const SCRAM_KEY_BYTES: usize = 32;
/// Longest SASL message of an authentication step, in bytes.
pub const SASL_MESSAGE_BYTES_MAX: usize = 4096;
/// Most users a cluster's state holds (and a [`DescribeSecurityResponse`] lists).
pub const USERS_MAX: usize = 10_000;
/// Most ACL entries a cluster's state holds.
pub const ACLS_MAX: usize = 10_000;

/// The SCRAM-SHA-256 keys of one user (RFC 5802 §3): what a broker needs to check a
/// client's proof and to prove itself, and not enough to log in as the user.
///
/// ```text
/// 2+n    salt                  bytes (u16 length) ≤ SCRAM_SALT_BYTES_MAX
/// 4      iterations            u32 (≥ 4096 when made by quire)
/// 32     stored_key            H(HMAC(SaltedPassword, "Client Key"))
/// 32     server_key            HMAC(SaltedPassword, "Server Key")
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScramCredential {
    /// The random salt of PBKDF2.
    pub salt: Bytes,
    /// PBKDF2-HMAC-SHA-256 iterations.
    pub iterations: u32,
    /// `H(ClientKey)`.
    pub stored_key: [u8; SCRAM_KEY_BYTES],
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: [u8; SCRAM_KEY_BYTES],
}

/// Add (or replace) a user's credential, or remove the user (event kind
/// [`crate::EventKind::UserAdmin`], and the body of a [`UserAdminRequest`]).
///
/// ```text
/// 2+n    user                  string ≤ PRINCIPAL_BYTES_MAX
/// 1      tag                   u8: 0 remove, 1 a ScramCredential follows (add/replace)
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserAdminEvent {
    /// The user's name (the principal it authenticates as).
    pub user: String,
    /// `Some`: set this credential; `None`: remove the user.
    pub credential: Option<ScramCredential>,
}

/// What an ACL entry allows. One byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum AclOperation {
    /// Produce to the topic.
    Produce = 1,
    /// Fetch from the topic and read its cursors.
    Consume = 2,
    /// Commit cursors of the topic.
    Commit = 3,
    /// Administer the cluster (users, ACLs, handoff); only with the topic pattern `*`.
    Admin = 4,
    /// Every operation here: the above, and [`AclOperation::Group`].
    All = 5,
    /// Be a member of the Kafka consumer groups whose ids the entry's pattern matches
    /// (its `topic` field holds a group id or pattern): join, sync, heartbeat, leave,
    /// describe, and commit or read the group's offsets (which also need the topic's
    /// `commit` / `consume`). Kafka's `READ` on a group resource.
    Group = 6,
}

impl AclOperation {
    /// Every operation, in numeric order.
    pub const ALL: [AclOperation; 6] = [
        AclOperation::Produce,
        AclOperation::Consume,
        AclOperation::Commit,
        AclOperation::Admin,
        AclOperation::All,
        AclOperation::Group,
    ];

    /// The operation's name in ACL listings and on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            AclOperation::Produce => "produce",
            AclOperation::Consume => "consume",
            AclOperation::Commit => "commit",
            AclOperation::Admin => "admin",
            AclOperation::All => "all",
            AclOperation::Group => "group",
        }
    }

    /// The operation of a name given by [`AclOperation::name`], or `None`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<AclOperation> {
        AclOperation::ALL.into_iter().find(|o| o.name() == name)
    }

    fn from_u8(byte: u8) -> Option<AclOperation> {
        AclOperation::ALL.into_iter().find(|o| *o as u8 == byte)
    }
}

impl std::fmt::Display for AclOperation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One ACL entry: `principal` may do `operation` on the topics `topic` matches. Entries
/// only allow (there is no deny); without authorization on the brokers they are kept but
/// not enforced.
///
/// `principal` is a user name, a certificate's common name, `ANONYMOUS`, or `*` for
/// everyone. `topic` is a topic name, `*` for every topic, or a prefix followed by `*`
/// (`orders.*`).
///
/// ```text
/// 2+n    principal             string ≤ PRINCIPAL_BYTES_MAX
/// 1      operation             u8 (AclOperation)
/// 2+n    topic                 string ≤ TOPIC_BYTES_MAX (a name or pattern)
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AclEntry {
    /// Who.
    pub principal: String,
    /// May do what.
    pub operation: AclOperation,
    /// On which topics (a name or a pattern); for [`AclOperation::Group`], on which Kafka
    /// consumer groups.
    pub topic: String,
}

impl AclEntry {
    /// Whether this entry lets `principal` do `operation` on `topic` (`None`: a request
    /// about the cluster rather than a topic, which only a `*` topic pattern covers).
    #[must_use]
    pub fn allows(&self, principal: &str, operation: AclOperation, topic: Option<&str>) -> bool {
        let who = self.principal == "*" || self.principal == principal;
        let what = self.operation == AclOperation::All || self.operation == operation;
        let on = match topic {
            None => self.topic == "*",
            Some(t) => match self.topic.strip_suffix('*') {
                Some(prefix) => t.starts_with(prefix),
                None => self.topic == t,
            },
        };
        who && what && on
    }
}

impl std::fmt::Display for AclEntry {
    /// `principal "alice" may produce to topic "orders"`, and so on per operation.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // "every topic", "the topics starting \"a.\"", "topic \"a\"", and so for groups.
        let matched = |every: &str, some: &str, one: &str| {
            if self.topic == "*" {
                every.to_owned()
            } else if let Some(prefix) = self.topic.strip_suffix('*') {
                format!("{some} starting {prefix:?}")
            } else {
                format!("{one} {:?}", self.topic)
            }
        };
        let topics = matched("every topic", "the topics", "topic");
        let what = match self.operation {
            AclOperation::Produce => format!("produce to {topics}"),
            AclOperation::Consume => format!("consume from {topics}"),
            AclOperation::Commit => format!("commit cursors of {topics}"),
            AclOperation::Admin => "administer the cluster".to_owned(),
            AclOperation::All if self.topic == "*" => {
                "do anything, administering the cluster included".to_owned()
            }
            AclOperation::All => format!("do anything on {topics}"),
            AclOperation::Group => format!(
                "be a member of {}",
                matched(
                    "every Kafka consumer group",
                    "the Kafka consumer groups",
                    "Kafka consumer group"
                )
            ),
        };
        write!(f, "principal {:?} may {what}", self.principal)
    }
}

/// Whether an [`AclAdminEvent`] adds or removes its entry. One byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AclAction {
    /// Add the entry (adding one already there changes nothing).
    Add = 1,
    /// Remove the entry (removing one not there changes nothing).
    Remove = 2,
}

/// Add or remove one ACL entry (event kind [`crate::EventKind::AclAdmin`], and the body of
/// an [`AclAdminRequest`]).
///
/// ```text
/// 1      action                u8 (1 add, 2 remove)
/// ..     entry                 AclEntry
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclAdminEvent {
    /// Add or remove.
    pub action: AclAction,
    /// The entry.
    pub entry: AclEntry,
}

/// Client → any broker: one step of a SASL exchange. The mechanism is `SCRAM-SHA-256`
/// (RFC 7677); the first request carries the client-first message, the second the
/// client-final message. A connection that completes it acts as that user from then on.
/// A failed exchange is answered with `AuthenticationFailed` and the connection closed.
///
/// ```text
/// 2+n    mechanism             string ≤ 32 ("SCRAM-SHA-256")
/// 4+n    message               bytes ≤ SASL_MESSAGE_BYTES_MAX
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthenticateRequest {
    /// The SASL mechanism name.
    pub mechanism: String,
    /// The client's message of this step.
    pub message: Bytes,
}

/// Broker → client: the server's message of the step (server-first, then server-final).
///
/// ```text
/// 4+n    message               bytes ≤ SASL_MESSAGE_BYTES_MAX
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthenticateResponse {
    /// The server's message.
    pub message: Bytes,
}

/// Operator → master: add, replace or remove a user. Body: a [`UserAdminEvent`]. Needs
/// the `admin` operation when brokers enforce ACLs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserAdminRequest(pub UserAdminEvent);

/// Operator → master: add or remove an ACL entry. Body: an [`AclAdminEvent`]. Needs the
/// `admin` operation when brokers enforce ACLs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclAdminRequest(pub AclAdminEvent);

/// Master → operator: the change is stabilized (every broker applies it from the log).
/// Empty body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdminResponse;

/// Operator → any broker: list users and ACL entries. Empty body. Needs the `admin`
/// operation when brokers enforce ACLs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DescribeSecurityRequest;

/// One user as listed: its name and the PBKDF2 iterations of its credential (never the
/// keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    /// The user's name.
    pub user: String,
    /// Iterations of its SCRAM-SHA-256 credential.
    pub iterations: u32,
}

/// Broker → operator: the users and ACL entries in the state this broker applied.
///
/// ```text
/// 1      authorization         bool: whether this broker enforces ACLs
/// 4      user count            u32 ≤ USERS_MAX; per user: 2+n name, 4 iterations u32
/// 4      acl count             u32 ≤ ACLS_MAX; per entry: AclEntry
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescribeSecurityResponse {
    /// Whether the answering broker enforces ACLs.
    pub authorization: bool,
    /// Every user, by name.
    pub users: Vec<UserInfo>,
    /// Every ACL entry, sorted.
    pub acls: Vec<AclEntry>,
}

// ---- encoding ----

const ACL_ENTRY_BYTES_MIN: usize = 2 + 1 + 1 + 2 + 1;
const USER_INFO_BYTES_MIN: usize = 2 + 1 + 4;

impl ScramCredential {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        if self.salt.len() > SCRAM_SALT_BYTES_MAX {
            return Err(WireError::StringTooLong {
                field: "scram salt",
                length: self.salt.len(),
                max: SCRAM_SALT_BYTES_MAX,
            });
        }
        w.u16(self.salt.len() as u16);
        w.put(&self.salt);
        w.u32(self.iterations);
        w.put(&self.stored_key);
        w.put(&self.server_key);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let field = "scram salt";
        let length = usize::from(r.u16(field)?);
        if length > SCRAM_SALT_BYTES_MAX {
            return Err(WireError::StringTooLong {
                field,
                length,
                max: SCRAM_SALT_BYTES_MAX,
            });
        }
        let salt = Bytes::copy_from_slice(r.take(field, length)?);
        let iterations = r.u32("scram iterations")?;
        let stored_key = r.array("scram stored key")?;
        let server_key = r.array("scram server key")?;
        Ok(ScramCredential {
            salt,
            iterations,
            stored_key,
            server_key,
        })
    }
}

impl UserAdminEvent {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.name("user", &self.user, PRINCIPAL_BYTES_MAX)?;
        match &self.credential {
            None => w.u8(0),
            Some(c) => {
                w.u8(1);
                c.write(w)?;
            }
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let user = r.name("user", PRINCIPAL_BYTES_MAX)?;
        let field = "user credential tag";
        let credential = match r.u8(field)? {
            0 => None,
            1 => Some(ScramCredential::read(r)?),
            byte => return Err(WireError::InvalidTag { field, byte }),
        };
        Ok(UserAdminEvent { user, credential })
    }
}

impl AclEntry {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.name("acl principal", &self.principal, PRINCIPAL_BYTES_MAX)?;
        w.u8(self.operation as u8);
        w.name("acl topic", &self.topic, TOPIC_BYTES_MAX)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let principal = r.name("acl principal", PRINCIPAL_BYTES_MAX)?;
        let field = "acl operation";
        let byte = r.u8(field)?;
        let operation = AclOperation::from_u8(byte).ok_or(WireError::InvalidTag { field, byte })?;
        let topic = r.name("acl topic", TOPIC_BYTES_MAX)?;
        Ok(AclEntry {
            principal,
            operation,
            topic,
        })
    }
}

impl AclAdminEvent {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u8(self.action as u8);
        self.entry.write(w)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let field = "acl action";
        let action = match r.u8(field)? {
            1 => AclAction::Add,
            2 => AclAction::Remove,
            byte => return Err(WireError::InvalidTag { field, byte }),
        };
        Ok(AclAdminEvent {
            action,
            entry: AclEntry::read(r)?,
        })
    }
}

fn sasl_message<W: BodyWriter>(w: &mut W, message: &Bytes) -> Result<(), WireError> {
    if message.len() > SASL_MESSAGE_BYTES_MAX {
        return Err(WireError::PayloadTooLarge {
            field: "sasl message",
            length: message.len(),
            max: SASL_MESSAGE_BYTES_MAX,
        });
    }
    w.payload("sasl message", message)
}

fn read_sasl_message(r: &mut Reader<'_>) -> Result<Bytes, WireError> {
    let message = r.payload("sasl message")?;
    if message.len() > SASL_MESSAGE_BYTES_MAX {
        return Err(WireError::PayloadTooLarge {
            field: "sasl message",
            length: message.len(),
            max: SASL_MESSAGE_BYTES_MAX,
        });
    }
    Ok(message)
}

impl AuthenticateRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.name("sasl mechanism", &self.mechanism, 32)?;
        sasl_message(w, &self.message)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(AuthenticateRequest {
            mechanism: r.name("sasl mechanism", 32)?,
            message: read_sasl_message(r)?,
        })
    }
}

impl AuthenticateResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        sasl_message(w, &self.message)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(AuthenticateResponse {
            message: read_sasl_message(r)?,
        })
    }
}

impl UserAdminRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        self.0.write(w)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(UserAdminRequest(UserAdminEvent::read(r)?))
    }
}

impl AclAdminRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        self.0.write(w)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(AclAdminRequest(AclAdminEvent::read(r)?))
    }
}

impl AdminResponse {
    pub(crate) fn write<W: BodyWriter>(&self, _w: &mut W) -> Result<(), WireError> {
        Ok(())
    }

    pub(crate) fn read(_r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(AdminResponse)
    }
}

impl DescribeSecurityRequest {
    pub(crate) fn write<W: BodyWriter>(&self, _w: &mut W) -> Result<(), WireError> {
        Ok(())
    }

    pub(crate) fn read(_r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(DescribeSecurityRequest)
    }
}

impl DescribeSecurityResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.bool(self.authorization);
        w.count("users", self.users.len(), USERS_MAX)?;
        for u in &self.users {
            w.name("user", &u.user, PRINCIPAL_BYTES_MAX)?;
            w.u32(u.iterations);
        }
        write_acls(w, &self.acls)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let authorization = r.bool("authorization")?;
        let count = r.count("users", USERS_MAX, USER_INFO_BYTES_MIN)?;
        let mut users = Vec::with_capacity(count);
        for _ in 0..count {
            users.push(UserInfo {
                user: r.name("user", PRINCIPAL_BYTES_MAX)?,
                iterations: r.u32("user iterations")?,
            });
        }
        Ok(DescribeSecurityResponse {
            authorization,
            users,
            acls: read_acls(r)?,
        })
    }
}

pub(crate) fn write_acls<W: BodyWriter>(w: &mut W, acls: &[AclEntry]) -> Result<(), WireError> {
    w.count("acls", acls.len(), ACLS_MAX)?;
    for a in acls {
        a.write(w)?;
    }
    Ok(())
}

pub(crate) fn read_acls(r: &mut Reader<'_>) -> Result<Vec<AclEntry>, WireError> {
    let count = r.count("acls", ACLS_MAX, ACL_ENTRY_BYTES_MIN)?;
    let mut acls = Vec::with_capacity(count);
    for _ in 0..count {
        acls.push(AclEntry::read(r)?);
    }
    Ok(acls)
}

/// Least bytes one user of a snapshot takes.
pub(crate) const SNAPSHOT_USER_BYTES_MIN: usize = 2 + 1 + 2 + 4 + 2 * SCRAM_KEY_BYTES;

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(principal: &str, operation: AclOperation, topic: &str) -> AclEntry {
        AclEntry {
            principal: principal.into(),
            operation,
            topic: topic.into(),
        }
    }

    #[test]
    fn acl_patterns_match_names_prefixes_and_everything() {
        let e = entry("alice", AclOperation::Produce, "orders");
        assert!(e.allows("alice", AclOperation::Produce, Some("orders")));
        assert!(!e.allows("alice", AclOperation::Produce, Some("orders2")));
        assert!(!e.allows("bob", AclOperation::Produce, Some("orders")));
        assert!(!e.allows("alice", AclOperation::Consume, Some("orders")));
        assert!(!e.allows("alice", AclOperation::Produce, None));
        let p = entry("alice", AclOperation::All, "orders.*");
        assert!(p.allows("alice", AclOperation::Commit, Some("orders.eu")));
        assert!(!p.allows("alice", AclOperation::Commit, Some("order")));
        let any = entry("*", AclOperation::Admin, "*");
        assert!(any.allows("ANONYMOUS", AclOperation::Admin, None));
        assert!(any.allows("x", AclOperation::Admin, Some("t")));
    }

    #[test]
    fn operation_names_round_trip() {
        for o in AclOperation::ALL {
            assert_eq!(AclOperation::from_name(o.name()), Some(o));
            assert_eq!(AclOperation::from_u8(o as u8), Some(o));
        }
        assert_eq!(AclOperation::from_name("write"), None);
        assert_eq!(AclOperation::from_u8(0), None);
    }
}
