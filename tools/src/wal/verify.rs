//! `quire wal verify DIR`: checks every record of the log with the recovery scan's rules
//! (`quire_wal::inspect`: header, CRC-32C, the next expected offset, truncation markers,
//! segment names) and the promised-epoch file, read-only.
//!
//! Exit status: 0 clean; 1 corruption (a bad record with valid records after it, a missing
//! segment, a damaged promised-epoch file) — printed with segment, position and offset;
//! 2 a torn tail only (the end of the last write was lost: a node cuts it when it starts,
//! `quire wal repair --truncate-torn-tail` cuts it offline); 3 nothing was verified: DIR
//! missing, not a directory, holding no WAL (see [`super::resolve_dir`]: a wrong path is
//! never reported clean), or unreadable — with an error on stderr and nothing on stdout.
//! A WAL that was opened but holds no record yet is an empty log: clean.
//!
//! # JSON output (`--format json`)
//! | field | meaning |
//! | --- | --- |
//! | `dir` | the WAL directory read |
//! | `result` | `"clean"`, `"torn_tail"` or `"corruption"` |
//! | `exit_code` | 0, 2 or 1 |
//! | `segments`, `records_checked`, `bytes_checked` | what was read (records that count; bytes = their headers + payloads) |
//! | `entries`, `markers` | log entries (after truncations) and truncation markers |
//! | `first_offset`, `next_offset`, `last_offset`, `last_epoch` | the log found |
//! | `promised_epoch` | from the `promised_epoch` file (0 if absent), `null` if damaged |
//! | `promised_epoch_error` | why the file is damaged, else `null` |
//! | `end` | how the log ends (see [`super::EndSummary`]) |
//! | `repaired_at_start` | on corruption: the damaged records a quire-node starting on this log places and has repaired from the other stores (docs/operations.md, "Corruption found at start"), when every corruption found is of that kind; `null` when the store would refuse to start, or there is none |
//! | `live_holder` | `{pid, name}` of a running process holding the WAL's lock, or `null` |

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::Context;
use quire_wal::{PromisedEpoch, RecordStatus};
use serde::Serialize;

use super::{
    live_holder, warn_live, EndSummary, FindingsExit, LiveHolder, EXIT_CLEAN, EXIT_CORRUPTION,
};
use crate::output::{self, OutputFormat, Report, Table};

/// What to verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyConfig {
    /// WAL directory or data directory.
    pub dir: PathBuf,
    /// Output format.
    pub format: OutputFormat,
}

/// The findings; see the module docs.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// The WAL directory read.
    pub dir: String,
    /// `"clean"`, `"torn_tail"` or `"corruption"`.
    pub result: &'static str,
    /// The process exit status.
    pub exit_code: u8,
    /// Segment files.
    pub segments: usize,
    /// Records that count (entries and markers).
    pub records_checked: u64,
    /// Their bytes (headers and payloads).
    pub bytes_checked: u64,
    /// Log entries after truncations.
    pub entries: u64,
    /// Truncation markers.
    pub markers: u64,
    /// The log's first offset.
    pub first_offset: u64,
    /// One past its last entry.
    pub next_offset: u64,
    /// Offset of the last entry.
    pub last_offset: Option<u64>,
    /// Epoch of the last entry.
    pub last_epoch: Option<u64>,
    /// The promised epoch (0 if no file), `None` if the file is damaged.
    pub promised_epoch: Option<u64>,
    /// Why the promised-epoch file is damaged.
    pub promised_epoch_error: Option<String>,
    /// How the log ends.
    pub end: EndSummary,
    /// On corruption: the offsets of the damaged records a store starting on this log
    /// places and repairs from its peers, when that is all the corruption there is; `None`
    /// when it would refuse to start (or the log is not corrupt).
    pub repaired_at_start: Option<Vec<u64>>,
    /// A running process holding the WAL's lock.
    pub live_holder: Option<LiveHolder>,
}

impl Report for VerifyReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let last = match (self.last_offset, self.last_epoch) {
            (Some(o), Some(e)) => format!("offset {o}, epoch {e}"),
            _ => "none (empty log)".to_owned(),
        };
        let mut table = Table::new();
        table
            .row("wal", &self.dir)
            .row(
                "checked",
                format!(
                    "{} segment(s), {} record(s), {} bytes",
                    self.segments, self.records_checked, self.bytes_checked
                ),
            )
            .row(
                "log",
                format!(
                    "offsets [{}, {}), {} entries, {} truncation marker(s)",
                    self.first_offset, self.next_offset, self.entries, self.markers
                ),
            )
            .row("last entry", last)
            .row(
                "promised",
                match (&self.promised_epoch, &self.promised_epoch_error) {
                    (_, Some(e)) => format!("DAMAGED: {e}"),
                    (Some(p), None) => format!("epoch {p}"),
                    (None, None) => "?".to_owned(),
                },
            )
            .row("end", self.end.describe());
        if self.result == "corruption" && self.promised_epoch_error.is_none() {
            table.row(
                "at start",
                match &self.repaired_at_start {
                    Some(offsets) => format!(
                        "quire-node starts with offset(s) {} marked damaged and repairs them \
                         from the other stores",
                        offsets
                            .iter()
                            .map(u64::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None => "quire-node refuses to start on this log".to_owned(),
                },
            );
        }
        if let Some(h) = &self.live_holder {
            table.row("note", format!("open by a running process, {h}"));
        }
        let verdict = match self.result {
            "clean" => "clean".to_owned(),
            "torn_tail" => "torn tail only".to_owned(),
            _ => "CORRUPTION".to_owned(),
        };
        table.row("result", format!("{verdict} (exit {})", self.exit_code));
        table.write(out)
    }
}

/// Runs `quire wal verify`, printing the report to `out`.
///
/// # Errors
/// A bad directory or an I/O error reading the log; [`FindingsExit`] (after printing)
/// with status 1 for corruption and 2 for a torn tail.
pub fn run(config: &VerifyConfig, out: &mut dyn Write) -> anyhow::Result<()> {
    let report = verify(config)?;
    output::emit(&report, config.format, &mut &mut *out).context("cannot write the report")?;
    if report.exit_code == EXIT_CLEAN {
        return Ok(());
    }
    let mut message = format!("{}: {}", report.dir, report.end.describe());
    if let Some(e) = &report.promised_epoch_error {
        message = format!("{}: promised-epoch file damaged: {e}", report.dir);
    }
    Err(FindingsExit {
        exit_code: report.exit_code,
        message,
    }
    .into())
}

/// Verifies the log of `config.dir` and returns the findings (without printing).
///
/// # Errors
/// A bad directory or an I/O error reading the log.
pub fn verify(config: &VerifyConfig) -> anyhow::Result<VerifyReport> {
    let wal_dir = super::resolve_dir(&config.dir)?;
    let holder = live_holder(&wal_dir);
    if let Some(h) = &holder {
        warn_live(&wal_dir, h);
    }
    let mut records = 0u64;
    let mut bytes = 0u64;
    let report = quire_wal::inspect(&wal_dir, |r| {
        if !matches!(r.status, RecordStatus::Bad(_)) {
            records += 1;
            bytes += r.bytes;
        }
    })
    .with_context(|| format!("cannot read the WAL in {}", wal_dir.display()))?;
    let (promised_epoch, promised_epoch_error) = match PromisedEpoch::load(&wal_dir) {
        Ok(p) => (Some(p.epoch().0), None),
        Err(e) if e.is_corruption() => (None, Some(e.to_string())),
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "cannot read the promised epoch in {}",
                wal_dir.display()
            )))
        }
    };
    let end = EndSummary::of(&report.end);
    // What a store starting on it would do: place the damaged records, or refuse.
    let repaired_at_start = if matches!(report.end, quire_wal::ScanEnd::Corruption(_)) {
        let placing = quire_wal::scan::scan_dir_placing(
            &wal_dir,
            &mut |_| {},
            quire_wal::DamagedRecords::Place,
        )
        .with_context(|| format!("cannot read the WAL in {}", wal_dir.display()))?;
        (!matches!(placing.end, quire_wal::ScanEnd::Corruption(_)))
            .then(|| placing.damaged.iter().map(|o| o.0).collect())
    } else {
        None
    };
    let (result, exit_code) = if promised_epoch_error.is_some() {
        ("corruption", EXIT_CORRUPTION)
    } else {
        (end.result, end.exit_code())
    };
    Ok(VerifyReport {
        dir: wal_dir.display().to_string(),
        result,
        exit_code,
        segments: report.segments.len(),
        records_checked: records,
        bytes_checked: bytes,
        entries: report.entries,
        markers: report.markers,
        first_offset: report.start.0,
        next_offset: report.next.0,
        last_offset: report.last.map(|p| p.offset.0),
        last_epoch: report.last.map(|p| p.epoch.0),
        promised_epoch,
        promised_epoch_error,
        end,
        repaired_at_start,
        live_holder: holder,
    })
}
