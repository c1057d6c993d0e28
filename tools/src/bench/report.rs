//! `quire bench report`: every benchmark in one run on one file system, as one Markdown
//! table with each figure's ratio to the raw disk.
//!
//! In order, all under `--dir`: `bench disk` (O_DIRECT writes of 64 KiB and 1 MiB, an
//! fdatasync behind each), `bench wal` (1 KiB and 16 KiB events, 64 appenders, group
//! commit), `bench node` (a node in this process, 1 KiB and 16 KiB events over TCP, 64
//! events per append), and `bench cluster` (a local cluster of 3 stores and 2 brokers,
//! [`crate::cluster::up::LocalCluster`], 4 producers, 1 KiB and 16 KiB messages). Each run
//! lasts `--duration` (default 4 s): under a minute in all on the development machine (40 s).
//!
//! The **ratio** of a row is its payload MB/s over the best raw-disk MB/s of the run (the
//! physical limit with an fdatasync per write). The machine section gives the kernel
//! (`uname -r`), the CPU count, the file system and the direct-I/O alignment (logical block
//! size) the disk benchmark found.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser};
use serde::Serialize;

use crate::bench::cluster::ClusterBenchConfig;
use crate::bench::disk::{BackendChoice, DiskBenchConfig, DiskLayout, FsyncPolicy};
use crate::cli::{BenchCommand, Cli, Command, FormatArgs};
use crate::cluster::master::MasterBound;
use crate::cluster::up::{ClusterSpec, LocalCluster, STOP_WAIT_DEFAULT};
use crate::output::Report;
use crate::units::parse_duration;

/// Longest wait for the report's cluster to name a master.
const CLUSTER_READY_WAIT: Duration = Duration::from_secs(60);

/// Arguments of `quire bench report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Directory on the file system to measure (created if missing); every benchmark writes
    /// below it and removes what it wrote.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,

    /// Also write the Markdown report to FILE.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// How long each of the eight runs measures.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "4s")]
    pub duration: Duration,

    #[command(flatten)]
    pub format: FormatArgs,
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `disk`, `wal`, `node`, `cluster`.
    pub bench: &'static str,
    /// What ran (sizes, concurrency).
    pub setup: String,
    /// Payload MB/s (10^6 B).
    pub mb_per_s: f64,
    /// Writes (disk) or events per second.
    pub ops_per_s: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: u64,
    /// `mb_per_s` over the best raw-disk MB/s.
    pub ratio_to_disk: f64,
}

/// The machine the report ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub kernel: String,
    pub cpus: usize,
    pub filesystem: String,
    pub logical_block_bytes: u64,
    pub dir: PathBuf,
}

/// The result of `quire bench report`.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub machine: Machine,
    pub disk_mb_per_s: f64,
    pub rows: Vec<Row>,
}

impl BenchReport {
    /// The report as Markdown.
    #[must_use]
    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut s = String::from("# Quire benchmark report\n\n");
        s.push_str(&format!(
            "Kernel {}, {} CPUs, file system {} ({}), logical block {} bytes.\n\n",
            m.kernel,
            m.cpus,
            m.filesystem,
            m.dir.display(),
            m.logical_block_bytes
        ));
        s.push_str(&format!(
            "Ratio: payload MB/s over the best raw-disk MB/s ({:.1} MB/s, an fdatasync behind each write). MB = 10^6 bytes.\n\n",
            self.disk_mb_per_s
        ));
        s.push_str("| bench | setup | MB/s | ops/s | p99 µs | ratio to disk |\n");
        s.push_str("| --- | --- | ---: | ---: | ---: | ---: |\n");
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {} | {:.1} | {:.0} | {} | {:.2} |\n",
                r.bench, r.setup, r.mb_per_s, r.ops_per_s, r.p99_us, r.ratio_to_disk
            ));
        }
        s
    }
}

impl Report for BenchReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self.markdown().as_bytes())
    }
}

/// Runs every benchmark (see the module docs) and assembles the report; writes it to
/// `args.out` too when given.
///
/// # Errors
/// Any benchmark failing (its error says which), or the report file not written.
pub fn run(args: &ReportArgs) -> anyhow::Result<BenchReport> {
    if args.duration.is_zero() {
        bail!("--duration must be above 0");
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let secs = format!("{}ms", args.duration.as_millis());
    let mut rows = Vec::new();
    let mut alignment = 0;
    let mut filesystem = String::new();
    for block in [64 * 1024u64, 1024 * 1024] {
        eprintln!("bench report: disk, {} KiB writes", block / 1024);
        let r = crate::bench::disk::run(&DiskBenchConfig {
            dir: args.dir.clone(),
            block_size: block,
            qd: 1,
            fsync: FsyncPolicy::Every,
            duration: args.duration,
            file_size: 256 * 1024 * 1024,
            backend: BackendChoice::Auto,
            layout: DiskLayout::Prewritten,
        })
        .context("bench disk")?;
        alignment = r.alignment;
        filesystem.clone_from(&r.filesystem);
        rows.push(row(
            "disk",
            format!("{} KiB writes, qd 1, fdatasync each", block / 1024),
            r.mb_per_s,
            r.ops_per_s,
            r.p99_us,
        ));
    }
    let dir = args.dir.to_string_lossy().into_owned();
    for size in ["1KiB", "16KiB"] {
        eprintln!("bench report: wal, {size} events");
        let config = match parse(&[
            "bench",
            "wal",
            "--dir",
            &dir,
            "--event-size",
            size,
            "--appenders",
            "64",
            "--duration",
            &secs,
            "--no-baseline",
            "--segment-size",
            "64MiB",
        ])? {
            Command::Bench(BenchCommand::Wal(a)) => a.to_config(),
            _ => bail!("bench wal arguments parsed as another command"),
        };
        let r = crate::bench::wal::run(&config).context("bench wal")?;
        rows.push(row(
            "wal",
            format!("{size} events, 64 appenders, group commit"),
            r.run.mb_per_s,
            r.run.ops_per_s,
            r.run.p99_us,
        ));
    }
    for size in ["1KiB", "16KiB"] {
        eprintln!("bench report: node, {size} events");
        let config = match parse(&[
            "bench",
            "node",
            "--dir",
            &dir,
            "--event-size",
            size,
            "--batch",
            "64",
            "--duration",
            &secs,
        ])? {
            Command::Bench(BenchCommand::Node(a)) => a.to_config(),
            _ => bail!("bench node arguments parsed as another command"),
        };
        let r = crate::bench::node::run(&config).context("bench node")?;
        rows.push(row(
            "node",
            format!("{size} events, 64 per append, 1 connection"),
            r.mb_per_s,
            r.events_per_s,
            r.p99_us,
        ));
    }
    rows.extend(cluster_rows(&args.dir, args.duration)?);
    let disk_mb_per_s = rows
        .iter()
        .filter(|r| r.bench == "disk")
        .map(|r| r.mb_per_s)
        .fold(0.0, f64::max);
    for r in &mut rows {
        r.ratio_to_disk = if disk_mb_per_s > 0.0 {
            r.mb_per_s / disk_mb_per_s
        } else {
            0.0
        };
    }
    let report = BenchReport {
        machine: Machine {
            kernel: kernel(),
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            filesystem,
            logical_block_bytes: alignment,
            dir: args.dir.clone(),
        },
        disk_mb_per_s,
        rows,
    };
    if let Some(out) = &args.out {
        std::fs::write(out, report.markdown())
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(report)
}

fn cluster_rows(dir: &Path, duration: Duration) -> anyhow::Result<Vec<Row>> {
    eprintln!("bench report: starting a cluster (3 stores, 2 brokers)");
    let cluster_dir = tempfile::Builder::new()
        .prefix("quire-bench-cluster-")
        .tempdir_in(dir)
        .context("creating the cluster directory")?;
    let mut cluster = LocalCluster::start(&ClusterSpec {
        dir: cluster_dir.path().to_owned(),
        stores: 3,
        brokers: 2,
        base_port: None,
        die_with_parent: true,
        tls: false,
    })?;
    cluster.wait_ready(CLUSTER_READY_WAIT)?;
    let mut rows = Vec::new();
    for size in [1024usize, 16 * 1024] {
        eprintln!("bench report: cluster, {} KiB messages", size / 1024);
        let r = crate::bench::cluster::run(&ClusterBenchConfig {
            brokers: cluster.broker_addrs(),
            connect: MasterBound {
                timeout: CLUSTER_READY_WAIT,
                flag: None,
                tls: None,
                sasl: None,
            },
            topic: "bench".into(),
            producers: 4,
            event_size: size,
            batch: 256,
            in_flight: 8,
            linger: Duration::from_millis(5),
            duration,
            warmup: Duration::ZERO,
            rate: None,
            hdr_out: None,
            cluster_dir: None,
        })
        .context("bench cluster")?;
        rows.push(row(
            "cluster",
            format!("{} KiB messages, 4 producers, 3 stores", size / 1024),
            r.mb_per_s,
            r.ops_per_s,
            r.p99_us,
        ));
    }
    cluster.stop(STOP_WAIT_DEFAULT);
    Ok(rows)
}

fn row(bench: &'static str, setup: String, mb_per_s: f64, ops_per_s: f64, p99_us: u64) -> Row {
    Row {
        bench,
        setup,
        mb_per_s,
        ops_per_s,
        p99_us,
        ratio_to_disk: 0.0,
    }
}

/// Parses `quire <args>` with the real declarations, so the report runs each benchmark
/// exactly as its own command would.
fn parse(args: &[&str]) -> anyhow::Result<Command> {
    let cli = Cli::try_parse_from(std::iter::once("quire").chain(args.iter().copied()))
        .context("building a benchmark's arguments")?;
    Ok(cli.command)
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}
