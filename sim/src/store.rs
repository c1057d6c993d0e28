//! A simulated event store: quire-node's own decision rules ([`Replica`]) over a simulated
//! disk that separates what was written from what is durable.
//!
//! # What is real and what is simulated
//! Every append and fence is decided by [`Replica::decide_append`] and
//! [`Replica::decide_fence`] — the node's pure rules — against the **accepted** log (written,
//! durable or not), exactly as the node's store actor does. What the actor does around them
//! is mirrored here: the promised epoch is made durable before anything else (as one atomic
//! step; the node writes it with temp + fsync + rename + fsync dir before it goes on),
//! accepted events are written to the disk and answered only once an fdatasync covers them
//! (group commit: one fdatasync covers every append written before it was issued), a fence
//! is granted once everything accepted before it is durable, and a failed write or
//! fdatasync makes the log fail-stop: every waiting append is answered `LogFailed`, every
//! later one too, the accepted view falls back to the durable one, and fences are still
//! answered (with the last durable entry).
//!
//! # The disk, at the level of log entries
//! The disk holds a sequence of records in file order — entries and truncation markers, as
//! the WAL writes them — and how many of them are durable. Replaying the records gives the
//! log. A crash keeps the durable records and a random prefix of the unsynced ones (a torn
//! write of the last batch cuts it anywhere; the WAL's recovery scan keeps exactly such a
//! prefix, `quire-wal` tests that byte by byte). The promised epoch and the store's role are
//! durable values. A bit flip is injected into a stopped store's durable entries; at the
//! next start the store finds it (a record with a bad checksum followed by valid ones is
//! corruption to the WAL) and refuses to start, and the operator re-initialises it: a new
//! identity, which never votes again. A flip in the *last* record cannot be told from a torn
//! write by the WAL's scan; [`crate::FaultSet::tail_flips`] models that faithfully (the
//! record is cut as a torn tail) and is off by default — see docs/testing.md.
//!
//! # Tail-cut marks
//! As quire-node does, a store whose recovery cut a torn tail — a crash that tore a write
//! in the middle of the unsynced records, or a flip in the last record — keeps a durable
//! tail-cut mark (the first offset cut and its promised epoch then), reports it in every
//! `FenceGranted`, and clears it once its durable log holds an entry of an epoch above that
//! promised epoch. A crash that lost every unsynced record with nothing of them on the
//! medium cuts nothing and leaves no mark.

use std::collections::VecDeque;

use quire_node::replica::{AppendDecision, FenceDecision, LogView, Replica};
use quire_node::Role;
use quire_proto::{
    AppendRejected, AppendRequest, Epoch, Event, FenceGranted, FenceRequest, Incarnation,
    LogPosition, Offset, PersistedAck, RejectReason, StoreId, TailCut,
};

use crate::msg::{AppendMeta, Msg, NodeId, ReadPurpose};
use crate::out::{Later, Out, Seen};
use crate::rng::SimRng;

/// The store's log as a vector of entries from offset 0 (stores are never trimmed in a
/// simulated run).
#[derive(Clone, Debug, Default)]
pub(crate) struct EntryLog {
    entries: Vec<Event>,
}

impl EntryLog {
    /// The entries, by offset.
    pub(crate) fn entries(&self) -> &[Event] {
        &self.entries
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    fn apply(&mut self, record: &Record) {
        match record {
            Record::Truncate(at) => {
                assert!(at.0 <= self.len(), "truncation past the end");
                self.entries.truncate(at.0 as usize);
            }
            Record::Entry(e) => {
                assert_eq!(e.offset.0, self.len(), "records replay contiguously");
                self.entries.push(e.clone());
            }
        }
    }
}

impl LogView for EntryLog {
    fn entry_epoch(&self, offset: Offset) -> Option<Epoch> {
        let i = usize::try_from(offset.0).ok()?;
        self.entries.get(i).map(|e| e.epoch)
    }
    fn last(&self) -> Option<LogPosition> {
        self.entries.last().map(|e| LogPosition {
            epoch: e.epoch,
            offset: e.offset,
        })
    }
    fn first_offset(&self) -> Offset {
        Offset::ZERO
    }
}

/// One record in file order.
#[derive(Clone, Debug)]
enum Record {
    /// Drop every entry from this offset on (the WAL's truncation marker).
    Truncate(Offset),
    /// One entry.
    Entry(Event),
}

/// The store's identity file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) store_id: StoreId,
    pub(crate) incarnation: Incarnation,
    pub(crate) role: Role,
}

/// What survives a crash.
#[derive(Clone, Debug)]
struct Disk {
    identity: Identity,
    /// The promised epoch file.
    promised: Epoch,
    /// Records in file order: written (the prefix `..durable` is durable).
    records: Vec<Record>,
    durable: usize,
    /// Replay of `records[..durable]`.
    durable_log: EntryLog,
    /// A bit flipped in the durable entry at this offset (injected while stopped).
    flipped: Option<Offset>,
    /// A crash tore a write: the next start's recovery cuts a torn tail that begins at this
    /// offset (and marks the store).
    torn: Option<Offset>,
    /// The durable tail-cut mark.
    tail_cut: Option<TailCut>,
}

impl Disk {
    fn new(identity: Identity) -> Disk {
        Disk {
            identity,
            promised: Epoch::ZERO,
            records: Vec::new(),
            durable: 0,
            durable_log: EntryLog::default(),
            flipped: None,
            torn: None,
            tail_cut: None,
        }
    }
}

/// An answer waiting for durability.
#[derive(Debug)]
enum Waiter {
    Persisted {
        needed: u64,
        to: NodeId,
        to_boot: u32,
        meta: AppendMeta,
        through: Option<Offset>,
    },
    Fence {
        needed: u64,
        to: NodeId,
        to_boot: u32,
        epoch: Epoch,
        last: Option<LogPosition>,
        tail_cut: Option<TailCut>,
    },
}

impl Waiter {
    fn needed(&self) -> u64 {
        match self {
            Waiter::Persisted { needed, .. } | Waiter::Fence { needed, .. } => *needed,
        }
    }
}

/// How a start after a stop went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StartOutcome {
    /// Serving; `cut`: the recovery cut a torn tail and marked the store with this.
    Started {
        /// The mark this start wrote, if its recovery cut a tail.
        cut: Option<TailCut>,
    },
    /// The recovery scan found a bad record before valid ones: the store refuses to start.
    Corrupt {
        /// The offset of the bad record.
        offset: Offset,
    },
}

/// Why the log failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DiskFault {
    /// The next fdatasync fails with EIO.
    FsyncEio,
    /// The next write fails with ENOSPC.
    Enospc,
}

/// Rules a test switches off on purpose in the store driver (see [`crate::Mutation`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StoreMutations {
    /// Ack the store's own accepted log end instead of `prev.offset + events.len()`.
    pub(crate) through_end: bool,
    /// A wiped store keeps its old identity and votes again once it caught up to the HWM
    /// it heard.
    pub(crate) wiped_votes: bool,
}

/// One simulated store. See the module docs.
#[derive(Debug)]
pub(crate) struct SimStore {
    pub(crate) index: u8,
    /// Whether the process runs.
    pub(crate) up: bool,
    /// Incarnation of the process (bumped at every start).
    pub(crate) boot: u32,
    disk: Disk,
    replica: Replica,
    accepted: EntryLog,
    failed: Option<DiskFault>,
    /// Sequence number of the latest submission (write) and of the latest durable one.
    submitted: u64,
    durable_seq: u64,
    /// An fdatasync in flight covers records `..cover.0` and submissions `..=cover.1`.
    fsync: Option<(usize, u64)>,
    generation: u64,
    waiters: VecDeque<Waiter>,
    armed: Option<DiskFault>,
    mutations: StoreMutations,
    /// The wiped-votes mutation: the identity this store votes with once caught up.
    mutant_identity: Option<Identity>,
    /// Acks whose `through` a mutation changed.
    pub(crate) mutated_acks: u64,
}

impl SimStore {
    /// A new, empty, running store with this identity.
    pub(crate) fn new(index: u8, identity: Identity, mutations: StoreMutations) -> SimStore {
        let disk = Disk::new(identity);
        SimStore {
            index,
            up: true,
            boot: 1,
            replica: Replica::new(
                identity.store_id,
                identity.incarnation,
                identity.role,
                Epoch::ZERO,
            ),
            accepted: EntryLog::default(),
            disk,
            failed: None,
            submitted: 0,
            durable_seq: 0,
            fsync: None,
            generation: 0,
            waiters: VecDeque::new(),
            armed: None,
            mutations,
            mutant_identity: None,
            mutated_acks: 0,
        }
    }

    fn node(&self) -> NodeId {
        NodeId::Store(self.index)
    }

    /// The identity on disk.
    pub(crate) fn identity(&self) -> Identity {
        self.disk.identity
    }

    /// The durable log (what survives a crash for sure).
    #[cfg(test)]
    pub(crate) fn durable_log(&self) -> &EntryLog {
        &self.disk.durable_log
    }

    /// The durable log this store will vote with after its next start, and whether it will
    /// carry a tail-cut mark; `None` if the next start will refuse (a flip before the last
    /// record is corruption).
    pub(crate) fn voting_log(&self) -> Option<(&[Event], bool)> {
        let entries = self.disk.durable_log.entries();
        let marked = self.disk.tail_cut.is_some() || self.disk.torn.is_some();
        match self.disk.flipped {
            None => Some((entries, marked)),
            Some(at) if at.0 + 1 == entries.len() as u64 => {
                Some((&entries[..entries.len() - 1], true))
            }
            Some(_) => None,
        }
    }

    /// Whether the log has failed (fail-stop).
    pub(crate) fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// The promised epoch on disk.
    #[cfg(test)]
    pub(crate) fn promised(&self) -> Epoch {
        self.disk.promised
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

    /// An append from `from` (incarnation `from_boot`).
    pub(crate) fn on_append(
        &mut self,
        from: NodeId,
        from_boot: u32,
        meta: AppendMeta,
        req: AppendRequest,
        out: &mut Out,
    ) {
        self.mutant_refresh();
        if self.failed.is_some() {
            out.answer(
                from,
                from_boot,
                self.rejected(meta, RejectReason::LogFailed),
            );
            return;
        }
        let plan = match self.replica.decide_append(&req, &self.accepted) {
            AppendDecision::Accept(plan) => plan,
            AppendDecision::Reject(reason) => {
                out.answer(from, from_boot, self.rejected(meta, reason));
                return;
            }
            AppendDecision::Invalid(_) => {
                out.answer(from, from_boot, Msg::AppendError { meta });
                return;
            }
        };
        if let Some(epoch) = plan.promise {
            self.disk.promised = epoch;
            self.replica.promise(epoch);
        }
        self.replica.learn_hwm(req.epoch, req.hwm);
        let mut through = plan.through;
        let needed = match plan.write_from {
            None => self.submitted,
            Some(from_index) => {
                if self.armed == Some(DiskFault::Enospc) {
                    self.armed = None;
                    self.fail(DiskFault::Enospc, out);
                    out.answer(
                        from,
                        from_boot,
                        self.rejected(meta, RejectReason::LogFailed),
                    );
                    return;
                }
                let first = req.events[from_index].offset;
                if plan.truncates {
                    self.write(Record::Truncate(first));
                }
                for e in req.events.into_iter().skip(from_index) {
                    self.write(Record::Entry(e));
                }
                self.submitted += 1;
                if self.fsync.is_none() {
                    self.start_fsync(out);
                }
                self.submitted
            }
        };
        if self.mutations.through_end {
            // MUTANT (test-only): ack the store's own log end.
            let end = self.accepted.last().map(|l| l.offset);
            if end != through {
                self.mutated_acks += 1;
            }
            through = end;
        }
        if let (Some(t), NodeId::Broker(broker)) = (through, from) {
            out.seen.push(Seen::AckClaim {
                store: self.index,
                broker,
                boot: from_boot,
                epoch: meta.epoch,
                through: t,
                held: self.accepted.entry_epoch(t),
            });
        }
        self.wait(
            Waiter::Persisted {
                needed,
                to: from,
                to_boot: from_boot,
                meta,
                through,
            },
            out,
        );
    }

    /// A fence from `from`.
    pub(crate) fn on_fence(
        &mut self,
        from: NodeId,
        from_boot: u32,
        req: FenceRequest,
        out: &mut Out,
    ) {
        self.mutant_refresh();
        match self.replica.decide_fence(&req) {
            FenceDecision::NotVoter => out.answer(from, from_boot, self.not_voter(req.epoch)),
            FenceDecision::BecomeLearner => {
                self.disk.identity.role = Role::Learner;
                self.replica.become_learner();
                self.mutant_identity = None;
                out.seen.push(Seen::Note(format!(
                    "{} expected another identity: became a learner",
                    self.node()
                )));
                out.answer(from, from_boot, self.not_voter(req.epoch));
            }
            FenceDecision::Refuse => out.answer(
                from,
                from_boot,
                Msg::FenceRefused {
                    epoch: req.epoch,
                    promised: self.replica.promised(),
                },
            ),
            FenceDecision::Grant { promise } => {
                if let Some(epoch) = promise {
                    self.disk.promised = epoch;
                    self.replica.promise(epoch);
                }
                let last = self.accepted.last();
                self.wait(
                    Waiter::Fence {
                        needed: self.submitted,
                        to: from,
                        to_boot: from_boot,
                        epoch: req.epoch,
                        last,
                        tail_cut: self.disk.tail_cut,
                    },
                    out,
                );
            }
        }
    }

    /// A read of durable events.
    pub(crate) fn on_read(
        &mut self,
        from: NodeId,
        from_boot: u32,
        purpose: ReadPurpose,
        first: Offset,
        max_events: u64,
        out: &mut Out,
    ) {
        let log = &self.disk.durable_log;
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
        if generation != self.generation || self.failed.is_some() {
            return;
        }
        let Some((records, seq)) = self.fsync.take() else {
            return;
        };
        if self.armed == Some(DiskFault::FsyncEio) {
            self.armed = None;
            self.fail(DiskFault::FsyncEio, out);
            return;
        }
        for r in &self.disk.records[self.disk.durable..records] {
            self.disk.durable_log.apply(r);
        }
        self.disk.durable = records;
        self.durable_seq = seq;
        self.clear_tail_cut(out);
        while self
            .waiters
            .front()
            .is_some_and(|w| w.needed() <= self.durable_seq)
        {
            let w = self.waiters.pop_front().expect("invariant: front exists");
            self.answer(w, true, out);
        }
        if self.submitted > self.durable_seq {
            self.start_fsync(out);
        }
    }

    // ---------------------------------------------------------------- faults

    /// The process dies: volatile state is gone; of the unsynced records a random prefix
    /// survives (a torn write cuts anywhere in it, and the next start cuts the torn record
    /// and marks the store). With `tear` false the write is not torn: a prefix the draw
    /// would have torn is lost whole instead (nothing of it on the medium, no mark).
    pub(crate) fn crash(&mut self, rng: &mut SimRng, tear: bool) {
        let unsynced = self.disk.records.len() - self.disk.durable;
        // 0: nothing of the unsynced writes reached the medium (the scan ends cleanly);
        // 1: all of them did; 2: a torn write, some prefix survives and the scan cuts the
        // partial record after it.
        let draw = rng.range(0, 2);
        let keep = match draw {
            0 => 0,
            1 => unsynced,
            _ => {
                let k = rng.range(0, unsynced as u64) as usize;
                if tear || k == unsynced {
                    k
                } else {
                    0
                }
            }
        };
        self.disk.records.truncate(self.disk.durable + keep);
        let mut log = EntryLog::default();
        for r in &self.disk.records {
            log.apply(r);
        }
        if draw == 2 && tear && keep < unsynced {
            self.disk.torn = Some(Offset(log.len()));
        }
        // What survived is on the medium: compact it to one record per entry.
        self.disk.records = log.entries().iter().cloned().map(Record::Entry).collect();
        self.disk.durable = self.disk.records.len();
        if self.disk.flipped.is_some_and(|o| o.0 >= log.len()) {
            self.disk.flipped = None;
        }
        self.disk.durable_log = log;
        self.up = false;
        self.waiters.clear();
        self.fsync = None;
        self.failed = None;
        self.armed = None;
        self.generation += 1;
    }

    /// Flips a bit in a stopped store's durable entry. Without `tail_flips`, only entries
    /// before the last one (sealed data; a flip in the last record reads as a torn write).
    /// Returns the offset, or `None` if there is no entry to flip.
    pub(crate) fn flip_bit(&mut self, tail_flips: bool, rng: &mut SimRng) -> Option<Offset> {
        assert!(!self.up, "bits are flipped in a stopped store");
        let n = self.disk.durable_log.len();
        let candidates = if tail_flips { n } else { n.saturating_sub(1) };
        if candidates == 0 {
            return None;
        }
        let at = Offset(rng.range(0, candidates - 1));
        self.disk.flipped = Some(at);
        Some(at)
    }

    /// Starts the process on its disk: recovery, then serving.
    pub(crate) fn start(&mut self) -> StartOutcome {
        assert!(!self.up, "start of a running store");
        if let Some(at) = self.disk.flipped {
            if at.0 + 1 == self.disk.durable_log.len() {
                // The WAL's scan sees a bad last record with nothing valid after it: a torn
                // tail, cut (only reachable with tail flips on), and the store is marked.
                self.disk.records.truncate(at.0 as usize);
                self.disk.durable = self.disk.records.len();
                self.disk.durable_log.entries.truncate(at.0 as usize);
                self.disk.flipped = None;
                self.disk.torn = Some(at);
            } else {
                return StartOutcome::Corrupt { offset: at };
            }
        }
        let mut cut = None;
        if let Some(at) = self.disk.torn.take() {
            // The node writes the mark durably before the WAL's cut (the WAL's pre-cut hook):
            // one atomic step here. A mark already there keeps its lower offset.
            let offset = self.disk.tail_cut.map_or(at, |c| c.offset.min(at));
            let mark = TailCut {
                offset,
                promised: self.disk.promised,
            };
            self.disk.tail_cut = Some(mark);
            cut = Some(mark);
        }
        let id = self.disk.identity;
        self.replica = Replica::new(id.store_id, id.incarnation, id.role, self.disk.promised);
        self.accepted = self.disk.durable_log.clone();
        self.boot += 1;
        self.up = true;
        self.submitted = 0;
        self.durable_seq = 0;
        StartOutcome::Started { cut }
    }

    /// The operator replaces the disk and runs `quire-node init`: an empty store with a new
    /// identity (a new store id and incarnation), which starts stopped. With the wiped-votes
    /// mutation the store keeps its old identity instead and votes again once caught up.
    pub(crate) fn reinitialise(&mut self, new_identity: Identity) {
        assert!(!self.up, "a running store's disk is not replaced");
        let old = self.disk.identity;
        if self.mutations.wiped_votes && old.role == Role::Voter {
            // MUTANT (test-only): the old identity, as a learner until it caught up.
            self.disk = Disk::new(Identity {
                role: Role::Learner,
                ..old
            });
            self.mutant_identity = Some(old);
        } else {
            self.disk = Disk::new(new_identity);
            self.mutant_identity = None;
        }
        self.generation += 1;
    }

    // ---------------------------------------------------------------- helpers

    fn write(&mut self, r: Record) {
        self.accepted.apply(&r);
        self.disk.records.push(r);
    }

    fn start_fsync(&mut self, out: &mut Out) {
        assert!(self.fsync.is_none(), "one fdatasync at a time");
        self.fsync = Some((self.disk.records.len(), self.submitted));
        out.later.push(Later::Fsync {
            store: self.index,
            boot: self.boot,
            generation: self.generation,
        });
    }

    fn wait(&mut self, w: Waiter, out: &mut Out) {
        if w.needed() <= self.durable_seq {
            self.answer(w, true, out);
        } else {
            self.waiters.push_back(w);
        }
    }

    fn fail(&mut self, fault: DiskFault, out: &mut Out) {
        self.failed = Some(fault);
        self.fsync = None;
        // Every submission is resolved (with the error): nothing waits any more.
        self.durable_seq = self.submitted;
        self.generation += 1;
        self.accepted = self.disk.durable_log.clone();
        out.seen.push(Seen::Note(format!(
            "{}: {fault:?}: the log failed (fail-stop)",
            self.node()
        )));
        while let Some(w) = self.waiters.pop_front() {
            self.answer(w, false, out);
        }
    }

    fn answer(&mut self, w: Waiter, durable: bool, out: &mut Out) {
        match w {
            Waiter::Persisted {
                to,
                to_boot,
                meta,
                through,
                ..
            } => {
                if durable {
                    self.mutant_refresh();
                    let ack = PersistedAck {
                        epoch: meta.epoch,
                        through_offset: through,
                        store_id: self.replica.store_id(),
                        incarnation: self.replica.incarnation(),
                        voter: self.replica.role().is_voter(),
                    };
                    out.answer(to, to_boot, Msg::Persisted { meta, ack });
                } else {
                    out.answer(to, to_boot, self.rejected(meta, RejectReason::LogFailed));
                }
            }
            Waiter::Fence {
                to,
                to_boot,
                epoch,
                last,
                tail_cut,
                ..
            } => {
                let last = if durable {
                    last
                } else {
                    self.disk.durable_log.last()
                };
                out.answer(
                    to,
                    to_boot,
                    Msg::FenceGranted(FenceGranted {
                        epoch,
                        last,
                        store_id: self.replica.store_id(),
                        incarnation: self.replica.incarnation(),
                        tail_cut,
                    }),
                );
            }
        }
    }

    /// Clears the tail-cut mark once the durable log holds an entry of an epoch above the
    /// promised epoch at the cut: a later master wrote it, and by log matching this store
    /// then holds that master's adopted log, which has every event the lost records could
    /// have helped stabilize.
    fn clear_tail_cut(&mut self, out: &mut Out) {
        let Some(cut) = self.disk.tail_cut else {
            return;
        };
        if self
            .disk
            .durable_log
            .last()
            .is_some_and(|l| l.epoch > cut.promised)
        {
            self.disk.tail_cut = None;
            out.seen.push(Seen::Note(format!(
                "{}: tail-cut mark (offset {}, promised {:#x}) cleared",
                self.node(),
                cut.offset.0,
                cut.promised.0
            )));
        }
    }

    fn rejected(&self, meta: AppendMeta, reason: RejectReason) -> Msg {
        Msg::Rejected {
            meta,
            rejected: AppendRejected {
                reason,
                promised: self.replica.promised(),
                last: self.accepted.last(),
            },
        }
    }

    fn not_voter(&self, epoch: Epoch) -> Msg {
        Msg::NotVoter {
            epoch,
            store_id: self.replica.store_id(),
            incarnation: self.replica.incarnation(),
        }
    }

    /// The wiped-votes mutation: a wiped store that kept its old identity becomes a voter
    /// again once its log reaches the HWM it heard (or at once if it heard none).
    fn mutant_refresh(&mut self) {
        let Some(old) = self.mutant_identity else {
            return;
        };
        let caught_up = self
            .replica
            .hwm()
            .is_none_or(|h| self.disk.durable_log.last().is_some_and(|l| l.offset >= h));
        if caught_up {
            self.mutant_identity = None;
            self.mutated_acks += 1;
            self.disk.identity = old;
            let hwm = self.replica.hwm();
            self.replica = Replica::new(
                old.store_id,
                old.incarnation,
                Role::Voter,
                self.disk.promised,
            );
            if let Some(h) = hwm {
                self.replica.learn_hwm(self.disk.promised, Some(h));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use quire_broker::core::AppendId;
    use quire_proto::EventKind;

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
            StoreMutations {
                through_end,
                wiped_votes: false,
            },
        )
    }

    /// The claim a store makes when it accepts `req`.
    fn claim(s: &mut SimStore, meta: AppendMeta, req: AppendRequest) -> (Offset, Option<Epoch>) {
        let mut out = Out::default();
        s.on_append(NodeId::Broker(0), 1, meta, req, &mut out);
        out.seen
            .into_iter()
            .find_map(|seen| match seen {
                Seen::AckClaim { through, held, .. } => Some((through, held)),
                _ => None,
            })
            .expect("an accepted append makes a claim")
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
            assert_eq!(s.accepted.len(), 3);
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
        assert!(s.disk.tail_cut.is_some(), "not before the entry is durable");
        let generation = s.generation;
        s.on_fsync_done(generation, &mut out);
        assert_eq!(s.disk.tail_cut, None);
        assert_eq!(s.voting_log().map(|(l, m)| (l.len(), m)), Some((2, false)));
    }
}
