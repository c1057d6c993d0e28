//! `quire-tools`: the library behind the `quire` command line.
//!
//! The binary (`src/main.rs`) only parses arguments, sets up logging and maps errors to an
//! exit status; everything else lives here so tests can call it:
//!
//! | module | owns |
//! | --- | --- |
//! | [`cli`] | the clap declarations of every command and option |
//! | [`units`] | parsers for durations (`5s`, `500ms`) and sizes (`64KiB`, `1MB`) |
//! | [`output`] | `--format text|json|jsonl` and the shared printing helpers |
//! | [`bench`] | `quire bench ...` (today: [`bench::disk`], [`bench::cluster`]) |
//! | [`servers`] | `quire node ...` / `quire broker ...`: the store and broker servers |
//! | [`produce`], [`consume`] | `quire produce` / `quire consume` |
//! | [`cluster`] | `quire cluster ...` and what the client commands share |
//! | [`access`] | `quire user ...`, `quire acl ...`: users and ACL entries |
//! | [`profile`] | `quire profile ...`: named connection settings in `profiles.toml` |
//! | [`settings`] | flag > `QUIRE_*` variable > profile > default, for the client commands |
//! | [`completion`] | `quire completion SHELL`, `quire man`: generated from [`cli`] |
//! | [`demo`] | `quire demo`: a local cluster, producers, a consumer, a killed master |
//! | [`wal`] | `quire wal dump|verify|stat|repair`: the offline WAL tools |
//! | [`dio`] | direct-I/O alignment discovery and aligned buffers |
//! | [`interrupt`] | Ctrl-C/SIGTERM as a flag for synchronous commands |
//!
//! Conventions for every command: results on stdout in the chosen format; logs (tracing)
//! and errors on stderr; an error is a non-zero exit (1, or 130 after Ctrl-C; clap usage
//! errors exit 2). `quire wal ...` differs (see [`failure_exit_code`]): its 1 and 2 are
//! findings, and it exits 3 when it could not read a log or its command line is wrong.
//! `quire cluster audit` exits with its verdict: 0 healthy, 4 degraded, 5 at risk
//! ([`cluster::audit::EXIT_DEGRADED`], [`cluster::audit::EXIT_AT_RISK`]).

pub mod access;
pub mod bench;
pub mod cli;
pub mod cluster;
pub mod completion;
pub mod consume;
pub mod demo;
pub mod dio;
pub mod interrupt;
pub mod output;
pub mod produce;
pub mod profile;
pub mod servers;
pub mod settings;
pub mod topic;
pub mod units;
pub mod wal;

use std::io::{self, IsTerminal};

use tracing_subscriber::EnvFilter;

use crate::cli::{BenchCommand, Cli, Command};
use crate::cluster::ClusterCommand;

/// Runs the command `cli` describes, printing its results to stdout.
///
/// # Errors
/// Whatever the command reports; the binary prints it to stderr with its causes.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let env = settings::Env::from_process();
    if reads_client_settings(&cli.command) {
        settings::check_variables(&env)?;
    }
    match cli.command {
        Command::Bench(BenchCommand::Disk(args)) => {
            let report = bench::disk::run(&args.to_config())?;
            output::emit(&report, args.format.format, &mut io::stdout().lock())?;
        }
        Command::Node(command) => servers::node(command)?,
        Command::Broker(command) => servers::broker(command)?,
        Command::Produce(mut args) => {
            args.brokers.resolve(Some(&mut args.connect), &env)?;
            produce::main(&args.to_config()?)?;
        }
        Command::Consume(mut args) => {
            args.brokers.resolve(Some(&mut args.connect), &env)?;
            consume::main(&args.to_config()?)?;
        }
        Command::Bench(BenchCommand::Report(args)) => {
            let report = bench::report::run(&args)?;
            output::emit(&report, args.format.format, &mut io::stdout().lock())?;
        }
        Command::Demo(args) => {
            let report = demo::run(&args.to_config()?)?;
            output::emit(&report, args.format.format, &mut io::stdout().lock())?;
            demo::check(&report)?;
        }
        Command::Cluster(ClusterCommand::Up(args)) => {
            cluster::up::run_up(&args, &mut io::stdout().lock())?;
        }
        Command::Cluster(ClusterCommand::Down(args)) => {
            cluster::up::run_down(&args, &env, &mut io::stdout().lock())?;
        }
        Command::Cluster(ClusterCommand::Handoff(mut args)) => {
            args.brokers.resolve(None, &env)?;
            let report = cluster::handoff::run(&args)?;
            cluster::handoff::print(&report, args.format.format)?;
        }
        Command::Cluster(ClusterCommand::AddStore(mut args)) => {
            args.options.brokers.resolve(None, &env)?;
            let report = cluster::members::add(&args)?;
            cluster::members::print(&report, args.options.format.format)?;
        }
        Command::Cluster(ClusterCommand::RemoveStore(mut args)) => {
            args.options.brokers.resolve(None, &env)?;
            let report = cluster::members::remove(&args)?;
            cluster::members::print(&report, args.options.format.format)?;
        }
        Command::Cluster(ClusterCommand::ReplaceStore(mut args)) => {
            args.options.brokers.resolve(None, &env)?;
            let report = cluster::members::replace(&args)?;
            cluster::members::print(&report, args.options.format.format)?;
        }
        Command::Cluster(ClusterCommand::Status(mut args)) => {
            args.brokers.resolve(None, &env)?;
            let status = cluster::status::run(&args.to_config()?)?;
            output::emit(&status, args.format.format, &mut io::stdout().lock())?;
        }
        Command::Cluster(ClusterCommand::Audit(mut args)) => {
            // The brokers' view (voter set, HWM) is what makes a partial audit honest, so
            // it is taken from QUIRE_BROKERS or the profile whenever one is there. Only an
            // audit of named stores or directories may go on without one.
            let named = !args.stores.is_empty() || !args.data_dirs.is_empty();
            match args.brokers.resolve(None, &env) {
                Ok(_) => {}
                Err(e) if named && args.brokers.profile.is_none() => {
                    tracing::debug!("{e:#}; auditing only the stores and directories named");
                }
                Err(e) => return Err(e),
            }
            let report = cluster::audit::run(&args.to_config()?)?;
            output::emit(&report, args.format.format, &mut io::stdout().lock())?;
            if let Some(exit) = cluster::audit::verdict_exit(&report) {
                return Err(exit.into());
            }
        }
        Command::Bench(BenchCommand::Cluster(mut args)) => {
            args.brokers.resolve(Some(&mut args.connect), &env)?;
            let report = bench::cluster::run(&args.to_config()?)?;
            output::emit(&report, args.format.format, &mut io::stdout().lock())?;
            bench::cluster::check(&report)?;
        }
        Command::Topic(command) => topic::run(command, &env)?,
        Command::User(command) => access::run_user(command, &env)?,
        Command::Acl(command) => access::run_acl(command, &env)?,
        Command::Wal(command) => wal::run(&command)?,
        Command::Profile(command) => profile::run(&command, &env, &mut io::stdout().lock())?,
        Command::Completion(args) => {
            completion::write_completion(args.shell, &mut io::stdout().lock())?;
        }
        Command::Man(args) => match &args.dir {
            Some(dir) => {
                for page in completion::write_pages(dir)? {
                    tracing::debug!(page = %page.display(), "man page written");
                }
            }
            None => completion::write_top_page(&mut io::stdout().lock())?,
        },
        Command::Bench(BenchCommand::Wal(args)) => {
            let report = bench::wal::run(&args.to_config())?;
            output::emit(&report, args.format.format, &mut io::stdout().lock())?;
        }
        Command::Bench(BenchCommand::Logs(args)) => {
            let report = bench::logs::run(&args.to_config())?;
            output::emit(&report, args.format.format, &mut io::stdout().lock())?;
        }
        Command::Bench(BenchCommand::Node(args)) => {
            let report = bench::node::run(&args.to_config())?;
            output::emit(&report, args.format.format, &mut io::stdout().lock())?;
        }
    }
    Ok(())
}

/// True for the commands that read the client's `QUIRE_*` variables or profiles (and so
/// refuse a misspelt one: [`settings::check_variables`]).
#[must_use]
pub fn reads_client_settings(command: &Command) -> bool {
    matches!(
        command,
        Command::Produce(_)
            | Command::Consume(_)
            | Command::Cluster(_)
            | Command::Topic(_)
            | Command::User(_)
            | Command::Acl(_)
            | Command::Profile(_)
            | Command::Bench(BenchCommand::Cluster(_))
    )
}

/// The exit status after `command` failed with an error that is neither a finding it
/// printed ([`wal::FindingsExit`]) nor an interruption (130): 1, except for `quire wal ...`,
/// where 1 and 2 report what was found in the log (corruption, a torn tail), so failing to
/// read a log at all (a wrong directory, an I/O error) is [`wal::EXIT_FAILED`] (3), as is
/// a usage error of a `wal` command (see [`is_wal_command_line`]).
#[must_use]
pub fn failure_exit_code(command: &Command) -> u8 {
    match command {
        Command::Wal(_) => wal::EXIT_FAILED,
        _ => 1,
    }
}

/// Whether `args` (the program name first, as `std::env::args_os` gives them) run a
/// `quire wal ...` command: the first argument that is not an option is `wal`. Used only
/// when the command line does not parse, to give a `wal` command's usage error the status
/// [`wal::EXIT_FAILED`] instead of clap's 2 (verify's "torn tail"). `quire`'s options
/// before the command (`-v`, `-q`) take no value, so no value is taken for the command.
pub fn is_wal_command_line(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    args.into_iter()
        .skip(1)
        .find(|a| !a.to_string_lossy().starts_with('-'))
        .is_some_and(|a| a == "wal")
}

/// Sends `tracing` output to stderr: `info` by default, `debug` with `-v`, `trace` with
/// `-vv`, `warn` with `-q`; the `RUST_LOG` environment variable, when set, overrides.
pub fn init_logging(cli: &Cli) {
    if servers::has_own_logging(&cli.command) {
        return;
    }
    let default = match (cli.quiet, cli.verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // A second initialization (only possible from tests) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn args(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn a_wal_command_line_is_told_by_its_first_word() {
        assert!(is_wal_command_line(args("quire wal verify d --format jsn")));
        assert!(is_wal_command_line(args("quire -v wal verify")));
        assert!(is_wal_command_line(args("quire -q wal")));
        assert!(!is_wal_command_line(args("quire bench wal --bogus")));
        assert!(!is_wal_command_line(args("quire produce --topic wal")));
        assert!(!is_wal_command_line(args("quire --bogus")));
        assert!(!is_wal_command_line(args("quire")));
    }
}
