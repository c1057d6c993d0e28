//! [`OsStorage`]: the real file system — `std::fs`, `libc` (`pwrite`, `fdatasync`,
//! `fallocate`, `flock`, `statx`), and the io_uring disk for the write path.
//!
//! This is the only module of the crate that calls `std::fs`. Its file handle is
//! `std::fs::File` itself, so the io_uring disk submits on its fd with no indirection and
//! the write path costs what it did before the [`Storage`] trait existed.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::{OpenMode, Storage, StorageFile};
use crate::disk::{self, DirectIo, DirectIoAlignment, Disk, ALIGN_BYTES_MAX, ALIGN_BYTES_MIN};
use crate::{IoBackend, WalError};

/// The real file system. A unit value: every clone is the same file system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OsStorage;

/// An exclusive `flock` on a lock file, held while the value lives.
#[derive(Debug)]
pub struct OsLock {
    _file: File,
}

impl StorageFile for File {
    fn read_at(&self, buf: &mut [u8], position: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, position)
    }

    fn write_at(&self, buf: &[u8], position: u64) -> io::Result<usize> {
        FileExt::write_at(self, buf, position)
    }

    fn allocate(&self, bytes: u64) -> io::Result<()> {
        let len =
            libc::off_t::try_from(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: fallocate on an fd we own; no memory involved.
        let rc = unsafe { libc::fallocate(self.as_raw_fd(), 0, 0, len) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn set_len(&self, bytes: u64) -> io::Result<()> {
        File::set_len(self, bytes)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }

    fn direct_io(&self) -> DirectIo {
        // SAFETY: F_GETFL on an fd we own takes no pointer.
        let flags = unsafe { libc::fcntl(self.as_raw_fd(), libc::F_GETFL) };
        if flags >= 0 && flags & libc::O_DIRECT != 0 {
            DirectIo::On
        } else {
            DirectIo::Off
        }
    }
}

/// Whether a refused O_DIRECT is worth a warning: for the segments appends go to, yes; for
/// the spare's zero-fill, no (the segment open right after it warns).
#[derive(Clone, Copy, PartialEq, Eq)]
enum WarnBuffered {
    Yes,
    No,
}

/// Opens with O_DIRECT added to `options`, falling back to buffered I/O where the file
/// system refuses it with EINVAL (tmpfs).
fn open_direct_or_buffered(
    options: &mut OpenOptions,
    path: &Path,
    warn: WarnBuffered,
) -> io::Result<File> {
    let direct = options.clone().custom_flags(libc::O_DIRECT).open(path);
    match direct {
        Ok(f) => Ok(f),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            if warn == WarnBuffered::Yes {
                tracing::warn!(
                    path = %path.display(),
                    "O_DIRECT is not supported here; segment writes go through the page \
                     cache (still fdatasync'ed)"
                );
            }
            options.open(path)
        }
        Err(e) => Err(e),
    }
}

impl Storage for OsStorage {
    type File = File;
    type Lock = OsLock;

    fn random_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        let mut filled = 0;
        while filled < b.len() {
            // SAFETY: getrandom writes at most the given length into the buffer we own.
            let n =
                unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), b.len() - filled, 0) };
            if n <= 0 {
                // Interrupted (EINTR), or no getrandom (ENOSYS, before Linux 3.17): fall
                // back on what the standard library's hash keys are seeded from.
                if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u128(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos()),
                );
                return h.finish();
            }
            filled += usize::try_from(n).expect("invariant: n > 0");
        }
        u64::from_le_bytes(b)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<File> {
        let mut o = OpenOptions::new();
        // Segments hold every topic's messages and the users' salted SCRAM keys: files
        // this creates are the store's user's alone (0600), as the TLS keys are.
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        match mode {
            OpenMode::Read => File::open(path),
            OpenMode::ReadRandom => {
                let f = File::open(path)?;
                // SAFETY: posix_fadvise on an fd we own; advice only, no memory involved.
                unsafe {
                    libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
                }
                Ok(f)
            }
            OpenMode::Write => o.read(true).write(true).open(path),
            OpenMode::WriteDirect => {
                open_direct_or_buffered(o.read(true).write(true), path, WarnBuffered::Yes)
            }
            OpenMode::Create => o.write(true).create(true).truncate(true).open(path),
            OpenMode::CreateDirect => open_direct_or_buffered(
                o.write(true).create(true).truncate(true),
                path,
                WarnBuffered::No,
            ),
            OpenMode::CreateKeep => o.write(true).create(true).truncate(false).open(path),
        }
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        Ok(fs::metadata(path)?.len())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir)? {
            out.push(entry?.file_name());
        }
        Ok(out)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        // Directories this creates are the store's user's alone (0700); one that exists
        // keeps its mode.
        std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
    }

    fn open_dir(&self, dir: &Path) -> io::Result<File> {
        File::open(dir)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn lock(&self, path: &Path) -> io::Result<OsLock> {
        let file = self.open(path, OpenMode::CreateKeep)?;
        // SAFETY: flock on an fd we own; no memory is involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OsLock { _file: file })
    }

    fn alignment(&self, dir: &Path) -> io::Result<DirectIoAlignment> {
        detect_alignment(dir)
    }

    fn open_disk(&self, backend: IoBackend) -> Result<Box<dyn Disk<File>>, WalError> {
        disk::open_disk(backend).map(|(d, _)| d)
    }
}

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

/// Opens an existing segment file for the write path: O_DIRECT where the file system
/// supports it (falling back to buffered writes with a warning on EINVAL).
///
/// # Errors
/// If the file cannot be opened.
pub fn open_for_append(path: &Path) -> io::Result<(File, DirectIo)> {
    let f = OsStorage.open(path, OpenMode::WriteDirect)?;
    let direct = StorageFile::direct_io(&f);
    Ok((f, direct))
}
