//! The command line of `quire-node` (clap derive), kept in the library so that the `quire`
//! CLI can carry the same `init` and `run` commands (`quire node init|run`) over the same
//! code: embed [`InitArgs`] / [`RunArgs`] in its own subcommands and call
//! [`crate::init`] / [`crate::run`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use quire_net::layers::{PrintFormat, SettingFlags};
use serde::Deserialize;

use crate::config::NodeSettings;

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
    /// counts toward a quorum, even once a voter-set change names it (a read-only copy).
    /// A store replacing a failed disk is initialised without it and made a voter with
    /// `quire cluster replace-store`.
    #[arg(long)]
    pub learner: bool,
}

/// `quire-node run`. Every setting is a flag here (`--connections-max 5000`), a
/// `QUIRE_NODE_*` variable (`QUIRE_NODE_CONNECTIONS_MAX=5000`) and a key of the `--config`
/// TOML file (`[limits] connections_max = 5000`); flag beats variable beats file beats
/// default. Durations take units (`10s`), sizes may (`64MiB`).
#[derive(Clone, Debug, Default, Args)]
pub struct RunArgs {
    /// Every setting, as given on the command line ([`crate::config::schema`] lists them).
    #[command(flatten)]
    pub settings: SettingFlags<NodeSettings>,
    /// A TOML file with settings (docs/operations.md lists the keys) [env: QUIRE_NODE_CONFIG].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print every effective setting and where it came from (default, file, env, flag), then
    /// exit without serving (non-zero if the settings are not valid).
    #[arg(long)]
    pub print_config: bool,
    /// How --print-config writes: text or json.
    #[arg(
        long,
        value_enum,
        value_name = "FORMAT",
        default_value_t,
        requires = "print_config"
    )]
    pub format: PrintFormat,
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
