//! `quire node init|run` and `quire broker run`: the store and broker servers carried by
//! the `quire` binary itself, so that `quire demo` / `quire cluster up` (and tests) can start
//! copies of `std::env::current_exe()` as stores and brokers without the `quire-node` and
//! `quire-broker` binaries having been built.
//!
//! These commands take exactly the arguments of `quire-node init|run` and
//! `quire-broker run` — the clap types are theirs (`quire_node::Command`,
//! `quire_broker::Command`), embedded as subcommands — and run the same library entry
//! points (`quire_node::main_with`, `quire_broker::main_with`). Their output is theirs too:
//! `listening on ADDR` (and `metrics on ADDR`) on stdout once bound, logs on stderr in the
//! server's own `--log-format`, exit on SIGINT/SIGTERM after a clean shutdown. `quire`'s own
//! `-v`/`-q` do not apply to them (the servers install their own logging; `RUST_LOG` works).
//!
//! This module owns only the delegation; everything else is the node's and the broker's.

/// Runs `quire node <command>` exactly as `quire-node <command>`.
///
/// # Errors
/// As `quire_node::main_with`.
pub fn node(command: quire_node::Command) -> anyhow::Result<()> {
    quire_node::main_with(quire_node::Cli { command })
}

/// Runs `quire broker <command>` exactly as `quire-broker <command>`.
///
/// # Errors
/// As `quire_broker::main_with`.
pub fn broker(command: quire_broker::Command) -> anyhow::Result<()> {
    quire_broker::main_with(quire_broker::Cli { command })
}

/// True for the commands that install their own logging (the servers).
#[must_use]
pub fn has_own_logging(command: &crate::cli::Command) -> bool {
    matches!(
        command,
        crate::cli::Command::Node(_) | crate::cli::Command::Broker(_)
    )
}
