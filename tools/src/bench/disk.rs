//! `quire bench disk`: the raw-disk yardstick. Sequential O_DIRECT writes of one block size
//! into a file laid out one of two ways (see [the file](#the-file)), `qd` at a time through
//! io_uring, optionally each followed by an fdatasync — the same job as
//! `fio --ioengine=io_uring --direct=1 --rw=write --bs=B --iodepth=N [--fdatasync=1]`,
//! so Quire's own numbers (WAL, node, cluster) can be read as a fraction of what the disk
//! gives.
//!
//! This module owns the benchmark; it knows nothing of the WAL's format.
//!
//! # What is measured
//! - An **op** is one write of `block_size` bytes; with `--fsync every` it is the write and
//!   the fdatasync linked behind it (`IOSQE_IO_LINK`: the fsync starts only after the write
//!   completed, and covers it). `qd` ops are kept in flight.
//! - **Latency** is per op, from just before its submission to its (last) completion, in
//!   microseconds, recorded in an HDR histogram (3 significant digits).
//! - **Throughput** counts completed writes over the wall time from the first submission to
//!   the last completion; ops still in flight at the deadline are waited for and counted.
//!   `mb_per_s` is in MB = 10^6 bytes (fio's `MB/s`); `mib_per_s` is in MiB = 2^20 bytes.
//! - With `--fsync none` one fdatasync runs after the timed part, not counted.
//!
//! # The file
//! `DIR/.quire-bench-disk-<pid>.tmp`, created new and deleted at the end, also after an
//! error or Ctrl-C. `--layout` chooses what it looks like before the timed part:
//!
//! - **`prewritten`** (default): preallocated (`fallocate`), written once fully with zeros
//!   and fdatasynced. The timed writes overwrite written blocks, so an fdatasync has only
//!   the data to flush: this is the disk's own speed, and what fio measures on a file that
//!   already exists. Writes wrap to the start at the end of the file (`--file-size`).
//! - **`fallocated`**: preallocated with `fallocate` (mode 0) to its size and fsynced,
//!   never written: fio's layout for a new file. Every timed write lands in an unwritten
//!   extent. On ext4 an O_DIRECT write there needs an extent conversion (unwritten →
//!   written) when it completes, a metadata change, so the fdatasync behind it must also
//!   commit the journal: each op costs the data write plus a journal commit, which is what
//!   a log that writes new blocks pays (and what fio reports for a new file). The timed
//!   writes must not wrap into blocks they wrote earlier in the run, or the figure drifts
//!   towards the pre-written one: the file is sized for
//!   [`FALLOCATED_BYTES_PER_S_MAX`] × duration (at least `--file-size`), capped at
//!   [`FALLOCATED_FREE_SHARE`] of the free space. If the writes still wrap, a warning is
//!   logged and `wraps` in the report is above 0.
//!
//! # Alignment
//! From `statx(STATX_DIOALIGN)` when the kernel reports it, else the device's block sizes,
//! and never below 4096 bytes (see [`crate::dio::detect_alignment`]). `block_size` must be
//! a multiple of it.
//!
//! # JSON output (`--format json`): one object, stable field names
//! | field | unit / values |
//! | --- | --- |
//! | `bench` | `"disk"` |
//! | `backend` | `"io_uring"` or `"pwrite"` (fallback when io_uring is unavailable) |
//! | `dir`, `filesystem` | the directory and its file system's name |
//! | `block_size`, `file_size`, `alignment` | bytes |
//! | `alignment_source` | `"statx"`, `"block_device"` or `"default"` |
//! | `dio_mem_align`, `dio_offset_align` | bytes from statx, or `null` |
//! | `qd` | ops in flight |
//! | `fsync` | `"every"` or `"none"` |
//! | `layout` | `"prewritten"` or `"fallocated"` (see [the file](#the-file)) |
//! | `prefill_s`, `duration_s` | seconds; `prefill_s` is the time to prepare the file (fallocate, and for `prewritten` the zero-fill and fdatasync), in no rate |
//! | `ops`, `bytes`, `fsyncs` | totals over `duration_s` |
//! | `wraps` | times the writes went back to the start of the file (expected with `prewritten`; with `fallocated` above 0 means part of the run overwrote written blocks) |
//! | `mb_per_s`, `mib_per_s` | 10^6 and 2^20 bytes per second |
//! | `ops_per_s`, `fsyncs_per_s` | per second (`fsyncs_per_s` is 0 with `fsync = "none"`) |
//! | `mean_us`, `p50_us`, `p99_us`, `p999_us`, `max_us` | op latency, microseconds |

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use hdrhistogram::Histogram;
use io_uring::{opcode, squeue, types, IoUring, Probe};
use serde::Serialize;

use crate::dio::{self, AlignedBuf, AlignmentSource, DioAlignment};
use crate::interrupt::{self, Interrupted};
use crate::output::{Report, Table};

/// Most ops in flight (`--qd`).
pub const QUEUE_DEPTH_MAX: u32 = 1024;
/// Largest `--block-size`, in bytes (an io_uring write length is a u32; this is far below).
pub const BLOCK_BYTES_MAX: u64 = 64 << 20;
/// Most buffer memory, `block_size * qd`, in bytes.
pub const BUFFER_BYTES_MAX: u64 = 1 << 30;
/// Longest `--duration`.
pub const DURATION_MAX: Duration = Duration::from_secs(24 * 3600);
/// Size of each zero-filling write while preparing the file, in bytes.
pub const PREFILL_CHUNK_BYTES: u64 = 4 << 20;
/// Largest latency the histogram holds, in microseconds (one hour); longer ones saturate.
pub const LATENCY_US_MAX: u64 = 3_600_000_000;

/// An op in flight longer than this is reported as stuck and ends the run with an error
/// (io_uring backend; a `pwrite` cannot be bounded).
pub const OP_STALL_MAX: Duration = Duration::from_secs(120);
/// Longest single wait for completions before the loop looks at the clock, Ctrl-C and
/// stuck ops again.
const WAIT_TICK: Duration = Duration::from_secs(1);

/// Default `--file-size`, in bytes (the CLI spells it `1GiB`; a unit test keeps the two equal).
pub const FILE_BYTES_DEFAULT: u64 = 1 << 30;

/// With [`DiskLayout::Fallocated`]: the fastest write rate the file is sized for, in bytes
/// per second (10^9-byte GB: 4 GB/s), so a run of `duration` writes at most this many
/// bytes × seconds and never wraps into blocks it wrote.
pub const FALLOCATED_BYTES_PER_S_MAX: u64 = 4_000_000_000;
/// With [`DiskLayout::Fallocated`]: the largest share of the free space the bench file may
/// take, as a fraction (the rest stays for whatever else runs on the file system).
pub const FALLOCATED_FREE_SHARE: f64 = 0.5;

/// How the bench file is laid out before the timed part (`--layout`); see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskLayout {
    /// Preallocated, written once with zeros and fdatasynced: timed writes overwrite
    /// written blocks (fio on an existing file).
    #[default]
    Prewritten,
    /// Preallocated with `fallocate` only, never written: every timed write lands in an
    /// unwritten extent (fio on a new file).
    Fallocated,
}

impl DiskLayout {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            DiskLayout::Prewritten => "prewritten",
            DiskLayout::Fallocated => "fallocated",
        }
    }
}

/// When the benchmark issues an fdatasync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsyncPolicy {
    /// Every write is followed by an fdatasync linked to it (fio `--fdatasync=1`).
    Every,
    /// No fdatasync while timing; one at the end, untimed.
    None,
}

/// Which I/O path to use (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BackendChoice {
    /// io_uring; fall back to `pwrite` (with a warning) if the kernel refuses io_uring.
    #[default]
    Auto,
    /// io_uring only; an error if it is unavailable.
    IoUring,
    /// `pwrite` + `fdatasync` from `qd` threads (what the fallback runs).
    Pwrite,
}

/// The I/O path a run used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Backend {
    /// io_uring `IORING_OP_WRITE` (+ `IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC`).
    #[serde(rename = "io_uring")]
    IoUring,
    /// `pwrite(2)` (+ `fdatasync(2)`) from `qd` threads.
    #[serde(rename = "pwrite")]
    Pwrite,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::IoUring => "io_uring",
            Backend::Pwrite => "pwrite",
        }
    }
}

/// What to run. Built from the command line, or directly by tests and other commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskBenchConfig {
    /// Directory on the file system under test; the bench file is created here.
    pub dir: PathBuf,
    /// Bytes per write; a multiple of the direct-I/O alignment.
    pub block_size: u64,
    /// Ops kept in flight, 1..=[`QUEUE_DEPTH_MAX`].
    pub qd: u32,
    /// When to fdatasync.
    pub fsync: FsyncPolicy,
    /// How long to keep submitting.
    pub duration: Duration,
    /// Size of the bench file in bytes; rounded down to a multiple of `block_size`, and at
    /// least `block_size * qd`. With [`DiskLayout::Fallocated`] a lower bound: the file is
    /// made large enough not to wrap (see [`fallocated_file_bytes`]).
    pub file_size: u64,
    /// Which I/O path to use.
    pub backend: BackendChoice,
    /// How the file is laid out before the timed part.
    pub layout: DiskLayout,
}

/// The result of one run; see the module docs for each field's unit.
#[derive(Debug, Clone, Serialize)]
pub struct DiskBenchReport {
    /// Always `"disk"`.
    pub bench: &'static str,
    /// The I/O path used.
    pub backend: Backend,
    /// The directory under test.
    pub dir: String,
    /// Its file system.
    pub filesystem: String,
    /// Bytes per write.
    pub block_size: u64,
    /// Ops in flight.
    pub qd: u32,
    /// fdatasync policy.
    pub fsync: FsyncPolicy,
    /// How the file was laid out before the timed part.
    pub layout: DiskLayout,
    /// Bench file size, bytes.
    pub file_size: u64,
    /// Alignment used for buffers, positions and lengths, bytes.
    pub alignment: u64,
    /// Where the alignment came from.
    pub alignment_source: AlignmentSource,
    /// statx `dio_mem_align`, bytes.
    pub dio_mem_align: Option<u32>,
    /// statx `dio_offset_align`, bytes.
    pub dio_offset_align: Option<u32>,
    /// Time to prepare the file (fallocate; for `prewritten` also zero-fill and fdatasync),
    /// seconds.
    pub prefill_s: f64,
    /// Measured wall time, first submission to last completion, seconds.
    pub duration_s: f64,
    /// Completed writes.
    pub ops: u64,
    /// Bytes written (`ops * block_size`).
    pub bytes: u64,
    /// Completed fdatasyncs.
    pub fsyncs: u64,
    /// Times the writes went back to the start of the file.
    pub wraps: u64,
    /// Throughput, 10^6 bytes per second.
    pub mb_per_s: f64,
    /// Throughput, 2^20 bytes per second.
    pub mib_per_s: f64,
    /// Writes per second.
    pub ops_per_s: f64,
    /// fdatasyncs per second.
    pub fsyncs_per_s: f64,
    /// Mean op latency, microseconds.
    pub mean_us: f64,
    /// Median op latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile op latency, microseconds.
    pub p99_us: u64,
    /// 99.9th percentile op latency, microseconds.
    pub p999_us: u64,
    /// Largest op latency, microseconds.
    pub max_us: u64,
}

impl Report for DiskBenchReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let fsync = match self.fsync {
            FsyncPolicy::Every => "fdatasync after every write",
            FsyncPolicy::None => "no fdatasync",
        };
        writeln!(
            out,
            "quire bench disk: {} O_DIRECT sequential writes, {fsync}",
            self.backend.name()
        )?;
        let mut alignment = format!("{} B ({}", self.alignment, self.alignment_source);
        if let (Some(mem), Some(offset)) = (self.dio_mem_align, self.dio_offset_align) {
            alignment.push_str(&format!(": mem {mem} B, offset {offset} B"));
        }
        alignment.push(')');
        let mut file = match self.layout {
            DiskLayout::Prewritten => format!(
                "{}, prewritten (prefilled in {:.2} s)",
                crate::output::human_bytes(self.file_size),
                self.prefill_s
            ),
            DiskLayout::Fallocated => format!(
                "{}, fallocated, not written (in {:.2} s)",
                crate::output::human_bytes(self.file_size),
                self.prefill_s
            ),
        };
        if self.layout == DiskLayout::Fallocated && self.wraps > 0 {
            file.push_str(&format!(
                "; WRAPPED {} time(s): part of the run overwrote written blocks",
                self.wraps
            ));
        }
        Table::new()
            .row("dir", format!("{} ({})", self.dir, self.filesystem))
            .row("file", file)
            .row(
                "block",
                format!(
                    "{}, qd {}",
                    crate::output::human_bytes(self.block_size),
                    self.qd
                ),
            )
            .row("alignment", alignment)
            .row("duration", format!("{:.2} s", self.duration_s))
            .row(
                "throughput",
                format!("{:.1} MB/s ({:.1} MiB/s)", self.mb_per_s, self.mib_per_s),
            )
            .row(
                "writes",
                format!("{:.0} /s ({} total)", self.ops_per_s, self.ops),
            )
            .row(
                "fdatasyncs",
                format!("{:.0} /s ({} total)", self.fsyncs_per_s, self.fsyncs),
            )
            .row(
                "latency",
                format!(
                    "mean {:.0} us, p50 {} us, p99 {} us, p99.9 {} us, max {} us",
                    self.mean_us, self.p50_us, self.p99_us, self.p999_us, self.max_us
                ),
            )
            .write(out)
    }
}

/// Runs the benchmark described by `config`: creates and lays out the bench file, measures,
/// deletes the file, and returns the figures. Installs a SIGINT/SIGTERM handler so Ctrl-C
/// stops it cleanly.
///
/// # Errors
/// - Invalid configuration (zero or oversized values, block size not a multiple of the
///   alignment, file too small for `qd` blocks, not enough free space).
/// - The directory not creatable, or its file system refusing O_DIRECT (the message names it).
/// - io_uring unavailable with [`BackendChoice::IoUring`].
/// - Any failed or short write or fdatasync (the first one, with its position).
/// - [`Interrupted`] after SIGINT/SIGTERM (the file is still removed).
pub fn run(config: &DiskBenchConfig) -> anyhow::Result<DiskBenchReport> {
    validate(config)?;
    let dir = &config.dir;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create --dir {}", dir.display()))?;
    let meta =
        std::fs::metadata(dir).with_context(|| format!("cannot use --dir {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("--dir {} is not a directory", dir.display());
    }
    let filesystem =
        dio::filesystem_name(dir).with_context(|| format!("cannot statfs {}", dir.display()))?;
    if matches!(filesystem.as_str(), "tmpfs" | "ramfs") {
        tracing::warn!(
            "{} is on {filesystem}: this measures memory, not a disk",
            dir.display()
        );
    }
    interrupt::install().context("cannot install the Ctrl-C handler")?;

    let mut ring = match config.backend {
        BackendChoice::Pwrite => None,
        BackendChoice::IoUring => Some(open_ring(config.qd).map_err(|e| {
            anyhow!("io_uring is unavailable: {e}; run with --backend pwrite (or auto)")
        })?),
        BackendChoice::Auto => match open_ring(config.qd) {
            Ok(ring) => Some(ring),
            Err(e) => {
                tracing::warn!(
                    "io_uring is unavailable ({e}); falling back to pwrite + fdatasync \
                     from {} threads",
                    config.qd
                );
                None
            }
        },
    };
    let backend = if ring.is_some() {
        Backend::IoUring
    } else {
        Backend::Pwrite
    };

    let bench_file = BenchFile::create(dir, &filesystem)?;
    let alignment = dio::detect_alignment(&bench_file.file).map_err(|e| {
        if e.kind() == io::ErrorKind::Unsupported {
            anyhow!(
                "{} ({filesystem}) does not support O_DIRECT: {e}; choose a directory on a \
                 disk-backed file system such as ext4 or xfs",
                dir.display()
            )
        } else {
            anyhow!(e).context(format!(
                "cannot find the direct I/O alignment of {}",
                bench_file.path.display()
            ))
        }
    })?;
    let align = alignment.required();
    if config.block_size % align != 0 {
        bail!(
            "--block-size {} is not a multiple of the direct I/O alignment {align} bytes of {} \
             ({filesystem}, from {})",
            config.block_size,
            dir.display(),
            alignment.source
        );
    }
    let available = dio::available_bytes(dir).unwrap_or(u64::MAX);
    let wanted = match config.layout {
        DiskLayout::Prewritten => config.file_size,
        DiskLayout::Fallocated => {
            fallocated_file_bytes(config.file_size, config.duration, available)
        }
    };
    let file_size = wanted - wanted % config.block_size;
    if config.layout == DiskLayout::Prewritten && file_size != config.file_size {
        tracing::info!("file size rounded down to {file_size} bytes, a multiple of the block size");
    }
    if available < file_size {
        bail!(
            "not enough free space in {}: the bench file needs {file_size} bytes, {available} \
             are available; pass a smaller --file-size",
            dir.display()
        );
    }

    let layout = config.layout.name();
    tracing::info!(
        "preparing {} ({file_size} bytes, {layout}): {}",
        bench_file.path.display(),
        match config.layout {
            DiskLayout::Prewritten => "preallocate, zero-fill, fdatasync",
            DiskLayout::Fallocated => "fallocate and fsync, no write",
        }
    );
    let prefill_started = Instant::now();
    prepare(&bench_file.file, config.layout, file_size, align)
        .with_context(|| format!("cannot prepare {}", bench_file.path.display()))?;
    let prefill = prefill_started.elapsed();
    tracing::info!(
        "prepared ({layout}) in {:.2} s; measuring for {:?}",
        prefill.as_secs_f64(),
        config.duration
    );

    let workload = Workload {
        file: &bench_file.file,
        block_size: config.block_size,
        qd: config.qd,
        fsync: config.fsync,
        duration: config.duration,
        file_size,
        align,
        filesystem: &filesystem,
    };
    let measurement = match ring.as_mut() {
        Some(ring) => run_io_uring(ring, &workload)?,
        None => run_pwrite(&workload)?,
    };
    if interrupt::is_interrupted() {
        return Err(Interrupted.into());
    }
    let wraps = measurement.wraps(file_size / config.block_size);
    if config.layout == DiskLayout::Fallocated && wraps > 0 {
        tracing::warn!(
            "the writes wrapped {wraps} time(s) past the end of the {file_size}-byte \
             fallocated file: part of the run overwrote blocks it had written, so the figure \
             lies between the fallocated and the pre-written one (free space in {} is too \
             small for this duration; pass a shorter --duration or free some space)",
            dir.display()
        );
    }
    if config.fsync == FsyncPolicy::None {
        bench_file
            .file
            .sync_data()
            .context("the final fdatasync failed")?;
    }
    drop(bench_file);

    Ok(report(
        config,
        backend,
        filesystem,
        file_size,
        &alignment,
        prefill,
        &measurement,
    ))
}

/// The size of a [`DiskLayout::Fallocated`] bench file, in bytes (before rounding down to
/// the block size): enough for [`FALLOCATED_BYTES_PER_S_MAX`] during `duration`, at least
/// `file_size_min`, and at most [`FALLOCATED_FREE_SHARE`] of `available_bytes` unless
/// `file_size_min` alone is more (the caller then checks that it fits).
pub fn fallocated_file_bytes(file_size_min: u64, duration: Duration, available_bytes: u64) -> u64 {
    // `as` from f64 saturates: a huge duration gives u64::MAX, then the cap applies.
    let needed = (FALLOCATED_BYTES_PER_S_MAX as f64 * duration.as_secs_f64()).ceil() as u64;
    let cap = (available_bytes as f64 * FALLOCATED_FREE_SHARE) as u64;
    needed.min(cap).max(file_size_min)
}

fn validate(config: &DiskBenchConfig) -> anyhow::Result<()> {
    if config.block_size == 0 || config.block_size % dio::DIO_ALIGN_MIN != 0 {
        bail!(
            "--block-size {} must be a positive multiple of {} bytes (direct I/O alignment)",
            config.block_size,
            dio::DIO_ALIGN_MIN
        );
    }
    if config.block_size > BLOCK_BYTES_MAX {
        bail!(
            "--block-size {} is larger than the maximum {BLOCK_BYTES_MAX} bytes",
            config.block_size
        );
    }
    if config.qd == 0 || config.qd > QUEUE_DEPTH_MAX {
        bail!("--qd {} must be between 1 and {QUEUE_DEPTH_MAX}", config.qd);
    }
    let buffer_bytes = config.block_size * u64::from(config.qd);
    if buffer_bytes > BUFFER_BYTES_MAX {
        bail!(
            "--block-size {} times --qd {} needs {buffer_bytes} bytes of buffers, more than \
             the maximum {BUFFER_BYTES_MAX}",
            config.block_size,
            config.qd
        );
    }
    if config.file_size < buffer_bytes {
        bail!(
            "--file-size {} must hold at least --qd {} blocks of {} bytes ({buffer_bytes} bytes)",
            config.file_size,
            config.qd,
            config.block_size
        );
    }
    if config.duration.is_zero() || config.duration > DURATION_MAX {
        bail!(
            "--duration {:?} must be more than 0 and at most {:?}",
            config.duration,
            DURATION_MAX
        );
    }
    Ok(())
}

/// Opens an io_uring with room for `qd` write+fsync pairs and checks that the kernel knows
/// the write and fsync opcodes.
///
/// The ring has the flags fio's io_uring engine asks for (see
/// [`quire_wal::disk::open_single_issuer_ring`], which the WAL's ring shares): it must be
/// used only from the thread that created it.
fn open_ring(qd: u32) -> io::Result<IoUring> {
    let entries = (2 * qd).next_power_of_two();
    let (ring, _) = quire_wal::disk::open_single_issuer_ring(entries, false)?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for (name, code) in [
        ("IORING_OP_WRITE", opcode::Write::CODE),
        ("IORING_OP_FSYNC", opcode::Fsync::CODE),
    ] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the kernel's io_uring lacks {name}"),
            ));
        }
    }
    Ok(ring)
}

/// The bench file; deleted when dropped (after an error or interruption too).
struct BenchFile {
    path: PathBuf,
    file: File,
}

impl BenchFile {
    fn create(dir: &Path, filesystem: &str) -> anyhow::Result<Self> {
        let path = dir.join(format!(".quire-bench-disk-{}.tmp", std::process::id()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
        {
            Ok(file) => Ok(Self { path, file }),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // Linux creates the file before refusing O_DIRECT; it is ours (create_new).
                let _ = std::fs::remove_file(&path);
                bail!(
                    "cannot open a file in {} with O_DIRECT: the file system ({filesystem}) \
                     does not support direct I/O ({e}); choose a directory on a disk-backed \
                     file system such as ext4 or xfs",
                    dir.display()
                )
            }
            Err(e) => {
                Err(anyhow!(e).context(format!("cannot create bench file {}", path.display())))
            }
        }
    }
}

impl Drop for BenchFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!("could not remove bench file {}: {e}", self.path.display());
        }
    }
}

/// Lays the file out as `layout` asks.
///
/// - [`DiskLayout::Prewritten`]: preallocates `file_size` bytes, writes them once with zeros
///   (O_DIRECT, in [`PREFILL_CHUNK_BYTES`] pieces), and fdatasyncs, so the timed writes land
///   in written extents.
/// - [`DiskLayout::Fallocated`]: `fallocate` (mode 0: allocates unwritten extents and sets
///   the size) and fsync, so the allocation itself is committed before timing and the timed
///   ops pay only for converting the extents they write.
///
/// # Errors
/// fallocate failing (for `fallocated` also when the file system does not support it),
/// a failed write or sync, or Ctrl-C during the zero-fill.
fn prepare(file: &File, layout: DiskLayout, file_size: u64, align: u64) -> anyhow::Result<()> {
    let len = i64::try_from(file_size).context("file size does not fit off_t")?;
    // SAFETY: fallocate only reads its integer arguments; the fd is open for the call.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // Not every file system preallocates; writing the zeros still works.
            Some(libc::EOPNOTSUPP) if layout == DiskLayout::Prewritten => {
                tracing::debug!("fallocate unsupported: {err}")
            }
            Some(libc::EOPNOTSUPP) => bail!(
                "the file system does not support fallocate ({err}), which --layout \
                 fallocated needs; use --layout prewritten"
            ),
            Some(libc::ENOSPC) => bail!("no space left for {file_size} bytes: {err}"),
            _ => return Err(anyhow!(err).context("fallocate failed")),
        }
    }
    if layout == DiskLayout::Fallocated {
        file.sync_all().context("fsync after fallocate failed")?;
        return Ok(());
    }
    let chunk_bytes = PREFILL_CHUNK_BYTES.max(align).min(file_size);
    let buf = AlignedBuf::zeroed(to_usize(chunk_bytes)?, to_usize(align)?);
    let mut position = 0;
    while position < file_size {
        if interrupt::is_interrupted() {
            return Err(Interrupted.into());
        }
        let len = chunk_bytes.min(file_size - position);
        // `len` is a multiple of `align`: file_size and chunk_bytes both are.
        write_block(file, &buf.as_slice()[..to_usize(len)?], position)?;
        position += len;
    }
    file.sync_data().context("fdatasync after prefill failed")?;
    Ok(())
}

/// One `pwrite`, retried on EINTR; a short write is an error.
fn write_block(file: &File, data: &[u8], position: u64) -> anyhow::Result<()> {
    loop {
        match file.write_at(data, position) {
            Ok(n) if n == data.len() => return Ok(()),
            Ok(n) => bail!(
                "short write: {n} of {} bytes at position {position}",
                data.len()
            ),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(anyhow!(e).context(format!(
                    "write of {} bytes at position {position} failed",
                    data.len()
                )))
            }
        }
    }
}

fn to_usize(value: u64) -> anyhow::Result<usize> {
    usize::try_from(value).with_context(|| format!("{value} does not fit usize"))
}

/// Everything an engine needs to run the timed part.
struct Workload<'a> {
    file: &'a File,
    block_size: u64,
    qd: u32,
    fsync: FsyncPolicy,
    duration: Duration,
    file_size: u64,
    align: u64,
    filesystem: &'a str,
}

impl Workload<'_> {
    /// The error for a failed write or fdatasync completion, with a hint for EINVAL.
    fn io_error(&self, what: &str, position: u64, errno: i32) -> anyhow::Error {
        let err = io::Error::from_raw_os_error(errno);
        let hint = if errno == libc::EINVAL {
            format!(
                "; the file system ({}) rejected the direct I/O request (alignment used: {} \
                 bytes)",
                self.filesystem, self.align
            )
        } else {
            String::new()
        };
        anyhow!(
            "{what} of the block at position {position} ({} bytes) failed: {err}{hint}",
            self.block_size
        )
    }

    /// A data block filled with pseudo-random bytes (xorshift64), different per `seed`, so
    /// no layer below can compress or deduplicate it.
    fn data_block(&self, seed: u64) -> anyhow::Result<AlignedBuf> {
        let mut buf = AlignedBuf::zeroed(to_usize(self.block_size)?, to_usize(self.align)?);
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for word in buf.as_mut_slice().chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        Ok(buf)
    }
}

/// What an engine measured.
#[derive(Debug)]
struct Measurement {
    ops: u64,
    fsyncs: u64,
    /// Writes submitted (the last few may have failed or been cut short by an error).
    submitted: u64,
    latency_us: Histogram<u64>,
    elapsed: Duration,
}

impl Measurement {
    /// Times the writes went back to the start of a file of `blocks` blocks: the first
    /// `blocks` writes fill it once, every further `blocks` is one more wrap.
    fn wraps(&self, blocks: u64) -> u64 {
        if blocks == 0 {
            return 0;
        }
        self.submitted.saturating_sub(1) / blocks
    }
}

fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).context("cannot create latency histogram")
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// io_uring `user_data`: slot index shifted left once, low bit the op kind.
const KIND_WRITE: u64 = 0;
const KIND_FSYNC: u64 = 1;

/// One op's buffer and bookkeeping.
struct Slot {
    buf: AlignedBuf,
    position: u64,
    submitted_at: Instant,
    /// Completions still to arrive for the op in flight (0 when the slot is free).
    pending: u8,
    /// A completion of the op in flight failed; its latency is not recorded.
    failed: bool,
    /// The write of the op in flight was counted (from its own completion).
    write_counted: bool,
}

/// The slots; if dropped while the kernel may still use a buffer (ops in flight, e.g. on a
/// ring error or a panic), the buffers are leaked instead of freed.
struct SlotPool {
    slots: Vec<Slot>,
    in_flight: usize,
}

impl Drop for SlotPool {
    fn drop(&mut self) {
        if self.in_flight > 0 {
            tracing::warn!(
                "{} ops still in flight: leaking their buffers",
                self.in_flight
            );
            for slot in self.slots.drain(..) {
                std::mem::forget(slot);
            }
        }
    }
}

/// The timed part through io_uring: keeps `qd` ops in flight until the deadline, then
/// waits for every one of them.
fn run_io_uring(ring: &mut IoUring, work: &Workload<'_>) -> anyhow::Result<Measurement> {
    let fd = types::Fd(work.file.as_raw_fd());
    let write_len = u32::try_from(work.block_size).context("block size does not fit u32")?;
    let qd = work.qd as usize;
    let mut pool = SlotPool {
        slots: Vec::with_capacity(qd),
        in_flight: 0,
    };
    let now = Instant::now();
    for index in 0..qd {
        pool.slots.push(Slot {
            buf: work.data_block(index as u64 + 1)?,
            position: 0,
            submitted_at: now,
            pending: 0,
            failed: false,
            write_counted: false,
        });
    }
    let mut free: Vec<usize> = (0..qd).rev().collect();
    let mut completions: Vec<(u64, i32)> = Vec::with_capacity(2 * qd);
    let mut latency_us = new_histogram()?;
    let (mut ops, mut fsyncs) = (0u64, 0u64);
    let mut first_error: Option<anyhow::Error> = None;
    let mut next_position = 0u64;
    let mut submitted = 0u64;
    // With `fsync every`, a successful write needs no completion of its own: the fsync
    // linked behind it runs only if the write completed in full. Skipping it saves a wake-up
    // per op, as the fsync's completion then carries the whole op. A failed or short write
    // still posts its completion, breaks the link and cancels the fsync *without* posting
    // the fsync's completion (the kernel's REQ_F_SKIP_LINK_CQES): that write completion
    // ends the op.
    let skip_write_cqe =
        work.fsync == FsyncPolicy::Every && ring.params().is_feature_skip_cqe_on_success();
    let write_flags = if skip_write_cqe {
        squeue::Flags::IO_LINK | squeue::Flags::SKIP_SUCCESS
    } else {
        squeue::Flags::IO_LINK
    };

    // Waits with a timeout (IORING_FEAT_EXT_ARG, Linux 5.11+) so a stuck op is noticed.
    let timed_wait = ring.params().is_feature_ext_arg();

    let start = Instant::now();
    let deadline = start + work.duration;
    let mut last_completion = start;
    loop {
        let stopping =
            first_error.is_some() || interrupt::is_interrupted() || Instant::now() >= deadline;
        if !stopping {
            while let Some(index) = free.pop() {
                let slot = &mut pool.slots[index];
                slot.position = next_position;
                next_position = (next_position + work.block_size) % work.file_size;
                let user_data = (index as u64) << 1;
                let write = opcode::Write::new(fd, slot.buf.as_ptr(), write_len)
                    .offset(slot.position)
                    .build()
                    .user_data(user_data | KIND_WRITE);
                slot.submitted_at = Instant::now();
                slot.failed = false;
                slot.write_counted = false;
                let mut sq = ring.submission();
                let pushed = match work.fsync {
                    FsyncPolicy::None => {
                        slot.pending = 1;
                        // SAFETY: the entry points at `slot.buf`, a heap allocation that
                        // does not move and is neither reused nor freed before this op's
                        // completion is reaped (`pending` > 0 keeps the slot off the free
                        // list; SlotPool leaks the buffers if dropped with ops in flight).
                        // `fd` stays open: `work.file` outlives this function.
                        unsafe { sq.push(&write) }
                    }
                    FsyncPolicy::Every => {
                        slot.pending = if skip_write_cqe { 1 } else { 2 };
                        let fsync = opcode::Fsync::new(fd)
                            .flags(types::FsyncFlags::DATASYNC)
                            .build()
                            .user_data(user_data | KIND_FSYNC);
                        // SAFETY: as for the single write above; the fsync entry holds no
                        // pointer. Both entries are pushed together or not at all.
                        unsafe { sq.push_multiple(&[write.flags(write_flags), fsync]) }
                    }
                };
                drop(sq);
                if pushed.is_err() {
                    // Cannot happen: the queue holds 2 * qd entries and is emptied by
                    // every submit below. Stop cleanly rather than trust the state.
                    let slot = &mut pool.slots[index];
                    slot.pending = 0;
                    free.push(index);
                    first_error = Some(anyhow!(
                        "bug: the io_uring submission queue is full with {} ops in flight",
                        pool.in_flight
                    ));
                    break;
                }
                pool.in_flight += 1;
                submitted += 1;
            }
        }
        if pool.in_flight == 0 {
            break;
        }
        let waited = if timed_wait {
            let tick = types::Timespec::from(WAIT_TICK);
            let args = types::SubmitArgs::new().timespec(&tick);
            ring.submitter().submit_with_args(1, &args)
        } else {
            ring.submit_and_wait(1)
        };
        match waited {
            Ok(_) => {}
            // A signal (Ctrl-C): the loop head sees the flag; in-flight ops are still reaped.
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            // No completion within WAIT_TICK: look for a stuck op, then wait again.
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => {
                let now = Instant::now();
                if let Some(stuck) = pool
                    .slots
                    .iter()
                    .find(|slot| slot.pending > 0 && now - slot.submitted_at > OP_STALL_MAX)
                {
                    // `pool` leaks the in-flight buffers when dropped.
                    bail!(
                        "the op at position {} has not completed after {:?}; giving up \
                         (the disk or the kernel is stuck)",
                        stuck.position,
                        OP_STALL_MAX
                    );
                }
            }
            Err(e) => {
                // `pool` leaks the in-flight buffers when dropped.
                return Err(anyhow!(e).context("io_uring_enter failed"));
            }
        }
        completions.clear();
        completions.extend(
            ring.completion()
                .map(|entry| (entry.user_data(), entry.result())),
        );
        let now = Instant::now();
        for &(user_data, result) in &completions {
            let index = usize::try_from(user_data >> 1).unwrap_or(usize::MAX);
            let kind = user_data & 1;
            let Some(slot) = pool.slots.get_mut(index) else {
                first_error.get_or_insert_with(|| {
                    anyhow!("bug: io_uring completion with unknown user_data {user_data}")
                });
                continue;
            };
            if slot.pending == 0 {
                first_error.get_or_insert_with(|| {
                    anyhow!("bug: io_uring completion for idle slot {index}")
                });
                continue;
            }
            slot.pending -= 1;
            let what = if kind == KIND_WRITE {
                "write"
            } else {
                "fdatasync"
            };
            if result < 0 {
                // A failed write cancels the fsync linked behind it: report the write only.
                let cancelled_by_write = kind == KIND_FSYNC && result == -libc::ECANCELED;
                if !(cancelled_by_write && slot.failed) {
                    first_error.get_or_insert_with(|| work.io_error(what, slot.position, -result));
                }
                slot.failed = true;
            } else if kind == KIND_WRITE && result != write_len as i32 {
                first_error.get_or_insert_with(|| {
                    anyhow!(
                        "short write: {result} of {} bytes at position {}",
                        work.block_size,
                        slot.position
                    )
                });
                slot.failed = true;
            } else if kind == KIND_WRITE {
                ops += 1;
                slot.write_counted = true;
                if skip_write_cqe {
                    // Only `pending` = 1 (the fsync) was expected; it is still coming.
                    slot.pending += 1;
                }
            } else {
                fsyncs += 1;
                // The linked fsync ran, so its write completed in full.
                if !slot.write_counted {
                    ops += 1;
                    slot.write_counted = true;
                }
            }
            if slot.pending == 0 {
                if !slot.failed {
                    latency_us.saturating_record(micros(now - slot.submitted_at));
                }
                pool.in_flight -= 1;
                free.push(index);
                last_completion = now;
            }
        }
    }
    if let Some(err) = first_error {
        return Err(err);
    }
    Ok(Measurement {
        ops,
        fsyncs,
        submitted,
        latency_us,
        elapsed: last_completion - start,
    })
}

/// The timed part with `pwrite` + `fdatasync`, one thread per op in flight: the fallback
/// when io_uring is unavailable. Threads take consecutive blocks from a shared counter.
fn run_pwrite(work: &Workload<'_>) -> anyhow::Result<Measurement> {
    let blocks = work.file_size / work.block_size;
    let next_block = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let deadline = start + work.duration;
    let worker = |seed: u64| -> anyhow::Result<(Measurement, Instant)> {
        let buf = work.data_block(seed)?;
        let mut latency_us = new_histogram()?;
        let (mut ops, mut fsyncs) = (0u64, 0u64);
        let mut last_completion = start;
        let result = (|| -> anyhow::Result<()> {
            while !stop.load(Ordering::Relaxed)
                && !interrupt::is_interrupted()
                && Instant::now() < deadline
            {
                let block = next_block.fetch_add(1, Ordering::Relaxed) % blocks;
                let position = block * work.block_size;
                let started = Instant::now();
                write_block(work.file, buf.as_slice(), position)?;
                ops += 1;
                if work.fsync == FsyncPolicy::Every {
                    work.file.sync_data().map_err(|e| {
                        work.io_error("fdatasync", position, e.raw_os_error().unwrap_or(0))
                    })?;
                    fsyncs += 1;
                }
                last_completion = Instant::now();
                latency_us.saturating_record(micros(last_completion - started));
            }
            Ok(())
        })();
        if result.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        result.map(|()| {
            (
                Measurement {
                    ops,
                    fsyncs,
                    submitted: 0,
                    latency_us,
                    elapsed: Duration::ZERO,
                },
                last_completion,
            )
        })
    };
    let results: Vec<anyhow::Result<(Measurement, Instant)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..work.qd)
            .map(|index| {
                let worker = &worker;
                scope.spawn(move || worker(u64::from(index) + 1))
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err(anyhow!("a pwrite worker thread panicked")))
            })
            .collect()
    });
    let mut total = Measurement {
        ops: 0,
        fsyncs: 0,
        // Every block number taken from the counter was written (or failed, ending the run).
        submitted: next_block.load(Ordering::Relaxed),
        latency_us: new_histogram()?,
        elapsed: Duration::ZERO,
    };
    let mut end = start;
    for result in results {
        let (part, last_completion) = result?;
        total.ops += part.ops;
        total.fsyncs += part.fsyncs;
        total
            .latency_us
            .add(&part.latency_us)
            .context("cannot merge latency histograms")?;
        end = end.max(last_completion);
    }
    total.elapsed = end - start;
    Ok(total)
}

fn report(
    config: &DiskBenchConfig,
    backend: Backend,
    filesystem: String,
    file_size: u64,
    alignment: &DioAlignment,
    prefill: Duration,
    measurement: &Measurement,
) -> DiskBenchReport {
    let seconds = measurement.elapsed.as_secs_f64();
    let per_second = |count: f64| if seconds > 0.0 { count / seconds } else { 0.0 };
    let bytes = measurement.ops * config.block_size;
    let latency = &measurement.latency_us;
    DiskBenchReport {
        bench: "disk",
        backend,
        dir: config.dir.display().to_string(),
        filesystem,
        block_size: config.block_size,
        qd: config.qd,
        fsync: config.fsync,
        layout: config.layout,
        file_size,
        alignment: alignment.required(),
        alignment_source: alignment.source,
        dio_mem_align: alignment.mem_align,
        dio_offset_align: alignment.offset_align,
        prefill_s: prefill.as_secs_f64(),
        duration_s: seconds,
        ops: measurement.ops,
        bytes,
        fsyncs: measurement.fsyncs,
        wraps: measurement.wraps(file_size / config.block_size),
        mb_per_s: per_second(bytes as f64) / 1e6,
        mib_per_s: per_second(bytes as f64) / (1u64 << 20) as f64,
        ops_per_s: per_second(measurement.ops as f64),
        fsyncs_per_s: per_second(measurement.fsyncs as f64),
        mean_us: latency.mean(),
        p50_us: latency.value_at_quantile(0.50),
        p99_us: latency.value_at_quantile(0.99),
        p999_us: latency.value_at_quantile(0.999),
        max_us: latency.max(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> DiskBenchConfig {
        DiskBenchConfig {
            dir: dir.to_path_buf(),
            block_size: 4096,
            qd: 2,
            fsync: FsyncPolicy::Every,
            duration: Duration::from_millis(200),
            file_size: 1 << 20,
            backend: BackendChoice::Auto,
            layout: DiskLayout::Prewritten,
        }
    }

    #[test]
    fn validate_rejects_bad_configurations() {
        let dir = Path::new("/nonexistent");
        assert!(validate(&config(dir)).is_ok());
        let cases = [
            DiskBenchConfig {
                block_size: 0,
                ..config(dir)
            },
            DiskBenchConfig {
                block_size: 1000,
                ..config(dir)
            },
            DiskBenchConfig {
                block_size: BLOCK_BYTES_MAX * 2,
                file_size: u64::MAX,
                ..config(dir)
            },
            DiskBenchConfig {
                qd: 0,
                ..config(dir)
            },
            DiskBenchConfig {
                qd: QUEUE_DEPTH_MAX + 1,
                ..config(dir)
            },
            DiskBenchConfig {
                block_size: BLOCK_BYTES_MAX,
                qd: 32,
                file_size: u64::MAX,
                ..config(dir)
            },
            DiskBenchConfig {
                file_size: 4096,
                ..config(dir)
            },
            DiskBenchConfig {
                duration: Duration::ZERO,
                ..config(dir)
            },
            DiskBenchConfig {
                duration: DURATION_MAX * 2,
                ..config(dir)
            },
        ];
        for case in cases {
            assert!(validate(&case).is_err(), "accepted {case:?}");
        }
    }

    /// A failing write must come back as a clear error naming the write (not the fsync it
    /// cancels), after every op in flight has been reaped. Here the kernel refuses the
    /// O_DIRECT write because its length (4097 bytes) is not aligned.
    ///
    /// The story: with `IOSQE_CQE_SKIP_SUCCESS` on the write, a failed write cancels its
    /// linked fsync *without* posting the fsync's completion. The first version waited for
    /// that completion and hung forever. The run happens on its own thread so a regression
    /// fails this test within [`REFUSED_WRITE_TIME_MAX`] instead of hanging it.
    #[test]
    fn a_refused_write_is_reported_and_the_ring_drained() {
        const REFUSED_WRITE_TIME_MAX: Duration = Duration::from_secs(60);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("refused");
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let block_size = 4097;
        file.set_len(block_size * 8).unwrap();
        let (sender, receiver) = std::sync::mpsc::channel();
        // Not a scoped thread: a hung run must not keep the test from failing.
        std::thread::spawn(move || {
            for fsync in [FsyncPolicy::Every, FsyncPolicy::None] {
                let work = Workload {
                    file: &file,
                    block_size,
                    qd: 4,
                    fsync,
                    duration: Duration::from_secs(5),
                    file_size: block_size * 8,
                    align: 4096,
                    filesystem: "test",
                };
                let uring = match open_ring(work.qd) {
                    Ok(mut ring) => {
                        Some(format!("{:#}", run_io_uring(&mut ring, &work).unwrap_err()))
                    }
                    Err(_) => None,
                };
                let pwrite = format!("{:#}", run_pwrite(&work).unwrap_err());
                sender.send((fsync, uring, pwrite)).unwrap();
            }
        });
        for _ in 0..2 {
            let (fsync, uring, pwrite) = receiver
                .recv_timeout(REFUSED_WRITE_TIME_MAX)
                .expect("the run with a refused write did not end");
            match uring {
                Some(err) => {
                    assert!(
                        err.starts_with("write of the block at position "),
                        "{fsync:?}: {err}"
                    );
                    assert!(err.contains("Invalid argument"), "{fsync:?}: {err}");
                    assert!(
                        err.contains("rejected the direct I/O request"),
                        "{fsync:?}: {err}"
                    );
                }
                None => eprintln!("SKIPPED (io_uring part): io_uring unavailable"),
            }
            assert!(pwrite.contains("Invalid argument"), "{fsync:?}: {pwrite}");
        }
    }

    /// Both engines on the real disk, in-process: every write and fsync completes, the
    /// counts agree with each other, and the file is gone afterwards.
    #[test]
    fn both_backends_write_and_clean_up() {
        let dir = tempfile::tempdir().unwrap();
        for backend in [BackendChoice::Auto, BackendChoice::Pwrite] {
            for fsync in [FsyncPolicy::Every, FsyncPolicy::None] {
                let report = run(&DiskBenchConfig {
                    backend,
                    fsync,
                    ..config(dir.path())
                })
                .unwrap();
                assert!(report.ops > 0, "{report:?}");
                assert_eq!(report.bytes, report.ops * 4096);
                match fsync {
                    FsyncPolicy::Every => assert_eq!(report.fsyncs, report.ops),
                    FsyncPolicy::None => assert_eq!(report.fsyncs, 0),
                }
                assert!(report.p50_us <= report.p99_us && report.p99_us <= report.max_us);
                assert_eq!(report.layout, DiskLayout::Prewritten);
                assert_eq!(report.file_size, 1 << 20);
                // Every write submitted completed, so the wraps follow from the count.
                assert_eq!(
                    report.wraps,
                    (report.ops - 1) / ((1 << 20) / 4096),
                    "{report:?}"
                );
                if backend == BackendChoice::Pwrite {
                    assert_eq!(report.backend, Backend::Pwrite);
                }
                let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
                assert!(left.is_empty(), "bench file left behind: {left:?}");
            }
        }
    }

    #[test]
    fn wraps_count_every_pass_after_the_first() {
        let measurement = |submitted| Measurement {
            ops: submitted,
            fsyncs: 0,
            submitted,
            latency_us: new_histogram().unwrap(),
            elapsed: Duration::ZERO,
        };
        for (submitted, wraps) in [(0, 0), (1, 0), (4, 0), (5, 1), (8, 1), (9, 2)] {
            assert_eq!(measurement(submitted).wraps(4), wraps, "{submitted} writes");
        }
        assert_eq!(measurement(9).wraps(0), 0);
    }

    #[test]
    fn a_fallocated_file_is_sized_for_the_duration_within_the_free_space() {
        let gb = 1_000_000_000;
        // 4 GB/s for 2 s, well within the free space.
        assert_eq!(
            fallocated_file_bytes(1 << 20, Duration::from_secs(2), 100 * gb),
            8 * gb
        );
        // Capped at half the free space.
        assert_eq!(
            fallocated_file_bytes(1 << 20, Duration::from_secs(10), 20 * gb),
            10 * gb
        );
        // Never below the requested size, even past the cap (the caller checks the space).
        assert_eq!(
            fallocated_file_bytes(3 * gb, Duration::from_secs(10), 4 * gb),
            3 * gb
        );
        assert_eq!(
            fallocated_file_bytes(1 << 30, Duration::from_millis(1), 100 * gb),
            1 << 30
        );
        // The longest run: 4 GB/s for a day, 345.6 TB.
        assert_eq!(
            fallocated_file_bytes(1 << 20, DURATION_MAX, u64::MAX),
            345_600 * gb
        );
        // Past u64 the product saturates instead of overflowing, then the cap applies.
        assert_eq!(
            fallocated_file_bytes(1 << 20, Duration::MAX, u64::MAX),
            (u64::MAX as f64 * FALLOCATED_FREE_SHARE) as u64
        );
    }

    /// `--layout fallocated` on the real disk: the file is made larger than asked (sized
    /// for the duration), the writes never wrap into written blocks, the report says which
    /// layout it measured, and the file is gone afterwards.
    #[test]
    fn a_fallocated_run_does_not_wrap_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        for backend in [BackendChoice::Auto, BackendChoice::Pwrite] {
            let config = DiskBenchConfig {
                backend,
                layout: DiskLayout::Fallocated,
                ..config(dir.path())
            };
            let report = match run(&config) {
                Ok(report) => report,
                Err(e) if format!("{e:#}").contains("does not support") => {
                    eprintln!("SKIPPED: {e:#}");
                    return;
                }
                Err(e) => panic!("{e:#}"),
            };
            assert_eq!(report.layout, DiskLayout::Fallocated);
            assert!(report.ops > 0, "{report:?}");
            assert_eq!(report.wraps, 0, "{report:?}");
            assert!(report.file_size >= config.file_size, "{report:?}");
            assert_eq!(report.file_size % config.block_size, 0);
            assert!(
                report.bytes <= report.file_size,
                "wrote past the file without wrapping? {report:?}"
            );
            let mut text = Vec::new();
            report.write_text(&mut text).unwrap();
            let text = String::from_utf8(text).unwrap();
            assert!(text.contains("fallocated, not written"), "{text}");
            let json = serde_json::to_value(&report).unwrap();
            assert_eq!(json["layout"], "fallocated");
            assert_eq!(json["wraps"], 0);
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert!(left.is_empty(), "bench file left behind: {left:?}");
        }
    }
}
