//! The `quire` binary: parses the command line, sets up logging, runs the command and
//! turns an error into a message on stderr and a non-zero exit status. All logic lives in
//! the `quire_tools` library.

use std::process::ExitCode;

use clap::Parser;
use quire_tools::cli::Cli;
use quire_tools::interrupt::Interrupted;
use quire_tools::wal::FindingsExit;

fn main() -> ExitCode {
    let cli = Cli::parse();
    quire_tools::init_logging(&cli);
    match quire_tools::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let err: anyhow::Error = err;
            eprintln!("quire: error: {err:#}");
            if err.is::<Interrupted>() {
                ExitCode::from(130)
            } else if let Some(findings) = err.downcast_ref::<FindingsExit>() {
                ExitCode::from(findings.exit_code)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
