//! The master's write path: produce and cursor-commit requests from arrival to answer.
//!
//! ```text
//!   request --on_request--> [blocked] --retry_blocked--> plan --propose--> [pending]
//!                              |                           |                  |
//!                           expire                   answer now          on_stabilized
//!                              v                  (dedup, errors)             v
//!                      Timeout / NoQuorum                                  answered
//! ```
//!
//! A request is planned against the applied broker state (the idempotent-producer table:
//! a batch already applied is answered with its offsets, a conflicting sequence is refused)
//! and against the batches in flight (a retry of a batch in flight waits for the first
//! attempt's answer). It is proposed to the [`MasterCore`] only while the in-flight bytes
//! stay within [`WriteLimits::inflight_bytes_max`]; otherwise it waits, in order, among the
//! blocked requests (at most [`WriteLimits::blocked_requests_max`]), as it does while the
//! driver holds the gate (the master is not serving yet, a handoff or a trim barrier).
//! Every request is answered once: when its batch is stabilized, when it waited longer than
//! [`WriteLimits::produce_timeout_ms`], or when the master steps down
//! ([`Writes::fail_all`]).
//!
//! What this does not own: whether this broker is master (the driver calls it only while it
//! is), the connections the answers go to, metrics (the commands say what to count).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::BytesMut;
use quire_proto::{
    encode_message_header_as, message_event_bytes, message_header_bytes_as, CommitCursorRequest,
    CursorCommitEvent, ErrorCode, ErrorResponse, EventBody, EventKind, MessageFormat, Offset,
    Payload, ProduceRequest, TopicAction, TopicAdminEvent, TopicAdminRequest, Voter,
};

use super::RequestToken;
use crate::core::event::EVENT_OVERHEAD_BYTES;
use crate::core::{ConfigChangeError, MasterCore, ProposeError};
use crate::security::SecurityChange;
use crate::state::{BrokerState, Dedup};

/// The bounds of the write path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteLimits {
    /// Largest message a produce may carry, in bytes (the payload alone).
    pub message_bytes_max: usize,
    /// Bytes of proposed, not yet stabilized events the master keeps at most (the
    /// [`crate::core::ReplicationLimits::inflight_bytes_max`] of its core).
    pub inflight_bytes_max: u64,
    /// How long a request may wait for its answer, in ms from its arrival.
    pub produce_timeout_ms: u64,
    /// Requests waiting for the gate or for in-flight room, at most; more are refused
    /// with `Overloaded`.
    pub blocked_requests_max: usize,
    /// Topics the state may hold (those applied and those new in flight); a produce that
    /// would add one more is refused with `LimitReached` (at most `state::TOPICS_MAX`).
    pub topics_max: usize,
    /// Durable cursors the state may hold, likewise for a commit of a new cursor (at most
    /// `state::CURSORS_MAX`).
    pub cursors_max: usize,
}

/// A write a client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteRequest {
    /// Append messages to a topic.
    Produce(ProduceRequest),
    /// Commit a consumer cursor (an event through the same quorum path).
    CommitCursor(CommitCursorRequest),
    /// Add, replace or remove a user or an ACL entry (one event, likewise).
    Security(SecurityChange),
    /// Create or delete a topic (one topic-admin event, likewise).
    TopicAdmin(TopicAdminRequest),
    /// Make this the voter set (one `Config` event through
    /// [`MasterCore::propose_config`]; the engine checked the change against what the
    /// master sees of the store first).
    Voters(Vec<Voter>),
}

impl Arrival {
    /// Request `token` asking `request`, arrived at `received_ms`.
    pub fn new(token: RequestToken, request: WriteRequest, received_ms: u64) -> Arrival {
        Arrival {
            token,
            request,
            received_ms,
        }
    }
}

impl WriteRequest {
    /// What kind of write this is.
    pub fn kind(&self) -> WriteKind {
        match self {
            WriteRequest::Produce(_) => WriteKind::Produce,
            WriteRequest::CommitCursor(_) => WriteKind::CommitCursor,
            WriteRequest::Security(_) => WriteKind::Security,
            WriteRequest::TopicAdmin(_) => WriteKind::TopicAdmin,
            WriteRequest::Voters(_) => WriteKind::Voters,
        }
    }
}

/// What kind of write a request or a batch is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// A produce: message events.
    Produce,
    /// A cursor commit: one cursor-commit event.
    CommitCursor,
    /// A user or ACL change: one user-admin or ACL-admin event.
    Security,
    /// A topic create or delete: one topic-admin event.
    TopicAdmin,
    /// A voter-set change: one `Config` event.
    Voters,
}

/// Whether the driver lets new writes be proposed now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// The master serves and nothing holds writes back: propose.
    Open,
    /// Hold writes among the blocked requests (not serving yet, a handoff, a trim barrier).
    Held,
}

/// The answer to a write request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The produce's messages are stabilized at `base_offset .. base_offset + count`.
    Produced {
        /// Offset of the first message.
        base_offset: Offset,
        /// Messages in the batch.
        count: u32,
    },
    /// The cursor commit is stabilized.
    CursorCommitted,
    /// The user or ACL change is stabilized.
    SecurityChanged,
    /// The topic create or delete is stabilized.
    TopicChanged,
    /// The voter-set change is stabilized.
    VotersChanged,
    /// This broker is not (or no longer) the master; the driver adds where the master is.
    NotMaster,
    /// A typed error.
    Error(ErrorResponse),
}

/// What the driver must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteCommand {
    /// Answer request `token` with `reply`.
    Answer {
        /// The request.
        token: RequestToken,
        /// What it was.
        kind: WriteKind,
        /// Its answer.
        reply: Reply,
        /// `Some(label)` when the answer counts as a failed produce under that label
        /// (`quire_broker_produce_errors_total{reason}`).
        error_label: Option<&'static str>,
    },
    /// A batch was proposed; its last event is at `last` (for the quorum-wait metric: the
    /// time from here to the matching [`WriteCommand::Stabilized`]).
    Proposed {
        /// Offset of the batch's last event.
        last: Offset,
    },
    /// A batch is stabilized; its waiters' answers follow.
    Stabilized {
        /// Offset of the batch's last event.
        last: Offset,
        /// What the batch was.
        kind: WriteKind,
        /// Events in the batch.
        count: u64,
        /// Requests answered with it (a retry attached to a batch in flight adds one).
        waiters: usize,
    },
}

/// A request waiting for its batch.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    token: RequestToken,
    kind: WriteKind,
    deadline_ms: u64,
}

/// Events proposed and not yet stabilized, answered together.
#[derive(Debug)]
struct Pending {
    kind: WriteKind,
    base: Offset,
    count: u64,
    /// `(producer_id, first sequence)` for an idempotent produce.
    batch: Option<(u64, u64)>,
    /// The topic or cursor it adds to the state, if new when proposed.
    adds: Option<NewName>,
    /// The topic a delete removes from the state.
    removes: Option<String>,
    waiters: Vec<Waiting>,
}

/// A topic or a cursor a write in flight adds to the state.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum NewName {
    Topic(String),
    Cursor(String, String),
    User(String),
    Acl(quire_proto::AclEntry),
}

/// A write request as it arrives (and waits while not yet proposed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// The request's name.
    pub token: RequestToken,
    /// What it asks.
    pub request: WriteRequest,
    /// When it arrived, in ms on the driver's clock (its deadline counts from here).
    pub received_ms: u64,
}

/// The master's write path. See the module docs.
#[derive(Debug)]
pub struct Writes {
    limits: WriteLimits,
    /// Keyed by the batch's last offset.
    pending: BTreeMap<Offset, Pending>,
    /// `(producer_id, first sequence)` → last offset of an idempotent batch in flight.
    inflight_batches: BTreeMap<(u64, u64), Offset>,
    /// Requests waiting for the gate or for room below the in-flight bound, in order.
    blocked: VecDeque<Arrival>,
    needs_flush: bool,
    /// Topics and cursors the writes in flight add (not in the state yet).
    new_names: BTreeSet<NewName>,
    /// Of those, topics.
    new_topics: usize,
    /// Of those, cursors.
    new_cursors: usize,
    /// Of those, users.
    new_users: usize,
    /// Of those, ACL entries.
    new_acls: usize,
    /// Topics with a delete in flight, and how many: a produce proposed after the delete
    /// creates the topic again once both are applied, so it counts as adding a topic
    /// (else, at `topics_max` = the state's bound, a produce to another new topic could be
    /// acknowledged and not indexed).
    deleting: BTreeMap<String, usize>,
}

/// What to do with a produce request.
enum Plan {
    /// Answer now.
    Reply(Reply, Option<&'static str>),
    /// The same batch is in flight: answer with it (its last offset).
    Attach(Offset),
    /// Write it.
    Write,
}

impl Writes {
    /// An empty write path (a new master).
    pub fn new(limits: WriteLimits) -> Writes {
        Writes {
            limits,
            pending: BTreeMap::new(),
            inflight_batches: BTreeMap::new(),
            blocked: VecDeque::new(),
            needs_flush: false,
            new_names: BTreeSet::new(),
            new_topics: 0,
            new_cursors: 0,
            new_users: 0,
            new_acls: 0,
            deleting: BTreeMap::new(),
        }
    }

    /// Requests waiting for the gate or for room, not yet proposed.
    pub fn blocked_len(&self) -> usize {
        self.blocked.len()
    }

    /// Batches proposed and not yet stabilized.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Whether proposals were made since the last call: the driver then flushes the core
    /// ([`MasterCore::flush`]) so the deferred appends go out.
    pub fn take_needs_flush(&mut self) -> bool {
        std::mem::take(&mut self.needs_flush)
    }

    /// A write request arrived while this broker is master.
    pub fn on_request(
        &mut self,
        core: &mut MasterCore,
        state: &BrokerState,
        gate: Gate,
        b: Arrival,
        out: &mut Vec<WriteCommand>,
    ) {
        let token = b.token;
        if gate == Gate::Held || !self.blocked.is_empty() {
            if self.blocked.len() >= self.limits.blocked_requests_max {
                out.push(WriteCommand::Answer {
                    token,
                    kind: b.request.kind(),
                    reply: Reply::Error(ErrorResponse::new(
                        ErrorCode::Overloaded,
                        "too many requests waiting",
                    )),
                    error_label: Some("overloaded"),
                });
                return;
            }
            self.blocked.push_back(b);
            return;
        }
        if let Some(b) = self.try_write(core, state, b, out) {
            self.blocked.push_back(b);
        }
    }

    /// Proposes the blocked requests in order while the gate is open and they fit.
    pub fn retry_blocked(
        &mut self,
        core: &mut MasterCore,
        state: &BrokerState,
        gate: Gate,
        out: &mut Vec<WriteCommand>,
    ) {
        if gate == Gate::Held {
            return;
        }
        while let Some(b) = self.blocked.pop_front() {
            if let Some(b) = self.try_write(core, state, b, out) {
                self.blocked.push_front(b);
                return;
            }
        }
    }

    /// The core stabilized everything through `through`: answers the batches it covers.
    pub fn on_stabilized(&mut self, through: Offset, out: &mut Vec<WriteCommand>) {
        while let Some(entry) = self.pending.first_entry() {
            if *entry.key() > through {
                break;
            }
            let last = *entry.key();
            let p = entry.remove();
            if let Some(batch) = p.batch {
                self.inflight_batches.remove(&batch);
            }
            if let Some(name) = &p.adds {
                // Applied before this call: the state counts it now.
                self.forget_new(name);
            }
            if let Some(topic) = &p.removes {
                if let Some(n) = self.deleting.get_mut(topic) {
                    *n -= 1;
                    if *n == 0 {
                        self.deleting.remove(topic);
                    }
                }
            }
            out.push(WriteCommand::Stabilized {
                last,
                kind: p.kind,
                count: p.count,
                waiters: p.waiters.len(),
            });
            for w in p.waiters {
                let reply = match p.kind {
                    WriteKind::Produce => Reply::Produced {
                        base_offset: p.base,
                        count: u32::try_from(p.count).unwrap_or(u32::MAX),
                    },
                    WriteKind::CommitCursor => Reply::CursorCommitted,
                    WriteKind::Security => Reply::SecurityChanged,
                    WriteKind::TopicAdmin => Reply::TopicChanged,
                    WriteKind::Voters => Reply::VotersChanged,
                };
                out.push(WriteCommand::Answer {
                    token: w.token,
                    kind: w.kind,
                    reply,
                    error_label: None,
                });
            }
        }
    }

    /// Fails the requests that waited past their deadline (arrival plus
    /// [`WriteLimits::produce_timeout_ms`]) at `now_ms`: `NoQuorum` when fewer than
    /// `ack_quorum` voting stores are reachable (`reachable_voters`), `Timeout` otherwise.
    /// Their events may still be stabilized later, but these requests are never answered
    /// again (a retry with the same producer id and sequence gets the offsets if they were).
    pub fn expire(
        &mut self,
        now_ms: u64,
        reachable_voters: usize,
        ack_quorum: usize,
        out: &mut Vec<WriteCommand>,
    ) {
        let (code, label, why) = if reachable_voters < ack_quorum {
            (
                ErrorCode::NoQuorum,
                "no_quorum",
                format!(
                    "not enough stores: {reachable_voters} voting stores reachable, {ack_quorum} needed; the outcome is unknown (retry with the same producer id and sequence)"
                ),
            )
        } else {
            (
                ErrorCode::Timeout,
                "timeout",
                "not stabilized in time; the outcome is unknown (retry with the same producer id and sequence)".to_owned(),
            )
        };
        let mut answer = |token, kind| {
            out.push(WriteCommand::Answer {
                token,
                kind,
                reply: Reply::Error(ErrorResponse::new(code, why.clone())),
                error_label: Some(label),
            });
        };
        let timeout_ms = self.limits.produce_timeout_ms;
        let mut keep = VecDeque::with_capacity(self.blocked.len());
        for b in self.blocked.drain(..) {
            if b.received_ms.saturating_add(timeout_ms) <= now_ms {
                answer(b.token, b.request.kind());
            } else {
                keep.push_back(b);
            }
        }
        self.blocked = keep;
        for p in self.pending.values_mut() {
            p.waiters.retain(|w| {
                let expired = w.deadline_ms <= now_ms;
                if expired {
                    answer(w.token, w.kind);
                }
                !expired
            });
        }
    }

    /// The master steps down: every request still waiting is answered — those whose batch
    /// was proposed with `NoQuorum` and `no_quorum` as the message when given (the check-
    /// quorum rule gave up; the outcome is unknown), `NotMaster` otherwise; those not yet
    /// proposed with `NotMaster`.
    pub fn fail_all(self, no_quorum: Option<&str>, out: &mut Vec<WriteCommand>) {
        for p in self.pending.into_values() {
            for w in p.waiters {
                let (reply, error_label) = match no_quorum {
                    Some(why) => (
                        Reply::Error(ErrorResponse::new(ErrorCode::NoQuorum, why)),
                        (w.kind == WriteKind::Produce).then_some("no_quorum"),
                    ),
                    None => (Reply::NotMaster, None),
                };
                out.push(WriteCommand::Answer {
                    token: w.token,
                    kind: w.kind,
                    reply,
                    error_label,
                });
            }
        }
        for b in self.blocked {
            out.push(WriteCommand::Answer {
                token: b.token,
                kind: b.request.kind(),
                reply: Reply::NotMaster,
                error_label: None,
            });
        }
    }

    /// Plans and proposes one request. Returns it if there is no room for it below the
    /// in-flight bound yet.
    fn try_write(
        &mut self,
        core: &mut MasterCore,
        state: &BrokerState,
        b: Arrival,
        out: &mut Vec<WriteCommand>,
    ) -> Option<Arrival> {
        let token = b.token;
        let kind = b.request.kind();
        let deadline_ms = b.received_ms.saturating_add(self.limits.produce_timeout_ms);
        let inflight_max = self.limits.inflight_bytes_max;
        let message_bytes_max = self.limits.message_bytes_max;
        let reply = |out: &mut Vec<WriteCommand>, reply, error_label| {
            out.push(WriteCommand::Answer {
                token,
                kind,
                reply,
                error_label,
            });
        };
        let (payloads, batch, adds) = match &b.request {
            WriteRequest::Voters(voters) => {
                return self.try_change_voters(core, b.clone(), voters.clone(), out);
            }
            WriteRequest::Produce(p) => {
                if let Some((i, msg)) = p
                    .messages
                    .iter()
                    .enumerate()
                    .find(|(_, msg)| msg.len() > message_bytes_max)
                {
                    reply(
                        out,
                        Reply::Error(ErrorResponse::new(
                            ErrorCode::MessageTooLarge,
                            format!(
                                "message {i} of the batch has {} bytes, more than this broker's message_bytes_max ({message_bytes_max})",
                                msg.len()
                            ),
                        )),
                        Some("message_too_large"),
                    );
                    return None;
                }
                match self.plan_produce(state, p) {
                    Plan::Reply(r, label) => {
                        reply(out, r, label);
                        return None;
                    }
                    Plan::Attach(last) => {
                        if let Some(p) = self.pending.get_mut(&last) {
                            p.waiters.push(Waiting {
                                token,
                                kind,
                                deadline_ms,
                            });
                        }
                        return None;
                    }
                    Plan::Write => {}
                }
                let adds = (state.topic(&p.topic).is_none()
                    || self.deleting.contains_key(&p.topic))
                .then(|| NewName::Topic(p.topic.clone()))
                .filter(|n| !self.new_names.contains(n));
                if adds.is_some() && self.topics_after(state) >= self.limits.topics_max {
                    reply(
                        out,
                        Reply::Error(ErrorResponse::new(
                            ErrorCode::LimitReached,
                            format!(
                                "topic {:?} would be one more than this cluster's topics_max ({}); write to an existing topic, or raise topics_max on the brokers",
                                p.topic, self.limits.topics_max
                            ),
                        )),
                        Some("topics_max"),
                    );
                    return None;
                }
                let bytes = batch_bytes(p);
                if bytes > inflight_max {
                    reply(
                        out,
                        Reply::Error(ErrorResponse::new(
                            ErrorCode::MessageTooLarge,
                            format!("the batch takes {bytes} bytes, more than the {inflight_max} bytes a master keeps in flight"),
                        )),
                        Some("message_too_large"),
                    );
                    return None;
                }
                if core.unstable_bytes() + bytes > inflight_max {
                    return Some(b);
                }
                match encode_batch(p) {
                    Ok(payloads) => (
                        payloads,
                        (p.producer_id != 0).then_some((p.producer_id, p.sequence)),
                        adds,
                    ),
                    Err(e) => {
                        reply(
                            out,
                            Reply::Error(ErrorResponse::new(
                                ErrorCode::MessageTooLarge,
                                e.to_string(),
                            )),
                            Some("message_too_large"),
                        );
                        return None;
                    }
                }
            }
            WriteRequest::CommitCursor(CommitCursorRequest {
                topic,
                cursor,
                offset,
            }) => {
                let adds = (state.cursor(topic, cursor).is_none())
                    .then(|| NewName::Cursor(topic.clone(), cursor.clone()))
                    .filter(|n| !self.new_names.contains(n));
                if adds.is_some()
                    && state.cursor_count() + self.new_cursors >= self.limits.cursors_max
                {
                    reply(
                        out,
                        Reply::Error(ErrorResponse::new(
                            ErrorCode::LimitReached,
                            format!(
                                "cursor {cursor:?} of topic {topic:?} would be one more than this cluster's cursors_max ({}); reuse a cursor name, or raise cursors_max on the brokers",
                                self.limits.cursors_max
                            ),
                        )),
                        Some("cursors_max"),
                    );
                    return None;
                }
                let body = EventBody::CursorCommit(CursorCommitEvent {
                    topic: topic.clone(),
                    cursor: cursor.clone(),
                    offset: *offset,
                });
                match one_event(core, &body, inflight_max) {
                    Ok(Some(p)) => (vec![p], None, adds),
                    Ok(None) => return Some(b),
                    Err(e) => {
                        reply(
                            out,
                            Reply::Error(ErrorResponse::new(ErrorCode::InvalidName, e.to_string())),
                            None,
                        );
                        return None;
                    }
                }
            }
            WriteRequest::Security(change) => {
                if let Err(why) = crate::security::validate(change) {
                    reply(
                        out,
                        Reply::Error(ErrorResponse::new(ErrorCode::InvalidName, why)),
                        None,
                    );
                    return None;
                }
                let tables = state.security();
                let inflight = match change {
                    SecurityChange::User(_) => self.new_users,
                    SecurityChange::Acl(_) => self.new_acls,
                };
                if let Some((what, max)) = tables.over_bound(change, inflight) {
                    reply(
                        out,
                        Reply::Error(ErrorResponse::new(
                            ErrorCode::LimitReached,
                            format!("the cluster holds its most {what} ({max}); remove some first"),
                        )),
                        None,
                    );
                    return None;
                }
                let body = match change {
                    SecurityChange::User(u) => EventBody::UserAdmin(u.clone()),
                    SecurityChange::Acl(a) => EventBody::AclAdmin(a.clone()),
                };
                let adds = tables
                    .adds(change)
                    .then(|| match change {
                        SecurityChange::User(u) => NewName::User(u.user.clone()),
                        SecurityChange::Acl(a) => NewName::Acl(a.entry.clone()),
                    })
                    .filter(|n| !self.new_names.contains(n));
                match one_event(core, &body, inflight_max) {
                    Ok(Some(p)) => (vec![p], None, adds),
                    Ok(None) => return Some(b),
                    Err(e) => {
                        reply(
                            out,
                            Reply::Error(ErrorResponse::new(ErrorCode::InvalidName, e.to_string())),
                            None,
                        );
                        return None;
                    }
                }
            }
            WriteRequest::TopicAdmin(t) => {
                let (adds, body) = match self.plan_topic_admin(state, t) {
                    Ok(planned) => planned,
                    Err(e) => {
                        reply(out, Reply::Error(e), None);
                        return None;
                    }
                };
                match one_event(core, &body, inflight_max) {
                    Ok(Some(p)) => (vec![p], None, adds),
                    Ok(None) => return Some(b),
                    Err(e) => {
                        reply(
                            out,
                            Reply::Error(ErrorResponse::new(ErrorCode::InvalidName, e.to_string())),
                            None,
                        );
                        return None;
                    }
                }
            }
        };
        let event_kind = match &b.request {
            WriteRequest::Produce(_) => EventKind::Message,
            WriteRequest::CommitCursor(_) => EventKind::CursorCommit,
            WriteRequest::Security(SecurityChange::User(_)) => EventKind::UserAdmin,
            WriteRequest::Security(SecurityChange::Acl(_)) => EventKind::AclAdmin,
            WriteRequest::TopicAdmin(_) => EventKind::TopicAdmin,
            WriteRequest::Voters(_) => EventKind::Config,
        };
        let count = payloads.len() as u64;
        let mut base = None;
        let mut last = None;
        for p in payloads {
            match core.propose_deferred(event_kind, p) {
                Ok(o) => {
                    base.get_or_insert(o);
                    last = Some(o);
                }
                Err(e) => {
                    // Room was checked above; only a step-down gets here, and then before
                    // the first event.
                    tracing::warn!(error = %e, "proposal refused");
                    if base.is_none() {
                        reply(out, Reply::NotMaster, None);
                        return None;
                    }
                    break;
                }
            }
        }
        // Appends keep the request's events together (a retry after a failover then finds
        // them all or none).
        core.end_batch();
        let (Some(base), Some(last)) = (base, last) else {
            reply(
                out,
                Reply::Error(ErrorResponse::new(
                    ErrorCode::Malformed,
                    "a produce request needs at least one message",
                )),
                None,
            );
            return None;
        };
        self.needs_flush = true;
        if let Some(batch) = batch {
            self.inflight_batches.insert(batch, last);
        }
        if let Some(name) = &adds {
            *self.count_of(name) += 1;
            self.new_names.insert(name.clone());
        }
        let removes = match &b.request {
            WriteRequest::TopicAdmin(t) if t.action == TopicAction::Delete => {
                *self.deleting.entry(t.topic.clone()).or_default() += 1;
                Some(t.topic.clone())
            }
            _ => None,
        };
        out.push(WriteCommand::Proposed { last });
        self.pending.insert(
            last,
            Pending {
                kind,
                base,
                count,
                batch,
                adds,
                removes,
                waiters: vec![Waiting {
                    token,
                    kind,
                    deadline_ms,
                }],
            },
        );
        None
    }

    /// Proposes a voter-set change ([`MasterCore::propose_config`]). Returns the request
    /// while it must wait (the epoch-start event not stabilized yet, no room below the
    /// in-flight bound); answers a refusal at once.
    fn try_change_voters(
        &mut self,
        core: &mut MasterCore,
        b: Arrival,
        voters: Vec<Voter>,
        out: &mut Vec<WriteCommand>,
    ) -> Option<Arrival> {
        let refuse = |code, why: String| Reply::Error(ErrorResponse::new(code, why));
        let reply = match core.propose_config(voters) {
            Ok(offset) => {
                self.needs_flush = true;
                out.push(WriteCommand::Proposed { last: offset });
                self.pending.insert(
                    offset,
                    Pending {
                        kind: WriteKind::Voters,
                        base: offset,
                        count: 1,
                        batch: None,
                        adds: None,
                        removes: None,
                        waiters: vec![Waiting {
                            token: b.token,
                            kind: WriteKind::Voters,
                            deadline_ms: b
                                .received_ms
                                .saturating_add(self.limits.produce_timeout_ms),
                        }],
                    },
                );
                return None;
            }
            Err(
                ConfigChangeError::EpochStartUnstable { .. }
                | ConfigChangeError::Propose(ProposeError::Backpressure { .. }),
            ) => return Some(b),
            Err(e @ ConfigChangeError::ChangePending { .. }) => {
                refuse(ErrorCode::ChangeInProgress, e.to_string())
            }
            Err(e @ (ConfigChangeError::NotOneChange { .. } | ConfigChangeError::Invalid(_))) => {
                refuse(ErrorCode::VoterChangeRefused, e.to_string())
            }
            Err(ConfigChangeError::Propose(_)) => Reply::NotMaster,
        };
        out.push(WriteCommand::Answer {
            token: b.token,
            kind: WriteKind::Voters,
            reply,
            error_label: None,
        });
        None
    }

    /// The topics the state will hold once every write in flight is applied, at most: the
    /// state's, less those a delete in flight removes, plus those the writes in flight add
    /// (a produce after a delete of its topic adds it again). A write proposed now is applied
    /// after every one in flight, or not at all, so the deletes may be counted as done.
    fn topics_after(&self, state: &BrokerState) -> usize {
        (state.topic_count() + self.new_topics).saturating_sub(self.deleting.len())
    }

    /// A write that added `name` stabilized (or left): the state counts the name now.
    fn forget_new(&mut self, name: &NewName) {
        if self.new_names.remove(name) {
            *self.count_of(name) -= 1;
        }
    }

    /// The count of names in flight of `name`'s kind.
    fn count_of(&mut self, name: &NewName) -> &mut usize {
        match name {
            NewName::Topic(_) => &mut self.new_topics,
            NewName::Cursor(..) => &mut self.new_cursors,
            NewName::User(_) => &mut self.new_users,
            NewName::Acl(_) => &mut self.new_acls,
        }
    }

    /// The event of a topic create or delete and the name it adds, or why it is refused:
    /// a create of a topic that exists or is being created (`TopicExists`), of other than
    /// one partition (`InvalidPartitions`), or past `topics_max` (`LimitReached`); a
    /// delete of a topic that does not exist (`UnknownTopic`); a bad name (`InvalidName`).
    fn plan_topic_admin(
        &self,
        state: &BrokerState,
        t: &TopicAdminRequest,
    ) -> Result<(Option<NewName>, EventBody), ErrorResponse> {
        quire_proto::validate_topic(&t.topic)
            .map_err(|e| ErrorResponse::new(ErrorCode::InvalidName, e.to_string()))?;
        let exists = state.topic(&t.topic).is_some();
        let name = NewName::Topic(t.topic.clone());
        let adds = match t.action {
            TopicAction::Create => {
                if exists || self.new_names.contains(&name) {
                    return Err(ErrorResponse::new(
                        ErrorCode::TopicExists,
                        format!("topic {:?} exists", t.topic),
                    ));
                }
                if t.partitions != 1 {
                    return Err(ErrorResponse::new(
                        ErrorCode::InvalidPartitions,
                        format!(
                            "{} partitions asked for: every topic is one partition in this version",
                            t.partitions
                        ),
                    ));
                }
                if self.topics_after(state) >= self.limits.topics_max {
                    return Err(ErrorResponse::new(
                        ErrorCode::LimitReached,
                        format!(
                            "topic {:?} would be one more than this cluster's topics_max ({})",
                            t.topic, self.limits.topics_max
                        ),
                    ));
                }
                Some(name)
            }
            TopicAction::Delete => {
                if !exists {
                    return Err(ErrorResponse::new(
                        ErrorCode::UnknownTopic,
                        format!("topic {:?} does not exist", t.topic),
                    ));
                }
                None
            }
        };
        let body = EventBody::TopicAdmin(TopicAdminEvent {
            action: t.action,
            topic: t.topic.clone(),
        });
        Ok((adds, body))
    }

    /// What to do with a produce: answer it from the idempotent-producer table or with an
    /// error, attach it to the same batch in flight, or write it.
    fn plan_produce(&self, state: &BrokerState, p: &ProduceRequest) -> Plan {
        let n = p.messages.len() as u64;
        let gap = |why: String| {
            Plan::Reply(
                Reply::Error(ErrorResponse::new(ErrorCode::SequenceGap, why)),
                Some("sequence_gap"),
            )
        };
        if n == 0 {
            return Plan::Reply(
                Reply::Error(ErrorResponse::new(
                    ErrorCode::Malformed,
                    "a produce request needs at least one message",
                )),
                Some("malformed"),
            );
        }
        if p.producer_id == 0 {
            return Plan::Write;
        }
        let dedup = state.dedup(p.producer_id, p.sequence, n);
        match dedup {
            Dedup::Duplicate { base_offset } => {
                return Plan::Reply(
                    Reply::Produced {
                        base_offset,
                        count: u32::try_from(n).unwrap_or(u32::MAX),
                    },
                    None,
                )
            }
            Dedup::Conflict { last_sequence } => {
                return gap(format!(
                    "producer {} sequence {} is at or below its last applied sequence {last_sequence} and not a batch the broker remembers",
                    p.producer_id, p.sequence
                ))
            }
            Dedup::New | Dedup::Partial { .. } => {}
        }
        if let Some(&last) = self.inflight_batches.get(&(p.producer_id, p.sequence)) {
            if self.pending.get(&last).is_some_and(|e| e.count == n) {
                return Plan::Attach(last);
            }
            return gap(format!(
                "producer {} sequence {} is in flight with another message count",
                p.producer_id, p.sequence
            ));
        }
        let inflight_last = self
            .inflight_batches
            .range((p.producer_id, 0)..=(p.producer_id, u64::MAX))
            .filter_map(|(&(_, seq), last)| self.pending.get(last).map(|e| seq + e.count - 1))
            .max();
        if inflight_last.is_some_and(|l| p.sequence <= l) {
            return gap(format!(
                "producer {} sequence {} overlaps a batch in flight (resend batches in order)",
                p.producer_id, p.sequence
            ));
        }
        // Kafka's rule for idempotent producers (KIP-98): a new batch starts right after
        // the last one written or in flight, so a batch that overtook a failed one is
        // refused and resent in order, never applied over a gap.
        if p.format == MessageFormat::Kafka && dedup == Dedup::New {
            let applied = state.last_sequence(p.producer_id);
            if applied.is_none() && inflight_last.is_none() && p.sequence != 0 {
                return Plan::Reply(
                    Reply::Error(ErrorResponse::new(
                        ErrorCode::UnknownProducer,
                        format!(
                            "producer {} is not in the idempotent-producer table (never seen, or forgotten for newer ones) and sequence {} is not 0: start over",
                            p.producer_id, p.sequence
                        ),
                    )),
                    Some("unknown_producer"),
                );
            }
            let applied_next = applied.map_or(0, |l| l + 1);
            let next = inflight_last.map_or(applied_next, |l| applied_next.max(l + 1));
            if p.sequence != next {
                return gap(format!(
                    "producer {} sequence {} is not the next one ({next}): a Kafka producer's batches follow each other",
                    p.producer_id, p.sequence
                ));
            }
        }
        Plan::Write
    }
}

/// The payload of a write of one event (a cursor commit, a user or ACL change), or
/// `Ok(None)` when it does not fit below the in-flight bound now (it then waits).
///
/// # Errors
/// A body that cannot be encoded (a name above its bound).
fn one_event(
    core: &MasterCore,
    body: &EventBody,
    inflight_max: u64,
) -> Result<Option<Payload>, quire_proto::WireError> {
    let p = body.to_payload()?;
    Ok(
        (core.unstable_bytes() + EVENT_OVERHEAD_BYTES + p.len() as u64 <= inflight_max)
            .then_some(p),
    )
}

/// Bytes a produce's events take in flight (payloads plus per-event overhead).
fn batch_bytes(p: &ProduceRequest) -> u64 {
    p.messages
        .iter()
        .map(|msg| {
            EVENT_OVERHEAD_BYTES
                + (message_event_bytes(p.topic.len(), msg.len())
                    + usize::from(p.format != MessageFormat::Raw)) as u64
        })
        .sum()
}

/// Builds the message events of a produce without copying a message: each event's payload
/// is its header (from one buffer shared by the batch) chained to the producer's bytes,
/// which stay in the produce frame they were decoded from ([`Payload::chained`]).
///
/// What that keeps alive is the frame and nothing more: the reader
/// (`quire_net::reader`) gives every frame a buffer of its own, so the events of a
/// produce hold its frame's bytes (about what the master's bounds charge for them) until
/// the last of them leaves the master's log suffix and recent-events cache. When the
/// reader shared one buffer between frames, a 1,025-byte message kept ~4 KB alive, and
/// one sent behind a refused 8 MB frame kept 7.8 MB.
fn encode_batch(p: &ProduceRequest) -> Result<Vec<Payload>, quire_proto::WireError> {
    let mut headers = BytesMut::with_capacity(
        message_header_bytes_as(p.format, p.topic.len()) * p.messages.len(),
    );
    let mut out = Vec::with_capacity(p.messages.len());
    for (i, msg) in p.messages.iter().enumerate() {
        encode_message_header_as(
            p.format,
            &p.topic,
            p.producer_id,
            p.sequence.wrapping_add(i as u64),
            msg.len(),
            &mut headers,
        )?;
        out.push(Payload::chained(headers.split().freeze(), msg.clone()));
    }
    Ok(out)
}
