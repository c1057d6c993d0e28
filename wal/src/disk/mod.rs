//! The I/O layer of the write path, behind the small [`Disk`] trait.
//!
//! The commit thread (see `commit.rs`) hands a `Disk` two kinds of operation — write a
//! batch at a position, fdatasync a file — and collects their completions. Three
//! implementations:
//!
//! - [`UringDisk`]: io_uring, one ring per data directory, O_DIRECT writes, an fdatasync
//!   linked to the write when nothing else is in flight, and a write of the next batch
//!   submitted while an fdatasync is still running;
//! - [`SyncDisk`]: `pwrite` + `fdatasync` on the calling thread, the fallback when
//!   io_uring is unavailable;
//! - [`FaultDisk`]: wraps another `Disk` and fails a chosen write or fdatasync (EIO,
//!   ENOSPC, …) for tests.
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
mod sync;
mod uring;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use std::{fmt, fs};

pub use buf::{AlignedBuf, HUGE_PAGE_BYTES};
pub use fault::{FaultDisk, FaultPlan, FaultSpecError, FAULT_AFTER_MAX};
pub use sync::SyncDisk;
pub use uring::{open_single_issuer_ring, UringDisk};

use crate::Position;

/// One operation for a [`Disk`].
#[derive(Debug)]
pub enum DiskOp {
    /// Write all of `buf` at byte `position` of `file`. `position` and `buf`'s length are
    /// multiples of the direct-I/O alignment.
    Write {
        /// The segment file (opened for writing, with O_DIRECT where supported).
        file: Arc<File>,
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
        file: Arc<File>,
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
/// collects results. See the module docs for the durability promise.
pub trait Disk: Send + fmt::Debug {
    /// A short name for logs and stats (`"io_uring"`, `"sync"`, …).
    fn name(&self) -> &'static str;

    /// Queues an operation; it is submitted by the next [`Disk::wait`].
    fn push(&mut self, op: DiskOp);

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

/// Finds the direct-I/O alignment for files in `dir`: the largest of statx's
/// STATX_DIOALIGN offset and memory alignments, the device's physical block size (sysfs),
/// and [`ALIGN_BYTES_MIN`]. When neither statx nor sysfs tells anything, the file
/// system's block size (`st_blksize`) is used. Never a constant assumption.
///
/// # Errors
/// If the probe file cannot be created or statx fails.
pub fn detect_alignment(dir: &Path) -> io::Result<DirectIoAlignment> {
    let probe = dir.join(".quire-dio-probe");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&probe)?;
    let result = statx_alignment(&file);
    drop(file);
    let _ = fs::remove_file(&probe);
    let (stx_offset, stx_mem, dev, fs_block) = result?;
    let physical = dev.and_then(|(major, minor)| physical_block_size(major, minor));
    let mut bytes = ALIGN_BYTES_MIN;
    for v in [stx_offset, stx_mem, physical].into_iter().flatten() {
        bytes = bytes.max(v);
    }
    if stx_offset.is_none() && physical.is_none() {
        bytes = bytes.max(fs_block);
    }
    let bytes = bytes.next_power_of_two().min(ALIGN_BYTES_MAX);
    Ok(DirectIoAlignment {
        bytes,
        statx_offset_bytes: stx_offset,
        statx_memory_bytes: stx_mem,
        physical_block_bytes: physical,
        fs_block_bytes: fs_block,
    })
}

type StatxAlign = (Option<u64>, Option<u64>, Option<(u32, u32)>, u64);

fn statx_alignment(file: &File) -> io::Result<StatxAlign> {
    use std::os::fd::AsRawFd;
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    // SAFETY: the fd is open for the duration of the call, the path is a valid C string and
    // stx points to a writable statx struct.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_BASIC_STATS | libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let (off, mem) = if stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align != 0 {
        (
            Some(u64::from(stx.stx_dio_offset_align)),
            Some(u64::from(stx.stx_dio_mem_align)),
        )
    } else {
        (None, None)
    };
    Ok((
        off,
        mem,
        Some((stx.stx_dev_major, stx.stx_dev_minor)),
        u64::from(stx.stx_blksize),
    ))
}

fn physical_block_size(major: u32, minor: u32) -> Option<u64> {
    let base = format!("/sys/dev/block/{major}:{minor}");
    for candidate in [
        format!("{base}/queue/physical_block_size"),
        // A partition has no queue directory of its own: its parent disk's applies.
        format!("{base}/../queue/physical_block_size"),
    ] {
        if let Ok(text) = fs::read_to_string(&candidate) {
            if let Ok(v) = text.trim().parse::<u64>() {
                if v.is_power_of_two() {
                    return Some(v);
                }
            }
        }
    }
    None
}

/// Whether writes to a file bypass the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectIo {
    /// The file was opened with O_DIRECT.
    On,
    /// The file system refused O_DIRECT (EINVAL, e.g. tmpfs); writes go through the page
    /// cache and durability still comes from fdatasync.
    Off,
}

/// Opens an existing segment file for the write path: O_DIRECT where the file system
/// supports it (falling back to buffered writes with a warning on EINVAL).
///
/// # Errors
/// If the file cannot be opened.
pub fn open_for_append(path: &Path) -> io::Result<(File, DirectIo)> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Ok((f, DirectIo::On)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::warn!(
                path = %path.display(),
                "O_DIRECT is not supported here; segment writes go through the page cache \
                 (still fdatasync'ed)"
            );
            let f = OpenOptions::new().read(true).write(true).open(path)?;
            Ok((f, DirectIo::Off))
        }
        Err(e) => Err(e),
    }
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
