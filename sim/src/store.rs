//! A simulated event store: quire-node's own store engine ([`Engine`]) and its own WAL
//! ([`Wal`]) on a crash-tracking in-memory disk ([`CrashDisk`]).
//!
//! # What is real and what is simulated
//! Every decision is the engine's — the same [`Engine`] `quire-node`'s store actor drives:
//! log matching and fences ([`quire_node::replica::Replica`]), promise-before-write,
//! group-commit waiters, fail-stop, fence answers, tail-cut clearing. Every byte is the
//! WAL's: the segment format, padding, checksums, truncation markers, segment rolls and
//! preallocation, group commit on the commit thread, the recovery scan and its torn-tail
//! cut, the promised-epoch, identity and tail-cut files, and the start-up steps
//! ([`startup::open_data_dir`], the same function `quire-node` runs). Submissions go
//! through [`Submissions`], the node's own code from `Command::Submit` to
//! `Engine::resolved`.
//!
//! This module is only the driver, as `node/src/store.rs` is the tokio one. The WAL's
//! commit thread runs on a [`StepDisk`]: writes happen at once, each fdatasync is held
//! until the simulation completes it at a simulated time ([`Later::Fsync`]), and the
//! driver waits for the commit thread to settle after every step, so a run is a function
//! of its seed. What the simulator decides, from its seed:
//! - **crashes**: the disk loses power ([`CrashDisk::crash_after`] `0`), then keeps its
//!   durable bytes and, of the un-synced writes, a prefix in write order
//!   ([`CrashMode::Prefix`]: a torn write the next start cuts and marks) or nothing
//!   ([`CrashMode::Durable`], where liveness mode forbids a mark);
//! - **disk faults**: the next fdatasync fails with EIO, or the next write with ENOSPC
//!   ([`CrashDisk::fail_syncs`], [`CrashDisk::fail_writes`]): the WAL fails (fail-stop);
//! - **bit flips** in a stopped store's durable entry, on the medium
//!   ([`CrashDisk::poke`]): a checksum that no longer matches, which the next start's scan
//!   finds — corruption before the last record (the store refuses to start), a torn tail
//!   in the last one (off by default, see [`crate::FaultSet::tail_flips`]);
//! - **wipes**: a new disk and `quire-node init` with a new identity.
//!
//! What the store will vote with after its next start ([`SimStore::voting_log`]) is the
//! real start-up run on a fork of its disk.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;

use quire_node::config::Limits;
use quire_node::engine::{Command, Engine, Mutations};
use quire_node::replica::Replica;
use quire_node::startup::{self, Opened};
use quire_node::submissions::Submissions;
use quire_node::Role;
use quire_proto::{
    Body, Epoch, ErrorCode, Event, FenceRequest, Incarnation, Offset, ReadRequest, StoreId, TailCut,
};
use quire_wal::disk::{StepControl, StepDisk};
use quire_wal::storage::{CrashFile, CrashMode};
use quire_wal::{CrashDisk, PromisedEpoch, RecordStatus, Storage, Wal, WalConfig, WalError};

use crate::msg::{AppendMeta, Msg, NodeId, ReadPurpose};
use crate::out::{Later, Out, Seen};
use crate::rng::SimRng;

/// The data directory of every simulated store, on its own disk.
const DATA_DIR: &str = "/store";
/// Its WAL directory.
const WAL_DIR: &str = "/store/wal";
/// Segment size of the simulated WALs, in bytes: the smallest the WAL takes, so runs roll
/// segments often.
const SEGMENT_BYTES: u64 = quire_wal::SEGMENT_BYTES_MIN;

/// A store's durable log and whether it carries a tail-cut mark.
type VotingLog = (Vec<Event>, bool);

/// The store's identity file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) store_id: StoreId,
    pub(crate) incarnation: Incarnation,
    pub(crate) role: Role,
}

/// How a start after a stop went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StartOutcome {
    /// Serving; `cut`: the recovery cut a torn tail and marked the store with this.
    Started {
        /// The mark this start wrote, if its recovery cut a tail.
        cut: Option<TailCut>,
        /// The lowest entry the cut dropped whose bits were flipped while a later entry
        /// followed it: sealed data the recovery took for a torn tail (a WAL bug).
        cut_sealed: Option<Offset>,
    },
    /// The recovery scan found a bad record before valid ones: the store refuses to start.
    Corrupt {
        /// The offset the log expected at the bad record.
        offset: Offset,
    },
}

/// A disk fault armed for the running store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DiskFault {
    /// The next fdatasync fails with EIO.
    FsyncEio,
    /// The next write fails with ENOSPC.
    Enospc,
}

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
    Tail(u64),
}

/// A running store process: its WAL, its files and its engine.
struct Running {
    wal: Wal<CrashDisk>,
    control: StepControl,
    promised: PromisedEpoch<CrashDisk>,
    engine: Engine<Token>,
    submissions: Submissions,
}

impl Drop for Running {
    /// The commit thread ends only once no fdatasync is held: complete them all (they fail
    /// on a crashed disk) so the WAL's drop can join it.
    fn drop(&mut self) {
        while self.control.held_syncs() > 0 {
            self.control.complete_all_syncs();
            self.control.settle();
        }
    }
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("last", &self.wal.last())
            .field("last_durable", &self.wal.last_durable())
            .finish_non_exhaustive()
    }
}

/// One simulated store. See the module docs.
#[derive(Debug)]
pub(crate) struct SimStore {
    pub(crate) index: u8,
    /// Whether the process runs.
    pub(crate) up: bool,
    /// Incarnation of the process (bumped at every start).
    pub(crate) boot: u32,
    /// The medium: it outlives the process.
    disk: CrashDisk,
    /// The identity file as last written (kept in memory to answer without a read).
    identity: Identity,
    running: Option<Running>,
    mutations: Mutations,
    /// Planted bugs of the WAL (none by default).
    wal_mutations: quire_wal::Mutations,
    next_token: u64,
    /// The append being fed to the engine, and whether it was answered while fed.
    feeding: Option<(u64, bool)>,
    /// For each unanswered append, the epochs the accepted log held at the offsets its ack
    /// may name (its `through` and the log's end), as it accepted it.
    claims: BTreeMap<u64, Vec<(Offset, Option<Epoch>)>>,
    /// An fdatasync completion is scheduled.
    fsync_scheduled: bool,
    generation: u64,
    armed: Option<DiskFault>,
    /// What the next start would vote with, computed on a fork of the stopped disk.
    predicted: RefCell<Option<Option<VotingLog>>>,
    /// Answers a mutation changed (an ack with another `through`, an answer under another
    /// identity than the one on disk).
    pub(crate) mutated_acks: u64,
    /// Trims the engine asked for.
    pub(crate) trims: u64,
    /// Offsets of entries whose bits were flipped since the last start while a later
    /// entry followed them on the medium (sealed data: corruption, never a torn tail).
    pub(crate) sealed_flips: Vec<Offset>,
}

fn wal_config() -> WalConfig {
    WalConfig {
        dir: WAL_DIR.into(),
        segment_bytes_max: SEGMENT_BYTES,
        batch_window_us: 0,
        // As quire-node runs it.
        stagger_rolls: true,
        ..WalConfig::default()
    }
}

/// `quire-node init` on `disk`: the data directory and its identity file.
fn init(disk: &CrashDisk, id: Identity) {
    disk.create_dir_all(Path::new(WAL_DIR))
        .and_then(|()| disk.sync_dir(Path::new(DATA_DIR)))
        .expect("invariant: init on a fresh simulated disk succeeds");
    PromisedEpoch::create_in(disk.clone(), Path::new(WAL_DIR))
        .expect("invariant: init on a fresh simulated disk succeeds");
    store_identity(disk, id);
}

/// Writes the identity file (as `init` does, and as a store that becomes a learner does).
fn store_identity(disk: &CrashDisk, id: Identity) {
    let identity = quire_node::Identity {
        store_id: id.store_id,
        incarnation: id.incarnation,
        role: id.role,
        created_ms: 0,
    };
    identity
        .store_in(disk, Path::new(DATA_DIR))
        .expect("invariant: identity writes on a simulated disk succeed");
}

/// Opens the data directory on `disk` as `quire-node` starts: `step` for the running
/// store, `None` for a prediction on a fork.
fn open(
    disk: &CrashDisk,
    step: Option<StepDisk<CrashFile>>,
    mutations: quire_wal::Mutations,
) -> Result<Opened<CrashDisk>, startup::StartError> {
    startup::open_data_dir(
        disk.clone(),
        Path::new(DATA_DIR),
        wal_config(),
        step.map(|s| Box::new(s) as Box<dyn quire_wal::disk::Disk<_>>),
        mutations,
    )
}

/// Every durable entry of `wal`, from its first offset.
fn durable_events(wal: &Wal<CrashDisk>) -> Vec<Event> {
    let mut events = Vec::new();
    let mut from = wal.first_offset();
    loop {
        let records = match wal.read(from, 4096, u64::MAX) {
            Ok(r) if !r.is_empty() => r,
            _ => return events,
        };
        from = Offset(records[records.len() - 1].offset.0 + 1);
        events.extend(records);
    }
}

impl SimStore {
    /// A new, empty, running store with this identity; `mutations` go to its engine,
    /// `wal_mutations` to its WAL.
    pub(crate) fn new(
        index: u8,
        identity: Identity,
        mutations: Mutations,
        wal_mutations: quire_wal::Mutations,
    ) -> SimStore {
        let disk = CrashDisk::new(u64::from(index));
        disk.set_alignment(4096);
        init(&disk, identity);
        let mut s = SimStore {
            index,
            up: false,
            boot: 0,
            disk,
            identity,
            running: None,
            mutations,
            wal_mutations,
            next_token: 0,
            feeding: None,
            claims: BTreeMap::new(),
            trims: 0,
            sealed_flips: Vec::new(),
            fsync_scheduled: false,
            generation: 0,
            armed: None,
            predicted: RefCell::new(None),
            mutated_acks: 0,
        };
        let started = s.start();
        assert_eq!(
            started,
            StartOutcome::Started {
                cut: None,
                cut_sealed: None
            }
        );
        s
    }

    fn node(&self) -> NodeId {
        NodeId::Store(self.index)
    }

    fn running(&mut self) -> &mut Running {
        self.running
            .as_mut()
            .expect("invariant: requests reach running stores only")
    }

    /// The identity the store answers under: its engine's (the one on disk, unless a
    /// mutation took another on), role included; the identity file's while stopped.
    pub(crate) fn identity(&self) -> Identity {
        match &self.running {
            Some(r) => {
                let replica = r.engine.replica();
                Identity {
                    store_id: replica.store_id(),
                    incarnation: replica.incarnation(),
                    role: replica.role(),
                }
            }
            None => self.identity,
        }
    }

    /// The durable log this store will vote with after its next start, and whether it will
    /// carry a tail-cut mark; `None` if the next start will refuse. Running: its durable
    /// log and its mark. Stopped: what the real start-up finds on a fork of the disk.
    pub(crate) fn voting_log(&self) -> Option<VotingLog> {
        if let Some(r) = &self.running {
            return Some((durable_events(&r.wal), r.engine.tail_cut().is_some()));
        }
        self.predict().clone()
    }

    /// Whether the store carries a tail-cut mark or will at its next start; `None` if the
    /// next start will refuse.
    pub(crate) fn marked(&self) -> Option<bool> {
        if let Some(r) = &self.running {
            return Some(r.engine.tail_cut().is_some());
        }
        self.predict().as_ref().map(|(_, m)| *m)
    }

    /// The real start-up on a fork of the stopped store's disk (cached until the disk
    /// changes).
    fn predict(&self) -> std::cell::RefMut<'_, Option<VotingLog>> {
        let mut cache = self.predicted.borrow_mut();
        if cache.is_none() {
            let fork = self.disk.fork();
            *cache = Some(match open(&fork, None, self.wal_mutations) {
                Ok(opened) => Some((durable_events(&opened.wal), opened.tail_cut.is_some())),
                Err(e) if e.is_corruption() => None,
                Err(e) => panic!("invariant: a simulated store starts or finds corruption: {e}"),
            });
        }
        std::cell::RefMut::map(cache, |c| c.as_mut().expect("just filled"))
    }

    /// Whether the log has failed (fail-stop).
    pub(crate) fn is_failed(&self) -> bool {
        self.running.as_ref().is_some_and(|r| r.wal.is_failed())
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
        let r = self.running();
        r.engine.append(token, req, &r.wal);
        self.drain(out);
        if self.feeding.take() == Some((id, false)) {
            // Waiting for durability: its ack claims what the accepted log holds now.
            let wal = &self.running().wal;
            let points = meta
                .through
                .into_iter()
                .chain(wal.last().map(|l| l.offset))
                // Below the log's start (retention deleted it) nothing can be claimed.
                .filter(|&o| o >= wal.first_offset())
                .map(|o| (o, wal.entry_epoch(o)))
                .collect();
            self.claims.insert(id, points);
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
        let r = self.running();
        r.engine.fence(token, req, &r.wal);
        self.drain(out);
    }

    /// A bootstrap probe's tail request from `from`.
    pub(crate) fn on_tail(&mut self, from: NodeId, from_boot: u32, generation: u64, out: &mut Out) {
        let token = self.token(from, from_boot, Request::Tail(generation));
        let r = self.running();
        r.engine.tail(token, &r.wal);
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
        let req = ReadRequest {
            from: first,
            max_events: u32::try_from(max_events).unwrap_or(u32::MAX),
            max_bytes: u32::MAX,
        };
        // The node's own read path (its connection handler calls the same function).
        let read = match quire_node::serve_read(&self.running().wal, &req, &Limits::default()) {
            Body::ReadResponse(r) => Some(r),
            _ => None,
        };
        out.answer(
            from,
            from_boot,
            Msg::ReadResult {
                purpose,
                from: first,
                read,
            },
        );
    }

    // ---------------------------------------------------------------- disk completions

    /// The fdatasync scheduled in generation `generation` completes (with EIO if that
    /// fault is armed).
    pub(crate) fn on_fsync_done(&mut self, generation: u64, out: &mut Out) {
        if generation != self.generation || !self.fsync_scheduled {
            return;
        }
        self.fsync_scheduled = false;
        let eio = self.armed == Some(DiskFault::FsyncEio);
        if eio {
            self.armed = None;
            self.disk.fail_syncs(Some(libc::EIO));
        }
        // Everything the disk holds completes together: an fdatasync, and after a segment
        // roll also the old segment's and the directory's fsync, in flight at once as on
        // a real device.
        let r = self.running();
        r.control.complete_all_syncs();
        r.control.settle();
        if eio {
            self.disk.fail_syncs(None);
            self.note_failed(DiskFault::FsyncEio, out);
        }
        self.take_resolved(out);
    }

    // ---------------------------------------------------------------- engine commands

    /// Executes the engine's commands until it has none, then lets the commit thread run
    /// what they queued and reports what resolved.
    fn drain(&mut self, out: &mut Out) {
        loop {
            let commands = self.running().engine.take_commands();
            if commands.is_empty() {
                break;
            }
            for c in commands {
                self.execute(c, out);
            }
        }
        assert!(
            !self.running().engine.is_blocked(),
            "invariant: the simulated store persists promises and roles at once"
        );
    }

    /// Reports to the engine every WAL append that resolved, drains what that releases,
    /// and schedules the next fdatasync completion if one is held.
    fn take_resolved(&mut self, out: &mut Out) {
        let r = self.running();
        r.submissions.report_ready(&mut r.engine, &r.wal);
        self.drain(out);
        self.schedule_fsync(out);
    }

    fn execute(&mut self, command: Command<Token>, out: &mut Out) {
        match command {
            Command::PersistPromise(epoch) => {
                let r = self.running();
                let stored = r.promised.store(epoch).map_err(|e| e.to_string());
                assert!(
                    stored.is_ok(),
                    "invariant: promise writes do not fail in the simulation: {stored:?}"
                );
                r.engine.promise_persisted(stored, &r.wal);
            }
            Command::Submit {
                seq, epoch, events, ..
            } => self.submit(seq, epoch, events, out),
            Command::Answer { token, body } => self.answer(token, body, out),
            Command::Trim { before } => {
                self.trims += 1;
                // A failed trim keeps the segments; the next trim point retries.
                let _ = self.running().wal.trim_before(before);
            }
            Command::ClearTailCut(cut) => {
                let cleared = quire_node::tail_cut::clear_in(&self.disk, Path::new(DATA_DIR));
                assert!(
                    cleared.is_ok(),
                    "invariant: clearing the mark does not fail in the simulation: {cleared:?}"
                );
                out.seen.push(Seen::Note(format!(
                    "{}: tail-cut mark (offset {}, promised {:#x}) cleared",
                    self.node(),
                    cut.offset.0,
                    cut.promised.0
                )));
                self.running().engine.tail_cut_cleared(true);
            }
        }
    }

    /// Hands submission `seq` to the WAL (with ENOSPC on its write if that fault is armed)
    /// and lets the commit thread write it.
    fn submit(&mut self, seq: u64, epoch: Epoch, events: Vec<Event>, out: &mut Out) {
        let enospc = self.armed == Some(DiskFault::Enospc);
        if enospc {
            self.armed = None;
            self.disk.fail_writes(Some(libc::ENOSPC));
        }
        let r = self.running();
        r.submissions
            .submit(&mut r.engine, &r.wal, seq, epoch, events);
        r.control.settle();
        if enospc {
            self.disk.fail_writes(None);
            self.note_failed(DiskFault::Enospc, out);
        }
        // Refusals and failures resolve at once; the next commands come from the engine.
        let r = self.running();
        r.submissions.report_ready(&mut r.engine, &r.wal);
        self.schedule_fsync(out);
    }

    fn note_failed(&mut self, fault: DiskFault, out: &mut Out) {
        if self.running().wal.is_failed() {
            out.seen.push(Seen::Note(format!(
                "{}: {fault:?}: the log failed (fail-stop)",
                self.node()
            )));
        }
    }

    /// Schedules the completion of the fdatasync the commit thread holds, if any.
    fn schedule_fsync(&mut self, out: &mut Out) {
        if self.fsync_scheduled || self.running().control.held_syncs() == 0 {
            return;
        }
        self.fsync_scheduled = true;
        out.later.push(Later::Fsync {
            store: self.index,
            boot: self.boot,
            generation: self.generation,
        });
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
        let on_disk = self.identity;
        let msg = match (request, body) {
            (Request::Append(meta), Body::PersistedAck(ack)) => {
                if ack.through_offset != meta.through
                    || (ack.store_id, ack.incarnation) != (on_disk.store_id, on_disk.incarnation)
                {
                    self.mutated_acks += 1;
                }
                if let (Some(t), NodeId::Broker(broker)) = (ack.through_offset, to) {
                    // What the store held at `t` when it accepted the append — unknown if
                    // retention deleted it since (below a stabilized trim point).
                    let wal = &self.running().wal;
                    let held = claim
                        .and_then(|points| points.iter().find(|p| p.0 == t).map(|p| p.1))
                        .or_else(|| (t >= wal.first_offset()).then(|| wal.entry_epoch(t)));
                    if let Some(held) = held {
                        out.seen.push(Seen::AckClaim {
                            store: self.index,
                            broker,
                            boot: to_boot,
                            epoch: meta.epoch,
                            through: t,
                            held,
                        });
                    }
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
                let r = self.running().engine.replica();
                Msg::NotVoter {
                    epoch,
                    store_id: r.store_id(),
                    incarnation: r.incarnation(),
                }
            }
            // An internal error (a promise or role write that failed): not simulated.
            (Request::Fence(_), other) => unreachable!("a fence answered {other:?}"),
            (Request::Tail(generation), Body::TailResponse(t)) => Msg::TailAnswer {
                generation,
                last: t.last,
                voter: t.voter,
            },
            (Request::Tail(_), other) => unreachable!("a tail request answered {other:?}"),
        };
        out.answer(to, to_boot, msg);
    }

    // ---------------------------------------------------------------- faults

    /// The process dies and the machine loses power: the disk keeps its durable bytes and,
    /// of the rest, a prefix in write order (`tear`) or nothing (module docs). `rng` seeds
    /// the disk's choice.
    pub(crate) fn crash(&mut self, rng: &mut SimRng, tear: bool) {
        if let Some(r) = self.running.take() {
            // Held fdatasyncs then run against the dead disk and fail (`Running`'s drop).
            self.disk.crash_after(0);
            drop(r);
        }
        self.disk.reseed(rng.next_u64());
        self.disk.set_mode(if tear {
            CrashMode::Prefix
        } else {
            CrashMode::Durable
        });
        self.disk.crash();
        self.up = false;
        self.armed = None;
        self.reset();
    }

    /// Forgets everything volatile of the process.
    fn reset(&mut self) {
        self.running = None;
        self.claims.clear();
        self.feeding = None;
        self.fsync_scheduled = false;
        self.generation += 1;
        self.predicted.replace(None);
    }

    /// Flips one bit of a stopped store's durable entry on the medium: in its checksum or
    /// its payload. Without `tail_flips`, only entries before the last one (sealed data; a
    /// flip in the last record reads as a torn write). Returns the entry's offset, or
    /// `None` if there is no entry to flip.
    pub(crate) fn flip_bit(&mut self, tail_flips: bool, rng: &mut SimRng) -> Option<Offset> {
        assert!(!self.up, "bits are flipped in a stopped store");
        // Where each live entry's record is: the scan visits records in file order, so a
        // later record of an offset (after a truncation marker) replaces an earlier one.
        let mut at: BTreeMap<u64, (std::path::PathBuf, u64, u64)> = BTreeMap::new();
        let report = quire_wal::scan::scan_dir_in(&self.disk, Path::new(WAL_DIR), &mut |r| match (
            r.status, r.header,
        ) {
            (RecordStatus::Entry, Some(h)) => {
                at.insert(
                    h.offset.0,
                    (
                        r.segment.to_path_buf(),
                        r.position.0,
                        r.payload.len() as u64,
                    ),
                );
            }
            (RecordStatus::Marker { .. }, Some(h)) => {
                at.retain(|&o, _| o < h.offset.0);
            }
            _ => {}
        })
        .ok()?;
        let last = report.last?.offset.0;
        at.retain(|&o, _| o <= last && (tail_flips || o < last));
        if at.is_empty() {
            return None;
        }
        let pick = rng.index(at.len());
        let (&offset, (path, position, payload)) = at.iter().nth(pick)?;
        if offset < last {
            self.sealed_flips.push(Offset(offset));
        }
        // One of the checksum's 4 bytes or a payload byte.
        let k = rng.range(0, 3 + payload);
        let byte = if k < 4 { k } else { 32 + (k - 4) };
        let contents = self.disk.contents(path)?;
        let old = *contents.get(usize::try_from(position + byte).ok()?)?;
        let bit = 1u8 << rng.range(0, 7);
        self.disk.poke(path, position + byte, &[old ^ bit]).ok()?;
        self.predicted.replace(None);
        Some(Offset(offset))
    }

    /// Starts the process on its disk: the real start-up (identity, promise, tail-cut mark,
    /// WAL recovery), then serving with a new engine.
    pub(crate) fn start(&mut self) -> StartOutcome {
        assert!(!self.up, "start of a running store");
        let (step, control) = StepDisk::new();
        let sealed_flips = std::mem::take(&mut self.sealed_flips);
        let opened = match open(&self.disk, Some(step), self.wal_mutations) {
            Ok(o) => o,
            Err(startup::StartError::Wal {
                source: WalError::Corruption { offset, .. },
                ..
            }) => return StartOutcome::Corrupt { offset },
            Err(e) => panic!("invariant: a simulated store starts or finds corruption: {e}"),
        };
        let cut = opened.report.torn_tail.as_ref().and(opened.tail_cut);
        let cut_sealed = cut.and_then(|c| {
            sealed_flips
                .iter()
                .copied()
                .filter(|&o| o >= c.offset)
                .min()
        });
        let id = opened.identity;
        self.identity = Identity {
            store_id: id.store_id,
            incarnation: id.incarnation,
            role: id.role,
        };
        let replica = Replica::new(
            id.store_id,
            id.incarnation,
            id.role,
            opened.promised.epoch(),
        );
        self.reset();
        self.running = Some(Running {
            engine: Engine::new(replica, opened.tail_cut, self.mutations),
            wal: opened.wal,
            control,
            promised: opened.promised,
            submissions: Submissions::new(),
        });
        self.boot += 1;
        self.up = true;
        StartOutcome::Started { cut, cut_sealed }
    }

    /// The operator replaces the disk and runs `quire-node init`: an empty store with a new
    /// identity (a new store id and incarnation), which starts stopped.
    pub(crate) fn reinitialise(&mut self, new_identity: Identity) {
        assert!(!self.up, "a running store's disk is not replaced");
        self.disk = CrashDisk::new(u64::from(self.index));
        self.disk.set_alignment(4096);
        self.sealed_flips.clear();
        init(&self.disk, new_identity);
        self.identity = new_identity;
        self.reset();
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
            payload: Bytes::from(format!("{epoch}/{offset}")).into(),
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

    fn durable_len(s: &SimStore) -> u64 {
        s.voting_log().expect("started").0.len() as u64
    }

    fn mark_on_disk(s: &SimStore) -> Option<TailCut> {
        quire_node::tail_cut::load_in(&s.disk, Path::new(DATA_DIR)).expect("readable")
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
            quire_wal::Mutations::default(),
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
            assert_eq!(durable_len(&s), 3);
            // Written, never synced: a truncation and two entries of epoch 2.
            let (meta, req) = append(2, Some((1, 0)), vec![ev(2, 1), ev(2, 2)]);
            s.on_append(NodeId::Broker(0), 1, meta, req, &mut out);
            assert_eq!(s.running().wal.next_offset(), Offset(3));
            s.crash(&mut rng, true);
            let StartOutcome::Started { cut, .. } = s.start() else {
                panic!("the store starts")
            };
            if let Some(cut) = cut {
                // A torn write: the mark names where the cut began and the promise then.
                assert_eq!(cut.offset.0, durable_len(&s));
                assert_eq!(cut.promised, Epoch(2));
            }
            let epochs: Vec<u64> = s
                .voting_log()
                .expect("started")
                .0
                .iter()
                .map(|e| e.epoch.0)
                .collect();
            assert!(
                [vec![1, 1, 1], vec![1], vec![1, 2], vec![1, 2, 2]].contains(&epochs),
                "{epochs:?}"
            );
            assert_eq!(
                s.running().promised.epoch(),
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
        // A flip lands on either record: take the first seed whose flip hits the last one.
        let mut s = (0..)
            .find_map(|seed| {
                let mut rng = SimRng::new(seed);
                let mut s = store(false);
                let mut out = Out::default();
                let (meta, req) = append(1, None, (0..2).map(|o| ev(1, o)).collect());
                s.on_append(NodeId::Broker(0), 1, meta, req, &mut out);
                let generation = s.generation;
                s.on_fsync_done(generation, &mut out);
                s.crash(&mut rng, true);
                (s.flip_bit(true, &mut rng) == Some(Offset(1))).then_some(s)
            })
            .expect("some seed flips the last record");
        assert_eq!(s.voting_log().map(|(l, m)| (l.len(), m)), Some((1, true)));
        let StartOutcome::Started { cut, .. } = s.start() else {
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
            mark_on_disk(&s).is_some(),
            "not before the entry is durable"
        );
        let generation = s.generation;
        s.on_fsync_done(generation, &mut out);
        assert_eq!(mark_on_disk(&s), None);
        assert_eq!(s.voting_log().map(|(l, m)| (l.len(), m)), Some((2, false)));
    }
}
