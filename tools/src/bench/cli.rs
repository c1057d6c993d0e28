//! The clap declarations of `quire bench wal` and `quire bench node` (kept next to the
//! benchmarks; [`crate::cli::BenchCommand`] refers to them).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::logs::{LogsBenchConfig, LogsLayout};
use super::node::NodeBenchConfig;
use super::wal::{WalBenchConfig, WalIo, WalSpareFill};
use crate::cli::FormatArgs;
use crate::output::OutputFormat;
use crate::units::{parse_duration, parse_size};

/// Arguments of `quire bench wal`.
#[derive(Debug, Clone, Args)]
pub struct WalBenchArgs {
    /// Directory on the file system to measure; a temporary WAL directory is created in it
    /// and removed at the end. Default: the system temp directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Payload bytes per event.
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "1KiB")]
    pub event_size: u64,

    /// Concurrent appenders, each appending one event and awaiting its durability.
    #[arg(long, value_name = "N", default_value_t = super::wal::APPENDERS_DEFAULT)]
    pub appenders: u32,

    /// How long to measure.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub duration: Duration,

    /// The WAL's disk backend: auto is io_uring, falling back to sync where refused.
    #[arg(long, value_enum, default_value_t)]
    pub io: WalIo,

    /// Also run a one-appender baseline (one fdatasync per event) and print the ratio.
    /// On by default with --format text.
    #[arg(long, conflicts_with = "no_baseline")]
    pub baseline: bool,

    /// Skip the baseline.
    #[arg(long)]
    pub no_baseline: bool,

    /// How long the baseline runs.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "3s")]
    pub baseline_duration: Duration,

    /// The WAL's segment size.
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "256MiB")]
    pub segment_size: u64,

    /// The WAL's most bytes per batch (one write).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "1MiB")]
    pub batch_bytes_max: u64,

    /// The WAL's batch window: how long a batch may wait for concurrent appenders on an
    /// idle disk, microseconds.
    #[arg(long, value_name = "US", default_value_t = 200)]
    pub batch_window_us: u64,

    /// Alternate the WAL run with raw-disk runs (`bench disk`, the event size as block size,
    /// qd 1, an fdatasync per write, same duration) and report the ratio of their MB/s.
    #[arg(long)]
    pub vs_disk: bool,

    /// Retention: keep about this many bytes of log, trimming whole segments below it as
    /// the run goes (every 20 ms), so that segment files are reused as spares. The report
    /// then gives the bytes written per payload byte. Off by default (the log only grows).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub retain: Option<u64>,

    /// How the WAL prepares a fresh spare segment: zeros written over a fallocated file
    /// (quire-node's default), or the fallocate alone (appends then write into unwritten
    /// extents). For comparing the two ways to grow a log on a file system.
    #[arg(long, value_enum, default_value_t = WalSpareFill::Zeros)]
    pub spare_fill: WalSpareFill,

    /// With --vs-disk: how many WAL + disk rounds (the report gives the median ratio).
    #[arg(long, value_name = "N", default_value_t = 3, requires = "vs_disk")]
    pub rounds: u32,

    #[command(flatten)]
    pub format: FormatArgs,
}

impl WalBenchArgs {
    /// The benchmark configuration these arguments describe.
    pub fn to_config(&self) -> WalBenchConfig {
        let baseline = if self.no_baseline {
            false
        } else {
            self.baseline || self.format.format == OutputFormat::Text
        };
        WalBenchConfig {
            dir: self.dir.clone(),
            event_size: self.event_size,
            appenders: self.appenders,
            duration: self.duration,
            io: self.io,
            baseline: baseline.then_some(self.baseline_duration),
            segment_bytes: self.segment_size,
            batch_bytes_max: self.batch_bytes_max,
            batch_window_us: self.batch_window_us,
            vs_disk: self.vs_disk.then_some(self.rounds),
            retain_bytes: self.retain,
            spare_fill: self.spare_fill,
        }
    }
}

/// Arguments of `quire bench node`.
#[derive(Debug, Clone, Args)]
pub struct NodeBenchArgs {
    /// A running quire-node's store address (host:port). It is fenced with a new epoch and
    /// written to: never a store a cluster uses. Default: start a node in this process on
    /// a temporary directory.
    #[arg(long, value_name = "ADDR")]
    pub store: Option<String>,

    /// The running node's metrics address (host:port), to count its fdatasyncs.
    #[arg(long, value_name = "ADDR", requires = "store")]
    pub metrics: Option<String>,

    /// Where the in-process node's temporary data directory goes (without --store).
    #[arg(long, value_name = "DIR", conflicts_with = "store")]
    pub dir: Option<PathBuf>,

    /// The in-process node's WAL backend (without --store).
    #[arg(long, value_enum, default_value_t, conflicts_with = "store")]
    pub io: WalIo,

    /// TCP connections the appends are spread over, in turn (the store has one log: an
    /// append that overtakes its predecessor is refused and resent).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub connections: u32,

    /// Appends unanswered at most (pipelining).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub in_flight: u32,

    /// Events per append.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub batch: u32,

    /// Payload bytes per event.
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "1KiB")]
    pub event_size: u64,

    /// How long to measure.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub duration: Duration,

    #[command(flatten)]
    pub format: FormatArgs,
}

impl NodeBenchArgs {
    /// The benchmark configuration these arguments describe.
    pub fn to_config(&self) -> NodeBenchConfig {
        NodeBenchConfig {
            store: self.store.clone(),
            metrics: self.metrics.clone(),
            dir: self.dir.clone(),
            io: self.io,
            connections: self.connections,
            in_flight: self.in_flight,
            batch: self.batch,
            event_size: self.event_size,
            duration: self.duration,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{BenchCommand, Cli, Command};
    use clap::Parser;

    fn bench_wal(args: &[&str]) -> WalBenchConfig {
        let cli = Cli::try_parse_from(["quire", "bench", "wal"].iter().chain(args)).unwrap();
        match cli.command {
            Command::Bench(BenchCommand::Wal(a)) => a.to_config(),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn bench_wal_defaults_match_the_readme_command() {
        let c = bench_wal(&[]);
        assert_eq!(c.event_size, 1024);
        assert_eq!(c.appenders, 64);
        assert_eq!(c.duration, Duration::from_secs(10));
        assert_eq!(
            c.baseline,
            Some(Duration::from_secs(3)),
            "text output runs the baseline"
        );
        let defaults = WalBenchConfig::default();
        assert_eq!(c.segment_bytes, defaults.segment_bytes);
        assert_eq!(c.batch_bytes_max, defaults.batch_bytes_max);
        assert_eq!(c.batch_window_us, defaults.batch_window_us);
    }

    #[test]
    fn bench_wal_baseline_follows_the_format_unless_asked() {
        assert_eq!(bench_wal(&["--format", "json"]).baseline, None);
        assert!(bench_wal(&["--format", "json", "--baseline"])
            .baseline
            .is_some());
        assert_eq!(bench_wal(&["--no-baseline"]).baseline, None);
        let c = bench_wal(&["--event-size", "64KiB", "--appenders", "1", "--io", "sync"]);
        assert_eq!((c.event_size, c.appenders, c.io), (65536, 1, WalIo::Sync));
    }

    #[test]
    fn bench_wal_vs_disk_takes_rounds() {
        assert_eq!(bench_wal(&[]).vs_disk, None);
        assert_eq!(bench_wal(&["--vs-disk"]).vs_disk, Some(3));
        assert_eq!(bench_wal(&["--vs-disk", "--rounds", "5"]).vs_disk, Some(5));
        assert!(Cli::try_parse_from(["quire", "bench", "wal", "--rounds", "5"]).is_err());
    }

    #[test]
    fn bench_node_metrics_needs_a_store() {
        assert!(Cli::try_parse_from(["quire", "bench", "node", "--metrics", "x:1"]).is_err());
        let cli = Cli::try_parse_from([
            "quire",
            "bench",
            "node",
            "--store",
            "h:1",
            "--metrics",
            "h:2",
            "--batch",
            "64",
        ])
        .unwrap();
        let Command::Bench(BenchCommand::Node(a)) = cli.command else {
            panic!("not bench node");
        };
        let c = a.to_config();
        assert_eq!(c.store.as_deref(), Some("h:1"));
        assert_eq!(c.batch, 64);
    }
}

/// Arguments of `quire bench logs`.
#[derive(Debug, Clone, Args)]
pub struct LogsBenchArgs {
    /// Directory on the file system to measure (a temporary directory is made in it and
    /// removed). Default: the system temp directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Numbers of busy logs, comma-separated: one set of rows each.
    #[arg(
        long,
        value_name = "N,..",
        value_delimiter = ',',
        default_value = "1,8,64"
    )]
    pub logs: Vec<u32>,

    /// Closed-loop appenders per log.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub appenders: u32,

    /// Payload bytes per event.
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "1KiB")]
    pub event_size: u64,

    /// How long each row runs.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5s")]
    pub duration: Duration,

    /// Layouts to run, comma-separated (default: all four).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub layouts: Vec<LogsLayout>,

    /// Segment size per log (and each raw file's size).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "16MiB")]
    pub segment_size: u64,

    /// The WALs' disk backend.
    #[arg(long, value_enum, default_value_t)]
    pub io: WalIo,

    #[command(flatten)]
    pub format: FormatArgs,
}

impl LogsBenchArgs {
    /// The benchmark configuration these arguments describe.
    pub fn to_config(&self) -> LogsBenchConfig {
        LogsBenchConfig {
            dir: self.dir.clone().unwrap_or_else(std::env::temp_dir),
            logs: self.logs.clone(),
            appenders_per_log: self.appenders,
            event_size: self.event_size,
            duration: self.duration,
            layouts: if self.layouts.is_empty() {
                LogsLayout::ALL.to_vec()
            } else {
                self.layouts.clone()
            },
            segment_size: self.segment_size,
            io: self.io,
        }
    }
}
