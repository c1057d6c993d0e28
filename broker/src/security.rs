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

    /// Whether `change` adds a user or an entry these tables do not hold (what the master
    /// counts against the bounds while the change is in flight).
    #[must_use]
    pub fn adds(&self, change: &SecurityChange) -> bool {
        match change {
            SecurityChange::User(u) => u.credential.is_some() && !self.users.contains_key(&u.user),
            SecurityChange::Acl(a) => a.action == AclAction::Add && !self.acls.contains(&a.entry),
        }
    }

    /// Whether `change` would add a user or an entry beyond its bound, with `inflight`
    /// additions of its kind proposed and not yet applied: the bound's name and value, for
    /// the master's `LimitReached` refusal.
    #[must_use]
    pub fn over_bound(
        &self,
        change: &SecurityChange,
        inflight: usize,
    ) -> Option<(&'static str, usize)> {
        if !self.adds(change) {
            return None;
        }
        match change {
            SecurityChange::User(_) => {
                (self.users.len() + inflight >= USERS_MAX).then_some(("users", USERS_MAX))
            }
            SecurityChange::Acl(_) => {
                (self.acls.len() + inflight >= ACLS_MAX).then_some(("ACL entries", ACLS_MAX))
            }
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

/// Failed logins an address may make within [`FAILED_LOGINS_WINDOW`] before its logins are
/// refused unchecked until the window ends.
pub const FAILED_LOGINS_MAX: u32 = 20;
/// The window [`FAILED_LOGINS_MAX`] counts in.
pub const FAILED_LOGINS_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);
/// Addresses [`LoginFailures`] remembers at most (about 3 MiB).
pub const FAILED_LOGINS_ADDRS_MAX: usize = 65_536;

/// Failed logins by client address: an online guesser gets [`FAILED_LOGINS_MAX`] guesses
/// per [`FAILED_LOGINS_WINDOW`] per address, whatever it does with its connections (the
/// per-failure delay alone let a client that hangs up early guess hundreds of times a
/// second). A window opens at an address's first failure; once it holds the most, the
/// address's logins are refused, right password or not, until it closes. Clients behind
/// one NAT address share the count.
#[derive(Debug, Default)]
pub struct LoginFailures {
    by_addr: std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u32)>,
}

impl LoginFailures {
    /// How long `addr`'s logins stay refused, or `None` if it may try.
    #[must_use]
    pub fn blocked(
        &self,
        addr: std::net::IpAddr,
        now: std::time::Instant,
    ) -> Option<std::time::Duration> {
        let &(start, count) = self.by_addr.get(&addr)?;
        let left = FAILED_LOGINS_WINDOW.checked_sub(now.saturating_duration_since(start))?;
        (count >= FAILED_LOGINS_MAX && !left.is_zero()).then_some(left)
    }

    /// Counts a failed login from `addr`. When [`FAILED_LOGINS_ADDRS_MAX`] addresses are
    /// remembered, those whose window closed are forgotten first; if none has, the failure
    /// is not counted (the per-failure delay still applies).
    pub fn failed(&mut self, addr: std::net::IpAddr, now: std::time::Instant) {
        let open =
            |start: std::time::Instant| now.saturating_duration_since(start) < FAILED_LOGINS_WINDOW;
        if !self.by_addr.contains_key(&addr) && self.by_addr.len() >= FAILED_LOGINS_ADDRS_MAX {
            self.by_addr.retain(|_, (start, _)| open(*start));
            if self.by_addr.len() >= FAILED_LOGINS_ADDRS_MAX {
                return;
            }
        }
        let entry = self.by_addr.entry(addr).or_insert((now, 0));
        if !open(entry.0) {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
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

/// Checks a change before the master writes it: user names that are not principals of
/// their own (`*`, `ANONYMOUS`), credentials no login could use, topic patterns with a `*`
/// anywhere but at the end.
///
/// # Errors
/// What is wrong, for an `InvalidName` refusal.
pub fn validate(change: &SecurityChange) -> Result<(), String> {
    match change {
        SecurityChange::User(u) => {
            if u.user.chars().any(char::is_control) {
                return Err(format!("user name {:?} holds control characters", u.user));
            }
            if u.user == "*" || u.user == ANONYMOUS {
                return Err(format!(
                    "{:?} cannot be a user's name: ACL entries use it for {}",
                    u.user,
                    if u.user == "*" {
                        "everyone"
                    } else {
                        "clients that proved nothing"
                    }
                ));
            }
            if let Some(c) = &u.credential {
                let iterations =
                    quire_tls::scram::ITERATIONS_MIN..=quire_tls::scram::ITERATIONS_MAX;
                if !iterations.contains(&c.iterations) || c.salt.is_empty() {
                    return Err(format!(
                        "a credential needs {}..={} iterations and a salt (this one: {} iterations, {} bytes of salt)",
                        iterations.start(),
                        iterations.end(),
                        c.iterations,
                        c.salt.len()
                    ));
                }
            }
        }
        SecurityChange::Acl(a) => {
            let principal = &a.entry.principal;
            if principal != "*"
                && (principal.contains('*') || principal.chars().any(char::is_control))
            {
                return Err(format!(
                    "principal {principal:?}: a principal is a name or '*' (there are no principal patterns)"
                ));
            }
            let topic = &a.entry.topic;
            if topic.trim_end_matches('*').contains('*') || topic.ends_with("**") {
                return Err(format!(
                    "topic pattern {topic:?}: '*' may stand alone or end a prefix ('orders.*'), nowhere else"
                ));
            }
            if a.entry.operation == AclOperation::Admin && topic != "*" {
                return Err(
                    "the admin operation is about the cluster: give the topic '*'".to_owned(),
                );
            }
        }
    }
    Ok(())
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
        | Body::HandoffRequest(_)
        | Body::TopicAdminRequest(_)
        | Body::VoterChangeRequest(_) => (AclOperation::Admin, None),
        _ => return None,
    })
}

/// Whether `principal` may send `body`, under `settings` and the applied `tables`.
///
/// There is no way in but `super_users` and the entries: the first administrator is a
/// certificate's common name in `super_users` (a broker enforces entries only with client
/// certificates checked). A "localhost exception" for the first user was tried and
/// dropped: with certificate super users no user ever closed it, and any process on a
/// broker's machine could add a user named like a super user.
///
/// # Errors
/// `Unauthorized`, naming the principal, the operation and the resource.
pub fn authorize(
    settings: &AuthSettings,
    tables: &SecurityTables,
    principal: &Principal,
    body: &Body,
) -> Result<(), ErrorResponse> {
    if !settings.authorization {
        return Ok(());
    }
    let Some((operation, topic)) = required(body) else {
        return Ok(());
    };
    if is_broker(principal) {
        return Ok(());
    }
    let name = principal.name();
    let is_super = settings.super_users.iter().any(|s| s == name);
    if let Body::UserAdminRequest(u) = body {
        // A user named like a super user would be one: only a super user may set or remove
        // its password (an `admin` entry would otherwise be a way to every right, kept after
        // the entry is removed).
        if settings.super_users.contains(&u.0.user) && !is_super {
            return Err(ErrorResponse::new(
                ErrorCode::Unauthorized,
                format!(
                    "principal {name:?} may not set or remove user {:?}: it is a super user, whose login only a super user may change",
                    u.0.user
                ),
            ));
        }
    }
    if is_super || tables.allows(name, operation, topic) {
        return Ok(());
    }
    let resource = match topic {
        Some(t) => format!("topic {t:?}"),
        None => "the cluster".to_owned(),
    };
    Err(refusal(
        principal,
        operation,
        &resource,
        topic.unwrap_or("*"),
    ))
}

fn is_broker(principal: &Principal) -> bool {
    matches!(
        principal,
        Principal::Certificate {
            role: Some(Role::Broker),
            ..
        }
    )
}

/// Whether `principal` may be a member of Kafka consumer group `group` (join, sync,
/// heartbeat, leave, describe it, commit or read its offsets): an ACL entry with
/// [`AclOperation::Group`] (or `all`) whose pattern matches the group id, as Kafka asks
/// for `READ` on the group.
///
/// # Errors
/// `Unauthorized`, naming the principal and the group.
pub fn authorize_group(
    settings: &AuthSettings,
    tables: &SecurityTables,
    principal: &Principal,
    group: &str,
) -> Result<(), ErrorResponse> {
    if !settings.authorization || is_broker(principal) {
        return Ok(());
    }
    let name = principal.name();
    if settings.super_users.iter().any(|s| s == name)
        || tables.allows(name, AclOperation::Group, Some(group))
    {
        return Ok(());
    }
    Err(refusal(
        principal,
        AclOperation::Group,
        &format!("consumer group {group:?}"),
        group,
    ))
}

/// `Unauthorized` for `principal` lacking `operation` on `resource`, with the hint that
/// fixes it (an entry on `pattern`, or a login).
fn refusal(
    principal: &Principal,
    operation: AclOperation,
    resource: &str,
    pattern: &str,
) -> ErrorResponse {
    let name = principal.name();
    let hint = if matches!(principal, Principal::Anonymous) {
        "this connection proved nothing: log in (--user, QUIRE_USER) or show a client certificate"
            .to_owned()
    } else {
        format!(
            "an administrator can add one: quire acl add --principal '{name}' --operation {operation} --topic '{pattern}'"
        )
    };
    ErrorResponse::new(
        ErrorCode::Unauthorized,
        format!("principal {name:?} has no {operation} right on {resource}: no ACL entry grants it ({hint})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_proto::{FetchRequest, HandoffRequest, MetadataRequest, Offset, ProduceRequest};

    fn produce(topic: &str) -> Body {
        Body::ProduceRequest(ProduceRequest {
            format: quire_proto::MessageFormat::Raw,
            topic: topic.into(),
            producer_id: 0,
            sequence: 0,
            messages: vec![],
        })
    }

    fn fetch(topic: &str) -> Body {
        Body::FetchRequest(FetchRequest {
            records: false,
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

    /// Kafka consumer groups need a `group` entry (Kafka's READ on the group): a topic
    /// right is not one, `all` is, patterns match group ids, super users and brokers pass,
    /// and nothing is checked without authorization.
    #[test]
    fn a_consumer_group_needs_a_group_entry_for_its_id() {
        let mut tables = SecurityTables::default();
        for (principal, operation, pattern) in [
            ("alice", AclOperation::Group, "billing-*"),
            ("alice", AclOperation::Consume, "*"),
            ("bob", AclOperation::All, "reports"),
        ] {
            tables.apply_acl(AclAdminEvent {
                action: AclAction::Add,
                entry: AclEntry {
                    principal: principal.into(),
                    operation,
                    topic: pattern.into(),
                },
            });
        }
        let on = AuthSettings {
            authorization: true,
            super_users: vec!["root".into()],
        };
        let user = |u: &str| Principal::User(u.into());
        let check = |p: &Principal, g: &str| authorize_group(&on, &tables, p, g);
        assert!(check(&user("alice"), "billing-eu").is_ok());
        let refused = check(&user("alice"), "audit").unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unauthorized);
        assert!(
            refused.message.contains("consumer group \"audit\"")
                && refused
                    .message
                    .contains("--operation group --topic 'audit'"),
            "{}",
            refused.message
        );
        assert!(check(&user("bob"), "reports").is_ok(), "all includes group");
        assert!(check(&user("bob"), "billing-eu").is_err());
        assert!(check(&Principal::Anonymous, "billing-eu").is_err());
        assert!(check(&user("root"), "anything").is_ok());
        let broker = Principal::Certificate {
            name: "b1".into(),
            role: Some(Role::Broker),
        };
        assert!(check(&broker, "anything").is_ok());
        let off = AuthSettings::default();
        assert!(authorize_group(&off, &tables, &Principal::Anonymous, "audit").is_ok());
    }

    #[test]
    fn an_address_that_fails_too_often_is_refused_until_its_window_closes() {
        let mut f = LoginFailures::default();
        let a: std::net::IpAddr = [10, 0, 0, 1].into();
        let b: std::net::IpAddr = [10, 0, 0, 2].into();
        let t0 = std::time::Instant::now();
        for _ in 0..FAILED_LOGINS_MAX - 1 {
            f.failed(a, t0);
        }
        assert_eq!(f.blocked(a, t0), None);
        f.failed(a, t0);
        let second = std::time::Duration::from_secs(1);
        assert_eq!(
            f.blocked(a, t0 + second),
            Some(FAILED_LOGINS_WINDOW - second)
        );
        assert_eq!(f.blocked(b, t0), None, "another address is not held back");
        assert_eq!(f.blocked(a, t0 + FAILED_LOGINS_WINDOW), None);
        // A failure after the window opens a new one.
        f.failed(a, t0 + FAILED_LOGINS_WINDOW);
        assert_eq!(f.blocked(a, t0 + FAILED_LOGINS_WINDOW), None);
    }

    #[test]
    fn changes_no_login_or_entry_could_use_are_refused() {
        let user = |user: &str, iterations: u32| {
            SecurityChange::User(UserAdminEvent {
                user: user.into(),
                credential: Some(ScramCredential {
                    salt: bytes::Bytes::from_static(b"salt"),
                    iterations,
                    stored_key: [0; 32],
                    server_key: [0; 32],
                }),
            })
        };
        assert!(validate(&user("alice", 4096)).is_ok());
        for bad in [
            user("*", 4096),
            user(ANONYMOUS, 4096),
            user("a", 0),
            user("a", u32::MAX),
        ] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
        let acl = |operation, topic: &str| {
            SecurityChange::Acl(AclAdminEvent {
                action: AclAction::Add,
                entry: AclEntry {
                    principal: "alice".into(),
                    operation,
                    topic: topic.into(),
                },
            })
        };
        for ok in ["orders", "*", "orders.*"] {
            assert!(validate(&acl(AclOperation::Consume, ok)).is_ok(), "{ok}");
        }
        for bad in ["a*b", "zz**", "*x"] {
            assert!(validate(&acl(AclOperation::Consume, bad)).is_err(), "{bad}");
        }
        assert!(validate(&acl(AclOperation::Admin, "orders")).is_err());
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
        assert!(authorize(&on, &tables, &alice, &produce("orders")).is_ok());
        let refused = authorize(&on, &tables, &alice, &fetch("orders")).unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unauthorized);
        assert!(refused
            .message
            .contains("\"alice\" has no consume right on topic \"orders\""));
        assert!(authorize(&on, &tables, &alice, &produce("other")).is_err());
        assert!(authorize(&on, &tables, &Principal::Anonymous, &produce("orders")).is_err());
        // Anyone may ask for metadata.
        let metadata = Body::MetadataRequest(MetadataRequest::default());
        assert!(authorize(&on, &tables, &Principal::Anonymous, &metadata).is_ok());
        // Super users and brokers may do everything.
        let handoff = Body::HandoffRequest(HandoffRequest {
            to: quire_proto::BrokerId(2),
        });
        assert!(authorize(&on, &tables, &Principal::User("root".into()), &handoff).is_ok());
        let broker = Principal::Certificate {
            name: "b1".into(),
            role: Some(Role::Broker),
        };
        assert!(authorize(&on, &tables, &broker, &handoff).is_ok());
        let client = Principal::Certificate {
            name: "b1".into(),
            role: Some(Role::Client),
        };
        assert!(authorize(&on, &tables, &client, &handoff).is_err());
        // An admin entry does not reach a super user's login.
        assert!(tables.apply_acl(AclAdminEvent {
            action: AclAction::Add,
            entry: AclEntry {
                principal: "ops".into(),
                operation: AclOperation::Admin,
                topic: "*".into(),
            },
        }));
        let set = |user: &str| {
            Body::UserAdminRequest(quire_proto::UserAdminRequest(UserAdminEvent {
                user: user.into(),
                credential: None,
            }))
        };
        let ops = Principal::User("ops".into());
        assert!(authorize(&on, &tables, &ops, &set("bob")).is_ok());
        assert!(authorize(&on, &tables, &ops, &set("root")).is_err());
        let root = Principal::User("root".into());
        assert!(authorize(&on, &tables, &root, &set("root")).is_ok());
        // Off: nothing is checked.
        let off = AuthSettings::default();
        assert!(authorize(&off, &tables, &Principal::Anonymous, &handoff).is_ok());
        // Removing the entry takes the right away.
        assert!(tables.apply_acl(AclAdminEvent {
            action: AclAction::Remove,
            entry: AclEntry {
                principal: "alice".into(),
                operation: AclOperation::Produce,
                topic: "orders".into(),
            },
        }));
        assert!(authorize(&on, &tables, &alice, &produce("orders")).is_err());
    }
}
