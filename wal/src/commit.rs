//! Group commit: the commit thread of one data directory, and the state it shares with the
//! [`crate::Wal`] handles.
//!
//! Appenders validate and queue their records under one mutex (so queue order is log
//! order) and wake the commit thread. The commit thread takes queued appends into a
//! **batch** of at most `batch_bytes_max` bytes, encodes them into one aligned buffer (the
//! one copy of each payload; the checksums were computed by the appenders before they
//! queued, off this thread), pads the batch with zeros to the alignment, and writes it
//! with one write at the next aligned position of the current segment. One fdatasync then
//! covers every batch written before it; only when it succeeds are the batch's appends
//! acknowledged and its entries added to the durable index.
//!
//! When to write:
//! - the disk is idle: at once — unless the last fdatasync released several appends
//!   (concurrent appenders): then the batch waits for as many appends to be queued again,
//!   for `batch_bytes_max` bytes, or for `batch_window_us` after its first append,
//!   whichever comes first. A lone appender never waits.
//! - an fdatasync is in flight: as soon as the batch holds half as many appends as the
//!   last fdatasync released (or `batch_bytes_max` bytes), provided no other write is in
//!   flight and fewer than [`PIPELINE_BATCHES_MAX`] batches wait between "written" and
//!   "durable" (pipelining: the write overlaps the running fdatasync, and the next
//!   fdatasync covers every batch written meanwhile); otherwise when the fdatasync
//!   completes. With nothing in flight, a write and its fdatasync are submitted together,
//!   linked.
//!
//! After an fdatasync completes, the next operations are submitted before its appends are
//! acknowledged, so waking the appenders overlaps the disk's work.
//!
//! A segment roll takes the preallocated spare (renamed to the new segment's name on this
//! thread, a metadata operation only) and goes on writing: it does not wait for the
//! batches of the old segment to become durable, and the directory fsync that makes the
//! new name durable is one more operation on the disk, beside the writes. Each file gets
//! its own fdatasync (at most one in flight per file), and appends are acknowledged in log
//! order: a batch only once it and every batch before it are durable **and** the directory
//! fsync that covers its segment's name has completed. Only a roll that a truncation below
//! the current segment's base forces (it deletes segments) waits until the pipeline is
//! empty. A fresh log with `stagger_rolls` ends its first segment at a random point
//! between half and all of its size, so that logs receiving the same appends (a cluster's
//! stores) do not roll together.
//!
//! Fail-stop: the first failed or short write, or failed fdatasync, fails every append in
//! the pipeline and in the queue and every later one with [`WalError::Failed`]; nothing is
//! retried. The accepted view of the log falls back to the durable one.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use quire_proto::{Epoch, Event, Offset};

use crate::append::AckSlot;
use crate::disk::{AlignedBuf, DirectIo, Disk, DiskCompletion, DiskOp, DiskWaker, HUGE_PAGE_BYTES};
use crate::error::WalError;
use crate::format::{self, align_up, SegmentTag, KIND_TRUNCATE};
use crate::index::{EpochRuns, Index, IndexedSegment};
use crate::recovery::{open_for_read, Tail};
use crate::segment::{self, segment_name, Preallocator};
use crate::stats::Counters;
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::{Mutations, Position};

/// Disk operations in flight at most: a write and an fdatasync for each pipelined batch.
pub(crate) const OPS_IN_FLIGHT_MAX: usize = 2 * PIPELINE_BATCHES_MAX;
/// Batches written but not yet durable, at most.
pub(crate) const PIPELINE_BATCHES_MAX: usize = 4;
/// Spare batch buffers kept for reuse.
const FREE_BUFFERS_MAX: usize = 3;

/// One queued append.
#[derive(Debug)]
pub(crate) struct Request {
    pub writer_epoch: Epoch,
    pub records: Vec<Event>,
    /// Each record's CRC-32C ([`format::event_crc_in`] with `crc_tag`), computed by the
    /// appender before the handoff so the commit thread only copies.
    pub crcs: Vec<u32>,
    /// The tag the checksums were computed for: the current segment's when the appender
    /// looked ([`Shared::current_tag`]). A batch that lands in another segment (a roll
    /// came between) computes them again.
    pub crc_tag: SegmentTag,
    /// Set when the append replaces the suffix from this offset: a marker precedes it.
    pub truncate_at: Option<Offset>,
    /// Encoded bytes (records, plus the marker if any), before padding.
    pub bytes: u64,
    pub ack: Arc<AckSlot>,
    pub arrived: Instant,
}

impl Request {
    fn first_offset(&self) -> Offset {
        self.records.first().map_or(Offset::ZERO, |r| r.offset)
    }
}

/// The accepted view of the log and the queue, under one mutex.
#[derive(Debug)]
pub(crate) struct CommitState {
    /// Epochs of every accepted entry (durable or queued).
    pub epochs: EpochRuns,
    /// Highest epoch of any accepted record (entries, and writer epochs of markers).
    pub max_epoch: Epoch,
    pub queue: VecDeque<Request>,
    pub queued_bytes: u64,
    /// Why the log failed, once it has.
    pub failed: Option<WalError>,
    pub closing: bool,
}

/// Everything the handles and the commit thread share.
#[derive(Debug)]
pub(crate) struct Shared<S: Storage> {
    pub storage: S,
    pub mutations: Mutations,
    pub dir: PathBuf,
    pub align: u64,
    pub segment_bytes: u64,
    pub batch_bytes_max: u64,
    pub batch_window: Duration,
    pub queue_bytes_max: u64,
    /// [`crate::WalConfig::stagger_rolls`].
    pub stagger_rolls: bool,
    pub backend: &'static str,
    pub state: Mutex<CommitState>,
    /// Records known damaged ([`crate::Wal::corrupt_records`]).
    pub damaged: crate::wal::Damaged,
    /// Durable entries only. Lock order: `state` before `index`.
    pub index: RwLock<Index<S::File>>,
    pub counters: Counters,
    pub waker: Arc<dyn DiskWaker>,
    /// While a batch is held open for concurrent appenders: the queue length at which an
    /// appender wakes the commit thread (`usize::MAX` otherwise).
    pub wake_at_queue_len: AtomicUsize,
    /// The tag of the segment appends go to now ([`SegmentTag::get`]), for the appenders'
    /// checksums; set by the commit thread at each roll.
    pub current_tag: AtomicU64,
}

impl<S: Storage> Shared<S> {
    pub(crate) fn lock_state(&self) -> MutexGuard<'_, CommitState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn read_index(&self) -> std::sync::RwLockReadGuard<'_, Index<S::File>> {
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, Index<S::File>> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
enum IndexOp {
    Truncate(Offset),
    Push {
        offset: Offset,
        epoch: Epoch,
        position: u64,
        bytes: u64,
    },
}

#[derive(Debug)]
struct Ack {
    slot: Arc<AckSlot>,
    last: Offset,
    records: u64,
    payload_bytes: u64,
}

#[derive(Debug)]
struct Batch<F> {
    segment: u32,
    path: PathBuf,
    file: Arc<F>,
    bytes: u64,
    write_token: u64,
    /// When its write was handed to the disk.
    submitted: Instant,
    written: bool,
    /// The fdatasync that covers it: linked to its write, or pushed after the write
    /// completed.
    sync_token: Option<u64>,
    /// That fdatasync completed.
    synced: bool,
    acks: Vec<Ack>,
    ops: Vec<IndexOp>,
}

/// An fdatasync in flight; at most one per segment file.
#[derive(Debug)]
struct InFlightSync {
    token: u64,
    /// The segment (index id) whose file it syncs.
    segment: u32,
    /// When it was submitted; for one linked behind a write (which the kernel starts only
    /// once that write completed), moved to the write's completion.
    started: Instant,
    /// The write it is linked behind, if any.
    linked_write: Option<u64>,
}

/// A directory fsync in flight: it makes the names of `segments` durable.
#[derive(Debug)]
struct InFlightDirSync {
    token: u64,
    segments: Vec<u32>,
}

#[derive(Debug)]
struct Current<F> {
    index_id: u32,
    base: Offset,
    path: PathBuf,
    file: Arc<F>,
    capacity: u64,
    /// Once the segment is written up to here, the next batch goes to a new segment
    /// (`capacity`, except for a staggered first segment).
    roll_at: u64,
    write_pos: u64,
    tag: SegmentTag,
}

enum Placement {
    Fits,
    /// Start a new segment named `name` (deleting every segment whose base >= `name`).
    NewSegment {
        name: Offset,
    },
}

/// The commit thread's state. See the module docs.
#[derive(Debug)]
pub(crate) struct Committer<S: Storage> {
    shared: Arc<Shared<S>>,
    disk: Box<dyn Disk<S::File>>,
    prealloc: Preallocator<S>,
    current: Option<Current<S::File>>,
    pipeline: VecDeque<Batch<S::File>>,
    write_in_flight: Option<u64>,
    /// fdatasyncs in flight, at most one per segment file.
    fsyncs: Vec<InFlightSync>,
    /// The data directory's handle, for [`DiskOp::SyncDir`].
    dir: Arc<S::File>,
    /// Segments renamed at a roll whose names no completed directory fsync covers yet:
    /// none of their batches is acknowledged until one does.
    unnamed: Vec<u32>,
    dir_sync: Option<InFlightDirSync>,
    next_token: u64,
    free: Vec<AlignedBuf>,
    completions: Vec<DiskCompletion>,
    /// Acknowledgements of durable appends, delivered after the next submission.
    acks_due: Vec<Ack>,
    /// Appends acknowledged by the last fdatasync: the expected number of concurrent
    /// appenders, which the batch window waits for.
    last_group_appends: usize,
    failed: bool,
}

impl<S: Storage> Committer<S> {
    pub(crate) fn new(
        shared: Arc<Shared<S>>,
        disk: Box<dyn Disk<S::File>>,
        prealloc: Preallocator<S>,
        tail: Option<Tail>,
    ) -> Result<Committer<S>, WalError> {
        let current = match tail {
            None => None,
            Some(t) => {
                let file = shared
                    .storage
                    .open(&t.path, OpenMode::WriteDirect)
                    .map_err(|e| WalError::io("open", &t.path, e))?;
                shared.current_tag.store(t.tag.get(), Ordering::Relaxed);
                Some(Current {
                    index_id: t.index_id,
                    base: t.base,
                    path: t.path,
                    file: Arc::new(file),
                    capacity: t.capacity,
                    roll_at: t.capacity,
                    write_pos: t.write_position,
                    tag: t.tag,
                })
            }
        };
        let dir = shared
            .storage
            .open_dir(&shared.dir)
            .map_err(|e| WalError::io("open dir", &shared.dir, e))?;
        Ok(Committer {
            shared,
            disk,
            prealloc,
            current,
            pipeline: VecDeque::new(),
            write_in_flight: None,
            fsyncs: Vec::new(),
            dir: Arc::new(dir),
            unnamed: Vec::new(),
            dir_sync: None,
            next_token: 1,
            free: Vec::new(),
            completions: Vec::new(),
            acks_due: Vec::new(),
            last_group_appends: 0,
            failed: false,
        })
    }

    /// The commit thread's loop; returns when the log is closed and everything queued
    /// has been written (or failed).
    pub(crate) fn run(mut self) {
        loop {
            let completions = std::mem::take(&mut self.completions);
            for c in completions {
                self.on_completion(c);
            }
            let mut timeout = None;
            if !self.failed {
                self.maybe_fsync();
                timeout = self.maybe_write();
                // A roll or a failure inside maybe_write may have produced work.
                if !self.failed {
                    self.maybe_fsync();
                }
            }
            let (closing, queue_empty) = {
                let st = self.shared.lock_state();
                (st.closing, st.queue.is_empty())
            };
            if !self.acks_due.is_empty() {
                if let Err(e) = self.disk.submit() {
                    self.fail(WalError::io("submit", &self.shared.dir, e));
                }
                self.deliver_acks();
            }
            if closing && queue_empty && self.pipeline.is_empty() && self.disk.in_flight() == 0 {
                break;
            }
            if let Err(e) = self.disk.wait(&mut self.completions, timeout) {
                self.fail(WalError::io("wait for completions", &self.shared.dir, e));
                if self.disk.in_flight() > 0 {
                    // The submission mechanism is broken; do not spin on it.
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    fn token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    fn on_completion(&mut self, c: DiskCompletion) {
        if let Some(buf) = c.buf {
            // Keep standard-size buffers; one-off large ones (a single append above
            // batch_bytes_max) go back to the allocator.
            let cap = buf.capacity() as u64;
            if self.free.len() < FREE_BUFFERS_MAX
                && cap >= self.shared.batch_bytes_max
                && cap <= 2 * self.shared.batch_bytes_max.max(self.shared.align)
            {
                self.free.push(buf);
            }
        }
        if self.write_in_flight == Some(c.token) {
            self.write_in_flight = None;
            let c_token = c.token;
            let Some(batch) = self.pipeline.iter_mut().find(|b| b.write_token == c.token) else {
                return;
            };
            match c.result {
                Ok(n) if u64::from(n) == batch.bytes => {
                    batch.written = true;
                    if self.shared.mutations.ack_before_fdatasync {
                        // Planted bug (tests only): acknowledge on the write's completion.
                        self.acks_due.append(&mut batch.acks);
                    }
                    let c = &self.shared.counters;
                    Counters::add(&c.stage_writes, 1);
                    Counters::add_elapsed(&c.stage_write_ns, batch.submitted);
                    if let Some(sync) = self
                        .fsyncs
                        .iter_mut()
                        .find(|s| s.linked_write == Some(c_token))
                    {
                        sync.started = Instant::now();
                    }
                }
                Ok(n) => {
                    let e =
                        std::io::Error::other(format!("short write: {n} of {} bytes", batch.bytes));
                    let path = batch.path.clone();
                    self.fail(WalError::io("write", path, e));
                }
                Err(e) => {
                    let path = batch.path.clone();
                    self.fail(WalError::io("write", path, e));
                }
            }
        } else if let Some(i) = self.fsyncs.iter().position(|s| s.token == c.token) {
            let sync = self.fsyncs.swap_remove(i);
            match c.result {
                Ok(_) => {
                    let us = u64::try_from(sync.started.elapsed().as_micros()).unwrap_or(u64::MAX);
                    self.shared.counters.record_fsync(us);
                    for b in &mut self.pipeline {
                        if b.sync_token == Some(sync.token) {
                            b.synced = true;
                        }
                    }
                    self.durable();
                }
                Err(e) => {
                    let path = self
                        .pipeline
                        .iter()
                        .find(|b| b.segment == sync.segment)
                        .map_or_else(|| self.shared.dir.clone(), |b| b.path.clone());
                    self.fail(WalError::io("fdatasync", path, e));
                }
            }
        } else if self.dir_sync.as_ref().is_some_and(|d| d.token == c.token) {
            let done = self.dir_sync.take().expect("invariant: checked above");
            match c.result {
                Ok(_) => {
                    self.unnamed.retain(|s| !done.segments.contains(s));
                    self.durable();
                }
                Err(e) => {
                    let dir = self.shared.dir.clone();
                    self.fail(WalError::io("fsync dir", dir, e));
                }
            }
        }
        // Otherwise: a completion that arrived after the log failed; nothing to do.
    }

    /// Takes the durable prefix of the pipeline — batches whose fdatasync completed, in a
    /// segment whose name is durable — indexes it, then acknowledges it.
    fn durable(&mut self) {
        let mut done = Vec::new();
        // Planted bug (tests only): ignore whether the segment's name is durable.
        let any_name = self.shared.mutations.ack_before_dir_sync;
        while self
            .pipeline
            .front()
            .is_some_and(|b| b.synced && (any_name || !self.unnamed.contains(&b.segment)))
        {
            done.push(self.pipeline.pop_front().expect("invariant: front exists"));
        }
        if done.is_empty() {
            return;
        }
        {
            let mut index = self.shared.write_index();
            for b in &done {
                for op in &b.ops {
                    match *op {
                        IndexOp::Truncate(x) => {
                            index.truncate(x);
                            self.shared.damaged.forget_from(x);
                        }
                        IndexOp::Push {
                            offset,
                            epoch,
                            position,
                            bytes,
                        } => {
                            index.push(offset, epoch, b.segment, Position(position), bytes);
                        }
                    }
                }
            }
        }
        self.last_group_appends = done.iter().map(|b| b.acks.len()).sum();
        for b in done {
            self.acks_due.extend(b.acks);
        }
    }

    /// Resolves the futures of durable appends.
    fn deliver_acks(&mut self) {
        let c = &self.shared.counters;
        for a in self.acks_due.drain(..) {
            Counters::add(&c.appends, 1);
            Counters::add(&c.records, a.records);
            Counters::add(&c.payload_bytes, a.payload_bytes);
            a.slot.complete(Ok(a.last));
        }
    }

    /// Pushes an fdatasync for each file with written batches that no fdatasync covers
    /// (unless one already runs on that file), and a directory fsync for renamed segments
    /// (unless one already runs).
    fn maybe_fsync(&mut self) {
        while let Some(b) = self.pipeline.iter().find(|b| {
            b.written
                && b.sync_token.is_none()
                && !self.fsyncs.iter().any(|s| s.segment == b.segment)
        }) {
            let segment = b.segment;
            let file = b.file.clone();
            let token = self.token();
            for b in &mut self.pipeline {
                if b.segment == segment && b.written && b.sync_token.is_none() {
                    b.sync_token = Some(token);
                }
            }
            self.disk.push(DiskOp::Fdatasync { file, token });
            self.fsyncs.push(InFlightSync {
                token,
                segment,
                started: Instant::now(),
                linked_write: None,
            });
        }
        if self.dir_sync.is_none() && !self.unnamed.is_empty() {
            let token = self.token();
            self.disk.push(DiskOp::SyncDir {
                dir: self.dir.clone(),
                token,
            });
            self.dir_sync = Some(InFlightDirSync {
                token,
                segments: self.unnamed.clone(),
            });
        }
    }

    /// Where request `r` goes if `in_batch` bytes precede it in the batch being formed.
    fn placement(&self, r: &Request, in_batch: u64) -> Placement {
        let Some(cur) = &self.current else {
            return Placement::NewSegment {
                name: r.truncate_at.unwrap_or_else(|| r.first_offset()),
            };
        };
        if let Some(x) = r.truncate_at {
            if x < cur.base {
                return Placement::NewSegment { name: x };
            }
        }
        let needed = align_up(in_batch + r.bytes, self.shared.align);
        if cur.write_pos + needed > cur.capacity || cur.write_pos + in_batch >= cur.roll_at {
            return Placement::NewSegment {
                name: r.truncate_at.unwrap_or_else(|| r.first_offset()),
            };
        }
        Placement::Fits
    }

    /// Forms and submits the next batch if the pipeline has room. Returns how long to
    /// wait for the batch window, if the batch is being held open.
    fn maybe_write(&mut self) -> Option<Duration> {
        self.shared
            .wake_at_queue_len
            .store(usize::MAX, Ordering::Relaxed);
        if self.write_in_flight.is_some() || self.pipeline.len() >= PIPELINE_BATCHES_MAX {
            return None;
        }
        let mut st = self.shared.lock_state();
        let first = st.queue.front()?;
        let full = st.queued_bytes >= self.shared.batch_bytes_max;
        if !self.fsyncs.is_empty()
            && !full
            && !st.closing
            && st.queue.len() * 2 < self.last_group_appends.max(2)
        {
            // An fdatasync is running: write behind it once the batch is worth a write of
            // its own (half the appenders the last fdatasync released, or a full batch);
            // until then keep filling it. The completion brings us back.
            return None;
        }
        if self.pipeline.is_empty()
            && !full
            && !st.closing
            && self.last_group_appends > 1
            && st.queue.len() < self.last_group_appends
        {
            // Concurrent appenders: give the ones the last fdatasync released a moment to
            // come back, so that they share the next one.
            let due = first.arrived + self.shared.batch_window;
            let now = Instant::now();
            if now < due {
                self.shared
                    .wake_at_queue_len
                    .store(self.last_group_appends, Ordering::Relaxed);
                return Some(due - now);
            }
        }
        if let Placement::NewSegment { name } = self.placement(first, 0) {
            let deletes = self.current.as_ref().is_none_or(|cur| name <= cur.base);
            if deletes && !self.pipeline.is_empty() {
                // A truncation below the current segment deletes segments: drain first
                // (the fdatasync completion wakes us). A plain roll does not wait.
                return None;
            }
            drop(st);
            if let Err(e) = self.new_segment(name) {
                self.fail(e);
                return None;
            }
            st = self.shared.lock_state();
        }
        let mut requests = Vec::new();
        let mut bytes = 0u64;
        while let Some(r) = st.queue.front() {
            if !requests.is_empty()
                && (bytes + r.bytes > self.shared.batch_bytes_max
                    || matches!(self.placement(r, bytes), Placement::NewSegment { .. }))
            {
                break;
            }
            let r = st.queue.pop_front().expect("invariant: front exists");
            bytes += r.bytes;
            st.queued_bytes -= r.bytes;
            requests.push(r);
        }
        drop(st);
        if !requests.is_empty() {
            self.submit_batch(requests, bytes);
        }
        None
    }

    fn take_buf(&mut self, bytes: u64) -> AlignedBuf {
        let need = usize::try_from(align_up(bytes, self.shared.align))
            .expect("invariant: a batch fits memory");
        // The most recently freed buffer that fits: its lines are the likeliest to be cached.
        if let Some(i) = self.free.iter().rposition(|b| b.capacity() >= need) {
            let mut b = self.free.remove(i);
            b.clear();
            return b;
        }
        let cap = need.max(usize::try_from(self.shared.batch_bytes_max).unwrap_or(usize::MAX));
        let align = usize::try_from(self.shared.align).expect("invariant: alignment fits usize");
        if cap >= HUGE_PAGE_BYTES / 2 {
            // Long-lived and large: huge pages make each write's page pinning and bio cheap.
            AlignedBuf::zeroed_huge(cap, align)
        } else {
            AlignedBuf::zeroed(cap, align)
        }
    }

    fn submit_batch(&mut self, requests: Vec<Request>, bytes: u64) {
        let encoding = Instant::now();
        {
            let c = &self.shared.counters;
            Counters::add(&c.stage_batched, requests.len() as u64);
            for r in &requests {
                let ns = encoding.saturating_duration_since(r.arrived).as_nanos();
                Counters::add(&c.stage_queue_ns, u64::try_from(ns).unwrap_or(u64::MAX));
            }
        }
        let mut buf = self.take_buf(bytes);
        let align = usize::try_from(self.shared.align).expect("invariant: alignment fits usize");
        let cur = self
            .current
            .as_mut()
            .expect("invariant: a segment is open before a batch");
        let start = cur.write_pos;
        let tag = cur.tag;
        let mut ops = Vec::new();
        let mut acks = Vec::with_capacity(requests.len());
        let mut truncations = 0;
        for r in requests {
            if let Some(x) = r.truncate_at {
                let n = format::encode(buf.spare_mut(), tag, r.writer_epoch, x, KIND_TRUNCATE, &[]);
                buf.advance(n);
                ops.push(IndexOp::Truncate(x));
                truncations += 1;
            }
            let mut payload_bytes = 0u64;
            debug_assert_eq!(r.crcs.len(), r.records.len());
            let same_tag = r.crc_tag == tag;
            for (rec, &crc) in r.records.iter().zip(&r.crcs) {
                let position = start + buf.len() as u64;
                let crc = if same_tag {
                    crc
                } else {
                    format::event_crc_in(tag, rec)
                };
                let n = format::encode_event_with_crc(buf.spare_mut(), tag, rec, crc);
                buf.advance(n);
                payload_bytes += rec.payload.len() as u64;
                ops.push(IndexOp::Push {
                    offset: rec.offset,
                    epoch: rec.epoch,
                    position,
                    bytes: n as u64,
                });
            }
            let last = r.records.last().map_or(Offset::ZERO, |rec| rec.offset);
            acks.push(Ack {
                slot: r.ack,
                last,
                records: r.records.len() as u64,
                payload_bytes,
            });
        }
        debug_assert_eq!(buf.len() as u64, bytes);
        let padding = buf.pad_to(align) as u64;
        let total = buf.len() as u64;
        assert!(
            start % self.shared.align == 0 && total % self.shared.align == 0,
            "O_DIRECT writes are aligned"
        );
        assert!(
            start + total <= cur.capacity,
            "a batch never crosses the segment's end"
        );
        cur.write_pos = start + total;
        self.prealloc.wrote(total);
        if cur.write_pos > cur.capacity / 2 {
            // The next roll is near: make sure the spare's zero-fill is not starved.
            self.prealloc.hurry();
        }
        let file = cur.file.clone();
        let path = cur.path.clone();
        let segment = cur.index_id;
        if truncations > 0 {
            // A file that holds a marker is never reused (docs/format.md, "Reuse").
            if let Some(s) = self.shared.write_index().segment_mut(segment) {
                s.has_marker = true;
            }
        }

        let c = &self.shared.counters;
        Counters::add(&c.batches, 1);
        Counters::add(&c.batch_bytes, total);
        Counters::add(&c.padding_bytes, padding);
        Counters::add(&c.truncations, truncations);
        Counters::add_elapsed(&c.stage_copy_ns, encoding);

        let write_token = self.token();
        let then_fdatasync = if self.fsyncs.iter().any(|s| s.segment == segment) {
            Counters::add(&self.shared.counters.pipelined_writes, 1);
            None
        } else {
            // Linked behind this write, it also covers every earlier write to the file
            // (they completed before this one was pushed).
            let token = self.token();
            self.fsyncs.push(InFlightSync {
                token,
                segment,
                started: Instant::now(),
                linked_write: Some(write_token),
            });
            for b in &mut self.pipeline {
                if b.segment == segment && b.written && b.sync_token.is_none() {
                    b.sync_token = Some(token);
                }
            }
            Some(token)
        };
        self.disk.push(DiskOp::Write {
            file: file.clone(),
            position: Position(start),
            buf,
            token: write_token,
            then_fdatasync,
        });
        self.write_in_flight = Some(write_token);
        self.pipeline.push_back(Batch {
            segment,
            path,
            file,
            bytes: total,
            write_token,
            submitted: Instant::now(),
            written: false,
            sync_token: then_fdatasync,
            synced: false,
            acks,
            ops,
        });
    }

    /// Starts segment `name`: deletes every segment whose base >= `name` (highest first,
    /// then fsyncs the directory; only with an empty pipeline), then takes the spare and
    /// renames it. The new name becomes durable with the next directory fsync
    /// ([`Committer::maybe_fsync`]), which its batches' acknowledgements wait for.
    fn new_segment(&mut self, name: Offset) -> Result<(), WalError> {
        let dir = self.shared.dir.clone();
        let doomed: Vec<(u32, PathBuf)> = {
            let index = self.shared.read_index();
            index
                .segments()
                .filter(|(_, s)| s.base >= name)
                .map(|(i, s)| (i, s.path.clone()))
                .collect()
        };
        if let Some(&(first, _)) = doomed.first() {
            // Every renamed segment keeps a batch in the pipeline until its directory
            // fsync completes, so an empty pipeline also means no name is pending (segment
            // ids are reused after a deletion: a stale one must not be in `unnamed`).
            assert!(
                self.pipeline.is_empty()
                    && self.fsyncs.is_empty()
                    && self.unnamed.is_empty()
                    && self.dir_sync.is_none(),
                "segments deleted with batches in flight"
            );
            // The durable view loses these segments' entries now, before the files go.
            self.shared.write_index().remove_segments_from(first);
            for (_, p) in doomed.iter().rev() {
                self.shared
                    .storage
                    .remove_file(p)
                    .map_err(|e| WalError::io("remove", p, e))?;
            }
            segment::fsync_dir_in(&self.shared.storage, &dir)?;
            tracing::info!(
                from = name.0,
                segments = doomed.len(),
                "deleted segments replaced by a truncation"
            );
        }
        let path = dir.join(segment_name(name));
        let tag = self.prealloc.take(&path)?;
        let file = self
            .shared
            .storage
            .open(&path, OpenMode::WriteDirect)
            .map_err(|e| WalError::io("open", &path, e))?;
        self.shared.counters.direct_io.store(
            file.direct_io() == DirectIo::On,
            std::sync::atomic::Ordering::Relaxed,
        );
        let capacity = format::align_down(
            file.size().map_err(|e| WalError::io("stat", &path, e))?,
            self.shared.align,
        );
        let data_start = tag.data_start(self.shared.align);
        let mut roll_at = capacity;
        if self.shared.stagger_rolls
            && self.current.is_none()
            && self.shared.read_index().segments().next().is_none()
        {
            // A fresh log: end the first segment early, at a random point in its second
            // half, so that stores fed the same appends roll at different moments. A batch
            // that starts before that point may still run to the end of the file, so an
            // append that fits a segment always fits this one.
            let half = (capacity - data_start) / 2 / self.shared.align;
            if half > 0 {
                roll_at -= self.shared.storage.random_u64() % half * self.shared.align;
            }
        }
        let read = open_for_read(&self.shared.storage, &path)?;
        let index_id = self.shared.write_index().add_segment(IndexedSegment {
            base: name,
            path: path.clone(),
            file: read,
            tag,
            has_marker: false,
        });
        self.shared.current_tag.store(tag.get(), Ordering::Relaxed);
        self.unnamed.push(index_id);
        Counters::add(&self.shared.counters.segments_created, 1);
        tracing::debug!(segment = %path.display(), roll_at, "started a new segment");
        self.current = Some(Current {
            index_id,
            base: name,
            path,
            file: Arc::new(file),
            capacity,
            roll_at,
            write_pos: data_start,
            tag,
        });
        Ok(())
    }

    /// Fail-stop. See the module docs.
    fn fail(&mut self, reason: WalError) {
        if self.failed {
            return;
        }
        self.failed = true;
        // Appends already durable keep their Ok.
        self.deliver_acks();
        tracing::error!(error = %reason, "the WAL failed; it is read-only from now on");
        let failed = WalError::Failed {
            reason: Arc::new(reason.clone()),
        };
        let queued = {
            let mut st = self.shared.lock_state();
            st.failed = Some(reason);
            st.queued_bytes = 0;
            st.epochs = self.shared.read_index().epochs().clone();
            std::mem::take(&mut st.queue)
        };
        self.shared
            .counters
            .failed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        for b in self.pipeline.drain(..) {
            for a in b.acks {
                a.slot.complete(Err(failed.clone()));
            }
        }
        for r in queued {
            r.ack.complete(Err(failed.clone()));
        }
        self.fsyncs.clear();
        self.dir_sync = None;
        self.unnamed.clear();
        self.write_in_flight = None;
    }
}
