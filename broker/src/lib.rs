//! quire-broker: the master/slave broker.
//!
//! - [`core`]: the replication logic as pure state machines (events in, commands out, no
//!   I/O): the master's quorum counting and stabilization, a slave's takeover, a slave
//!   following the master's stream. The simulation (quire-sim) reuses them.
//! - [`state`]: the broker state (topics, cursors, the idempotent-producer table) as a
//!   deterministic function of the stabilized events.
//! - [`server`]: the network and disk layer around them — [`Broker`].
//! - [`durable`]: the data directory (epoch counter, cluster file, lock).
//! - [`config`], [`metrics`]: settings and `/metrics`.
//!
//! # Embedding
//! `quire-broker`'s `main` is `quire_broker::main_with(Cli::parse())`; the `quire` CLI can
//! carry the same command by embedding [`RunArgs`] and calling [`run`]. Tests and tools can
//! start a [`Broker`] in their own runtime with [`Broker::start`].

pub mod config;
pub mod core;
pub mod durable;
pub mod engine;
pub mod metrics;
pub mod retention;
pub mod security;
pub mod server;
pub mod state;

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};

pub use config::{BrokerConfig, LogFormat, RunArgs};
pub use server::Broker;

/// `quire-broker`: the Quire message broker.
#[derive(Debug, Parser)]
#[command(
    name = "quire-broker",
    version = quire_net::build_info::VERSION_LINE,
    about = "Quire broker: master/slave message broker over quorum-replicated event stores"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a broker (it starts as a slave; the cluster elects a master).
    Run(RunArgs),
}

/// Runs a parsed `quire-broker` command line.
///
/// # Errors
/// As [`run`].
pub fn main_with(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run(args),
    }
}

/// `quire-broker run`: resolves the settings, starts logging and a Tokio runtime, serves
/// until SIGINT or SIGTERM. With `--print-config` it prints the effective settings and
/// their sources on stdout instead and returns (an error if they are not valid).
/// Deprecated spellings are logged as warnings once logging is up.
///
/// Prints `listening on ADDR` (and `metrics on ADDR`, `kafka on ADDR`) on stdout once bound, so scripts and
/// tests started with port 0 can find the broker.
///
/// # Errors
/// Bad settings, an unusable data directory, an address that cannot be bound.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let env = quire_net::layers::process_env(config::ENV_PREFIX)?;
    let resolved = config::resolve(&args, &env)?;
    if args.print_config {
        resolved.print(
            args.format,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        )?;
        BrokerConfig::from_resolved(&resolved)?;
        return Ok(());
    }
    let config = BrokerConfig::from_resolved(&resolved)?;
    init_logging(config.log_format);
    for warning in &resolved.warnings {
        tracing::warn!("{warning}");
    }
    if !quire_net::return_large_buffers_to_the_os() {
        tracing::debug!("could not pin malloc's mmap threshold");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("quire-broker")
        .build()
        .context("starting the Tokio runtime")?;
    runtime.block_on(async move {
        let broker = Broker::start(config).await?;
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "listening on {}", broker.local_addr())?;
            if let Some(m) = broker.metrics_addr() {
                writeln!(out, "metrics on {m}")?;
            }
            if let Some(k) = broker.kafka_addr() {
                writeln!(out, "kafka on {k}")?;
            }
            out.flush()?;
        }
        quire_net::until_shutdown(|| broker.reload_tls())
            .await
            .context("waiting for a signal")?;
        tracing::info!("signal received: shutting down");
        broker.shutdown().await;
        Ok(())
    })
}

/// Installs the global `tracing` subscriber on stderr (filter from `RUST_LOG`, default
/// `info`). Does nothing if one is installed already.
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
