//! `quire wal repair DIR --truncate-torn-tail [--yes]`: cuts a torn tail offline, the
//! same cut a node makes when it opens its WAL (`quire_wal::repair_torn_tail`: zeros
//! written over the torn bytes and fdatasynced; a segment whose first record is torn, and
//! later segments with no valid record, deleted and the directory fsynced).
//!
//! On a store's WAL (`DIR/wal` next to a store `identity` file) it first writes the store's
//! tail-cut mark (`DIR/tail_cut`, `quire_node::tail_cut`), as the node does before its own
//! cut: the cut may remove an acked record with a flipped bit, so the store must not vote
//! as if it held everything it acked (docs/protocol.md, "Tail-cut marks").
//!
//! Without `--yes` it is a dry run: it scans read-only and prints what would be cut.
//! Corruption (a bad record with valid records after it) is never cut: the command prints
//! where it is and exits 1, changing nothing. With `--yes` the WAL's lock is taken (without
//! waiting): a WAL a running node has open is refused, naming the process.
//!
//! # JSON output (`--format json`)
//! | field | meaning |
//! | --- | --- |
//! | `dir` | the WAL directory |
//! | `dry_run` | `true` without `--yes` |
//! | `result` | `"clean"` (nothing to cut), `"torn_tail"`, or `"corruption"` (refused) |
//! | `changed` | whether anything was written or deleted |
//! | `cut` | the torn tail (see [`super::EndSummary`]); for `"corruption"`, where it is |
//! | `last_offset`, `last_epoch` | the log's last entry after the cut (`null`: empty) |

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::{anyhow, Context};
use quire_wal::{ScanEnd, WalError};
use serde::Serialize;

use super::{live_holder, EndSummary, FindingsExit, EXIT_CORRUPTION};
use crate::output::{self, OutputFormat, Report, Table};

/// What to repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairConfig {
    /// WAL directory or data directory.
    pub dir: PathBuf,
    /// Cut for real (`--yes`); otherwise a dry run.
    pub apply: bool,
    /// Output format.
    pub format: OutputFormat,
}

/// What the repair found and did; see the module docs.
#[derive(Debug, Clone, Serialize)]
pub struct RepairOutcome {
    /// The WAL directory.
    pub dir: String,
    /// No change was made on purpose.
    pub dry_run: bool,
    /// `"clean"`, `"torn_tail"` or `"corruption"`.
    pub result: &'static str,
    /// Whether anything was written or deleted.
    pub changed: bool,
    /// The torn tail (or the corruption's location).
    pub cut: Option<EndSummary>,
    /// The last entry's offset after the cut.
    pub last_offset: Option<u64>,
    /// The last entry's epoch after the cut.
    pub last_epoch: Option<u64>,
}

impl Report for RepairOutcome {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let what = match (self.result, self.dry_run) {
            ("clean", _) => "the log ends cleanly: nothing to cut".to_owned(),
            ("torn_tail", true) => format!(
                "dry run: would cut the {}",
                self.cut
                    .as_ref()
                    .map_or_else(String::new, EndSummary::describe)
            ),
            ("torn_tail", false) => format!(
                "cut the {}",
                self.cut
                    .as_ref()
                    .map_or_else(String::new, EndSummary::describe)
            ),
            _ => format!(
                "REFUSED: {} (repair only cuts a torn tail, never corruption in the middle \
                 of the log; nothing was changed)",
                self.cut
                    .as_ref()
                    .map_or_else(String::new, EndSummary::describe)
            ),
        };
        let last = match (self.last_offset, self.last_epoch) {
            (Some(o), Some(e)) => format!("offset {o}, epoch {e}"),
            _ => "none (empty log)".to_owned(),
        };
        let mut table = Table::new();
        table.row("wal", &self.dir).row("repair", what);
        if self.result != "corruption" {
            table.row(
                if self.dry_run && self.result == "torn_tail" {
                    "last entry after the cut"
                } else {
                    "last entry"
                },
                last,
            );
        }
        if self.dry_run && self.result == "torn_tail" {
            table.row("next", "run again with --yes to cut it");
        }
        table.write(out)
    }
}

/// Runs `quire wal repair`, printing the outcome to `out`.
///
/// # Errors
/// A bad directory, an I/O error, a WAL locked by a running process (with `--yes`);
/// [`FindingsExit`] with status 1 (after printing) when the log is corrupt.
pub fn run(config: &RepairConfig, out: &mut dyn Write) -> anyhow::Result<()> {
    let outcome = repair(config)?;
    output::emit(&outcome, config.format, &mut &mut *out).context("cannot write the report")?;
    if outcome.result == "corruption" {
        return Err(FindingsExit {
            exit_code: EXIT_CORRUPTION,
            message: format!(
                "refusing to repair {}: {}",
                outcome.dir,
                outcome
                    .cut
                    .as_ref()
                    .map_or_else(String::new, EndSummary::describe)
            ),
        }
        .into());
    }
    Ok(())
}

/// Repairs (or, without `config.apply`, plans the repair of) the log of `config.dir`.
///
/// # Errors
/// As [`run`], except corruption, which is an outcome here.
pub fn repair(config: &RepairConfig) -> anyhow::Result<RepairOutcome> {
    let wal_dir = super::resolve_dir(&config.dir)?;
    let dir = wal_dir.display().to_string();
    if !config.apply {
        if let Some(h) = live_holder(&wal_dir) {
            tracing::warn!(
                "{} is open by a running process, {h}: a repair with --yes will be refused \
                 until it stops",
                wal_dir.display()
            );
        }
        let report = quire_wal::inspect(&wal_dir, |_| {})
            .with_context(|| format!("cannot read the WAL in {}", wal_dir.display()))?;
        let summary = EndSummary::of(&report.end);
        // The last entry after the cut is the last entry the scan accepted: a torn tail
        // holds no entry.
        let (last_offset, last_epoch) = match &report.end {
            ScanEnd::Corruption(_) => (None, None),
            _ => (
                report.last.map(|p| p.offset.0),
                report.last.map(|p| p.epoch.0),
            ),
        };
        return Ok(RepairOutcome {
            dir,
            dry_run: true,
            result: summary.result,
            changed: false,
            cut: (summary.result != "clean").then_some(summary),
            last_offset,
            last_epoch,
        });
    }
    mark_store_before_cut(&wal_dir)?;
    match quire_wal::repair_torn_tail(&wal_dir) {
        Ok(r) => {
            let cut = r
                .cut
                .map(|t| EndSummary::of(&quire_wal::ScanEnd::TornTail(t)));
            Ok(RepairOutcome {
                dir,
                dry_run: false,
                result: if cut.is_some() { "torn_tail" } else { "clean" },
                changed: cut.is_some(),
                cut,
                last_offset: r.last.map(|p| p.offset.0),
                last_epoch: r.last.map(|p| p.epoch.0),
            })
        }
        Err(e @ WalError::Corruption { .. }) => Ok(RepairOutcome {
            dir,
            dry_run: false,
            result: "corruption",
            changed: false,
            cut: Some(EndSummary::of(&ScanEnd::Corruption(e))),
            last_offset: None,
            last_epoch: None,
        }),
        Err(WalError::Locked { .. }) => {
            let who = live_holder(&wal_dir)
                .map_or_else(|| "another process".to_owned(), |h| h.to_string());
            Err(anyhow!(
                "{} is locked by {who} (a running node?): stop it first; nothing was changed",
                wal_dir.display()
            ))
        }
        Err(e) => Err(anyhow::Error::new(e)
            .context(format!("cannot repair the WAL in {}", wal_dir.display()))),
    }
}

/// If `wal_dir` is a store's WAL (`DIR/wal` with `DIR/identity`) and its log ends in a torn
/// tail, writes the store's tail-cut mark durably before anything is cut (a mark without
/// a cut, should the cut then fail, only makes the store wait for a later master).
fn mark_store_before_cut(wal_dir: &std::path::Path) -> anyhow::Result<()> {
    let Some(data_dir) = wal_dir
        .parent()
        .filter(|_| wal_dir.file_name().is_some_and(|n| n == "wal"))
        .filter(|d| d.join(quire_node::identity::IDENTITY_FILE_NAME).is_file())
    else {
        return Ok(());
    };
    let report = quire_wal::inspect(wal_dir, |_| {})
        .with_context(|| format!("cannot read the WAL in {}", wal_dir.display()))?;
    let ScanEnd::TornTail(t) = &report.end else {
        return Ok(());
    };
    let promised = quire_wal::PromisedEpoch::load(wal_dir)
        .with_context(|| format!("cannot read the promised epoch in {}", wal_dir.display()))?;
    let old = quire_node::tail_cut::load(data_dir)?;
    let cut = quire_node::tail_cut::merge(old, t.offset, promised.epoch());
    quire_node::tail_cut::store(data_dir, cut)?;
    tracing::warn!(
        data_dir = %data_dir.display(),
        cut_offset = %cut.offset,
        cut_promised = %cut.promised,
        "the store is marked: its fence grants count only when every store grants, until it catches up with a later master"
    );
    Ok(())
}
