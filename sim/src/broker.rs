//! A simulated broker: the broker's pure cores ([`FollowerCore`], [`TakeoverCore`],
//! [`MasterCore`]) and its broker state ([`BrokerState`]) driven the way the broker's actor
//! drives them, with the network, the clock and the epoch-counter file simulated.
//!
//! The roles and their changes follow `broker/src/server/actor.rs`: every broker starts as a
//! slave (a follower with an empty log, knowing the voters' identities from its cluster
//! file — the simulation starts after the cluster's bootstrap); an election timeout starts a
//! takeover; `BecomeMaster` starts a master with an epoch-start event naming the voters; a
//! higher epoch in any answer or a rival's append turns a master or a takeover back into a
//! slave. Produce requests go through the broker's own write path
//! ([`quire_broker::engine::Writes`], the code the broker's actor drives): a batch already
//! applied is answered from the idempotent-producer table with its offsets, a batch in
//! flight gets the same answer as the first attempt, and the master answers only once a
//! batch is stabilized. A restart forgets everything but the epoch counter and the cluster file.

use std::collections::{BTreeMap, VecDeque};

use quire_broker::core::takeover::TakeoverMutation;
use quire_broker::core::{
    AdoptedLog, AppendCommand, AppendEvents, AppendId, ClusterConfig, ElectionConfig, Event,
    FenceRefusal, FollowerCommand, FollowerConfig, FollowerCore, FollowerInput, LocalLog,
    MasterCommand, MasterConfig, MasterCore, MasterInput, RejectReason, ReplicationLimits, SlotId,
    SlotKind, StoreIdentity, TakeoverCommand, TakeoverConfig, TakeoverCore, TakeoverInput,
};
use quire_broker::engine::{
    Arrival, Gate, Reply, RequestToken, WriteCommand, WriteLimits, WriteRequest, Writes,
};
use quire_broker::state::BrokerState;
use quire_proto::{
    AppendRejected, AppendRequest, BrokerId, Epoch, EpochStartEvent, ErrorCode, EventBody,
    EventKind, FenceRequest, Offset, ProduceRequest, Voter,
};

use crate::msg::{AppendMeta, Msg, NodeId, ProduceError, ReadPurpose};
use crate::out::{Later, Out, Seen};
use crate::rng::SimRng;

/// Produce requests a master holds at most while it is not serving yet or has no room.
pub(crate) const BLOCKED_REQUESTS_MAX: usize = 256;

/// The settings every broker of a run shares.
#[derive(Clone, Debug)]
pub(crate) struct BrokerParams {
    pub(crate) stores: usize,
    pub(crate) brokers: usize,
    pub(crate) limits: ReplicationLimits,
    pub(crate) election_timeout_ms_min: u64,
    pub(crate) fetch_events_max: u32,
    pub(crate) takeover_timeout_ms: u64,
    pub(crate) produce_timeout_ms: u64,
    pub(crate) follower_retained_bytes_max: u64,
    /// The store identities bound in every broker's cluster file.
    pub(crate) identities: Vec<StoreIdentity>,
    /// Test-only: adopt the longest log in takeovers.
    pub(crate) adopt_longest: bool,
    /// Test-only: a restarted broker reads its epoch counter as 0.
    pub(crate) forget_epoch: bool,
    /// Report the protocol's steps for the trace.
    pub(crate) verbose: bool,
}

/// Where the answer to a write request the engine holds goes.
#[derive(Clone, Copy, Debug)]
struct Requester {
    client: NodeId,
    boot: u32,
    request: u64,
}

#[derive(Debug)]
struct MasterRun {
    core: MasterCore,
    serving: bool,
    /// The broker engine's write path.
    writes: Writes,
}

#[derive(Debug)]
struct TakeoverRun {
    core: TakeoverCore,
    deadline_ms: u64,
    known_epoch: Epoch,
}

#[derive(Debug)]
enum Role {
    Follower(Box<FollowerCore>),
    TakingOver(Box<TakeoverRun>),
    Master(Box<MasterRun>),
}

/// One simulated broker. See the module docs.
#[derive(Debug)]
pub(crate) struct SimBroker {
    pub(crate) index: u8,
    id: BrokerId,
    pub(crate) up: bool,
    pub(crate) boot: u32,
    params: BrokerParams,
    /// The epoch counter file.
    durable_counter: u64,
    /// A counter write in flight.
    persisting: Option<u64>,
    role: Option<Role>,
    state: BrokerState,
    /// Every stabilized event applied, by offset (what consumers read).
    applied: Vec<Event>,
    highest_seen: Epoch,
    cluster: ClusterConfig,
    slot_up: Vec<bool>,
    seed: u64,
    clock_offset_ms: u64,
    clock_rate_ppm: u64,
    /// Times a mutation changed what this broker did.
    pub(crate) mutated: u64,
    /// Write requests the engine holds, by token.
    held_writes: BTreeMap<RequestToken, Requester>,
    next_token: u64,
}

fn to_proto_event(e: &Event) -> quire_proto::Event {
    quire_proto::Event {
        epoch: e.epoch,
        offset: e.offset,
        kind: EventKind::from_u8(e.kind)
            .expect("invariant: every event a simulated broker holds has a known kind"),
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

impl SimBroker {
    /// A broker, stopped; [`SimBroker::start`] starts it.
    pub(crate) fn new(index: u8, params: BrokerParams, rng: &mut SimRng) -> SimBroker {
        let id = BrokerId(u16::from(index) + 1);
        let cluster = Self::cluster_of(&params, index);
        SimBroker {
            index,
            id,
            up: false,
            boot: 0,
            durable_counter: 0,
            persisting: None,
            role: None,
            state: BrokerState::new(),
            applied: Vec::new(),
            highest_seen: Epoch::ZERO,
            slot_up: vec![false; cluster.slots.len()],
            cluster,
            params,
            seed: rng.next_u64(),
            clock_offset_ms: rng.range(0, 10_000),
            clock_rate_ppm: rng.range(950_000, 1_050_000),
            mutated: 0,
            held_writes: BTreeMap::new(),
            next_token: 0,
        }
    }

    fn cluster_of(params: &BrokerParams, me: u8) -> ClusterConfig {
        let mut slots: Vec<SlotKind> = params
            .identities
            .iter()
            .map(|&id| SlotKind::Store { identity: Some(id) })
            .collect();
        for b in 0..params.brokers {
            let b = u8::try_from(b).expect("invariant: few brokers");
            if b != me {
                slots.push(SlotKind::Slave {
                    broker: BrokerId(u16::from(b) + 1),
                });
            }
        }
        ClusterConfig::with_majorities(slots)
    }

    /// The process at slot `slot` of this broker's configuration.
    pub(crate) fn slot_node(&self, slot: SlotId) -> NodeId {
        let i = slot.index();
        if i < self.params.stores {
            return NodeId::Store(u8::try_from(i).expect("invariant: few stores"));
        }
        let k = i - self.params.stores;
        let b = if k < usize::from(self.index) {
            k
        } else {
            k + 1
        };
        NodeId::Broker(u8::try_from(b).expect("invariant: few brokers"))
    }

    /// The slot of process `node`, if it is one of this broker's slots.
    pub(crate) fn node_slot(&self, node: NodeId) -> Option<SlotId> {
        let i = match node {
            NodeId::Store(s) => usize::from(s),
            NodeId::Broker(b) if b != self.index => {
                let k = if b < self.index {
                    usize::from(b)
                } else {
                    usize::from(b) - 1
                };
                self.params.stores + k
            }
            _ => return None,
        };
        (i < self.cluster.slots.len()).then(|| SlotId(u16::try_from(i).expect("few slots")))
    }

    /// Number of slots.
    pub(crate) fn slot_count(&self) -> usize {
        self.cluster.slots.len()
    }

    fn is_store(&self, slot: SlotId) -> bool {
        slot.index() < self.params.stores
    }

    /// This broker's clock, from the world's.
    pub(crate) fn local_ms(&self, now_ms: u64) -> u64 {
        self.clock_offset_ms + now_ms * self.clock_rate_ppm / 1_000_000
    }

    /// Whether this broker is master and serving producers.
    pub(crate) fn is_serving_master(&self) -> bool {
        matches!(&self.role, Some(Role::Master(m)) if m.serving)
    }

    /// The epoch of the entry at `offset` of this broker's log if it is master of `epoch`.
    pub(crate) fn master_epoch_at(&self, epoch: Epoch, offset: Offset) -> Option<Option<Epoch>> {
        match &self.role {
            Some(Role::Master(m)) if m.core.epoch() == epoch => Some(m.core.log().epoch_at(offset)),
            _ => None,
        }
    }

    /// The master epoch if this broker is master.
    pub(crate) fn master_epoch(&self) -> Option<Epoch> {
        match &self.role {
            Some(Role::Master(m)) => Some(m.core.epoch()),
            _ => None,
        }
    }

    // ---------------------------------------------------------------- lifecycle

    /// Starts the process: a slave with an empty log. `slot_up` says which slots are
    /// reachable now.
    pub(crate) fn start(&mut self, now_ms: u64, slot_up: Vec<bool>, out: &mut Out) {
        assert!(!self.up, "start of a running broker");
        self.up = true;
        self.boot += 1;
        if self.params.forget_epoch && self.durable_counter > 0 {
            // MUTANT (test-only): the epoch counter is read back as 0.
            self.durable_counter = 0;
            self.mutated += 1;
        }
        self.state = BrokerState::new();
        self.applied.clear();
        self.highest_seen = Epoch::ZERO;
        self.cluster = Self::cluster_of(&self.params, self.index);
        self.slot_up = slot_up;
        let f = self.new_follower(now_ms, LocalLog::empty(), Epoch::ZERO);
        self.role = Some(Role::Follower(Box::new(f)));
        out.seen.push(Seen::Note(format!(
            "B{} started (epoch counter {})",
            self.index + 1,
            self.durable_counter
        )));
    }

    /// The process dies. A counter write in flight may or may not have reached the disk.
    pub(crate) fn crash(&mut self, rng: &mut SimRng) {
        if let Some(c) = self.persisting.take() {
            if rng.chance(0.5) {
                self.durable_counter = self.durable_counter.max(c);
            }
        }
        self.up = false;
        self.role = None;
    }

    // ---------------------------------------------------------------- inputs

    /// The heartbeat timer fired.
    pub(crate) fn on_tick(&mut self, now_ms: u64, out: &mut Out) {
        let local = self.local_ms(now_ms);
        match self.role.as_mut() {
            Some(Role::Follower(f)) => {
                let mut cmds = Vec::new();
                f.handle(FollowerInput::Tick { now_ms: local }, &mut cmds);
                if cmds
                    .iter()
                    .any(|c| matches!(c, FollowerCommand::StartTakeover { .. }))
                {
                    self.start_takeover(now_ms, out);
                }
            }
            Some(Role::TakingOver(t)) if local >= t.deadline_ms => {
                self.abandon_takeover(now_ms, "timed out", out);
            }
            Some(Role::Master(m)) => {
                let mut cmds = Vec::new();
                m.core.handle(MasterInput::HeartbeatTick, &mut cmds);
                self.dispatch_master(cmds, now_ms, out);
                self.expire_writes(now_ms, out);
            }
            Some(Role::TakingOver(_)) | None => {}
        }
    }

    /// The connection to `slot` came up or went down.
    pub(crate) fn on_link(&mut self, slot: SlotId, up: bool, now_ms: u64, out: &mut Out) {
        if slot.index() >= self.slot_up.len() || self.slot_up[slot.index()] == up {
            return;
        }
        self.slot_up[slot.index()] = up;
        match self.role.as_mut() {
            Some(Role::Master(m)) => {
                let input = if up {
                    MasterInput::SlotConnected { slot }
                } else {
                    MasterInput::SlotDisconnected { slot }
                };
                let mut cmds = Vec::new();
                m.core.handle(input, &mut cmds);
                self.dispatch_master(cmds, now_ms, out);
            }
            Some(Role::TakingOver(t)) if up => {
                let mut cmds = Vec::new();
                t.core
                    .handle(TakeoverInput::SlotConnected { slot }, &mut cmds);
                self.dispatch_takeover(cmds, now_ms, out);
            }
            _ => {}
        }
    }

    /// The epoch counter write for `counter` completed.
    pub(crate) fn on_counter_persisted(&mut self, counter: u64, now_ms: u64, out: &mut Out) {
        if self.persisting == Some(counter) {
            self.persisting = None;
        }
        self.durable_counter = self.durable_counter.max(counter);
        if let Some(Role::TakingOver(t)) = self.role.as_mut() {
            let mut cmds = Vec::new();
            t.core
                .handle(TakeoverInput::EpochPersisted { counter }, &mut cmds);
            self.dispatch_takeover(cmds, now_ms, out);
        }
    }

    /// A message from `from` (incarnation `from_boot`).
    pub(crate) fn on_msg(
        &mut self,
        from: NodeId,
        from_boot: u32,
        msg: Msg,
        now_ms: u64,
        out: &mut Out,
    ) {
        match msg {
            Msg::Append { meta, req } => {
                self.on_inbound_append(from, from_boot, meta, req, now_ms, out)
            }
            Msg::Persisted { .. }
            | Msg::Rejected { .. }
            | Msg::AppendError { .. }
            | Msg::SlaveHas { .. } => {
                if let Some(slot) = self.node_slot(from) {
                    self.on_append_answer(slot, msg, now_ms, out);
                }
            }
            Msg::FenceGranted(_) | Msg::FenceRefused { .. } | Msg::NotVoter { .. } => {
                if let Some(slot) = self.node_slot(from) {
                    self.on_fence_answer(slot, msg, now_ms, out);
                }
            }
            Msg::ReadResult {
                purpose,
                from: first,
                events,
            } => {
                if let Some(slot) = self.node_slot(from) {
                    self.on_read_result(slot, purpose, first, events, now_ms, out);
                }
            }
            Msg::Produce {
                request,
                producer_id,
                sequence,
                topic,
                messages,
            } => {
                let requester = Requester {
                    client: from,
                    boot: from_boot,
                    request,
                };
                let req = ProduceRequest {
                    topic,
                    producer_id,
                    sequence,
                    messages,
                };
                self.on_produce(requester, req, now_ms, out);
            }
            Msg::Fetch {
                request,
                from: first,
                max_events,
            } => {
                let start = usize::try_from(first.0)
                    .unwrap_or(usize::MAX)
                    .min(self.applied.len());
                let end = start
                    .saturating_add(usize::try_from(max_events).unwrap_or(usize::MAX))
                    .min(self.applied.len());
                out.answer(
                    from,
                    from_boot,
                    Msg::Fetched {
                        request,
                        from: first,
                        events: self.applied[start..end].to_vec(),
                    },
                );
            }
            Msg::Fence { .. }
            | Msg::Read { .. }
            | Msg::ProduceOk { .. }
            | Msg::ProduceFailed { .. }
            | Msg::Fetched { .. } => {}
        }
    }

    // ---------------------------------------------------------------- slave path

    /// A trace line, built only when the run keeps a trace.
    fn note(&self, out: &mut Out, line: impl FnOnce() -> String) {
        if self.params.verbose {
            out.seen
                .push(Seen::Note(format!("B{} {}", self.index + 1, line())));
        }
    }

    fn see(&mut self, e: Epoch) {
        self.highest_seen = self.highest_seen.max(e);
    }

    fn new_follower(&mut self, now_ms: u64, local: LocalLog, known_epoch: Epoch) -> FollowerCore {
        self.seed = self
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let min = self.params.election_timeout_ms_min;
        let config = FollowerConfig {
            election: ElectionConfig {
                election_timeout_ms_min: min,
                election_timeout_ms_jitter: min / 2,
                rank: u32::from(self.index),
                rank_step_ms: min / 4,
            },
            retained_bytes_max: self.params.follower_retained_bytes_max,
        };
        let now = self.local_ms(now_ms);
        match FollowerCore::new(config, local, known_epoch, self.seed, now) {
            Ok(f) => f,
            Err(e) => panic!("a simulated broker's local log is invalid: {e}"),
        }
    }

    fn on_inbound_append(
        &mut self,
        from: NodeId,
        from_boot: u32,
        meta: AppendMeta,
        req: AppendRequest,
        now_ms: u64,
        out: &mut Out,
    ) {
        self.see(req.epoch);
        match self.role.as_mut() {
            Some(Role::Master(m)) if req.epoch > m.core.epoch() => {
                let mut cmds = Vec::new();
                m.core
                    .handle(MasterInput::RivalSeen { epoch: req.epoch }, &mut cmds);
                self.dispatch_master(cmds, now_ms, out);
            }
            Some(Role::Master(m)) => {
                let rejected = AppendRejected {
                    reason: quire_proto::RejectReason::StaleEpoch,
                    promised: m.core.epoch(),
                    last: m.core.log().last(),
                };
                out.answer(from, from_boot, Msg::Rejected { meta, rejected });
                return;
            }
            Some(Role::TakingOver(t)) if req.epoch > t.core.epoch() => {
                let mut cmds = Vec::new();
                t.core
                    .handle(TakeoverInput::RivalSeen { epoch: req.epoch }, &mut cmds);
                self.dispatch_takeover(cmds, now_ms, out);
            }
            Some(Role::TakingOver(t)) => {
                let rejected = AppendRejected {
                    reason: quire_proto::RejectReason::StaleEpoch,
                    promised: t.core.epoch(),
                    last: None,
                };
                out.answer(from, from_boot, Msg::Rejected { meta, rejected });
                return;
            }
            _ => {}
        }
        let Some(Role::Follower(f)) = self.role.as_mut() else {
            out.answer(from, from_boot, Msg::AppendError { meta });
            return;
        };
        let mut cmds = Vec::new();
        f.handle(
            FollowerInput::Append {
                append: meta.append,
                epoch: req.epoch,
                prev: req.prev,
                events: req.events.into_iter().map(from_proto_event).collect(),
                hwm: req.hwm,
            },
            &mut cmds,
        );
        let master_epoch = f.master_epoch();
        for c in cmds {
            match c {
                FollowerCommand::Has { .. } => out.answer(
                    from,
                    from_boot,
                    Msg::SlaveHas {
                        meta,
                        epoch: master_epoch,
                    },
                ),
                FollowerCommand::Refuse {
                    known_epoch,
                    last,
                    reason,
                    ..
                } => out.answer(
                    from,
                    from_boot,
                    Msg::Rejected {
                        meta,
                        rejected: AppendRejected {
                            reason: wire_reason(reason),
                            promised: known_epoch,
                            last,
                        },
                    },
                ),
                FollowerCommand::Apply { events } => {
                    self.apply_events(&events);
                    out.seen.push(Seen::Applied {
                        broker: self.index,
                        events,
                    });
                }
                FollowerCommand::StartTakeover { .. } => {}
            }
        }
    }

    fn apply_events(&mut self, events: &[Event]) {
        for e in events {
            assert_eq!(
                e.offset.0,
                self.applied.len() as u64,
                "a broker applies stabilized events in order, once"
            );
            self.state.apply(e);
            self.applied.push(e.clone());
        }
    }

    // ---------------------------------------------------------------- takeover

    fn start_takeover(&mut self, now_ms: u64, out: &mut Out) {
        let Some(Role::Follower(f)) = self.role.take() else {
            return;
        };
        let known_epoch = f.master_epoch();
        let highest = self.highest_seen.max(known_epoch);
        let local = f.into_local_log();
        let config = TakeoverConfig {
            broker: self.id,
            cluster: self.cluster.clone(),
            fetch_events_max: self.params.fetch_events_max,
        };
        let mut cmds = Vec::new();
        let fallback = local.clone();
        match TakeoverCore::start(config, self.durable_counter, highest, local, &mut cmds) {
            Ok(mut core) => {
                if self.params.adopt_longest {
                    core.set_mutation(TakeoverMutation::AdoptLongest);
                }
                out.seen.push(Seen::Note(format!(
                    "B{} takes over with epoch {:#x}",
                    self.index + 1,
                    core.epoch().0
                )));
                self.role = Some(Role::TakingOver(Box::new(TakeoverRun {
                    core,
                    deadline_ms: self.local_ms(now_ms) + self.params.takeover_timeout_ms,
                    known_epoch,
                })));
                self.dispatch_takeover(cmds, now_ms, out);
            }
            Err(e) => panic!("a simulated takeover cannot start: {e} ({fallback:?})"),
        }
    }

    fn abandon_takeover(&mut self, now_ms: u64, why: &str, out: &mut Out) {
        let Some(Role::TakingOver(t)) = self.role.take() else {
            return;
        };
        self.see(t.core.highest_seen());
        out.seen.push(Seen::Note(format!(
            "B{} abandons the takeover with epoch {:#x}: {why}",
            self.index + 1,
            t.core.epoch().0
        )));
        let known = t.known_epoch;
        let local = t.core.into_local_log();
        let f = self.new_follower(now_ms, local, known);
        self.role = Some(Role::Follower(Box::new(f)));
    }

    fn dispatch_takeover(&mut self, cmds: Vec<TakeoverCommand>, now_ms: u64, out: &mut Out) {
        let mut queue: VecDeque<TakeoverCommand> = cmds.into();
        while let Some(c) = queue.pop_front() {
            if !matches!(self.role, Some(Role::TakingOver(_))) {
                return;
            }
            if !matches!(c, TakeoverCommand::BecomeMaster(_)) {
                self.note(out, || format!("takeover: {c:?}"));
            }
            match c {
                TakeoverCommand::PersistEpochCounter { counter, .. } => {
                    self.persisting = Some(counter);
                    out.later.push(Later::CounterPersisted {
                        broker: self.index,
                        boot: self.boot,
                        counter,
                    });
                }
                TakeoverCommand::SendFence { slot, epoch } => {
                    out.seen.push(Seen::Fencing {
                        broker: self.index,
                        boot: self.boot,
                        epoch,
                    });
                    if self.slot_up[slot.index()] {
                        let expected = self
                            .cluster
                            .expected_identity(slot)
                            .map(|id| (id.store_id, id.incarnation));
                        let to = self.slot_node(slot);
                        out.request(
                            to,
                            Msg::Fence {
                                req: FenceRequest { epoch, expected },
                            },
                        );
                    }
                }
                TakeoverCommand::Fetch {
                    slot,
                    epoch,
                    from,
                    through,
                } => {
                    if self.slot_up[slot.index()] {
                        let to = self.slot_node(slot);
                        out.request(
                            to,
                            Msg::Read {
                                purpose: ReadPurpose::TakeoverFetch { epoch },
                                from,
                                max_events: through.0 - from.0 + 1,
                            },
                        );
                    } else if let Some(Role::TakingOver(t)) = self.role.as_mut() {
                        let mut more = Vec::new();
                        t.core.handle(
                            TakeoverInput::FetchFailed {
                                slot,
                                epoch,
                                promised: None,
                            },
                            &mut more,
                        );
                        queue.extend(more);
                    }
                }
                TakeoverCommand::BecomeMaster(adopted) => {
                    self.become_master(adopted, now_ms, out);
                    return;
                }
                TakeoverCommand::StepBack { rival } => {
                    self.see(rival);
                    self.abandon_takeover(now_ms, "a rival has a higher epoch", out);
                    return;
                }
                TakeoverCommand::Aborted { reason, .. } => {
                    self.abandon_takeover(now_ms, &format!("aborted: {reason:?}"), out);
                    return;
                }
            }
        }
    }

    fn on_fence_answer(&mut self, slot: SlotId, msg: Msg, now_ms: u64, out: &mut Out) {
        let Some(Role::TakingOver(t)) = self.role.as_mut() else {
            return;
        };
        let current = t.core.epoch();
        self.note(out, || {
            format!("fence answer from slot {}: {msg:?}", slot.0)
        });
        let input = match msg {
            Msg::FenceGranted(g) if g.epoch == current => TakeoverInput::FenceGranted {
                slot,
                epoch: g.epoch,
                identity: StoreIdentity {
                    store_id: g.store_id,
                    incarnation: g.incarnation,
                },
                last: g.last,
                tail_cut: g.tail_cut,
            },
            Msg::FenceRefused { epoch, promised } if epoch == current => {
                self.highest_seen = self.highest_seen.max(promised);
                TakeoverInput::FenceRefused {
                    slot,
                    epoch,
                    promised,
                    reason: FenceRefusal::Promised,
                }
            }
            Msg::NotVoter { epoch, .. } if epoch == current => TakeoverInput::FenceRefused {
                slot,
                epoch,
                promised: Epoch::ZERO,
                reason: FenceRefusal::NotVoter,
            },
            _ => return,
        };
        let Some(Role::TakingOver(t)) = self.role.as_mut() else {
            return;
        };
        let mut cmds = Vec::new();
        t.core.handle(input, &mut cmds);
        self.dispatch_takeover(cmds, now_ms, out);
    }

    fn on_read_result(
        &mut self,
        slot: SlotId,
        purpose: ReadPurpose,
        first: Offset,
        events: Option<Vec<quire_proto::Event>>,
        now_ms: u64,
        out: &mut Out,
    ) {
        match purpose {
            ReadPurpose::TakeoverFetch { epoch, .. } => {
                let local_ms = self.local_ms(now_ms);
                let Some(Role::TakingOver(t)) = self.role.as_mut() else {
                    return;
                };
                let input = match events {
                    Some(events) => {
                        // As the actor does: a fetch that brings events of this attempt is
                        // progress, and the deadline bounds a stall, not the log's length.
                        if epoch == t.core.epoch() && !events.is_empty() {
                            t.deadline_ms = local_ms + self.params.takeover_timeout_ms;
                        }
                        TakeoverInput::Fetched {
                            slot,
                            epoch,
                            events: events.into_iter().map(from_proto_event).collect(),
                        }
                    }
                    None => TakeoverInput::FetchFailed {
                        slot,
                        epoch,
                        promised: None,
                    },
                };
                let mut cmds = Vec::new();
                t.core.handle(input, &mut cmds);
                self.dispatch_takeover(cmds, now_ms, out);
            }
            ReadPurpose::ForAppend(cmd) => {
                let same_master = self.master_epoch() == Some(cmd.epoch);
                let Some(mut events) = events.filter(|_| same_master) else {
                    return;
                };
                // The read must hold exactly the offsets the append carries.
                let whole = events.len() as u64 >= cmd.count
                    && events
                        .iter()
                        .enumerate()
                        .all(|(i, e)| e.offset.0 == first.0 + i as u64)
                    && first == cmd.first;
                if !whole {
                    return;
                }
                events.truncate(usize::try_from(cmd.count).unwrap_or(usize::MAX));
                self.send_append(&cmd, events, out);
            }
        }
    }

    // ---------------------------------------------------------------- master

    fn become_master(&mut self, adopted: AdoptedLog, now_ms: u64, out: &mut Out) {
        let Some(Role::TakingOver(t)) = self.role.take() else {
            return;
        };
        let epoch = adopted.epoch;
        self.see(epoch);
        let voters: Vec<Voter> = (0..self.params.stores)
            .filter_map(|i| {
                let slot = SlotId(u16::try_from(i).ok()?);
                let id = self.cluster.expected_identity(slot)?;
                Some(Voter {
                    store_index: slot.0,
                    store_id: id.store_id,
                    incarnation: id.incarnation,
                })
            })
            .collect();
        let payload = EventBody::EpochStart(EpochStartEvent {
            epoch,
            broker: self.id,
            voters,
        })
        .to_payload()
        .expect("invariant: an epoch-start body with a few voters encodes");
        let fallback = LocalLog {
            log: adopted.log.clone(),
            applied: adopted.applied,
        };
        let mut cmds = Vec::new();
        let config = MasterConfig {
            cluster: self.cluster.clone(),
            limits: self.params.limits,
        };
        match MasterCore::new(config, adopted, payload, &mut cmds) {
            Ok(mut core) => {
                for i in 0..self.slot_up.len() {
                    if !self.slot_up[i] {
                        let slot = SlotId(u16::try_from(i).expect("few slots"));
                        core.handle(MasterInput::SlotDisconnected { slot }, &mut cmds);
                    }
                }
                out.seen.push(Seen::BecameMaster {
                    broker: self.index,
                    epoch,
                });
                self.role = Some(Role::Master(Box::new(MasterRun {
                    core,
                    serving: false,
                    writes: Writes::new(self.write_limits()),
                })));
                self.dispatch_master(cmds, now_ms, out);
            }
            Err(e) => {
                out.seen.push(Seen::Note(format!(
                    "B{} cannot lead the adopted log: {e}",
                    self.index + 1
                )));
                let f = self.new_follower(now_ms, fallback, t.known_epoch);
                self.role = Some(Role::Follower(Box::new(f)));
            }
        }
    }

    fn on_append_answer(&mut self, slot: SlotId, msg: Msg, now_ms: u64, out: &mut Out) {
        let is_store = self.is_store(slot);
        let Some(Role::Master(m)) = self.role.as_mut() else {
            if let Msg::Rejected { rejected, .. } = &msg {
                let p = rejected.promised;
                self.see(p);
            }
            return;
        };
        let epoch = m.core.epoch();
        let input = match msg {
            Msg::Persisted { meta, ack } if is_store && meta.epoch == epoch => {
                MasterInput::Persisted {
                    slot,
                    append: meta.append,
                    epoch: ack.epoch,
                    through: ack.through_offset,
                    identity: StoreIdentity {
                        store_id: ack.store_id,
                        incarnation: ack.incarnation,
                    },
                    voter: ack.voter,
                }
            }
            Msg::SlaveHas { meta, epoch: seen } if !is_store && meta.epoch == epoch => {
                if seen > epoch {
                    MasterInput::RivalSeen { epoch: seen }
                } else {
                    MasterInput::SlaveHas {
                        slot,
                        append: meta.append,
                        epoch: meta.epoch,
                        through: meta.through,
                    }
                }
            }
            Msg::Rejected { meta, rejected } if meta.epoch == epoch => {
                self.highest_seen = self.highest_seen.max(rejected.promised);
                MasterInput::Rejected {
                    slot,
                    append: meta.append,
                    promised: rejected.promised,
                    last: rejected.last,
                    reason: core_reason(rejected.reason),
                }
            }
            _ => return,
        };
        let Some(Role::Master(m)) = self.role.as_mut() else {
            return;
        };
        let mut cmds = Vec::new();
        m.core.handle(input, &mut cmds);
        self.dispatch_master(cmds, now_ms, out);
    }

    fn dispatch_master(&mut self, cmds: Vec<MasterCommand>, now_ms: u64, out: &mut Out) {
        for c in cmds {
            if !matches!(self.role, Some(Role::Master(_))) {
                return;
            }
            match c {
                MasterCommand::Append(cmd) => match &cmd.events {
                    AppendEvents::InMemory(events) => {
                        let events = events.iter().map(to_proto_event).collect();
                        self.send_append(&cmd, events, out);
                    }
                    AppendEvents::FromStore { source } => {
                        if self.slot_up[source.index()] && self.slot_up[cmd.slot.index()] {
                            let to = self.slot_node(*source);
                            out.request(
                                to,
                                Msg::Read {
                                    purpose: ReadPurpose::ForAppend(Box::new(cmd.clone())),
                                    from: cmd.first,
                                    max_events: cmd.count,
                                },
                            );
                        }
                    }
                },
                MasterCommand::Stabilized { through, events } => {
                    self.on_stabilized(through, events, now_ms, out);
                }
                MasterCommand::StepDown { promised } => self.step_down(promised, now_ms, out),
                // The simulation leaves the check-quorum rule off, so this never comes; if
                // it did, the broker would follow as after a step-down (as its actor does).
                MasterCommand::QuorumLost { .. } => {
                    if let Some(own) = self.master_epoch() {
                        self.step_down(own, now_ms, out);
                    }
                }
            }
        }
    }

    fn send_append(&mut self, cmd: &AppendCommand, events: Vec<quire_proto::Event>, out: &mut Out) {
        if !self.slot_up[cmd.slot.index()] {
            return;
        }
        let meta = AppendMeta {
            append: cmd.append,
            epoch: cmd.epoch,
            through: cmd.through(),
        };
        let req = AppendRequest {
            epoch: cmd.epoch,
            prev: cmd.prev,
            events,
            hwm: cmd.hwm,
        };
        let to = self.slot_node(cmd.slot);
        out.request(to, Msg::Append { meta, req });
    }

    fn on_stabilized(&mut self, through: Offset, events: Vec<Event>, now_ms: u64, out: &mut Out) {
        self.apply_events(&events);
        let index = self.index;
        let boot = self.boot;
        let Some(Role::Master(m)) = self.role.as_mut() else {
            return;
        };
        out.seen.push(Seen::Stabilized {
            broker: index,
            boot,
            epoch: m.core.epoch(),
            events,
        });
        let mut cmds = Vec::new();
        m.writes.on_stabilized(through, &mut cmds);
        if !m.serving && m.core.hwm() >= Some(m.core.epoch_start()) {
            m.serving = true;
            out.seen.push(Seen::Note(format!(
                "B{} serves as master of epoch {:#x}",
                index + 1,
                m.core.epoch().0
            )));
        }
        self.execute_writes(cmds, out);
        self.retry_blocked(now_ms, out);
    }

    fn step_down(&mut self, promised: Epoch, now_ms: u64, out: &mut Out) {
        let Some(Role::Master(m)) = self.role.take() else {
            return;
        };
        self.see(promised);
        out.seen.push(Seen::Note(format!(
            "B{} (epoch {:#x}) steps down: fenced by {:#x}",
            self.index + 1,
            m.core.epoch().0,
            promised.0
        )));
        let MasterRun { core, writes, .. } = *m;
        let local = core.into_local_log();
        let f = self.new_follower(now_ms, local, promised);
        self.role = Some(Role::Follower(Box::new(f)));
        let mut cmds = Vec::new();
        writes.fail_all(None, &mut cmds);
        self.execute_writes(cmds, out);
    }

    /// Where this broker believes the master is.
    fn hint(&self) -> Option<u8> {
        match &self.role {
            Some(Role::Master(_)) => Some(self.index),
            Some(Role::Follower(f)) if f.master_epoch() != Epoch::ZERO => {
                let b = f.master_epoch().broker().0;
                u8::try_from(b.checked_sub(1)?).ok()
            }
            _ => None,
        }
    }

    // ---------------------------------------------------------------- produce

    fn on_produce(
        &mut self,
        requester: Requester,
        req: ProduceRequest,
        now_ms: u64,
        out: &mut Out,
    ) {
        let hint = self.hint();
        let Some(Role::Master(m)) = self.role.as_mut() else {
            out.answer(
                requester.client,
                requester.boot,
                Msg::ProduceFailed {
                    request: requester.request,
                    error: ProduceError::NotMaster { hint },
                },
            );
            return;
        };
        let token = RequestToken(self.next_token);
        self.next_token += 1;
        self.held_writes.insert(token, requester);
        let gate = if m.serving { Gate::Open } else { Gate::Held };
        let mut cmds = Vec::new();
        let request = WriteRequest::Produce(req);
        let arrival = Arrival::new(token, request, now_ms);
        m.writes
            .on_request(&mut m.core, &self.state, gate, arrival, &mut cmds);
        self.execute_writes(cmds, out);
        self.flush(now_ms, out);
    }

    fn retry_blocked(&mut self, now_ms: u64, out: &mut Out) {
        let Some(Role::Master(m)) = self.role.as_mut() else {
            return;
        };
        let gate = if m.serving { Gate::Open } else { Gate::Held };
        let mut cmds = Vec::new();
        m.writes
            .retry_blocked(&mut m.core, &self.state, gate, &mut cmds);
        self.execute_writes(cmds, out);
        self.flush(now_ms, out);
    }

    fn flush(&mut self, now_ms: u64, out: &mut Out) {
        let Some(Role::Master(m)) = self.role.as_mut() else {
            return;
        };
        if !m.writes.take_needs_flush() {
            return;
        }
        let mut cmds = Vec::new();
        m.core.flush(&mut cmds);
        self.dispatch_master(cmds, now_ms, out);
    }

    /// The write path's bounds: the broker's, with the simulation's timeout and a smaller
    /// queue of blocked requests.
    fn write_limits(&self) -> WriteLimits {
        WriteLimits {
            message_bytes_max: quire_proto::MESSAGE_BYTES_MAX,
            inflight_bytes_max: self.params.limits.inflight_bytes_max,
            produce_timeout_ms: self.params.produce_timeout_ms,
            blocked_requests_max: BLOCKED_REQUESTS_MAX,
        }
    }

    /// Sends the write path's answers to the simulated clients.
    fn execute_writes(&mut self, cmds: Vec<WriteCommand>, out: &mut Out) {
        for c in cmds {
            let WriteCommand::Answer { token, reply, .. } = c else {
                continue;
            };
            let Some(r) = self.held_writes.remove(&token) else {
                continue;
            };
            let msg = match reply {
                Reply::Produced { base_offset, .. } => Msg::ProduceOk {
                    request: r.request,
                    base_offset,
                },
                Reply::CursorCommitted => continue,
                Reply::NotMaster => Msg::ProduceFailed {
                    request: r.request,
                    error: ProduceError::NotMaster { hint: self.hint() },
                },
                Reply::Error(e) => Msg::ProduceFailed {
                    request: r.request,
                    error: match e.code {
                        ErrorCode::Overloaded => ProduceError::Overloaded,
                        ErrorCode::SequenceGap => ProduceError::SequenceGap,
                        ErrorCode::Timeout | ErrorCode::NoQuorum => ProduceError::Timeout,
                        other => panic!("a simulated produce got {other:?}: {}", e.message),
                    },
                },
            };
            out.answer(r.client, r.boot, msg);
        }
    }

    fn expire_writes(&mut self, now_ms: u64, out: &mut Out) {
        let Some(Role::Master(m)) = self.role.as_mut() else {
            return;
        };
        // The simulated master does not count reachable voters: an expired write times out.
        let q = m.core.cluster().ack_quorum;
        let mut cmds = Vec::new();
        m.writes.expire(now_ms, q, q, &mut cmds);
        self.execute_writes(cmds, out);
    }
}

/// The id a broker core gives no append: the simulated network never needs one.
#[allow(dead_code)]
const _: AppendId = AppendId(0);
