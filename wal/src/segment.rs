//! Segment files and the data directory: names, listing, the directory lock, directory
//! fsync, and the background preparation of the next segment.
//!
//! A segment is named by its base offset, `<base_offset:020>.log` (20 decimal digits, so
//! names sort like offsets). Its first record has offset `base`: an event, or — for a
//! segment started by a truncation below the current segment — the truncation marker at
//! `base`. This module does not read or write records (see `scan.rs` and `commit.rs`).
//!
//! Segments are preallocated **and written** before they take appends: on ext4 an O_DIRECT
//! write past the end of a file or into an unwritten extent costs a journal commit and runs
//! several times slower. [`Preallocator`] keeps one such file ready (`spare.prealloc`) on a
//! background thread; a roll renames it to the new segment's name, and the commit thread
//! fsyncs the directory through its disk, beside the appends (see `commit.rs`).
//! A spare is either a fresh file zero-filled whole, or — once retention deletes segments —
//! a **reused** one: the trim hands its oldest segment over as `spare.recycle` (a file that
//! holds no truncation marker and has the configured size), and the spare is that file with
//! a new [`SegmentHeader`] (a fresh random [`SegmentTag`]) written over its first block.
//! Nothing else of the file is written again: its earlier life's records carry another tag
//! and never check out (docs/format.md, "Reuse"). The directory is fsynced after the
//! reused file is renamed away from its segment name and before its header changes, so no
//! crash leaves a segment name on a file whose records no longer count. Once a file has been
//! reused, the preparation of the next spare waits for the next trim to hand one over, and
//! zero-fills a fresh file only when the current segment passes half full or a roll waits.
//! On a storage that allows no
//! background work ([`crate::Storage::background_work`]: the simulated [`crate::CrashDisk`])
//! there is no thread: the roll that needs the spare prepares it inline, so every file
//! operation happens in an order the caller drives.
//!
//! The zero-fill is **paced** by the appends. Every fdatasync of the log also makes the
//! device persist whatever the zero-fill wrote since the previous one (this disk has a
//! write-back cache and no FUA), so a zero-fill running at full speed makes the appends'
//! fdatasyncs slow: measured here with 4 MiB chunks, p99 append latency 4–5 ms at one 256
//! KiB appender against 1.5 ms paced. So each [`ZERO_FILL_CHUNK_BYTES`] chunk waits until
//! the log has written half as many bytes since the fill began as the fill has zeroed
//! (beyond a lead of [`ZERO_FILL_LEAD_CHUNKS`] chunks): the spare is ready by the time the
//! current segment is half full, when [`Preallocator::hurry`] lifts the pacing anyway. The
//! fill also runs freely while the log has written nothing for [`ZERO_FILL_IDLE`], and at
//! full speed when a roll waits for it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use quire_proto::Offset;

use crate::disk::{AlignedBuf, DirectIo};
use crate::error::WalError;
use crate::format::{SegmentHeader, SegmentTag, SEGMENT_HEADER_ENCODED_BYTES};
use crate::storage::{OpenMode, OsStorage, Storage, StorageFile};

/// File name suffix of a segment.
pub const SEGMENT_SUFFIX: &str = ".log";
/// Name of the fully prepared spare segment.
pub const SPARE_NAME: &str = "spare.prealloc";
/// Name of a spare segment being prepared.
pub const SPARE_TMP_NAME: &str = "spare.prealloc.tmp";
/// Name of the directory lock file.
pub const LOCK_NAME: &str = "LOCK";
/// Name of a trimmed segment's file waiting to be reused as the next spare.
pub const RECYCLE_NAME: &str = "spare.recycle";

/// The bytes of zeros written per call when preparing a spare, in bytes: few, large
/// requests (each costs the device a request and the kernel a bio), from a buffer of huge
/// pages (see [`AlignedBuf::zeroed_huge`]).
const ZERO_FILL_CHUNK_BYTES: usize = 1 << 20;
/// Chunks the zero-fill may write ahead of the appends' pace (see the module docs).
const ZERO_FILL_LEAD_CHUNKS: u64 = 4;
/// Bytes zeroed per byte the log writes, while paced.
const ZERO_FILL_PACE_RATIO: u64 = 2;
/// A log that has written nothing for this long does not pace the zero-fill.
const ZERO_FILL_IDLE: Duration = Duration::from_millis(2);
/// How often a preparation waiting for a file to reuse looks at the log's progress.
const RECYCLE_WAIT_POLL: Duration = Duration::from_millis(5);
/// How long a paced zero-fill sleeps before looking at the appends' progress again.
const ZERO_FILL_PACE_SLEEP: Duration = Duration::from_micros(500);

/// The file name of the segment with base offset `base`.
#[must_use]
pub fn segment_name(base: Offset) -> String {
    format!("{:020}{SEGMENT_SUFFIX}", base.0)
}

/// The base offset encoded in a segment file name, or `None` if `name` is not one.
#[must_use]
pub fn parse_segment_name(name: &str) -> Option<Offset> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Offset)
}

/// A segment file found in a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentPath {
    /// Its base offset (from the name).
    pub base: Offset,
    /// Its path.
    pub path: PathBuf,
}

/// The segments of `dir` on the real file system, sorted by base offset
/// ([`list_segments_in`] with [`OsStorage`]).
///
/// # Errors
/// If the directory cannot be read, or a `*.log` file has a malformed name.
pub fn list_segments(dir: &Path) -> Result<Vec<SegmentPath>, WalError> {
    list_segments_in(&OsStorage, dir)
}

/// The segments of `dir` in `storage`, sorted by base offset.
///
/// # Errors
/// If the directory cannot be read, or a `*.log` file has a malformed name.
pub fn list_segments_in<S: Storage>(storage: &S, dir: &Path) -> Result<Vec<SegmentPath>, WalError> {
    let mut out = Vec::new();
    let names = storage
        .list_dir(dir)
        .map_err(|e| WalError::io("read_dir", dir, e))?;
    for name in names {
        let Some(name) = name.to_str() else { continue };
        if !name.ends_with(SEGMENT_SUFFIX) {
            continue;
        }
        let Some(base) = parse_segment_name(name) else {
            return Err(WalError::BadDirectory {
                dir: dir.to_path_buf(),
                detail: format!("{name} is not a segment name (<20 digits>.log)"),
            });
        };
        out.push(SegmentPath {
            base,
            path: dir.join(name),
        });
    }
    out.sort_by_key(|s| s.base);
    Ok(out)
}

/// fsyncs a directory of the real file system so that creations, renames and deletions in
/// it are durable ([`fsync_dir_in`] with [`OsStorage`]).
///
/// # Errors
/// If the directory cannot be opened or synced.
pub fn fsync_dir(dir: &Path) -> Result<(), WalError> {
    fsync_dir_in(&OsStorage, dir)
}

/// fsyncs directory `dir` of `storage` so that creations, renames and deletions in it are
/// durable.
///
/// # Errors
/// If the directory cannot be opened or synced.
pub fn fsync_dir_in<S: Storage>(storage: &S, dir: &Path) -> Result<(), WalError> {
    storage
        .sync_dir(dir)
        .map_err(|e| WalError::io("fsync dir", dir, e))
}

/// An exclusive lock on the directory's `LOCK` file (`flock` on the real file system),
/// held while the value lives.
#[derive(Debug)]
pub struct DirLock<S: Storage = OsStorage> {
    _lock: S::Lock,
}

impl DirLock {
    /// Takes the lock of `dir` on the real file system without waiting.
    ///
    /// # Errors
    /// [`WalError::Locked`] if someone holds it; an I/O error otherwise.
    pub fn acquire(dir: &Path) -> Result<DirLock, WalError> {
        DirLock::acquire_in(&OsStorage, dir)
    }
}

impl<S: Storage> DirLock<S> {
    /// Takes the lock of `dir` in `storage` without waiting.
    ///
    /// # Errors
    /// [`WalError::Locked`] if someone holds it; an I/O error otherwise.
    pub fn acquire_in(storage: &S, dir: &Path) -> Result<DirLock<S>, WalError> {
        let path = dir.join(LOCK_NAME);
        match storage.lock(&path) {
            Ok(lock) => Ok(DirLock { _lock: lock }),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(WalError::Locked {
                dir: dir.to_path_buf(),
            }),
            Err(e) => Err(WalError::io("flock", &path, e)),
        }
    }
}

/// Writes zeros over `[from, to)` of `file` through the page cache (any alignment), without
/// syncing.
///
/// # Errors
/// The first write error.
pub fn write_zeros<F: StorageFile>(file: &F, from: u64, to: u64) -> io::Result<()> {
    let zeros = vec![0u8; ZERO_FILL_CHUNK_BYTES];
    let mut pos = from;
    while pos < to {
        let n = usize::try_from(to - pos)
            .unwrap_or(usize::MAX)
            .min(zeros.len());
        let written = file.write_at(&zeros[..n], pos)?;
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "zero-length write",
            ));
        }
        pos += written as u64;
    }
    Ok(())
}

#[derive(Debug, Default)]
struct SpareState {
    /// `spare.prealloc` exists, is written to the right size, has a header and is durable.
    ready: bool,
    /// The ready spare's tag.
    tag: SegmentTag,
    /// `spare.recycle` exists (the right size), waiting to become the next spare.
    recycle_ready: bool,
    /// The thread should prepare a spare.
    wanted: bool,
    /// The last preparation failed with this error.
    error: Option<WalError>,
    stop: bool,
}

#[derive(Debug)]
struct SpareShared<S: Storage> {
    storage: S,
    dir: PathBuf,
    bytes: u64,
    align: usize,
    state: Mutex<SpareState>,
    cv: Condvar,
    /// A roll waits for the spare: zero-fill at normal I/O priority.
    urgent: AtomicBool,
    /// The log is closing: abandon a zero-fill in progress.
    stopping: AtomicBool,
    /// Bytes the log has written to its segments (monotonic), for the pacing.
    written: AtomicU64,
    /// When the log last wrote, in µs after `started`.
    written_at_us: AtomicU64,
    started: Instant,
    /// A file to reuse was handed over: a zero-fill in progress stops and reuses it.
    recycle_offered: AtomicBool,
    /// Bytes of zeros written into fresh spares (monotonic).
    zeroed_bytes: AtomicU64,
    /// Spares made from reused files (monotonic).
    recycled: AtomicU64,
    /// Planted bug (tests only): [`crate::Mutations::reuse_keeps_tag`].
    reuse_keeps_tag: AtomicBool,
    /// [`SpareFill::Allocate`]: a fresh spare is only allocated, not zero-filled.
    allocate_only: AtomicBool,
}

/// How a fresh spare segment (one no trim handed over) is prepared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpareFill {
    /// `fallocate`, then zeros written over the whole file: later appends overwrite
    /// written blocks (the default; see the module docs for why).
    #[default]
    Zeros,
    /// `fallocate` only: appends write into unwritten extents, and each fdatasync then
    /// also commits their conversion (a file-system journal commit). Safe on ext4 and XFS
    /// (unwritten extents read as zeros, and fdatasync persists the conversion); where the
    /// file system cannot allocate, zeros are written anyway. For measuring the two ways
    /// to grow a log (`quire bench wal --spare-fill`).
    Allocate,
}

/// What the log's retention needs of the [`Preallocator`]: a way to hand over a trimmed
/// segment's file for reuse, and the spare counters. Cheap to clone.
#[derive(Debug)]
pub struct Recycler<S: Storage = OsStorage> {
    shared: Arc<SpareShared<S>>,
}

impl<S: Storage> Clone for Recycler<S> {
    fn clone(&self) -> Self {
        Recycler {
            shared: self.shared.clone(),
        }
    }
}

impl<S: Storage> Recycler<S> {
    /// Takes the segment file at `path` (just removed from the log by a trim; it must hold
    /// no truncation marker and be the configured size) for the next spare: renames it to
    /// `spare.recycle` and returns `true`, or returns `false` if a file already waits
    /// there (the caller deletes this one). The caller fsyncs the directory afterwards, as
    /// for a deletion.
    ///
    /// # Errors
    /// The rename's.
    pub fn offer(&self, path: &Path) -> Result<bool, WalError> {
        let s = &self.shared;
        let mut st = s.lock();
        if st.recycle_ready || st.stop {
            return Ok(false);
        }
        let to = s.dir.join(RECYCLE_NAME);
        s.storage
            .rename(path, &to)
            .map_err(|e| WalError::io("rename", &to, e))?;
        st.recycle_ready = true;
        s.recycle_offered.store(true, Ordering::Relaxed);
        s.cv.notify_all();
        Ok(true)
    }

    /// The size every segment file has, in bytes: only such a file may be offered.
    #[must_use]
    pub fn segment_bytes(&self) -> u64 {
        self.shared.bytes
    }

    /// Bytes of zeros written into fresh spares so far.
    #[must_use]
    pub fn zeroed_bytes(&self) -> u64 {
        self.shared.zeroed_bytes.load(Ordering::Relaxed)
    }

    /// Spares made from reused files so far.
    #[must_use]
    pub fn recycled(&self) -> u64 {
        self.shared.recycled.load(Ordering::Relaxed)
    }
}

/// Keeps one preallocated, written spare segment ready on a background thread.
#[derive(Debug)]
pub struct Preallocator<S: Storage = OsStorage> {
    shared: Arc<SpareShared<S>>,
    thread: Option<JoinHandle<()>>,
}

impl Preallocator {
    /// [`Preallocator::start_in`] on the real file system, zero-filling fresh spares and
    /// with no planted bugs.
    ///
    /// # Errors
    /// As [`Preallocator::start_in`].
    pub fn start(dir: &Path, segment_bytes: u64, align: usize) -> Result<Preallocator, WalError> {
        Preallocator::start_in(
            OsStorage,
            dir,
            segment_bytes,
            align,
            SpareFill::Zeros,
            crate::Mutations::default(),
        )
    }
}

impl<S: Storage> Preallocator<S> {
    /// Starts the background thread for `dir` of `storage`, preparing spares of
    /// `segment_bytes` bytes (a multiple of `align`). A complete spare left by an earlier
    /// run is reused with a new header (a new tag: records a crash left in it never count),
    /// as is a file waiting for reuse; a partial spare is deleted, and so is a complete one
    /// when a file already waits for reuse. `fill` says how fresh spares are prepared and
    /// `mutations` which planted bugs concerning spares are on (tests only); both hold from
    /// the first spare on.
    ///
    /// # Errors
    /// If the leftover files cannot be inspected or removed, or the thread cannot start.
    pub fn start_in(
        storage: S,
        dir: &Path,
        segment_bytes: u64,
        align: usize,
        fill: SpareFill,
        mutations: crate::Mutations,
    ) -> Result<Preallocator<S>, WalError> {
        let tmp = dir.join(SPARE_TMP_NAME);
        match storage.remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(WalError::io("remove", &tmp, e)),
        }
        let recycle = dir.join(RECYCLE_NAME);
        let mut recycle_ready = false;
        match storage.file_len(&recycle) {
            Ok(len) if len == segment_bytes => recycle_ready = true,
            Ok(_) => storage
                .remove_file(&recycle)
                .map_err(|e| WalError::io("remove", &recycle, e))?,
            Err(_) => {}
        }
        let spare = dir.join(SPARE_NAME);
        match storage.file_len(&spare) {
            // A whole spare left by an earlier run is reused with a new tag, never kept as
            // it is: a roll renames the spare without waiting for the directory fsync, so a
            // crash can leave records under its name, of its tag (zero-filled by an older
            // version, it gets its first header the same way).
            Ok(len) if len == segment_bytes && !recycle_ready => {
                storage
                    .rename(&spare, &recycle)
                    .map_err(|e| WalError::io("rename", &recycle, e))?;
                recycle_ready = true;
            }
            Ok(_) => storage
                .remove_file(&spare)
                .map_err(|e| WalError::io("remove", &spare, e))?,
            Err(_) => {}
        }
        let shared = Arc::new(SpareShared {
            storage,
            dir: dir.to_path_buf(),
            bytes: segment_bytes,
            align,
            state: Mutex::new(SpareState {
                ready: false,
                tag: SegmentTag::default(),
                recycle_ready,
                wanted: true,
                error: None,
                stop: false,
            }),
            cv: Condvar::new(),
            urgent: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            written: AtomicU64::new(0),
            written_at_us: AtomicU64::new(0),
            started: Instant::now(),
            recycle_offered: AtomicBool::new(recycle_ready),
            zeroed_bytes: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
            reuse_keeps_tag: AtomicBool::new(mutations.reuse_keeps_tag),
            allocate_only: AtomicBool::new(fill == SpareFill::Allocate),
        });
        if !shared.storage.background_work() {
            // Inline: the spare is prepared by the roll that needs it (see `take`).
            return Ok(Preallocator {
                shared,
                thread: None,
            });
        }
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("quire-wal-prealloc".into())
            .spawn(move || worker.run())
            .map_err(|e| WalError::io("spawn prealloc thread", dir, e))?;
        Ok(Preallocator {
            shared,
            thread: Some(thread),
        })
    }

    /// The handle retention uses to hand trimmed segments over for reuse.
    #[must_use]
    pub fn recycler(&self) -> Recycler<S> {
        Recycler {
            shared: self.shared.clone(),
        }
    }

    /// Asks for the spare at normal I/O priority from now on (the current segment is filling
    /// up and a roll will soon need it). Cheap; call as often as convenient.
    pub fn hurry(&self) {
        self.shared.urgent.store(true, Ordering::Relaxed);
    }

    /// Tells the pacing that the log wrote `bytes` more bytes (a batch). Cheap: two relaxed
    /// atomic stores.
    pub fn wrote(&self, bytes: u64) {
        let s = &self.shared;
        s.written.fetch_add(bytes, Ordering::Relaxed);
        let us = u64::try_from(s.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        s.written_at_us.store(us, Ordering::Relaxed);
    }

    /// Renames the spare to `dest`, waiting for the spare if it is still being prepared;
    /// then asks for the next one. Returns the new segment's tag. The rename is not durable
    /// yet: the caller fsyncs the directory (through its disk, beside its writes) before it
    /// counts on anything written to `dest`. Until then a crash may leave the file under
    /// the spare's name with records in it, which is why [`Preallocator::start_in`] gives a
    /// leftover spare a new tag.
    ///
    /// # Errors
    /// The preparation's error (e.g. [`WalError::NoSpace`]), or the rename's.
    pub fn take(&self, dest: &Path) -> Result<SegmentTag, WalError> {
        let s = &self.shared;
        if self.thread.is_none() && !s.lock().ready {
            // No background thread (a storage without background work): prepare it now.
            let tag = s.prepare()?;
            let mut st = s.lock();
            st.ready = true;
            st.tag = tag;
        }
        let mut st = s.lock();
        if !st.ready && st.error.is_none() {
            tracing::warn!("segment roll waits for the spare segment to be zero-filled");
            s.urgent.store(true, Ordering::Relaxed);
        }
        while !st.ready {
            if let Some(e) = st.error.take() {
                // Ask again so that a later roll can succeed once space is freed.
                st.wanted = true;
                s.cv.notify_all();
                return Err(e);
            }
            st.wanted = true;
            s.cv.notify_all();
            st = s.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        let spare = s.dir.join(SPARE_NAME);
        s.storage
            .rename(&spare, dest)
            .map_err(|e| WalError::io("rename", dest, e))?;
        st.ready = false;
        st.wanted = true;
        // A segment has just started: no roll needs the next spare yet.
        s.urgent.store(false, Ordering::Relaxed);
        s.cv.notify_all();
        Ok(st.tag)
    }
}

impl<S: Storage> Drop for Preallocator<S> {
    fn drop(&mut self) {
        {
            self.shared.stopping.store(true, Ordering::Relaxed);
            let mut st = self.shared.lock();
            st.stop = true;
            self.shared.cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<S: Storage> SpareShared<S> {
    fn lock(&self) -> std::sync::MutexGuard<'_, SpareState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn run(&self) {
        loop {
            {
                let mut st = self.lock();
                let needs_spare = |s: &SpareState| s.wanted && !s.ready;
                while !st.stop && !needs_spare(&st) {
                    st = self.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
                if st.stop {
                    return;
                }
                st.wanted = false;
            }
            let result = self.prepare();
            let mut st = self.lock();
            match result {
                Ok(tag) => {
                    st.ready = true;
                    st.tag = tag;
                    st.error = None;
                }
                Err(WalError::Closed) => return,
                Err(e) => {
                    tracing::error!(error = %e, "preparing the next WAL segment failed");
                    st.error = Some(e);
                }
            }
            self.cv.notify_all();
        }
    }

    /// Whether the paced zero-fill, `zeroed` bytes into the spare, may write its next chunk
    /// (see the module docs); `written_at_start` is the log's byte count when it began.
    fn may_zero(&self, zeroed: u64, written_at_start: u64) -> bool {
        let chunk = ZERO_FILL_CHUNK_BYTES as u64;
        let written = self
            .written
            .load(Ordering::Relaxed)
            .saturating_sub(written_at_start);
        let allowed = ZERO_FILL_LEAD_CHUNKS * chunk + ZERO_FILL_PACE_RATIO * written;
        if zeroed + chunk <= allowed {
            return true;
        }
        let now_us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let idle_us = now_us.saturating_sub(self.written_at_us.load(Ordering::Relaxed));
        idle_us >= u64::try_from(ZERO_FILL_IDLE.as_micros()).unwrap_or(u64::MAX)
    }

    /// Makes `spare.prealloc.tmp` — the file waiting for reuse, or a fresh one allocated
    /// and zero-filled — writes a new header into it, syncs it, renames it to
    /// `spare.prealloc` and fsyncs the directory. Returns the spare's tag.
    fn prepare(&self) -> Result<SegmentTag, WalError> {
        let tmp = self.dir.join(SPARE_TMP_NAME);
        let result = self.make(&tmp);
        if result.is_err() {
            let _ = self.storage.remove_file(&tmp);
        }
        let tag = result?;
        let spare = self.dir.join(SPARE_NAME);
        self.storage
            .rename(&tmp, &spare)
            .map_err(|e| WalError::io("rename", &spare, e))?;
        fsync_dir_in(&self.storage, &self.dir)?;
        Ok(tag)
    }

    fn make(&self, tmp: &Path) -> Result<SegmentTag, WalError> {
        loop {
            if let Some(previous) = self.claim_recycled(tmp)? {
                let tag = self.stamp(tmp, previous)?;
                self.recycled.fetch_add(1, Ordering::Relaxed);
                return Ok(tag);
            }
            if self.recycled.load(Ordering::Relaxed) > 0
                && self.storage.background_work()
                && self.wait_for_recycle()
            {
                continue;
            }
            if self.fill(tmp)? {
                return self.stamp(tmp, SegmentTag::V1);
            }
            // A file to reuse turned up during the zero-fill: use it instead.
            self.storage
                .remove_file(tmp)
                .map_err(|e| WalError::io("remove", tmp, e))?;
        }
    }

    /// Retention has reused files before: rather than zero-fill a fresh spare at once,
    /// wait for the next trim to hand one over, until the current segment is half full or
    /// a roll waits ([`Preallocator::hurry`], `take`), or the log closes. Returns whether a
    /// file was handed over.
    fn wait_for_recycle(&self) -> bool {
        let mut st = self.lock();
        while !st.recycle_ready
            && !st.stop
            && !self.urgent.load(Ordering::Relaxed)
            && !self.stopping.load(Ordering::Relaxed)
        {
            // `hurry` only sets a flag: look again now and then.
            st = self
                .cv
                .wait_timeout(st, RECYCLE_WAIT_POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        st.recycle_ready
    }

    /// If a file waits for reuse: renames it to `tmp`, fsyncs the directory (so that no
    /// crash can leave it under a segment name once its header changes) and returns the
    /// tag of its earlier life.
    fn claim_recycled(&self, tmp: &Path) -> Result<Option<SegmentTag>, WalError> {
        let mut st = self.lock();
        if !st.recycle_ready {
            return Ok(None);
        }
        let from = self.dir.join(RECYCLE_NAME);
        self.storage
            .rename(&from, tmp)
            .map_err(|e| WalError::io("rename", tmp, e))?;
        st.recycle_ready = false;
        self.recycle_offered.store(false, Ordering::Relaxed);
        drop(st);
        fsync_dir_in(&self.storage, &self.dir)?;
        Ok(Some(
            read_tag(&self.storage, tmp)?.unwrap_or(SegmentTag::V1),
        ))
    }

    /// Writes a header with a fresh tag (not `previous`) over the first block of `tmp` and
    /// syncs the file.
    fn stamp(&self, tmp: &Path, previous: SegmentTag) -> Result<SegmentTag, WalError> {
        let tag = if previous != SegmentTag::V1 && self.reuse_keeps_tag.load(Ordering::Relaxed) {
            previous // planted bug (tests only)
        } else {
            SegmentTag::draw(|| self.storage.random_u64(), previous)
        };
        let file = self
            .storage
            .open(tmp, OpenMode::WriteDirect)
            .map_err(|e| WalError::io("open", tmp, e))?;
        let mut block = AlignedBuf::zeroed(self.align, self.align);
        block.spare_mut()[..SEGMENT_HEADER_ENCODED_BYTES]
            .copy_from_slice(&SegmentHeader { tag }.encode());
        block.advance(self.align);
        file.write_all_at(block.as_slice(), 0)
            .map_err(|e| WalError::io("write segment header", tmp, e))?;
        file.sync_all().map_err(|e| WalError::io("fsync", tmp, e))?;
        Ok(tag)
    }

    /// Creates `tmp`, allocates and zero-fills it (without syncing). Returns `false` if it
    /// stopped because a file to reuse was offered meanwhile.
    fn fill(&self, tmp: &Path) -> Result<bool, WalError> {
        let file = self
            .storage
            .open(tmp, OpenMode::CreateDirect)
            .map_err(|e| WalError::io("create", tmp, e))?;
        let is_direct = file.direct_io() == DirectIo::On;
        match file.allocate(self.bytes) {
            Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => {
                return Err(WalError::io("fallocate", tmp, err));
            }
            // EOPNOTSUPP and friends: the zero fill below allocates the blocks anyway.
            Err(_) => {}
            Ok(()) if self.allocate_only.load(Ordering::Relaxed) => return Ok(true),
            Ok(()) => {}
        }
        if is_direct {
            let mut zeros = AlignedBuf::zeroed_huge(ZERO_FILL_CHUNK_BYTES, self.align);
            zeros.advance(zeros.capacity());
            // Zero-filling competes with the appends for the disk: do it at idle I/O
            // priority (honoured by mq-deadline and bfq), unless a roll is waiting for it.
            set_thread_io_priority(IoPriority::Idle);
            let mut raised = false;
            let mut pos = 0u64;
            let written_at_start = self.written.load(Ordering::Relaxed);
            while pos < self.bytes {
                if self.stopping.load(Ordering::Relaxed) {
                    return Err(WalError::Closed);
                }
                if self.recycle_offered.load(Ordering::Relaxed) {
                    set_thread_io_priority(IoPriority::Normal);
                    return Ok(false);
                }
                if !raised && self.urgent.load(Ordering::Relaxed) {
                    set_thread_io_priority(IoPriority::Normal);
                    raised = true;
                }
                if !raised && !self.may_zero(pos, written_at_start) {
                    std::thread::sleep(ZERO_FILL_PACE_SLEEP);
                    continue;
                }
                let n = usize::try_from(self.bytes - pos)
                    .unwrap_or(usize::MAX)
                    .min(zeros.len());
                let written = file
                    .write_at(&zeros.as_slice()[..n], pos)
                    .map_err(|e| WalError::io("zero-fill", tmp, e))?;
                if written == 0 {
                    return Err(WalError::io(
                        "zero-fill",
                        tmp,
                        io::Error::from(io::ErrorKind::WriteZero),
                    ));
                }
                pos += written as u64;
                self.zeroed_bytes
                    .fetch_add(written as u64, Ordering::Relaxed);
            }
        } else {
            write_zeros(&file, 0, self.bytes).map_err(|e| WalError::io("zero-fill", tmp, e))?;
            self.zeroed_bytes.fetch_add(self.bytes, Ordering::Relaxed);
        }
        set_thread_io_priority(IoPriority::Normal);
        Ok(true)
    }
}

/// The tag in the header of the file at `path`, or `None` if it has none (a version-1
/// file, zeros) or a damaged one.
fn read_tag<S: Storage>(storage: &S, path: &Path) -> Result<Option<SegmentTag>, WalError> {
    let file = storage
        .open(path, OpenMode::Read)
        .map_err(|e| WalError::io("open", path, e))?;
    let mut head = [0u8; SEGMENT_HEADER_ENCODED_BYTES];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| WalError::io("read", path, e))?;
    Ok(SegmentHeader::decode(&head).ok().flatten().map(|h| h.tag))
}

#[derive(Clone, Copy, Debug)]
enum IoPriority {
    /// IOPRIO_CLASS_BE, level 4 (the default).
    Normal,
    /// IOPRIO_CLASS_IDLE: served when nothing else waits for the disk.
    Idle,
}

/// Sets the I/O priority of the calling thread (advisory: failures are ignored).
fn set_thread_io_priority(p: IoPriority) {
    const IOPRIO_WHO_PROCESS: libc::c_int = 1;
    const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
    let value = match p {
        IoPriority::Normal => (2 << IOPRIO_CLASS_SHIFT) | 4,
        IoPriority::Idle => 3 << IOPRIO_CLASS_SHIFT,
    };
    // SAFETY: ioprio_set takes three integers; `who = 0` means the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, value) };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), ?p, "ioprio_set failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort() {
        assert_eq!(segment_name(Offset(42)), "00000000000000000042.log");
        assert_eq!(
            parse_segment_name("00000000000000000042.log"),
            Some(Offset(42))
        );
        assert_eq!(
            parse_segment_name(&segment_name(Offset(u64::MAX))),
            Some(Offset(u64::MAX))
        );
        assert_eq!(parse_segment_name("42.log"), None);
        assert_eq!(parse_segment_name("0000000000000000004x.log"), None);
        assert!(segment_name(Offset(9)) < segment_name(Offset(10)));
    }

    #[test]
    fn zero_fill_keeps_pace_with_the_appends_and_runs_free_when_they_stop() {
        let s = SpareShared {
            storage: OsStorage,
            dir: PathBuf::new(),
            bytes: 64 << 20,
            align: 4096,
            state: Mutex::default(),
            cv: Condvar::new(),
            urgent: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            written: AtomicU64::new(1000),
            // "Just wrote": far in the future, so the idle rule cannot fire by accident.
            written_at_us: AtomicU64::new(u64::MAX),
            started: Instant::now(),
            recycle_offered: AtomicBool::new(false),
            zeroed_bytes: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
            reuse_keeps_tag: AtomicBool::new(false),
            allocate_only: AtomicBool::new(false),
        };
        let chunk = ZERO_FILL_CHUNK_BYTES as u64;
        let lead = ZERO_FILL_LEAD_CHUNKS * chunk;
        // The lead is free; beyond it the fill waits for the log.
        assert!(s.may_zero(lead - chunk, 1000));
        assert!(!s.may_zero(lead, 1000));
        // Each byte written lets the fill zero ZERO_FILL_PACE_RATIO more.
        s.written
            .fetch_add(chunk / ZERO_FILL_PACE_RATIO, Ordering::Relaxed);
        assert!(s.may_zero(lead, 1000));
        assert!(!s.may_zero(lead + chunk, 1000));
        // A log that stopped writing no longer holds the fill back.
        s.written_at_us.store(0, Ordering::Relaxed);
        std::thread::sleep(ZERO_FILL_IDLE * 2);
        assert!(s.may_zero(lead + 10 * chunk, 1000));
    }

    #[test]
    fn lock_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DirLock::acquire(dir.path()).unwrap();
        assert!(matches!(
            DirLock::acquire(dir.path()),
            Err(WalError::Locked { .. })
        ));
        drop(lock);
        DirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn spare_is_zero_filled_stamped_and_renamed() {
        let dir = tempfile::tempdir().unwrap();
        let p = Preallocator::start(dir.path(), 64 * 1024, 4096).unwrap();
        let dest = dir.path().join(segment_name(Offset(0)));
        let tag = p.take(&dest).unwrap();
        let bytes = std::fs::read(&dest).unwrap();
        assert_eq!(bytes.len(), 64 * 1024);
        assert_eq!(
            SegmentHeader::decode(&bytes),
            Ok(Some(SegmentHeader { tag }))
        );
        assert!(bytes[SEGMENT_HEADER_ENCODED_BYTES..]
            .iter()
            .all(|&b| b == 0));
        let dest2 = dir.path().join(segment_name(Offset(7)));
        let tag2 = p.take(&dest2).unwrap();
        assert_ne!(tag, tag2);
        assert_eq!(std::fs::metadata(&dest2).unwrap().len(), 64 * 1024);
    }

    /// A file handed over for reuse becomes the next spare with only its first block
    /// written again: a new header with another tag, the rest of its bytes as they were.
    #[test]
    fn an_offered_file_is_reused_with_a_new_tag_and_nothing_else_written() {
        let dir = tempfile::tempdir().unwrap();
        let p = Preallocator::start(dir.path(), 64 * 1024, 4096).unwrap();
        let first = dir.path().join(segment_name(Offset(0)));
        let tag = p.take(&first).unwrap();
        // Its "records": anything but zeros after the first block.
        let mut bytes = std::fs::read(&first).unwrap();
        bytes[4096..].fill(0xA5);
        std::fs::write(&first, &bytes).unwrap();
        // Let the next fresh spare finish, so that the offered file waits its turn.
        let second = dir.path().join(segment_name(Offset(10)));
        p.take(&second).unwrap();
        assert!(p.recycler().offer(&first).unwrap());
        assert!(!first.exists());
        let mut tags = vec![tag];
        let mut reused = 0;
        for name in [20, 30] {
            let dest = dir.path().join(segment_name(Offset(name)));
            let t = p.take(&dest).unwrap();
            assert!(!tags.contains(&t));
            tags.push(t);
            let got = std::fs::read(&dest).unwrap();
            assert_eq!(
                SegmentHeader::decode(&got),
                Ok(Some(SegmentHeader { tag: t }))
            );
            assert!(got[SEGMENT_HEADER_ENCODED_BYTES..4096]
                .iter()
                .all(|&b| b == 0));
            if got[4096] == 0xA5 {
                assert!(got[4096..].iter().all(|&b| b == 0xA5));
                reused += 1;
            }
        }
        assert_eq!((reused, p.recycler().recycled()), (1, 1));
    }
}
