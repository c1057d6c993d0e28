//! The consumer-group coordinator: Kafka's classic group membership protocol (JoinGroup,
//! SyncGroup, Heartbeat, LeaveGroup; KIP-62 for the session and rebalance timeouts,
//! KIP-394 for the member id handed out before the first join), kept in memory by the
//! master's Kafka listener.
//!
//! Membership is soft state, as in Kafka: a new master starts with no groups, and the
//! members of the old one, told `NOT_COORDINATOR` and then `UNKNOWN_MEMBER_ID`, join
//! again. What must survive a failover — the committed offsets — is not here: an offset
//! commit is a cursor commit (cursor = group id) through the replicated log
//! (`api::offset_commit`).
//!
//! A group moves through Kafka's states:
//!
//! ```text
//!   Empty ──join──▶ PreparingRebalance ──every member joined, or the rebalance
//!     ▲                  ▲    │              timeout──▶ CompletingRebalance
//!     │  last member     │    │                            │ leader's SyncGroup
//!     └──── leaves ──────┴────┴── a join, a leave, ◀───── Stable
//!                                 a session expiry
//! ```
//!
//! This type is the state machine alone: time comes in as an argument (`now`), answers go
//! out through oneshot channels, so tests drive it without a runtime or a clock.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tokio::sync::oneshot;

/// Session timeouts a member may ask for, in ms (Kafka's broker defaults
/// `group.min.session.timeout.ms` and `group.max.session.timeout.ms`).
pub const SESSION_TIMEOUT_MS: std::ops::RangeInclusive<i32> = 6_000..=1_800_000;
/// Groups with members held at once; a join that would start another is refused with
/// `GROUP_MAX_SIZE_REACHED` (a group without members is forgotten at once: its offsets
/// are in the log).
pub const GROUPS_MAX: usize = 4_096;
/// Members per group, at most (Kafka's `group.max.size` is unbounded by default; a bound
/// here keeps one group's memory bounded): `GROUP_MAX_SIZE_REACHED` beyond it. A member id
/// handed out before the first join (KIP-394) holds nothing: it is checked by its tag.
pub const MEMBERS_MAX: usize = 1_024;
/// Bytes of one member's protocol metadata (all its protocols together), and of one
/// assignment, at most: `INCONSISTENT_GROUP_PROTOCOL` beyond (a consumer's subscription
/// of hundreds of topics takes a few KiB).
pub const METADATA_BYTES_MAX: usize = 256 << 10;
/// Bytes of protocol metadata and assignments the coordinator holds for all groups
/// together, at most: a join beyond it is refused with `GROUP_MAX_SIZE_REACHED`.
pub const HELD_BYTES_MAX: usize = 256 << 20;
/// Members that one client address holds over all groups, at most
/// (`GROUP_MAX_SIZE_REACHED` beyond): without a login on the listener, one host could
/// otherwise start all [`GROUPS_MAX`] groups with idle members of 30-minute sessions and
/// keep every other consumer out (found by a break-it trial).
pub const MEMBERS_PER_HOST_MAX: usize = 1_024;
/// Members over all groups, at most (`GROUP_MAX_SIZE_REACHED` beyond).
pub const MEMBERS_TOTAL_MAX: usize = 65_536;

/// How long a group that had no members waits for more to join before its first
/// generation (Kafka's `group.initial.rebalance.delay.ms`, 3 s by default): consumers
/// starting together, or rejoining a new master after a failover, form one generation
/// instead of the first taking every partition for a moment.
pub const INITIAL_REBALANCE_DELAY: Duration = Duration::from_secs(3);
/// Bytes of the client id kept in a member id, at most.
const MEMBER_ID_CLIENT_BYTES_MAX: usize = 64;

/// A group's state, as DescribeGroups and ListGroups name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    /// No members.
    Empty,
    /// Waiting for the members to join again.
    PreparingRebalance,
    /// Joined; waiting for the leader's assignment.
    CompletingRebalance,
    /// Every member has its assignment.
    Stable,
}

impl GroupState {
    /// Kafka's name for the state.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// A JoinGroup, decoded.
#[derive(Clone, Debug)]
pub struct Join {
    /// The group id (non-empty).
    pub group: String,
    /// The member id; empty for a member joining for the first time.
    pub member_id: String,
    /// The static member id (KIP-345), kept and shown only.
    pub instance_id: Option<String>,
    /// The client's `client.id` (request header).
    pub client_id: String,
    /// The client's address.
    pub client_host: String,
    /// ms without a heartbeat after which the member is removed.
    pub session_timeout_ms: i32,
    /// ms the coordinator waits for every member to join again in a rebalance.
    pub rebalance_timeout_ms: i32,
    /// The protocol type (`consumer` for consumers).
    pub protocol_type: String,
    /// The protocols the member supports (assignor name, metadata), in its order of
    /// preference.
    pub protocols: Vec<(String, Bytes)>,
    /// Version 4 and later: a member without an id is given one and must join again with it
    /// (`MEMBER_ID_REQUIRED`, KIP-394).
    pub member_id_required: bool,
}

/// The answer to a JoinGroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Joined {
    /// `None` for success.
    pub error: Option<ResponseError>,
    /// The new generation.
    pub generation: i32,
    /// The group's protocol type.
    pub protocol_type: Option<String>,
    /// The protocol chosen.
    pub protocol_name: Option<String>,
    /// The leader's member id.
    pub leader: String,
    /// This member's id.
    pub member_id: String,
    /// For the leader: every member with its metadata for the chosen protocol; empty for
    /// the others.
    pub members: Vec<(String, Option<String>, Bytes)>,
}

impl Joined {
    fn error(e: ResponseError, member_id: &str) -> Joined {
        Joined {
            error: Some(e),
            generation: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            member_id: member_id.to_owned(),
            members: Vec::new(),
        }
    }
}

/// The answer to a SyncGroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Synced {
    /// `None` for success.
    pub error: Option<ResponseError>,
    /// The group's protocol type.
    pub protocol_type: Option<String>,
    /// The protocol chosen.
    pub protocol_name: Option<String>,
    /// This member's assignment (the leader's bytes for it; empty if it gave none).
    pub assignment: Bytes,
}

impl Synced {
    fn error(e: ResponseError) -> Synced {
        Synced {
            error: Some(e),
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }
}

/// An answer now, or one to come.
#[derive(Debug)]
pub enum Answer<T> {
    /// Answered at once.
    Now(T),
    /// Answered when the rebalance gets there (a dropped sender means the member was
    /// removed or replaced first).
    Later(oneshot::Receiver<T>),
}

impl Member {
    /// Bytes of metadata and assignment this member holds.
    fn held_bytes(&self) -> usize {
        self.protocols
            .iter()
            .map(|(n, m)| n.len() + m.len())
            .sum::<usize>()
            + self.assignment.len()
    }
}

#[derive(Debug)]
struct Member {
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    last_seen: Instant,
    join: Option<oneshot::Sender<Joined>>,
    sync: Option<oneshot::Sender<Synced>>,
}

#[derive(Debug)]
struct Group {
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    rebalance_deadline: Option<Instant>,
    /// Bytes of metadata and assignments its members hold ([`Group::recount`]).
    held: usize,
    /// In CompletingRebalance: when the members that have not sent SyncGroup are removed
    /// (the generation's longest rebalance timeout after it formed, as Kafka does).
    sync_deadline: Option<Instant>,
    /// While set and not passed, the join phase does not end early when every member has
    /// joined: the group had no members ([`INITIAL_REBALANCE_DELAY`]).
    initial_until: Option<Instant>,
}

impl Group {
    /// Removes the members that did not send SyncGroup by the deadline (a rebalance
    /// follows).
    fn expire_unsynced(&mut self, now: Instant) {
        if self.state != GroupState::CompletingRebalance
            || self.sync_deadline.is_none_or(|d| now < d)
        {
            return;
        }
        let silent: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| m.sync.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        self.sync_deadline = None;
        self.remove(&silent, now);
    }

    /// Counts the bytes its members hold again (after any change to them).
    fn recount(&mut self) {
        self.held = self.members.values().map(Member::held_bytes).sum();
    }

    fn new() -> Group {
        Group {
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            rebalance_deadline: None,
            held: 0,
            sync_deadline: None,
            initial_until: None,
        }
    }

    /// Starts a rebalance (or keeps the one running): every member must join again.
    fn prepare_rebalance(&mut self, now: Instant) {
        if self.state == GroupState::PreparingRebalance {
            return;
        }
        for m in self.members.values_mut() {
            // A member waiting for its assignment is told to join again.
            if let Some(tx) = m.sync.take() {
                let _ = tx.send(Synced::error(ResponseError::RebalanceInProgress));
            }
        }
        let wait = self
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default();
        if self.state == GroupState::Empty {
            let delay = INITIAL_REBALANCE_DELAY.min(wait);
            self.initial_until = Some(now + delay);
            self.rebalance_deadline = Some(now + delay);
        } else {
            self.initial_until = None;
            self.rebalance_deadline = Some(now + wait);
        }
        self.state = GroupState::PreparingRebalance;
    }

    /// Ends the join phase once every member joined again, or at the rebalance deadline
    /// (members that did not join by then are removed): a new generation, its leader
    /// given every member's metadata.
    fn try_complete_join(&mut self, now: Instant) {
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let all_joined = self.members.values().all(|m| m.join.is_some())
            && self.initial_until.is_none_or(|t| now >= t);
        let late = self.rebalance_deadline.is_some_and(|d| now >= d);
        if !all_joined && !late {
            return;
        }
        self.initial_until = None;
        self.members.retain(|_, m| m.join.is_some());
        self.generation = self.generation.wrapping_add(1).max(1);
        self.rebalance_deadline = None;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol = None;
            self.protocol_type = None;
            self.leader = None;
            return;
        }
        if !self
            .leader
            .as_ref()
            .is_some_and(|l| self.members.contains_key(l))
        {
            self.leader = self.members.keys().next().cloned();
        }
        let leader = self.leader.clone().unwrap_or_default();
        self.protocol = self.choose_protocol(&leader);
        self.state = GroupState::CompletingRebalance;
        self.sync_deadline = self
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .map(|t| now + t);
        let protocol = self.protocol.clone().unwrap_or_default();
        let everyone: Vec<(String, Option<String>, Bytes)> = self
            .members
            .iter()
            .map(|(id, m)| {
                let metadata = m
                    .protocols
                    .iter()
                    .find(|(n, _)| *n == protocol)
                    .map(|(_, b)| b.clone())
                    .unwrap_or_default();
                (id.clone(), m.instance_id.clone(), metadata)
            })
            .collect();
        for (id, m) in &mut self.members {
            m.assignment = Bytes::new();
            m.last_seen = now;
            if let Some(tx) = m.join.take() {
                let _ = tx.send(Joined {
                    error: None,
                    generation: self.generation,
                    protocol_type: self.protocol_type.clone(),
                    protocol_name: self.protocol.clone(),
                    leader: leader.clone(),
                    member_id: id.clone(),
                    members: if *id == leader {
                        everyone.clone()
                    } else {
                        Vec::new()
                    },
                });
            }
        }
    }

    /// The protocol every member supports that most members list first among those
    /// (Kafka's vote), ties broken by the leader's order.
    fn choose_protocol(&self, leader: &str) -> Option<String> {
        let common = |name: &str| {
            self.members
                .values()
                .all(|m| m.protocols.iter().any(|(n, _)| n == name))
        };
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some((n, _)) = m.protocols.iter().find(|(n, _)| common(n)) {
                *votes.entry(n.as_str()).or_default() += 1;
            }
        }
        let order = &self.members.get(leader)?.protocols;
        let mut best: Option<(&str, usize)> = None;
        for (n, _) in order {
            let v = votes.get(n.as_str()).copied().unwrap_or(0);
            if v > 0 && best.is_none_or(|(_, b)| v > b) {
                best = Some((n, v));
            }
        }
        best.map(|(n, _)| n.to_owned())
    }

    /// Whether `protocols` share one protocol with every member now in the group.
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return true;
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols.iter().any(|(n, _)| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(o, _)| o == n))
            })
    }

    /// Removes members; starts a rebalance if any are left.
    fn remove(&mut self, ids: &[String], now: Instant) {
        let mut removed = false;
        for id in ids {
            removed |= self.members.remove(id).is_some();
        }
        if !removed {
            return;
        }
        if self.leader.as_ref().is_some_and(|l| ids.contains(l)) {
            self.leader = None;
        }
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.generation = self.generation.wrapping_add(1).max(1);
            self.protocol = None;
            self.protocol_type = None;
            self.rebalance_deadline = None;
        } else {
            self.prepare_rebalance(now);
            self.try_complete_join(now);
        }
        self.recount();
    }
}

/// Every group this coordinator holds, for the master epoch it coordinates in.
#[derive(Debug, Default)]
pub struct Groups {
    groups: BTreeMap<String, Group>,
    epoch: Option<u64>,
    /// The key of the member-id tags: SipHash keyed with random keys drawn once per
    /// coordinator (std's `RandomState`), so that a tag cannot be made without asking.
    tags: std::collections::hash_map::RandomState,
    /// Members per client address, counted again at each [`Groups::tick`] and counted up
    /// at each join in between (so between ticks it may count members already gone: it
    /// refuses early, never late).
    hosts: std::collections::HashMap<String, usize>,
    /// Members over all groups, counted likewise.
    members: usize,
}

/// Hex digits of a member id's nonce and of its tag.
const NONCE_HEX: usize = 16;
const TAG_HEX: usize = 16;

/// The tag of a member id handed out for `group` with `nonce`.
fn tag(key: &std::collections::hash_map::RandomState, group: &str, nonce: u64) -> u64 {
    use std::hash::BuildHasher;
    key.hash_one((group, nonce))
}

/// Whether `member_id` ends with a nonce and its tag for `group` under `key`.
fn tagged(key: &std::collections::hash_map::RandomState, group: &str, member_id: &str) -> bool {
    let Some(tail) = member_id
        .len()
        .checked_sub(NONCE_HEX + TAG_HEX)
        .and_then(|at| member_id.get(at..))
    else {
        return false;
    };
    let (nonce, t) = tail.split_at(NONCE_HEX);
    match (u64::from_str_radix(nonce, 16), u64::from_str_radix(t, 16)) {
        (Ok(nonce), Ok(t)) => tag(key, group, nonce) == t,
        _ => false,
    }
}

/// A group's state as DescribeGroups shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    /// The state.
    pub state: GroupState,
    /// The protocol type (empty for none).
    pub protocol_type: String,
    /// The protocol chosen (empty for none).
    pub protocol: String,
    /// `(member id, instance id, client id, client host, metadata, assignment)` each.
    pub members: Vec<DescribedMember>,
}

/// One member as DescribeGroups shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescribedMember {
    /// Member id.
    pub member_id: String,
    /// Static member id.
    pub instance_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client address.
    pub client_host: String,
    /// Its metadata for the chosen protocol (empty before one is chosen).
    pub metadata: Bytes,
    /// Its assignment (empty before the leader's SyncGroup).
    pub assignment: Bytes,
}

impl Groups {
    /// Drops every group if the master epoch changed since the groups were formed: this
    /// broker became master again, after another master whose groups its members joined.
    pub fn coordinate_in(&mut self, epoch: u64) {
        if self.epoch != Some(epoch) {
            self.groups.clear();
            self.epoch = Some(epoch);
        }
    }

    /// JoinGroup.
    ///
    /// A member joining for the first time (empty member id) is given an id: its client
    /// id, `-`, a 64-bit random nonce and a 64-bit tag of (group, nonce) under this
    /// coordinator's key, in hex. From version 4 (`member_id_required`) the id is answered
    /// with `MEMBER_ID_REQUIRED` and nothing is kept until the member joins with it, when
    /// its tag shows it was handed out here for this group (KIP-394's purpose — a member
    /// whose first join timed out cannot leave a ghost behind — without a table of ids an
    /// unauthenticated client could fill).
    pub fn join(&mut self, req: Join, now: Instant) -> Answer<Joined> {
        let fail = |e| Answer::Now(Joined::error(e, &req.member_id));
        if req.group.is_empty() {
            return fail(ResponseError::InvalidGroupId);
        }
        if !SESSION_TIMEOUT_MS.contains(&req.session_timeout_ms) {
            return fail(ResponseError::InvalidSessionTimeout);
        }
        let adds: usize = req.protocols.iter().map(|(n, m)| n.len() + m.len()).sum();
        if req.protocol_type.is_empty() || req.protocols.is_empty() || adds > METADATA_BYTES_MAX {
            return fail(ResponseError::InconsistentGroupProtocol);
        }
        let known = self.groups.get(&req.group);
        if known.is_none() && self.groups.len() >= GROUPS_MAX {
            return fail(ResponseError::GroupMaxSizeReached);
        }
        if known.is_some_and(|g| !g.supports(&req.protocol_type, &req.protocols)) {
            return fail(ResponseError::InconsistentGroupProtocol);
        }
        let current = known.and_then(|g| g.members.get(&req.member_id));
        if current.is_none() && known.is_some_and(|g| g.members.len() >= MEMBERS_MAX) {
            return fail(ResponseError::GroupMaxSizeReached);
        }
        let from_host = self.hosts.get(&req.client_host).copied().unwrap_or(0);
        let hands_out_an_id = req.member_id.is_empty() && req.member_id_required;
        if current.is_none()
            && !hands_out_an_id
            && (from_host >= MEMBERS_PER_HOST_MAX || self.members >= MEMBERS_TOTAL_MAX)
        {
            tracing::warn!(group = %req.group, host = %req.client_host, from_host, members = self.members, "group coordinator: member bound reached, join refused");
            return fail(ResponseError::GroupMaxSizeReached);
        }
        let held_before = current.map_or(0, Member::held_bytes);
        let held: usize = self.groups.values().map(|g| g.held).sum();
        if held.saturating_sub(held_before) + adds > HELD_BYTES_MAX {
            tracing::warn!(group = %req.group, held, "group coordinator: metadata bound reached, join refused");
            return fail(ResponseError::GroupMaxSizeReached);
        }
        let member_id = if req.member_id.is_empty() {
            let client: String = req
                .client_id
                .chars()
                .scan(0, |n, c| {
                    *n += c.len_utf8();
                    (*n <= MEMBER_ID_CLIENT_BYTES_MAX).then_some(c)
                })
                .collect();
            let nonce: u64 = rand::random();
            let id = format!(
                "{client}-{nonce:0w$x}{:0t$x}",
                tag(&self.tags, &req.group, nonce),
                w = NONCE_HEX,
                t = TAG_HEX
            );
            if req.member_id_required {
                return Answer::Now(Joined::error(ResponseError::MemberIdRequired, &id));
            }
            id
        } else if current.is_some() || tagged(&self.tags, &req.group, &req.member_id) {
            req.member_id.clone()
        } else {
            return fail(ResponseError::UnknownMemberId);
        };
        let session_timeout = Duration::from_millis(req.session_timeout_ms.unsigned_abs().into());
        let rebalance_timeout = Duration::from_millis(
            req.rebalance_timeout_ms
                .max(req.session_timeout_ms)
                .unsigned_abs()
                .into(),
        );
        if !self
            .groups
            .get(&req.group)
            .is_some_and(|g| g.members.contains_key(&member_id))
        {
            *self.hosts.entry(req.client_host.clone()).or_default() += 1;
            self.members += 1;
        }
        let group = self
            .groups
            .entry(req.group.clone())
            .or_insert_with(Group::new);
        let (tx, rx) = oneshot::channel();
        let member = group.members.entry(member_id).or_insert_with(|| Member {
            instance_id: None,
            client_id: String::new(),
            client_host: String::new(),
            session_timeout,
            rebalance_timeout,
            protocols: Vec::new(),
            assignment: Bytes::new(),
            last_seen: now,
            join: None,
            sync: None,
        });
        member.instance_id = req.instance_id;
        member.client_id = req.client_id;
        member.client_host = req.client_host;
        member.session_timeout = session_timeout;
        member.rebalance_timeout = rebalance_timeout;
        member.protocols = req.protocols;
        member.last_seen = now;
        member.join = Some(tx);
        if group.members.len() == 1 {
            group.protocol_type = Some(req.protocol_type);
        }
        group.prepare_rebalance(now);
        group.try_complete_join(now);
        group.recount();
        Answer::Later(rx)
    }

    /// SyncGroup: the leader's `assignments` (member id, bytes) are handed to every member.
    pub fn sync(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        assignments: Vec<(String, Bytes)>,
        now: Instant,
    ) -> Answer<Synced> {
        let held_elsewhere: usize = self
            .groups
            .iter()
            .filter(|(id, _)| id.as_str() != group)
            .map(|(_, g)| g.held)
            .sum();
        let Some(g) = self.groups.get_mut(group) else {
            return Answer::Now(Synced::error(ResponseError::UnknownMemberId));
        };
        let Some(m) = g.members.get_mut(member_id) else {
            return Answer::Now(Synced::error(ResponseError::UnknownMemberId));
        };
        m.last_seen = now;
        if generation != g.generation {
            return Answer::Now(Synced::error(ResponseError::IllegalGeneration));
        }
        let answer = |g: &Group, m: &Member| Synced {
            error: None,
            protocol_type: g.protocol_type.clone(),
            protocol_name: g.protocol.clone(),
            assignment: m.assignment.clone(),
        };
        match g.state {
            GroupState::Empty | GroupState::PreparingRebalance => {
                Answer::Now(Synced::error(ResponseError::RebalanceInProgress))
            }
            GroupState::Stable => Answer::Now(answer(g, &g.members[member_id])),
            GroupState::CompletingRebalance => {
                let (tx, rx) = oneshot::channel();
                if let Some(m) = g.members.get_mut(member_id) {
                    m.sync = Some(tx);
                }
                if g.leader.as_deref() == Some(member_id) {
                    let protocols: usize = g
                        .members
                        .values()
                        .map(|m| {
                            m.protocols
                                .iter()
                                .map(|(n, b)| n.len() + b.len())
                                .sum::<usize>()
                        })
                        .sum();
                    let assigned: usize = assignments
                        .iter()
                        .filter(|(id, _)| g.members.contains_key(id))
                        .map(|(_, b)| b.len())
                        .sum();
                    if held_elsewhere + protocols + assigned > HELD_BYTES_MAX {
                        // The assignments would take the coordinator past its bound: the
                        // generation is given up, and its members join again.
                        tracing::warn!(
                            group,
                            "group coordinator: assignments past the metadata bound, sync refused"
                        );
                        g.prepare_rebalance(now);
                        g.recount();
                        return Answer::Now(Synced::error(ResponseError::GroupMaxSizeReached));
                    }
                    for (id, bytes) in assignments {
                        if bytes.len() <= METADATA_BYTES_MAX {
                            if let Some(m) = g.members.get_mut(&id) {
                                m.assignment = bytes;
                            }
                        }
                    }
                    g.state = GroupState::Stable;
                    g.recount();
                    let answers: Vec<(String, Synced)> = g
                        .members
                        .iter()
                        .map(|(id, m)| (id.clone(), answer(g, m)))
                        .collect();
                    for (id, a) in answers {
                        if let Some(tx) = g.members.get_mut(&id).and_then(|m| m.sync.take()) {
                            let _ = tx.send(a);
                        }
                    }
                }
                Answer::Later(rx)
            }
        }
    }

    /// Heartbeat: `None` while the member's generation is current and stable,
    /// `REBALANCE_IN_PROGRESS` when it must join again.
    pub fn heartbeat(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        now: Instant,
    ) -> Option<ResponseError> {
        let g = match self.member_of(group, generation, member_id, now) {
            Ok(g) => g,
            Err(e) => return Some(e),
        };
        match g.state {
            GroupState::PreparingRebalance | GroupState::Empty => {
                Some(ResponseError::RebalanceInProgress)
            }
            GroupState::CompletingRebalance | GroupState::Stable => None,
        }
    }

    /// The group `member_id` belongs to, the member seen at `now`, if `generation` is the
    /// group's: `UNKNOWN_MEMBER_ID` or `ILLEGAL_GENERATION` otherwise.
    fn member_of(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        now: Instant,
    ) -> Result<&mut Group, ResponseError> {
        let g = self
            .groups
            .get_mut(group)
            .ok_or(ResponseError::UnknownMemberId)?;
        let m = g
            .members
            .get_mut(member_id)
            .ok_or(ResponseError::UnknownMemberId)?;
        m.last_seen = now;
        if generation != g.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        Ok(g)
    }

    /// Whether `member_id` of `generation` may commit offsets for `group` now. A commit
    /// with generation -1 and no member id (a consumer that assigns partitions itself) is
    /// taken when the group has no members.
    pub fn may_commit(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        now: Instant,
    ) -> Option<ResponseError> {
        let g = self.groups.get_mut(group);
        if generation < 0 && member_id.is_empty() {
            return match g {
                Some(g) if !g.members.is_empty() => Some(ResponseError::UnknownMemberId),
                _ => None,
            };
        }
        let g = match self.member_of(group, generation, member_id, now) {
            Ok(g) => g,
            Err(e) => return Some(e),
        };
        // As Kafka: the generation's members may commit while the group prepares a
        // rebalance (that is when their partitions are revoked, and commit), not while
        // it waits for the new generation's assignment.
        match g.state {
            GroupState::Stable | GroupState::PreparingRebalance => None,
            GroupState::Empty | GroupState::CompletingRebalance => {
                Some(ResponseError::RebalanceInProgress)
            }
        }
    }

    /// LeaveGroup: each member's result (`UNKNOWN_MEMBER_ID` for one not in the group).
    pub fn leave(
        &mut self,
        group: &str,
        members: &[String],
        now: Instant,
    ) -> Vec<Option<ResponseError>> {
        let Some(g) = self.groups.get_mut(group) else {
            return vec![Some(ResponseError::UnknownMemberId); members.len()];
        };
        let results = members
            .iter()
            .map(|id| (!g.members.contains_key(id)).then_some(ResponseError::UnknownMemberId))
            .collect();
        g.remove(members, now);
        if g.members.is_empty() {
            self.groups.remove(group);
        }
        results
    }

    /// Time passes: members silent for their session timeout are removed (a member
    /// waiting in a join is not silent), a rebalance whose deadline passed completes
    /// without the members that did not join, and groups left without members are
    /// forgotten.
    pub fn tick(&mut self, now: Instant) {
        for g in self.groups.values_mut() {
            let expired: Vec<String> = g
                .members
                .iter()
                .filter(|(_, m)| m.join.is_none() && now >= m.last_seen + m.session_timeout)
                .map(|(id, _)| id.clone())
                .collect();
            g.remove(&expired, now);
            g.try_complete_join(now);
            g.expire_unsynced(now);
            g.recount();
        }
        self.groups.retain(|_, g| !g.members.is_empty());
        self.hosts.clear();
        self.members = 0;
        for m in self.groups.values().flat_map(|g| g.members.values()) {
            *self.hosts.entry(m.client_host.clone()).or_default() += 1;
            self.members += 1;
        }
    }

    /// Groups with members: `(group id, protocol type, state)`, by id.
    #[must_use]
    pub fn list(&self) -> Vec<(String, String, GroupState)> {
        self.groups
            .iter()
            .filter(|(_, g)| !g.members.is_empty())
            .map(|(id, g)| {
                (
                    id.clone(),
                    g.protocol_type.clone().unwrap_or_default(),
                    g.state,
                )
            })
            .collect()
    }

    /// DescribeGroups for one group (`Empty` with no members for one not held).
    #[must_use]
    pub fn describe(&self, group: &str) -> Described {
        let Some(g) = self.groups.get(group) else {
            return Described {
                state: GroupState::Empty,
                protocol_type: String::new(),
                protocol: String::new(),
                members: Vec::new(),
            };
        };
        let protocol = g.protocol.clone().unwrap_or_default();
        Described {
            state: g.state,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol: protocol.clone(),
            members: g
                .members
                .iter()
                .map(|(id, m)| DescribedMember {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: m
                        .protocols
                        .iter()
                        .find(|(n, _)| *n == protocol)
                        .map(|(_, b)| b.clone())
                        .unwrap_or_default(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn join(member_id: &str, protocols: &[&str]) -> Join {
        Join {
            group: "g".to_owned(),
            member_id: member_id.to_owned(),
            instance_id: None,
            client_id: "c".to_owned(),
            client_host: "127.0.0.1".to_owned(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 20_000,
            protocol_type: "consumer".to_owned(),
            protocols: protocols
                .iter()
                .map(|p| ((*p).to_owned(), Bytes::from(format!("meta-{member_id}"))))
                .collect(),
            member_id_required: true,
        }
    }

    fn now_answer<T: std::fmt::Debug>(a: Answer<T>) -> T {
        match a {
            Answer::Now(t) => t,
            Answer::Later(_) => panic!("expected an answer now"),
        }
    }

    fn later<T>(a: Answer<T>) -> oneshot::Receiver<T> {
        match a {
            Answer::Later(rx) => rx,
            Answer::Now(_) => panic!("expected an answer later"),
        }
    }

    /// Joins a member from scratch (MEMBER_ID_REQUIRED, then the join with its id).
    fn new_member(
        g: &mut Groups,
        protocols: &[&str],
        t: Instant,
    ) -> (String, oneshot::Receiver<Joined>) {
        let first = now_answer(g.join(join("", protocols), t));
        assert_eq!(first.error, Some(ResponseError::MemberIdRequired));
        let rx = later(g.join(join(&first.member_id, protocols), t));
        (first.member_id, rx)
    }

    /// A group of one member at generation 1 (formed after the initial delay), its
    /// assignment synced; the time it became stable.
    fn one_member(g: &mut Groups, t: Instant) -> (String, Instant) {
        let (a, mut rx) = new_member(g, &["range"], t);
        assert!(
            rx.try_recv().is_err(),
            "the first generation waits for the initial delay"
        );
        let t = t + INITIAL_REBALANCE_DELAY;
        g.tick(t);
        let joined = rx.try_recv().unwrap();
        assert_eq!((joined.error, joined.generation), (None, 1));
        assert_eq!(joined.leader, a);
        let _ = g.sync("g", 1, &a, vec![(a.clone(), Bytes::from("all"))], t);
        (a, t)
    }

    /// One member: join, the leader's own sync, heartbeats, commits; a second member makes
    /// the first join again; the leader's assignment reaches both; a leave rebalances.
    #[test]
    fn members_join_sync_heartbeat_and_leave() {
        let mut g = Groups::default();
        g.coordinate_in(7);
        let (a, t) = one_member(&mut g, Instant::now());
        assert_eq!(g.describe("g").members[0].assignment, Bytes::from("all"));
        assert_eq!(g.heartbeat("g", 1, &a, t), None);
        assert_eq!(g.may_commit("g", 1, &a, t), None);
        assert_eq!(
            g.may_commit("g", 0, &a, t),
            Some(ResponseError::IllegalGeneration)
        );
        assert_eq!(
            g.may_commit("g", -1, "", t),
            Some(ResponseError::UnknownMemberId),
            "a group with members takes no commits from outside it"
        );

        // b joins: a is told by its heartbeat, may still commit, joins again; both get
        // generation 2 at once (no initial delay: the group had members).
        let (b, mut rx_b) = new_member(&mut g, &["range"], t);
        assert!(rx_b.try_recv().is_err(), "b waits for a");
        assert_eq!(
            g.heartbeat("g", 1, &a, t),
            Some(ResponseError::RebalanceInProgress)
        );
        assert_eq!(
            g.may_commit("g", 1, &a, t),
            None,
            "a commits while its partitions are revoked"
        );
        let mut rx_a = later(g.join(join(&a, &["range"]), t));
        let (ja, jb) = (rx_a.try_recv().unwrap(), rx_b.try_recv().unwrap());
        assert_eq!((ja.generation, jb.generation), (2, 2));
        assert_eq!(ja.members.len(), 2, "the leader learns every member");
        assert!(jb.members.is_empty());
        assert_eq!(
            g.may_commit("g", 2, &a, t),
            Some(ResponseError::RebalanceInProgress),
            "no commits while the new assignment is awaited"
        );
        // b syncs first and waits for the leader's assignment.
        let mut sb = later(g.sync("g", 2, &b, Vec::new(), t));
        assert!(sb.try_recv().is_err());
        let mut sa = later(g.sync(
            "g",
            2,
            &a,
            vec![
                (a.clone(), Bytes::from("p0")),
                (b.clone(), Bytes::from("p1")),
            ],
            t,
        ));
        assert_eq!(sa.try_recv().unwrap().assignment, Bytes::from("p0"));
        assert_eq!(sb.try_recv().unwrap().assignment, Bytes::from("p1"));
        assert_eq!(g.describe("g").state, GroupState::Stable);

        // a leaves: b must join again and becomes the leader of generation 3.
        assert_eq!(
            g.leave("g", &[a.clone(), "nobody".to_owned()], t),
            vec![None, Some(ResponseError::UnknownMemberId)]
        );
        assert_eq!(
            g.heartbeat("g", 2, &b, t),
            Some(ResponseError::RebalanceInProgress)
        );
        let mut rx_b = later(g.join(join(&b, &["range"]), t));
        let jb = rx_b.try_recv().unwrap();
        assert_eq!((jb.generation, jb.leader.as_str()), (3, b.as_str()));
        // The last member leaves: the group is forgotten.
        g.leave("g", &[b], t);
        assert!(g.list().is_empty());
    }

    /// Members that join within the initial delay form one generation.
    #[test]
    fn members_starting_together_form_one_generation() {
        let t = Instant::now();
        let mut g = Groups::default();
        let mut rxs: Vec<_> = (0..3)
            .map(|i| new_member(&mut g, &["range"], t + SECOND * i).1)
            .collect();
        g.tick(t + INITIAL_REBALANCE_DELAY - Duration::from_millis(1));
        assert!(rxs.iter_mut().all(|rx| rx.try_recv().is_err()));
        g.tick(t + INITIAL_REBALANCE_DELAY);
        let joined: Vec<Joined> = rxs.iter_mut().map(|rx| rx.try_recv().unwrap()).collect();
        assert!(joined.iter().all(|j| j.generation == 1));
        assert_eq!(joined.iter().map(|j| j.members.len()).sum::<usize>(), 3);
    }

    /// A member silent for its session timeout is removed; one that does not join again
    /// within the rebalance timeout is left out of the next generation.
    #[test]
    fn silent_members_are_removed() {
        let mut g = Groups::default();
        let (a, t) = one_member(&mut g, Instant::now());
        let (b, mut rx_b) = new_member(&mut g, &["range"], t);
        // a heartbeats (told to join again) but never joins: after the rebalance timeout
        // (20 s) b is alone.
        for at in [9, 18] {
            assert_eq!(
                g.heartbeat("g", 1, &a, t + SECOND * at),
                Some(ResponseError::RebalanceInProgress)
            );
            g.tick(t + SECOND * at);
        }
        g.tick(t + SECOND * 19);
        assert!(rx_b.try_recv().is_err());
        g.tick(t + SECOND * 21);
        let jb = rx_b.try_recv().unwrap();
        assert_eq!((jb.generation, jb.leader.as_str()), (2, b.as_str()));
        assert_eq!(
            g.heartbeat("g", 1, &a, t),
            Some(ResponseError::UnknownMemberId)
        );
        // b stops heartbeating: removed after its session timeout (10 s).
        let _ = g.sync("g", 2, &b, Vec::new(), t + SECOND * 21);
        g.tick(t + SECOND * 30);
        assert_eq!(g.list().len(), 1);
        g.tick(t + SECOND * 32);
        assert!(g.list().is_empty());
    }

    #[test]
    fn bad_joins_are_refused() {
        let t = Instant::now();
        let mut g = Groups::default();
        let mut short = join("", &["range"]);
        short.session_timeout_ms = 100;
        assert_eq!(
            now_answer(g.join(short, t)).error,
            Some(ResponseError::InvalidSessionTimeout)
        );
        let mut big = join("", &["range"]);
        big.protocols[0].1 = Bytes::from(vec![0u8; METADATA_BYTES_MAX]);
        assert_eq!(
            now_answer(g.join(big, t)).error,
            Some(ResponseError::InconsistentGroupProtocol)
        );
        let (_a, _rx) = new_member(&mut g, &["range"], t);
        assert_eq!(
            now_answer(g.join(join("", &["sticky"]), t)).error,
            Some(ResponseError::InconsistentGroupProtocol),
            "no protocol in common with the members"
        );
    }

    /// A member id handed out is kept nowhere: it is good for its group only, and any
    /// other id a client makes up is refused.
    #[test]
    fn member_ids_prove_themselves() {
        let t = Instant::now();
        let mut g = Groups::default();
        for _ in 0..10_000 {
            let _ = g.join(join("", &["range"]), t);
        }
        assert!(g.list().is_empty(), "ids handed out hold nothing");
        let id = now_answer(g.join(join("", &["range"]), t)).member_id;
        let mut other_group = join(&id, &["range"]);
        other_group.group = "h".to_owned();
        assert_eq!(
            now_answer(g.join(other_group, t)).error,
            Some(ResponseError::UnknownMemberId)
        );
        let mut forged = id.clone().into_bytes();
        let last = forged.len() - 1;
        forged[last] = if forged[last] == b'0' { b'1' } else { b'0' };
        let forged = String::from_utf8(forged).unwrap();
        for made_up in ["made-up", "", "c-00", forged.as_str()] {
            if made_up.is_empty() {
                continue;
            }
            assert_eq!(
                now_answer(g.join(join(made_up, &["range"]), t)).error,
                Some(ResponseError::UnknownMemberId),
                "{made_up}"
            );
        }
        let _rx = later(g.join(join(&id, &["range"]), t));
        assert_eq!(g.describe("g").members.len(), 1);
    }

    /// The coordinator holds at most HELD_BYTES_MAX of metadata over all groups.
    #[test]
    fn held_metadata_is_bounded() {
        let t = Instant::now();
        let mut g = Groups::default();
        let meta = Bytes::from(vec![7u8; METADATA_BYTES_MAX - 8]);
        let fits = HELD_BYTES_MAX / METADATA_BYTES_MAX;
        let mut refused = 0;
        for i in 0..fits + 4 {
            let mut j = join("", &["range"]);
            j.group = format!("g{}", i % 8);
            j.member_id_required = false;
            j.protocols[0].1 = meta.clone();
            if let Answer::Now(r) = g.join(j, t) {
                assert_eq!(r.error, Some(ResponseError::GroupMaxSizeReached));
                refused += 1;
            }
        }
        assert!(refused >= 4, "{refused}");
        let held: usize = g.groups.values().map(|g| g.held).sum();
        assert!(held <= HELD_BYTES_MAX);
    }

    /// Assignments count against the coordinator's bound too: a sync past it is refused
    /// and the group must join again.
    #[test]
    fn assignments_are_bounded_with_the_metadata() {
        let t = Instant::now();
        let mut g = Groups::default();
        let meta = Bytes::from(vec![7u8; METADATA_BYTES_MAX - 8]);
        let (a, t) = one_member(&mut g, t);
        // Fill the coordinator with other groups' metadata, nearly to the bound.
        let fits = HELD_BYTES_MAX / METADATA_BYTES_MAX;
        for i in 0..fits {
            let mut j = join("", &["range"]);
            j.group = format!("other{}", i % 8);
            j.client_host = format!("10.0.0.{}", i % 200);
            j.member_id_required = false;
            j.protocols[0].1 = meta.clone();
            let _ = g.join(j, t);
        }
        // a's group rebalances (b joins) and its leader assigns more than is left.
        let (_b, _rx_b) = new_member(&mut g, &["range"], t);
        let _rx_a = later(g.join(join(&a, &["range"]), t));
        let big = Bytes::from(vec![1u8; METADATA_BYTES_MAX]);
        let refused = now_answer(g.sync("g", 2, &a, vec![(a.clone(), big)], t));
        assert_eq!(refused.error, Some(ResponseError::GroupMaxSizeReached));
        assert_eq!(g.describe("g").state, GroupState::PreparingRebalance);
    }

    /// Members that never send SyncGroup are removed after the rebalance timeout.
    #[test]
    fn members_that_never_sync_are_removed() {
        let t = Instant::now();
        let mut g = Groups::default();
        let (a, mut rx) = new_member(&mut g, &["range"], t);
        let t = t + INITIAL_REBALANCE_DELAY;
        g.tick(t);
        assert!(rx.try_recv().is_ok());
        // It heartbeats, so its session lives; it never syncs.
        for at in [8, 16] {
            assert_eq!(g.heartbeat("g", 1, &a, t + SECOND * at), None);
            g.tick(t + SECOND * at);
        }
        g.tick(t + Duration::from_secs(19));
        assert_eq!(g.list().len(), 1);
        g.tick(t + Duration::from_secs(20));
        assert!(g.list().is_empty(), "removed at its 20 s rebalance timeout");
    }

    /// One client address holds at most MEMBERS_PER_HOST_MAX members over all groups.
    #[test]
    fn one_address_cannot_take_every_group() {
        let t = Instant::now();
        let mut g = Groups::default();
        let mut refused = 0;
        for i in 0..MEMBERS_PER_HOST_MAX + 10 {
            let mut j = join("", &["range"]);
            j.group = format!("squat-{i}");
            j.member_id_required = false;
            if let Answer::Now(r) = g.join(j, t) {
                assert_eq!(r.error, Some(ResponseError::GroupMaxSizeReached));
                refused += 1;
            }
        }
        assert_eq!(refused, 10);
        let mut other = join("", &["range"]);
        other.client_host = "10.1.1.1".to_owned();
        other.group = "victim".to_owned();
        assert!(
            matches!(g.join(other, t), Answer::Now(_)),
            "MEMBER_ID_REQUIRED first"
        );
        let mut other = join("", &["range"]);
        other.client_host = "10.1.1.1".to_owned();
        other.group = "victim".to_owned();
        other.member_id_required = false;
        assert!(
            matches!(g.join(other, t), Answer::Later(_)),
            "another address joins"
        );
    }

    /// The protocol chosen is one every member supports, by the members' first choices.
    #[test]
    fn the_protocol_is_voted() {
        let t = Instant::now();
        let mut g = Groups::default();
        let mut rxs: Vec<_> = [
            &["roundrobin", "range"][..],
            &["range", "roundrobin"][..],
            &["range"][..],
        ]
        .into_iter()
        .map(|p| new_member(&mut g, p, t).1)
        .collect();
        g.tick(t + INITIAL_REBALANCE_DELAY);
        let j = rxs[0].try_recv().unwrap();
        assert_eq!(j.protocol_name.as_deref(), Some("range"));
    }

    /// A new master epoch forgets every group.
    #[test]
    fn a_new_epoch_starts_without_groups() {
        let t = Instant::now();
        let mut g = Groups::default();
        g.coordinate_in(1);
        let (_a, _rx) = new_member(&mut g, &["range"], t);
        assert_eq!(g.list().len(), 1);
        g.coordinate_in(1);
        assert_eq!(g.list().len(), 1);
        g.coordinate_in(2);
        assert!(g.list().is_empty());
    }
}
