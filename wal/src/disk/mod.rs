//! The I/O layer of the write path, behind the small [`Disk`] trait.
//!
//! The commit thread (see `commit.rs`) hands a `Disk` three kinds of operation — write a
//! batch at a position, fdatasync a file, fsync the directory after a segment roll — and
//! collects their completions. Three
//! implementations:
//!
//! - [`UringDisk`]: io_uring, one ring per data directory, O_DIRECT writes, an fdatasync
//!   linked to the write when nothing else is in flight, and a write of the next batch
//!   submitted while an fdatasync is still running;
//! - [`SyncDisk`]: `pwrite` + `fdatasync` on the calling thread, the fallback when
//!   io_uring is unavailable;
//! - [`FaultDisk`]: wraps another `Disk` and fails a chosen write or fdatasync (EIO,
//!   ENOSPC, …) for tests;
//! - [`StepDisk`]: runs writes at once and holds each fdatasync until a driver completes
//!   it, for the deterministic simulator (quire-sim).
//!
//! The trait is generic over the file type `F` (default `std::fs::File`): a
//! [`crate::Storage`] hands the commit thread a `Disk<Storage::File>`. [`UringDisk`] works
//! on real files only; [`SyncDisk`] and [`FaultDisk`] on any [`crate::StorageFile`], so a
//! simulated storage runs the same commit thread. Every other file operation of the WAL
//! (open, create, rename, directory fsync, ...) goes through the [`crate::Storage`] itself.
//!
//! This module does not decide what is written where (that is the commit thread's job)
//! and never retries a failed operation.
//!
//! # Durability promise
//!
//! When a [`DiskOp::Fdatasync`] (or the fdatasync linked to a [`DiskOp::Write`]) completes
//! with success, every write to the same file whose completion was returned *before* that
//! fdatasync was pushed, and the write it is linked to, is on stable storage.

mod buf;
mod fault;
mod step;
mod sync;
mod uring;

use std::fmt;
use std::fs::File;
use std::io;
use std::sync::Arc;
use std::time::Duration;

pub use buf::{AlignedBuf, HUGE_PAGE_BYTES};
pub use fault::{FaultDisk, FaultPlan, FaultSpecError, FAULT_AFTER_MAX};
pub use step::{StepControl, StepDisk};
pub use sync::SyncDisk;
pub use uring::{open_single_issuer_ring, UringDisk};

pub use crate::storage::{detect_alignment, open_for_append};

use crate::Position;

/// One operation for a [`Disk`], on files of type `F` (a [`crate::storage::StorageFile`];
/// `std::fs::File` for the real disks).
#[derive(Debug)]
pub enum DiskOp<F = File> {
    /// Write all of `buf` at byte `position` of `file`. `position` and `buf`'s length are
    /// multiples of the direct-I/O alignment.
    Write {
        /// The segment file (opened for writing, with O_DIRECT where supported).
        file: Arc<F>,
        /// Byte position in the file.
        position: Position,
        /// The bytes; returned in the completion.
        buf: AlignedBuf,
        /// Identifies the completion.
        token: u64,
        /// If set, an fdatasync of `file` runs right after the write succeeds, and its
        /// completion carries this token. If the write fails, the fdatasync completes with
        /// an error too (ECANCELED).
        then_fdatasync: Option<u64>,
    },
    /// fdatasync the file.
    Fdatasync {
        /// The segment file.
        file: Arc<F>,
        /// Identifies the completion.
        token: u64,
    },
    /// fsync a directory, opened with [`crate::Storage::open_dir`]: makes the creations,
    /// renames and removals in it done before the push durable (a rolled segment's name).
    SyncDir {
        /// The directory's handle.
        dir: Arc<F>,
        /// Identifies the completion.
        token: u64,
    },
}

/// The result of one [`DiskOp`].
#[derive(Debug)]
pub struct DiskCompletion {
    /// The token given with the operation.
    pub token: u64,
    /// Bytes written (0 for an fdatasync), or the error. A short write is reported as
    /// written bytes and is the caller's to treat as a failure.
    pub result: io::Result<u32>,
    /// The buffer of a write, handed back.
    pub buf: Option<AlignedBuf>,
}

/// Wakes a thread blocked in [`Disk::wait`]. Level-triggered: a wake that happens while
/// nobody waits makes the next `wait` return at once.
pub trait DiskWaker: Send + Sync + fmt::Debug {
    /// Makes the current or next [`Disk::wait`] return.
    fn wake(&self);
}

/// A completion-based disk: operations are pushed, then [`Disk::wait`] submits them and
/// collects results, on files of type `F`. See the module docs for the durability promise.
pub trait Disk<F = File>: Send + fmt::Debug {
    /// A short name for logs and stats (`"io_uring"`, `"sync"`, …).
    fn name(&self) -> &'static str;

    /// Queues an operation; it is submitted by the next [`Disk::wait`].
    fn push(&mut self, op: DiskOp<F>);

    /// Hands queued operations to the device now, if this disk runs them asynchronously;
    /// a disk that runs them inside [`Disk::wait`] does nothing here.
    ///
    /// # Errors
    /// When the submission mechanism fails.
    fn submit(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// Submits queued operations, then blocks until at least one completion is available,
    /// the waker was signalled, or `timeout` passed (`None`: no timeout;
    /// `Some(Duration::ZERO)`: do not block). Appends completions to `out`.
    ///
    /// # Errors
    /// When the submission mechanism itself fails (not when an operation fails: that is
    /// reported in its completion).
    fn wait(&mut self, out: &mut Vec<DiskCompletion>, timeout: Option<Duration>) -> io::Result<()>;

    /// Operations pushed or submitted whose completion has not been returned yet.
    fn in_flight(&self) -> usize;

    /// A handle that wakes [`Disk::wait`] from another thread.
    fn waker(&self) -> Arc<dyn DiskWaker>;
}

/// The direct-I/O alignment of a directory's device, and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectIoAlignment {
    /// Alignment of file positions and lengths for O_DIRECT, in bytes (a power of two,
    /// at least the physical block size when known).
    pub bytes: u64,
    /// `statx` STATX_DIOALIGN offset alignment, if the kernel reported one.
    pub statx_offset_bytes: Option<u64>,
    /// `statx` STATX_DIOALIGN memory alignment, if the kernel reported one.
    pub statx_memory_bytes: Option<u64>,
    /// The device's physical block size from sysfs, if found.
    pub physical_block_bytes: Option<u64>,
    /// The file system's preferred I/O size (`st_blksize`).
    pub fs_block_bytes: u64,
}

/// The smallest alignment the WAL uses, in bytes.
pub const ALIGN_BYTES_MIN: u64 = 512;
/// The largest alignment the WAL accepts, in bytes.
pub const ALIGN_BYTES_MAX: u64 = 1 << 20;

/// Whether writes to a file bypass the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectIo {
    /// The file was opened with O_DIRECT.
    On,
    /// The file system refused O_DIRECT (EINVAL, e.g. tmpfs); writes go through the page
    /// cache and durability still comes from fdatasync.
    Off,
}

/// Which implementation [`open_disk`] chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskChoice {
    /// io_uring.
    Uring,
    /// pwrite + fdatasync.
    Sync,
}

/// Whether io_uring can be used by this process, with the reason when it cannot.
///
/// # Errors
/// The reason io_uring is unavailable (ENOSYS, EPERM, missing opcodes, old kernel).
pub fn uring_available() -> Result<(), String> {
    UringDisk::new(crate::commit::OPS_IN_FLIGHT_MAX).map(|_| ())
}

/// Builds the disk for `backend`: io_uring if asked or if `Auto` and available; the sync
/// fallback otherwise, with a log line saying why.
///
/// # Errors
/// [`crate::WalError::UringUnavailable`] when `Uring` is required and unavailable.
pub fn open_disk(
    backend: crate::IoBackend,
) -> Result<(Box<dyn Disk>, DiskChoice), crate::WalError> {
    use crate::IoBackend;
    match backend {
        IoBackend::Sync => Ok((Box::new(SyncDisk::new()), DiskChoice::Sync)),
        IoBackend::Uring => match UringDisk::new(crate::commit::OPS_IN_FLIGHT_MAX) {
            Ok(d) => Ok((Box::new(d), DiskChoice::Uring)),
            Err(reason) => Err(crate::WalError::UringUnavailable(reason)),
        },
        IoBackend::Auto => match UringDisk::new(crate::commit::OPS_IN_FLIGHT_MAX) {
            Ok(d) => Ok((Box::new(d), DiskChoice::Uring)),
            Err(reason) => {
                tracing::warn!(
                    %reason,
                    "io_uring is unavailable; the WAL falls back to synchronous pwrite + fdatasync"
                );
                Ok((Box::new(SyncDisk::new()), DiskChoice::Sync))
            }
        },
    }
}
