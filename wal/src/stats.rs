//! Counters of the write path, for the node to export (Prometheus-style: monotonic
//! counters, sums, and a fixed-bucket histogram of fdatasync latency).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Upper bounds (inclusive, microseconds) of the fdatasync latency histogram buckets; a
/// last implicit bucket counts everything slower.
pub const FSYNC_US_BUCKETS: [u64; 12] = [
    50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 1_000_000,
];

/// A snapshot of the WAL's counters. Every count is since open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Appends acknowledged durable.
    pub appends: u64,
    /// Records (events) acknowledged durable.
    pub records: u64,
    /// Payload bytes acknowledged durable.
    pub payload_bytes: u64,
    /// Batches written (one write each).
    pub batches: u64,
    /// Bytes written by batches, padding included.
    pub batch_bytes: u64,
    /// Zero padding bytes written to align batches.
    pub padding_bytes: u64,
    /// fdatasyncs completed successfully.
    pub fsyncs: u64,
    /// Sum of fdatasync latencies, microseconds: from submission to completion, or for an
    /// fdatasync linked behind a write, from that write's completion (when the kernel
    /// starts it).
    pub fsync_us_sum: u64,
    /// Slowest fdatasync, microseconds.
    pub fsync_us_max: u64,
    /// fdatasync latency histogram: counts per bucket of [`FSYNC_US_BUCKETS`], plus one
    /// overflow bucket at the end (not cumulative).
    pub fsync_us_buckets: [u64; FSYNC_US_BUCKETS.len() + 1],
    /// Batch writes submitted while an fdatasync was in flight (pipelining at work).
    pub pipelined_writes: u64,
    /// Truncation markers written.
    pub truncations: u64,
    /// Segments started (rolls and truncations below the current segment).
    pub segments_created: u64,
    /// Segments deleted by retention ([`crate::Wal::trim_before`]), reused ones included.
    pub segments_trimmed: u64,
    /// Of those, files kept to be reused as a spare segment (docs/format.md, "Reuse").
    pub segments_reused: u64,
    /// Spare segments made from reused files (a header written, nothing else).
    pub spares_reused: u64,
    /// Bytes of zeros written into fresh spare segments: what a log that reuses no file
    /// writes on top of its records.
    pub spare_zero_bytes: u64,
    /// Appends refused by validation.
    pub appends_refused: u64,
    /// Where append latency goes, as sums over the counted appends or batches
    /// ([`StageSums`]).
    pub stages: StageSums,
    /// Whether the log has failed (fail-stop).
    pub failed: bool,
    /// Whether the current segment is written with O_DIRECT (false where the file system
    /// refuses it, e.g. tmpfs).
    pub direct_io: bool,
}

/// The stages of an append's path, as sums of nanoseconds: divide by the count named on each
/// field for a mean. A lone appender's append-to-durable latency is about
/// `prepare + queue + copy + write + fdatasync` plus the wake-ups between threads (the
/// commit thread waking, the appender waking after its acknowledgement), which no
/// counter here sees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StageSums {
    /// Appends that reached the queue (validated and queued).
    pub queued: u64,
    /// On the appender's thread, from `Wal::append` until the append is queued: the
    /// checksums, validation, the queue lock. Per queued append.
    pub prepare_ns: u64,
    /// From queued until the commit thread starts encoding the batch that holds it: the
    /// commit thread's wake-up, the batch window, waiting for the pipeline. Per append
    /// placed in a batch (counted in [`StageSums::batched`]).
    pub queue_ns: u64,
    /// Appends placed in a batch.
    pub batched: u64,
    /// Encoding a batch into its aligned buffer (the payload copy). Per batch
    /// ([`WalStats::batches`]).
    pub copy_ns: u64,
    /// From handing a batch's write to the disk until it completes. Per completed write
    /// (counted in [`StageSums::writes`]).
    pub write_ns: u64,
    /// Writes completed successfully.
    pub writes: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub appends: AtomicU64,
    pub records: AtomicU64,
    pub payload_bytes: AtomicU64,
    pub batches: AtomicU64,
    pub batch_bytes: AtomicU64,
    pub padding_bytes: AtomicU64,
    pub fsyncs: AtomicU64,
    pub fsync_us_sum: AtomicU64,
    pub fsync_us_max: AtomicU64,
    pub fsync_us_buckets: [AtomicU64; FSYNC_US_BUCKETS.len() + 1],
    pub pipelined_writes: AtomicU64,
    pub truncations: AtomicU64,
    pub segments_created: AtomicU64,
    pub segments_trimmed: AtomicU64,
    pub segments_reused: AtomicU64,
    pub appends_refused: AtomicU64,
    pub stage_queued: AtomicU64,
    pub stage_prepare_ns: AtomicU64,
    pub stage_queue_ns: AtomicU64,
    pub stage_batched: AtomicU64,
    pub stage_copy_ns: AtomicU64,
    pub stage_write_ns: AtomicU64,
    pub stage_writes: AtomicU64,
    pub failed: AtomicBool,
    pub direct_io: AtomicBool,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds the nanoseconds elapsed since `since` to `sum`.
    pub(crate) fn add_elapsed(sum: &AtomicU64, since: std::time::Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        sum.fetch_add(ns, Ordering::Relaxed);
    }

    pub(crate) fn record_fsync(&self, us: u64) {
        Self::add(&self.fsyncs, 1);
        Self::add(&self.fsync_us_sum, us);
        self.fsync_us_max.fetch_max(us, Ordering::Relaxed);
        let i = FSYNC_US_BUCKETS
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(FSYNC_US_BUCKETS.len());
        Self::add(&self.fsync_us_buckets[i], 1);
    }

    pub(crate) fn snapshot(&self) -> WalStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut buckets = [0u64; FSYNC_US_BUCKETS.len() + 1];
        for (b, c) in buckets.iter_mut().zip(self.fsync_us_buckets.iter()) {
            *b = get(c);
        }
        WalStats {
            appends: get(&self.appends),
            records: get(&self.records),
            payload_bytes: get(&self.payload_bytes),
            batches: get(&self.batches),
            batch_bytes: get(&self.batch_bytes),
            padding_bytes: get(&self.padding_bytes),
            fsyncs: get(&self.fsyncs),
            fsync_us_sum: get(&self.fsync_us_sum),
            fsync_us_max: get(&self.fsync_us_max),
            fsync_us_buckets: buckets,
            pipelined_writes: get(&self.pipelined_writes),
            truncations: get(&self.truncations),
            segments_created: get(&self.segments_created),
            segments_trimmed: get(&self.segments_trimmed),
            segments_reused: get(&self.segments_reused),
            // Filled in by `Wal::stats` from the preallocator.
            spares_reused: 0,
            spare_zero_bytes: 0,
            appends_refused: get(&self.appends_refused),
            stages: StageSums {
                queued: get(&self.stage_queued),
                prepare_ns: get(&self.stage_prepare_ns),
                queue_ns: get(&self.stage_queue_ns),
                batched: get(&self.stage_batched),
                copy_ns: get(&self.stage_copy_ns),
                write_ns: get(&self.stage_write_ns),
                writes: get(&self.stage_writes),
            },
            failed: self.failed.load(Ordering::Relaxed),
            direct_io: self.direct_io.load(Ordering::Relaxed),
        }
    }
}
