//! The command line of `quire-node` (clap derive), kept in the library so that the `quire`
//! CLI can carry the same `init` and `run` commands (`quire node init|run`) over the same
//! code: embed [`InitArgs`] / [`RunArgs`] in its own subcommands and call
//! [`crate::init`] / [`crate::run`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

/// `quire-node`: the Quire event store.
#[derive(Debug, Parser)]
#[command(
    name = "quire-node",
    version = quire_net::build_info::VERSION_LINE,
    about = "Quire event store: a WAL served over TCP"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new store directory with a fresh random identity.
    Init(InitArgs),
    /// Serve an initialised store directory.
    Run(RunArgs),
}

/// `quire-node init`.
#[derive(Clone, Debug, Args)]
pub struct InitArgs {
    /// The data directory to create (it must not exist or be empty).
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Create the store as a learner: it receives the log but never grants a fence nor
    /// counts toward a quorum (for a store replacing a failed disk).
    #[arg(long)]
    pub learner: bool,
}

/// `quire-node run`. Every setting may also come from the `--config` TOML file; a flag
/// given here overrides the file.
#[derive(Clone, Debug, Default, Args)]
pub struct RunArgs {
    /// The data directory, initialised by `quire-node init`.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address to serve the store protocol on (`host:port`; port 0 picks a free one, and
    /// the bound address is printed as `listening on ADDR`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// A TOML file with settings (keys: see node/README.md); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to serve Prometheus metrics on (`GET /metrics`); none by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Log line format (on stderr). Default: pretty.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
}

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}
