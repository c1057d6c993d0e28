//! A simulated event store: quire-node's own store engine ([`Engine`]) over a simulated
//! disk that separates what was written from what is durable.
//!
//! # What is real and what is simulated
//! Every decision is the engine's — the same [`Engine`] `quire-node`'s store actor drives
//! over the real WAL: log matching and fences ([`quire_node::replica::Replica`]),
//! promise-before-write, group-commit waiters, fail-stop, fence answers, tail-cut clearing.
//! This module is only its driver, as `node/src/store.rs` is the tokio one: it turns
//! messages into engine requests, executes the engine's commands on the simulated disk
//! ([`Command::PersistPromise`] and [`Command::PersistLearner`] as one atomic durable step
//! each — the node writes them with temp + fsync + rename + fsync dir before it goes on;
//! [`Command::Submit`] as written, unsynced records; [`Command::ClearTailCut`] at once),
//! turns answers back into messages, and reports each submission resolved: durable once an
//! fdatasync covers it (group commit: one fdatasync covers every record written before it
//! was issued), failed when the disk fails (fsync EIO, ENOSPC: the log is then failed and
//! its accepted view falls back to the durable one, as the WAL's does). The engine sees the
//! disk through [`quire_node::engine::StoreLog`], implemented by [`SimWal`].
//!
//! The disk itself — records written and durable, crashes, torn writes, bit flips, wipes,
//! recovery at start — is [`crate::disk`].
//!
//! Not simulated: retention trims ([`Command::Trim`] is dropped, as a failed trim is; no
//! simulated broker writes Trim events yet) and a promise or role write that fails.

use std::collections::BTreeMap;

use quire_node::engine::{Command, Engine, Mutations};
use quire_node::replica::{LogView, Replica};
use quire_node::Role;
use quire_proto::{Body, Epoch, ErrorCode, Event, FenceRequest, Offset};

use crate::disk::{Disk, SimWal, Snapshot};
pub(crate) use crate::disk::{DiskFault, Identity, StartOutcome};
use crate::msg::{AppendMeta, Msg, NodeId, ReadPurpose};
use crate::out::{Later, Out, Seen};
use crate::rng::SimRng;

/// Who asked, and what: the engine's request token.
#[derive(Debug)]
pub(crate) struct Token {
    id: u64,
    to: NodeId,
    to_boot: u32,
    request: Request,
}

#[derive(Clone, Copy, Debug)]
enum Request {
    Append(AppendMeta),
    Fence(Epoch),
}

/// One simulated store. See the module docs.
#[derive(Debug)]
pub(crate) struct SimStore {
    pub(crate) index: u8,
    /// Whether the process runs.
    pub(crate) up: bool,
    /// Incarnation of the process (bumped at every start).
    pub(crate) boot: u32,
    wal: SimWal,
    engine: Engine<Token>,
    mutations: Mutations,
    next_token: u64,
    /// The append being fed to the engine, and whether it was answered while fed.
    feeding: Option<(u64, bool)>,
    /// The accepted log as each unanswered append left it, for its ack claim.
    claims: BTreeMap<u64, Snapshot>,
    /// The latest submission written, and the latest reported resolved.
    submitted: u64,
    reported: u64,
    /// An fdatasync in flight covers records `..cover.0` and submissions `..=cover.1`.
    fsync: Option<(usize, u64)>,
    generation: u64,
    armed: Option<DiskFault>,
    /// Answers a mutation changed (an ack with another `through`, an answer under another
    /// identity than the one on disk).
    pub(crate) mutated_acks: u64,
}

/// The engine of a store that starts on `disk`.
fn engine_on(disk: &Disk, mutations: Mutations) -> Engine<Token> {
    let id = disk.identity;
    let replica = Replica::new(id.store_id, id.incarnation, id.role, disk.promised);
    Engine::new(replica, disk.tail_cut, mutations)
}

impl SimStore {
    /// A new, empty, running store with this identity; `mutations` go to its engine.
    pub(crate) fn new(index: u8, identity: Identity, mutations: Mutations) -> SimStore {
        let wal = SimWal::new(identity);
        SimStore {
            index,
            up: true,
            boot: 1,
            engine: engine_on(&wal.disk, mutations),
            wal,
            mutations,
            next_token: 0,
            feeding: None,
            claims: BTreeMap::new(),
            submitted: 0,
            reported: 0,
            fsync: None,
            generation: 0,
            armed: None,
            mutated_acks: 0,
        }
    }

    fn node(&self) -> NodeId {
        NodeId::Store(self.index)
    }

    /// The identity the store answers under: its engine's (the one on disk, unless a
    /// mutation took another on), role included.
    pub(crate) fn identity(&self) -> Identity {
        let r = self.engine.replica();
        Identity {
            store_id: r.store_id(),
            incarnation: r.incarnation(),
            role: r.role(),
        }
    }

    /// The durable log (what survives a crash for sure).
    #[cfg(test)]
    pub(crate) fn durable_log(&self) -> &crate::disk::EntryLog {
        &self.wal.disk.durable_log
    }

    /// The durable log this store will vote with after its next start, and whether it will
    /// carry a tail-cut mark; `None` if the next start will refuse.
    pub(crate) fn voting_log(&self) -> Option<(&[Event], bool)> {
        self.wal.voting_log()
    }

    /// Whether the log has failed (fail-stop).
    pub(crate) fn is_failed(&self) -> bool {
        self.wal.failed.is_some()
    }

    /// The promised epoch on disk.
    #[cfg(test)]
    pub(crate) fn promised(&self) -> Epoch {
        self.wal.disk.promised
    }

    /// Arms a disk fault for the next fdatasync or write (`None` disarms).
    pub(crate) fn arm(&mut self, fault: Option<DiskFault>) {
        self.armed = fault;
    }

    /// Whether a disk fault is armed and has not struck yet.
    pub(crate) fn is_armed(&self) -> bool {
        self.armed.is_some()
    }

    // ---------------------------------------------------------------- requests

    fn token(&mut self, to: NodeId, to_boot: u32, request: Request) -> Token {
        self.next_token += 1;
        Token {
            id: self.next_token,
            to,
            to_boot,
            request,
        }
    }

    /// An append from `from` (incarnation `from_boot`).
    pub(crate) fn on_append(
        &mut self,
        from: NodeId,
        from_boot: u32,
        meta: AppendMeta,
        req: quire_proto::AppendRequest,
        out: &mut Out,
    ) {
        let token = self.token(from, from_boot, Request::Append(meta));
        let id = token.id;
        self.feeding = Some((id, false));
        self.engine.append(token, req, &self.wal);
        self.drain(out);
        if self.feeding.take() == Some((id, false)) {
            // Waiting for durability: its ack claims what the accepted log holds now.
            self.claims.insert(id, self.wal.accepted.snapshot());
        }
    }

    /// A fence from `from`.
    pub(crate) fn on_fence(
        &mut self,
        from: NodeId,
        from_boot: u32,
        req: FenceRequest,
        out: &mut Out,
    ) {
        let token = self.token(from, from_boot, Request::Fence(req.epoch));
        self.engine.fence(token, req, &self.wal);
        self.drain(out);
    }

    /// A read of durable events (the WAL's reader; no decision of the engine).
    pub(crate) fn on_read(
        &mut self,
        from: NodeId,
        from_boot: u32,
        purpose: ReadPurpose,
        first: Offset,
        max_events: u64,
        out: &mut Out,
    ) {
        let log = &self.wal.disk.durable_log;
        let events = (first.0 <= log.len()).then(|| {
            let end = log.len().min(first.0.saturating_add(max_events));
            log.entries()[first.0 as usize..end as usize].to_vec()
        });
        out.answer(
            from,
            from_boot,
            Msg::ReadResult {
                purpose,
                from: first,
                events,
            },
        );
    }

    // ---------------------------------------------------------------- disk completions

    /// The fdatasync of generation `generation` completed.
    pub(crate) fn on_fsync_done(&mut self, generation: u64, out: &mut Out) {
        if generation != self.generation || self.wal.failed.is_some() {
            return;
        }
        let Some((records, seq)) = self.fsync.take() else {
            return;
        };
        if self.armed == Some(DiskFault::FsyncEio) {
            self.armed = None;
            self.fail(DiskFault::FsyncEio, out);
            self.drain(out);
            return;
        }
        self.wal.synced(records);
        while self.reported < seq {
            self.reported += 1;
            self.engine.resolved(self.reported, true, &self.wal);
        }
        self.drain(out);
        if self.submitted > self.reported {
            self.start_fsync(out);
        }
    }

    // ---------------------------------------------------------------- engine commands

    /// Executes the engine's commands until it has none.
    fn drain(&mut self, out: &mut Out) {
        loop {
            let commands = self.engine.take_commands();
            if commands.is_empty() {
                break;
            }
            for c in commands {
                self.execute(c, out);
            }
        }
        assert!(
            !self.engine.is_blocked(),
            "invariant: the simulated disk persists promises and roles at once"
        );
    }

    fn execute(&mut self, command: Command<Token>, out: &mut Out) {
        match command {
            Command::PersistPromise(epoch) => {
                self.wal.disk.promised = epoch;
                self.engine.promise_persisted(Ok(()), &self.wal);
            }
            Command::PersistLearner => {
                self.wal.disk.identity.role = Role::Learner;
                out.seen.push(Seen::Note(format!(
                    "{} expected another identity: became a learner",
                    self.node()
                )));
                self.engine.learner_persisted(Ok(()));
            }
            Command::Submit {
                seq,
                events,
                truncates,
                ..
            } => self.submit(seq, events, truncates, out),
            Command::Answer { token, body } => self.answer(token, body, out),
            Command::Trim { .. } => {}
            Command::ClearTailCut(cut) => {
                self.wal.disk.tail_cut = None;
                out.seen.push(Seen::Note(format!(
                    "{}: tail-cut mark (offset {}, promised {:#x}) cleared",
                    self.node(),
                    cut.offset.0,
                    cut.promised.0
                )));
                self.engine.tail_cut_cleared(true);
            }
        }
    }

    /// Writes submission `seq` (unsynced), or fails the log if a write fault is armed.
    fn submit(&mut self, seq: u64, events: Vec<Event>, truncates: bool, out: &mut Out) {
        assert_eq!(seq, self.submitted + 1, "invariant: submissions in order");
        self.submitted = seq;
        if self.wal.failed.is_some() || self.armed == Some(DiskFault::Enospc) {
            if self.wal.failed.is_none() {
                self.armed = None;
                self.fail(DiskFault::Enospc, out);
            }
            // The WAL refuses every write of a failed log.
            self.resolve_failed();
            return;
        }
        let truncated = self.wal.write(events);
        assert_eq!(
            truncated, truncates,
            "invariant: the engine and the WAL agree"
        );
        if self.fsync.is_none() {
            self.start_fsync(out);
        }
    }

    /// Sends the engine's answer `body` to `token` as a simulated message.
    fn answer(&mut self, token: Token, body: Body, out: &mut Out) {
        let Token {
            id,
            to,
            to_boot,
            request,
        } = token;
        let claim = self.claims.remove(&id);
        if let Some((fed, answered)) = self.feeding.as_mut() {
            if *fed == id {
                *answered = true;
            }
        }
        let on_disk = self.wal.disk.identity;
        let msg = match (request, body) {
            (Request::Append(meta), Body::PersistedAck(ack)) => {
                if ack.through_offset != meta.through
                    || (ack.store_id, ack.incarnation) != (on_disk.store_id, on_disk.incarnation)
                {
                    self.mutated_acks += 1;
                }
                if let (Some(t), NodeId::Broker(broker)) = (ack.through_offset, to) {
                    // What the store held at `t` when it accepted the append.
                    let held = match &claim {
                        Some(snapshot) => snapshot.entry_epoch(t),
                        None => self.wal.accepted.entry_epoch(t),
                    };
                    out.seen.push(Seen::AckClaim {
                        store: self.index,
                        broker,
                        boot: to_boot,
                        epoch: meta.epoch,
                        through: t,
                        held,
                    });
                }
                Msg::Persisted { meta, ack }
            }
            (Request::Append(meta), Body::AppendRejected(rejected)) => {
                Msg::Rejected { meta, rejected }
            }
            (Request::Append(meta), _) => Msg::AppendError { meta },
            (Request::Fence(_), Body::FenceGranted(g)) => {
                if (g.store_id, g.incarnation) != (on_disk.store_id, on_disk.incarnation) {
                    self.mutated_acks += 1;
                }
                Msg::FenceGranted(g)
            }
            (Request::Fence(epoch), Body::FenceRefused(r)) => Msg::FenceRefused {
                epoch,
                promised: r.promised,
            },
            (Request::Fence(epoch), Body::ErrorResponse(e)) if e.code == ErrorCode::NotVoter => {
                let r = self.engine.replica();
                Msg::NotVoter {
                    epoch,
                    store_id: r.store_id(),
                    incarnation: r.incarnation(),
                }
            }
            // An internal error (a promise or role write that failed): not simulated.
            (Request::Fence(_), other) => unreachable!("a fence answered {other:?}"),
        };
        out.answer(to, to_boot, msg);
    }

    // ---------------------------------------------------------------- faults

    /// The process dies: volatile state is gone, the disk keeps what a crash keeps
    /// ([`SimWal::crash`]; `tear`: whether a write may be torn).
    pub(crate) fn crash(&mut self, rng: &mut SimRng, tear: bool) {
        self.wal.crash(rng, tear);
        self.up = false;
        self.armed = None;
        self.reset();
    }

    /// Forgets everything volatile: the engine, the accepted view, the fdatasync in flight.
    fn reset(&mut self) {
        self.engine = engine_on(&self.wal.disk, self.mutations);
        self.claims.clear();
        self.feeding = None;
        self.submitted = 0;
        self.reported = 0;
        self.fsync = None;
        self.generation += 1;
    }

    /// Flips a bit in a stopped store's durable entry ([`SimWal::flip_bit`]).
    pub(crate) fn flip_bit(&mut self, tail_flips: bool, rng: &mut SimRng) -> Option<Offset> {
        assert!(!self.up, "bits are flipped in a stopped store");
        self.wal.flip_bit(tail_flips, rng)
    }

    /// Starts the process on its disk: recovery ([`SimWal::recover`]), then serving with a
    /// new engine.
    pub(crate) fn start(&mut self) -> StartOutcome {
        assert!(!self.up, "start of a running store");
        let outcome = self.wal.recover();
        if let StartOutcome::Started { .. } = outcome {
            self.reset();
            self.boot += 1;
            self.up = true;
        }
        outcome
    }

    /// The operator replaces the disk and runs `quire-node init`: an empty store with a new
    /// identity (a new store id and incarnation), which starts stopped.
    pub(crate) fn reinitialise(&mut self, new_identity: Identity) {
        assert!(!self.up, "a running store's disk is not replaced");
        self.wal.reinitialise(new_identity);
        self.reset();
    }

    // ---------------------------------------------------------------- helpers

    fn start_fsync(&mut self, out: &mut Out) {
        assert!(self.fsync.is_none(), "one fdatasync at a time");
        self.fsync = Some((self.wal.written(), self.submitted));
        out.later.push(Later::Fsync {
            store: self.index,
            boot: self.boot,
            generation: self.generation,
        });
    }

    /// The disk failed ([`SimWal::fail`]): every submission written resolves failed.
    fn fail(&mut self, fault: DiskFault, out: &mut Out) {
        self.wal.fail(fault);
        self.fsync = None;
        self.generation += 1;
        out.seen.push(Seen::Note(format!(
            "{}: {fault:?}: the log failed (fail-stop)",
            self.node()
        )));
        self.resolve_failed();
    }

    /// Reports every submission not yet resolved as failed.
    fn resolve_failed(&mut self) {
        while self.reported < self.submitted {
            self.reported += 1;
            self.engine.resolved(self.reported, false, &self.wal);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use quire_broker::core::AppendId;
    use quire_proto::EventKind;

    use quire_proto::{AppendRequest, Incarnation, LogPosition, RejectReason, StoreId};

    use super::*;
    use crate::checker::{Checker, Violation};

    fn ev(epoch: u64, offset: u64) -> Event {
        Event {
            epoch: Epoch(epoch),
            offset: Offset(offset),
            kind: EventKind::Message,
            payload: Bytes::from(format!("{epoch}/{offset}")),
        }
    }

    fn append(
        epoch: u64,
        prev: Option<(u64, u64)>,
        events: Vec<Event>,
    ) -> (AppendMeta, AppendRequest) {
        let req = AppendRequest {
            epoch: Epoch(epoch),
            prev: prev.map(|(e, o)| LogPosition {
                epoch: Epoch(e),
                offset: Offset(o),
            }),
            events,
            hwm: None,
        };
        let meta = AppendMeta {
            append: AppendId(1),
            epoch: Epoch(epoch),
            through: req.through_offset(),
        };
        (meta, req)
    }

    fn store(through_end: bool) -> SimStore {
        SimStore::new(
            0,
            Identity {
                store_id: StoreId(1),
                incarnation: Incarnation(1),
                role: Role::Voter,
            },
            Mutations {
                through_end,
                ..Mutations::default()
            },
        )
    }

    /// The claim a store makes when it acks `req` (once durable).
    fn claim(s: &mut SimStore, meta: AppendMeta, req: AppendRequest) -> (Offset, Option<Epoch>) {
        let mut out = Out::default();
        s.on_append(NodeId::Broker(0), 1, meta, req, &mut out);
        let generation = s.generation;
        s.on_fsync_done(generation, &mut out);
        out.seen
            .into_iter()
            .find_map(|seen| match seen {
                Seen::AckClaim { through, held, .. } => Some((through, held)),
                _ => None,
            })
            .expect("an acked append makes a claim")
    }

    /// The checker's ack rule catches a store acking its own log end when the append's
    /// range ends before a stale suffix the master does not hold (the situation the model
    /// checker's `mut-through-end` counterexample builds, which the master core never
    /// creates; see the mutation test in tests/sim.rs).
    #[test]
    fn a_store_acking_its_own_log_end_is_caught_by_the_ack_rule() {
        for through_end in [false, true] {
            let mut s = store(through_end);
            // An old master of epoch 1 wrote offsets 0..=5.
            let (meta, req) = append(1, None, (0..6).map(|o| ev(1, o)).collect());
            claim(&mut s, meta, req);
            // The new master (epoch 2) adopted 0..=3 and put its epoch start at 4; its probe
            // carries offset 3 only.
            let master_epoch_at = |o: u64| match o {
                0..=3 => Some(Epoch(1)),
                4 => Some(Epoch(2)),
                _ => None,
            };
            let (meta, req) = append(2, Some((1, 2)), vec![ev(1, 3)]);
            let (through, held) = claim(&mut s, meta, req);
            let mut checker = Checker::default();
            checker.ack_claim(0, Epoch(2), through, held, master_epoch_at(through.0));
            if through_end {
                assert_eq!(through, Offset(5));
                assert!(matches!(
                    checker.violations[..],
                    [Violation::AckClaimsUnheld { through: 5, .. }]
                ));
            } else {
                assert_eq!(through, Offset(3));
                assert!(checker.violations.is_empty());
            }
        }
    }

    #[test]
    fn a_crash_keeps_the_durable_records_and_a_prefix_of_the_rest() {
        let mut rng = SimRng::new(3);
        for _ in 0..50 {
            let mut s = store(false);
            let mut out = Out::default();
            let (meta, req) = append(1, None, (0..3).map(|o| ev(1, o)).collect());
            s.on_append(NodeId::Broker(0), 1, meta, req, &mut out);
            let generation = s.generation;
            s.on_fsync_done(generation, &mut out);
            assert_eq!(s.durable_log().len(), 3);
            // Written, never synced: a truncation and two entries of epoch 2.
            let (meta, req) = append(2, Some((1, 0)), vec![ev(2, 1), ev(2, 2)]);
            s.on_append(NodeId::Broker(0), 1, meta, req, &mut out);
            assert_eq!(s.wal.accepted.len(), 3);
            s.crash(&mut rng, true);
            let StartOutcome::Started { cut } = s.start() else {
                panic!("the store starts")
            };
            if let Some(cut) = cut {
                // A torn write: the mark names where the cut began and the promise then.
                assert_eq!(cut.offset.0, s.durable_log().len());
                assert_eq!(cut.promised, Epoch(2));
            }
            let epochs: Vec<u64> = s
                .durable_log()
                .entries()
                .iter()
                .map(|e| e.epoch.0)
                .collect();
            assert!(
                [vec![1, 1, 1], vec![1], vec![1, 2], vec![1, 2, 2]].contains(&epochs),
                "{epochs:?}"
            );
            assert_eq!(
                s.promised(),
                Epoch(2),
                "the promise was durable before the write"
            );
        }
    }

    #[test]
    fn a_failed_fsync_fails_the_waiting_appends_and_every_later_one() {
        let mut s = store(false);
        let mut out = Out::default();
        let (meta, req) = append(1, None, vec![ev(1, 0)]);
        s.on_append(NodeId::Broker(0), 1, meta, req, &mut out);
        s.arm(Some(DiskFault::FsyncEio));
        let generation = s.generation;
        s.on_fsync_done(generation, &mut out);
        assert!(s.is_failed());
        let (meta, req) = append(1, Some((1, 0)), vec![ev(1, 1)]);
        s.on_append(NodeId::Broker(0), 1, meta, req, &mut out);
        let refusals = out
            .sends
            .iter()
            .filter(|m| {
                matches!(&m.msg, Msg::Rejected { rejected, .. } if rejected.reason == RejectReason::LogFailed)
            })
            .count();
        assert_eq!(refusals, 2, "{:?}", out.sends);
        assert!(!out
            .sends
            .iter()
            .any(|m| matches!(m.msg, Msg::Persisted { .. })));
        // Fences are still answered, with the last durable entry (none).
        let mut out = Out::default();
        s.on_fence(
            NodeId::Broker(0),
            1,
            FenceRequest {
                epoch: Epoch(5),
                expected: None,
            },
            &mut out,
        );
        assert!(matches!(
            &out.sends[..],
            [crate::out::Send { msg: Msg::FenceGranted(g), .. }] if g.last.is_none()
        ));
    }

    #[test]
    fn a_flipped_bit_before_the_last_record_stops_the_start() {
        let mut rng = SimRng::new(1);
        let mut s = store(false);
        let mut out = Out::default();
        let (meta, req) = append(1, None, (0..4).map(|o| ev(1, o)).collect());
        s.on_append(NodeId::Broker(0), 1, meta, req, &mut out);
        let generation = s.generation;
        s.on_fsync_done(generation, &mut out);
        s.crash(&mut rng, true);
        let at = s.flip_bit(false, &mut rng).expect("entries to flip");
        assert!(at.0 < 3, "sealed data only");
        assert_eq!(s.start(), StartOutcome::Corrupt { offset: at });
        assert!(!s.up);
    }

    #[test]
    fn a_flip_in_the_last_record_is_cut_marked_reported_and_cleared_by_a_later_master() {
        let mut rng = SimRng::new(5);
        let mut s = store(false);
        let mut out = Out::default();
        let (meta, req) = append(1, None, (0..2).map(|o| ev(1, o)).collect());
        s.on_append(NodeId::Broker(0), 1, meta, req, &mut out);
        let generation = s.generation;
        s.on_fsync_done(generation, &mut out);
        s.crash(&mut rng, true);
        // Only the last record is a candidate once the first is excluded: flip until it hits.
        while s.flip_bit(true, &mut rng) != Some(Offset(1)) {}
        assert_eq!(s.voting_log().map(|(l, m)| (l.len(), m)), Some((1, true)));
        let StartOutcome::Started { cut } = s.start() else {
            panic!("a flipped last record reads as a torn tail")
        };
        let cut = cut.expect("the cut marks the store");
        assert_eq!(cut.offset, Offset(1));
        assert_eq!(cut.promised, Epoch(1));
        // Its grants carry the mark.
        let mut out = Out::default();
        let fence = FenceRequest {
            epoch: Epoch(2),
            expected: None,
        };
        s.on_fence(NodeId::Broker(1), 1, fence, &mut out);
        let [crate::out::Send {
            msg: Msg::FenceGranted(g),
            ..
        }] = &out.sends[..]
        else {
            panic!("{:?}", out.sends)
        };
        assert_eq!(g.tail_cut, Some(cut));
        // An entry of epoch 2 (above the promise at the cut), once durable, clears it.
        let (meta, req) = append(2, Some((1, 0)), vec![ev(2, 1)]);
        let mut out = Out::default();
        s.on_append(NodeId::Broker(1), 1, meta, req, &mut out);
        assert!(
            s.wal.disk.tail_cut.is_some(),
            "not before the entry is durable"
        );
        let generation = s.generation;
        s.on_fsync_done(generation, &mut out);
        assert_eq!(s.wal.disk.tail_cut, None);
        assert_eq!(s.voting_log().map(|(l, m)| (l.len(), m)), Some((2, false)));
    }
}
