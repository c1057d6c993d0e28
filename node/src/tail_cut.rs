//! The tail-cut mark: a store whose WAL recovery cut a torn tail remembers it durably until
//! it has caught up with a later master (docs/protocol.md, "Tail-cut marks").
//!
//! The WAL's recovery cannot tell a torn write (a batch the crash interrupted, never acked)
//! from a bit flip in the last durable record (acked, perhaps stabilized): both end the log
//! with a bad record and nothing valid after it. So every cut may have removed an acked
//! event, and the store must not vote as if its log held everything it acked. It writes
//! this mark **before** the cut changes anything on disk (from the WAL's pre-cut hook), so
//! a crash between the two leaves the mark and the tail, never a cut without a mark; it
//! reports the mark in every `FenceGranted`; brokers count such a grant toward the fence
//! quorum only when every store granted. The store clears the mark once its **durable**
//! log holds an entry of an epoch above the promised epoch at the cut: a later master wrote
//! it, and the store then holds that master's adopted log.
//!
//! File `tail_cut` in the data directory, 24 bytes, little-endian:
//!
//! ```text
//!  byte 0        4     5       8                16               24
//!       +--------+-----+-------+----------------+----------------+
//!       | "QTCM" | ver | 0 0 0 | offset u64     | promised u64   |
//!       +--------+-----+-------+----------------+----------------+
//!  then crc32c u32 over bytes 0..24 (28 bytes in all)
//! ```
//!
//! `ver` is 1; `offset` is the first offset the cut may have removed; `promised` is the
//! store's promised epoch when it cut. The file is written to `tail_cut.tmp`, fsynced,
//! renamed over `tail_cut`, and the directory fsynced; clearing removes it and fsyncs the
//! directory. No file: no mark.

use std::io;
use std::path::{Path, PathBuf};

use quire_proto::{Epoch, Offset, TailCut};

use quire_wal::small_file::{self, IoFailure};
use quire_wal::{OsStorage, Storage};

/// File name of the mark inside a data directory.
pub const TAIL_CUT_FILE_NAME: &str = "tail_cut";
const MAGIC: [u8; 4] = *b"QTCM";
const VERSION: u8 = 1;
const FILE_BYTES: usize = 28;

/// Why the mark could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum TailCutError {
    /// The file exists but is damaged: the store cannot know whether it is marked.
    #[error("tail-cut mark {} is damaged: {problem}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: &'static str,
    },
    /// A system call failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl From<IoFailure> for TailCutError {
    fn from(f: IoFailure) -> Self {
        TailCutError::Io {
            op: f.op,
            path: f.path,
            source: f.source,
        }
    }
}

/// The file's bytes for `cut`.
#[must_use]
pub fn to_bytes(cut: TailCut) -> [u8; FILE_BYTES] {
    let mut b = [0u8; FILE_BYTES];
    b[8..16].copy_from_slice(&cut.offset.0.to_le_bytes());
    b[16..24].copy_from_slice(&cut.promised.0.to_le_bytes());
    small_file::seal(&mut b, MAGIC, VERSION);
    b
}

/// Parses the file's bytes.
///
/// # Errors
/// The problem found, for [`TailCutError::Corrupt`].
pub fn from_bytes(b: &[u8]) -> Result<TailCut, &'static str> {
    let b = small_file::check::<FILE_BYTES>(b, MAGIC, VERSION)?;
    Ok(TailCut {
        offset: Offset(small_file::u64_at(b, 8)),
        promised: Epoch(small_file::u64_at(b, 16)),
    })
}

/// Loads the mark of data directory `dir` (`None`: not marked).
///
/// # Errors
/// [`TailCutError::Corrupt`] for a damaged file (the store must not start: it cannot know
/// whether it lost acked events); I/O errors.
pub fn load(dir: &Path) -> Result<Option<TailCut>, TailCutError> {
    load_in(&OsStorage, dir)
}

/// [`load`] on `storage` (the simulator's crash-tracking disk).
///
/// # Errors
/// As [`load`].
pub fn load_in<S: Storage>(storage: &S, dir: &Path) -> Result<Option<TailCut>, TailCutError> {
    let Some(b) = small_file::read_in(storage, dir, TAIL_CUT_FILE_NAME)? else {
        return Ok(None);
    };
    from_bytes(&b)
        .map(Some)
        .map_err(|problem| TailCutError::Corrupt {
            path: dir.join(TAIL_CUT_FILE_NAME),
            problem,
        })
}

/// Writes `cut` as `dir`'s mark, durably (temp file, fsync, rename, fsync of the
/// directory). When it returns `Ok`, the mark survives a crash.
///
/// # Errors
/// I/O errors (the old file, if any, is then unchanged).
pub fn store(dir: &Path, cut: TailCut) -> Result<(), TailCutError> {
    store_in(&OsStorage, dir, cut)
}

/// [`store`] on `storage`.
///
/// # Errors
/// As [`store`].
pub fn store_in<S: Storage>(storage: &S, dir: &Path, cut: TailCut) -> Result<(), TailCutError> {
    Ok(small_file::replace_in(
        storage,
        dir,
        TAIL_CUT_FILE_NAME,
        &to_bytes(cut),
    )?)
}

/// Removes `dir`'s mark durably (remove, fsync of the directory). A missing file is fine.
///
/// # Errors
/// I/O errors (the mark may then still be there: the store stays marked, the safe side).
pub fn clear(dir: &Path) -> Result<(), TailCutError> {
    clear_in(&OsStorage, dir)
}

/// [`clear`] on `storage`.
///
/// # Errors
/// As [`clear`].
pub fn clear_in<S: Storage>(storage: &S, dir: &Path) -> Result<(), TailCutError> {
    Ok(small_file::remove_in(storage, dir, TAIL_CUT_FILE_NAME)?)
}

/// The mark after a cut at `offset` with promised epoch `promised`, given the mark already
/// on disk: a store cut twice before it caught up keeps the lower offset and the higher
/// promised epoch (only a master above both clears it).
#[must_use]
pub fn merge(old: Option<TailCut>, offset: Offset, promised: Epoch) -> TailCut {
    match old {
        None => TailCut { offset, promised },
        Some(o) => TailCut {
            offset: o.offset.min(offset),
            promised: o.promised.max(promised),
        },
    }
}

/// Whether a store marked with `cut` whose last durable entry has epoch `last_epoch` may
/// clear its mark: that entry was written by a master of a later epoch than any ack the
/// lost records got.
#[must_use]
pub fn clears(cut: TailCut, last_epoch: Option<Epoch>) -> bool {
    last_epoch.is_some_and(|e| e > cut.promised)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn store_load_clear_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(load(dir.path()).expect("load"), None);
        let cut = TailCut {
            offset: Offset(41),
            promised: Epoch(0x3_0002),
        };
        store(dir.path(), cut).expect("store");
        assert_eq!(load(dir.path()).expect("load"), Some(cut));
        assert!(!dir.path().join("tail_cut.tmp").exists());
        clear(dir.path()).expect("clear");
        assert_eq!(load(dir.path()).expect("load"), None);
        clear(dir.path()).expect("clearing twice is fine");
    }

    #[test]
    fn a_damaged_mark_is_an_error_not_an_absent_mark() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut b = to_bytes(TailCut {
            offset: Offset(1),
            promised: Epoch(2),
        });
        b[9] ^= 0x10;
        fs::write(dir.path().join(TAIL_CUT_FILE_NAME), b).expect("write");
        assert!(matches!(
            load(dir.path()),
            Err(TailCutError::Corrupt {
                problem: "checksum mismatch",
                ..
            })
        ));
        fs::write(dir.path().join(TAIL_CUT_FILE_NAME), &b[..10]).expect("write");
        assert!(matches!(
            load(dir.path()),
            Err(TailCutError::Corrupt {
                problem: "wrong size",
                ..
            })
        ));
    }

    #[test]
    fn a_second_cut_keeps_the_lower_offset_and_the_higher_promise() {
        let first = merge(None, Offset(9), Epoch(5));
        assert_eq!(
            first,
            TailCut {
                offset: Offset(9),
                promised: Epoch(5)
            }
        );
        assert_eq!(
            merge(Some(first), Offset(7), Epoch(6)),
            TailCut {
                offset: Offset(7),
                promised: Epoch(6)
            }
        );
    }

    #[test]
    fn only_an_entry_above_the_promised_epoch_at_the_cut_clears_the_mark() {
        let cut = TailCut {
            offset: Offset(3),
            promised: Epoch(0x2_0001),
        };
        assert!(!clears(cut, None));
        assert!(!clears(cut, Some(Epoch(0x1_0002))));
        assert!(
            !clears(cut, Some(Epoch(0x2_0001))),
            "the same epoch acked the lost records"
        );
        assert!(clears(cut, Some(Epoch(0x3_0002))));
    }
}
