//! The `quire` command line, declared with clap's derive API: every subcommand, its
//! arguments, their defaults and their help text. Nothing here runs anything; `crate::run`
//! dispatches a parsed [`Cli`] to the module that does the work.
//!
//! # Adding a command
//! 1. Add a variant to [`Command`] (or to a group such as [`BenchCommand`]) with a doc
//!    comment (it becomes the help text) and an `Args` struct below.
//! 2. Parse quantities with [`crate::units`] (`value_parser = parse_size` /
//!    `parse_duration`) and take `#[command(flatten)] format: FormatArgs` if it prints
//!    results.
//! 3. Put the work in its own module with a plain config struct (no clap types) and add
//!    the dispatch line to `crate::run`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};

use crate::bench::disk::{BackendChoice, DiskBenchConfig, DiskLayout, FsyncPolicy};
use crate::output::OutputFormat;
use crate::units::{parse_duration, parse_size};

/// Quire: a replicated message broker. This is its command line.
///
/// Durations take plain seconds or a unit (5, 5s, 500ms, 2m); sizes take plain bytes or a
/// unit (4096, 64KiB, 1MiB; KB/MB/GB are powers of 1000). Results go to stdout (`quire
/// produce` prints acknowledgements there only with --format jsonl, its summary always
/// to stderr), logs and errors to stderr; a failed command exits non-zero.
#[derive(Debug, Parser)]
#[command(
    name = "quire",
    version = quire_net::build_info::VERSION_LINE,
    propagate_version = true
)]
pub struct Cli {
    /// More log output on stderr (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Only warnings and errors on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,

    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a local cluster, produce and consume through it, kill the master partway,
    /// and check that every acknowledged message was consumed exactly once, in order.
    Demo(crate::demo::DemoArgs),

    /// Measure the raw disk, the WAL, a node and a cluster (`report` runs them all with ratios to the disk).
    #[command(subcommand)]
    Bench(BenchCommand),

    /// An event store (the same commands and arguments as `quire-node`): `init`, `run`.
    #[command(subcommand)]
    Node(quire_node::Command),

    /// A broker (the same commands and arguments as `quire-broker`): `run`.
    #[command(subcommand)]
    Broker(quire_broker::Command),

    /// Send messages to a topic: one per stdin line, or --count N generated ones.
    Produce(crate::produce::ProduceArgs),

    /// Read a topic's messages in log order.
    Consume(crate::consume::ConsumeArgs),

    /// Run and steer a cluster: `up`/`down` (a local one), `status`, `handoff`, `audit`.
    #[command(subcommand)]
    Cluster(crate::cluster::ClusterCommand),

    /// The cluster's topics: `create`, `delete`, `list`.
    #[command(subcommand)]
    Topic(crate::topic::TopicCommand),

    /// The cluster's users (SCRAM-SHA-256 logins): `add`, `remove`, `list`.
    #[command(subcommand)]
    User(crate::access::UserCommand),

    /// The cluster's ACL entries (who may produce, consume, commit, administer): `add`,
    /// `remove`, `list`. Enforced by brokers with authorization = "acl".
    #[command(subcommand)]
    Acl(crate::access::AclCommand),

    /// Inspect, verify and repair a store's write-ahead log offline.
    #[command(subcommand)]
    Wal(crate::wal::args::WalCommand),

    /// Named connection settings (brokers, connect timeout) so client commands need no
    /// --brokers: `create`, `use`, `list`, `show`, `delete`. Stored in
    /// $QUIRE_CONFIG_DIR/profiles.toml (default ~/.config/quire/profiles.toml).
    #[command(subcommand)]
    Profile(crate::profile::ProfileCommand),

    /// Print a shell completion script to stdout, e.g. `quire completion bash >
    /// ~/.local/share/bash-completion/completions/quire`.
    Completion(crate::completion::CompletionArgs),

    /// Write the man pages: the top page to stdout, or one page per command with --dir.
    Man(crate::completion::ManArgs),
}

/// `quire bench ...`
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Raw O_DIRECT sequential writes through io_uring, the same job as
    /// `fio --ioengine=io_uring --direct=1 --rw=write --bs=B --iodepth=N [--fdatasync=1]`.
    ///
    /// Creates a file in DIR, writes it once with zeros, then rewrites it block by block
    /// for the given duration with QD writes in flight, wrapping at the end, and deletes
    /// it. Prints throughput (MB = 10^6 bytes), IOPS, fdatasyncs per second and op latency
    /// percentiles in microseconds.
    Disk(DiskBenchArgs),

    /// Produce-to-stabilized-ack throughput and latency of a running cluster (closed loop,
    /// or --rate for a fixed rate measured from each message's intended send time).
    Cluster(Box<crate::bench::cluster::ClusterBenchArgs>),

    /// Appends through quire-wal with N concurrent appenders (group commit): MB/s,
    /// events/s, fdatasyncs/s, append-to-durable latency, CPU per event; in text output
    /// also a one-appender baseline (one fdatasync per event) and the ratio.
    Wal(crate::bench::cli::WalBenchArgs),

    /// The disk layouts a store could give many logs (partitions), at 1, 8 and 64 busy
    /// logs: one shared WAL, a WAL per log, and raw per-log files with one fdatasync each
    /// per round against one file: events/s, fdatasyncs/s, latency, CPU per event.
    Logs(crate::bench::cli::LogsBenchArgs),

    /// Appends through a running quire-node (or one started in this process) over TCP, as
    /// a master does: events/s, MB/s, fdatasyncs/s, append-to-persisted latency.
    Node(crate::bench::cli::NodeBenchArgs),

    /// Every benchmark in one run on one file system (disk, wal, node, and a local cluster),
    /// as a Markdown table with each figure's ratio to the raw disk and the machine.
    Report(crate::bench::report::ReportArgs),
}

/// The `--format` option, for every command that prints results.
#[derive(Debug, Clone, Copy, Args)]
pub struct FormatArgs {
    /// Output format: text for people; json prints one JSON object on one line; jsonl one
    /// object per line (the same single line for commands with one result). QUIRE_FORMAT,
    /// when set, replaces the default.
    #[arg(
        short = 'f',
        long,
        value_enum,
        default_value_t,
        env = "QUIRE_FORMAT",
        hide_env = true
    )]
    pub format: OutputFormat,
}

/// Arguments of `quire bench disk`.
#[derive(Debug, Clone, Args)]
pub struct DiskBenchArgs {
    /// Directory on the file system to measure; a temporary file is created in it.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,

    /// Bytes per write; a multiple of the direct I/O alignment (at least 4096).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "256KiB")]
    pub block_size: u64,

    /// Writes in flight (io_uring queue depth).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub qd: u32,

    /// every: an fdatasync linked behind each write; none: no fdatasync while timing.
    #[arg(long, value_enum, default_value_t = FsyncPolicy::Every)]
    pub fsync: FsyncPolicy,

    /// How long to measure.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub duration: Duration,

    /// Size of the temporary file the writes cycle through. With --layout fallocated a
    /// lower bound: the file is sized so the run does not wrap (4 GB/s x duration, at most
    /// half the free space).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "1GiB")]
    pub file_size: u64,

    /// How the file is laid out before timing. prewritten: preallocated, zero-filled and
    /// fdatasynced, so the writes overwrite written blocks (fio on an existing file).
    /// fallocated: fallocate only, never written, so every write lands in an unwritten
    /// extent (fio on a new file; on ext4 each fdatasync then also commits the journal).
    #[arg(long, value_enum, default_value_t)]
    pub layout: DiskLayout,

    /// I/O path: auto uses io_uring and falls back to pwrite if the kernel refuses it.
    #[arg(long, value_enum, default_value_t)]
    pub backend: BackendChoice,

    #[command(flatten)]
    pub format: FormatArgs,
}

impl DiskBenchArgs {
    /// The benchmark configuration these arguments describe.
    pub fn to_config(&self) -> DiskBenchConfig {
        DiskBenchConfig {
            dir: self.dir.clone(),
            block_size: self.block_size,
            qd: self.qd,
            fsync: self.fsync,
            duration: self.duration,
            file_size: self.file_size,
            backend: self.backend,
            layout: self.layout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bench_disk_parses_units_and_defaults() {
        let cli = Cli::try_parse_from([
            "quire",
            "bench",
            "disk",
            "--dir",
            "/tmp",
            "--block-size",
            "64KiB",
            "--qd",
            "32",
            "--fsync",
            "none",
            "--duration",
            "500ms",
            "--format",
            "json",
        ])
        .unwrap();
        let Command::Bench(BenchCommand::Disk(args)) = cli.command else {
            panic!("parsed as another command");
        };
        assert_eq!(args.block_size, 64 * 1024);
        assert_eq!(args.qd, 32);
        assert_eq!(args.fsync, FsyncPolicy::None);
        assert_eq!(args.duration, Duration::from_millis(500));
        assert_eq!(args.file_size, crate::bench::disk::FILE_BYTES_DEFAULT);
        assert_eq!(args.format.format, OutputFormat::Json);
        assert_eq!(args.backend, BackendChoice::Auto);
        assert_eq!(args.layout, DiskLayout::Prewritten);
        assert_eq!(args.to_config().layout, DiskLayout::Prewritten);
    }

    #[test]
    fn bench_disk_takes_a_layout() {
        let parse = |layout: &str| {
            Cli::try_parse_from([
                "quire", "bench", "disk", "--dir", "/tmp", "--layout", layout,
            ])
        };
        for (name, layout) in [
            ("prewritten", DiskLayout::Prewritten),
            ("fallocated", DiskLayout::Fallocated),
        ] {
            let Command::Bench(BenchCommand::Disk(args)) = parse(name).unwrap().command else {
                panic!("parsed as another command");
            };
            assert_eq!(args.to_config().layout, layout);
            assert_eq!(layout.name(), name, "the CLI and JSON names agree");
        }
        let err = parse("sparse").unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        assert!(err.to_string().contains("fallocated"), "{err}");
    }

    #[test]
    fn bad_units_are_usage_errors_naming_the_value() {
        let err = Cli::try_parse_from([
            "quire",
            "bench",
            "disk",
            "--dir",
            "/tmp",
            "--block-size",
            "12q",
        ])
        .unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        let message = err.to_string();
        assert!(message.contains("--block-size"), "{message}");
        assert!(message.contains("unknown unit \"q\""), "{message}");
    }
}
