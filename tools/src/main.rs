//! The `quire` binary: parses the command line, sets up logging, runs the command and
//! turns an error into a message on stderr and a non-zero exit status. All logic lives in
//! the `quire_tools` library.

use std::process::ExitCode;

use clap::Parser;
use quire_tools::cli::Cli;
use quire_tools::interrupt::Interrupted;
use quire_tools::wal::FindingsExit;

fn main() -> ExitCode {
    // An empty QUIRE_* variable counts as unset (docs/operations.md), also for the options
    // clap reads from variables (`--tls-ca`, `--password-file`, ...), which would otherwise
    // take "" as a value given. Done first, while this process has one thread.
    for (name, value) in std::env::vars_os() {
        if value.is_empty() && name.to_string_lossy().starts_with("QUIRE_") {
            std::env::remove_var(name);
        }
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // `--help` and `--version` print to stdout and exit 0; a usage error exits
            // 2, except for `quire wal ...`, whose 2 means "torn tail".
            let code = if err.use_stderr() && quire_tools::is_wal_command_line(std::env::args_os())
            {
                i32::from(quire_tools::wal::EXIT_FAILED)
            } else {
                err.exit_code()
            };
            let _ = err.print();
            return ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
    };
    quire_tools::init_logging(&cli);
    let failure = quire_tools::failure_exit_code(&cli.command);
    match quire_tools::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let err: anyhow::Error = err;
            if is_broken_pipe(&err) {
                // The reader of stdout went away (`quire consume | head`): that is how a
                // pipeline ends, not a failure (as `cat` and `grep` behave).
                return ExitCode::SUCCESS;
            }
            eprintln!("quire: error: {err:#}");
            if err.is::<Interrupted>() {
                ExitCode::from(130)
            } else if let Some(findings) = err.downcast_ref::<FindingsExit>() {
                ExitCode::from(findings.exit_code)
            } else {
                ExitCode::from(failure)
            }
        }
    }
}

/// Whether `err` is, or was caused by, a write to a closed pipe (EPIPE). Rust ignores
/// SIGPIPE, so such a write returns an error instead of ending the process.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
