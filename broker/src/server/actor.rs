//! The broker's actor: one task that owns the role (slave, taking over, master) with its
//! pure core, the broker state, the waiting producers and consumers. Everything that
//! changes them arrives as a message (client requests, slot answers, blocking-helper
//! completions, the heartbeat tick); the actor never waits on a socket or a disk — it hands
//! I/O to slot tasks, spawned tasks and blocking threads and hears back by message.
//!
//! Roles (DESIGN.md "Failover"):
//!
//! ```text
//!   Slave (FollowerCore) --election timeout--> TakingOver (TakeoverCore)
//!   TakingOver --BecomeMaster--> Master (MasterCore) --epoch-start stabilized--> serving
//!   TakingOver --StepBack / Aborted / takeover timeout--> Slave
//!   Master --StepDown (a higher epoch fenced the stores) / a rival's append--> Slave
//! ```
//!
//! Every broker starts as a slave; the cluster's first master is elected like any failover.
//! While no store identity is known (a new cluster), the takeover is a *bootstrap*: it fences
//! with no identity expected, and goes on only if every store granted with an empty log —
//! it then binds their identities, makes them durable, and names them in its epoch-start
//! event. A broker that knows no identity but finds a non-empty store never bootstraps: it
//! stays a slave until a master's stream teaches it the voters.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quire_client::{ClientError, FenceOutcome};
use quire_proto::{
    encode_body, AppendRejected, AppendRequest, Body, BrokerId, BrokerInfo, CommitCursorResponse,
    CursorRequest, CursorResponse, Epoch, EpochStartEvent, ErrorCode, ErrorResponse, EventBody,
    EventKind, FetchRequest, FetchResponse, Frame, HeartbeatAck, LogPosition, MetadataResponse,
    Offset, ProduceResponse, RequestId, StoreInfo, Voter, FRAME_BYTES_MAX, MESSAGES_PER_FRAME_MAX,
};
use tokio::sync::mpsc;

use super::conn::{Permits, Request, Responder};
use super::recent::{RecentEvents, RECENT_BYTES_MAX_DEFAULT};
use super::slots::{AppendMeta, Internal, SlotHandle, SlotSend};
use crate::config::BrokerConfig;
use crate::core::{
    AdoptedLog, AppendCommand, AppendEvents, ClusterConfig, ElectionConfig, Event, FenceRefusal,
    FollowerCommand, FollowerConfig, FollowerCore, FollowerInput, LocalLog, MasterCommand,
    MasterConfig, MasterCore, MasterInput, RejectReason, ReplicationLimits, SlotId, SlotKind,
    SlotLink, StoreIdentity, TakeoverCommand, TakeoverConfig, TakeoverCore, TakeoverInput,
};
use crate::durable::{self, ClusterFile};
use crate::engine::{
    Arrival, Gate, Reply, RequestToken, WriteCommand, WriteKind, WriteLimits, WriteRequest, Writes,
};
use crate::metrics::{Metrics, StatusSnapshot, StoreProgress};
use crate::retention::TrimPlanner;
use crate::state::{Applied, BrokerState};
use quire_net::Readiness;

mod handoff;
mod retention;

/// Longest long-poll a fetch may ask for, in milliseconds.
pub const FETCH_WAIT_MS_MAX: u32 = 30_000;
/// Fetches waiting for messages at once, at most; more are answered at once (empty).
pub const FETCH_WAITERS_MAX: usize = 4096;
/// Produce and commit requests waiting for the master to serve or for in-flight room.
pub const BLOCKED_REQUESTS_MAX: usize = 4096;
/// Requests the actor takes from its queue before flushing proposals to the stores.
pub const DRAIN_BATCH_MAX: usize = 1024;
/// Most events asked of a store in one takeover fetch.
pub const TAKEOVER_FETCH_EVENTS_MAX: u32 = 4096;
/// Most payload bytes asked of a store in one read.
pub const READ_BYTES_MAX: u32 = 8 << 20;
/// A slave counts as ready (`GET /ready`) while its applied state is at most this many
/// events behind the HWM its master last sent.
pub const SLAVE_READY_LAG_EVENTS_MAX: u64 = 4096;
/// Payload bytes one fetch response carries at most (it must fit in a frame).
pub const FETCH_BYTES_MAX: usize = FRAME_BYTES_MAX / 2;

/// The answer a waiting request gets.
#[derive(Debug)]
struct Waiter {
    request_id: RequestId,
    reply: Responder,
    deadline: Instant,
    permits: Permits,
}

impl Waiter {
    /// Answers the request; its permits go back once the answer is written (a fetch's
    /// answer bytes among them).
    fn answer(self, body: Body) {
        self.reply.answer(self.request_id, body, self.permits);
    }
}

/// The master's bookkeeping around its core.
#[derive(Debug)]
struct MasterRun {
    core: MasterCore,
    serving: bool,
    /// When the failover this master ended began (for the failover duration metric).
    failover_from: Instant,
    /// The write path (produces and cursor commits), decided by the engine.
    writes: Writes,
    /// Per store slot: the identity and voter flag of its last ack.
    store_answers: Vec<Option<(StoreIdentity, bool)>>,
    /// Per store slot: when it last acked as a voter with its bound identity.
    voted_at: Vec<Option<Instant>>,
}

/// A takeover in progress.
#[derive(Debug)]
struct TakeoverRun {
    core: TakeoverCore,
    /// The log to fall back to if the core fails to start or the attempt is dropped.
    deadline: Instant,
    failover_from: Instant,
    /// The master epoch followed before (a follower goes back to it).
    known_epoch: Epoch,
    /// `Some` while bootstrapping: the grants collected, by store slot.
    bootstrap: Option<Vec<Option<quire_proto::FenceGranted>>>,
    /// The bootstrap's identities are being made durable.
    binding: bool,
}

#[derive(Debug)]
enum Role {
    Follower(Box<FollowerCore>),
    TakingOver(Box<TakeoverRun>),
    Master(Box<MasterRun>),
    /// Only between two roles, inside one method.
    Switching,
}

/// A fetch waiting for messages.
#[derive(Debug)]
struct FetchWaiter {
    req: FetchRequest,
    waiter: Waiter,
}

/// The actor. See the module docs.
pub(crate) struct Actor {
    cfg: Arc<BrokerConfig>,
    me: BrokerId,
    store_count: usize,
    cluster: ClusterConfig,
    cluster_file: ClusterFile,
    slots: Vec<SlotHandle>,
    slot_up: Vec<bool>,
    role: Role,
    state: BrokerState,
    recent: RecentEvents,
    durable_counter: u64,
    highest_epoch_seen: Epoch,
    last_master_contact: Option<Instant>,
    /// The HWM the master's last accepted append carried (for readiness: how far this
    /// slave's applied state is behind it).
    master_hwm_heard: Option<Offset>,
    internal_tx: mpsc::Sender<Internal>,
    metrics: Arc<Metrics>,
    /// See [`ActorInit::message_event_bytes_max`].
    message_event_bytes_max: Arc<AtomicUsize>,
    start: Instant,
    fetch_waiters: Vec<FetchWaiter>,
    limits: ReplicationLimits,
    seed: u64,
    persisting_identities: bool,
    /// A bootstrap probe in progress: per store, whether it answered "empty voter".
    bootstrap_probe: Option<(u64, Vec<Option<bool>>)>,
    probe_generation: u64,
    bootstrap_refusal_logged: bool,
    probe_started: Instant,
    identities_dirty: bool,
    /// A graceful handoff this broker runs as the handing master.
    handoff: Option<handoff::Handoff>,
    /// Retention: where the master may trim the log (fed by every applied event).
    planner: TrimPlanner,
    /// Retention: the master holds writes until nothing is in flight, to take a checkpoint.
    trim_barrier: Option<retention::TrimBarrier>,
    /// After a checkpoint too large to propose: no trim is planned before this instant.
    checkpoint_retry_at: Option<Instant>,
    /// Retention: offset of the last checkpoint this master proposed.
    trim_proposed: Option<Offset>,
    /// The broker state missed events it could not rebuild (no checkpoint yet): it must not
    /// take over until a checkpoint repairs it.
    state_gap: bool,
    /// Write requests handed to the engine and not yet answered.
    held_writes: BTreeMap<RequestToken, HeldWrite>,
    next_token: u64,
    /// When each batch in flight was proposed, by its last offset (quorum-wait metric).
    proposed_at: BTreeMap<Offset, Instant>,
}

/// A write request the engine holds by its token: what answers it.
#[derive(Debug)]
struct HeldWrite {
    request_id: RequestId,
    reply: Responder,
    permits: Permits,
    received: Instant,
}

impl std::fmt::Debug for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actor")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

/// Everything the actor starts with.
pub(crate) struct ActorInit {
    pub(crate) cfg: Arc<BrokerConfig>,
    pub(crate) cluster_file: ClusterFile,
    pub(crate) durable_counter: u64,
    pub(crate) slots: Vec<SlotHandle>,
    pub(crate) internal_tx: mpsc::Sender<Internal>,
    pub(crate) metrics: Arc<Metrics>,
    /// Raised to the payload length of every message event applied (shared with the
    /// connection readers, who bound a fetch's answer by it).
    pub(crate) message_event_bytes_max: Arc<AtomicUsize>,
}

fn to_proto_event(e: &Event) -> quire_proto::Event {
    quire_proto::Event {
        epoch: e.epoch,
        offset: e.offset,
        kind: EventKind::from_u8(e.kind).expect(
            "invariant: every event in a broker log has a known kind (created here or decoded)",
        ),
        payload: e.payload.clone(),
    }
}

fn from_proto_event(e: quire_proto::Event) -> Event {
    Event {
        epoch: e.epoch,
        offset: e.offset,
        kind: e.kind.as_u8(),
        payload: e.payload,
    }
}

fn wire_reason(r: RejectReason) -> quire_proto::RejectReason {
    match r {
        RejectReason::Fenced => quire_proto::RejectReason::StaleEpoch,
        RejectReason::LogMismatch => quire_proto::RejectReason::LogMismatch,
        RejectReason::Overloaded => quire_proto::RejectReason::Overloaded,
        RejectReason::Failed | RejectReason::Malformed => quire_proto::RejectReason::LogFailed,
    }
}

fn core_reason(r: quire_proto::RejectReason) -> RejectReason {
    match r {
        quire_proto::RejectReason::StaleEpoch => RejectReason::Fenced,
        quire_proto::RejectReason::LogMismatch => RejectReason::LogMismatch,
        quire_proto::RejectReason::LogFailed => RejectReason::Failed,
        quire_proto::RejectReason::Overloaded => RejectReason::Overloaded,
    }
}

impl Actor {
    pub(crate) fn new(init: ActorInit) -> Actor {
        let ActorInit {
            cfg,
            cluster_file,
            durable_counter,
            slots,
            internal_tx,
            metrics,
            message_event_bytes_max,
        } = init;
        let store_count = cfg.stores.len();
        let identities = cluster_file.identities_by_slot();
        let mut kinds: Vec<SlotKind> = identities
            .iter()
            .map(|&identity| SlotKind::Store { identity })
            .collect();
        for (b, _) in &cfg.brokers {
            if *b != cfg.id {
                kinds.push(SlotKind::Slave { broker: *b });
            }
        }
        let mut cluster = ClusterConfig::with_majorities(kinds);
        cluster.ack_quorum = cfg.ack_quorum;
        cluster.fence_quorum = (store_count + 1).saturating_sub(cfg.ack_quorum).max(1);
        let seed = u64::from(std::process::id())
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        let slot_count = slots.len();
        let mut actor = Actor {
            me: cfg.id,
            store_count,
            cluster,
            cluster_file,
            slot_up: vec![false; slot_count],
            slots,
            role: Role::Switching,
            state: BrokerState::new(),
            recent: RecentEvents::new(RECENT_BYTES_MAX_DEFAULT),
            durable_counter,
            highest_epoch_seen: Epoch::ZERO,
            last_master_contact: None,
            master_hwm_heard: None,
            internal_tx,
            metrics,
            message_event_bytes_max,
            start: Instant::now(),
            fetch_waiters: Vec::new(),
            limits: ReplicationLimits::default(),
            seed,
            persisting_identities: false,
            bootstrap_probe: None,
            probe_generation: 0,
            bootstrap_refusal_logged: false,
            probe_started: Instant::now(),
            identities_dirty: false,
            handoff: None,
            planner: TrimPlanner::new(cfg.retention, Offset::ZERO),
            trim_barrier: None,
            checkpoint_retry_at: None,
            trim_proposed: None,
            state_gap: false,
            held_writes: BTreeMap::new(),
            next_token: 0,
            proposed_at: BTreeMap::new(),
            cfg,
        };
        actor.role = Role::Follower(Box::new(actor.new_follower(LocalLog::empty(), Epoch::ZERO)));
        actor
    }

    /// Runs until the request channel closes (the broker stops).
    pub(crate) async fn run(
        mut self,
        mut requests: mpsc::Receiver<Request>,
        mut internal: mpsc::Receiver<Internal>,
    ) {
        let mut tick = tokio::time::interval(self.cfg.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                m = internal.recv() => {
                    let Some(m) = m else { return };
                    self.on_internal(m);
                    let mut n = 0;
                    while n < DRAIN_BATCH_MAX {
                        match internal.try_recv() {
                            Ok(m) => self.on_internal(m),
                            Err(_) => break,
                        }
                        n += 1;
                    }
                    self.flush();
                }
                _ = tick.tick() => self.on_tick(),
                r = requests.recv() => {
                    let Some(r) = r else { return };
                    self.on_request(r);
                    let mut n = 0;
                    while n < DRAIN_BATCH_MAX {
                        match requests.try_recv() {
                            Ok(r) => self.on_request(r),
                            Err(_) => break,
                        }
                        n += 1;
                    }
                    self.flush();
                }
            }
        }
    }

    // ------------------------------------------------------------------ helpers

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn follower_config(&self) -> FollowerConfig {
        let brokers: Vec<BrokerId> = self.cfg.brokers.iter().map(|(b, _)| *b).collect();
        let min = u64::try_from(self.cfg.election_timeout.as_millis()).unwrap_or(u64::MAX);
        FollowerConfig {
            election: ElectionConfig {
                election_timeout_ms_min: min,
                election_timeout_ms_jitter: min / 2,
                rank: ElectionConfig::rank_of(&brokers, self.me),
                rank_step_ms: min / 4,
            },
            retained_bytes_max: crate::core::follower::FOLLOWER_RETAINED_BYTES_MAX_DEFAULT,
        }
    }

    fn new_follower(&mut self, local: LocalLog, known_epoch: Epoch) -> FollowerCore {
        self.seed = self
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let now = self.now_ms();
        match FollowerCore::new(self.follower_config(), local, known_epoch, self.seed, now) {
            Ok(f) => f,
            Err(e) => {
                // Only a core bug gets here; start over from an empty log and state, which
                // the master's stream rebuilds.
                tracing::error!(error = %e, "cannot follow with this log: starting from an empty one");
                self.state = BrokerState::new();
                self.recent.clear();
                FollowerCore::new(
                    self.follower_config(),
                    LocalLog::empty(),
                    known_epoch,
                    self.seed,
                    now,
                )
                .expect("invariant: an empty local log is valid")
            }
        }
    }

    /// The check-quorum window: the election timeout in heartbeat ticks, rounded up.
    fn check_quorum_ticks(&self) -> u32 {
        let hb = self.cfg.heartbeat.as_millis().max(1);
        let ticks = self.cfg.election_timeout.as_millis().div_ceil(hb);
        u32::try_from(ticks).unwrap_or(u32::MAX).max(1)
    }

    fn slot_of(i: usize) -> SlotId {
        SlotId(u16::try_from(i).expect("invariant: slots <= SLOTS_MAX"))
    }

    fn is_store(&self, slot: SlotId) -> bool {
        slot.index() < self.store_count
    }

    fn knows_identities(&self) -> bool {
        (0..self.store_count).any(|i| self.cluster.expected_identity(Self::slot_of(i)).is_some())
    }

    fn broker_info(&self, id: BrokerId) -> Option<BrokerInfo> {
        self.cfg.broker_addr(id).map(|addr| BrokerInfo {
            id,
            addr: addr.to_owned(),
        })
    }

    /// The master as far as this broker knows, for `NotMaster` hints and metadata.
    fn master_hint(&self) -> (Epoch, Option<BrokerInfo>) {
        match &self.role {
            Role::Master(_) => (self.highest_epoch_seen, self.broker_info(self.me)),
            Role::Follower(_) if self.handoff_hint().is_some() => {
                (self.highest_epoch_seen, self.handoff_hint())
            }
            Role::Follower(f) => {
                let recent = self
                    .last_master_contact
                    .is_some_and(|t| t.elapsed() < self.cfg.election_timeout * 2);
                let e = f.master_epoch();
                let master = (e != Epoch::ZERO && recent)
                    .then(|| self.broker_info(e.broker()))
                    .flatten();
                (self.highest_epoch_seen.max(e), master)
            }
            Role::TakingOver(_) | Role::Switching => (self.highest_epoch_seen, None),
        }
    }

    fn not_master(&self, reply: &Responder, request_id: RequestId) {
        let (epoch, master) = self.master_hint();
        reply.error(request_id, ErrorResponse::not_master(epoch, master));
    }

    fn see_epoch(&mut self, e: Epoch) {
        self.highest_epoch_seen = self.highest_epoch_seen.max(e);
    }

    // ------------------------------------------------------------------ requests

    fn on_request(&mut self, r: Request) {
        match r.body {
            Body::AppendRequest(_) => self.on_inbound_append(r),
            Body::Heartbeat(ref h) => {
                let (epoch, last) = match &self.role {
                    Role::Follower(f) => (f.master_epoch(), f.log().last()),
                    _ => (self.highest_epoch_seen, None),
                };
                self.see_epoch(h.epoch);
                r.reply.send(
                    r.request_id,
                    HeartbeatAck {
                        epoch: epoch.max(self.highest_epoch_seen),
                        broker: self.me,
                        last,
                    }
                    .into(),
                );
            }
            Body::MetadataRequest(_) => {
                let m = self.metadata();
                r.reply.send(r.request_id, m.into());
            }
            Body::ProduceRequest(_) => {
                self.metrics.produce_requests.inc();
                self.on_write_request(r);
            }
            Body::CommitCursorRequest(_) => self.on_write_request(r),
            Body::HandoffRequest(_) => self.on_handoff_request(r),
            Body::TakeOverNowRequest(_) => self.on_take_over_now(r),
            Body::FetchRequest(_) => {
                self.metrics.fetch_requests.inc();
                self.on_fetch(r);
            }
            Body::CursorRequest(CursorRequest {
                ref topic,
                ref cursor,
            }) => {
                if !self.is_serving() {
                    self.not_master(&r.reply, r.request_id);
                    return;
                }
                let offset = self.state.cursor(topic, cursor);
                r.reply.send(r.request_id, CursorResponse { offset }.into());
            }
            other => r.reply.error(
                r.request_id,
                ErrorResponse::new(
                    ErrorCode::UnexpectedFrame,
                    format!("a broker does not serve {:?}", other.frame_type()),
                ),
            ),
        }
    }

    fn is_serving(&self) -> bool {
        matches!(&self.role, Role::Master(m) if m.serving)
    }

    fn metadata(&self) -> MetadataResponse {
        let (epoch, master) = self.master_hint();
        let hwm = match &self.role {
            Role::Master(m) => m.core.hwm(),
            Role::Follower(f) => f.hwm(),
            _ => self.state.applied(),
        };
        let stores = (0..self.store_count)
            .map(|i| {
                let slot = Self::slot_of(i);
                let identity = self.cluster.expected_identity(slot);
                let (voter, persisted, answered) = match &self.role {
                    Role::Master(m) => {
                        let status = m.core.slot_status(slot);
                        let answered = m.store_answers[i];
                        let voter = identity.is_some()
                            && answered.is_none_or(|(id, v)| v && Some(id) == identity);
                        (voter, status.and_then(|s| s.matched), answered)
                    }
                    _ => (identity.is_some(), None, None),
                };
                let shown = identity.or(answered.map(|(id, _)| id)).unwrap_or_default();
                StoreInfo {
                    store_id: shown.store_id,
                    incarnation: shown.incarnation,
                    addr: self.cfg.stores[i].clone(),
                    voter,
                    persisted,
                    connected: self.slot_up[i],
                }
            })
            .collect();
        MetadataResponse {
            epoch,
            hwm,
            master,
            brokers: self
                .cfg
                .brokers
                .iter()
                .map(|(id, addr)| BrokerInfo {
                    id: *id,
                    addr: addr.clone(),
                })
                .collect(),
            stores,
            applied: self.state.applied(),
        }
    }

    // ------------------------------------------------------------------ slave path

    fn on_inbound_append(&mut self, r: Request) {
        let Request {
            request_id,
            body: Body::AppendRequest(req),
            reply,
            ..
        } = r
        else {
            return;
        };
        self.see_epoch(req.epoch);
        // A master or a takeover meets a higher epoch: it stops and follows.
        let rival = match &mut self.role {
            Role::Master(m) if req.epoch > m.core.epoch() => {
                let mut out = Vec::new();
                m.core
                    .handle(MasterInput::RivalSeen { epoch: req.epoch }, &mut out);
                self.dispatch_master(out);
                false
            }
            Role::Master(m) => {
                reply.send(
                    request_id,
                    AppendRejected {
                        reason: quire_proto::RejectReason::StaleEpoch,
                        promised: m.core.epoch(),
                        last: m.core.log().last(),
                    }
                    .into(),
                );
                return;
            }
            Role::TakingOver(t) if req.epoch > t.core.epoch() => true,
            Role::TakingOver(t) => {
                reply.send(
                    request_id,
                    AppendRejected {
                        reason: quire_proto::RejectReason::StaleEpoch,
                        promised: t.core.epoch(),
                        last: None,
                    }
                    .into(),
                );
                return;
            }
            Role::Follower(_) | Role::Switching => false,
        };
        if rival {
            let mut out = Vec::new();
            if let Role::TakingOver(t) = &mut self.role {
                t.core
                    .handle(TakeoverInput::RivalSeen { epoch: req.epoch }, &mut out);
            }
            self.dispatch_takeover(out);
        }
        let Role::Follower(f) = &mut self.role else {
            // Still master (the rival was not above us) or switching: nothing to follow.
            self.not_master(&reply, request_id);
            return;
        };
        let mut out = Vec::new();
        let heard_hwm = req.hwm;
        let events = req.events.into_iter().map(from_proto_event).collect();
        f.handle(
            FollowerInput::Append {
                append: crate::core::AppendId(request_id.0),
                epoch: req.epoch,
                prev: req.prev,
                events,
                hwm: req.hwm,
            },
            &mut out,
        );
        let master_epoch = f.master_epoch();
        let last = f.log().last();
        for c in out {
            match c {
                FollowerCommand::Has { .. } => {
                    self.last_master_contact = Some(Instant::now());
                    self.master_hwm_heard = self.master_hwm_heard.max(heard_hwm);
                    reply.send(
                        request_id,
                        HeartbeatAck {
                            epoch: master_epoch,
                            broker: self.me,
                            last,
                        }
                        .into(),
                    );
                }
                FollowerCommand::Refuse {
                    known_epoch,
                    last,
                    reason,
                    ..
                } => {
                    if reason != RejectReason::Fenced {
                        self.last_master_contact = Some(Instant::now());
                    }
                    reply.send(
                        request_id,
                        AppendRejected {
                            reason: wire_reason(reason),
                            promised: known_epoch,
                            last,
                        }
                        .into(),
                    );
                }
                FollowerCommand::Apply { events } => self.apply_events(&events),
                FollowerCommand::StartTakeover { .. } => {}
            }
        }
        self.advance_handoff();
    }

    /// Applies stabilized events to the broker state (any role), keeps them for consumers,
    /// learns voters from epoch-start events and wakes the fetches they satisfy.
    fn apply_events(&mut self, events: &[Event]) {
        let mut touched: BTreeSet<String> = BTreeSet::new();
        for e in events {
            let expected = self.state.applied().map_or(Offset::ZERO, Offset::next);
            let applied = if e.offset == expected {
                self.state.apply(e)
            } else {
                match self.rebuild_at(e) {
                    Some(a) => a,
                    None => continue,
                }
            };
            if matches!(applied, Applied::Message { .. }) {
                self.message_event_bytes_max
                    .fetch_max(e.payload.len(), Ordering::Relaxed);
            }
            match applied {
                Applied::Message { topic } if !self.fetch_waiters.is_empty() => {
                    touched.insert(topic);
                }
                Applied::EpochStart { voters, .. } => self.learn_voters(&voters),
                _ => {}
            }
            self.retention_applied(e);
            self.recent.push(e.clone());
        }
        if !touched.is_empty() {
            self.wake_fetches(Some(&touched));
        }
    }

    fn learn_voters(&mut self, voters: &[Voter]) {
        for v in voters {
            let slot = SlotId(v.store_index);
            if !self.is_store(slot) {
                tracing::error!(
                    store_index = v.store_index,
                    "an epoch-start event names a store outside the store list"
                );
                continue;
            }
            let identity = StoreIdentity {
                store_id: v.store_id,
                incarnation: v.incarnation,
            };
            match self.cluster.expected_identity(slot) {
                Some(known) if known == identity => {}
                Some(known) => {
                    tracing::error!(%slot, ?known, ?identity, "an epoch-start event names another identity for a bound store; keeping the bound one")
                }
                None => {
                    self.cluster.learn_identity(slot, identity);
                    if let Role::Master(m) = &mut self.role {
                        let mut out = Vec::new();
                        m.core
                            .handle(MasterInput::StoreIdentityKnown { slot, identity }, &mut out);
                    }
                    tracing::info!(%slot, store_id = identity.store_id.0, incarnation = identity.incarnation.0, "learned a voter identity");
                    self.identities_dirty = true;
                }
            }
        }
        self.persist_identities(None);
    }

    /// Makes the identities known in memory durable in the cluster file (one write at a
    /// time; a change during a write is written after it).
    fn persist_identities(&mut self, bootstrap_epoch: Option<Epoch>) {
        if bootstrap_epoch.is_none() && (!self.identities_dirty || self.persisting_identities) {
            return;
        }
        self.identities_dirty = false;
        self.persisting_identities = true;
        let ids: Vec<Option<StoreIdentity>> = (0..self.store_count)
            .map(|i| self.cluster.expected_identity(Self::slot_of(i)))
            .collect();
        self.cluster_file.set_identities(&ids);
        let file = self.cluster_file.clone();
        let dir = self.cfg.data_dir.clone();
        let tx = self.internal_tx.clone();
        tokio::spawn(async move {
            let outcome = tokio::task::spawn_blocking(move || durable::store_cluster(&dir, &file))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
            let _ = tx
                .send(Internal::IdentitiesPersisted {
                    bootstrap_epoch,
                    outcome,
                })
                .await;
        });
    }

    // ------------------------------------------------------------------ internal messages

    fn on_internal(&mut self, m: Internal) {
        match m {
            Internal::SlotUp { slot } => {
                self.slot_up[slot.index()] = true;
                match &mut self.role {
                    Role::Master(run) => {
                        let mut out = Vec::new();
                        run.core
                            .handle(MasterInput::SlotConnected { slot }, &mut out);
                        self.dispatch_master(out);
                    }
                    Role::TakingOver(t) => {
                        let mut out = Vec::new();
                        t.core
                            .handle(TakeoverInput::SlotConnected { slot }, &mut out);
                        self.dispatch_takeover(out);
                    }
                    _ => {}
                }
            }
            Internal::SlotDown { slot } => {
                self.slot_up[slot.index()] = false;
                if let Role::Master(run) = &mut self.role {
                    let mut out = Vec::new();
                    run.core
                        .handle(MasterInput::SlotDisconnected { slot }, &mut out);
                    self.dispatch_master(out);
                }
            }
            Internal::AppendAnswer {
                slot,
                meta,
                outcome,
            } => self.on_append_answer(slot, meta, outcome),
            Internal::FenceAnswer {
                slot,
                epoch,
                outcome,
            } => self.on_fence_answer(slot, epoch, outcome),
            Internal::Fetched {
                slot,
                epoch,
                outcome,
            } => {
                let Role::TakingOver(t) = &mut self.role else {
                    return;
                };
                let input = match outcome {
                    Ok(read) => {
                        // Progress: a long tail may take many reads; the deadline bounds
                        // a stall, not the length of the log (the simulation's driver,
                        // sim/src/broker.rs, does the same).
                        if epoch == t.core.epoch() && !read.events.is_empty() {
                            t.deadline = Instant::now() + takeover_budget(&self.cfg);
                        }
                        TakeoverInput::Fetched {
                            slot,
                            epoch,
                            events: read.events.into_iter().map(from_proto_event).collect(),
                        }
                    }
                    Err(e) => {
                        tracing::warn!(%slot, error = %e, "takeover fetch failed");
                        TakeoverInput::FetchFailed {
                            slot,
                            epoch,
                            promised: None,
                        }
                    }
                };
                let mut out = Vec::new();
                t.core.handle(input, &mut out);
                self.dispatch_takeover(out);
            }
            Internal::ReadTrimmed { cmd, first_offset } => {
                self.on_read_trimmed(&cmd, first_offset);
            }
            Internal::ReadForAppend { cmd, outcome } => match outcome {
                Ok(events) => {
                    if matches!(&self.role, Role::Master(m) if m.core.epoch() == cmd.epoch) {
                        self.send_append(&cmd, Batch::Wire(events), &mut Vec::new());
                    }
                }
                Err(e) => {
                    tracing::debug!(slot = %cmd.slot, error = %e, "read for a lagging slot failed; the append times out and is resent");
                }
            },
            Internal::TailAnswer {
                slot,
                generation,
                outcome,
            } => self.on_tail_answer(slot, generation, outcome),
            Internal::HandoffAnswer { epoch, outcome } => self.on_handoff_answer(epoch, outcome),
            Internal::EpochPersisted { counter, outcome } => match outcome {
                Ok(()) => {
                    self.durable_counter = self.durable_counter.max(counter);
                    if let Role::TakingOver(t) = &mut self.role {
                        let mut out = Vec::new();
                        t.core
                            .handle(TakeoverInput::EpochPersisted { counter }, &mut out);
                        self.dispatch_takeover(out);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, counter, "cannot make the epoch counter durable: no fence goes out");
                    self.abandon_takeover("the epoch counter is not durable");
                }
            },
            Internal::IdentitiesPersisted {
                bootstrap_epoch,
                outcome,
            } => {
                self.persisting_identities = false;
                if let Err(e) = &outcome {
                    tracing::error!(error = %e, "cannot write the cluster file with the store identities");
                }
                if let Some(epoch) = bootstrap_epoch {
                    self.finish_bootstrap(epoch, outcome.is_ok());
                }
                self.persist_identities(None);
            }
        }
    }

    // ------------------------------------------------------------------ tick

    fn on_tick(&mut self) {
        let now = Instant::now();
        let now_ms = self.now_ms();
        match &mut self.role {
            Role::Follower(f) => {
                let mut out = Vec::new();
                f.handle(FollowerInput::Tick { now_ms }, &mut out);
                let followed = f.master_epoch();
                if out
                    .iter()
                    .any(|c| matches!(c, FollowerCommand::StartTakeover { .. }))
                {
                    if self.knows_identities() {
                        self.start_takeover();
                    } else if followed == Epoch::ZERO {
                        self.probe_bootstrap();
                    } else {
                        // A master existed: the cluster is not new, and this broker has not
                        // learned its voters yet. Only a master's stream can teach it.
                        tracing::debug!("no master heard, no voters known: waiting for a master");
                    }
                }
            }
            Role::TakingOver(t) => {
                if now >= t.deadline {
                    tracing::info!(epoch = %t.core.epoch(), "takeover did not finish in time");
                    self.abandon_takeover("timed out");
                }
            }
            Role::Master(m) => {
                let mut out = Vec::new();
                m.core.handle(MasterInput::HeartbeatTick, &mut out);
                self.dispatch_master(out);
                self.expire_writes(now);
            }
            Role::Switching => {}
        }
        self.retention_tick(now_ms);
        self.advance_handoff();
        self.expire_fetches(now);
        self.publish_status();
    }

    fn publish_status(&self) {
        let (is_master, hwm, lags) = match &self.role {
            Role::Master(m) => {
                let end = m.core.next_offset().0;
                let lags = (0..self.store_count)
                    .map(|i| {
                        let matched = m.core.slot_status(Self::slot_of(i)).and_then(|s| s.matched);
                        Some(end - matched.map_or(0, |o| o.0 + 1))
                    })
                    .collect();
                (true, m.core.hwm(), lags)
            }
            Role::Follower(f) => (false, f.hwm(), vec![None; self.store_count]),
            _ => (false, self.state.applied(), vec![None; self.store_count]),
        };
        let epoch = match &self.role {
            Role::Master(m) => m.core.epoch(),
            Role::Follower(f) => f.master_epoch().max(self.highest_epoch_seen),
            _ => self.highest_epoch_seen,
        };
        self.metrics.set_readiness(self.readiness());
        self.metrics.set_status(StatusSnapshot {
            is_master,
            epoch: epoch.0,
            hwm: hwm.map(|h| h.0),
            applied: self.state.applied().map(|a| a.0),
            trim_point: self.state.trim_point().0,
            last_checkpoint: self.state.last_checkpoint().map(|c| c.0),
            stores: self
                .cfg
                .stores
                .iter()
                .zip(lags)
                .map(|(addr, lag)| StoreProgress {
                    addr: addr.clone(),
                    lag,
                })
                .collect(),
        });
    }

    /// Whether this broker should get client traffic (`GET /ready`; docs/operations.md
    /// "Health checks"):
    /// - a master is ready once it serves (its epoch-start event is stabilized) and while it
    ///   is not handing off;
    /// - a slave is ready while it heard from a master within the election timeout and its
    ///   applied state is at most [`SLAVE_READY_LAG_EVENTS_MAX`] events behind the HWM that
    ///   master last sent;
    /// - a broker taking over is not ready.
    fn readiness(&self) -> Readiness {
        match &self.role {
            Role::Master(m) if !m.serving => Readiness::NotReady(format!(
                "master of epoch {}, not serving yet: its epoch-start event is not stabilized",
                m.core.epoch()
            )),
            Role::Master(m) if self.is_handing_off() => Readiness::NotReady(format!(
                "master of epoch {}, handing off to another broker",
                m.core.epoch()
            )),
            Role::Master(_) => Readiness::Ready,
            Role::TakingOver(t) => Readiness::NotReady(format!(
                "taking over (epoch {}): no master serves",
                t.core.epoch()
            )),
            Role::Switching => Readiness::NotReady("changing role".to_owned()),
            Role::Follower(f) => {
                let Some(heard) = self.last_master_contact else {
                    return Readiness::NotReady("slave: no master known yet".to_owned());
                };
                let silent = heard.elapsed();
                if silent >= self.cfg.election_timeout {
                    return Readiness::NotReady(format!(
                        "slave: the master of epoch {} has been silent for {} ms (election timeout {} ms)",
                        f.master_epoch(),
                        silent.as_millis(),
                        self.cfg.election_timeout.as_millis()
                    ));
                }
                let behind = match (self.master_hwm_heard, f.applied()) {
                    (None, _) => 0,
                    (Some(h), None) => h.0 + 1,
                    (Some(h), Some(a)) => h.0.saturating_sub(a.0),
                };
                if behind > SLAVE_READY_LAG_EVENTS_MAX {
                    return Readiness::NotReady(format!(
                        "slave: catching up, {behind} events behind the master's HWM (ready within {SLAVE_READY_LAG_EVENTS_MAX})"
                    ));
                }
                Readiness::Ready
            }
        }
    }

    // ------------------------------------------------------------------ takeover

    /// A broker that knows no voter asks every store for its tail before it fences
    /// anything: it bootstraps only if every store is an empty voter, and otherwise never
    /// raises a store's promised epoch (which would disturb a running cluster).
    fn probe_bootstrap(&mut self) {
        self.probe_generation += 1;
        let generation = self.probe_generation;
        self.bootstrap_probe = Some((generation, vec![None; self.store_count]));
        self.probe_started = Instant::now();
        for i in 0..self.store_count {
            let slot = Self::slot_of(i);
            let client = self.slots[i].client();
            let tx = self.internal_tx.clone();
            tokio::spawn(async move {
                let outcome = match client {
                    Some(c) => c.tail().await,
                    None => Err(ClientError::Closed {
                        addr: String::new(),
                        reason: "not connected".into(),
                    }),
                };
                let _ = tx
                    .send(Internal::TailAnswer {
                        slot,
                        generation,
                        outcome,
                    })
                    .await;
            });
        }
    }

    fn on_tail_answer(
        &mut self,
        slot: SlotId,
        generation: u64,
        outcome: Result<quire_proto::TailResponse, ClientError>,
    ) {
        let Some((g, answers)) = &mut self.bootstrap_probe else {
            return;
        };
        if *g != generation {
            return;
        }
        // The answers are stale if a master spoke since the probe began (it may have
        // written its epoch-start event after a store answered).
        let heard = self
            .last_master_contact
            .is_some_and(|t| t >= self.probe_started);
        let follows = matches!(&self.role, Role::Follower(f) if f.master_epoch() != Epoch::ZERO);
        if heard || follows || !matches!(self.role, Role::Follower(_)) {
            self.bootstrap_probe = None;
            return;
        }
        match outcome {
            Ok(t) => {
                let empty_voter = t.last.is_none() && t.voter;
                if !empty_voter {
                    if self.probe_generation == generation && !self.bootstrap_refusal_logged {
                        tracing::warn!(%slot, last = ?t.last, voter = t.voter, "a store is not an empty voter but this broker knows no store identity: it will not bootstrap a cluster; waiting to learn the voters from a master");
                        self.bootstrap_refusal_logged = true;
                    } else {
                        tracing::debug!(%slot, last = ?t.last, "still no voters known and a store is not empty");
                    }
                    self.bootstrap_probe = None;
                    return;
                }
                answers[slot.index()] = Some(true);
                if answers.iter().all(Option::is_some) {
                    self.bootstrap_probe = None;
                    self.start_takeover();
                }
            }
            Err(e) => tracing::debug!(%slot, error = %e, "bootstrap probe: no tail"),
        }
    }

    fn start_takeover(&mut self) {
        if self.state_gap {
            tracing::warn!(
                "not taking over: the broker state has a gap (waiting for a retention checkpoint)"
            );
            return;
        }
        let Role::Follower(f) = std::mem::replace(&mut self.role, Role::Switching) else {
            return;
        };
        let known_epoch = f.master_epoch();
        let highest = self.highest_epoch_seen.max(known_epoch);
        let local = f.into_local_log();
        let bootstrap = !self.knows_identities();
        let config = TakeoverConfig {
            broker: self.me,
            cluster: self.cluster.clone(),
            fetch_events_max: TAKEOVER_FETCH_EVENTS_MAX,
        };
        let mut out = Vec::new();
        let fallback = local.clone();
        match TakeoverCore::start(config, self.durable_counter, highest, local, &mut out) {
            Ok(core) => {
                let now = Instant::now();
                tracing::info!(
                    epoch = %core.epoch(),
                    bootstrap,
                    silent_ms = self.last_master_contact.map(|t| t.elapsed().as_millis() as u64),
                    "no master heard: taking over"
                );
                self.role = Role::TakingOver(Box::new(TakeoverRun {
                    core,
                    deadline: now + takeover_budget(&self.cfg),
                    failover_from: self.last_master_contact.unwrap_or(now),
                    known_epoch,
                    bootstrap: bootstrap.then(|| vec![None; self.store_count]),
                    binding: false,
                }));
                self.dispatch_takeover(out);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start a takeover");
                self.role = Role::Follower(Box::new(self.new_follower(fallback, known_epoch)));
            }
        }
    }

    /// Gives a takeover up and follows again (the election timer starts over).
    fn abandon_takeover(&mut self, why: &str) {
        let Role::TakingOver(t) = std::mem::replace(&mut self.role, Role::Switching) else {
            return;
        };
        self.see_epoch(t.core.highest_seen());
        tracing::info!(epoch = %t.core.epoch(), why, "takeover abandoned: following again");
        let known = t.known_epoch;
        let local = t.core.into_local_log();
        self.role = Role::Follower(Box::new(self.new_follower(local, known)));
    }

    fn dispatch_takeover(&mut self, out: Vec<TakeoverCommand>) {
        for c in out {
            match c {
                TakeoverCommand::PersistEpochCounter { counter, epoch } => {
                    tracing::debug!(counter, %epoch, "persisting the epoch counter");
                    let dir = self.cfg.data_dir.clone();
                    let tx = self.internal_tx.clone();
                    tokio::spawn(async move {
                        let outcome = tokio::task::spawn_blocking(move || {
                            durable::store_epoch_counter(&dir, counter)
                        })
                        .await
                        .map_err(|e| e.to_string())
                        .and_then(|r| r.map_err(|e| e.to_string()));
                        let _ = tx.send(Internal::EpochPersisted { counter, outcome }).await;
                    });
                }
                TakeoverCommand::SendFence { slot, epoch } => {
                    let expected = self
                        .cluster
                        .expected_identity(slot)
                        .map(|id| (id.store_id, id.incarnation));
                    let client = self.slots[slot.index()].client();
                    let tx = self.internal_tx.clone();
                    tokio::spawn(async move {
                        let outcome = match client {
                            Some(c) => c.fence(epoch, expected).await,
                            None => Err(ClientError::Closed {
                                addr: String::new(),
                                reason: "not connected".into(),
                            }),
                        };
                        let _ = tx
                            .send(Internal::FenceAnswer {
                                slot,
                                epoch,
                                outcome,
                            })
                            .await;
                    });
                }
                TakeoverCommand::Fetch {
                    slot,
                    epoch,
                    from,
                    through,
                } => {
                    let client = self.slots[slot.index()].client();
                    let tx = self.internal_tx.clone();
                    let count = u32::try_from(through.0 - from.0 + 1).unwrap_or(u32::MAX);
                    tokio::spawn(async move {
                        let outcome = match client {
                            Some(c) => c.read(from, count, READ_BYTES_MAX).await,
                            None => Err(ClientError::Closed {
                                addr: String::new(),
                                reason: "not connected".into(),
                            }),
                        };
                        let _ = tx
                            .send(Internal::Fetched {
                                slot,
                                epoch,
                                outcome,
                            })
                            .await;
                    });
                }
                TakeoverCommand::BecomeMaster(adopted) => self.become_master(adopted),
                TakeoverCommand::StepBack { rival } => {
                    self.see_epoch(rival);
                    tracing::info!(%rival, "a higher epoch exists: stepping back");
                    self.abandon_takeover("a rival has a higher epoch");
                }
                TakeoverCommand::Aborted { epoch, reason } => {
                    tracing::warn!(%epoch, ?reason, "takeover attempt aborted");
                    self.abandon_takeover("aborted");
                }
            }
        }
    }

    fn on_fence_answer(
        &mut self,
        slot: SlotId,
        epoch: Epoch,
        outcome: Result<FenceOutcome, ClientError>,
    ) {
        let Role::TakingOver(t) = &mut self.role else {
            return;
        };
        if epoch != t.core.epoch() {
            return;
        }
        let mut out = Vec::new();
        match outcome {
            Ok(FenceOutcome::Granted(g)) => {
                if let Some(cut) = g.tail_cut {
                    tracing::warn!(%slot, cut_offset = %cut.offset, cut_promised = %cut.promised, "the store grants with a tail-cut mark: it counts toward the fence quorum only if every store grants");
                }
                if let Some(grants) = &mut t.bootstrap {
                    if g.last.is_some() {
                        tracing::warn!(%slot, last = ?g.last, "a store holds events but this broker knows no store identity: it will not bootstrap a cluster; waiting to learn the voters from a master");
                        self.abandon_takeover("a store is not empty");
                        return;
                    }
                    if g.epoch == epoch {
                        grants[slot.index()] = Some(g);
                    }
                    if grants.iter().all(Option::is_some) && !t.binding {
                        t.binding = true;
                        for (i, g) in grants.iter().enumerate() {
                            if let Some(g) = g {
                                self.cluster.learn_identity(
                                    Self::slot_of(i),
                                    StoreIdentity {
                                        store_id: g.store_id,
                                        incarnation: g.incarnation,
                                    },
                                );
                            }
                        }
                        tracing::info!(%epoch, "every store granted with an empty log: binding their identities (bootstrap)");
                        self.persist_identities(Some(epoch));
                    }
                    return;
                }
                t.core.handle(
                    TakeoverInput::FenceGranted {
                        slot,
                        epoch: g.epoch,
                        identity: StoreIdentity {
                            store_id: g.store_id,
                            incarnation: g.incarnation,
                        },
                        last: g.last,
                        tail_cut: g.tail_cut,
                    },
                    &mut out,
                );
            }
            Ok(FenceOutcome::Refused(r)) => {
                self.highest_epoch_seen = self.highest_epoch_seen.max(r.promised);
                t.core.handle(
                    TakeoverInput::FenceRefused {
                        slot,
                        epoch,
                        promised: r.promised,
                        reason: FenceRefusal::Promised,
                    },
                    &mut out,
                );
            }
            Ok(FenceOutcome::NotVoter {
                store_id,
                incarnation,
            }) => {
                tracing::warn!(%slot, store_id = store_id.0, incarnation = incarnation.0, "store answered the fence: not a voter");
                if t.bootstrap.is_some() {
                    self.abandon_takeover("a store is a learner");
                    return;
                }
                t.core.handle(
                    TakeoverInput::FenceRefused {
                        slot,
                        epoch,
                        promised: Epoch::ZERO,
                        reason: FenceRefusal::NotVoter,
                    },
                    &mut out,
                );
            }
            Err(e) => {
                tracing::debug!(%slot, error = %e, "fence failed");
            }
        }
        self.dispatch_takeover(out);
    }

    fn finish_bootstrap(&mut self, epoch: Epoch, durable: bool) {
        let Role::TakingOver(t) = &mut self.role else {
            return;
        };
        if t.core.epoch() != epoch || t.bootstrap.is_none() {
            return;
        }
        if !durable {
            self.abandon_takeover("the store identities are not durable");
            return;
        }
        let grants = t.bootstrap.take().unwrap_or_default();
        let mut out = Vec::new();
        for (i, g) in grants.into_iter().enumerate() {
            let Some(g) = g else { continue };
            let slot = Self::slot_of(i);
            let identity = StoreIdentity {
                store_id: g.store_id,
                incarnation: g.incarnation,
            };
            t.core.handle(
                TakeoverInput::StoreIdentityKnown { slot, identity },
                &mut out,
            );
            t.core.handle(
                TakeoverInput::FenceGranted {
                    slot,
                    epoch: g.epoch,
                    identity,
                    last: g.last,
                    tail_cut: g.tail_cut,
                },
                &mut out,
            );
        }
        self.dispatch_takeover(out);
    }

    fn become_master(&mut self, adopted: AdoptedLog) {
        let Role::TakingOver(t) = std::mem::replace(&mut self.role, Role::Switching) else {
            return;
        };
        let epoch = adopted.epoch;
        self.see_epoch(epoch);
        let voters: Vec<Voter> = (0..self.store_count)
            .filter_map(|i| {
                let id = self.cluster.expected_identity(Self::slot_of(i))?;
                Some(Voter {
                    store_index: u16::try_from(i).ok()?,
                    store_id: id.store_id,
                    incarnation: id.incarnation,
                })
            })
            .collect();
        let payload = EventBody::EpochStart(EpochStartEvent {
            epoch,
            broker: self.me,
            voters,
        })
        .to_payload();
        let fallback = LocalLog {
            log: adopted.log.clone(),
            applied: adopted.applied,
        };
        let mut out = Vec::new();
        let core = payload.map_err(|e| e.to_string()).and_then(|payload| {
            MasterCore::new(
                MasterConfig {
                    cluster: self.cluster.clone(),
                    limits: self.limits,
                },
                adopted,
                payload,
                &mut out,
            )
            .map_err(|e| e.to_string())
        });
        match core {
            Ok(mut core) => {
                core.enable_check_quorum(self.check_quorum_ticks());
                tracing::info!(%epoch, log_end = %core.next_offset(), "became master; waiting for the epoch-start event to be stabilized");
                for (i, up) in self.slot_up.iter().enumerate() {
                    if !up {
                        core.handle(
                            MasterInput::SlotDisconnected {
                                slot: Self::slot_of(i),
                            },
                            &mut out,
                        );
                    }
                }
                self.role = Role::Master(Box::new(MasterRun {
                    core,
                    serving: false,
                    failover_from: t.failover_from,
                    writes: Writes::new(self.write_limits()),
                    store_answers: vec![None; self.store_count],
                    voted_at: vec![None; self.store_count],
                }));
                self.dispatch_master(out);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot lead the adopted log");
                self.role = Role::Follower(Box::new(self.new_follower(fallback, t.known_epoch)));
            }
        }
    }

    // ------------------------------------------------------------------ master

    fn on_append_answer(
        &mut self,
        slot: SlotId,
        meta: AppendMeta,
        outcome: Result<Frame, ClientError>,
    ) {
        let is_store = self.is_store(slot);
        let Role::Master(m) = &mut self.role else {
            if let Ok(Frame {
                body: Body::AppendRejected(r),
                ..
            }) = &outcome
            {
                self.see_epoch(r.promised);
            }
            return;
        };
        if meta.epoch != m.core.epoch() {
            return;
        }
        let input = match outcome {
            Ok(frame) => match frame.body {
                Body::PersistedAck(a) if is_store => {
                    let identity = StoreIdentity {
                        store_id: a.store_id,
                        incarnation: a.incarnation,
                    };
                    m.store_answers[slot.index()] = Some((identity, a.voter));
                    if a.voter && self.cluster.expected_identity(slot) == Some(identity) {
                        m.voted_at[slot.index()] = Some(Instant::now());
                    }
                    MasterInput::Persisted {
                        slot,
                        append: meta.append,
                        epoch: a.epoch,
                        through: a.through_offset,
                        identity,
                        voter: a.voter,
                    }
                }
                Body::HeartbeatAck(h) if !is_store => {
                    if h.epoch > m.core.epoch() {
                        MasterInput::RivalSeen { epoch: h.epoch }
                    } else {
                        MasterInput::SlaveHas {
                            slot,
                            append: meta.append,
                            epoch: meta.epoch,
                            through: meta.through,
                        }
                    }
                }
                Body::AppendRejected(r) => MasterInput::Rejected {
                    slot,
                    append: meta.append,
                    promised: r.promised,
                    last: r.last,
                    reason: core_reason(r.reason),
                },
                Body::ErrorResponse(e) => {
                    tracing::warn!(%slot, code = %e.code, message = %e.message, "append answered with an error");
                    return;
                }
                other => {
                    tracing::warn!(%slot, frame = ?other.frame_type(), "unexpected answer to an append");
                    return;
                }
            },
            Err(e) => {
                tracing::debug!(%slot, error = %e, "append failed");
                return;
            }
        };
        if let MasterInput::Rejected { promised, .. } = &input {
            self.highest_epoch_seen = self.highest_epoch_seen.max(*promised);
        }
        let mut out = Vec::new();
        m.core.handle(input, &mut out);
        self.dispatch_master(out);
    }

    fn dispatch_master(&mut self, out: Vec<MasterCommand>) {
        let mut encoded: Vec<(AppendKey, Arc<quire_proto::EncodedBody>)> = Vec::new();
        for c in out {
            match c {
                MasterCommand::Append(cmd) => match &cmd.events {
                    AppendEvents::InMemory(events) => {
                        self.send_append(&cmd, Batch::Core(events), &mut encoded);
                    }
                    AppendEvents::FromStore { source } => {
                        self.read_for_append(cmd.clone(), *source)
                    }
                },
                MasterCommand::Stabilized { through, events } => {
                    self.on_stabilized(through, &events)
                }
                MasterCommand::StepDown { promised } => self.step_down(promised),
                MasterCommand::QuorumLost {
                    voters_heard,
                    ack_quorum,
                } => {
                    self.lose_quorum(voters_heard, ack_quorum);
                }
            }
        }
        self.retention_barrier_check();
    }

    /// Encodes an append (once for every slot it goes to unchanged) and queues it.
    fn send_append(
        &mut self,
        cmd: &AppendCommand,
        events: Batch<'_>,
        cache: &mut Vec<(AppendKey, Arc<quire_proto::EncodedBody>)>,
    ) {
        if !self.slot_up[cmd.slot.index()] {
            return;
        }
        let key = AppendKey {
            epoch: cmd.epoch,
            prev: cmd.prev,
            first: cmd.first,
            count: cmd.count,
            hwm: cmd.hwm,
        };
        let body = if let Some((_, b)) = cache.iter().find(|(k, _)| *k == key) {
            b.clone()
        } else {
            let events = match events {
                Batch::Core(evs) => evs.iter().map(to_proto_event).collect(),
                Batch::Wire(evs) => evs,
            };
            let req = AppendRequest {
                epoch: cmd.epoch,
                prev: cmd.prev,
                events,
                hwm: cmd.hwm,
            };
            let mut scratch = BytesMut::new();
            match encode_body(&req.into(), &mut scratch) {
                Ok(b) => {
                    let b = Arc::new(b);
                    if cache.len() >= APPEND_ENCODE_CACHE_MAX {
                        cache.remove(0);
                    }
                    cache.push((key, b.clone()));
                    b
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode an append");
                    return;
                }
            }
        };
        let send = SlotSend {
            meta: AppendMeta::of(cmd),
            body,
        };
        if self.slots[cmd.slot.index()].tx.try_send(send).is_err() {
            tracing::debug!(slot = %cmd.slot, "slot queue full: the append is resent after its timeout");
        }
    }

    fn read_for_append(&mut self, cmd: AppendCommand, source: SlotId) {
        let Some(client) = self.slots[source.index()].client() else {
            return;
        };
        let tx = self.internal_tx.clone();
        tokio::spawn(async move {
            let want = u32::try_from(cmd.count).unwrap_or(u32::MAX);
            let mut events: Vec<quire_proto::Event> = Vec::new();
            let mut next = cmd.first;
            let outcome = loop {
                if events.len() as u64 >= cmd.count {
                    break Ok(events);
                }
                let left = want - u32::try_from(events.len()).unwrap_or(u32::MAX);
                match client.read(next, left, READ_BYTES_MAX).await {
                    Ok(r) if r.events.first().is_some_and(|e| e.offset == next) => {
                        next = Offset(next.0 + r.events.len() as u64);
                        events.extend(r.events);
                    }
                    Ok(_) => break Err(format!("the store does not hold offset {next}")),
                    Err(ClientError::Trimmed { first_offset, .. }) => {
                        let _ = tx.send(Internal::ReadTrimmed { cmd, first_offset }).await;
                        return;
                    }
                    Err(e) => break Err(e.to_string()),
                }
            };
            let outcome = outcome.map(|mut evs| {
                evs.truncate(usize::try_from(cmd.count).unwrap_or(usize::MAX));
                evs
            });
            let _ = tx.send(Internal::ReadForAppend { cmd, outcome }).await;
        });
    }

    fn on_stabilized(&mut self, through: Offset, events: &[Event]) {
        self.apply_events(events);
        let now = Instant::now();
        let Role::Master(m) = &mut self.role else {
            return;
        };
        let mut out = Vec::new();
        m.writes.on_stabilized(through, &mut out);
        if !m.serving && m.core.hwm() >= Some(m.core.epoch_start()) {
            m.serving = true;
            let took = now.duration_since(m.failover_from);
            self.metrics.failovers.inc();
            self.metrics.failover_duration.observe(took.as_secs_f64());
            tracing::info!(epoch = %m.core.epoch(), hwm = ?m.core.hwm(), took_ms = took.as_millis() as u64, "master is serving");
        }
        self.execute_writes(out, None);
        self.advance_handoff();
        self.retry_blocked();
    }

    /// Stops being master and follows: fenced by the higher epoch `promised`.
    fn step_down(&mut self, promised: Epoch) {
        self.leave_master(promised, None);
    }

    /// The check-quorum rule gave up ([`MasterCommand::QuorumLost`]): step down without a
    /// higher epoch, so the slaves stop hearing heartbeats and one that reaches a quorum of
    /// stores takes over. The writes that were waiting get `NoQuorum` (outcome unknown).
    fn lose_quorum(&mut self, voters_heard: usize, ack_quorum: usize) {
        let Role::Master(m) = &self.role else {
            return;
        };
        let own = m.core.epoch();
        tracing::warn!(
            epoch = %own,
            voters_heard,
            ack_quorum,
            window_ms = self.cfg.election_timeout.as_millis() as u64,
            "check-quorum: too few voting stores acked within the election timeout; stepping down so a slave that reaches them can take over; nothing more is acked"
        );
        let why = format!(
            "the master lost its quorum of stores ({voters_heard} voting stores acked within the election timeout, {ack_quorum} needed) and stepped down; the outcome is unknown (retry with the same producer id and sequence)"
        );
        self.leave_master(own, Some(why));
    }

    /// Leaves the master role for a follower that knows epoch `promised`. Waiting writes get
    /// `NoQuorum` with `no_quorum` as the message when given, `NotMaster` otherwise; writes
    /// not yet proposed and waiting fetches get `NotMaster`.
    fn leave_master(&mut self, promised: Epoch, no_quorum: Option<String>) {
        let Role::Master(m) = std::mem::replace(&mut self.role, Role::Switching) else {
            return;
        };
        self.see_epoch(promised);
        self.metrics.step_downs.inc();
        if no_quorum.is_none() {
            tracing::warn!(epoch = %m.core.epoch(), %promised, "fenced by a higher epoch: stepping down to slave; nothing more is acked");
        }
        let MasterRun { core, writes, .. } = *m;
        let local = core.into_local_log();
        self.role = Role::Follower(Box::new(self.new_follower(local, promised)));
        let mut out = Vec::new();
        writes.fail_all(no_quorum.as_deref(), &mut out);
        self.execute_writes(out, None);
        for f in std::mem::take(&mut self.fetch_waiters) {
            self.not_master(&f.waiter.reply, f.waiter.request_id);
        }
    }

    /// Sends what deferred proposals are due.
    fn flush(&mut self) {
        let Role::Master(m) = &mut self.role else {
            return;
        };
        if !m.writes.take_needs_flush() {
            return;
        }
        let mut out = Vec::new();
        m.core.flush(&mut out);
        self.dispatch_master(out);
    }

    // ------------------------------------------------------------------ produce

    fn on_write_request(&mut self, r: Request) {
        let gate = self.write_gate();
        let received_ms = self.ms_at(r.received);
        let Role::Master(m) = &mut self.role else {
            if matches!(r.body, Body::ProduceRequest(_)) {
                self.metrics.produce_error("not_master");
            }
            self.not_master(&r.reply, r.request_id);
            return;
        };
        let request = match r.body {
            Body::ProduceRequest(p) => WriteRequest::Produce(p),
            Body::CommitCursorRequest(c) => WriteRequest::CommitCursor(c),
            _ => return,
        };
        let token = RequestToken(self.next_token);
        self.next_token += 1;
        self.held_writes.insert(
            token,
            HeldWrite {
                request_id: r.request_id,
                reply: r.reply,
                permits: r.permits,
                received: r.received,
            },
        );
        let arrival = Arrival {
            token,
            request,
            received_ms,
        };
        let mut out = Vec::new();
        m.writes
            .on_request(&mut m.core, &self.state, gate, arrival, &mut out);
        self.execute_writes(out, None);
    }

    /// Whether the write path may propose now.
    fn write_gate(&self) -> Gate {
        let open = self.is_serving() && !self.is_handing_off() && self.trim_barrier.is_none();
        if open {
            Gate::Open
        } else {
            Gate::Held
        }
    }

    /// The engine's write bounds from the settings.
    fn write_limits(&self) -> WriteLimits {
        WriteLimits {
            message_bytes_max: self.cfg.message_bytes_max,
            inflight_bytes_max: self.limits.inflight_bytes_max,
            produce_timeout_ms: u64::try_from(self.cfg.produce_timeout.as_millis())
                .unwrap_or(u64::MAX),
            blocked_requests_max: BLOCKED_REQUESTS_MAX,
        }
    }

    /// `t` in ms on the engine's clock (since the actor started).
    fn ms_at(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.start).as_millis()).unwrap_or(u64::MAX)
    }

    /// Carries out the write path's commands. `not_master` replaces the usual `NotMaster`
    /// answer (a handoff names its target).
    fn execute_writes(&mut self, out: Vec<WriteCommand>, not_master: Option<&ErrorResponse>) {
        let now = Instant::now();
        for c in out {
            match c {
                WriteCommand::Proposed { last } => {
                    self.proposed_at.insert(last, now);
                }
                WriteCommand::Stabilized {
                    last,
                    kind,
                    count,
                    waiters,
                } => {
                    if let Some(t) = self.proposed_at.remove(&last) {
                        self.metrics
                            .quorum_wait
                            .observe(now.duration_since(t).as_secs_f64());
                    }
                    if kind == WriteKind::Produce {
                        self.metrics
                            .produce_messages_acked
                            .inc_by(count * waiters as u64);
                    }
                }
                WriteCommand::Answer {
                    token,
                    kind,
                    reply,
                    error_label,
                } => {
                    let Some(h) = self.held_writes.remove(&token) else {
                        continue;
                    };
                    if let Some(label) = error_label {
                        self.metrics.produce_error(label);
                    }
                    let body: Body = match reply {
                        Reply::Produced { base_offset, count } => {
                            if kind == WriteKind::Produce {
                                self.metrics
                                    .produce_latency
                                    .observe(now.duration_since(h.received).as_secs_f64());
                            }
                            ProduceResponse { base_offset, count }.into()
                        }
                        Reply::CursorCommitted => CommitCursorResponse.into(),
                        Reply::NotMaster => match not_master {
                            Some(e) => e.clone().into(),
                            None => {
                                let (epoch, master) = self.master_hint();
                                ErrorResponse::not_master(epoch, master).into()
                            }
                        },
                        Reply::Error(e) => e.into(),
                    };
                    h.reply.answer(h.request_id, body, h.permits);
                }
            }
        }
        if !matches!(self.role, Role::Master(_)) {
            self.proposed_at.clear();
        }
    }

    /// Retries blocked requests in order while they fit.
    fn retry_blocked(&mut self) {
        let gate = self.write_gate();
        let Role::Master(m) = &mut self.role else {
            return;
        };
        let mut out = Vec::new();
        m.writes
            .retry_blocked(&mut m.core, &self.state, gate, &mut out);
        self.execute_writes(out, None);
    }

    /// Fails the writes that waited past their deadline (see [`Writes::expire`]).
    fn expire_writes(&mut self, now: Instant) {
        let now_ms = self.ms_at(now);
        let Role::Master(m) = &mut self.role else {
            return;
        };
        // A voter is reachable if it is connected and acked (heartbeats included) within
        // the produce timeout: a stopped store keeps its connection but acks nothing.
        let window = self.cfg.produce_timeout;
        let up_voters = (0..self.store_count)
            .filter(|&i| {
                self.slot_up[i]
                    && m.voted_at[i].is_some_and(|t| now.saturating_duration_since(t) < window)
            })
            .count();
        let mut out = Vec::new();
        m.writes
            .expire(now_ms, up_voters, self.cluster.ack_quorum, &mut out);
        self.execute_writes(out, None);
    }

    // ------------------------------------------------------------------ fetch

    fn on_fetch(&mut self, r: Request) {
        if !self.is_serving() {
            self.not_master(&r.reply, r.request_id);
            return;
        }
        let Body::FetchRequest(req) = r.body else {
            return;
        };
        let wait = Duration::from_millis(u64::from(req.wait_ms.min(FETCH_WAIT_MS_MAX)));
        let waiter = Waiter {
            request_id: r.request_id,
            reply: r.reply,
            deadline: r.received + wait,
            permits: r.permits,
        };
        self.serve_fetch(req, waiter, false);
    }

    /// Answers a fetch from memory, from a store, or parks it until messages arrive.
    fn serve_fetch(&mut self, req: FetchRequest, waiter: Waiter, expired: bool) {
        if let Some(trimmed) = self.trimmed_answer(req.from_offset) {
            waiter.answer(trimmed.into());
            return;
        }
        let hwm = match &self.role {
            Role::Master(m) => m.core.hwm(),
            _ => self.state.applied(),
        };
        let max_messages = (req.max_messages as usize).clamp(1, MESSAGES_PER_FRAME_MAX);
        let offsets = self
            .state
            .topic_offsets(&req.topic, req.from_offset, max_messages);
        if offsets.is_empty() {
            if !expired
                && waiter.deadline > Instant::now()
                && self.fetch_waiters.len() < FETCH_WAITERS_MAX
            {
                self.fetch_waiters.push(FetchWaiter { req, waiter });
                return;
            }
            let next = req
                .from_offset
                .max(self.state.applied().map_or(Offset::ZERO, Offset::next));
            waiter.answer(
                FetchResponse {
                    hwm,
                    next_offset: next,
                    messages: Vec::new(),
                }
                .into(),
            );
            return;
        }
        let bytes_max = (req.max_bytes as usize).clamp(1, FETCH_BYTES_MAX);
        let mut messages: Vec<(Offset, Bytes)> = Vec::new();
        let mut bytes = 0usize;
        let mut missed = false;
        for &o in &offsets {
            let Some(e) = self.recent.get(o) else {
                missed = true;
                break;
            };
            let Ok(EventBody::Message(msg)) = EventBody::decode(EventKind::Message, &e.payload)
            else {
                continue;
            };
            if !messages.is_empty() && bytes + msg.message.len() > bytes_max {
                break;
            }
            bytes += msg.message.len();
            messages.push((o, msg.message));
        }
        if messages.is_empty() && missed {
            self.fetch_from_store(req, offsets, bytes_max, hwm, waiter);
            return;
        }
        let next_offset = messages.last().map_or(req.from_offset, |(o, _)| o.next());
        waiter.answer(
            FetchResponse {
                hwm,
                next_offset,
                messages,
            }
            .into(),
        );
    }

    /// Serves a fetch of offsets older than the in-memory window by reading a voting store
    /// that holds them.
    fn fetch_from_store(
        &mut self,
        req: FetchRequest,
        offsets: Vec<Offset>,
        bytes_max: usize,
        hwm: Option<Offset>,
        waiter: Waiter,
    ) {
        self.metrics.fetches_from_store.inc();
        let (Some(&first), Some(&last)) = (offsets.first(), offsets.last()) else {
            return;
        };
        let source = match &self.role {
            Role::Master(m) => (0..self.store_count).map(Self::slot_of).find(|&s| {
                self.slot_up[s.index()]
                    && m.core.slot_status(s).is_some_and(|st| {
                        st.link == SlotLink::Up && st.voted_through >= Some(first)
                    })
            }),
            _ => None,
        };
        let client = source.and_then(|s| self.slots[s.index()].client());
        let Some(client) = client else {
            waiter.answer(
                ErrorResponse::new(
                    ErrorCode::Internal,
                    "no store can serve this range now; retry",
                )
                .into(),
            );
            return;
        };
        let trim_point = self.state.trim_point();
        tokio::spawn(async move {
            let span = u32::try_from(last.0 - first.0 + 1)
                .unwrap_or(u32::MAX)
                .min(TAKEOVER_FETCH_EVENTS_MAX);
            let wanted: BTreeSet<Offset> = offsets.into_iter().collect();
            match client.read(first, span, READ_BYTES_MAX).await {
                Ok(read) if read.events.is_empty() && read.first_offset > first => {
                    // Retention deleted the range on this store since the state was read.
                    waiter.answer(
                        ErrorResponse::trimmed(req.from_offset, read.first_offset.max(trim_point))
                            .into(),
                    );
                }
                Ok(read) => {
                    let mut messages = Vec::new();
                    let mut bytes = 0usize;
                    let mut scanned: Option<Offset> = None;
                    for e in read.events {
                        if e.offset > last {
                            break;
                        }
                        scanned = Some(e.offset);
                        if !wanted.contains(&e.offset) || e.kind != EventKind::Message {
                            continue;
                        }
                        let Ok(EventBody::Message(msg)) =
                            EventBody::decode(EventKind::Message, &e.payload)
                        else {
                            continue;
                        };
                        if !messages.is_empty() && bytes + msg.message.len() > bytes_max {
                            break;
                        }
                        bytes += msg.message.len();
                        messages.push((e.offset, msg.message));
                    }
                    let next_offset = messages.last().map_or_else(
                        || {
                            scanned
                                .map_or(req.from_offset, Offset::next)
                                .max(req.from_offset)
                        },
                        |(o, _): &(Offset, Bytes)| o.next(),
                    );
                    waiter.answer(
                        FetchResponse {
                            hwm,
                            next_offset,
                            messages,
                        }
                        .into(),
                    );
                }
                Err(e) => waiter.answer(
                    ErrorResponse::new(
                        ErrorCode::Internal,
                        format!("reading a store failed: {e}; retry"),
                    )
                    .into(),
                ),
            }
        });
    }

    /// Re-serves parked fetches (of the `touched` topics, or all).
    fn wake_fetches(&mut self, touched: Option<&BTreeSet<String>>) {
        let parked = std::mem::take(&mut self.fetch_waiters);
        for f in parked {
            if touched.is_some_and(|t| !t.contains(&f.req.topic)) {
                self.fetch_waiters.push(f);
                continue;
            }
            self.serve_fetch(f.req, f.waiter, false);
        }
    }

    fn expire_fetches(&mut self, now: Instant) {
        if self.fetch_waiters.iter().all(|f| f.waiter.deadline > now) {
            return;
        }
        let parked = std::mem::take(&mut self.fetch_waiters);
        for f in parked {
            if f.waiter.deadline <= now {
                self.serve_fetch(f.req, f.waiter, true);
            } else {
                self.fetch_waiters.push(f);
            }
        }
    }
}

/// How long a takeover may go without progress before it is dropped: twice the election
/// timeout, at least 1 s.
fn takeover_budget(cfg: &BrokerConfig) -> Duration {
    cfg.election_timeout.max(Duration::from_millis(500)) * 2
}

/// The events of an append to encode.
enum Batch<'a> {
    /// Events from the master's memory.
    Core(&'a [Event]),
    /// Events read from a store.
    Wire(Vec<quire_proto::Event>),
}

/// Distinct appends whose encoding one dispatch keeps for the other slots.
const APPEND_ENCODE_CACHE_MAX: usize = 32;

/// What identifies an append's bytes apart from the request id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AppendKey {
    epoch: Epoch,
    prev: Option<LogPosition>,
    first: Offset,
    count: u64,
    hwm: Option<Offset>,
}
