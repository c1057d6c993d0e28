//! The cluster-facing commands: `quire cluster ...` ([`status`], [`handoff`], [`audit`]) and the pieces that
//! `quire produce`, `quire consume` and `quire bench cluster` share — the `--brokers`
//! and `--profile` options ([`BrokersArgs`], filled in from `QUIRE_*` variables and
//! profiles by [`crate::settings`]), finding the master with a note on stderr when it cannot be
//! reached ([`master`], `--connect-timeout`), the Tokio runtime each of them builds in its own `run`
//! ([`runtime`]), and Ctrl-C/SIGTERM as a future ([`signal`]).
//!
//! This module talks to brokers only through `quire-client`; it owns no wire bytes. [`up`]
//! starts a local cluster as child processes (`quire node run` / `quire broker run`, see
//! [`crate::servers`]) for `quire cluster up` and `quire demo`.

pub mod audit;
pub mod handoff;
pub mod master;
pub mod members;
pub mod status;
pub mod up;

use anyhow::Context;
use clap::{Args, Subcommand};

/// `quire cluster ...`
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// The cluster as its brokers see it: the master, the epoch, the high-water mark, every
    /// store (voter or learner, persisted offset, lag) and every broker.
    ///
    /// Asks every broker given (and every broker their answers name) for its metadata, each
    /// request bounded by --timeout; the stores' figures come from the master's answer.
    Status(status::StatusArgs),

    /// Start a local cluster (stores and brokers as child processes on 127.0.0.1, data and
    /// logs under --dir), wait until it has a master, print its addresses, and run until
    /// Ctrl-C (or, with --detach, leave it running and exit).
    Up(up::UpArgs),

    /// Stop a cluster started with `quire cluster up --detach` (SIGTERM, a bounded wait,
    /// then SIGKILL).
    Down(up::DownArgs),

    /// Hand mastership to a named slave broker: the master stops taking new producer
    /// batches, waits until its HWM covers all it accepted, tells the slave to take over
    /// and becomes a slave itself. Producers see a short pause, no error.
    Handoff(handoff::HandoffArgs),

    /// Make a store a voter (a membership change through the log, DESIGN.md "Membership
    /// changes"): the master appends a Config event naming the new voter set and answers
    /// once it is stabilized. Waits while the store is still catching up or another change
    /// is in flight; any other refusal says why, and nothing changes.
    AddStore(members::AddStoreArgs),

    /// Remove a voter: it keeps receiving the log as a learner but no longer counts toward
    /// a quorum. Refused if the remaining voters that acked recently are fewer than their
    /// quorum.
    RemoveStore(members::RemoveStoreArgs),

    /// Replace a voter (a dead or wiped disk) with another store: two changes, one store
    /// at a time — remove OLD, then add the store at --with once it has caught up.
    ReplaceStore(members::ReplaceStoreArgs),

    /// Which store holds which offsets, where their logs diverge, whether a quorum of voters
    /// holds every offset up to the high-water mark, and what a takeover would adopt now.
    ///
    /// Reads the stores online (--brokers, --stores: read-only range digests over the wire)
    /// or offline (--data-dir: a read-only scan of a store's directory, never repaired or
    /// locked; a running store's directory is read as a snapshot). Logs are compared by
    /// digests of offset ranges, bisected down to the first offset where they differ.
    /// Exit status: 0 healthy, 4 degraded, 5 at risk, 1 when no store could be read.
    Audit(audit::AuditArgs),
}

/// The `--brokers` and `--profile` options of every command that talks to a running
/// cluster. Where a missing `--brokers` comes from: [`crate::settings`].
#[derive(Debug, Clone, Args)]
pub struct BrokersArgs {
    /// Broker addresses (`host:port`), comma separated; any subset of the cluster's
    /// brokers will do, the others are learned from their answers. Default: $QUIRE_BROKERS,
    /// else the profile's.
    #[arg(short = 'b', long, value_name = "ADDR,...", value_delimiter = ',')]
    pub brokers: Vec<String>,

    /// The profile whose settings fill in what no flag or QUIRE_* variable gives. Default:
    /// $QUIRE_PROFILE, else the current one (`quire profile list`).
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,

    /// PEM file of the CA that the brokers' certificates chain to: talk TLS 1.3 to them
    /// (unset: plaintext). `quire cluster up --tls` prints it. Default: $QUIRE_TLS_CA.
    #[arg(long, value_name = "FILE", env = "QUIRE_TLS_CA", hide_env = true)]
    pub tls_ca: Option<std::path::PathBuf>,

    /// PEM file of the client certificate to show (with --tls-key): brokers may ask for
    /// one, stores always do (`cluster audit` reads them). Default: $QUIRE_TLS_CERT.
    #[arg(long, value_name = "FILE", env = "QUIRE_TLS_CERT", hide_env = true)]
    pub tls_cert: Option<std::path::PathBuf>,

    /// PEM file of the private key of --tls-cert. Default: $QUIRE_TLS_KEY.
    #[arg(long, value_name = "FILE", env = "QUIRE_TLS_KEY", hide_env = true)]
    pub tls_key: Option<std::path::PathBuf>,

    /// Authenticate to the brokers as this user with SCRAM-SHA-256 (`quire user add`); the
    /// password comes from --password-file, else $QUIRE_PASSWORD. The login, not a client
    /// certificate, then names the principal. Default: $QUIRE_USER.
    #[arg(long, value_name = "NAME", env = "QUIRE_USER", hide_env = true)]
    pub user: Option<String>,

    /// File whose first line is --user's password (never give a password as a flag: other
    /// users of the machine see flags). Default: $QUIRE_PASSWORD_FILE.
    #[arg(
        long,
        value_name = "FILE",
        env = "QUIRE_PASSWORD_FILE",
        hide_env = true
    )]
    pub password_file: Option<std::path::PathBuf>,
}

impl BrokersArgs {
    /// Fills in `brokers` (and `connect`'s timeout, for the commands that have one) from
    /// the flags, the `QUIRE_*` variables in `env` and the chosen profile, in that order
    /// (see [`crate::settings`]), and returns where each came from.
    ///
    /// # Errors
    /// As [`crate::settings::resolve`]: no brokers anywhere, a bad variable, a missing or
    /// corrupt profile.
    pub fn resolve(
        &mut self,
        connect: Option<&mut master::ConnectArgs>,
        env: &crate::settings::Env,
    ) -> anyhow::Result<crate::settings::ClientSettings> {
        let flags = crate::settings::Flags {
            brokers: &self.brokers,
            profile: self.profile.as_deref(),
            connect_timeout: connect.as_ref().and_then(|c| c.connect_timeout),
            wants_connect_timeout: connect.is_some(),
        };
        let settings = crate::settings::resolve(&flags, env)?;
        tracing::debug!(
            brokers = %settings.brokers.join(","),
            from = %settings.brokers_from,
            "broker addresses"
        );
        self.brokers.clone_from(&settings.brokers);
        if let Some(connect) = connect {
            connect.connect_timeout = Some(settings.connect_timeout);
        }
        Ok(settings)
    }

    /// The TLS side of connections to the brokers: `None` (plaintext) without --tls-ca.
    ///
    /// # Errors
    /// A file that cannot be read or used (named in the message).
    pub fn tls(&self) -> anyhow::Result<Option<quire_tls::TlsConnector>> {
        let files = quire_tls::TlsFiles {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            ca: self.tls_ca.clone(),
        };
        if self.tls_ca.is_none() && !files.is_empty() {
            anyhow::bail!("--tls-cert and --tls-key ($QUIRE_TLS_CERT, $QUIRE_TLS_KEY) need --tls-ca ($QUIRE_TLS_CA: the CA the servers' certificates chain to)");
        }
        files.connector().context(
            "the TLS files (--tls-ca, --tls-cert, --tls-key, or $QUIRE_TLS_CA, $QUIRE_TLS_CERT, $QUIRE_TLS_KEY)",
        )
    }

    /// The SCRAM login of `--user`: `None` without one.
    ///
    /// # Errors
    /// A user without a password ($QUIRE_PASSWORD, --password-file), an unreadable
    /// password file, or a password file without a user.
    pub fn sasl(&self) -> anyhow::Result<Option<quire_client::ScramLogin>> {
        let Some(user) = self.user.clone().filter(|u| !u.is_empty()) else {
            if self.password_file.is_some() {
                anyhow::bail!("--password-file ($QUIRE_PASSWORD_FILE) needs --user ($QUIRE_USER)");
            }
            if std::env::var_os(crate::settings::PASSWORD_ENV).is_some_and(|p| !p.is_empty()) {
                tracing::warn!("$QUIRE_PASSWORD is set but no user is: not logging in (give --user or $QUIRE_USER)");
            }
            return Ok(None);
        };
        let password = match &self.password_file {
            Some(path) => read_password_file(path)?,
            None => std::env::var(crate::settings::PASSWORD_ENV).map_err(|_| {
                anyhow::anyhow!(
                    "--user {user} needs a password: set $QUIRE_PASSWORD or give --password-file"
                )
            })?,
        };
        Ok(Some(quire_client::ScramLogin { user, password }))
    }

    /// The addresses, trimmed, empty entries dropped.
    #[must_use]
    pub fn addrs(&self) -> Vec<String> {
        self.brokers
            .iter()
            .map(|b| b.trim().to_owned())
            .filter(|b| !b.is_empty())
            .collect()
    }
}

/// The first line of `path`, without its line ending: a password.
///
/// # Errors
/// The file cannot be read, or its first line is empty.
pub fn read_password_file(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the password file {}", path.display()))?;
    let line = text.lines().next().unwrap_or_default();
    if line.is_empty() {
        anyhow::bail!(
            "the password file {} has an empty first line",
            path.display()
        );
    }
    Ok(line.to_owned())
}

/// The Tokio runtime an async command runs in: multi-threaded, with I/O and timers, its
/// threads named after the command.
///
/// # Errors
/// The runtime could not be built (no threads or file descriptors left).
pub fn runtime(name: &str) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(format!("quire-{name}"))
        .build()
        .context("starting the Tokio runtime")
}

/// Resolves when SIGINT (Ctrl-C) or SIGTERM arrives. Must run inside a Tokio runtime.
///
/// # Errors
/// The signal handlers could not be installed.
pub async fn signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// `after.saturating_sub(before)` counted in log positions: the number of offsets at or
/// below `after` that are not at or below `before` (`None` meaning "no offset").
#[must_use]
pub fn offsets_between(before: Option<u64>, after: Option<u64>) -> u64 {
    let next = |o: Option<u64>| o.map_or(0, |o| o.saturating_add(1));
    next(after).saturating_sub(next(before))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_between_counts_positions() {
        assert_eq!(offsets_between(None, None), 0);
        assert_eq!(offsets_between(None, Some(0)), 1);
        assert_eq!(offsets_between(Some(4), Some(9)), 5);
        assert_eq!(offsets_between(Some(9), Some(4)), 0, "never negative");
        assert_eq!(offsets_between(Some(9), None), 0);
    }

    #[test]
    fn broker_addresses_are_trimmed() {
        let args = BrokersArgs {
            brokers: vec![" a:1".into(), String::new(), "b:2 ".into()],
            profile: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            user: None,
            password_file: None,
        };
        assert_eq!(args.addrs(), vec!["a:1".to_owned(), "b:2".to_owned()]);
    }
}
