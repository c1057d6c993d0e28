//! [`Storage`]: everything the WAL does to a file system, behind one trait.
//!
//! Every file and directory operation of the crate goes through a `Storage`: opening and
//! creating files, positional reads and writes, `fallocate`, `set_len`, sizes, renames,
//! removals, directory listings and creation, the directory lock, fsync and fdatasync of a
//! file and fsync of a directory. The write path's batches go through a [`Disk`] the
//! storage hands out ([`Storage::open_disk`]), so the io_uring ring keeps the hot path.
//!
//! Two implementations:
//!
//! - [`OsStorage`] (`os.rs`): `std::fs` and `libc` on the real file system, with the
//!   io_uring [`crate::disk::UringDisk`] (or the `pwrite` + `fdatasync`
//!   [`crate::disk::SyncDisk`]) behind it for data writes. The default type parameter of
//!   [`crate::Wal`], so code that names `Wal` uses it.
//! - [`CrashDisk`] (`crash.rs`): an in-memory file system that tracks, per file, what was
//!   written and what is durable, and on [`CrashDisk::crash`] keeps only what a real
//!   device may keep (the ALICE cases, OSDI'14). For tests and the simulator.
//!
//! Errors are [`io::Error`], so an EIO or ENOSPC keeps its errno through every layer
//! (`WalError::io` turns ENOSPC into `WalError::NoSpace`).
//!
//! # Durability promise
//!
//! - When [`StorageFile::sync_data`] or [`StorageFile::sync_all`] returns `Ok`, every byte
//!   written to the file before the call, and its size, is on stable storage. Neither
//!   makes the file's *name* durable.
//! - When [`Storage::sync_dir`] returns `Ok`, every creation, rename and removal of an
//!   entry of that directory done before the call is on stable storage.
//! - Nothing else is promised: an un-synced write may be lost whole, in part (at sector
//!   granularity, in any order), and an un-synced directory change may be lost.

pub mod crash;
mod os;

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::Path;

pub use crash::{CrashDisk, CrashFile, CrashLock, CrashMode, CrashReport, SECTOR_BYTES};
pub use os::{detect_alignment, open_for_append, OsLock, OsStorage};

use crate::disk::{DirectIo, DirectIoAlignment, Disk};
use crate::{IoBackend, WalError};

/// How [`Storage::open`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// An existing file, read-only, for a sequential scan.
    Read,
    /// An existing file, read-only, for reads at random positions (the reader's handles:
    /// readahead off, since the blocks after the durable end are being written).
    ReadRandom,
    /// An existing file, read and write, through the page cache.
    Write,
    /// An existing file, read and write, bypassing the page cache (O_DIRECT) where the
    /// file system supports it; see [`StorageFile::direct_io`]. Segments being appended to.
    WriteDirect,
    /// Created if missing and truncated to empty, write-only, through the page cache.
    Create,
    /// As [`OpenMode::Create`], bypassing the page cache where supported (a spare being
    /// zero-filled).
    CreateDirect,
    /// Created if missing, never truncated, write-only (the lock file).
    CreateKeep,
}

/// An open file of a [`Storage`]. Positions and lengths are bytes. Shared between threads
/// (the commit thread writes while readers read), so every method takes `&self`.
pub trait StorageFile: Send + Sync + fmt::Debug + 'static {
    /// Reads into `buf` from byte `position`; returns the bytes read (0 at the end).
    ///
    /// # Errors
    /// The device's error (EIO for a latent sector error).
    fn read_at(&self, buf: &mut [u8], position: u64) -> io::Result<usize>;

    /// Writes `buf` at byte `position`, extending the file if needed; returns the bytes
    /// written. Not durable until a sync.
    ///
    /// # Errors
    /// The device's error (EIO, ENOSPC, ...).
    fn write_at(&self, buf: &[u8], position: u64) -> io::Result<usize>;

    /// Allocates `[0, bytes)` (`fallocate` mode 0): the file is at least `bytes` long
    /// afterwards and later writes there cannot fail for want of space.
    ///
    /// # Errors
    /// ENOSPC; EOPNOTSUPP where the file system cannot allocate (callers may go on: writing
    /// the bytes allocates them too).
    fn allocate(&self, bytes: u64) -> io::Result<()>;

    /// Sets the file's size to `bytes` (truncating or extending with zeros).
    ///
    /// # Errors
    /// The device's error.
    fn set_len(&self, bytes: u64) -> io::Result<()>;

    /// The file's current size, in bytes.
    ///
    /// # Errors
    /// The device's error.
    fn size(&self) -> io::Result<u64>;

    /// fdatasync: see the module's durability promise.
    ///
    /// # Errors
    /// The device's error; after one, the file's state is unknown (never retry).
    fn sync_data(&self) -> io::Result<()>;

    /// fsync: as [`StorageFile::sync_data`], and the file's metadata too.
    ///
    /// # Errors
    /// As [`StorageFile::sync_data`].
    fn sync_all(&self) -> io::Result<()>;

    /// Whether writes to this handle bypass the page cache.
    fn direct_io(&self) -> DirectIo;

    /// Fills `buf` from byte `position` ([`StorageFile::read_at`] until full).
    ///
    /// # Errors
    /// `UnexpectedEof` if the file ends first; read errors.
    fn read_exact_at(&self, mut buf: &mut [u8], mut position: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, position) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the file ends before the requested bytes",
                    ))
                }
                Ok(n) => {
                    buf = &mut buf[n..];
                    position += n as u64;
                }
                // EINTR means the call did nothing; calling again is not a retry of a failure.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `buf` at byte `position` ([`StorageFile::write_at`] until done).
    ///
    /// # Errors
    /// `WriteZero` if a write makes no progress; write errors.
    fn write_all_at(&self, mut buf: &[u8], mut position: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write_at(buf, position) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => {
                    buf = &buf[n..];
                    position += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A file system as the WAL uses it. See the module docs for what each implementation is
/// and for the durability promise. Cheap to clone (a handle); clones share one file system.
pub trait Storage: Clone + Send + Sync + fmt::Debug + 'static {
    /// An open file.
    type File: StorageFile;
    /// A held directory lock; released when dropped.
    type Lock: Send + Sync + fmt::Debug + 'static;

    /// Opens `path` as `mode` says.
    ///
    /// # Errors
    /// `NotFound` for a missing file in a mode that does not create; device errors.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Self::File>;

    /// The size of the file at `path`, in bytes.
    ///
    /// # Errors
    /// `NotFound` if there is none.
    fn file_len(&self, path: &Path) -> io::Result<u64>;

    /// Renames `from` to `to`, replacing `to` atomically if it exists. Durable after a
    /// [`Storage::sync_dir`] of the directory.
    ///
    /// # Errors
    /// `NotFound` if `from` does not exist; device errors.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Removes the file at `path`. Durable after a [`Storage::sync_dir`].
    ///
    /// # Errors
    /// `NotFound` if there is none; device errors.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// The names of the entries of directory `dir`, in no particular order.
    ///
    /// # Errors
    /// `NotFound` if there is no such directory; device errors.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<OsString>>;

    /// Creates `dir` and any missing parent (like `mkdir -p`); fine if it exists.
    ///
    /// # Errors
    /// Device errors.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;

    /// Opens directory `dir` as a handle whose [`StorageFile::sync_all`] is
    /// [`Storage::sync_dir`] of it: the commit thread hands it to its [`Disk`] as a
    /// [`crate::disk::DiskOp::SyncDir`], so the fsync that makes a new segment's name
    /// durable runs beside the appends instead of in line with them. Nothing but
    /// `sync_all` is meaningful on it.
    ///
    /// # Errors
    /// `NotFound` if there is no such directory; device errors.
    fn open_dir(&self, dir: &Path) -> io::Result<Self::File>;

    /// fsyncs directory `dir`: see the module's durability promise.
    ///
    /// # Errors
    /// Device errors.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;

    /// Takes an exclusive lock on the file `path` (created if missing) without waiting.
    ///
    /// # Errors
    /// `WouldBlock` if another holder has it; device errors.
    fn lock(&self, path: &Path) -> io::Result<Self::Lock>;

    /// The direct-I/O alignment of files in `dir`.
    ///
    /// # Errors
    /// If it cannot be found out (device errors).
    fn alignment(&self, dir: &Path) -> io::Result<DirectIoAlignment>;

    /// Whether the WAL may do work on background threads besides the commit thread (the
    /// spare segment's preparation). `false` makes the preparation run inline, at the roll
    /// that needs it, so that the order of every operation follows from the caller's
    /// (a simulated disk, whose crash points must replay from a seed). Default `true`.
    fn background_work(&self) -> bool {
        true
    }

    /// 64 unpredictable bits, for a new segment's [`crate::format::SegmentTag`]: from the
    /// kernel's random source (`getrandom`) on a real file system, from the seed on a
    /// simulated one (so that a run replays).
    fn random_u64(&self) -> u64;

    /// The disk the commit thread writes batches and fdatasyncs through, for `backend`
    /// (which a simulated storage may ignore).
    ///
    /// # Errors
    /// [`WalError::UringUnavailable`] when io_uring is required and missing.
    fn open_disk(&self, backend: IoBackend) -> Result<Box<dyn Disk<Self::File>>, WalError>;
}
