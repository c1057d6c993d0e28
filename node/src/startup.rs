//! A store's start-up on its data directory, generic over the [`Storage`] it lives in: the
//! real file system for `quire-node`, the crash-tracking [`quire_wal::CrashDisk`] for
//! quire-sim, so both run the same steps.
//!
//! The steps, in order: load the identity; load the promised epoch; load the tail-cut
//! mark; open the WAL, whose recovery calls back before it cuts a torn tail so the mark
//! (merged with any mark already there) is written durably first (docs/protocol.md,
//! "Tail-cut marks"); refuse a log holding entries above the promised epoch (the
//! promised-epoch file was lost or replaced); drop a mark the durable log already
//! satisfies.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use quire_proto::{Epoch, TailCut};
use quire_wal::disk::Disk;
use quire_wal::{
    Mutations, PromisedEpoch, RecoveryReport, Storage, TornTail, Wal, WalConfig, WalError,
};

use crate::identity::{Identity, IdentityError};
use crate::tail_cut::{self, TailCutError};

/// A data directory opened by [`open_data_dir`], ready to serve.
#[derive(Debug)]
pub struct Opened<S: Storage> {
    /// The identity file's contents.
    pub identity: Identity,
    /// The recovered WAL.
    pub wal: Wal<S>,
    /// What recovery found and did.
    pub report: RecoveryReport,
    /// The promised-epoch file.
    pub promised: PromisedEpoch<S>,
    /// The tail-cut mark the store carries after start-up, if any.
    pub tail_cut: Option<TailCut>,
}

/// Why a store cannot start on its data directory.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The identity file is missing, damaged or unreadable.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The promised-epoch file is damaged or unreadable.
    // The source is not in the message: printed with its chain (`{:#}`, as quire-node's
    // main does), it would read twice.
    #[error("loading the promised epoch in {}", dir.display())]
    Promised {
        /// The WAL directory.
        dir: PathBuf,
        /// The error.
        #[source]
        source: WalError,
    },
    /// The tail-cut mark is damaged or cannot be read, written or removed.
    #[error(transparent)]
    TailCut(#[from] TailCutError),
    /// The WAL cannot be opened: corruption found by recovery ([`WalError::Corruption`]:
    /// nothing was changed), a lock held, I/O errors.
    #[error("opening the WAL in {}", dir.display())]
    Wal {
        /// The WAL directory.
        dir: PathBuf,
        /// The error.
        #[source]
        source: WalError,
    },
    /// The WAL directory has no promised-epoch file, which `quire-node init` writes: the
    /// directory was deleted or replaced.
    #[error(
        "{} has no promised-epoch file, which `quire-node init` writes: the WAL directory was \
         deleted or replaced, so this store may have acked entries it no longer holds and must \
         not vote under its identity. Bring it back as for a replaced disk (docs/operations.md, \
         \"A replaced or wiped disk\"); a directory initialised by a Quire build older than \
         this check and never run: initialise it again",
        dir.display()
    )]
    WalMissing {
        /// The WAL directory.
        dir: PathBuf,
    },
    /// The log holds entries of an epoch above the promised epoch.
    #[error(
        "the log in {} holds entries of epoch {last_epoch} but the promised epoch is {promised}: \
         the promised-epoch file was lost or replaced, so this store may have forgotten fences \
         it granted; it must not vote again. Re-initialise it as a learner \
         (`quire-node init --learner` on an empty directory)",
        dir.display()
    )]
    PromiseBehindLog {
        /// The WAL directory.
        dir: PathBuf,
        /// The epoch of the log's last durable entry.
        last_epoch: Epoch,
        /// The promised epoch on disk.
        promised: Epoch,
    },
}

impl StartError {
    /// Whether the WAL's recovery found corruption (the operator must re-initialise).
    #[must_use]
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            StartError::Wal {
                source: WalError::Corruption { .. },
                ..
            }
        )
    }
}

/// Opens the store in `data_dir` of `storage` with its WAL in `wal_config.dir` (see the
/// module docs for the steps). `disk`: the WAL's write-path disk (`None`: the storage's own
/// for `wal_config.io`); `mutations`: the WAL's test-only planted bugs (none by default).
///
/// # Errors
/// [`StartError`]: nothing is served. On [`StartError::Wal`] with corruption the WAL is
/// unchanged; a tail-cut mark may already have been written if the failure came after it.
pub fn open_data_dir<S: Storage>(
    storage: S,
    data_dir: &Path,
    wal_config: WalConfig,
    disk: Option<Box<dyn Disk<S::File>>>,
    mutations: Mutations,
) -> Result<Opened<S>, StartError> {
    let identity = Identity::load_in(&storage, data_dir)?;
    let wal_dir = wal_config.dir.clone();
    // `quire-node init` writes the promised-epoch file: without it the WAL directory was
    // deleted or replaced, and the store may have acked entries it no longer holds.
    let present = PromisedEpoch::is_present_in(&storage, &wal_dir).map_err(|source| {
        StartError::Promised {
            dir: wal_dir.clone(),
            source,
        }
    })?;
    if !present {
        return Err(StartError::WalMissing { dir: wal_dir });
    }
    let promised = PromisedEpoch::load_in(storage.clone(), &wal_dir).map_err(|source| {
        StartError::Promised {
            dir: wal_dir.clone(),
            source,
        }
    })?;
    let mut mark = tail_cut::load_in(&storage, data_dir)?;
    // docs/protocol.md "Tail-cut marks": the cut may have removed an acked record with a
    // flipped bit; the mark is durable before the WAL changes anything.
    let mark_storage = storage.clone();
    let mut before_cut = |t: &TornTail| -> Result<(), WalError> {
        let cut = tail_cut::merge(mark, t.offset, promised.epoch());
        tail_cut::store_in(&mark_storage, data_dir, cut).map_err(|e| WalError::Io {
            op: "write the tail-cut mark",
            path: data_dir.join(tail_cut::TAIL_CUT_FILE_NAME),
            source: Arc::new(std::io::Error::other(e.to_string())),
        })?;
        tracing::warn!(cut_offset = %cut.offset, cut_promised = %cut.promised, "recovery cuts a torn tail: the store is marked and its fence grants count only when every store grants, until it catches up with a later master");
        mark = Some(cut);
        Ok(())
    };
    let (wal, report) = Wal::open_in(
        storage.clone(),
        wal_config,
        disk,
        &mut before_cut,
        mutations,
    )
    .map_err(|source| StartError::Wal {
        dir: wal_dir.clone(),
        source,
    })?;
    // A store raises its promise durably before it writes an entry of a new epoch, so an
    // entry above the promise means the promised-epoch file was lost or replaced: the
    // store has forgotten fences it granted and must not serve.
    if let Some(last) = wal.last_durable() {
        if last.epoch > promised.epoch() {
            return Err(StartError::PromiseBehindLog {
                dir: wal_dir,
                last_epoch: last.epoch,
                promised: promised.epoch(),
            });
        }
    }
    if let Some(cut) = mark {
        // Caught up before a crash that came before the clearing.
        if tail_cut::clears(cut, wal.last_durable().map(|l| l.epoch)) {
            tail_cut::clear_in(&storage, data_dir)?;
            mark = None;
        }
    }
    Ok(Opened {
        identity,
        wal,
        report,
        promised,
        tail_cut: mark,
    })
}
