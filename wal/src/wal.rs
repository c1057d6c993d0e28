//! [`Wal`]: the handle the node uses — open (with recovery), append, read, inspect state.
//!
//! A `Wal` is a cheap clone of a handle to one data directory's commit thread. The thread
//! stops (after writing what is queued) when the last handle is dropped or
//! [`Wal::close`] is called.

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use quire_proto::{Epoch, Event, LogPosition, Offset, RepairOutcome};

use crate::append::{AckSlot, Append};
use crate::commit::{CommitState, Committer, Request, Shared};
use crate::disk::{self, Disk};
use crate::error::WalError;
use crate::format::{
    self, align_down, align_up, record_bytes, SegmentTag, HEADER_BYTES, PAYLOAD_BYTES_MAX,
};
use crate::recovery::{self, RecoveryReport};
use crate::scan::DamagedRecords;
use crate::segment::{DirLock, Preallocator, Recycler, SpareFill};
use crate::stats::{Counters, WalStats};
use crate::storage::{OsStorage, Storage, StorageFile};
use crate::Mutations;

/// Smallest accepted `segment_bytes_max`, in bytes.
pub const SEGMENT_BYTES_MIN: u64 = 64 * 1024;
/// Largest accepted `segment_bytes_max`, in bytes (positions in the index are 32-bit).
pub const SEGMENT_BYTES_LIMIT: u64 = 1 << 32;

/// Which disk implementation the commit thread uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoBackend {
    /// io_uring when available, else the synchronous fallback (with a warning in the log).
    #[default]
    Auto,
    /// io_uring, or fail to open.
    Uring,
    /// `pwrite` + `fdatasync` on the commit thread.
    Sync,
}

/// How to open a WAL. Sizes are bytes, times microseconds.
#[derive(Clone, Debug)]
pub struct WalConfig {
    /// The data directory (created if missing).
    pub dir: PathBuf,
    /// Size of a segment file, in bytes (rounded down to the alignment). A segment rolls
    /// when the next batch does not fit. Default 256 MiB; at least [`SEGMENT_BYTES_MIN`].
    pub segment_bytes_max: u64,
    /// Most bytes one batch (one write) carries, in bytes; a single append larger than
    /// this still goes out as one batch. Default 1 MiB.
    pub batch_bytes_max: u64,
    /// How long, in microseconds, the first append of a batch may wait for others when the
    /// disk is idle and the last fdatasync released several appends (so appenders are
    /// concurrent); a lone appender never waits. 0 never waits: batching then comes only
    /// from appends that arrive while an fdatasync runs. Default 200.
    pub batch_window_us: u64,
    /// Most bytes queued and not yet taken into a batch, in bytes; an append beyond it is
    /// refused with [`WalError::TooLarge`] (`what = "queue"`). Default 256 MiB.
    pub queue_bytes_max: u64,
    /// The disk implementation. Default [`IoBackend::Auto`].
    pub io: IoBackend,
    /// A fresh log ends its first segment at a random point between half and all of
    /// `segment_bytes_max` (rolls after that take whole segments), so that logs receiving
    /// the same appends — a cluster's stores — do not roll at the same moment: a roll then
    /// delays at most one store of a quorum. The point comes from
    /// [`crate::Storage::random_u64`]. Default `false`; quire-node turns it on.
    pub stagger_rolls: bool,
    /// How a fresh spare segment is prepared. Default [`SpareFill::Zeros`].
    pub spare_fill: SpareFill,
    /// What opening does with a damaged record that valid records follow. Default
    /// [`DamagedRecords::Refuse`] (the open fails with a located
    /// [`WalError::Corruption`]); quire-node uses [`DamagedRecords::Place`]: the log opens
    /// with the record in [`Wal::corrupt_records`], to be repaired with
    /// [`Wal::repair_record`].
    pub damaged_records: DamagedRecords,
}

impl WalConfig {
    /// The defaults for `dir`.
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> WalConfig {
        WalConfig {
            dir: dir.into(),
            ..WalConfig::default()
        }
    }
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            dir: PathBuf::from("data"),
            segment_bytes_max: 256 << 20,
            batch_bytes_max: 1 << 20,
            batch_window_us: 200,
            queue_bytes_max: 256 << 20,
            io: IoBackend::Auto,
            stagger_rolls: false,
            spare_fill: SpareFill::Zeros,
            damaged_records: DamagedRecords::Refuse,
        }
    }
}

/// A handle to an open write-ahead log whose files live in `S` (the real file system by
/// default). `Clone + Send + Sync`; see the module docs.
#[derive(Debug)]
pub struct Wal<S: Storage = OsStorage> {
    inner: Arc<WalInner<S>>,
}

impl<S: Storage> Clone for Wal<S> {
    fn clone(&self) -> Self {
        Wal {
            inner: self.inner.clone(),
        }
    }
}

#[derive(Debug)]
struct WalInner<S: Storage> {
    shared: Arc<Shared<S>>,
    recycler: Recycler<S>,
    thread: Mutex<Option<JoinHandle<()>>>,
    _lock: DirLock<S>,
}

/// The offsets of durable records known damaged (found by a read, or placed at open), at
/// most [`CORRUPT_RECORDS_MAX`]; see [`Wal::corrupt_records`]. Shared with the commit
/// thread, which forgets those a truncation replaces.
#[derive(Debug)]
pub(crate) struct Damaged {
    set: Mutex<BTreeSet<Offset>>,
    /// The lowest offset in `set` (`u64::MAX`: none), read without the lock on every ack
    /// ([`Wal::first_corrupt_record`]).
    first: AtomicU64,
}

impl Damaged {
    pub(crate) fn new(set: BTreeSet<Offset>) -> Damaged {
        let first = AtomicU64::new(set.first().map_or(u64::MAX, |o| o.0));
        Damaged {
            set: Mutex::new(set),
            first,
        }
    }

    /// Runs `change` on the set, keeps it bounded and `first` true.
    fn update<T>(&self, change: impl FnOnce(&mut BTreeSet<Offset>) -> T) -> T {
        let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
        let out = change(&mut set);
        while set.len() > CORRUPT_RECORDS_MAX {
            set.pop_last();
        }
        let first = set.first().map_or(u64::MAX, |o| o.0);
        self.first.store(first, Ordering::Release);
        out
    }

    /// A truncation at `x` replaced every entry from `x` on: none of them is damaged.
    pub(crate) fn forget_from(&self, x: Offset) {
        self.update(|set| {
            set.split_off(&x);
        });
    }
}

/// Damaged records a [`Wal`] remembers at most; a read finding more keeps the lowest.
pub const CORRUPT_RECORDS_MAX: usize = 1024;

impl<S: Storage> Drop for WalInner<S> {
    fn drop(&mut self) {
        stop(&self.shared, &self.thread);
    }
}

fn stop<S: Storage>(shared: &Shared<S>, thread: &Mutex<Option<JoinHandle<()>>>) {
    shared.lock_state().closing = true;
    shared.waker.wake();
    let handle = thread.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(h) = handle {
        if h.join().is_err() {
            tracing::error!("the WAL commit thread panicked");
        }
    }
}

impl Wal {
    /// Opens (or creates) the log in `config.dir`: takes the directory lock, finds the
    /// direct-I/O alignment, runs recovery (cutting a torn tail durably), and starts the
    /// commit thread with the configured disk.
    ///
    /// # Errors
    /// [`WalError::Corruption`] (nothing is changed), [`WalError::Locked`],
    /// [`WalError::Config`], [`WalError::UringUnavailable`] for `IoBackend::Uring`, I/O
    /// errors.
    pub fn open(config: WalConfig) -> Result<(Wal, RecoveryReport), WalError> {
        let (disk, _) = disk::open_disk(config.io)?;
        Wal::open_with_disk(config, disk)
    }

    /// [`Wal::open`] with a given disk (tests: a [`crate::disk::FaultDisk`]); `config.io`
    /// is ignored.
    ///
    /// # Errors
    /// As [`Wal::open`].
    pub fn open_with_disk(
        config: WalConfig,
        disk: Box<dyn Disk>,
    ) -> Result<(Wal, RecoveryReport), WalError> {
        Wal::open_with_hook(config, Some(disk), &mut |_| Ok(()))
    }

    /// [`Wal::open`] (`disk: None`) or [`Wal::open_with_disk`], calling `before_cut` with
    /// the torn tail recovery found before it cuts it (see [`crate::BeforeCut`]). When
    /// `before_cut` fails, the open fails with its error and the log is unchanged.
    ///
    /// # Errors
    /// As [`Wal::open`], and `before_cut`'s error.
    pub fn open_with_hook(
        config: WalConfig,
        disk: Option<Box<dyn Disk>>,
        before_cut: crate::BeforeCut<'_>,
    ) -> Result<(Wal, RecoveryReport), WalError> {
        Wal::open_in(OsStorage, config, disk, before_cut, Mutations::default())
    }
}

impl<S: Storage> Wal<S> {
    /// [`Wal::open`] on `storage` (for example a [`crate::CrashDisk`]): its own disk for
    /// `config.io`, no pre-cut hook, no planted bug.
    ///
    /// # Errors
    /// As [`Wal::open`].
    pub fn open_on(storage: S, config: WalConfig) -> Result<(Wal<S>, RecoveryReport), WalError> {
        Wal::open_in(storage, config, None, &mut |_| Ok(()), Mutations::default())
    }

    /// [`Wal::open_with_hook`] on `storage`: every file operation of this log, and the
    /// write path's disk (`disk`, or `storage`'s own [`Storage::open_disk`] for
    /// `config.io` when `None`), go through it. `mutations` plants test-only bugs
    /// ([`Mutations::default`]: none).
    ///
    /// # Errors
    /// As [`Wal::open_with_hook`].
    pub fn open_in(
        storage: S,
        config: WalConfig,
        disk: Option<Box<dyn Disk<S::File>>>,
        before_cut: crate::BeforeCut<'_>,
        mutations: Mutations,
    ) -> Result<(Wal<S>, RecoveryReport), WalError> {
        let disk = match disk {
            Some(d) => d,
            None => storage.open_disk(config.io)?,
        };
        if config.batch_bytes_max == 0 {
            return Err(WalError::Config("batch_bytes_max must be positive".into()));
        }
        storage
            .create_dir_all(&config.dir)
            .map_err(|e| WalError::io("create dir", &config.dir, e))?;
        let lock = DirLock::acquire_in(&storage, &config.dir)?;
        let found = storage
            .alignment(&config.dir)
            .map_err(|e| WalError::io("detect alignment", &config.dir, e))?;
        // Never below a page: the reader's buffered reads cache whole pages, which must not
        // straddle a block the commit thread is still writing.
        let page = page_size();
        let align = found.bytes.max(page);
        let segment_bytes = align_down(
            config.segment_bytes_max.min(SEGMENT_BYTES_LIMIT - align),
            align,
        );
        if segment_bytes < SEGMENT_BYTES_MIN.max(2 * align) {
            return Err(WalError::Config(format!(
                "segment_bytes_max {} is below the minimum {}",
                config.segment_bytes_max,
                SEGMENT_BYTES_MIN.max(2 * align)
            )));
        }
        tracing::info!(
            dir = %config.dir.display(),
            align_bytes = align,
            statx_offset_bytes = ?found.statx_offset_bytes,
            physical_block_bytes = ?found.physical_block_bytes,
            disk = disk.name(),
            "opening WAL"
        );
        let rec = recovery::recover(
            &storage,
            &config.dir,
            segment_bytes,
            align,
            before_cut,
            mutations,
            config.damaged_records,
        )?;
        let report = rec.report.clone();
        for &offset in report.damaged.iter().take(16) {
            tracing::error!(%offset, "the log holds a damaged record: reads of it are refused until it is repaired from a replica");
        }
        let damaged = Damaged::new(
            report
                .damaged
                .iter()
                .take(CORRUPT_RECORDS_MAX)
                .copied()
                .collect(),
        );
        let prealloc = Preallocator::start_in(
            storage.clone(),
            &config.dir,
            segment_bytes,
            usize::try_from(align).expect("invariant: alignment fits usize"),
            config.spare_fill,
            mutations,
        )?;
        let shared = Arc::new(Shared {
            storage,
            mutations,
            dir: config.dir.clone(),
            align,
            segment_bytes,
            batch_bytes_max: config.batch_bytes_max,
            batch_window: Duration::from_micros(config.batch_window_us),
            queue_bytes_max: config.queue_bytes_max,
            stagger_rolls: config.stagger_rolls,
            backend: disk.name(),
            state: Mutex::new(CommitState {
                epochs: rec.index.epochs().clone(),
                max_epoch: rec.max_epoch,
                queue: VecDeque::new(),
                queued_bytes: 0,
                failed: None,
                closing: false,
            }),
            index: RwLock::new(rec.index),
            counters: Counters::default(),
            waker: disk.waker(),
            wake_at_queue_len: AtomicUsize::new(usize::MAX),
            current_tag: AtomicU64::new(0),
            damaged,
        });
        let recycler = prealloc.recycler();
        let committer = Committer::new(shared.clone(), disk, prealloc, rec.tail)?;
        let thread = std::thread::Builder::new()
            .name("quire-wal-commit".into())
            .spawn(move || committer.run())
            .map_err(|e| WalError::io("spawn commit thread", &config.dir, e))?;
        let wal = Wal {
            inner: Arc::new(WalInner {
                shared,
                recycler,
                thread: Mutex::new(Some(thread)),
                _lock: lock,
            }),
        };
        Ok((wal, report))
    }

    fn shared(&self) -> &Shared<S> {
        &self.inner.shared
    }

    /// Appends `records` on behalf of a master of epoch `writer_epoch`.
    ///
    /// The records must have consecutive offsets starting at `x <= next_offset()`. If
    /// `x < next_offset()` the append replaces the log's suffix from `x` ("file order is
    /// authoritative"): the WAL first writes a truncation marker `{offset: x, epoch:
    /// writer_epoch}`. That is allowed only if `writer_epoch` is greater than the epoch of
    /// the entry now at `x` and not below any epoch the log has seen. Every record's epoch
    /// must be at most `writer_epoch`, and epochs must not decrease along the log.
    ///
    /// The returned future resolves to the last offset written once an fdatasync covering
    /// the append has succeeded. Validation errors resolve at once and change nothing.
    /// The append is in the log's accepted view ([`Wal::last`], [`Wal::entry_epoch`]) as
    /// soon as this returns, and durable when the future resolves `Ok`.
    ///
    /// # Errors (through the future)
    /// [`WalError::EmptyAppend`], [`WalError::Gap`], [`WalError::NotConsecutive`],
    /// [`WalError::TooLarge`], [`WalError::EpochAboveWriter`],
    /// [`WalError::EpochRegression`], [`WalError::TruncationRefused`],
    /// [`WalError::TruncateBelowStart`], [`WalError::Failed`], [`WalError::Closed`].
    pub fn append(&self, writer_epoch: Epoch, records: Vec<Event>) -> Append {
        let called = Instant::now();
        let shared = self.shared();
        // The checksums are computed here, on the appender's thread and outside the lock,
        // so the commit thread (one per log) only copies. Oversized payloads are refused by
        // `validate` below; they get no checksum.
        let crc_tag =
            SegmentTag::new(shared.current_tag.load(Ordering::Relaxed)).unwrap_or(SegmentTag::V1);
        let crcs: Vec<u32> = records
            .iter()
            .map(|r| {
                if r.payload.len() <= PAYLOAD_BYTES_MAX {
                    format::event_crc_in(crc_tag, r)
                } else {
                    0
                }
            })
            .collect();
        let mut st = shared.lock_state();
        if let Some(reason) = &st.failed {
            return Append::ready(Err(WalError::Failed {
                reason: Arc::new(reason.clone()),
            }));
        }
        if st.closing {
            return Append::ready(Err(WalError::Closed));
        }
        let plan = match validate(
            &st,
            writer_epoch,
            &records,
            shared.segment_bytes,
            shared.align,
        ) {
            Ok(p) => p,
            Err(e) => {
                Counters::add(&shared.counters.appends_refused, 1);
                return Append::ready(Err(e));
            }
        };
        if st.queued_bytes + plan.bytes > shared.queue_bytes_max && !st.queue.is_empty() {
            Counters::add(&shared.counters.appends_refused, 1);
            return Append::ready(Err(WalError::TooLarge {
                what: "queue",
                bytes: st.queued_bytes + plan.bytes,
                max: shared.queue_bytes_max,
            }));
        }
        if let Some(x) = plan.truncate_at {
            st.epochs.truncate(x);
            st.max_epoch = st.max_epoch.max(writer_epoch);
        }
        for r in &records {
            st.epochs.push(r.offset, r.epoch);
            st.max_epoch = st.max_epoch.max(r.epoch);
        }
        let slot = AckSlot::new();
        let before = st.queued_bytes;
        st.queued_bytes += plan.bytes;
        let wake = st.queue.is_empty()
            || (before < shared.batch_bytes_max && st.queued_bytes >= shared.batch_bytes_max);
        st.queue.push_back(Request {
            writer_epoch,
            records,
            crcs,
            crc_tag,
            truncate_at: plan.truncate_at,
            bytes: plan.bytes,
            ack: slot.clone(),
            arrived: Instant::now(),
        });
        // The commit thread holding a batch open for this many appends wants to know.
        let wake = wake || st.queue.len() == shared.wake_at_queue_len.load(Ordering::Relaxed);
        drop(st);
        let c = &shared.counters;
        Counters::add(&c.stage_queued, 1);
        Counters::add_elapsed(&c.stage_prepare_ns, called);
        if wake {
            shared.waker.wake();
        }
        Append::pending(slot)
    }

    /// The last entry of the accepted log (durable or queued), or `None` if empty. After a
    /// failure: the last durable entry.
    #[must_use]
    pub fn last(&self) -> Option<LogPosition> {
        self.shared().lock_state().epochs.last()
    }

    /// The last durable entry (covered by a successful fdatasync).
    #[must_use]
    pub fn last_durable(&self) -> Option<LogPosition> {
        self.shared().read_index().last()
    }

    /// The first offset of the log (0 for a new log).
    #[must_use]
    pub fn first_offset(&self) -> Offset {
        self.shared().lock_state().epochs.start()
    }

    /// The offset the next non-truncating append starts at (`last + 1`, or the log's start).
    #[must_use]
    pub fn next_offset(&self) -> Offset {
        self.shared().lock_state().epochs.next()
    }

    /// The epoch of the accepted entry at `offset`, for log matching.
    #[must_use]
    pub fn entry_epoch(&self, offset: Offset) -> Option<Epoch> {
        self.shared().lock_state().epochs.epoch_at(offset)
    }

    /// Reads durable records from `from` on: at most `max_events` records and at most
    /// `max_bytes` payload bytes (but always the first record, whatever its size). Returns
    /// an empty vector when `from` is one past the last durable entry.
    ///
    /// # Errors
    /// [`WalError::OffsetOutOfRange`] if `from` is below the log's start or beyond its
    /// durable end + 1; [`WalError::Corruption`] if the record at `from` does not match
    /// what was written (a bad record later in the range ends the read early instead: the
    /// records before it are returned, so a caller learns the bad offset by reading on);
    /// I/O errors.
    pub fn read(
        &self,
        from: Offset,
        max_events: usize,
        max_bytes: u64,
    ) -> Result<Vec<Event>, WalError> {
        let result = crate::reader::read(&self.shared().index, from, max_events, max_bytes);
        if let Err(WalError::Corruption { offset, .. }) = &result {
            self.shared().damaged.update(|set| set.insert(*offset));
        }
        result
    }

    /// Offsets of durable records that a [`Wal::read`] found damaged (a checksum, offset or
    /// epoch that does not match what was written) since the log was opened, ascending,
    /// or placed at open ([`crate::DamagedRecords::Place`]), ascending, leaving out those
    /// retention has trimmed or a truncation replaced since. Such a record is lost *on
    /// this disk*:
    /// the store must not claim it (vote with it) until it is repaired from a replica. At
    /// most [`CORRUPT_RECORDS_MAX`] are remembered; reads do not stop at them (each read
    /// that starts at one fails again).
    #[must_use]
    pub fn corrupt_records(&self) -> Vec<Offset> {
        let first = self.first_offset();
        self.shared().damaged.update(|set| {
            set.retain(|o| *o >= first);
            set.iter().copied().collect()
        })
    }

    /// The lowest of [`Wal::corrupt_records`], cheaply (one atomic load while there is none:
    /// stores report it in every ack).
    #[must_use]
    pub fn first_corrupt_record(&self) -> Option<Offset> {
        match self.shared().damaged.first.load(Ordering::Acquire) {
            u64::MAX => None,
            o if Offset(o) >= self.first_offset() => Some(Offset(o)),
            _ => self.corrupt_records().first().copied(),
        }
    }

    /// Forgets `offset` as damaged.
    fn forget_corrupt(&self, offset: Offset) {
        self.shared().damaged.update(|set| set.remove(&offset));
    }

    /// Rewrites this log's damaged copy of an entry with `good`, a copy read from another
    /// replica (docs/protocol.md, "Damaged records"), durably, and reads it back.
    ///
    /// Only the same entry is written: the index must hold an entry at `good.offset` of
    /// `good.epoch`, and `good` must encode to the record's size (an epoch and an offset
    /// name one entry in a Quire cluster: one master per epoch, which never writes an
    /// offset twice). Where the damaged record's header still reads as this entry's, the
    /// copy must also have either its stored checksum (the damage is in bytes the checksum
    /// covers: the kind, the tag, the payload) or all its bytes after the checksum (the
    /// damage is in the checksum): a copy that differs more than the damage could explain
    /// is refused
    /// ([`RepairOutcome::OtherEntry`]), as is one that differs from a copy that reads back
    /// good ([`RepairOutcome::AlreadyGood`] only for the same bytes).
    ///
    /// The record is written in place with O_DIRECT: the aligned blocks that hold it are
    /// read, the record's bytes replaced, the blocks written back and `fdatasync`ed. The
    /// commit thread never writes those blocks again (every batch starts on a fresh aligned
    /// block), so this works in any segment, the one appends go to included. The index's
    /// read lock is held throughout, so a retention trim cannot delete the segment or hand
    /// its file over for reuse meanwhile (appends' index updates wait for one write and one
    /// `fdatasync` at most). A repaired or good record leaves [`Wal::corrupt_records`].
    /// Blocking: call it off any async runtime.
    ///
    /// # Errors
    /// [`WalError::Failed`] if the log has failed; I/O errors reading, writing or syncing
    /// the segment; [`WalError::Corruption`] if the rewritten record does not read back
    /// (the disk is bad there: the offset stays damaged).
    pub fn repair_record(&self, good: &Event) -> Result<RepairOutcome, WalError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let shared = self.shared();
        let index = shared.read_index();
        let Some(loc) = index.locate(good.offset) else {
            return Ok(RepairOutcome::NotHeld);
        };
        let epoch = index
            .epochs()
            .epoch_at(good.offset)
            .expect("invariant: every located offset has an epoch");
        let len = loc.bytes as usize;
        if epoch != good.epoch
            || good.payload.len() > PAYLOAD_BYTES_MAX
            || record_bytes(good.payload.len()) != len
        {
            return Ok(RepairOutcome::OtherEntry);
        }
        let seg = index
            .segment(loc.segment)
            .expect("invariant: an indexed entry's segment is held");
        let position = u64::from(loc.position);
        let mut record = vec![0u8; len];
        let crc = format::event_crc_in(seg.tag, good);
        format::encode_event_with_crc(&mut record, seg.tag, good, crc);
        let read_current = || -> Result<Vec<u8>, WalError> {
            let mut current = vec![0u8; len];
            seg.file
                .read_exact_at(&mut current, position)
                .map_err(|e| WalError::io("read", &seg.path, e))?;
            Ok(current)
        };
        let reads_good = |current: &[u8]| {
            format::decode_header(current).is_ok_and(|h| {
                h.record_bytes() == len as u64
                    && h.offset == good.offset
                    && h.epoch == good.epoch
                    && quire_proto::EventKind::from_u8(h.kind).is_some()
            }) && format::checksum_ok(seg.tag, current)
        };
        let current = read_current()?;
        if reads_good(&current) {
            if current != record {
                return Ok(RepairOutcome::OtherEntry);
            }
            self.forget_corrupt(good.offset);
            return Ok(RepairOutcome::AlreadyGood);
        }
        if let Ok(h) = format::decode_header(&current) {
            let same_header =
                h.offset == good.offset && h.epoch == good.epoch && h.record_bytes() == len as u64;
            // One damage leaves the stored checksum (it covers every other byte, the
            // kind included) or every byte after it as the copy has them.
            let explained = h.crc == crc || current[4..] == record[4..];
            if same_header && !explained {
                return Ok(RepairOutcome::OtherEntry);
            }
        }
        // The aligned blocks holding the record, with the record's bytes replaced.
        let align = shared.align;
        let first = align_down(position, align);
        let last = align_up(position + len as u64, align);
        let span = usize::try_from(last - first).expect("invariant: a record's blocks fit memory");
        let align_usize = usize::try_from(align).expect("invariant: the alignment fits memory");
        let mut blocks = crate::disk::AlignedBuf::zeroed(span, align_usize);
        {
            let spare = &mut blocks.spare_mut()[..span];
            seg.file
                .read_exact_at(spare, first)
                .map_err(|e| WalError::io("read for repair", &seg.path, e))?;
            let at = usize::try_from(position - first).expect("invariant: inside the blocks");
            spare[at..at + len].copy_from_slice(&record);
        }
        blocks.advance(span);
        let file = shared
            .storage
            .open(&seg.path, crate::storage::OpenMode::WriteDirect)
            .map_err(|e| WalError::io("open for repair", &seg.path, e))?;
        file.write_all_at(blocks.as_slice(), first)
            .map_err(|e| WalError::io("repair write", &seg.path, e))?;
        file.sync_data()
            .map_err(|e| WalError::io("repair fdatasync", &seg.path, e))?;
        if read_current()? != record {
            return Err(WalError::Corruption {
                segment: seg.path.clone(),
                position: crate::Position(position),
                offset: good.offset,
                problem: crate::CorruptionKind::ReadMismatch,
            });
        }
        self.forget_corrupt(good.offset);
        tracing::info!(offset = %good.offset, segment = %seg.path.display(), position, "repaired a damaged record from a replica's copy");
        Ok(RepairOutcome::Repaired)
    }

    /// Retention: deletes, oldest first, every whole segment whose entries all lie below
    /// `before`, then fsyncs the directory. The log then starts at the base offset of its
    /// first remaining segment (the **trim point**, `first_offset()`), which is at most
    /// `before`: a segment holding any entry at or above `before` is kept whole.
    ///
    /// Never deleted: the segment appends go to (the last one) and the segment holding the
    /// log's last durable entry, so the new first offset is always a durable entry and a
    /// torn tail cut at the next open can never empty the log. The trim point needs no
    /// file of its own: it is the first segment's base, which recovery already takes as
    /// the log's start; deleting lowest first means a crash part-way leaves a shorter
    /// contiguous run of segments, never a gap. Reads below the trim point then fail with
    /// [`WalError::Trimmed`]; an append that would truncate below it fails with
    /// [`WalError::TruncateBelowStart`].
    ///
    /// Blocking (unlinks files and fsyncs the directory): call it off any async runtime.
    /// The caller decides that `before` is safe to drop (the node: only at or below the
    /// stabilized HWM). Readers holding a deleted segment open finish their read.
    ///
    /// Precondition: no append that truncates below `before` is queued or in flight (the
    /// WAL does not check it: an accepted truncation below the new start would leave the
    /// commit thread a marker below the log's first segment). Stabilized entries are never
    /// truncated, so a trim point at or below the stabilized HWM always satisfies it.
    ///
    /// # Errors
    /// [`WalError::Failed`] if the log has failed; I/O errors from unlinking or the
    /// directory fsync (the in-memory log already starts at the new trim point then, and the
    /// next open finds whichever segments remain).
    pub fn trim_before(&self, before: Offset) -> Result<TrimReport, WalError> {
        let shared = self.shared();
        let removed = {
            // Lock order: state before index.
            let mut st = shared.lock_state();
            if let Some(reason) = &st.failed {
                return Err(WalError::Failed {
                    reason: Arc::new(reason.clone()),
                });
            }
            let mut index = shared.write_index();
            let next = index.next();
            let bases: Vec<Offset> = index.segments().map(|(_, s)| s.base).collect();
            // Segment i goes if the one after it starts at or below `before` and holds a
            // durable entry (so it is neither the last segment nor past the durable end).
            let count = bases
                .windows(2)
                .take_while(|w| w[1] <= before && w[1] < next && w[1] > index.start())
                .count();
            let removed = index.trim_front(count);
            if count > 0 {
                st.epochs.trim_front(index.start());
            }
            removed
        };
        let first_offset = self.first_offset();
        let mut report = TrimReport {
            first_offset,
            segments_deleted: 0,
            segments_reused: 0,
            bytes_deleted: 0,
        };
        if removed.is_empty() {
            return Ok(report);
        }
        let recycler = &self.inner.recycler;
        for seg in &removed {
            let bytes = seg.file.size().unwrap_or(0);
            // The oldest file goes to the preallocator for reuse if it can be (no marker,
            // the configured size, and no other file already waiting); the rest go.
            let reused = !seg.has_marker
                && bytes == recycler.segment_bytes()
                && recycler.offer(&seg.path)?;
            if !reused {
                shared
                    .storage
                    .remove_file(&seg.path)
                    .map_err(|e| WalError::io("remove", &seg.path, e))?;
            }
            report.segments_deleted += 1;
            report.segments_reused += u64::from(reused);
            report.bytes_deleted += bytes;
        }
        crate::segment::fsync_dir_in(&shared.storage, &shared.dir)?;
        Counters::add(&shared.counters.segments_trimmed, report.segments_deleted);
        Counters::add(&shared.counters.segments_reused, report.segments_reused);
        tracing::info!(
            before = before.0,
            first_offset = first_offset.0,
            segments = report.segments_deleted,
            bytes = report.bytes_deleted,
            "retention deleted segments below the trim point"
        );
        Ok(report)
    }

    /// A snapshot of the counters.
    #[must_use]
    pub fn stats(&self) -> WalStats {
        let mut s = self.shared().counters.snapshot();
        s.spares_reused = self.inner.recycler.recycled();
        s.spare_zero_bytes = self.inner.recycler.zeroed_bytes();
        s
    }

    /// Whether the log has failed (fail-stop) and refuses appends.
    #[must_use]
    pub fn is_failed(&self) -> bool {
        self.shared().lock_state().failed.is_some()
    }

    /// The error that failed the log, if it has failed.
    #[must_use]
    pub fn failure(&self) -> Option<WalError> {
        self.shared().lock_state().failed.clone()
    }

    /// The data directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.shared().dir
    }

    /// The alignment of writes (and of batch padding), in bytes.
    #[must_use]
    pub fn alignment_bytes(&self) -> u64 {
        self.shared().align
    }

    /// The size of new segments, in bytes.
    #[must_use]
    pub fn segment_bytes(&self) -> u64 {
        self.shared().segment_bytes
    }

    /// The disk implementation in use (`"io_uring"`, `"sync"`, `"fault"`).
    #[must_use]
    pub fn backend(&self) -> &'static str {
        self.shared().backend
    }

    /// Stops the log for every handle: later appends return [`WalError::Closed`]; appends
    /// already queued are written and acknowledged first; returns when the commit thread
    /// has ended.
    ///
    /// # Errors
    /// [`WalError::Failed`] if the log had failed.
    pub fn close(&self) -> Result<(), WalError> {
        stop(&self.inner.shared, &self.inner.thread);
        match self.failure() {
            Some(reason) => Err(WalError::Failed {
                reason: Arc::new(reason),
            }),
            None => Ok(()),
        }
    }
}

/// What [`Wal::trim_before`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrimReport {
    /// The log's first offset after the trim (the trim point).
    pub first_offset: Offset,
    /// Segment files taken out of the log by this call (deleted, or kept for reuse).
    pub segments_deleted: u64,
    /// Of those, files kept to become a spare segment again.
    pub segments_reused: u64,
    /// Their total size, in bytes.
    pub bytes_deleted: u64,
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(v)
        .ok()
        .filter(|v| v.is_power_of_two())
        .unwrap_or(4096)
}

struct Plan {
    truncate_at: Option<Offset>,
    bytes: u64,
}

/// Checks an append against the accepted log. Pure: changes nothing.
fn validate(
    st: &CommitState,
    writer_epoch: Epoch,
    records: &[Event],
    segment_bytes: u64,
    align: u64,
) -> Result<Plan, WalError> {
    let Some(first) = records.first() else {
        return Err(WalError::EmptyAppend);
    };
    let x = first.offset;
    let next = st.epochs.next();
    if x > next {
        return Err(WalError::Gap { first: x, next });
    }
    let mut bytes = 0u64;
    let mut prev_epoch = if x > st.epochs.start() {
        st.epochs.epoch_at(Offset(x.0 - 1))
    } else {
        None
    };
    for (i, r) in records.iter().enumerate() {
        let expected = Offset(x.0 + i as u64);
        if r.offset != expected {
            return Err(WalError::NotConsecutive {
                index: i,
                expected,
                actual: r.offset,
            });
        }
        if r.payload.len() > PAYLOAD_BYTES_MAX {
            return Err(WalError::TooLarge {
                what: "payload",
                bytes: r.payload.len() as u64,
                max: PAYLOAD_BYTES_MAX as u64,
            });
        }
        if r.epoch > writer_epoch {
            return Err(WalError::EpochAboveWriter {
                offset: r.offset,
                epoch: r.epoch,
                writer_epoch,
            });
        }
        if let Some(p) = prev_epoch {
            if r.epoch < p {
                return Err(WalError::EpochRegression {
                    offset: r.offset,
                    epoch: r.epoch,
                    previous: p,
                });
            }
        }
        prev_epoch = Some(r.epoch);
        bytes += record_bytes(r.payload.len()) as u64;
    }
    let truncate_at = if x < next {
        if x < st.epochs.start() {
            return Err(WalError::TruncateBelowStart {
                offset: x,
                first: st.epochs.start(),
            });
        }
        let entry_epoch = st.epochs.epoch_at(x).expect("invariant: start <= x < next");
        if writer_epoch <= entry_epoch || writer_epoch < st.max_epoch {
            return Err(WalError::TruncationRefused {
                offset: x,
                entry_epoch,
                writer_epoch,
                max_epoch_seen: st.max_epoch,
            });
        }
        bytes += HEADER_BYTES as u64;
        Some(x)
    } else {
        None
    };
    // What a new segment holds after its header.
    let room = segment_bytes - align_up(format::SEGMENT_HEADER_BYTES, align);
    if align_up(bytes, align) > room {
        return Err(WalError::TooLarge {
            what: "append",
            bytes,
            max: room,
        });
    }
    Ok(Plan { truncate_at, bytes })
}
