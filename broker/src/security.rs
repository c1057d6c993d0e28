//! Users, ACL entries and the checks made with them: who a connection acts as
//! ([`Principal`]), and whether it may do what a request asks ([`authorize`]).
//!
//! Users and ACL entries are replicated cluster state: `quire user` and `quire acl` write
//! them as events into the log through the master ([`quire_proto::UserAdminEvent`],
//! [`quire_proto::AclAdminEvent`]); every broker applies them to its [`SecurityTables`]
//! and they ride in checkpoints, like cursors. The model is Kafka's
//! (`AclAuthorizer`): entries only allow, a request nothing allows is refused, super users
//! and brokers are allowed everything, and nothing is enforced until a broker is told to
//! (`authorization = true`).

use std::collections::{BTreeMap, BTreeSet};

use quire_proto::{
    AclAction, AclAdminEvent, AclEntry, AclOperation, Body, ErrorCode, ErrorResponse,
    ScramCredential, UserAdminEvent, ACLS_MAX, USERS_MAX,
};
use quire_tls::{PeerAuth, Role};

/// The principal name of a connection that proved nothing (no verified certificate, no
/// SASL exchange): Kafka's `ANONYMOUS`.
pub const ANONYMOUS: &str = "ANONYMOUS";

/// The users and ACL entries the broker applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecurityTables {
    users: BTreeMap<String, ScramCredential>,
    acls: BTreeSet<AclEntry>,
}

impl SecurityTables {
    /// The tables a checkpoint holds.
    #[must_use]
    pub fn from_snapshot(users: Vec<(String, ScramCredential)>, acls: Vec<AclEntry>) -> Self {
        SecurityTables {
            users: users.into_iter().collect(),
            acls: acls.into_iter().collect(),
        }
    }

    /// Applies a user change; `false` if an addition was dropped because [`USERS_MAX`]
    /// users exist (the master refuses it before it is written).
    pub fn apply_user(&mut self, e: UserAdminEvent) -> bool {
        match e.credential {
            Some(c) => {
                if self.users.len() >= USERS_MAX && !self.users.contains_key(&e.user) {
                    return false;
                }
                self.users.insert(e.user, c);
            }
            None => {
                self.users.remove(&e.user);
            }
        }
        true
    }

    /// Applies an ACL change; `false` if an addition was dropped because [`ACLS_MAX`]
    /// entries exist.
    pub fn apply_acl(&mut self, e: AclAdminEvent) -> bool {
        match e.action {
            AclAction::Add => {
                if self.acls.len() >= ACLS_MAX && !self.acls.contains(&e.entry) {
                    return false;
                }
                self.acls.insert(e.entry);
            }
            AclAction::Remove => {
                self.acls.remove(&e.entry);
            }
        }
        true
    }

    /// Whether a change would add a user or an entry beyond its bound: the bound's name
    /// and value, for the master's `LimitReached` refusal.
    #[must_use]
    pub fn over_bound(&self, change: &SecurityChange) -> Option<(&'static str, usize)> {
        match change {
            SecurityChange::User(u) => (u.credential.is_some()
                && self.users.len() >= USERS_MAX
                && !self.users.contains_key(&u.user))
            .then_some(("users", USERS_MAX)),
            SecurityChange::Acl(a) => (a.action == AclAction::Add
                && self.acls.len() >= ACLS_MAX
                && !self.acls.contains(&a.entry))
            .then_some(("ACL entries", ACLS_MAX)),
        }
    }

    /// `user`'s credential, if the user exists.
    #[must_use]
    pub fn credential(&self, user: &str) -> Option<&ScramCredential> {
        self.users.get(user)
    }

    /// Every user, by name.
    pub fn users(&self) -> impl Iterator<Item = (&str, &ScramCredential)> + '_ {
        self.users.iter().map(|(u, c)| (u.as_str(), c))
    }

    /// Every ACL entry, sorted.
    pub fn acls(&self) -> impl Iterator<Item = &AclEntry> + '_ {
        self.acls.iter()
    }

    /// Whether some entry lets `principal` do `operation` on `topic` (`None`: the cluster).
    #[must_use]
    ///
    /// Looks only at the entries of `principal` and of `*` (the set is ordered by principal
    /// first), so a check costs the entries of those two, not all 10,000.
    pub fn allows(&self, principal: &str, operation: AclOperation, topic: Option<&str>) -> bool {
        ["*", principal].into_iter().any(|who| {
            let from = AclEntry {
                principal: who.to_owned(),
                operation: AclOperation::Produce,
                topic: String::new(),
            };
            self.acls
                .range(from..)
                .take_while(|e| e.principal == who)
                .any(|e| e.allows(principal, operation, topic))
        })
    }
}

/// The tables the actor applied last, as the connections read them (to check a SCRAM
/// proof or an ACL without a round trip to the actor). The actor replaces the inner `Arc`
/// when its state's tables change.
pub type SecurityView = std::sync::Arc<std::sync::RwLock<std::sync::Arc<SecurityTables>>>;

/// The tables `view` holds now (a poisoned lock still holds the last tables set).
#[must_use]
pub fn current(view: &SecurityView) -> std::sync::Arc<SecurityTables> {
    match view.read() {
        Ok(t) => t.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    }
}

/// A user or ACL change, as the master writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecurityChange {
    /// Add, replace or remove a user.
    User(UserAdminEvent),
    /// Add or remove an ACL entry.
    Acl(AclAdminEvent),
}

/// Who a connection acts as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// Nothing proved.
    Anonymous,
    /// A verified client certificate: its common name and role.
    Certificate {
        /// The subject's common name.
        name: String,
        /// The role it names, if one.
        role: Option<Role>,
    },
    /// A user that completed a SCRAM exchange on this connection.
    User(String),
}

impl Principal {
    /// The principal a TLS handshake established (`Anonymous` without a verified
    /// certificate that names its holder).
    #[must_use]
    pub fn of(auth: &PeerAuth) -> Principal {
        match auth {
            PeerAuth::Checked {
                name: Some(name),
                role,
            } => Principal::Certificate {
                name: name.clone(),
                role: *role,
            },
            PeerAuth::Checked { name: None, .. } | PeerAuth::Unchecked => Principal::Anonymous,
        }
    }

    /// The name ACL entries and `super_users` match.
    #[must_use]
    pub fn name(&self) -> &str {
        match self {
            Principal::Anonymous => ANONYMOUS,
            Principal::Certificate { name, .. } | Principal::User(name) => name,
        }
    }
}

/// How a broker checks requests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthSettings {
    /// Whether requests are checked against the ACL entries (`false`: every principal may
    /// do everything, as before users and ACLs existed).
    pub authorization: bool,
    /// Principals allowed everything, ACL entries or not (Kafka's `super.users`): how the
    /// first administrator adds users and entries.
    pub super_users: Vec<String>,
}

/// What a request needs: the operation and the topic (`None`: the cluster), or `None` for
/// a request anyone may send (metadata, authentication; replication and take-over
/// requests are the TLS role check's).
#[must_use]
pub fn required(body: &Body) -> Option<(AclOperation, Option<&str>)> {
    Some(match body {
        Body::ProduceRequest(p) => (AclOperation::Produce, Some(p.topic.as_str())),
        Body::FetchRequest(f) => (AclOperation::Consume, Some(f.topic.as_str())),
        Body::CursorRequest(c) => (AclOperation::Consume, Some(c.topic.as_str())),
        Body::CommitCursorRequest(c) => (AclOperation::Commit, Some(c.topic.as_str())),
        Body::UserAdminRequest(_)
        | Body::AclAdminRequest(_)
        | Body::DescribeSecurityRequest(_)
        | Body::HandoffRequest(_) => (AclOperation::Admin, None),
        _ => return None,
    })
}

/// Whether `principal` may send `body`, under `settings` and the applied `tables`.
/// `loopback`: the connection comes from a loopback address.
///
/// The first user: while the cluster has no users at all, a user-admin request from a
/// loopback address is allowed whoever sends it (MongoDB's "localhost exception"), so an
/// operator on a broker's machine can add the first administrator named in
/// `super_users`. The exception closes with the first user.
///
/// # Errors
/// `Unauthorized`, naming the principal, the operation and the resource.
pub fn authorize(
    settings: &AuthSettings,
    tables: &SecurityTables,
    principal: &Principal,
    loopback: bool,
    body: &Body,
) -> Result<(), ErrorResponse> {
    if !settings.authorization {
        return Ok(());
    }
    let Some((operation, topic)) = required(body) else {
        return Ok(());
    };
    if loopback && tables.users.is_empty() && matches!(body, Body::UserAdminRequest(_)) {
        return Ok(());
    }
    if let Principal::Certificate {
        role: Some(Role::Broker),
        ..
    } = principal
    {
        return Ok(());
    }
    let name = principal.name();
    if settings.super_users.iter().any(|s| s == name) || tables.allows(name, operation, topic) {
        return Ok(());
    }
    let resource = match topic {
        Some(t) => format!("topic {t:?}"),
        None => "the cluster".to_owned(),
    };
    Err(ErrorResponse::new(
        ErrorCode::Unauthorized,
        format!(
            "principal {name:?} has no {operation} right on {resource}: no ACL entry grants it (an administrator can add one: quire acl add --principal {name} --operation {operation} --topic {})",
            topic.unwrap_or("'*'")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_proto::{FetchRequest, HandoffRequest, MetadataRequest, Offset, ProduceRequest};

    fn produce(topic: &str) -> Body {
        Body::ProduceRequest(ProduceRequest {
            topic: topic.into(),
            producer_id: 0,
            sequence: 0,
            messages: vec![],
        })
    }

    fn fetch(topic: &str) -> Body {
        Body::FetchRequest(FetchRequest {
            topic: topic.into(),
            from_offset: Offset(0),
            max_messages: 1,
            max_bytes: 1,
            wait_ms: 0,
        })
    }

    #[test]
    fn a_check_finds_the_entries_of_the_principal_and_of_everyone_among_many() {
        let mut tables = SecurityTables::default();
        for i in 0..500 {
            for (principal, topic) in [
                (format!("user{i}"), format!("t{i}")),
                ("*".into(), "public".into()),
            ] {
                tables.apply_acl(AclAdminEvent {
                    action: AclAction::Add,
                    entry: AclEntry {
                        principal,
                        operation: AclOperation::Consume,
                        topic,
                    },
                });
            }
        }
        assert!(tables.allows("user7", AclOperation::Consume, Some("t7")));
        assert!(!tables.allows("user7", AclOperation::Consume, Some("t8")));
        assert!(tables.allows("user7", AclOperation::Consume, Some("public")));
        assert!(tables.allows("ANONYMOUS", AclOperation::Consume, Some("public")));
        assert!(!tables.allows("ANONYMOUS", AclOperation::Produce, Some("public")));
        // A name that sorts between others, or before "*", finds nothing of theirs.
        assert!(!tables.allows("user", AclOperation::Consume, Some("t1")));
        assert!(!tables.allows("!", AclOperation::Consume, Some("t1")));
    }

    #[test]
    fn authorization_follows_entries_super_users_and_roles() {
        let on = AuthSettings {
            authorization: true,
            super_users: vec!["root".into()],
        };
        let mut tables = SecurityTables::default();
        assert!(tables.apply_acl(AclAdminEvent {
            action: AclAction::Add,
            entry: AclEntry {
                principal: "alice".into(),
                operation: AclOperation::Produce,
                topic: "orders".into(),
            },
        }));
        let alice = Principal::User("alice".into());
        assert!(authorize(&on, &tables, &alice, false, &produce("orders")).is_ok());
        let refused = authorize(&on, &tables, &alice, false, &fetch("orders")).unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unauthorized);
        assert!(refused
            .message
            .contains("\"alice\" has no consume right on topic \"orders\""));
        assert!(authorize(&on, &tables, &alice, false, &produce("other")).is_err());
        assert!(authorize(
            &on,
            &tables,
            &Principal::Anonymous,
            false,
            &produce("orders")
        )
        .is_err());
        // Anyone may ask for metadata.
        let metadata = Body::MetadataRequest(MetadataRequest);
        assert!(authorize(&on, &tables, &Principal::Anonymous, false, &metadata).is_ok());
        // Super users and brokers may do everything.
        let handoff = Body::HandoffRequest(HandoffRequest {
            to: quire_proto::BrokerId(2),
        });
        assert!(authorize(
            &on,
            &tables,
            &Principal::User("root".into()),
            false,
            &handoff
        )
        .is_ok());
        let broker = Principal::Certificate {
            name: "b1".into(),
            role: Some(Role::Broker),
        };
        assert!(authorize(&on, &tables, &broker, false, &handoff).is_ok());
        let client = Principal::Certificate {
            name: "b1".into(),
            role: Some(Role::Client),
        };
        assert!(authorize(&on, &tables, &client, false, &handoff).is_err());
        // Off: nothing is checked.
        let off = AuthSettings::default();
        assert!(authorize(&off, &tables, &Principal::Anonymous, false, &handoff).is_ok());
        // Removing the entry takes the right away.
        assert!(tables.apply_acl(AclAdminEvent {
            action: AclAction::Remove,
            entry: AclEntry {
                principal: "alice".into(),
                operation: AclOperation::Produce,
                topic: "orders".into(),
            },
        }));
        assert!(authorize(&on, &tables, &alice, false, &produce("orders")).is_err());
        // The first user may be added from the broker's own machine, and only the first.
        let add = Body::UserAdminRequest(quire_proto::UserAdminRequest(UserAdminEvent {
            user: "root".into(),
            credential: None,
        }));
        assert!(authorize(&on, &tables, &Principal::Anonymous, true, &add).is_ok());
        assert!(authorize(&on, &tables, &Principal::Anonymous, false, &add).is_err());
        assert!(authorize(&on, &tables, &Principal::Anonymous, true, &handoff).is_err());
        tables.apply_user(UserAdminEvent {
            user: "root".into(),
            credential: Some(quire_tls::scram::new_credential("pw", 4096).unwrap()),
        });
        assert!(authorize(&on, &tables, &Principal::Anonymous, true, &add).is_err());
    }
}
