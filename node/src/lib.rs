//! quire-node: the event store server — one data directory's WAL served over TCP with the
//! store protocol of `quire-proto` (docs/protocol.md).
//!
//! What it owns:
//! - the store's replication rules as a pure state machine ([`replica`]): log matching
//!   against the accepted log, promised epoch, fences, learners, HWM;
//! - the store actor ([`store`], internal) that decides every append and fence in one
//!   order and owns the order of WAL submissions, answering after the covering fsync;
//! - connections ([`conn`], internal): frame decoding, bounded in-flight work per
//!   connection, a writer per connection with a bounded queue;
//! - the tail-cut mark ([`tail_cut`]): a store whose WAL recovery cut a torn tail reports
//!   it in its fence grants until it has caught up with a later master;
//! - the data directory's identity file ([`identity`]), the settings ([`config`]), the
//!   command line ([`cli`]) and the metrics endpoint ([`metrics`]);
//! - with the `failpoints` feature, fault injection into its WAL from the environment
//!   ([`failpoints`]), for the fault tests of the real binary.
//!
//! What it does not own: the on-disk log format, group commit and recovery (`quire-wal`),
//! and wire bytes (`quire-proto`).
//!
//! # Data directory
//!
//! ```text
//! DIR/identity        store_id, incarnation, role (see [`identity`])
//! DIR/tail_cut        present while the store carries a tail-cut mark (see [`tail_cut`])
//! DIR/wal/            the WAL: segments, promised_epoch, lock (see docs/format.md)
//! ```
//!
//! # Embedding
//!
//! `quire-node`'s `main` is `quire_node::main_with(Cli::parse())`; another binary can carry
//! the same commands by embedding [`cli::InitArgs`] and [`cli::RunArgs`] and calling
//! [`init`] and [`run`]. Tests and tools can start a [`Node`] in their own runtime.

pub mod cli;
pub mod config;
mod conn;
pub mod engine;
pub mod failpoints;
pub mod identity;
pub mod metrics;
mod node;
pub mod replica;
pub mod startup;
mod store;
pub mod submissions;
pub mod tail_cut;

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context};

pub use cli::{Cli, Command, InitArgs, LogFormat, RunArgs};
pub use config::NodeConfig;
pub use conn::serve_read;
pub use identity::{Identity, IdentityError, Role};
pub use node::{Node, LISTEN_BACKLOG};

/// Runs a parsed `quire-node` command line.
///
/// # Errors
/// As [`init`] or [`run`].
pub fn main_with(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Init(args) => {
            let id = init(&args)?;
            println!(
                "initialised store {:016x} incarnation {:016x} ({}) in {}",
                id.store_id.0,
                id.incarnation.0,
                id.role,
                args.data_dir.display()
            );
            Ok(())
        }
        Command::Run(args) => run(args),
    }
}

/// `quire-node init`: creates the data directory (it must not exist, or be empty) and
/// writes a new identity with a random `store_id` and `incarnation`, durably.
///
/// # Errors
/// A non-empty directory (it may hold a store: never re-initialise one), or I/O errors.
pub fn init(args: &InitArgs) -> anyhow::Result<Identity> {
    let dir = &args.data_dir;
    let role = if args.learner {
        Role::Learner
    } else {
        Role::Voter
    };
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if let Some(entry) = entries.next() {
                let name = entry
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .unwrap_or_else(|_| "?".into());
                bail!(
                    "refusing to init {}: the directory is not empty (it holds {name:?}). A store directory is initialised once; to serve it, use `quire-node run --data-dir {}`; to start afresh, pick an empty directory",
                    dir.display(),
                    dir.display()
                );
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                identity::fsync_dir(parent)?;
            }
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!("reading {}", dir.display())));
        }
    }
    let id = Identity::generate(role).context("drawing a random identity")?;
    // The WAL directory with its promised-epoch file (epoch 0): a store whose file is
    // missing later lost its WAL and refuses to start (startup::StartError::WalMissing).
    let wal_dir = config::wal_dir(dir);
    quire_wal::PromisedEpoch::create_in(quire_wal::OsStorage, &wal_dir)
        .with_context(|| format!("creating {}", wal_dir.display()))?;
    id.store(dir)?;
    Ok(id)
}

/// `quire-node run`: loads the settings, starts logging and a Tokio runtime, serves until
/// SIGINT or SIGTERM, then shuts down cleanly. With `--print-config` it prints the
/// effective settings and their sources on stdout instead and returns (an error if they
/// are not valid). Deprecated spellings are logged as warnings once logging is up.
///
/// Prints `listening on ADDR` (and `metrics on ADDR`) on stdout once bound, so scripts and
/// tests started with port 0 can find the node.
///
/// # Errors
/// Bad settings, an uninitialised or unusable data directory, an address that cannot be
/// bound, or a failed WAL at shutdown.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let env = quire_net::layers::process_env(config::ENV_PREFIX)?;
    let resolved = config::resolve(&args, &env)?;
    if args.print_config {
        resolved.print(
            args.format,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        )?;
        NodeConfig::from_resolved(&resolved)?;
        return Ok(());
    }
    let config = NodeConfig::from_resolved(&resolved)?;
    init_logging(config.log_format);
    for warning in &resolved.warnings {
        tracing::warn!("{warning}");
    }
    if !quire_net::return_large_buffers_to_the_os() {
        tracing::debug!("could not pin malloc's mmap threshold");
    }
    raise_open_files_limit();
    if !config.data_dir.join(identity::IDENTITY_FILE_NAME).exists() {
        // The same check `Node::start` makes, before any runtime or WAL file exists.
        return Err(IdentityError::NotInitialised {
            dir: config.data_dir.clone(),
        }
        .into());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("quire-node")
        .build()
        .context("starting the Tokio runtime")?;
    runtime.block_on(async move {
        let node = Node::start(config).await?;
        announce(&node)?;
        quire_net::until_shutdown(|| node.reload_tls())
            .await
            .context("waiting for a signal")?;
        tracing::info!("signal received: shutting down");
        node.shutdown().await
    })
}

fn announce(node: &Node) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {}", node.local_addr())?;
    if let Some(m) = node.metrics_addr() {
        writeln!(out, "metrics on {m}")?;
    }
    out.flush()?;
    Ok(())
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

/// Raises this process's soft limit on open files to its hard limit: every connection is
/// a file descriptor.
pub fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; setrlimit only reads it.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::debug!(
                from = limit.rlim_cur,
                to = limit.rlim_max,
                "raised the open files limit"
            );
        }
    }
}

/// Whether `dir` holds an initialised store (an identity file).
#[must_use]
pub fn is_initialised(dir: &Path) -> bool {
    dir.join(identity::IDENTITY_FILE_NAME).exists()
}
