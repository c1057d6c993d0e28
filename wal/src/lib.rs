//! quire-wal: the write-ahead log of one store.
//!
//! Owns the on-disk format of a store's log (segment files of checksummed records, see
//! `docs/format.md`), the write path (group commit of O_DIRECT batches through io_uring or
//! a synchronous fallback, each acknowledged only after the fdatasync that covers it), the
//! recovery scan, the in-memory index and the reader, and the promised-epoch file. It has
//! no networking and no async runtime: [`Append`] is a plain `Future` that any executor
//! can poll, or [`Append::wait`] blocks.
//!
//! Modules: [`format`] (record bytes), [`segment`] (files, directory, preallocation),
//! [`scan`] (recovery rules, read-only), [`recovery`] (open-time cut, offline repair and
//! inspection), `index`, `reader`, [`storage`] (every file-system operation, behind the
//! [`Storage`] trait: the real [`OsStorage`] and the crash-tracking [`CrashDisk`]),
//! [`disk`] (the write path's completion-based I/O trait and its io_uring, sync and
//! fault-injecting implementations), `commit` (the commit thread), [`promised`],
//! [`small_file`] (the one durable small-file implementation, also used by the node's
//! identity and tail-cut files).
//!
//! Every type that touches files is generic over `S: Storage`, with [`OsStorage`] as the
//! default, so `Wal` means `Wal<OsStorage>`.
//!
//! ```no_run
//! use quire_proto::{Epoch, Event, EventKind, Offset};
//! use quire_wal::{Wal, WalConfig};
//!
//! let (wal, report) = Wal::open(WalConfig::new("/var/lib/quire/wal"))?;
//! let next = wal.next_offset();
//! let rec = Event { epoch: Epoch(1), offset: next, kind: EventKind::Message, payload: "hello".into() };
//! let last: Offset = wal.append(Epoch(1), vec![rec]).wait()?;
//! # Ok::<(), quire_wal::WalError>(())
//! ```

mod append;
mod commit;
mod copy;
pub mod disk;
mod error;
pub mod format;
mod index;
pub mod promised;
mod reader;
pub mod recovery;
pub mod scan;
pub mod segment;
pub mod small_file;
mod stats;
pub mod storage;
mod wal;

use std::fmt;

pub use append::Append;
pub use error::{CorruptionKind, WalError};
pub use index::EpochRuns;
pub use promised::PromisedEpoch;
pub use recovery::{inspect, repair_torn_tail, BeforeCut, RecoveryReport, RepairReport};
pub use scan::{
    BadRecord, DamagedRecords, RecordStatus, ScanEnd, ScanReport, ScannedRecord, SegmentReport,
    TornTail,
};
pub use segment::SpareFill;
pub use stats::{StageSums, WalStats, FSYNC_US_BUCKETS};
pub use storage::{CrashDisk, OsStorage, Storage, StorageFile};
pub use wal::{
    IoBackend, TrimReport, Wal, WalConfig, CORRUPT_RECORDS_MAX, SEGMENT_BYTES_LIMIT,
    SEGMENT_BYTES_MIN,
};

/// Planted bugs for the crash tests (issue 12 item 6): each switch turns one rule of the
/// shipped code off, so that a test can show its checker finds the bug. All off by
/// default; nothing outside tests sets them.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mutations {
    /// The commit thread acknowledges a batch's appends when its write completes, before
    /// the fdatasync that covers it.
    pub ack_before_fdatasync: bool,
    /// The recovery scan calls a bad record followed by valid ones a torn tail (and cuts
    /// it) instead of reporting corruption.
    pub mid_log_bad_record_is_torn_tail: bool,
    /// A reused segment file keeps the tag of its earlier life (so that life's records
    /// still check out) instead of drawing a new one.
    pub reuse_keeps_tag: bool,
    /// The commit thread acknowledges the appends of a segment started by a roll once
    /// their fdatasync completed, without waiting for the directory fsync that makes the
    /// segment's name durable.
    pub ack_before_dir_sync: bool,
}

/// A byte location in a file (never a log offset: that is [`quire_proto::Offset`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position(pub u64);

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

// The node shares one `Wal` across tasks and threads, and awaits `Append` on any executor.
const _: () = {
    const fn shareable<T: Clone + Send + Sync>() {}
    const fn sendable<T: Send + Unpin>() {}
    shareable::<Wal>();
    shareable::<Wal<CrashDisk>>();
    sendable::<Append>();
};
