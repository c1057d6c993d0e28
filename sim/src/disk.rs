//! A store's simulated disk and WAL, at the level of log entries: what was written, what is
//! durable, and what a crash, a bit flip or a wipe leaves. No decision of the store here:
//! [`crate::store`] drives the real store engine over it, through [`SimWal`]'s
//! [`StoreLog`].
//!
//! The disk holds a sequence of records in file order — entries and truncation markers, as
//! the WAL writes them — and how many of them are durable. Replaying the records gives the
//! log. A crash keeps the durable records and a random prefix of the unsynced ones (a torn
//! write of the last batch cuts it anywhere; the WAL's recovery scan keeps exactly such a
//! prefix, `quire-wal` tests that byte by byte). The promised epoch, the store's identity
//! and role and its tail-cut mark are durable values. A bit flip is injected into a stopped
//! store's durable entries; at the next start the store finds it (a record with a bad
//! checksum followed by valid ones is corruption to the WAL) and refuses to start, and the
//! operator re-initialises it: a new identity, which never votes again. A flip in the
//! *last* record cannot be told from a torn write by the WAL's scan;
//! [`crate::FaultSet::tail_flips`] models that faithfully (the record is cut as a torn
//! tail) and is off by default — see docs/testing.md.
//!
//! As quire-node's start-up does, a store whose recovery cut a torn tail — a crash that
//! tore a write in the middle of the unsynced records, or a flip in the last record —
//! writes a durable tail-cut mark first, and drops one already satisfied. A crash that lost
//! every unsynced record with nothing of them on the medium cuts nothing and leaves no mark.

use quire_node::engine::StoreLog;
use quire_node::replica::LogView;
use quire_node::{tail_cut, Role};
use quire_proto::{Epoch, Event, Incarnation, LogPosition, Offset, StoreId, TailCut};

use crate::rng::SimRng;

/// The store's log as a vector of entries from offset 0 (stores are never trimmed in a
/// simulated run), with its epoch runs.
#[derive(Clone, Debug, Default)]
pub(crate) struct EntryLog {
    entries: Vec<Event>,
    /// `(epoch, first offset)` of each run of entries of one epoch, in log order.
    runs: Vec<(Epoch, Offset)>,
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
                while self.runs.last().is_some_and(|&(_, first)| first >= *at) {
                    self.runs.pop();
                }
            }
            Record::Entry(e) => {
                assert_eq!(e.offset.0, self.len(), "records replay contiguously");
                if self.runs.last().is_none_or(|&(epoch, _)| epoch != e.epoch) {
                    self.runs.push((e.epoch, e.offset));
                }
                self.entries.push(e.clone());
            }
        }
    }

    /// Cuts the log to its first `len` entries.
    fn cut(&mut self, len: u64) {
        self.apply(&Record::Truncate(Offset(len)));
    }

    /// The epochs of the log as they are now, cheap to keep (one pair per epoch run).
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            runs: self.runs.clone(),
            len: self.len(),
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

/// The epochs of an [`EntryLog`] at one moment.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    runs: Vec<(Epoch, Offset)>,
    len: u64,
}

impl Snapshot {
    /// The epoch of the entry at `offset` then, `None` past the end.
    pub(crate) fn entry_epoch(&self, offset: Offset) -> Option<Epoch> {
        if offset.0 >= self.len {
            return None;
        }
        let i = self.runs.partition_point(|&(_, first)| first <= offset);
        Some(self.runs[i.checked_sub(1)?].0)
    }
}

/// One record in file order.
#[derive(Clone, Debug)]
pub(crate) enum Record {
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
pub(crate) struct Disk {
    /// The identity file.
    pub(crate) identity: Identity,
    /// The promised epoch file.
    pub(crate) promised: Epoch,
    /// Records in file order: written (the prefix `..durable` is durable).
    records: Vec<Record>,
    durable: usize,
    /// Replay of `records[..durable]`.
    pub(crate) durable_log: EntryLog,
    /// A bit flipped in the durable entry at this offset (injected while stopped).
    flipped: Option<Offset>,
    /// A crash tore a write: the next start's recovery cuts a torn tail that begins at this
    /// offset (and marks the store).
    torn: Option<Offset>,
    /// The durable tail-cut mark.
    pub(crate) tail_cut: Option<TailCut>,
}

impl Disk {
    pub(crate) fn new(identity: Identity) -> Disk {
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

/// The simulated WAL as the engine sees it: the accepted log (written, durable or not),
/// the disk's durable log, and whether the log failed.
#[derive(Debug)]
pub(crate) struct SimWal {
    /// What survives a crash.
    pub(crate) disk: Disk,
    /// The accepted log: every record written, durable or not (the durable one once failed).
    pub(crate) accepted: EntryLog,
    /// Why the log failed, if it did.
    pub(crate) failed: Option<DiskFault>,
}

impl LogView for SimWal {
    fn entry_epoch(&self, offset: Offset) -> Option<Epoch> {
        self.accepted.entry_epoch(offset)
    }
    fn last(&self) -> Option<LogPosition> {
        self.accepted.last()
    }
    fn first_offset(&self) -> Offset {
        self.accepted.first_offset()
    }
}

impl StoreLog for SimWal {
    fn last_durable(&self) -> Option<LogPosition> {
        self.disk.durable_log.last()
    }
    fn is_failed(&self) -> bool {
        self.failed.is_some()
    }
}

impl SimWal {
    /// An empty WAL on a new disk with this identity.
    pub(crate) fn new(identity: Identity) -> SimWal {
        SimWal {
            disk: Disk::new(identity),
            accepted: EntryLog::default(),
            failed: None,
        }
    }

    /// Writes `events` (unsynced), after a truncation marker if the first replaces an
    /// accepted entry (as the WAL does). Returns whether it truncated.
    pub(crate) fn write(&mut self, events: Vec<Event>) -> bool {
        let first = events.first().map(|e| e.offset);
        let truncates = first.filter(|f| f.0 < self.accepted.len());
        if let Some(at) = truncates {
            self.push(Record::Truncate(at));
        }
        for e in events {
            self.push(Record::Entry(e));
        }
        truncates.is_some()
    }

    fn push(&mut self, r: Record) {
        self.accepted.apply(&r);
        self.disk.records.push(r);
    }

    /// Records written so far (an fdatasync issued now covers them).
    pub(crate) fn written(&self) -> usize {
        self.disk.records.len()
    }

    /// An fdatasync that covers the first `records` records completed.
    pub(crate) fn synced(&mut self, records: usize) {
        let disk = &mut self.disk;
        for r in &disk.records[disk.durable..records] {
            disk.durable_log.apply(r);
        }
        disk.durable = records;
    }

    /// The disk failed: the log is failed until a restart and its accepted view falls back
    /// to the durable one, as the WAL's does.
    pub(crate) fn fail(&mut self, fault: DiskFault) {
        self.failed = Some(fault);
        self.accepted = self.disk.durable_log.clone();
    }

    /// The process died: of the unsynced records a random prefix survives (a torn write
    /// cuts anywhere in it, and the next start cuts the torn record and marks the store).
    /// With `tear` false the write is not torn: a prefix the draw would have torn is lost
    /// whole instead (nothing of it on the medium, no mark).
    pub(crate) fn crash(&mut self, rng: &mut SimRng, tear: bool) {
        let disk = &mut self.disk;
        let unsynced = disk.records.len() - disk.durable;
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
        disk.records.truncate(disk.durable + keep);
        let mut log = EntryLog::default();
        for r in &disk.records {
            log.apply(r);
        }
        if draw == 2 && tear && keep < unsynced {
            disk.torn = Some(Offset(log.len()));
        }
        // What survived is on the medium: compact it to one record per entry.
        disk.records = log.entries().iter().cloned().map(Record::Entry).collect();
        disk.durable = disk.records.len();
        if disk.flipped.is_some_and(|o| o.0 >= log.len()) {
            disk.flipped = None;
        }
        disk.durable_log = log;
        self.restart();
    }

    /// Flips a bit in a durable entry. Without `tail_flips`, only entries before the last
    /// one (sealed data; a flip in the last record reads as a torn write). Returns the
    /// offset, or `None` if there is no entry to flip.
    pub(crate) fn flip_bit(&mut self, tail_flips: bool, rng: &mut SimRng) -> Option<Offset> {
        let n = self.disk.durable_log.len();
        let candidates = if tail_flips { n } else { n.saturating_sub(1) };
        if candidates == 0 {
            return None;
        }
        let at = Offset(rng.range(0, candidates - 1));
        self.disk.flipped = Some(at);
        Some(at)
    }

    /// Recovery at start, as quire-node's start-up: the WAL's scan (a bad record before
    /// valid ones is corruption; a bad last record is a torn tail, cut), the tail-cut mark
    /// written before the cut ([`tail_cut::merge`]), a satisfied mark dropped
    /// ([`tail_cut::clears`]).
    pub(crate) fn recover(&mut self) -> StartOutcome {
        let disk = &mut self.disk;
        if let Some(at) = disk.flipped {
            if at.0 + 1 != disk.durable_log.len() {
                return StartOutcome::Corrupt { offset: at };
            }
            // A bad last record with nothing valid after it: a torn tail (only reachable
            // with tail flips on).
            disk.records.truncate(at.0 as usize);
            disk.durable = disk.records.len();
            disk.durable_log.cut(at.0);
            disk.flipped = None;
            disk.torn = Some(at);
        }
        let mut cut = None;
        if let Some(at) = disk.torn.take() {
            // The node writes the mark durably before the WAL's cut (the WAL's pre-cut
            // hook): one atomic step here.
            let mark = tail_cut::merge(disk.tail_cut, at, disk.promised);
            disk.tail_cut = Some(mark);
            cut = Some(mark);
        }
        if let Some(mark) = disk.tail_cut {
            // Caught up before a crash that came before the clearing.
            if tail_cut::clears(mark, disk.durable_log.last().map(|l| l.epoch)) {
                disk.tail_cut = None;
            }
        }
        self.restart();
        StartOutcome::Started { cut }
    }

    /// The operator replaces the disk and runs `quire-node init`: an empty disk with a new
    /// identity.
    pub(crate) fn reinitialise(&mut self, identity: Identity) {
        *self = SimWal::new(identity);
    }

    /// Opens the log again on what is on disk.
    fn restart(&mut self) {
        self.accepted = self.disk.durable_log.clone();
        self.failed = None;
    }

    /// The durable log this store will vote with after its next start, and whether it will
    /// carry a tail-cut mark; `None` if the next start will refuse (a flip before the last
    /// record is corruption).
    pub(crate) fn voting_log(&self) -> Option<(&[Event], bool)> {
        let disk = &self.disk;
        let entries = disk.durable_log.entries();
        let marked = disk.tail_cut.is_some() || disk.torn.is_some();
        match disk.flipped {
            None => Some((entries, marked)),
            Some(at) if at.0 + 1 == entries.len() as u64 => {
                Some((&entries[..entries.len() - 1], true))
            }
            Some(_) => None,
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
