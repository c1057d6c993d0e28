//! `quire-node`: the event store binary. Everything lives in the library (`quire_node`);
//! see `quire-node --help`.

use clap::Parser;

fn main() -> std::process::ExitCode {
    match quire_node::main_with(quire_node::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quire-node: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
