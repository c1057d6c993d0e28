//! `quire-broker`: the broker binary. Everything lives in the library (`quire_broker`); see
//! `quire-broker --help`.

use clap::Parser;

fn main() -> std::process::ExitCode {
    match quire_broker::main_with(quire_broker::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quire-broker: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
