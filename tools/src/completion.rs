//! `quire completion SHELL` and `quire man`: shell completion scripts and man pages,
//! generated from the clap declarations in [`crate::cli`] (clap_complete and clap_mangen),
//! so they can never disagree with the command line they describe.
//!
//! This module owns only the generation; every word of help text is the command's own.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::cli::Cli;

/// The binary's name as the generated files call it.
pub const BIN_NAME: &str = "quire";

/// Arguments of `quire completion`.
#[derive(Debug, Clone, Args)]
pub struct CompletionArgs {
    /// The shell to write a completion script for (bash, zsh, fish; elvish and powershell
    /// work too).
    #[arg(value_name = "SHELL", value_enum)]
    pub shell: Shell,
}

/// Arguments of `quire man`.
#[derive(Debug, Clone, Args)]
pub struct ManArgs {
    /// Write one page per command (quire.1, quire-produce.1, quire-cluster-status.1, ...)
    /// into DIR (created if missing) instead of the top page to stdout.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The footer of every page: `quire VERSION` (clap_mangen would name the subcommand).
fn source() -> String {
    format!("{BIN_NAME} {}", env!("CARGO_PKG_VERSION"))
}

/// Writes the completion script for `shell` to `out`.
///
/// # Errors
/// None today (clap_complete panics rather than failing); kept for a writer that fails.
pub fn write_completion(shell: Shell, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut command = Cli::command();
    // clap_complete panics when its writer fails (a closed pipe: `| head`), so the script
    // is built in memory and written here, where a failure is an error.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, BIN_NAME, &mut script);
    out.write_all(&script)
        .and_then(|()| out.flush())
        .context("writing the completion script")
}

/// Writes the man page of `quire` itself (roff) to `out`.
///
/// # Errors
/// Writing `out` failed.
pub fn write_top_page(out: &mut dyn Write) -> anyhow::Result<()> {
    clap_mangen::Man::new(Cli::command())
        .source(source())
        .render(out)
        .context("writing the man page")
}

/// Writes one man page per command and subcommand into `dir` (`quire.1`,
/// `quire-produce.1`, `quire-cluster-status.1`, ...), and returns their paths in the order
/// written.
///
/// # Errors
/// `dir` cannot be created, or a page cannot be written.
pub fn write_pages(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut command = Cli::command();
    command.build();
    let mut written = Vec::new();
    write_tree(&command, dir, &mut written)?;
    Ok(written)
}

fn write_tree(
    command: &clap::Command,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    // After `build`, a subcommand's display name is its full name: `quire-cluster-status`.
    let name = command
        .get_display_name()
        .unwrap_or_else(|| command.get_name());
    let path = dir.join(format!("{name}.1"));
    let mut bytes = Vec::new();
    clap_mangen::Man::new(command.clone())
        .source(source())
        .render(&mut bytes)
        .with_context(|| format!("rendering {}", path.display()))?;
    fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    for sub in command.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        write_tree(sub, dir, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_script_names_the_subcommands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut out = Vec::new();
            write_completion(shell, &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            for word in [
                "produce",
                "consume",
                "cluster",
                "profile",
                "status",
                "--brokers",
            ] {
                assert!(text.contains(word), "{shell}: no {word}");
            }
        }
    }

    #[test]
    fn one_page_per_command_each_a_roff_page() {
        let dir = tempfile::tempdir().unwrap();
        let pages = write_pages(dir.path()).unwrap();
        for name in [
            "quire.1",
            "quire-produce.1",
            "quire-consume.1",
            "quire-cluster-status.1",
            "quire-profile-create.1",
        ] {
            let path = dir.path().join(name);
            assert!(pages.contains(&path), "{name} missing from {pages:?}");
            let text = fs::read_to_string(&path).unwrap();
            assert!(
                text.starts_with(".ie") || text.contains(".TH"),
                "{name}: {text}"
            );
            assert!(text.contains(".SH NAME"), "{name}");
        }
        let produce = fs::read_to_string(dir.path().join("quire-produce.1")).unwrap();
        assert!(
            produce.contains("quire\\-produce"),
            "the page names its command"
        );
        let mut top = Vec::new();
        write_top_page(&mut top).unwrap();
        assert!(String::from_utf8(top).unwrap().contains(".TH quire"));
    }
}
