//! `quire bench wal`: appends through `quire-wal` itself (no network, no node), with N
//! concurrent appenders, and measures what group commit gives against one fdatasync per
//! event.
//!
//! # What runs
//! A fresh WAL in a new temporary directory (inside `--dir`, default the system temp
//! directory), removed at the end, also after an error or Ctrl-C. Before timing, one append
//! creates the first segment (from the spare the WAL's preallocator zero-filled) and the
//! run waits until the next spare is ready too, so the timed part starts in steady state. Then `appenders`
//! async tasks on one thread (a Tokio current-thread runtime) each loop: take the next
//! offset, `Wal::append` one event of `event_size` bytes, await its durability. Taking the
//! offset and queueing the append happen under one mutex, so queue order is log order, as
//! in a node's store actor. The WAL's commit thread batches whatever is queued into one
//! O_DIRECT write and one fdatasync (group commit).
//!
//! With `--retain BYTES`, a thread trims the log every [`TRIM_EVERY`] to keep about that
//! many bytes (whole segments only, as a store's retention does), so that trimmed segments'
//! files come back as spares (docs/format.md, "Reuse"); the report's "device writes" line
//! gives what reached the block layer per payload byte. A fresh spare costs a segment of
//! zeros, a reused one a 4 KiB header: in steady state the figure tends to the batches'
//! own overhead (headers and padding). Use segments small enough for several rolls in the
//! window (`--segment-size`).
//!
//! With a baseline (on by default in text output, `--baseline`/`--no-baseline`), a second
//! fresh WAL then runs **one** appender for `--baseline-duration`: one event per fdatasync,
//! the rate a log without group commit gets. The report gives the ratio.
//!
//! With `--vs-disk`, the run is repeated `--rounds` times, and each WAL run is followed at
//! once by two raw-disk runs (`quire bench disk` with the event size rounded up to the
//! alignment as block size, queue depth 1, an fdatasync behind every write, the same
//! duration, on the same file system), one per file layout (see [`super::disk`]):
//! - **pre-written** (`--layout prewritten`): the writes overwrite written blocks, so each
//!   fdatasync flushes data only: the physical limit for one event per fdatasync;
//! - **fresh** (`--layout fallocated`): a new file, fallocated but never written, as fio
//!   lays out a new file: on ext4 every write converts an unwritten extent and every
//!   fdatasync commits the journal.
//!
//! The WAL sits between the two: it is a growing log, but it zero-fills each segment ahead
//! of need, so its appends overwrite written blocks like the first yardstick while paying
//! for the zero-fill (the second yardstick's cost, moved off the append path). Each round
//! gives the ratio of the WAL's payload MB/s to each disk run's MB/s; the report gives both
//! medians, and its main figures are those of the median round by the pre-written ratio.
//! Alternating short runs keeps all three under the same background load on a shared
//! machine.
//!
//! # What is measured
//! - **Latency** per append, from just before `Wal::append` to the resolution of its
//!   future (durable: covered by a successful fdatasync), microseconds, HDR histogram.
//! - **Throughput** counts events acknowledged between the start and the moment the last
//!   appender finished (appends in flight at the deadline are awaited and counted).
//!   `mb_per_s` is payload in MB = 10^6 bytes; `disk_mb_per_s` is what the WAL wrote
//!   (headers and padding included).
//! - **fdatasyncs** and batches from the WAL's own counters (`Wal::stats`) over the window.
//! - **Stages** (`stages`), means over the window from the WAL's own counters
//!   ([`quire_wal::StageSums`]): `prepare` (the appender's thread until the append is
//!   queued: checksums, validation), `queue` (queued until the commit thread encodes its
//!   batch: the commit thread's wake-up, the batch window), `copy` (encoding a batch),
//!   `write` and `fsync` (each from hand-off to completion). With one appender, each append
//!   is one batch, one write and one fdatasync, so the mean latency minus these stages is
//!   the thread wake-ups no counter sees (`wakeup_us`), mostly the appender's own after its
//!   acknowledgement.
//! - **CPU**: user + system seconds of the whole process over the window (`getrusage`), per
//!   event, and by thread name (`quire-wal-commit`, `quire-wal-prealloc`, the appenders'
//!   thread).
//!
//! # JSON output (`--format json`): one object
//! | field | unit / values |
//! | --- | --- |
//! | `bench` | `"wal"` |
//! | `backend` | `"io_uring"` or `"sync"` |
//! | `direct_io` | whether segments are written with O_DIRECT |
//! | `dir`, `filesystem` | the parent directory used and its file system |
//! | `event_size` | payload bytes per event |
//! | `appenders` | concurrent appenders |
//! | `segment_bytes`, `batch_bytes_max`, `batch_window_us` | WAL settings used |
//! | `warmup_s`, `duration_s` | seconds (warm-up is in no rate) |
//! | `events`, `payload_bytes`, `written_bytes`, `fsyncs`, `batches`, `segments_created` | totals over `duration_s` |
//! | `segments_trimmed`, `spares_reused`, `spare_zero_bytes` | retention (`--retain`) over the window: segments trimmed, spares made from reused files, bytes of zeros written into fresh spares |
//! | `process_write_bytes`, `write_bytes_per_payload_byte` | bytes this process had the block layer write over the window (`write_bytes` of `/proc/self/io`: batches, zeros, headers; not the journal), and that per payload byte; `null` where unreadable |
//! | `mb_per_s`, `mib_per_s` | payload, 10^6 and 2^20 bytes per second |
//! | `disk_mb_per_s` | bytes written by the WAL, 10^6 bytes per second |
//! | `ops_per_s` | events (= appends) acknowledged per second |
//! | `fsyncs_per_s` | fdatasyncs per second |
//! | `events_per_fsync`, `events_per_batch` | group-commit sizes |
//! | `mean_us`, `p50_us`, `p99_us`, `p999_us`, `max_us` | append-to-durable latency, microseconds |
//! | `cpu_user_s`, `cpu_sys_s` | process CPU over the window, seconds |
//! | `cpu_us_per_event` | (user + sys) / events, microseconds |
//! | `cpu_by_thread` | `[{name, threads, user_s, sys_s}]`, busiest first |
//! | `stages` | `{prepare_us, queue_us, copy_us, write_us, fsync_us, wakeup_us}`: mean microseconds per stage (see below) |
//! | `baseline` | the same fields (without `bench`, `dir`, `filesystem`, WAL settings) for the one-appender run, or `null` |
//! | `ratio_vs_baseline` | `ops_per_s / baseline.ops_per_s`, or `null` |
//! | `vs_disk` | with `--vs-disk`: `{block_size, rounds: [{wal_mb_per_s, wal_ops_per_s, wal_cpu_us_per_event, wal_p50_us, disk_mb_per_s, disk_ops_per_s, disk_p50_us, ratio, fresh_disk_mb_per_s, fresh_disk_ops_per_s, fresh_disk_p50_us, fresh_disk_wraps, fresh_ratio}]}`, else `null`; `disk_*` and `ratio` are the pre-written layout's, `fresh_*` the fallocated one's (`fresh_disk_wraps` above 0: that run wrapped, see [`super::disk`]) |
//! | `ratio_vs_disk` | median over the rounds of `ratio` (`wal_mb_per_s / disk_mb_per_s`, pre-written layout), or `null` |
//! | `ratio_vs_fresh_disk` | median over the rounds of `fresh_ratio` (`wal_mb_per_s / fresh_disk_mb_per_s`, fallocated layout), or `null` |

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use hdrhistogram::Histogram;
use quire_proto::{Epoch, Event, EventKind, Offset};
use quire_wal::format::PAYLOAD_BYTES_MAX;
use quire_wal::{IoBackend, Wal, WalConfig, WalError, WalStats};
use serde::Serialize;

use super::cpu::{ProcessCpu, ThreadCpu, ThreadSnapshot};
use super::disk::{BackendChoice, DiskBenchConfig, DiskBenchReport, DiskLayout, FsyncPolicy};
use crate::dio;
use crate::interrupt::{self, Interrupted};
use crate::output::{Report, Table};

/// Default `--event-size`, bytes.
pub const EVENT_BYTES_DEFAULT: u64 = 1024;
/// Default `--appenders`.
pub const APPENDERS_DEFAULT: u32 = 64;
/// Default `--duration`.
pub const DURATION_DEFAULT: Duration = Duration::from_secs(10);
/// Default `--baseline-duration`.
pub const BASELINE_DURATION_DEFAULT: Duration = Duration::from_secs(3);
/// Most `--appenders`.
pub const APPENDERS_MAX: u32 = 4096;
/// Largest `--event-size`, bytes: the WAL's own payload bound.
pub const EVENT_BYTES_MAX: u64 = PAYLOAD_BYTES_MAX as u64;
/// Longest `--duration`.
pub const DURATION_MAX: Duration = Duration::from_secs(24 * 3600);
/// Largest latency the histogram holds, microseconds (one hour); longer ones saturate.
pub const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Most `--rounds` of `--vs-disk`.
pub const ROUNDS_MAX: u32 = 100;
/// Size of the pre-written raw-disk run's bench file with `--vs-disk`, bytes (its writes
/// wrap around); the lower bound of the fallocated run's (which is sized not to wrap).
pub const VS_DISK_FILE_BYTES: u64 = 256 << 20;
/// How often the retention of `--retain` trims the log.
pub const TRIM_EVERY: Duration = Duration::from_millis(20);
/// Longest wait for the WAL's preallocator to prepare the spare segment before timing.
pub const SPARE_WAIT_MAX: Duration = Duration::from_secs(120);

/// The WAL's disk backend (`--io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum WalIo {
    /// io_uring, falling back to `sync` (with a warning) where the kernel refuses it.
    #[default]
    Auto,
    /// io_uring only.
    Uring,
    /// `pwrite` + `fdatasync` on the WAL's commit thread.
    Sync,
}

impl WalIo {
    pub(crate) fn backend(self) -> IoBackend {
        match self {
            WalIo::Auto => IoBackend::Auto,
            WalIo::Uring => IoBackend::Uring,
            WalIo::Sync => IoBackend::Sync,
        }
    }
}

/// How the WAL prepares a fresh spare segment (`--spare-fill`; [`quire_wal::SpareFill`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum WalSpareFill {
    /// `fallocate`, then zeros over the whole file (quire-node's default, `[wal] spare_fill`).
    #[default]
    Zeros,
    /// `fallocate` only: appends write into unwritten extents.
    Allocate,
}

/// What to run. Built from the command line, or directly by tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalBenchConfig {
    /// Where to create the temporary WAL directory; `None`: the system temp directory.
    pub dir: Option<PathBuf>,
    /// Payload bytes per event, 1..=[`EVENT_BYTES_MAX`].
    pub event_size: u64,
    /// Concurrent appenders, 1..=[`APPENDERS_MAX`].
    pub appenders: u32,
    /// How long to append.
    pub duration: Duration,
    /// The WAL's disk backend.
    pub io: WalIo,
    /// Run the one-appender baseline for this long afterwards.
    pub baseline: Option<Duration>,
    /// The WAL's `segment_bytes_max`, bytes.
    pub segment_bytes: u64,
    /// The WAL's `batch_bytes_max`, bytes.
    pub batch_bytes_max: u64,
    /// The WAL's `batch_window_us`, microseconds.
    pub batch_window_us: u64,
    /// `Some(rounds)`: alternate `rounds` WAL runs with raw-disk runs and report the ratio
    /// (see the module docs); 1..=[`ROUNDS_MAX`].
    pub vs_disk: Option<u32>,
    /// Retention: keep about this many bytes of log, trimming below it every
    /// [`TRIM_EVERY`] (see the module docs); `None`: the log only grows.
    pub retain_bytes: Option<u64>,
    /// How fresh spare segments are prepared.
    pub spare_fill: WalSpareFill,
}

impl Default for WalBenchConfig {
    fn default() -> Self {
        let wal = WalConfig::default();
        WalBenchConfig {
            dir: None,
            event_size: EVENT_BYTES_DEFAULT,
            appenders: APPENDERS_DEFAULT,
            duration: DURATION_DEFAULT,
            io: WalIo::Auto,
            baseline: None,
            segment_bytes: wal.segment_bytes_max,
            batch_bytes_max: wal.batch_bytes_max,
            batch_window_us: wal.batch_window_us,
            vs_disk: None,
            retain_bytes: None,
            spare_fill: WalSpareFill::Zeros,
        }
    }
}

/// One measured run; see the module docs for units.
#[derive(Debug, Clone, Serialize)]
pub struct WalRun {
    /// `"io_uring"` or `"sync"`.
    pub backend: &'static str,
    /// Segments written with O_DIRECT.
    pub direct_io: bool,
    /// Payload bytes per event.
    pub event_size: u64,
    /// Concurrent appenders.
    pub appenders: u32,
    /// Open + first append + spare ready, seconds.
    pub warmup_s: f64,
    /// Measured wall time, seconds.
    pub duration_s: f64,
    /// Events acknowledged durable.
    pub events: u64,
    /// Their payload bytes.
    pub payload_bytes: u64,
    /// Bytes the WAL wrote (records, padding).
    pub written_bytes: u64,
    /// fdatasyncs completed.
    pub fsyncs: u64,
    /// Batches (writes).
    pub batches: u64,
    /// Segments started.
    pub segments_created: u64,
    /// Segments trimmed by `--retain` over the window.
    pub segments_trimmed: u64,
    /// Spare segments made from reused (trimmed) files over the window.
    pub spares_reused: u64,
    /// Zeros written into fresh spare segments over the window, bytes.
    pub spare_zero_bytes: u64,
    /// Bytes this process had the block layer write over the window (`write_bytes` of
    /// `/proc/self/io`: batches, spares' zeros and headers; not the file system's journal),
    /// or `null` where the kernel does not say.
    pub process_write_bytes: Option<u64>,
    /// `process_write_bytes / payload_bytes`: device bytes per payload byte (`null` as
    /// above).
    pub write_bytes_per_payload_byte: Option<f64>,
    /// Payload MB/s (10^6).
    pub mb_per_s: f64,
    /// Payload MiB/s (2^20).
    pub mib_per_s: f64,
    /// Written MB/s (10^6).
    pub disk_mb_per_s: f64,
    /// Events per second.
    pub ops_per_s: f64,
    /// fdatasyncs per second.
    pub fsyncs_per_s: f64,
    /// Events per fdatasync.
    pub events_per_fsync: f64,
    /// Events per batch.
    pub events_per_batch: f64,
    /// Mean latency, microseconds.
    pub mean_us: f64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile, microseconds.
    pub p99_us: u64,
    /// 99.9th percentile, microseconds.
    pub p999_us: u64,
    /// Largest, microseconds.
    pub max_us: u64,
    /// Process user CPU over the window, seconds.
    pub cpu_user_s: f64,
    /// Process system CPU over the window, seconds.
    pub cpu_sys_s: f64,
    /// (user + sys) per event, microseconds.
    pub cpu_us_per_event: f64,
    /// CPU by thread name.
    pub cpu_by_thread: Vec<ThreadCpu>,
    /// Where the append latency went (the WAL's stage counters over the window).
    pub stages: StageMeans,
}

/// Mean time per stage of an append over the window, microseconds, from the WAL's
/// [`quire_wal::StageSums`] and fdatasync counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StageMeans {
    /// On the appender's thread until queued (checksums, validation), per append.
    pub prepare_us: f64,
    /// Queued until its batch is encoded (commit thread wake-up, batch window), per append.
    pub queue_us: f64,
    /// Encoding (copying) a batch, per batch.
    pub copy_us: f64,
    /// A batch's write, handed to the disk until complete, per write.
    pub write_us: f64,
    /// One fdatasync, submission to completion.
    pub fsync_us: f64,
    /// With one appender (one event per write and fdatasync): the mean latency minus the
    /// stages above, i.e. the thread wake-ups no counter sees (mostly the appender's own,
    /// after its acknowledgement). `null` with several appenders, whose stages overlap.
    pub wakeup_us: Option<f64>,
}

impl StageMeans {
    fn between(before: &WalStats, after: &WalStats, appenders: u32, mean_us: f64) -> StageMeans {
        let (b, a) = (&before.stages, &after.stages);
        let per = |ns: u64, n: u64| {
            if n > 0 {
                ns as f64 / n as f64 / 1e3
            } else {
                0.0
            }
        };
        let fsyncs = after.fsyncs - before.fsyncs;
        let mut m = StageMeans {
            prepare_us: per(a.prepare_ns - b.prepare_ns, a.queued - b.queued),
            queue_us: per(a.queue_ns - b.queue_ns, a.batched - b.batched),
            copy_us: per(a.copy_ns - b.copy_ns, after.batches - before.batches),
            write_us: per(a.write_ns - b.write_ns, a.writes - b.writes),
            fsync_us: per((after.fsync_us_sum - before.fsync_us_sum) * 1000, fsyncs),
            wakeup_us: None,
        };
        if appenders == 1 && fsyncs > 0 {
            let seen = m.prepare_us + m.queue_us + m.copy_us + m.write_us + m.fsync_us;
            m.wakeup_us = Some((mean_us - seen).max(0.0));
        }
        m
    }
}

/// The result of `quire bench wal`.
#[derive(Debug, Clone, Serialize)]
pub struct WalBenchReport {
    /// Always `"wal"`.
    pub bench: &'static str,
    /// The parent directory of the temporary WAL.
    pub dir: String,
    /// Its file system.
    pub filesystem: String,
    /// `segment_bytes_max` used, bytes.
    pub segment_bytes: u64,
    /// `batch_bytes_max` used, bytes.
    pub batch_bytes_max: u64,
    /// `batch_window_us` used.
    pub batch_window_us: u64,
    /// The main run.
    #[serde(flatten)]
    pub run: WalRun,
    /// The one-appender run.
    pub baseline: Option<WalRun>,
    /// `run.ops_per_s / baseline.ops_per_s`.
    pub ratio_vs_baseline: Option<f64>,
    /// The rounds against the raw disk (`--vs-disk`).
    pub vs_disk: Option<VsDisk>,
    /// Median of the rounds' `ratio` (pre-written layout).
    pub ratio_vs_disk: Option<f64>,
    /// Median of the rounds' `fresh_ratio` (fallocated layout).
    pub ratio_vs_fresh_disk: Option<f64>,
}

/// The WAL against the raw disk, round by round (`--vs-disk`).
#[derive(Debug, Clone, Serialize)]
pub struct VsDisk {
    /// The disk run's bytes per write: the event size rounded up to the alignment.
    pub block_size: u64,
    /// Each round: a WAL run, then a disk run per layout.
    pub rounds: Vec<VsDiskRound>,
}

/// One WAL run and the two raw-disk runs right after it: pre-written (`disk_*`, `ratio`),
/// then fallocated (`fresh_*`).
#[derive(Debug, Clone, Serialize)]
pub struct VsDiskRound {
    /// WAL payload MB/s (10^6).
    pub wal_mb_per_s: f64,
    /// WAL events per second.
    pub wal_ops_per_s: f64,
    /// WAL process CPU per event, microseconds.
    pub wal_cpu_us_per_event: f64,
    /// WAL median append latency, microseconds.
    pub wal_p50_us: u64,
    /// Disk MB/s (10^6).
    pub disk_mb_per_s: f64,
    /// Disk writes (each with its fdatasync) per second.
    pub disk_ops_per_s: f64,
    /// Disk median op latency, microseconds.
    pub disk_p50_us: u64,
    /// `wal_mb_per_s / disk_mb_per_s`.
    pub ratio: f64,
    /// Disk MB/s (10^6) on a new fallocated file.
    pub fresh_disk_mb_per_s: f64,
    /// Disk writes per second on a new fallocated file.
    pub fresh_disk_ops_per_s: f64,
    /// Disk median op latency on a new fallocated file, microseconds.
    pub fresh_disk_p50_us: u64,
    /// Times that run's writes wrapped into blocks it had written (0 expected).
    pub fresh_disk_wraps: u64,
    /// `wal_mb_per_s / fresh_disk_mb_per_s`.
    pub fresh_ratio: f64,
}

impl Report for WalBenchReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let r = &self.run;
        writeln!(
            out,
            "quire bench wal: {} appender(s) of {} events through quire-wal ({}{}), group commit",
            r.appenders,
            crate::output::human_bytes(r.event_size),
            r.backend,
            if r.direct_io {
                ", O_DIRECT"
            } else {
                ", buffered"
            }
        )?;
        let mut table = Table::new();
        table
            .row("dir", format!("{} ({})", self.dir, self.filesystem))
            .row(
                "duration",
                format!("{:.2} s (warm-up {:.2} s)", r.duration_s, r.warmup_s),
            );
        run_rows(&mut table, r);
        if let (Some(b), Some(ratio)) = (&self.baseline, self.ratio_vs_baseline) {
            table
                .row(
                    "baseline",
                    format!(
                        "1 appender (one fdatasync per event), {:.2} s: {:.0} events/s, {:.0} \
                         fsyncs/s, {:.1} MB/s, p50 {} us, p99 {} us",
                        b.duration_s, b.ops_per_s, b.fsyncs_per_s, b.mb_per_s, b.p50_us, b.p99_us
                    ),
                )
                .row(
                    "ratio",
                    format!(
                        "{ratio:.1}x the events/s of one fdatasync per event ({} appenders vs 1, \
                         same event size, same run)",
                        r.appenders
                    ),
                );
        }
        if let (Some(v), Some(ratio), Some(fresh)) =
            (&self.vs_disk, self.ratio_vs_disk, self.ratio_vs_fresh_disk)
        {
            let rounds: Vec<String> = v
                .rounds
                .iter()
                .map(|x| {
                    format!(
                        "{:.1}/{:.1}/{:.1} MB/s = {:.2}, {:.2} (p50 {}/{}/{} us)",
                        x.wal_mb_per_s,
                        x.disk_mb_per_s,
                        x.fresh_disk_mb_per_s,
                        x.ratio,
                        x.fresh_ratio,
                        x.wal_p50_us,
                        x.disk_p50_us,
                        x.fresh_disk_p50_us
                    )
                })
                .collect();
            let mut ratio_row = format!(
                "{ratio:.2} of the pre-written disk's MB/s, {fresh:.2} of a new fallocated \
                 file's (medians of {} rounds)",
                v.rounds.len()
            );
            let wrapped = v.rounds.iter().filter(|x| x.fresh_disk_wraps > 0).count();
            if wrapped > 0 {
                ratio_row.push_str(&format!(
                    "; the fallocated file WRAPPED in {wrapped} round(s), its figure is too high"
                ));
            }
            table
                .row(
                    "vs disk",
                    format!(
                        "{} rounds of wal, then `bench disk --block-size {} --qd 1 --fsync \
                         every` with --layout prewritten, then fallocated; wal/pre-written/\
                         fallocated: {}",
                        v.rounds.len(),
                        v.block_size,
                        rounds.join("; ")
                    ),
                )
                .row("ratio", ratio_row);
        }
        table.write(out)
    }
}

fn run_rows(table: &mut Table, r: &WalRun) {
    table
        .row(
            "throughput",
            format!(
                "{:.1} MB/s payload ({:.1} MiB/s); {:.1} MB/s written",
                r.mb_per_s, r.mib_per_s, r.disk_mb_per_s
            ),
        )
        .row(
            "events",
            format!("{:.0} /s ({} total)", r.ops_per_s, r.events),
        )
        .row(
            "fdatasyncs",
            format!(
                "{:.0} /s ({} total), {:.1} events per fsync, {:.1} per write",
                r.fsyncs_per_s, r.fsyncs, r.events_per_fsync, r.events_per_batch
            ),
        )
        .row(
            "latency",
            format!(
                "append to durable: mean {:.0} us, p50 {} us, p99 {} us, p99.9 {} us, max {} us",
                r.mean_us, r.p50_us, r.p99_us, r.p999_us, r.max_us
            ),
        );
    let s = &r.stages;
    let mut stages = format!(
        "mean prepare {:.1} us, queue {:.1} us, copy {:.1} us, write {:.1} us, fdatasync {:.1} us",
        s.prepare_us, s.queue_us, s.copy_us, s.write_us, s.fsync_us
    );
    if let Some(w) = s.wakeup_us {
        stages.push_str(&format!(
            "; the other {w:.1} us of the mean latency: thread wake-ups"
        ));
    }
    table.row("stages", stages);
    table.row(
        "device writes",
        format!(
            "{} per payload byte ({}); spares: {} reused, {} fresh ({:.1} MB of zeros written into them); \
             {} segments trimmed",
            r.write_bytes_per_payload_byte
                .map_or_else(|| "unknown".to_owned(), |x| format!("{x:.3} B")),
            r.process_write_bytes.map_or_else(
                || "/proc/self/io unreadable".to_owned(),
                |b| { format!("{:.1} MB by this process", b as f64 / 1e6) }
            ),
            r.spares_reused,
            r.segments_created.saturating_sub(r.spares_reused),
            r.spare_zero_bytes as f64 / 1e6,
            r.segments_trimmed
        ),
    );
    let threads: Vec<String> = r
        .cpu_by_thread
        .iter()
        .take(4)
        .map(|t| format!("{} {:.2} s", t.name, t.user_s + t.sys_s))
        .collect();
    table.row(
        "cpu",
        format!(
            "user {:.2} s + sys {:.2} s = {:.2} us per event ({})",
            r.cpu_user_s,
            r.cpu_sys_s,
            r.cpu_us_per_event,
            threads.join(", ")
        ),
    );
}

fn validate(config: &WalBenchConfig) -> anyhow::Result<()> {
    if config.event_size == 0 || config.event_size > EVENT_BYTES_MAX {
        bail!(
            "--event-size {} is out of range: 1 to {EVENT_BYTES_MAX} bytes",
            config.event_size
        );
    }
    if config.appenders == 0 || config.appenders > APPENDERS_MAX {
        bail!(
            "--appenders {} is out of range: 1 to {APPENDERS_MAX}",
            config.appenders
        );
    }
    for (name, d) in [
        ("--duration", Some(config.duration)),
        ("--baseline-duration", config.baseline),
    ] {
        if let Some(d) = d {
            if d.is_zero() || d > DURATION_MAX {
                bail!("{name} {d:?} is out of range: above 0, at most {DURATION_MAX:?}");
            }
        }
    }
    if let Some(rounds) = config.vs_disk {
        if rounds == 0 || rounds > ROUNDS_MAX {
            bail!("--rounds {rounds} is out of range: 1 to {ROUNDS_MAX}");
        }
    }
    if config.segment_bytes < 4 * (config.event_size + 4096) {
        bail!(
            "--segment-size {} is too small for events of {} bytes (at least four per segment)",
            config.segment_bytes,
            config.event_size
        );
    }
    Ok(())
}

/// Runs the benchmark: the main run, then the baseline if configured; removes the
/// temporary directory. Installs a SIGINT/SIGTERM handler so Ctrl-C stops it cleanly.
///
/// # Errors
/// Invalid configuration; the directory not creatable or too full; the WAL failing to open
/// (e.g. `--io uring` without io_uring) or failing during the run (fail-stop: the first
/// error); [`Interrupted`] after Ctrl-C (the directory is still removed).
pub fn run(config: &WalBenchConfig) -> anyhow::Result<WalBenchReport> {
    validate(config)?;
    let parent = config.dir.clone().unwrap_or_else(std::env::temp_dir);
    // A --dir that does not exist yet is created (the run's files go in a temporary
    // directory inside it, removed at the end).
    std::fs::create_dir_all(&parent)
        .with_context(|| format!("cannot create --dir {}", parent.display()))?;
    let meta = std::fs::metadata(&parent)
        .with_context(|| format!("cannot use --dir {}", parent.display()))?;
    if !meta.is_dir() {
        bail!("--dir {} is not a directory", parent.display());
    }
    let filesystem = dio::filesystem_name(&parent)
        .with_context(|| format!("cannot statfs {}", parent.display()))?;
    if matches!(filesystem.as_str(), "tmpfs" | "ramfs") {
        tracing::warn!(
            "{} is on {filesystem}: this measures memory, not a disk (pass --dir on a disk)",
            parent.display()
        );
    }
    let needed = 3 * config.segment_bytes;
    let available = dio::available_bytes(&parent).unwrap_or(u64::MAX);
    if available < needed {
        bail!(
            "not enough free space in {}: the WAL needs at least {needed} bytes (three \
             segments), {available} are available; pass --dir elsewhere or a smaller \
             --segment-size",
            parent.display()
        );
    }
    interrupt::install().context("cannot install the Ctrl-C handler")?;
    let root = tempfile::Builder::new()
        .prefix(".quire-bench-wal-")
        .tempdir_in(&parent)
        .with_context(|| format!("cannot create a directory in {}", parent.display()))?;

    let (run, vs_disk) = match config.vs_disk {
        None => (
            measure(
                &root.path().join("main"),
                config,
                config.appenders,
                config.duration,
            )?,
            None,
        ),
        Some(rounds) => {
            let (run, v) = against_disk(root.path(), config, rounds)?;
            (run, Some(v))
        }
    };
    let baseline = match config.baseline {
        Some(d) => {
            tracing::info!("baseline: 1 appender for {d:?}");
            Some(measure(&root.path().join("baseline"), config, 1, d)?)
        }
        None => None,
    };
    root.close()
        .with_context(|| format!("cannot remove the bench directory in {}", parent.display()))?;
    let ratio_vs_baseline = baseline
        .as_ref()
        .filter(|b| b.ops_per_s > 0.0)
        .map(|b| run.ops_per_s / b.ops_per_s);
    let ratio_vs_disk = vs_disk.as_ref().map(|v| median_round(&v.rounds).ratio);
    let ratio_vs_fresh_disk = vs_disk
        .as_ref()
        .map(|v| median(v.rounds.iter().map(|r| r.fresh_ratio).collect()));
    Ok(WalBenchReport {
        bench: "wal",
        dir: parent.display().to_string(),
        filesystem,
        segment_bytes: config.segment_bytes,
        batch_bytes_max: config.batch_bytes_max,
        batch_window_us: config.batch_window_us,
        run,
        baseline,
        ratio_vs_baseline,
        vs_disk,
        ratio_vs_disk,
        ratio_vs_fresh_disk,
    })
}

/// `--vs-disk`: `rounds` times a WAL run, then a raw-disk run on a pre-written file, then one
/// on a new fallocated file. Returns the WAL run of the median round (by the pre-written
/// ratio) and every round.
fn against_disk(
    root: &Path,
    config: &WalBenchConfig,
    rounds: u32,
) -> anyhow::Result<(WalRun, VsDisk)> {
    let block_size = config.event_size.div_ceil(4096) * 4096;
    let mut runs = Vec::new();
    let mut out = Vec::new();
    for i in 0..rounds {
        tracing::info!("round {} of {rounds}: wal", i + 1);
        let run = measure(
            &root.join(format!("round-{i}")),
            config,
            config.appenders,
            config.duration,
        )?;
        let disk_run = |layout: DiskLayout| -> anyhow::Result<DiskBenchReport> {
            tracing::info!(
                "round {} of {rounds}: disk, {block_size}-byte writes, {} file",
                i + 1,
                layout.name()
            );
            super::disk::run(&DiskBenchConfig {
                dir: root.to_path_buf(),
                block_size,
                qd: 1,
                fsync: FsyncPolicy::Every,
                duration: config.duration,
                file_size: VS_DISK_FILE_BYTES.max(4 * block_size),
                backend: BackendChoice::Auto,
                layout,
            })
            .with_context(|| format!("bench disk --layout {} (--vs-disk)", layout.name()))
        };
        let disk = disk_run(DiskLayout::Prewritten)?;
        let fresh = disk_run(DiskLayout::Fallocated)?;
        let ratio = |disk_mb_per_s: f64| {
            if disk_mb_per_s > 0.0 {
                run.mb_per_s / disk_mb_per_s
            } else {
                0.0
            }
        };
        out.push(VsDiskRound {
            wal_mb_per_s: run.mb_per_s,
            wal_ops_per_s: run.ops_per_s,
            wal_cpu_us_per_event: run.cpu_us_per_event,
            wal_p50_us: run.p50_us,
            disk_mb_per_s: disk.mb_per_s,
            disk_ops_per_s: disk.ops_per_s,
            disk_p50_us: disk.p50_us,
            ratio: ratio(disk.mb_per_s),
            fresh_disk_mb_per_s: fresh.mb_per_s,
            fresh_disk_ops_per_s: fresh.ops_per_s,
            fresh_disk_p50_us: fresh.p50_us,
            fresh_disk_wraps: fresh.wraps,
            fresh_ratio: ratio(fresh.mb_per_s),
        });
        runs.push(run);
    }
    let median = median_round(&out);
    let at = out
        .iter()
        .position(|r| std::ptr::eq(r, median))
        .expect("invariant: the median is one of the rounds");
    let run = runs.swap_remove(at);
    Ok((
        run,
        VsDisk {
            block_size,
            rounds: out,
        },
    ))
}

/// The round with the median ratio (the lower middle one for an even count).
///
/// # Panics
/// If `rounds` is empty.
fn median_round(rounds: &[VsDiskRound]) -> &VsDiskRound {
    let mut sorted: Vec<&VsDiskRound> = rounds.iter().collect();
    sorted.sort_by(|a, b| a.ratio.total_cmp(&b.ratio));
    sorted[(sorted.len() - 1) / 2]
}

/// The median of `values` (the lower middle one for an even count).
///
/// # Panics
/// If `values` is empty.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[(values.len() - 1) / 2]
}

/// A payload of `len` bytes that does not compress (an xorshift stream).
pub(crate) fn payload_bytes(len: usize) -> Bytes {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut bytes = Vec::with_capacity(len);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let take = (len - bytes.len()).min(8);
        bytes.extend_from_slice(&state.to_le_bytes()[..take]);
    }
    Bytes::from(bytes)
}

/// How long to wait after the spare segment's file appears: the preallocator renames it
/// into place, then fsyncs the directory, and only then marks it ready (a roll before that
/// waits, and logs a warning).
pub const SPARE_SETTLE: Duration = Duration::from_millis(200);

/// Waits (bounded) until the WAL in `dir` has its spare segment ready.
fn wait_for_spare(dir: &Path) {
    let spare = dir.join(quire_wal::segment::SPARE_NAME);
    let started = Instant::now();
    while !spare.exists() {
        if started.elapsed() > SPARE_WAIT_MAX || interrupt::is_interrupted() {
            tracing::warn!(
                "the WAL's spare segment is not ready after {:?}; measuring anyway",
                started.elapsed()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(SPARE_SETTLE);
}

/// One run on a fresh WAL in `dir` (created, then removed).
fn measure(
    dir: &Path,
    config: &WalBenchConfig,
    appenders: u32,
    duration: Duration,
) -> anyhow::Result<WalRun> {
    let opened = Instant::now();
    let wal_config = WalConfig {
        dir: dir.to_path_buf(),
        segment_bytes_max: config.segment_bytes,
        batch_bytes_max: config.batch_bytes_max,
        batch_window_us: config.batch_window_us,
        io: config.io.backend(),
        spare_fill: match config.spare_fill {
            WalSpareFill::Zeros => quire_wal::SpareFill::Zeros,
            WalSpareFill::Allocate => quire_wal::SpareFill::Allocate,
        },
        ..WalConfig::default()
    };
    let (wal, _) = Wal::open(wal_config).map_err(|e| match e {
        WalError::UringUnavailable(why) => {
            anyhow!("io_uring is unavailable: {why}; run with --io sync (or auto)")
        }
        other => {
            anyhow::Error::new(other).context(format!("cannot open a WAL in {}", dir.display()))
        }
    })?;
    let epoch = Epoch(1);
    let event_len = usize::try_from(config.event_size).context("event size")?;
    let payload = payload_bytes(event_len);
    let record = |offset: u64| Event {
        epoch,
        offset: Offset(offset),
        kind: EventKind::Message,
        payload: payload.clone().into(),
    };
    // The first append takes the spare segment: let it be ready first, then the next one.
    wait_for_spare(dir);
    wal.append(epoch, vec![record(wal.next_offset().0)])
        .wait()
        .context("the warm-up append failed")?;
    wait_for_spare(dir);
    let warmup = opened.elapsed();
    tracing::info!(
        "measuring {appenders} appender(s) of {} bytes for {duration:?} ({})",
        config.event_size,
        wal.backend()
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .context("cannot start the appenders' runtime")?;
    let next = Arc::new(Mutex::new(wal.next_offset().0));
    let stats_before = wal.stats();
    let io_before = process_write_bytes();
    let cpu_before = ProcessCpu::now();
    let threads_before = ThreadSnapshot::now();
    let started = Instant::now();
    let deadline = started + duration;
    let retention = config.retain_bytes.map(|retain| {
        let (wal, next) = (wal.clone(), next.clone());
        let keep = (retain / config.event_size.max(1)).max(1);
        std::thread::spawn(move || retain_until(&wal, &next, keep, deadline))
    });
    let results = runtime.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..appenders {
            set.spawn(appender(
                wal.clone(),
                next.clone(),
                epoch,
                payload.clone(),
                deadline,
            ));
        }
        let mut results = Vec::with_capacity(set.len());
        while let Some(joined) = set.join_next().await {
            results.push(joined);
        }
        results
    });
    if let Some(t) = retention {
        t.join()
            .map_err(|_| anyhow!("the retention thread panicked"))?
            .context("a retention trim failed")?;
    }
    let elapsed = started.elapsed();
    let cpu = ProcessCpu::now().since(cpu_before);
    let cpu_by_thread = ThreadSnapshot::now().since(&threads_before);
    let stats = wal.stats();
    let process_written = io_before
        .zip(process_write_bytes())
        .map(|(a, b)| b.saturating_sub(a));
    let backend = wal.backend();
    drop(runtime);

    let mut hist = latency_histogram();
    let mut events = 0u64;
    for joined in results {
        let (h, n) = joined
            .map_err(|e| anyhow!("an appender task failed: {e}"))?
            .context("an append failed")?;
        hist.add(h)
            .map_err(|e| anyhow!("merging latency histograms: {e}"))?;
        events += n;
    }
    wal.close().context("the WAL failed")?;
    drop(wal);
    std::fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    if interrupt::is_interrupted() {
        return Err(Interrupted.into());
    }

    let secs = elapsed.as_secs_f64();
    let fsyncs = stats.fsyncs - stats_before.fsyncs;
    let batches = stats.batches - stats_before.batches;
    let written_bytes = stats.batch_bytes - stats_before.batch_bytes;
    let payload_bytes = events * config.event_size;
    let per_sec = |v: f64| if secs > 0.0 { v / secs } else { 0.0 };
    let per = |a: u64, b: u64| if b > 0 { a as f64 / b as f64 } else { 0.0 };
    let cpu_s = (cpu.user + cpu.sys).as_secs_f64();
    Ok(WalRun {
        backend,
        direct_io: stats.direct_io,
        event_size: config.event_size,
        appenders,
        warmup_s: warmup.as_secs_f64(),
        duration_s: secs,
        events,
        payload_bytes,
        written_bytes,
        fsyncs,
        batches,
        segments_created: stats.segments_created - stats_before.segments_created,
        segments_trimmed: stats.segments_trimmed - stats_before.segments_trimmed,
        spares_reused: stats.spares_reused - stats_before.spares_reused,
        spare_zero_bytes: stats.spare_zero_bytes - stats_before.spare_zero_bytes,
        process_write_bytes: process_written,
        write_bytes_per_payload_byte: process_written
            .filter(|_| payload_bytes > 0)
            .map(|w| w as f64 / payload_bytes as f64),
        mb_per_s: per_sec(payload_bytes as f64) / 1e6,
        mib_per_s: per_sec(payload_bytes as f64) / f64::from(1u32 << 20),
        disk_mb_per_s: per_sec(written_bytes as f64) / 1e6,
        ops_per_s: per_sec(events as f64),
        fsyncs_per_s: per_sec(fsyncs as f64),
        events_per_fsync: per(events, fsyncs),
        events_per_batch: per(events, batches),
        mean_us: hist.mean(),
        p50_us: hist.value_at_quantile(0.50),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        max_us: hist.max(),
        cpu_user_s: cpu.user.as_secs_f64(),
        cpu_sys_s: cpu.sys.as_secs_f64(),
        cpu_us_per_event: if events > 0 {
            cpu_s * 1e6 / events as f64
        } else {
            0.0
        },
        cpu_by_thread,
        stages: StageMeans::between(&stats_before, &stats, appenders, hist.mean()),
    })
}

/// `--retain`: until `deadline`, every [`TRIM_EVERY`], trims the log below its last `keep`
/// offsets (whole segments only, as a store's retention does).
fn retain_until(
    wal: &Wal,
    next: &Mutex<u64>,
    keep: u64,
    deadline: Instant,
) -> Result<(), WalError> {
    while Instant::now() < deadline && !interrupt::is_interrupted() {
        std::thread::sleep(TRIM_EVERY);
        let before = next
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .saturating_sub(keep);
        wal.trim_before(Offset(before))?;
    }
    Ok(())
}

/// `write_bytes` of `/proc/self/io`: bytes this process caused to be written to the block
/// layer, or `None` where the kernel does not say.
fn process_write_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// An HDR histogram of microseconds, 3 significant digits, up to [`LATENCY_US_MAX`].
pub(crate) fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
        .expect("invariant: constant bounds are valid (1 <= low, high >= 2 * low, sigfig 3)")
}

/// One appender: appends single events until `deadline` (or Ctrl-C), each awaited before
/// the next. Returns its latency histogram and the events it got acknowledged.
pub(crate) async fn appender(
    wal: Wal,
    next: Arc<Mutex<u64>>,
    epoch: Epoch,
    payload: Bytes,
    deadline: Instant,
) -> Result<(Histogram<u64>, u64), WalError> {
    let mut hist = latency_histogram();
    let mut events = 0u64;
    while Instant::now() < deadline && !interrupt::is_interrupted() {
        let sent = Instant::now();
        let append = {
            // Offset order is queue order: take the offset and queue under one lock.
            let mut next = next.lock().unwrap_or_else(PoisonError::into_inner);
            let offset = *next;
            *next += 1;
            wal.append(
                epoch,
                vec![Event {
                    epoch,
                    offset: Offset(offset),
                    kind: EventKind::Message,
                    payload: payload.clone().into(),
                }],
            )
        };
        append.await?;
        let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        hist.saturating_record(us.max(1));
        events += 1;
    }
    Ok((hist, events))
}
