//! [`PromisedEpoch`]: the store's promised epochs, one per log it hosts, kept durably in
//! their own small file.
//!
//! Every log has its own promise (docs/partitions.md): one promise shared by the logs
//! would let one log's takeover depose every other log's master, and promises kept apart
//! in memory but persisted as one value would let a deposed master's entry be stabilized
//! after a restart (`model/quire_mc_logs.py`, mutants `shared-promise` and
//! `promise-one-slot`). So the file holds a table of `(log, epoch)` and every change
//! rewrites the whole table atomically.
//!
//! File `promised_epoch` in the data directory, little-endian. Version 1, 20 bytes, is
//! written while only log 0 has a promise (every cluster without partitions: the bytes
//! are those of the single-log stores before it):
//!
//! ```text
//!  byte 0        4     5   8                  16         20
//!       +--------+-----+---+------------------+----------+
//!       | "QPEP" | ver | 0 |  epoch (u64)     | crc32c   |
//!       +--------+-----+---+------------------+----------+
//! ```
//!
//! Version 2, `16 + 16 × count + 4` bytes, once another log has a promise:
//!
//! ```text
//!  byte 0        4     5   8           12      16                                 end−4
//!       +--------+-----+---+-----------+-------+--------------------------------+--------+
//!       | "QPEP" | ver | 0 | count u32 |   0   | count × (log u32, 0 u32,       | crc32c |
//!       |        | = 2 |   | ≥ 1       |       |          epoch u64)            |        |
//!       +--------+-----+---+-----------+-------+--------------------------------+--------+
//! ```
//!
//! Entries are sorted by log, each log once, each epoch above 0 (a log without an entry
//! has promised nothing); at most [`PROMISED_LOGS_MAX`] entries. `crc32c` covers every
//! byte before it. A store writes `promised_epoch.tmp`, fsyncs it, renames it
//! over `promised_epoch` and fsyncs the directory — only then may the fence be acked. A
//! missing file means epoch 0 (nothing promised). Reading and replacing go through
//! [`crate::small_file`], the one small-file implementation (shared with the node's
//! `identity` and `tail_cut`); the magic and version are checked before the checksum here,
//! as they always were (any damage reads as [`CorruptionKind::PromisedEpochFile`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use quire_proto::{Epoch, LogId};

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
const VERSION_TABLE: u8 = 2;
const TABLE_HEADER_BYTES: usize = 16;
const ENTRY_BYTES: usize = 16;
const CRC_BYTES: usize = 4;

/// The most logs one store keeps promises for: 4,000, the partitions per broker Kafka's
/// developers advised (Confluent, "Apache Kafka Supports 200K Partitions Per Cluster",
/// 2018). The table is then at most 64,020 bytes, rewritten whole at each fence of any
/// log, and within what a small file may hold.
pub const PROMISED_LOGS_MAX: usize = 4_000;

const _: () = assert!(
    (TABLE_HEADER_BYTES + ENTRY_BYTES * PROMISED_LOGS_MAX + CRC_BYTES) as u64
        <= small_file::SMALL_FILE_BYTES_MAX
);

/// The promised epochs of one data directory, one per log, kept in `S` (the real file
/// system by default). See the module docs.
#[derive(Debug)]
pub struct PromisedEpoch<S: Storage = OsStorage> {
    storage: S,
    dir: PathBuf,
    /// Logs with a promise above 0.
    epochs: BTreeMap<LogId, Epoch>,
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
    /// Loads the promised epochs of `dir` in `storage` (none if the file does not exist):
    /// a version-1 file is log 0's promise, a version-2 file the table.
    ///
    /// # Errors
    /// [`WalError::Corruption`] ([`CorruptionKind::PromisedEpochFile`]) if the file is
    /// damaged or breaks a rule of its layout; I/O errors.
    pub fn load_in(storage: S, dir: &Path) -> Result<PromisedEpoch<S>, WalError> {
        let path = dir.join(PROMISED_EPOCH_NAME);
        let Some(bytes) =
            small_file::read_in(&storage, dir, PROMISED_EPOCH_NAME).map_err(io_error)?
        else {
            return Ok(PromisedEpoch {
                storage,
                dir: dir.to_path_buf(),
                epochs: BTreeMap::new(),
            });
        };
        let epochs = decode(&bytes).ok_or_else(|| WalError::Corruption {
            segment: path.clone(),
            position: Position(0),
            offset: quire_proto::Offset::ZERO,
            problem: CorruptionKind::PromisedEpochFile,
        })?;
        Ok(PromisedEpoch {
            storage,
            dir: dir.to_path_buf(),
            epochs,
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
            epochs: BTreeMap::new(),
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

    /// Log 0's promised epoch (the one log of a cluster without partitions).
    #[must_use]
    pub fn epoch(&self) -> Epoch {
        self.epoch_of(LogId::ZERO)
    }

    /// `log`'s promised epoch (0 if it never promised anything).
    #[must_use]
    pub fn epoch_of(&self, log: LogId) -> Epoch {
        self.epochs.get(&log).copied().unwrap_or(Epoch::ZERO)
    }

    /// Every log with a promise, in log order, with its epoch (above 0).
    pub fn promises(&self) -> impl Iterator<Item = (LogId, Epoch)> + '_ {
        self.epochs.iter().map(|(l, e)| (*l, *e))
    }

    /// Durably raises log 0's promised epoch to `epoch`: [`PromisedEpoch::store_for`].
    ///
    /// # Errors
    /// As [`PromisedEpoch::store_for`].
    pub fn store(&mut self, epoch: Epoch) -> Result<(), WalError> {
        self.store_for(LogId::ZERO, epoch)
    }

    /// Durably raises `log`'s promised epoch to `epoch`, rewriting the whole table (temp
    /// file, fsync, rename, fsync dir); the other logs' promises are unchanged. Storing
    /// the current value again does nothing.
    ///
    /// # Errors
    /// [`WalError::PromiseRegression`] if `epoch` is below `log`'s current one;
    /// [`WalError::TooManyPromises`] if `log` is new and [`PROMISED_LOGS_MAX`] logs have
    /// promises already; I/O errors (the promise is then not made, and the in-memory
    /// table is unchanged).
    pub fn store_for(&mut self, log: LogId, epoch: Epoch) -> Result<(), WalError> {
        let current = self.epoch_of(log);
        if epoch < current {
            return Err(WalError::PromiseRegression {
                current,
                requested: epoch,
            });
        }
        if epoch == current {
            return Ok(());
        }
        if current == Epoch::ZERO && self.epochs.len() >= PROMISED_LOGS_MAX {
            return Err(WalError::TooManyPromises {
                max: PROMISED_LOGS_MAX,
            });
        }
        let mut next = self.epochs.clone();
        next.insert(log, epoch);
        let bytes = encode(&next);
        small_file::replace_in(&self.storage, &self.dir, PROMISED_EPOCH_NAME, &bytes)
            .map_err(io_error)?;
        self.epochs = next;
        Ok(())
    }
}

/// The file's bytes for `epochs` (every epoch above 0): version 1 when only log 0 has a
/// promise (or none has), else version 2.
fn encode(epochs: &BTreeMap<LogId, Epoch>) -> Vec<u8> {
    if epochs.keys().all(|l| *l == LogId::ZERO) {
        let mut bytes = vec![0u8; FILE_BYTES];
        let epoch = epochs.get(&LogId::ZERO).copied().unwrap_or(Epoch::ZERO);
        bytes[8..16].copy_from_slice(&epoch.0.to_le_bytes());
        small_file::seal(&mut bytes, MAGIC, VERSION);
        return bytes;
    }
    let mut bytes = vec![0u8; TABLE_HEADER_BYTES + ENTRY_BYTES * epochs.len() + CRC_BYTES];
    let count = u32::try_from(epochs.len()).expect("invariant: at most PROMISED_LOGS_MAX logs");
    bytes[8..12].copy_from_slice(&count.to_le_bytes());
    for (i, (log, epoch)) in epochs.iter().enumerate() {
        let at = TABLE_HEADER_BYTES + i * ENTRY_BYTES;
        bytes[at..at + 4].copy_from_slice(&log.0.to_le_bytes());
        bytes[at + 8..at + 16].copy_from_slice(&epoch.0.to_le_bytes());
    }
    small_file::seal(&mut bytes, MAGIC, VERSION_TABLE);
    bytes
}

/// The table in a file's bytes, or `None` if they are damaged or break a layout rule.
fn decode(bytes: &[u8]) -> Option<BTreeMap<LogId, Epoch>> {
    if bytes.len() < FILE_BYTES || bytes[0..4] != MAGIC {
        return None;
    }
    let crc_at = bytes.len() - CRC_BYTES;
    let stored = u32::from_le_bytes(bytes[crc_at..].try_into().ok()?);
    if crc32c::crc32c(&bytes[..crc_at]) != stored || bytes[5..8] != [0, 0, 0] {
        return None;
    }
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let mut epochs = BTreeMap::new();
    match bytes[4] {
        VERSION if bytes.len() == FILE_BYTES => {
            let epoch = Epoch(small_file::u64_at(bytes, 8));
            if epoch > Epoch::ZERO {
                epochs.insert(LogId::ZERO, epoch);
            }
        }
        VERSION_TABLE => {
            let count = u32_at(8)? as usize;
            if count == 0
                || count > PROMISED_LOGS_MAX
                || u32_at(12)? != 0
                || bytes.len() != TABLE_HEADER_BYTES + ENTRY_BYTES * count + CRC_BYTES
            {
                return None;
            }
            let mut last: Option<LogId> = None;
            for i in 0..count {
                let at = TABLE_HEADER_BYTES + i * ENTRY_BYTES;
                let log = LogId(u32_at(at)?);
                let epoch = Epoch(small_file::u64_at(bytes, at + 8));
                if u32_at(at + 4)? != 0 || epoch == Epoch::ZERO || last.is_some_and(|l| l >= log) {
                    return None;
                }
                last = Some(log);
                epochs.insert(log, epoch);
            }
        }
        _ => return None,
    }
    Some(epochs)
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

    /// Promises are per log: raising one log's leaves the others' as they were, on disk
    /// too, and each goes only up. The table survives a crash that loses every un-synced
    /// change (the model's `promise-one-slot` mutant is what a single persisted value
    /// would be).
    #[test]
    fn each_log_has_its_own_promise_and_all_survive_a_crash() {
        let disk = crate::CrashDisk::new(11);
        let dir = Path::new("/d/wal");
        let mut p = PromisedEpoch::create_in(disk.clone(), dir).unwrap();
        p.store(Epoch(5)).unwrap();
        p.store_for(LogId(7), Epoch(3)).unwrap();
        p.store_for(LogId(2), Epoch(9)).unwrap();
        assert_eq!(p.epoch_of(LogId(7)), Epoch(3));
        assert_eq!(p.epoch_of(LogId(8)), Epoch::ZERO);
        assert!(matches!(
            p.store_for(LogId(2), Epoch(8)),
            Err(WalError::PromiseRegression { .. })
        ));
        // A lower epoch for another log is fine: promises are not compared across logs.
        p.store_for(LogId(3), Epoch(1)).unwrap();
        disk.crash();
        let back = PromisedEpoch::load_in(disk.clone(), dir).unwrap();
        let all: Vec<_> = back.promises().collect();
        assert_eq!(
            all,
            vec![
                (LogId::ZERO, Epoch(5)),
                (LogId(2), Epoch(9)),
                (LogId(3), Epoch(1)),
                (LogId(7), Epoch(3)),
            ]
        );
        assert_eq!(back.epoch(), Epoch(5));
    }

    /// While only log 0 has a promise the file is version 1, as single-log stores wrote
    /// it; the first promise of another log makes it version 2; a store without log 0's
    /// promise reads epoch 0 for it.
    #[test]
    fn the_file_is_version_1_until_another_log_promises() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PROMISED_EPOCH_NAME);
        let mut p = PromisedEpoch::load(dir.path()).unwrap();
        p.store(Epoch(4)).unwrap();
        assert_eq!(fs::read(&path).unwrap().len(), FILE_BYTES);
        p.store_for(LogId(1), Epoch(6)).unwrap();
        let b = fs::read(&path).unwrap();
        assert_eq!(b.len(), 16 + 2 * 16 + 4);
        assert_eq!(&b[0..8], &[b'Q', b'P', b'E', b'P', 2, 0, 0, 0]);
        assert_eq!(&b[8..12], &2u32.to_le_bytes());
        assert_eq!(&b[32..36], &1u32.to_le_bytes());
        assert_eq!(&b[40..48], &6u64.to_le_bytes());
        let mut only_other = PromisedEpoch::load(tempfile::tempdir().unwrap().path()).unwrap();
        let other_dir = tempfile::tempdir().unwrap();
        only_other.dir = other_dir.path().to_path_buf();
        only_other.store_for(LogId(9), Epoch(2)).unwrap();
        let back = PromisedEpoch::load(other_dir.path()).unwrap();
        assert_eq!(
            (back.epoch(), back.epoch_of(LogId(9))),
            (Epoch::ZERO, Epoch(2))
        );
    }

    /// Every way a version-2 file can break its layout reads as damage, never as a
    /// smaller table: a flipped bit, a count that disagrees with the size, logs out of
    /// order or repeated, a zero epoch, a set padding word, a count above the bound.
    #[test]
    fn a_broken_table_is_reported_as_damage() {
        let mut good = BTreeMap::new();
        good.insert(LogId(1), Epoch(2));
        good.insert(LogId(4), Epoch(5));
        let bytes = encode(&good);
        assert_eq!(decode(&bytes), Some(good));
        let reseal = |mut b: Vec<u8>| {
            let at = b.len() - 4;
            let crc = crc32c::crc32c(&b[..at]);
            b[at..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert_eq!(decode(&flipped), None, "flipped bit");
        let mut count = bytes.clone();
        count[8] = 3;
        assert_eq!(decode(&reseal(count)), None, "count");
        let mut order = bytes.clone();
        order[32] = 1; // the second entry's log becomes 1, as the first's
        assert_eq!(decode(&reseal(order)), None, "repeated log");
        let mut zero = bytes.clone();
        zero[24..32].fill(0);
        assert_eq!(decode(&reseal(zero)), None, "zero epoch");
        let mut pad = bytes.clone();
        pad[20] = 1;
        assert_eq!(decode(&reseal(pad)), None, "padding word");
        let mut over = bytes.clone();
        over[8..12].copy_from_slice(&(PROMISED_LOGS_MAX as u32 + 1).to_le_bytes());
        assert_eq!(decode(&reseal(over)), None, "count above the bound");
        let mut version = bytes;
        version[4] = 3;
        assert_eq!(decode(&reseal(version)), None, "unknown version");
    }

    /// A promise for one log more than the bound is refused, and nothing is written.
    #[test]
    fn a_promise_past_the_bound_on_logs_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = PromisedEpoch::load(dir.path()).unwrap();
        p.epochs = (0..PROMISED_LOGS_MAX as u32)
            .map(|l| (LogId(l), Epoch(1)))
            .collect();
        assert!(matches!(
            p.store_for(LogId(u32::MAX), Epoch(1)),
            Err(WalError::TooManyPromises { .. })
        ));
        assert!(!dir.path().join(PROMISED_EPOCH_NAME).exists());
        // A log already in the table may still raise its promise.
        p.store_for(LogId(3), Epoch(2)).unwrap();
        assert_eq!(
            PromisedEpoch::load(dir.path()).unwrap().promises().count(),
            PROMISED_LOGS_MAX
        );
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
