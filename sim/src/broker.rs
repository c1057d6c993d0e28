//! A simulated broker: a thin driver of the broker's own [`Engine`] (`quire_broker::engine`,
//! the code the broker's tokio actor drives), with the network, the clock and the
//! epoch-counter file simulated.
//!
//! Every decision is the engine's: the roles and their changes (an election timeout starts
//! a takeover; `BecomeMaster` starts a master with an epoch-start event naming the voters; a
//! higher epoch in any answer or a rival's append turns a master or a takeover back into a
//! slave; the check-quorum rule), the master's write path (dedup against the
//! idempotent-producer table, answers once a batch is stabilized, expiry). What stays here
//! is the world around it: which process a slot is, turning simulated messages into engine
//! inputs and engine commands into messages, the broker's skewed clock, and its two durable
//! files, the epoch counter and the cluster file (a write in flight at a crash survives
//! whole or not at all). Every broker starts as a slave; by default its cluster file binds
//! every voter's identity (the run starts after the cluster's bootstrap), with
//! `--bootstrap` it is empty and the engine's bootstrap path binds them. A restart forgets
//! everything but the epoch counter and the cluster file.

use std::collections::BTreeMap;

use quire_broker::core::{ClusterConfig, ReplicationLimits, SlotId, SlotKind, StoreIdentity};
use quire_broker::engine::{
    Command, Engine, EngineConfig, FenceAnswer, FetchReply, HandoffFailure, InboundAnswer,
    Mutations, Reply, RequestToken, SlotAnswer, TailAnswer, WriteCommand, WriteLimits,
    WriteRequest,
};
use quire_broker::retention::RetentionPolicy;
use quire_proto::{
    AppendRequest, BrokerId, CommitCursorRequest, Epoch, ErrorCode, ErrorResponse, FenceRequest,
    Offset, ProduceRequest, ReadResponse, VoterChangeRequest,
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
    /// The heartbeat tick of the world (the check-quorum window is counted in ticks).
    pub(crate) heartbeat_ms: u64,
    pub(crate) fetch_events_max: u32,
    pub(crate) takeover_timeout_ms: u64,
    pub(crate) produce_timeout_ms: u64,
    pub(crate) follower_retained_bytes_max: u64,
    /// Retention: off in half the seeds, else a payload-byte bound drawn from the seed.
    pub(crate) retention: RetentionPolicy,
    /// Longest slice of a checkpoint one Trim event carries, in bytes (small in half the
    /// seeds, so checkpoints are written in parts under faults).
    pub(crate) checkpoint_part_bytes: usize,
    /// The store identities bound in every broker's cluster file at the start (`None`
    /// each with `--bootstrap`: the first master binds them).
    pub(crate) identities: Vec<Option<StoreIdentity>>,
    /// Test-only: the broker engine's planted bugs.
    pub(crate) mutations: Mutations,
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
    /// A cursor commit (else a produce): which answer the client expects.
    cursor: bool,
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
    /// The cluster file: the store identities bound, by store index.
    cluster_file: Vec<Option<StoreIdentity>>,
    /// A cluster-file write in flight.
    persisting_identities: Option<Vec<Option<StoreIdentity>>>,
    /// The engine while the process runs.
    engine: Option<Engine>,
    slot_count: usize,
    /// One past the last stabilized event applied (a broker whose log starts at a
    /// checkpoint skips ahead; it never goes back).
    applied_next: Offset,
    seed: u64,
    clock_offset_ms: u64,
    clock_rate_ppm: u64,
    /// Times a mutation changed what this broker did.
    pub(crate) mutated: u64,
    /// Write requests the engine holds, by token.
    held_writes: BTreeMap<RequestToken, Requester>,
    /// Fetches the engine holds (long polls, store reads), by token.
    held_fetches: BTreeMap<RequestToken, Requester>,
    next_token: u64,
}

impl SimBroker {
    /// A broker, stopped; [`SimBroker::start`] starts it.
    pub(crate) fn new(index: u8, params: BrokerParams, rng: &mut SimRng) -> SimBroker {
        let id = BrokerId(u16::from(index) + 1);
        let slot_count = params.stores + params.brokers - 1;
        SimBroker {
            index,
            id,
            up: false,
            boot: 0,
            durable_counter: 0,
            persisting: None,
            cluster_file: params.identities.clone(),
            persisting_identities: None,
            engine: None,
            slot_count,
            applied_next: Offset::ZERO,
            params,
            seed: rng.next_u64(),
            clock_offset_ms: rng.range(0, 10_000),
            clock_rate_ppm: rng.range(950_000, 1_050_000),
            mutated: 0,
            held_writes: BTreeMap::new(),
            held_fetches: BTreeMap::new(),
            next_token: 0,
        }
    }

    /// The engine's configuration for a start of this broker.
    fn engine_config(&self) -> EngineConfig {
        let mut slots = SlotKind::stores_from_bound(&self.cluster_file);
        for b in 0..self.params.brokers {
            let b = u8::try_from(b).expect("invariant: few brokers");
            if b != self.index {
                slots.push(SlotKind::Slave {
                    broker: BrokerId(u16::from(b) + 1),
                });
            }
        }
        let p = &self.params;
        EngineConfig {
            me: self.id,
            brokers: (0..p.brokers)
                .map(|b| BrokerId(u16::try_from(b).expect("invariant: few brokers") + 1))
                .collect(),
            cluster: ClusterConfig::with_majorities(slots),
            election_timeout_ms: p.election_timeout_ms_min,
            heartbeat_ms: p.heartbeat_ms,
            takeover_timeout_ms: p.takeover_timeout_ms,
            check_quorum: true,
            write_limits: WriteLimits {
                message_bytes_max: quire_proto::MESSAGE_BYTES_MAX,
                inflight_bytes_max: p.limits.inflight_bytes_max,
                produce_timeout_ms: p.produce_timeout_ms,
                blocked_requests_max: BLOCKED_REQUESTS_MAX,
                topics_max: quire_broker::state::TOPICS_MAX,
                cursors_max: quire_broker::state::CURSORS_MAX,
            },
            limits: p.limits,
            takeover_fetch_events_max: p.fetch_events_max,
            follower_retained_bytes_max: p.follower_retained_bytes_max,
            seed: self.seed ^ u64::from(self.boot),
            retention: p.retention,
            recent_bytes_max: quire_broker::engine::recent::RECENT_BYTES_MAX_DEFAULT,
            checkpoint_part_bytes: p.checkpoint_part_bytes,
            mutations: p.mutations,
        }
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
        (i < self.slot_count).then(|| SlotId(u16::try_from(i).expect("few slots")))
    }

    /// Number of slots.
    pub(crate) fn slot_count(&self) -> usize {
        self.slot_count
    }

    /// This broker's clock, from the world's.
    pub(crate) fn local_ms(&self, now_ms: u64) -> u64 {
        self.clock_offset_ms + now_ms * self.clock_rate_ppm / 1_000_000
    }

    /// Whether this broker is master and serving producers.
    pub(crate) fn is_serving_master(&self) -> bool {
        self.engine.as_ref().is_some_and(Engine::is_serving)
    }

    /// The epoch of the entry at `offset` of this broker's log if it is master of `epoch`.
    pub(crate) fn master_epoch_at(&self, epoch: Epoch, offset: Offset) -> Option<Option<Epoch>> {
        let core = self.engine.as_ref()?.master_core()?;
        // Below where the master's log started (at a checkpoint) its epochs are a bound.
        (core.epoch() == epoch && offset >= core.log().exact_from())
            .then(|| core.log().epoch_at(offset))
    }

    /// The master epoch if this broker is master.
    pub(crate) fn master_epoch(&self) -> Option<Epoch> {
        self.engine.as_ref()?.master_epoch()
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
        self.applied_next = Offset::ZERO;
        self.held_writes.clear();
        self.held_fetches.clear();
        let local = self.local_ms(now_ms);
        let mut engine = Engine::new(self.engine_config(), self.durable_counter, local);
        for (i, up) in slot_up.into_iter().enumerate() {
            if up {
                engine.link(slot_id(i), true, local);
            }
        }
        self.engine = Some(engine);
        out.seen.push(Seen::Note(format!(
            "B{} started (epoch counter {})",
            self.index + 1,
            self.durable_counter
        )));
        self.run_commands(now_ms, out);
    }

    /// The process dies. A counter write in flight may or may not have reached the disk.
    pub(crate) fn crash(&mut self, rng: &mut SimRng) {
        if let Some(c) = self.persisting.take() {
            if rng.chance(0.5) {
                self.durable_counter = self.durable_counter.max(c);
            }
        }
        if let Some(ids) = self.persisting_identities.take() {
            // Written to a temporary file and renamed: all of it or nothing.
            if rng.chance(0.5) {
                self.cluster_file = ids;
            }
        }
        self.up = false;
        if let Some(e) = self.engine.take() {
            self.mutated += e.mutated_steps();
        }
    }

    /// Steps a mutation changed in this broker, over all its runs.
    pub(crate) fn mutated_total(&self) -> u64 {
        self.mutated + self.engine.as_ref().map_or(0, Engine::mutated_steps)
    }

    // ---------------------------------------------------------------- inputs

    /// Runs `f` on the engine (if the process runs) at the broker's local time, then
    /// carries out what it asked.
    fn drive(&mut self, now_ms: u64, out: &mut Out, f: impl FnOnce(&mut Engine, u64)) {
        let local = self.local_ms(now_ms);
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        f(engine, local);
        engine.flush(local);
        self.run_commands(now_ms, out);
    }

    /// The heartbeat timer fired.
    pub(crate) fn on_tick(&mut self, now_ms: u64, out: &mut Out) {
        self.drive(now_ms, out, |e, t| e.tick(t));
    }

    /// The connection to `slot` came up or went down.
    pub(crate) fn on_link(&mut self, slot: SlotId, up: bool, now_ms: u64, out: &mut Out) {
        if slot.index() >= self.slot_count {
            return;
        }
        self.drive(now_ms, out, |e, t| {
            if e.slot_up(slot) != up {
                e.link(slot, up, t);
            }
        });
    }

    /// An operator asks this broker to hand mastership to broker `to` (index) gracefully
    /// (the real `HandoffRequest`; the answer is [`Seen::HandoffDone`]).
    pub(crate) fn request_handoff(&mut self, to: u8, now_ms: u64, out: &mut Out) {
        let token = RequestToken(self.next_token);
        self.next_token += 1;
        let to = BrokerId(u16::from(to) + 1);
        self.drive(now_ms, out, |e, t| e.handoff_request(token, to, t));
    }

    /// The operator asks this broker for a voter-set change (answered, if at all, to
    /// nobody: the operator reads the master's voter set instead, [`SimBroker::voter_at`]).
    pub(crate) fn request_voter_change(
        &mut self,
        change: VoterChangeRequest,
        now_ms: u64,
        out: &mut Out,
    ) {
        let token = RequestToken(self.next_token);
        self.next_token += 1;
        self.drive(now_ms, out, |e, t| {
            e.change_voters(token, change, t, t);
        });
    }

    /// If master: the identity store slot `s` votes with in its voter set (`None`: not a
    /// voter), and whether a change is not stabilized yet.
    pub(crate) fn voter_at(&self, s: u8) -> Option<(Option<StoreIdentity>, bool)> {
        let core = self.engine.as_ref()?.master_core()?;
        Some((
            core.cluster().expected_identity(SlotId(u16::from(s))),
            core.pending_config().is_some(),
        ))
    }

    /// The epoch counter write for `counter` completed.
    pub(crate) fn on_counter_persisted(&mut self, counter: u64, now_ms: u64, out: &mut Out) {
        if self.persisting == Some(counter) {
            self.persisting = None;
        }
        self.durable_counter = self.durable_counter.max(counter);
        self.drive(now_ms, out, |e, t| e.epoch_persisted(counter, true, t));
    }

    /// The cluster-file write of `identities` completed.
    pub(crate) fn on_identities_persisted(
        &mut self,
        identities: Vec<Option<StoreIdentity>>,
        bootstrap_epoch: Option<Epoch>,
        now_ms: u64,
        out: &mut Out,
    ) {
        if self.persisting_identities.as_ref() == Some(&identities) {
            self.persisting_identities = None;
        }
        self.cluster_file = identities;
        self.drive(now_ms, out, |e, t| {
            e.identities_persisted(bootstrap_epoch, true, t);
        });
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
        let slot = self.node_slot(from);
        match msg {
            Msg::Append { meta, req } => {
                let mut answer = InboundAnswer::NotFollowing;
                self.drive(now_ms, out, |e, t| {
                    answer = e.inbound_append(meta.append, req, t);
                });
                let msg = match answer {
                    InboundAnswer::Has { epoch, .. } => Msg::SlaveHas { meta, epoch },
                    InboundAnswer::Rejected(rejected) => Msg::Rejected { meta, rejected },
                    InboundAnswer::NotFollowing => Msg::AppendError { meta },
                };
                out.answer(from, from_boot, msg);
            }
            Msg::Persisted { meta, ack } => {
                let answer = SlotAnswer::Persisted {
                    epoch: ack.epoch,
                    through: ack.through_offset,
                    identity: StoreIdentity {
                        store_id: ack.store_id,
                        incarnation: ack.incarnation,
                    },
                    voter: ack.voter,
                };
                self.append_answer(slot, meta, answer, now_ms, out);
            }
            Msg::SlaveHas { meta, epoch } => {
                self.append_answer(slot, meta, SlotAnswer::SlaveHas { epoch }, now_ms, out);
            }
            Msg::Rejected { meta, rejected } => {
                self.append_answer(slot, meta, SlotAnswer::Rejected(rejected), now_ms, out);
            }
            Msg::AppendError { .. } => {}
            Msg::TailAnswer {
                generation,
                last,
                voter,
            } => {
                if let Some(slot) = slot {
                    self.drive(now_ms, out, |e, t| {
                        e.tail_answer(slot, generation, Ok(TailAnswer { last, voter }), t);
                    });
                }
            }
            Msg::FenceGranted(g) => {
                let epoch = g.epoch;
                self.fence_answer(slot, epoch, FenceAnswer::Granted(g), now_ms, out);
            }
            Msg::FenceRefused { epoch, promised } => {
                self.fence_answer(slot, epoch, FenceAnswer::Refused { promised }, now_ms, out);
            }
            Msg::NotVoter { epoch, .. } => {
                self.fence_answer(slot, epoch, FenceAnswer::NotVoter, now_ms, out);
            }
            Msg::ReadResult {
                purpose,
                from: first,
                read,
            } => {
                if let Some(slot) = slot {
                    self.on_read_result(slot, purpose, first, read, now_ms, out);
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
                    cursor: false,
                };
                let req = ProduceRequest {
                    format: quire_proto::MessageFormat::Raw,
                    topic,
                    producer_id,
                    sequence,
                    messages,
                };
                self.on_write(requester, WriteRequest::Produce(req), now_ms, out);
            }
            Msg::CommitCursor {
                request,
                topic,
                cursor,
                offset,
            } => {
                let requester = Requester {
                    client: from,
                    boot: from_boot,
                    request,
                    cursor: true,
                };
                let req = CommitCursorRequest {
                    topic,
                    cursor,
                    offset,
                };
                self.on_write(requester, WriteRequest::CommitCursor(req), now_ms, out);
            }
            Msg::ReadCursor {
                request,
                topic,
                cursor,
            } => {
                let offset = self
                    .engine
                    .as_ref()
                    .and_then(|e| e.read_cursor(&topic, &cursor));
                out.answer(from, from_boot, Msg::CursorValue { request, offset });
            }
            Msg::Fetch { request, req } => {
                if let Some(e) = self.engine.as_ref().filter(|_| self.params.verbose) {
                    let st = e.state();
                    let line = format!(
                        "fetch of {} from {}: trim point {}, indexed from there {:?}",
                        req.topic,
                        req.from_offset,
                        st.trim_point(),
                        st.topic_offsets(&req.topic, req.from_offset, 4)
                    );
                    self.note(out, || line);
                }
                let token = self.token();
                self.held_fetches.insert(
                    token,
                    Requester {
                        client: from,
                        boot: from_boot,
                        request,
                        cursor: false,
                    },
                );
                let local = self.local_ms(now_ms);
                self.drive(now_ms, out, |e, t| e.fetch(token, req, local, t));
            }
            Msg::TakeOverNow { from_epoch } => {
                let mut taking_over = false;
                self.drive(now_ms, out, |e, t| {
                    taking_over = e.take_over_now(from_epoch, t);
                });
                let answer = Msg::TakeOverAnswer {
                    from_epoch,
                    taking_over,
                };
                out.answer(from, from_boot, answer);
            }
            Msg::TakeOverAnswer {
                from_epoch,
                taking_over,
            } => {
                let outcome = if taking_over {
                    Ok(())
                } else {
                    Err(HandoffFailure::TargetRefused(ErrorResponse::new(
                        ErrorCode::NotMaster,
                        "the target does not follow this master",
                    )))
                };
                self.drive(now_ms, out, |e, t| {
                    e.take_over_answer(from_epoch, outcome, t)
                });
            }
            Msg::Fence { .. }
            | Msg::Tail { .. }
            | Msg::Read { .. }
            | Msg::ProduceOk { .. }
            | Msg::ProduceFailed { .. }
            | Msg::CursorCommitted { .. }
            | Msg::CursorValue { .. }
            | Msg::Fetched { .. } => {}
        }
    }

    fn append_answer(
        &mut self,
        slot: Option<SlotId>,
        meta: AppendMeta,
        answer: SlotAnswer,
        now_ms: u64,
        out: &mut Out,
    ) {
        let Some(slot) = slot else {
            return;
        };
        self.drive(now_ms, out, |e, t| {
            e.append_answer(slot, meta.append, meta.epoch, meta.through, answer, t);
        });
    }

    fn fence_answer(
        &mut self,
        slot: Option<SlotId>,
        epoch: Epoch,
        answer: FenceAnswer,
        now_ms: u64,
        out: &mut Out,
    ) {
        let Some(slot) = slot else {
            return;
        };
        self.note(out, || {
            format!("fence answer from slot {}: {answer:?}", slot.0)
        });
        self.drive(now_ms, out, |e, t| e.fence_answer(slot, epoch, answer, t));
    }

    fn on_read_result(
        &mut self,
        slot: SlotId,
        purpose: ReadPurpose,
        first: Offset,
        read: Option<ReadResponse>,
        now_ms: u64,
        out: &mut Out,
    ) {
        // As the store client: an empty answer whose log starts past `first` is `Trimmed`.
        let trimmed = read
            .as_ref()
            .filter(|r| r.events.is_empty() && r.first_offset > first)
            .map(|r| r.first_offset);
        match purpose {
            ReadPurpose::TakeoverFetch { epoch } => {
                if let Some(first_offset) = trimmed {
                    self.drive(now_ms, out, |e, t| {
                        e.takeover_read_trimmed(slot, epoch, first_offset, t);
                    });
                    return;
                }
                let events = read.map(|r| r.events).ok_or(());
                self.drive(now_ms, out, |e, t| e.takeover_read(slot, epoch, events, t));
            }
            ReadPurpose::ForAppend(cmd) => {
                if let Some(first_offset) = trimmed {
                    // As the actor: the engine sends a slave the log from a checkpoint.
                    self.drive(now_ms, out, |e, t| e.read_trimmed(&cmd, first_offset, t));
                    return;
                }
                let Some(mut events) = read
                    .map(|r| r.events)
                    .filter(|_| self.master_epoch() == Some(cmd.epoch))
                else {
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
            ReadPurpose::ForFetch { token, read: fetch } => {
                let reply = match read {
                    Some(r) => fetch.answer(r.first_offset, &r.events),
                    None => FetchReply::Unavailable,
                };
                self.answer_fetch(token, reply, out);
            }
        }
    }

    /// A fresh request token.
    fn token(&mut self) -> RequestToken {
        let token = RequestToken(self.next_token);
        self.next_token += 1;
        token
    }

    /// Sends the answer to the fetch `token` to its consumer.
    fn answer_fetch(&mut self, token: RequestToken, reply: FetchReply, out: &mut Out) {
        if let Some(r) = self.held_fetches.remove(&token) {
            let msg = Msg::Fetched {
                request: r.request,
                reply,
            };
            out.answer(r.client, r.boot, msg);
        }
    }

    fn on_write(&mut self, requester: Requester, req: WriteRequest, now_ms: u64, out: &mut Out) {
        let token = self.token();
        // Known before the engine sees the request: it may answer at once (dedup, a bound).
        self.held_writes.insert(token, requester);
        let mut accepted = false;
        let local = self.local_ms(now_ms);
        self.drive(now_ms, out, |e, t| {
            accepted = e.write(token, req, local, t);
        });
        if !accepted {
            self.held_writes.remove(&token);
            let msg = self.failed(requester, ProduceError::NotMaster { hint: None }, now_ms);
            out.answer(requester.client, requester.boot, msg);
        }
    }

    /// The failure answer to `r`'s write: a cursor commit's, or a produce's `error` (a
    /// `NotMaster` gets this broker's hint).
    fn failed(&self, r: Requester, error: ProduceError, now_ms: u64) -> Msg {
        if r.cursor {
            return Msg::CursorCommitted {
                request: r.request,
                ok: false,
            };
        }
        let error = match error {
            ProduceError::NotMaster { .. } => ProduceError::NotMaster {
                hint: self.hint(now_ms),
            },
            other => other,
        };
        Msg::ProduceFailed {
            request: r.request,
            error,
        }
    }

    // ---------------------------------------------------------------- commands

    /// A trace line, built only when the run keeps a trace.
    fn note(&self, out: &mut Out, line: impl FnOnce() -> String) {
        if self.params.verbose {
            out.seen
                .push(Seen::Note(format!("B{} {}", self.index + 1, line())));
        }
    }

    /// Carries out the engine's commands until it queues no more.
    fn run_commands(&mut self, now_ms: u64, out: &mut Out) {
        loop {
            let Some(engine) = self.engine.as_mut() else {
                return;
            };
            let commands = engine.take_commands();
            if commands.is_empty() {
                return;
            }
            for c in commands {
                self.run_command(c, now_ms, out);
            }
        }
    }

    fn run_command(&mut self, c: Command, now_ms: u64, out: &mut Out) {
        let local = self.local_ms(now_ms);
        match c {
            Command::PersistEpochCounter { counter } => {
                self.note(out, || format!("persists epoch counter {counter}"));
                self.persisting = Some(counter);
                out.later.push(Later::CounterPersisted {
                    broker: self.index,
                    boot: self.boot,
                    counter,
                });
            }
            Command::PersistIdentities {
                identities,
                bootstrap_epoch,
            } => {
                self.note(out, || format!("persists the cluster file {identities:?}"));
                self.persisting_identities = Some(identities.clone());
                out.later.push(Later::IdentitiesPersisted {
                    broker: self.index,
                    boot: self.boot,
                    identities,
                    bootstrap_epoch,
                });
            }
            Command::ReadTail { slot, generation } => {
                if self.slot_is_up(slot) {
                    let to = self.slot_node(slot);
                    out.request(to, Msg::Tail { generation });
                } else if let Some(e) = self.engine.as_mut() {
                    e.tail_answer(slot, generation, Err(()), local);
                }
            }
            Command::SendFence {
                slot,
                epoch,
                expected,
            } => {
                out.seen.push(Seen::Fencing {
                    broker: self.index,
                    boot: self.boot,
                    epoch,
                });
                if self.slot_is_up(slot) {
                    let expected = expected.map(|id| (id.store_id, id.incarnation));
                    let to = self.slot_node(slot);
                    out.request(
                        to,
                        Msg::Fence {
                            req: FenceRequest { epoch, expected },
                        },
                    );
                }
            }
            Command::ReadForTakeover(read) => {
                if self.slot_is_up(read.slot) {
                    let to = self.slot_node(read.slot);
                    out.request(
                        to,
                        Msg::Read {
                            purpose: ReadPurpose::TakeoverFetch { epoch: read.epoch },
                            from: read.from,
                            max_events: read.count(),
                        },
                    );
                } else if let Some(e) = self.engine.as_mut() {
                    e.takeover_read(read.slot, read.epoch, Err(()), local);
                }
            }
            Command::Append(cmd) => match &cmd.events {
                quire_broker::core::AppendEvents::InMemory(events) => {
                    let events = events.to_vec();
                    self.send_append(&cmd, events, out);
                }
                quire_broker::core::AppendEvents::FromStore { source } => {
                    if self.slot_is_up(*source) && self.slot_is_up(cmd.slot) {
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
            Command::Applied { events, master, .. } => {
                for e in &events {
                    // In order, once; ahead only when the log starts at a checkpoint.
                    assert!(
                        e.offset >= self.applied_next,
                        "a broker applies stabilized events in order, once: {} after {}",
                        e.offset,
                        self.applied_next
                    );
                    self.applied_next = e.offset.next();
                }
                match master {
                    Some(epoch) => out.seen.push(Seen::Stabilized {
                        broker: self.index,
                        boot: self.boot,
                        epoch,
                        events,
                    }),
                    None => out.seen.push(Seen::Applied {
                        broker: self.index,
                        events,
                    }),
                }
            }
            Command::AskTakeOver { to, epoch, .. } => {
                let target = u8::try_from(to.0.saturating_sub(1)).unwrap_or(u8::MAX);
                out.request(
                    NodeId::Broker(target),
                    Msg::TakeOverNow { from_epoch: epoch },
                );
            }
            Command::HandoffDone { outcome, .. } => out.seen.push(Seen::HandoffDone {
                broker: self.index,
                outcome: outcome.map(|d| d.epoch).map_err(|f| format!("{f:?}")),
            }),
            Command::FetchAnswer { token, reply } => self.answer_fetch(token, reply, out),
            Command::RepairRecord { slot, offset, .. } => {
                // The simulated stores never answer a read `Corrupt` (their disks damage
                // records only at rest, found by recovery), so no repair is ever asked
                // for; one that were would be refused here, and retried by the engine.
                out.seen.push(Seen::Note(format!(
                    "B{} would repair store slot {slot} at {offset} (not simulated)",
                    self.index + 1
                )));
                if let Some(e) = self.engine.as_mut() {
                    e.repair_done(slot, offset, Err("not simulated".to_owned()), local);
                }
            }
            Command::FetchFromStore { token, read } => {
                // As the actor: read the store the engine picked, if connected.
                if !self.slot_is_up(read.source) {
                    self.answer_fetch(token, FetchReply::Unavailable, out);
                    return;
                }
                let (first, span) = read.read_span();
                let to = self.slot_node(read.source);
                let msg = Msg::Read {
                    purpose: ReadPurpose::ForFetch {
                        token,
                        read: Box::new(read),
                    },
                    from: first,
                    max_events: u64::from(span),
                };
                out.request(to, msg);
            }
            Command::Write(w) => self.execute_write(w, now_ms, out),
            Command::TakingOver { epoch, .. } => out.seen.push(Seen::Note(format!(
                "B{} takes over with epoch {:#x}",
                self.index + 1,
                epoch.0
            ))),
            Command::Abandoned { epoch, why } => out.seen.push(Seen::Note(format!(
                "B{} abandons the takeover with epoch {:#x}: {why}",
                self.index + 1,
                epoch.0
            ))),
            Command::BecameMaster { epoch } => out.seen.push(Seen::BecameMaster {
                broker: self.index,
                epoch,
            }),
            Command::Serving { epoch, .. } => out.seen.push(Seen::Note(format!(
                "B{} serves as master of epoch {:#x}",
                self.index + 1,
                epoch.0
            ))),
            Command::LeftMaster { epoch, promised } => out.seen.push(Seen::Note(format!(
                "B{} (epoch {:#x}) steps down: fenced by {:#x}",
                self.index + 1,
                epoch.0,
                promised.0
            ))),
        }
    }

    fn slot_is_up(&self, slot: SlotId) -> bool {
        self.engine.as_ref().is_some_and(|e| e.slot_up(slot))
    }

    fn send_append(
        &mut self,
        cmd: &quire_broker::core::AppendCommand,
        events: Vec<quire_proto::Event>,
        out: &mut Out,
    ) {
        if !self.slot_is_up(cmd.slot) {
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

    /// Where this broker believes the master is.
    fn hint(&self, now_ms: u64) -> Option<u8> {
        let engine = self.engine.as_ref()?;
        let (_, master) = engine.master_hint(self.local_ms(now_ms));
        u8::try_from(master?.0.checked_sub(1)?).ok()
    }

    /// Sends the write path's answers to the simulated clients.
    fn execute_write(&mut self, c: WriteCommand, now_ms: u64, out: &mut Out) {
        let WriteCommand::Answer { token, reply, .. } = c else {
            return;
        };
        let Some(r) = self.held_writes.remove(&token) else {
            return;
        };
        let msg = match reply {
            Reply::Produced { base_offset, .. } => Msg::ProduceOk {
                request: r.request,
                base_offset,
            },
            Reply::CursorCommitted => Msg::CursorCommitted {
                request: r.request,
                ok: true,
            },
            Reply::SecurityChanged | Reply::TopicChanged | Reply::VotersChanged => {
                panic!("the simulated clients send no user, ACL, topic or voter changes")
            }
            Reply::NotMaster => self.failed(r, ProduceError::NotMaster { hint: None }, now_ms),
            Reply::Error(e) => {
                let error = match e.code {
                    ErrorCode::Overloaded => ProduceError::Overloaded,
                    ErrorCode::SequenceGap => ProduceError::SequenceGap,
                    ErrorCode::Timeout | ErrorCode::NoQuorum => ProduceError::Timeout,
                    other => panic!("a simulated write got {other:?}: {}", e.message),
                };
                self.failed(r, error, now_ms)
            }
        };
        out.answer(r.client, r.boot, msg);
    }
}

/// The slot at index `i`.
fn slot_id(i: usize) -> SlotId {
    SlotId(u16::try_from(i).expect("invariant: few slots"))
}
