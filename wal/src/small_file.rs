//! The small durable files of a store's data directory (`promised_epoch`, and the node's
//! `identity` and `tail_cut`) — the one implementation all of them use: a fixed
//! layout that starts with a 4-byte magic and a version byte and ends with a CRC-32C of
//! everything before it, replaced atomically and durably.
//!
//! Replacing follows the usual crash-safe sequence: write `NAME.tmp`, fsync it, rename it
//! over `NAME`, fsync the directory. After a crash, `NAME` is either the old file or the new
//! one, never a mix.

use std::io;
use std::path::{Path, PathBuf};

use crate::storage::{OpenMode, OsStorage, Storage, StorageFile};

/// Bytes of the trailing checksum.
const CRC_BYTES: usize = 4;

/// A failed system call: what was being done, on which path, and the OS error. Each file's
/// module maps it into its own error type.
#[derive(Debug)]
pub struct IoFailure {
    /// The operation that failed (`"create"`, `"fsync"`, ...).
    pub op: &'static str,
    /// The path it failed on.
    pub path: PathBuf,
    /// The OS error.
    pub source: io::Error,
}

fn failure<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> IoFailure + 'a {
    move |source| IoFailure {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `magic` and `version` at the start of `b` and the CRC-32C of all but the last 4
/// bytes into those last 4 bytes. `b` holds the file's fields in between.
///
/// # Panics
/// If `b` is shorter than 9 bytes (magic, version, checksum).
pub fn seal(b: &mut [u8], magic: [u8; 4], version: u8) {
    assert!(
        b.len() >= 4 + 1 + CRC_BYTES,
        "invariant: a small file holds magic, version and crc"
    );
    let crc_at = b.len() - CRC_BYTES;
    b[0..4].copy_from_slice(&magic);
    b[4] = version;
    let crc = crc32c::crc32c(&b[..crc_at]);
    b[crc_at..].copy_from_slice(&crc.to_le_bytes());
}

/// Checks the size, magic, checksum and version of a file's bytes `b` (checksum before
/// version, so a damaged version byte reads as damage).
///
/// # Errors
/// What is wrong, for the caller's `Corrupt` error.
pub fn check<const N: usize>(
    b: &[u8],
    magic: [u8; 4],
    version: u8,
) -> Result<&[u8; N], &'static str> {
    let b: &[u8; N] = b.try_into().map_err(|_| "wrong size")?;
    if b[0..4] != magic {
        return Err("bad magic");
    }
    let crc_at = N - CRC_BYTES;
    let stored = u32::from_le_bytes([b[crc_at], b[crc_at + 1], b[crc_at + 2], b[crc_at + 3]]);
    if crc32c::crc32c(&b[..crc_at]) != stored {
        return Err("checksum mismatch");
    }
    if b[4] != version {
        return Err("unsupported version");
    }
    Ok(b)
}

/// The little-endian u64 at byte `at` of `b`.
///
/// # Panics
/// If `at + 8` is past the end of `b` (callers read fixed layouts).
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// Reads `dir/name` on the real file system ([`read_in`] with [`OsStorage`]).
///
/// # Errors
/// As [`read_in`].
pub fn read(dir: &Path, name: &str) -> Result<Option<Vec<u8>>, IoFailure> {
    read_in(&OsStorage, dir, name)
}

/// The most bytes a small file may hold; a larger one is not read (it is not one of ours).
pub const SMALL_FILE_BYTES_MAX: u64 = 64 * 1024;

/// Reads `dir/name` of `storage`; `Ok(None)` if there is no such file.
///
/// # Errors
/// Any other I/O error, and `InvalidData` for a file above [`SMALL_FILE_BYTES_MAX`].
pub fn read_in<S: Storage>(
    storage: &S,
    dir: &Path,
    name: &str,
) -> Result<Option<Vec<u8>>, IoFailure> {
    let path = dir.join(name);
    let file = match storage.open(&path, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(failure("open", &path)(e)),
    };
    let len = file.size().map_err(failure("stat", &path))?;
    if len > SMALL_FILE_BYTES_MAX {
        return Err(failure("read", &path)(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{len} bytes is too large for a small file"),
        )));
    }
    let mut b = vec![0u8; usize::try_from(len).expect("invariant: bounded above")];
    file.read_exact_at(&mut b, 0)
        .map_err(failure("read", &path))?;
    Ok(Some(b))
}

/// Replaces `dir/name` on the real file system ([`replace_in`] with [`OsStorage`]).
///
/// # Errors
/// As [`replace_in`].
pub fn replace(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), IoFailure> {
    replace_in(&OsStorage, dir, name, bytes)
}

/// Replaces `dir/name` of `storage` with `bytes` durably (module docs). When it returns
/// `Ok`, the new file survives a crash.
///
/// # Errors
/// I/O errors (the old file, if any, is then unchanged).
pub fn replace_in<S: Storage>(
    storage: &S,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(), IoFailure> {
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(name);
    let f = storage
        .open(&tmp, OpenMode::Create)
        .map_err(failure("create", &tmp))?;
    f.write_all_at(bytes, 0).map_err(failure("write", &tmp))?;
    f.sync_all().map_err(failure("fsync", &tmp))?;
    drop(f);
    storage
        .rename(&tmp, &path)
        .map_err(failure("rename", &path))?;
    fsync_dir_in(storage, dir)
}

/// Removes `dir/name` on the real file system ([`remove_in`] with [`OsStorage`]).
///
/// # Errors
/// As [`remove_in`].
pub fn remove(dir: &Path, name: &str) -> Result<(), IoFailure> {
    remove_in(&OsStorage, dir, name)
}

/// Removes `dir/name` of `storage` durably (remove, fsync of the directory); a missing
/// file is fine.
///
/// # Errors
/// I/O errors (the file may then still be there).
pub fn remove_in<S: Storage>(storage: &S, dir: &Path, name: &str) -> Result<(), IoFailure> {
    let path = dir.join(name);
    match storage.remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(failure("remove", &path)(e)),
    }
    fsync_dir_in(storage, dir)
}

/// fsyncs `dir` on the real file system ([`fsync_dir_in`] with [`OsStorage`]).
///
/// # Errors
/// I/O errors.
pub fn fsync_dir(dir: &Path) -> Result<(), IoFailure> {
    fsync_dir_in(&OsStorage, dir)
}

/// fsyncs `dir` of `storage`, so that a rename, a new entry or a removal in it is durable.
///
/// # Errors
/// I/O errors.
pub fn fsync_dir_in<S: Storage>(storage: &S, dir: &Path) -> Result<(), IoFailure> {
    storage.sync_dir(dir).map_err(failure("fsync dir", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_file_checks_and_any_flipped_bit_is_caught() {
        let mut b = [0u8; 16];
        b[8..12].copy_from_slice(&[1, 2, 3, 4]);
        seal(&mut b, *b"TEST", 1);
        assert_eq!(check::<16>(&b, *b"TEST", 1), Ok(&b));
        for bit in 0..b.len() * 8 {
            let mut bad = b;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(check::<16>(&bad, *b"TEST", 1).is_err(), "bit {bit}");
        }
        assert_eq!(check::<16>(&b[..15], *b"TEST", 1), Err("wrong size"));
        assert_eq!(check::<16>(&b, *b"TEST", 2), Err("unsupported version"));
    }

    #[test]
    fn replace_read_and_remove_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path(), "f").unwrap().is_none());
        replace(dir.path(), "f", b"one").unwrap();
        replace(dir.path(), "f", b"two").unwrap();
        assert_eq!(read(dir.path(), "f").unwrap().as_deref(), Some(&b"two"[..]));
        assert!(!dir.path().join("f.tmp").exists());
        remove(dir.path(), "f").unwrap();
        remove(dir.path(), "f").unwrap();
        assert!(read(dir.path(), "f").unwrap().is_none());
    }
}
