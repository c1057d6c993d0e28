//! `quire wal stat DIR`: a summary per segment and for the whole log, read-only.
//!
//! # JSON output (`--format json`)
//! | field | meaning |
//! | --- | --- |
//! | `dir` | the WAL directory read |
//! | `segments[]` | one object per segment file, in base order (below) |
//! | `totals` | `segments`, `records`, `markers`, `entries` (log entries after truncations), `used_bytes`, `file_bytes`, `first_offset`, `next_offset`, `last_offset`, `last_epoch`, `max_epoch` |
//! | `trim_point` | the log's first offset: every offset below it was deleted by retention (0: nothing trimmed) |
//! | `last_trim_before` | `before` of the newest Trim event in the log (the point the master asked for; whole segments only are deleted, so `trim_point <= last_trim_before` once the store acted on it), `null` if none |
//! | `promised_epoch` | from the `promised_epoch` file (0 if absent), `null` if damaged |
//! | `end` | how the log ends (see [`super::EndSummary`]) |
//! | `live_holder` | `{pid, name}` of a running process holding the WAL's lock, or `null` |
//!
//! | segment field | meaning |
//! | --- | --- |
//! | `name`, `base_offset` | file name and the base offset it encodes |
//! | `last_offset` | offset of the last event record accepted in it (`null` if none) |
//! | `records`, `markers` | event records and truncation markers accepted in it (entries a later marker dropped still count here) |
//! | `used_bytes` | end of its last accepted record, bytes |
//! | `file_bytes` | its size on disk (preallocated), bytes |
//! | `version` | its format version: 1 (no header) or 2 (a segment header; docs/format.md) |
//! | `tag` | a version-2 segment's tag as 16 hex digits (a new one each time the file is prepared, reused files included), `null` in version 1 |
//! | `epochs` | distinct epochs of its accepted records, in log order, at most [`EPOCHS_LISTED_MAX`] |
//! | `epochs_count` | how many distinct epochs (may exceed the list) |

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::Context;
use quire_proto::{EventBody, EventKind};
use quire_wal::{PromisedEpoch, RecordStatus};
use serde::Serialize;

use super::{file_name, live_holder, warn_live, EndSummary, LiveHolder};
use crate::output::{self, OutputFormat, Report, Table};

/// Most distinct epochs listed per segment.
pub const EPOCHS_LISTED_MAX: usize = 32;

/// What to summarize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatConfig {
    /// WAL directory or data directory.
    pub dir: PathBuf,
    /// Output format (`text` is the table).
    pub format: OutputFormat,
}

/// One segment's summary; see the module docs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SegmentStat {
    /// File name.
    pub name: String,
    /// Base offset.
    pub base_offset: u64,
    /// Last event record's offset.
    pub last_offset: Option<u64>,
    /// Event records accepted.
    pub records: u64,
    /// Truncation markers accepted.
    pub markers: u64,
    /// End of the last accepted record, bytes.
    pub used_bytes: u64,
    /// File size, bytes.
    pub file_bytes: u64,
    /// Format version (1 or 2).
    pub version: u8,
    /// A version-2 segment's tag (16 hex digits).
    pub tag: Option<String>,
    /// Distinct epochs, in order, at most [`EPOCHS_LISTED_MAX`].
    pub epochs: Vec<u64>,
    /// Distinct epochs in all.
    pub epochs_count: u64,
}

/// The totals; see the module docs.
#[derive(Debug, Clone, Serialize)]
pub struct Totals {
    /// Segment files.
    pub segments: usize,
    /// Event records accepted.
    pub records: u64,
    /// Truncation markers.
    pub markers: u64,
    /// Log entries after truncations.
    pub entries: u64,
    /// Sum of `used_bytes`.
    pub used_bytes: u64,
    /// Sum of `file_bytes`.
    pub file_bytes: u64,
    /// The log's first offset.
    pub first_offset: u64,
    /// One past its last entry.
    pub next_offset: u64,
    /// Last entry's offset.
    pub last_offset: Option<u64>,
    /// Last entry's epoch.
    pub last_epoch: Option<u64>,
    /// Highest epoch of any accepted record.
    pub max_epoch: u64,
}

/// `quire wal stat`'s result.
#[derive(Debug, Clone, Serialize)]
pub struct StatReport {
    /// The WAL directory read.
    pub dir: String,
    /// Per segment.
    pub segments: Vec<SegmentStat>,
    /// For the log.
    pub totals: Totals,
    /// The log's first offset: offsets below were deleted by retention.
    pub trim_point: u64,
    /// `before` of the newest Trim event in the log.
    pub last_trim_before: Option<u64>,
    /// The promised epoch, `None` if its file is damaged.
    pub promised_epoch: Option<u64>,
    /// How the log ends.
    pub end: EndSummary,
    /// A running process holding the WAL's lock.
    pub live_holder: Option<LiveHolder>,
}

impl Report for StatReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{:<24} {:>3} {:>12} {:>12} {:>10} {:>7} {:>12} {:>12}  EPOCHS",
            "SEGMENT", "VER", "BASE", "LAST", "RECORDS", "MARKERS", "USED_BYTES", "FILE_BYTES"
        )?;
        for s in &self.segments {
            let mut epochs: Vec<String> = s.epochs.iter().map(u64::to_string).collect();
            if s.epochs_count > s.epochs.len() as u64 {
                epochs.push(format!("... ({} in all)", s.epochs_count));
            }
            writeln!(
                out,
                "{:<24} {:>3} {:>12} {:>12} {:>10} {:>7} {:>12} {:>12}  {}",
                s.name,
                s.version,
                s.base_offset,
                s.last_offset
                    .map_or_else(|| "-".to_owned(), |o| o.to_string()),
                s.records,
                s.markers,
                s.used_bytes,
                s.file_bytes,
                if epochs.is_empty() {
                    "-".to_owned()
                } else {
                    epochs.join(",")
                }
            )?;
        }
        let t = &self.totals;
        let last = match (t.last_offset, t.last_epoch) {
            (Some(o), Some(e)) => format!("offset {o}, epoch {e}"),
            _ => "none (empty log)".to_owned(),
        };
        writeln!(out)?;
        let mut table = Table::new();
        table
            .row("wal", &self.dir)
            .row(
                "segments",
                format!(
                    "{}, {} of {} bytes used",
                    t.segments, t.used_bytes, t.file_bytes
                ),
            )
            .row(
                "records",
                format!("{} event record(s), {} marker(s)", t.records, t.markers),
            )
            .row(
                "log",
                format!(
                    "offsets [{}, {}), {} entries",
                    t.first_offset, t.next_offset, t.entries
                ),
            )
            .row("last entry", last)
            .row("trim point", self.describe_trim())
            .row("max epoch", t.max_epoch.to_string())
            .row(
                "promised",
                self.promised_epoch
                    .map_or_else(|| "DAMAGED".to_owned(), |p| format!("epoch {p}")),
            )
            .row("end", self.end.describe());
        if let Some(h) = &self.live_holder {
            table.row("note", format!("open by a running process, {h}"));
        }
        table.write(out)
    }
}

impl StatReport {
    fn describe_trim(&self) -> String {
        let asked = self.last_trim_before.map_or_else(String::new, |b| {
            format!("; the last Trim event asks for {b}")
        });
        if self.trim_point == 0 {
            format!("none (nothing trimmed){asked}")
        } else {
            format!(
                "offset {} (offsets below were deleted by retention){asked}",
                self.trim_point
            )
        }
    }
}

/// Runs `quire wal stat`, printing to `out`.
///
/// # Errors
/// A bad directory or an I/O error reading the log or writing the output.
pub fn run(config: &StatConfig, out: &mut dyn Write) -> anyhow::Result<()> {
    let report = stat(config)?;
    output::emit(&report, config.format, &mut &mut *out).context("cannot write the report")?;
    Ok(())
}

/// Summarizes the log of `config.dir` (without printing).
///
/// # Errors
/// A bad directory or an I/O error reading the log.
pub fn stat(config: &StatConfig) -> anyhow::Result<StatReport> {
    let wal_dir = super::resolve_dir(&config.dir)?;
    let holder = live_holder(&wal_dir);
    if let Some(h) = &holder {
        warn_live(&wal_dir, h);
    }
    // Filled by segment index as the scan goes; the scan's own summaries complete them.
    let mut per_segment: Vec<SegmentStat> = Vec::new();
    let mut last_trim_before: Option<u64> = None;
    let report = quire_wal::inspect(&wal_dir, |r| {
        let Some(h) = r.header else { return };
        if matches!(r.status, RecordStatus::Bad(_)) {
            return;
        }
        if matches!(r.status, RecordStatus::Entry) && h.kind == EventKind::Trim.as_u8() {
            if let Ok(EventBody::Trim(t)) = EventBody::decode(
                EventKind::Trim,
                &bytes::Bytes::copy_from_slice(r.payload).into(),
            ) {
                last_trim_before = last_trim_before.max(Some(t.before.0));
            }
        }
        if per_segment.len() <= r.segment_index {
            per_segment.resize_with(r.segment_index + 1, SegmentStat::default);
        }
        let s = &mut per_segment[r.segment_index];
        if matches!(r.status, RecordStatus::Entry) {
            s.last_offset = Some(h.offset.0);
        }
        if s.epochs.last() != Some(&h.epoch.0) {
            s.epochs_count += 1;
            if s.epochs.len() < EPOCHS_LISTED_MAX {
                s.epochs.push(h.epoch.0);
            }
        }
    })
    .with_context(|| format!("cannot read the WAL in {}", wal_dir.display()))?;
    per_segment.resize_with(report.segments.len(), SegmentStat::default);
    for (s, seg) in per_segment.iter_mut().zip(&report.segments) {
        s.name = file_name(&seg.path);
        s.base_offset = seg.base.0;
        s.records = seg.entries;
        s.markers = seg.markers;
        s.used_bytes = seg.end.0;
        s.file_bytes = seg.file_bytes;
        s.version = seg.version();
        s.tag = (seg.tag != quire_wal::format::SegmentTag::V1)
            .then(|| format!("{:016x}", seg.tag.get()));
    }
    let promised_epoch = match PromisedEpoch::load(&wal_dir) {
        Ok(p) => Some(p.epoch().0),
        Err(e) if e.is_corruption() => {
            tracing::warn!("{e}");
            None
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "cannot read the promised epoch in {}",
                wal_dir.display()
            )))
        }
    };
    let totals = Totals {
        segments: per_segment.len(),
        records: per_segment.iter().map(|s| s.records).sum(),
        markers: report.markers,
        entries: report.entries,
        used_bytes: per_segment.iter().map(|s| s.used_bytes).sum(),
        file_bytes: per_segment.iter().map(|s| s.file_bytes).sum(),
        first_offset: report.start.0,
        next_offset: report.next.0,
        last_offset: report.last.map(|p| p.offset.0),
        last_epoch: report.last.map(|p| p.epoch.0),
        max_epoch: report.max_epoch.0,
    };
    Ok(StatReport {
        dir: wal_dir.display().to_string(),
        segments: per_segment,
        trim_point: totals.first_offset,
        last_trim_before,
        totals,
        promised_epoch,
        end: EndSummary::of(&report.end),
        live_holder: holder,
    })
}
