//! [`WalError`]: every way a WAL operation can fail, with where it happened.
//!
//! Three classes (STYLE.md): validation errors of an append come back at once and change
//! nothing; I/O errors of the write path turn the log failed for good ([`WalError::Failed`]
//! carries the first reason); corruption found by a scan is located
//! ([`WalError::Corruption`]) and never silently skipped.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use quire_proto::{Epoch, Offset};

use crate::Position;

/// The error type of the WAL. `Clone` so that one failure can be handed to every pending
/// append (the I/O error itself is shared behind an `Arc`).
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// A system call failed.
    #[error("{op} failed on {}: {source}", path.display())]
    Io {
        /// What was being done (`"write"`, `"fdatasync"`, `"open"`, …).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: Arc<io::Error>,
    },

    /// The file system is full (ENOSPC). Everything acknowledged before stays intact.
    #[error("no space left on device during {op} on {}", path.display())]
    NoSpace {
        /// What was being done.
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
    },

    /// The log has failed (fail-stop): a write or fsync error happened and the log is now
    /// read-only until it is reopened. `reason` is the first error.
    #[error("the log has failed and is read-only: {reason}")]
    Failed {
        /// The error that failed the log.
        reason: Arc<WalError>,
    },

    /// A segment holds bytes that are neither a valid record nor a torn tail.
    #[error(
        "corruption in {} at position {position} (expected offset {offset}): {problem}",
        segment.display()
    )]
    Corruption {
        /// The segment file.
        segment: PathBuf,
        /// Byte position of the bad record in that file.
        position: Position,
        /// The offset the log expected at that position.
        offset: Offset,
        /// What is wrong.
        problem: CorruptionKind,
    },

    /// The data directory is not a valid WAL directory (missing segment, bad name, …).
    #[error("bad WAL directory {}: {detail}", dir.display())]
    BadDirectory {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        detail: String,
    },

    /// Another process (or another `Wal` in this process) holds the directory's lock.
    #[error("the WAL directory {} is locked by another user", dir.display())]
    Locked {
        /// The directory.
        dir: PathBuf,
    },

    /// A configuration value is out of range.
    #[error("invalid WAL configuration: {0}")]
    Config(String),

    /// `IoBackend::Uring` was required but io_uring cannot be used here.
    #[error("io_uring is unavailable: {0}")]
    UringUnavailable(String),

    /// An append carried no records.
    #[error("an append must carry at least one record")]
    EmptyAppend,

    /// An append's first offset leaves a gap after the log's end.
    #[error("append at offset {first} leaves a gap: the log's next offset is {next}")]
    Gap {
        /// First offset of the append.
        first: Offset,
        /// The log's next offset (last + 1, or the start of an empty log).
        next: Offset,
    },

    /// The records of one append do not have consecutive offsets.
    #[error("record {index} of the append has offset {actual}, expected {expected}")]
    NotConsecutive {
        /// Index of the record within the append.
        index: usize,
        /// The offset it should have had.
        expected: Offset,
        /// The offset it had.
        actual: Offset,
    },

    /// A truncating append's writer epoch does not justify replacing the entry at its
    /// first offset.
    #[error(
        "truncation at offset {offset} refused: writer epoch {writer_epoch} is not greater than \
         the entry's epoch {entry_epoch} or is below the highest epoch seen {max_epoch_seen}"
    )]
    TruncationRefused {
        /// The first offset the append would replace.
        offset: Offset,
        /// Epoch of the entry now at that offset.
        entry_epoch: Epoch,
        /// The append's writer epoch.
        writer_epoch: Epoch,
        /// The highest epoch of any record this log has accepted.
        max_epoch_seen: Epoch,
    },

    /// A truncating append would replace entries below the first offset the log holds.
    #[error("cannot truncate at offset {offset}: the log starts at {first}")]
    TruncateBelowStart {
        /// The requested truncation point.
        offset: Offset,
        /// The log's first offset.
        first: Offset,
    },

    /// A record's epoch is above the writer epoch of its append.
    #[error("record at offset {offset} has epoch {epoch} above the writer epoch {writer_epoch}")]
    EpochAboveWriter {
        /// The record's offset.
        offset: Offset,
        /// The record's epoch.
        epoch: Epoch,
        /// The append's writer epoch.
        writer_epoch: Epoch,
    },

    /// Entry epochs must not decrease along the log.
    #[error(
        "record at offset {offset} has epoch {epoch} below the previous entry's epoch {previous}"
    )]
    EpochRegression {
        /// The record's offset.
        offset: Offset,
        /// The record's epoch.
        epoch: Epoch,
        /// Epoch of the entry before it.
        previous: Epoch,
    },

    /// A record's payload, or a whole append, is too large.
    #[error("{what} of {bytes} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// `"payload"` or `"append"`.
        what: &'static str,
        /// The size asked for.
        bytes: u64,
        /// The bound.
        max: u64,
    },

    /// A read asked for an offset the log does not hold.
    #[error("offset {requested} is outside the log [{first}, {next})")]
    OffsetOutOfRange {
        /// The offset asked for.
        requested: Offset,
        /// The first offset held.
        first: Offset,
        /// One past the last durable offset.
        next: Offset,
    },

    /// A read asked for an offset below the log's first offset: retention deleted it
    /// ([`crate::Wal::trim_before`]). Reads can start at `first`.
    #[error("offset {requested} was trimmed; the log starts at {first}")]
    Trimmed {
        /// The offset asked for.
        requested: Offset,
        /// The first offset held (the trim point).
        first: Offset,
    },

    /// A promised epoch may only go up.
    #[error("promised epoch cannot go down from {current} to {requested}")]
    PromiseRegression {
        /// The promised epoch on disk.
        current: Epoch,
        /// The epoch asked for.
        requested: Epoch,
    },

    /// A promise for one more log would pass the bound on logs with promises.
    #[error("promised epochs are kept for at most {max} logs per store")]
    TooManyPromises {
        /// The bound ([`crate::promised::PROMISED_LOGS_MAX`]).
        max: usize,
    },

    /// The log was closed.
    #[error("the log is closed")]
    Closed,
}

/// What a corruption error found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CorruptionKind {
    /// A record's checksum or header is bad and valid records follow it.
    #[error("a bad record is followed by valid records")]
    BadRecordBeforeValid,
    /// A segment's name does not match its content (first record, base offset).
    #[error("the segment does not start with the record its name promises")]
    SegmentStart,
    /// A version-2 segment's header (its first bytes say "QS") is damaged, so its records
    /// cannot be told from an earlier life of the file.
    #[error("the segment header is damaged ({problem:?})")]
    SegmentHeader {
        /// What is wrong with it.
        problem: crate::format::SegmentHeaderProblem,
    },
    /// A segment's base offset leaves a gap after the previous segment.
    #[error("a segment is missing before this one")]
    MissingSegment,
    /// The log's records end here (the error's position: after the last record that
    /// counts) and the next valid record, later in this segment or at the start of the
    /// next one, has a higher offset than expected: the entries in between are missing.
    /// Either they were here and read back as zeros (a lost, misdirected or zeroed write),
    /// or a whole segment between was lost.
    #[error(
        "the entries from here to offset {next_offset} (excluded), the next valid record's, \
         are missing: only zeros lie between (a lost or zeroed write), or a segment between \
         was lost"
    )]
    MissingRecords {
        /// The offset of the next valid record (the next segment's base, when it starts
        /// that segment).
        next_offset: quire_proto::Offset,
    },
    /// A record read back through the index does not match what was written.
    #[error("a record read back does not match the index")]
    ReadMismatch,
    /// The promised-epoch file is damaged.
    #[error("the promised-epoch file is damaged")]
    PromisedEpochFile,
    /// A record read back (its checksum good) holds an event kind byte this build does not
    /// know: written by a newer build, or not by Quire.
    #[error("the record holds event kind byte {byte:#04x}, which this build does not know")]
    UnknownEventKind {
        /// The kind byte.
        byte: u8,
    },
}

impl WalError {
    /// Builds an I/O error, mapping ENOSPC to [`WalError::NoSpace`].
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> WalError {
        let path = path.into();
        if source.raw_os_error() == Some(libc::ENOSPC) {
            WalError::NoSpace { op, path }
        } else {
            WalError::Io {
                op,
                path,
                source: Arc::new(source),
            }
        }
    }

    /// Whether this error (or the reason a log failed) is ENOSPC.
    #[must_use]
    pub fn is_no_space(&self) -> bool {
        match self {
            WalError::NoSpace { .. } => true,
            WalError::Failed { reason } => reason.is_no_space(),
            _ => false,
        }
    }

    /// Whether this is a corruption report (or a failure caused by one).
    #[must_use]
    pub fn is_corruption(&self) -> bool {
        match self {
            WalError::Corruption { .. } => true,
            WalError::Failed { reason } => reason.is_corruption(),
            _ => false,
        }
    }
}
