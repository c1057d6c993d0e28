//! `quire bench logs`: the disk layouts a store could give many logs (issue 13, partitions),
//! measured on one machine at a given number of busy logs.
//!
//! # What runs
//! For each number of logs N (`--logs 1,8,64`), `--appenders` closed-loop appenders per log
//! (each appends one event and awaits its durability before the next), in each layout:
//!
//! | layout | what it is | what runs |
//! | --- | --- | --- |
//! | `shared-wal` | one WAL for every log, a per-log index in memory | one quire-wal, N × A appenders (the index is not built: it costs memory, not disk time) |
//! | `wal-per-log` | one WAL per log | N quire-wals in N directories, each with its commit and ring threads, A appenders each |
//! | `files-one-sync` | per-log segment files, one commit thread that writes each log's batch to its file and then fdatasyncs every file it wrote | a round loop: each of N threads writes its log's events (A × event size, rounded up to 4 KiB) to its own O_DIRECT file and fdatasyncs it; the round ends when all have (as an io_uring worker pool would run N linked write + fsync pairs) |
//! | `file-shared` | the yardstick for the line above: the same rounds into one file | one thread writes all N × A events per round to one O_DIRECT file and fdatasyncs it |
//!
//! The last two are raw-disk loops, not a WAL: they show what N fdatasyncs per group commit
//! cost against one on this file system, which is the question that decides between a
//! shared journal (BookKeeper's) and per-log files. Rounds of one layout run back to back;
//! the layouts alternate, so drift in the machine hits each alike.
//!
//! # Output
//! One row per (N, layout): events/s, MB/s of payload, fdatasyncs/s, events per
//! fdatasync, p50/p99 append latency (µs, from the append to its durability; a raw
//! round's events all take the round's time), CPU µs per event (the whole process: user +
//! system), and the threads the layout runs.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use quire_proto::{Epoch, Event, EventKind, Offset};
use quire_wal::{Wal, WalConfig};
use serde::Serialize;

use super::cpu::ProcessCpu;
use super::wal::{latency_histogram, payload_bytes, WalIo};
use crate::dio::AlignedBuf;
use crate::interrupt::{self, Interrupted};
use crate::output::{Report, Table};

/// The most logs one row may run (a WAL per log runs three threads each).
pub const LOGS_MAX: u32 = 256;

/// Alignment of the raw loops' O_DIRECT writes, bytes (a multiple of every logical block
/// size Linux file systems use).
const RAW_ALIGN: usize = 4096;

/// A layout (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LogsLayout {
    /// One WAL for every log.
    SharedWal,
    /// One WAL per log.
    WalPerLog,
    /// Per-log files, every file written and fdatasynced per round (raw loop).
    FilesOneSync,
    /// One file, one fdatasync per round (raw loop; the yardstick of `files-one-sync`).
    FileShared,
}

impl LogsLayout {
    /// Every layout, in the order rows print.
    pub const ALL: [LogsLayout; 4] = [
        LogsLayout::SharedWal,
        LogsLayout::WalPerLog,
        LogsLayout::FilesOneSync,
        LogsLayout::FileShared,
    ];

    fn name(self) -> &'static str {
        match self {
            LogsLayout::SharedWal => "shared-wal",
            LogsLayout::WalPerLog => "wal-per-log",
            LogsLayout::FilesOneSync => "files-one-sync",
            LogsLayout::FileShared => "file-shared",
        }
    }
}

/// What `quire bench logs` runs.
#[derive(Debug, Clone)]
pub struct LogsBenchConfig {
    /// Directory on the file system to measure (a temporary directory is made in it).
    pub dir: PathBuf,
    /// Numbers of busy logs, one set of rows each; each 1..=[`LOGS_MAX`].
    pub logs: Vec<u32>,
    /// Closed-loop appenders per log.
    pub appenders_per_log: u32,
    /// Payload bytes per event.
    pub event_size: u64,
    /// How long each row runs.
    pub duration: Duration,
    /// Layouts to run.
    pub layouts: Vec<LogsLayout>,
    /// Segment (and raw file) size per log, bytes.
    pub segment_size: u64,
    /// The WALs' disk backend.
    pub io: WalIo,
}

/// One row: one layout at one number of logs.
#[derive(Debug, Clone, Serialize)]
pub struct LogsRow {
    /// The layout.
    pub layout: LogsLayout,
    /// Busy logs.
    pub logs: u32,
    /// Appenders in all.
    pub appenders: u32,
    /// Measured wall time, seconds.
    pub duration_s: f64,
    /// Events made durable.
    pub events: u64,
    /// Events per second.
    pub events_per_s: f64,
    /// Payload MB (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// fdatasyncs per second.
    pub fsyncs_per_s: f64,
    /// Events per fdatasync.
    pub events_per_fsync: f64,
    /// Append latency percentiles, microseconds.
    pub p50_us: u64,
    /// As `p50_us`.
    pub p99_us: u64,
    /// CPU (user + system, whole process) per event, microseconds.
    pub cpu_us_per_event: f64,
    /// Threads the layout ran (WAL threads or raw writers, not counting this one).
    pub threads: u32,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct LogsBenchReport {
    /// The directory measured.
    pub dir: String,
    /// Payload bytes per event.
    pub event_size: u64,
    /// Appenders per log.
    pub appenders_per_log: u32,
    /// Every row.
    pub rows: Vec<LogsRow>,
}

impl Report for LogsBenchReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "quire bench logs: {} appender(s) per log, {}-byte events, in {}",
            self.appenders_per_log, self.event_size, self.dir
        )?;
        writeln!(
            out,
            "{:>5} {:<15} {:>10} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7}",
            "logs",
            "layout",
            "events/s",
            "MB/s",
            "fsyncs/s",
            "ev/fsync",
            "p50 us",
            "p99 us",
            "CPU us/ev",
            "threads"
        )?;
        for r in &self.rows {
            writeln!(
                out,
                "{:>5} {:<15} {:>10.0} {:>8.1} {:>9.0} {:>8.1} {:>8} {:>8} {:>8.1} {:>7}",
                r.logs,
                r.layout.name(),
                r.events_per_s,
                r.mb_per_s,
                r.fsyncs_per_s,
                r.events_per_fsync,
                r.p50_us,
                r.p99_us,
                r.cpu_us_per_event,
                r.threads
            )?;
        }
        let mut table = Table::new();
        for n in self.logs() {
            let rate = |layout| {
                self.rows
                    .iter()
                    .find(|r| r.logs == n && r.layout == layout)
                    .map(|r| r.events_per_s)
            };
            if let (Some(a), Some(b)) = (rate(LogsLayout::WalPerLog), rate(LogsLayout::SharedWal)) {
                table.row(
                    format!("{n} logs: wal-per-log / shared-wal"),
                    format!("{:.2}", a / b.max(1.0)),
                );
            }
            if let (Some(a), Some(b)) =
                (rate(LogsLayout::FilesOneSync), rate(LogsLayout::FileShared))
            {
                table.row(
                    format!("{n} logs: files-one-sync / file-shared"),
                    format!("{:.2}", a / b.max(1.0)),
                );
            }
        }
        table.write(out)
    }
}

impl LogsBenchReport {
    fn logs(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.rows.iter().map(|r| r.logs).collect();
        v.dedup();
        v
    }
}

/// Runs every (logs, layout) row of `config`.
///
/// # Errors
/// A bad configuration (no logs, more than [`LOGS_MAX`], zero appenders, a size of 0), a
/// WAL or file that cannot be opened or written, or Ctrl-C.
pub fn run(config: &LogsBenchConfig) -> anyhow::Result<LogsBenchReport> {
    if config.logs.is_empty() || config.logs.iter().any(|&n| n == 0 || n > LOGS_MAX) {
        bail!("--logs takes numbers of logs in 1..={LOGS_MAX}");
    }
    if config.appenders_per_log == 0 || config.event_size == 0 || config.layouts.is_empty() {
        bail!("--appenders, --event-size and --layouts must not be zero or empty");
    }
    let work = tempfile::Builder::new()
        .prefix(".quire-bench-logs-")
        .tempdir_in(&config.dir)
        .with_context(|| format!("cannot make a directory in {}", config.dir.display()))?;
    let mut rows = Vec::new();
    for &logs in &config.logs {
        for &layout in &config.layouts {
            let dir = work.path().join(format!("{}-{logs}", layout.name()));
            std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
            tracing::info!("{logs} log(s), {}", layout.name());
            let row = match layout {
                LogsLayout::SharedWal => measure_wals(&dir, config, logs, 1)?,
                LogsLayout::WalPerLog => measure_wals(&dir, config, logs, logs)?,
                LogsLayout::FilesOneSync => measure_raw(&dir, config, logs, logs)?,
                LogsLayout::FileShared => measure_raw(&dir, config, logs, 1)?,
            };
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            rows.push(LogsRow { layout, ..row });
        }
    }
    Ok(LogsBenchReport {
        dir: config.dir.display().to_string(),
        event_size: config.event_size,
        appenders_per_log: config.appenders_per_log,
        rows,
    })
}

/// `logs` busy logs through `wals` quire-wals (1: shared; `logs`: one each).
fn measure_wals(
    dir: &Path,
    config: &LogsBenchConfig,
    logs: u32,
    wals: u32,
) -> anyhow::Result<LogsRow> {
    let mut opened = Vec::new();
    for i in 0..wals {
        let wal_dir = dir.join(format!("log-{i}"));
        let wal_config = WalConfig {
            dir: wal_dir.clone(),
            segment_bytes_max: config.segment_size,
            io: config.io.backend(),
            ..WalConfig::default()
        };
        let (wal, _) = Wal::open(wal_config)
            .with_context(|| format!("cannot open a WAL in {}", wal_dir.display()))?;
        opened.push((wal, Arc::new(Mutex::new(0u64))));
    }
    let epoch = Epoch(1);
    let payload = payload_bytes(usize::try_from(config.event_size).context("event size")?);
    // Warm up: one append each (the first takes the spare segment).
    for (wal, next) in &opened {
        let event = Event {
            epoch,
            offset: Offset(0),
            kind: EventKind::Message,
            payload: payload.clone().into(),
        };
        wal.append(epoch, vec![event])
            .wait()
            .context("the warm-up append failed")?;
        *next.lock().map_err(|_| anyhow!("poisoned"))? = 1;
    }
    let fsyncs_before: u64 = opened.iter().map(|(w, _)| w.stats().fsyncs).sum();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .context("cannot start the appenders' runtime")?;
    let cpu_before = ProcessCpu::now();
    let started = Instant::now();
    let deadline = started + config.duration;
    let appenders = logs * config.appenders_per_log;
    let results = runtime.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for a in 0..appenders {
            // Appender a serves log a % logs, written to that log's WAL (or the shared one).
            let (wal, next) = &opened[(a % logs % wals) as usize];
            set.spawn(super::wal::appender(
                wal.clone(),
                next.clone(),
                epoch,
                payload.clone(),
                deadline,
            ));
        }
        let mut results = Vec::new();
        while let Some(joined) = set.join_next().await {
            results.push(joined);
        }
        results
    });
    let elapsed = started.elapsed();
    let cpu = ProcessCpu::now().since(cpu_before);
    let fsyncs = opened.iter().map(|(w, _)| w.stats().fsyncs).sum::<u64>() - fsyncs_before;
    drop(runtime);
    let mut hist = latency_histogram();
    let mut events = 0;
    for joined in results {
        let (h, n) = joined
            .map_err(|e| anyhow!("an appender task failed: {e}"))?
            .context("an append failed")?;
        hist.add(h)
            .map_err(|e| anyhow!("merging histograms: {e}"))?;
        events += n;
    }
    for (wal, _) in opened {
        wal.close().context("a WAL failed")?;
    }
    if interrupt::is_interrupted() {
        return Err(Interrupted.into());
    }
    Ok(row(
        config,
        logs,
        appenders,
        elapsed,
        events,
        fsyncs,
        &hist,
        cpu,
        3 * wals,
    ))
}

/// Raw rounds: `files` threads, each writing its share of a round's `logs × A` events to its
/// own O_DIRECT file and fdatasyncing it; a round ends when every thread has.
fn measure_raw(
    dir: &Path,
    config: &LogsBenchConfig,
    logs: u32,
    files: u32,
) -> anyhow::Result<LogsRow> {
    let events_per_round = u64::from(logs * config.appenders_per_log);
    let per_file_events = events_per_round / u64::from(files);
    let write_len = round_up(per_file_events * config.event_size, RAW_ALIGN as u64);
    let file_bytes = round_up(config.segment_size.max(write_len), write_len);
    let mut handles = Vec::new();
    for i in 0..files {
        let path = dir.join(format!("log-{i}"));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .with_context(|| {
                format!(
                    "cannot create {} with O_DIRECT (the raw layouts need direct I/O)",
                    path.display()
                )
            })?;
        prewrite(&file, file_bytes).with_context(|| format!("preparing {}", path.display()))?;
        handles.push(file);
    }
    let buf = Arc::new(AlignedBuf::zeroed(
        usize::try_from(write_len).context("write length")?,
        RAW_ALIGN,
    ));
    let start = Arc::new(Barrier::new(files as usize + 1));
    let done = Arc::new(Barrier::new(files as usize + 1));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut threads = Vec::new();
    for file in handles {
        let (buf, start, done, stop, failures) = (
            buf.clone(),
            start.clone(),
            done.clone(),
            stop.clone(),
            failures.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let mut position = 0u64;
            loop {
                start.wait();
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                let result = file
                    .write_all_at(buf.as_slice(), position)
                    .and_then(|()| file.sync_data());
                if let Err(e) = result {
                    if let Ok(mut f) = failures.lock() {
                        f.push(e.to_string());
                    }
                }
                position = (position + write_len) % file_bytes;
                done.wait();
            }
        }));
    }
    let mut hist = latency_histogram();
    let cpu_before = ProcessCpu::now();
    let started = Instant::now();
    let deadline = started + config.duration;
    let mut rounds = 0u64;
    while Instant::now() < deadline && !interrupt::is_interrupted() {
        let t = Instant::now();
        start.wait();
        done.wait();
        let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
        hist.saturating_record_n(us.max(1), events_per_round);
        rounds += 1;
    }
    let elapsed = started.elapsed();
    let cpu = ProcessCpu::now().since(cpu_before);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    start.wait();
    for t in threads {
        t.join().map_err(|_| anyhow!("a raw writer panicked"))?;
    }
    let failures = failures.lock().map_err(|_| anyhow!("poisoned"))?;
    if let Some(first) = failures.first() {
        bail!(
            "{} raw writes or fdatasyncs failed, the first: {first}",
            failures.len()
        );
    }
    if interrupt::is_interrupted() {
        return Err(Interrupted.into());
    }
    Ok(row(
        config,
        logs,
        logs * config.appenders_per_log,
        elapsed,
        rounds * events_per_round,
        rounds * u64::from(files),
        &hist,
        cpu,
        files,
    ))
}

/// Writes zeros over `[0, bytes)` of `file` and fdatasyncs it, so timed writes land in
/// written extents (as a WAL's zero-filled spare).
fn prewrite(file: &File, bytes: u64) -> anyhow::Result<()> {
    const CHUNK: usize = 1 << 20;
    let zeros = AlignedBuf::zeroed(CHUNK, RAW_ALIGN);
    let mut pos = 0u64;
    while pos < bytes {
        let n = usize::try_from((bytes - pos).min(CHUNK as u64)).context("chunk")?;
        file.write_all_at(&zeros.as_slice()[..n], pos)
            .context("zero-fill write")?;
        pos += n as u64;
    }
    file.sync_data().context("fdatasync after the zero fill")
}

fn round_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to) * to
}

#[allow(clippy::too_many_arguments)]
fn row(
    config: &LogsBenchConfig,
    logs: u32,
    appenders: u32,
    elapsed: Duration,
    events: u64,
    fsyncs: u64,
    hist: &hdrhistogram::Histogram<u64>,
    cpu: ProcessCpu,
    threads: u32,
) -> LogsRow {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let cpu_s = (cpu.user + cpu.sys).as_secs_f64();
    LogsRow {
        layout: LogsLayout::SharedWal,
        logs,
        appenders,
        duration_s: secs,
        events,
        events_per_s: events as f64 / secs,
        mb_per_s: (events * config.event_size) as f64 / secs / 1e6,
        fsyncs_per_s: fsyncs as f64 / secs,
        events_per_fsync: if fsyncs > 0 {
            events as f64 / fsyncs as f64
        } else {
            0.0
        },
        p50_us: hist.value_at_quantile(0.50),
        p99_us: hist.value_at_quantile(0.99),
        cpu_us_per_event: if events > 0 {
            cpu_s * 1e6 / events as f64
        } else {
            0.0
        },
        threads,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every layout runs briefly at 1 and 3 logs and reports events, fdatasyncs and the
    /// thread counts its layout implies.
    #[test]
    fn every_layout_runs_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogsBenchConfig {
            dir: dir.path().to_path_buf(),
            logs: vec![1, 3],
            appenders_per_log: 2,
            event_size: 512,
            duration: Duration::from_millis(150),
            layouts: LogsLayout::ALL.to_vec(),
            segment_size: 1 << 20,
            io: WalIo::Auto,
        };
        let report = match run(&config) {
            Ok(r) => r,
            // tmpfs and the like refuse O_DIRECT, which the raw layouts need.
            Err(e) if format!("{e:#}").contains("O_DIRECT") => return,
            Err(e) => panic!("{e:#}"),
        };
        assert_eq!(report.rows.len(), 8);
        for r in &report.rows {
            assert!(r.events > 0, "{r:?}");
            assert!(r.fsyncs_per_s > 0.0, "{r:?}");
        }
        let threads = |logs, layout| {
            report
                .rows
                .iter()
                .find(|r| r.logs == logs && r.layout == layout)
                .unwrap()
                .threads
        };
        assert_eq!(threads(3, LogsLayout::WalPerLog), 9);
        assert_eq!(threads(3, LogsLayout::SharedWal), 3);
        assert_eq!(threads(3, LogsLayout::FilesOneSync), 3);
        assert_eq!(threads(3, LogsLayout::FileShared), 1);
        let mut text = Vec::new();
        report.write_text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("files-one-sync / file-shared"), "{text}");
    }
}
