//! The clap declarations of `quire wal ...` (kept next to the commands they drive; the
//! top-level [`crate::cli::Command`] refers to [`WalCommand`]).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::cli::FormatArgs;

use super::dump::{DumpConfig, PayloadMode};
use super::repair::RepairConfig;
use super::stat::StatConfig;
use super::verify::VerifyConfig;

/// `quire wal ...`
#[derive(Debug, Subcommand)]
pub enum WalCommand {
    /// Print one line per record: offset, epoch, kind, length, segment, position, checksum.
    ///
    /// DIR is a WAL directory or a store's data directory (its WAL is DIR/wal). Read-only:
    /// takes no lock, so it also works on the directory of a node that was killed (and
    /// says so if a running process has it open). The record that ends the log (a torn
    /// tail or a corrupt record) is printed with its status, and a last line tells how the
    /// log ends.
    Dump(WalDumpArgs),

    /// Check every record. Exit status 0: clean; 1: corruption (prints segment, position,
    /// offset); 2: only a torn tail (what a crash mid-write leaves; a node cuts it at
    /// start-up, `quire wal repair` cuts it offline); 3: nothing checked, because DIR is
    /// missing, holds no WAL (no <20 digits>.log segment, LOCK, promised_epoch or
    /// spare.prealloc, and no wal/ subdirectory) or cannot be read.
    Verify(WalVerifyArgs),

    /// Per segment: base and last offset, records, bytes used and on disk, epochs seen;
    /// then the totals and how the log ends.
    Stat(WalStatArgs),

    /// Cut a torn tail of the log (a dry run unless --yes). Never cuts corruption in the
    /// middle of the log: that is refused with exit status 1.
    Repair(WalRepairArgs),
}

/// Arguments of `quire wal dump`.
#[derive(Debug, Clone, Args)]
pub struct WalDumpArgs {
    /// The WAL directory, or a store's data directory (then DIR/wal).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    /// Print records from this offset on (records before it are scanned, not printed).
    #[arg(long, value_name = "OFFSET")]
    pub from: Option<u64>,

    /// Print at most this many records.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,

    /// How to print each record's payload: none, hex, or utf8 (invalid bytes replaced). A
    /// payload that decodes as a broker event is shown decoded: its fields (topic,
    /// producer, sequence, ...) and the message in hex or as UTF-8.
    #[arg(long, value_enum, default_value_t)]
    pub payload: PayloadMode,

    #[command(flatten)]
    pub format: FormatArgs,
}

impl WalDumpArgs {
    /// The command's configuration.
    pub fn to_config(&self) -> DumpConfig {
        DumpConfig {
            dir: self.dir.clone(),
            from: self.from,
            count: self.count,
            payload: self.payload,
            format: self.format.format,
        }
    }
}

/// Arguments of `quire wal verify`.
#[derive(Debug, Clone, Args)]
pub struct WalVerifyArgs {
    /// The WAL directory, or a store's data directory (then DIR/wal).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    #[command(flatten)]
    pub format: FormatArgs,
}

impl WalVerifyArgs {
    /// The command's configuration.
    pub fn to_config(&self) -> VerifyConfig {
        VerifyConfig {
            dir: self.dir.clone(),
            format: self.format.format,
        }
    }
}

/// Arguments of `quire wal stat`.
#[derive(Debug, Clone, Args)]
pub struct WalStatArgs {
    /// The WAL directory, or a store's data directory (then DIR/wal).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    #[command(flatten)]
    pub format: FormatArgs,
}

impl WalStatArgs {
    /// The command's configuration.
    pub fn to_config(&self) -> StatConfig {
        StatConfig {
            dir: self.dir.clone(),
            format: self.format.format,
        }
    }
}

/// Arguments of `quire wal repair`.
#[derive(Debug, Clone, Args)]
pub struct WalRepairArgs {
    /// The WAL directory, or a store's data directory (then DIR/wal).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    /// The repair to make: cut a torn tail (the only repair there is; required so that
    /// the command says what it does).
    #[arg(long, required = true)]
    pub truncate_torn_tail: bool,

    /// Really cut it. Without --yes, only print what would be cut.
    #[arg(long)]
    pub yes: bool,

    #[command(flatten)]
    pub format: FormatArgs,
}

impl WalRepairArgs {
    /// The command's configuration.
    pub fn to_config(&self) -> RepairConfig {
        RepairConfig {
            dir: self.dir.clone(),
            apply: self.yes,
            format: self.format.format,
        }
    }
}
