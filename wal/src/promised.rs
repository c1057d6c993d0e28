//! [`PromisedEpoch`]: the store's promised epoch, kept durably in its own small file.
//!
//! File `promised_epoch` in the data directory, 20 bytes, little-endian:
//!
//! ```text
//!  byte 0        4     5   8                  16         20
//!       +--------+-----+---+------------------+----------+
//!       | "QPEP" | ver | 0 |  epoch (u64)     | crc32c   |
//!       +--------+-----+---+------------------+----------+
//! ```
//!
//! `crc32c` covers bytes 0..16. A store writes `promised_epoch.tmp`, fsyncs it, renames it
//! over `promised_epoch` and fsyncs the directory — only then may the fence be acked. A
//! missing file means epoch 0 (nothing promised). Reading and replacing go through
//! [`crate::small_file`], the one small-file implementation (shared with the node's
//! `identity` and `tail_cut`); the magic and version are checked before the checksum here,
//! as they always were (any damage reads as [`CorruptionKind::PromisedEpochFile`]).

use std::path::{Path, PathBuf};

use quire_proto::Epoch;

use crate::error::{CorruptionKind, WalError};
use crate::small_file::{self, IoFailure};
use crate::storage::{OsStorage, Storage};
use crate::Position;

/// File name of the promised epoch.
pub const PROMISED_EPOCH_NAME: &str = "promised_epoch";
#[cfg(test)]
const TMP_NAME: &str = "promised_epoch.tmp";
const MAGIC: [u8; 4] = *b"QPEP";
const VERSION: u8 = 1;
const FILE_BYTES: usize = 20;

/// The promised epoch of one data directory, kept in `S` (the real file system by
/// default). See the module docs.
#[derive(Debug)]
pub struct PromisedEpoch<S: Storage = OsStorage> {
    storage: S,
    dir: PathBuf,
    epoch: Epoch,
}

impl PromisedEpoch {
    /// Loads the promised epoch of `dir` on the real file system (epoch 0 if the file does
    /// not exist).
    ///
    /// # Errors
    /// [`WalError::Corruption`] if the file is damaged; I/O errors.
    pub fn load(dir: &Path) -> Result<PromisedEpoch, WalError> {
        PromisedEpoch::load_in(OsStorage, dir)
    }
}

impl<S: Storage> PromisedEpoch<S> {
    /// Loads the promised epoch of `dir` in `storage` (epoch 0 if the file does not exist).
    ///
    /// # Errors
    /// [`WalError::Corruption`] if the file is damaged; I/O errors.
    pub fn load_in(storage: S, dir: &Path) -> Result<PromisedEpoch<S>, WalError> {
        let path = dir.join(PROMISED_EPOCH_NAME);
        let Some(bytes) =
            small_file::read_in(&storage, dir, PROMISED_EPOCH_NAME).map_err(io_error)?
        else {
            return Ok(PromisedEpoch {
                storage,
                dir: dir.to_path_buf(),
                epoch: Epoch::ZERO,
            });
        };
        let damaged = || WalError::Corruption {
            segment: path.clone(),
            position: Position(0),
            offset: quire_proto::Offset::ZERO,
            problem: CorruptionKind::PromisedEpochFile,
        };
        if bytes.len() != FILE_BYTES || bytes[0..4] != MAGIC || bytes[4] != VERSION {
            return Err(damaged());
        }
        let b = small_file::check::<FILE_BYTES>(&bytes, MAGIC, VERSION).map_err(|_| damaged())?;
        Ok(PromisedEpoch {
            storage,
            dir: dir.to_path_buf(),
            epoch: Epoch(small_file::u64_at(b, 8)),
        })
    }

    /// Writes the file of a store that has promised nothing yet (epoch 0), durably, in
    /// `dir` (created if missing): `quire-node init` does, so that a store whose file is
    /// later missing is known to have lost its WAL directory.
    ///
    /// # Errors
    /// I/O errors.
    pub fn create_in(storage: S, dir: &Path) -> Result<PromisedEpoch<S>, WalError> {
        storage
            .create_dir_all(dir)
            .map_err(|e| WalError::io("create dir", dir, e))?;
        let mut bytes = [0u8; FILE_BYTES];
        small_file::seal(&mut bytes, MAGIC, VERSION);
        small_file::replace_in(&storage, dir, PROMISED_EPOCH_NAME, &bytes).map_err(io_error)?;
        Ok(PromisedEpoch {
            storage,
            dir: dir.to_path_buf(),
            epoch: Epoch::ZERO,
        })
    }

    /// Whether `dir` holds a promised-epoch file (damaged or not).
    ///
    /// # Errors
    /// I/O errors other than the file's absence.
    pub fn is_present_in(storage: &S, dir: &Path) -> Result<bool, WalError> {
        Ok(small_file::read_in(storage, dir, PROMISED_EPOCH_NAME)
            .map_err(io_error)?
            .is_some())
    }

    /// The promised epoch.
    #[must_use]
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Durably raises the promised epoch to `epoch` (temp file, fsync, rename, fsync dir).
    /// Storing the current value again does nothing.
    ///
    /// # Errors
    /// [`WalError::PromiseRegression`] if `epoch` is below the current one; I/O errors (the
    /// promise is then not made, and the in-memory value is unchanged).
    pub fn store(&mut self, epoch: Epoch) -> Result<(), WalError> {
        if epoch < self.epoch {
            return Err(WalError::PromiseRegression {
                current: self.epoch,
                requested: epoch,
            });
        }
        if epoch == self.epoch {
            return Ok(());
        }
        let mut bytes = [0u8; FILE_BYTES];
        bytes[8..16].copy_from_slice(&epoch.0.to_le_bytes());
        small_file::seal(&mut bytes, MAGIC, VERSION);
        small_file::replace_in(&self.storage, &self.dir, PROMISED_EPOCH_NAME, &bytes)
            .map_err(io_error)?;
        self.epoch = epoch;
        Ok(())
    }
}

fn io_error(f: IoFailure) -> WalError {
    WalError::io(f.op, f.path, f.source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// `create_in` (as `quire-node init`), then a raise: the raise survives a crash that
    /// loses every un-synced change (a rename over the existing file included).
    #[test]
    fn a_raise_over_the_created_file_survives_a_crash() {
        let disk = crate::CrashDisk::new(7);
        let dir = Path::new("/d/wal");
        let created = PromisedEpoch::create_in(disk.clone(), dir).unwrap();
        assert_eq!(created.epoch(), Epoch::ZERO);
        assert!(PromisedEpoch::is_present_in(&disk, dir).unwrap());
        let mut p = PromisedEpoch::load_in(disk.clone(), dir).unwrap();
        p.store(Epoch(5)).unwrap();
        disk.crash();
        assert_eq!(
            PromisedEpoch::load_in(disk.clone(), dir).unwrap().epoch(),
            Epoch(5)
        );
    }

    #[test]
    fn store_load_and_refuse_to_go_down() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = PromisedEpoch::load(dir.path()).unwrap();
        assert_eq!(p.epoch(), Epoch::ZERO);
        p.store(Epoch(7)).unwrap();
        assert_eq!(PromisedEpoch::load(dir.path()).unwrap().epoch(), Epoch(7));
        assert!(matches!(
            p.store(Epoch(6)),
            Err(WalError::PromiseRegression { .. })
        ));
        p.store(Epoch(7)).unwrap();
        p.store(Epoch(9)).unwrap();
        assert_eq!(PromisedEpoch::load(dir.path()).unwrap().epoch(), Epoch(9));
        assert!(!dir.path().join(TMP_NAME).exists());
    }

    #[test]
    fn damaged_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = PromisedEpoch::load(dir.path()).unwrap();
        p.store(Epoch(3)).unwrap();
        let path = dir.path().join(PROMISED_EPOCH_NAME);
        let mut b = fs::read(&path).unwrap();
        b[9] ^= 0x10;
        fs::write(&path, &b).unwrap();
        let err = PromisedEpoch::load(dir.path()).unwrap_err();
        assert!(err.is_corruption(), "{err}");
    }

    /// The file is byte for byte what the pre-unification code wrote (golden bytes), so
    /// existing data directories keep opening.
    #[test]
    fn golden_bytes_are_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = PromisedEpoch::load(dir.path()).unwrap();
        p.store(Epoch(0x0102_0304_0506_0708)).unwrap();
        let b = fs::read(dir.path().join(PROMISED_EPOCH_NAME)).unwrap();
        let mut want = [0u8; FILE_BYTES];
        want[0..4].copy_from_slice(b"QPEP");
        want[4] = 1;
        want[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        let crc = crc32c::crc32c(&want[..16]);
        want[16..20].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(b, want);
    }
}
