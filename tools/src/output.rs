//! How `quire` commands print results: the `--format` choice and the writers for it.
//!
//! This module owns the output conventions shared by every command; it does not know what
//! any command measures. The stable contract, for scripts:
//!
//! - `text` (the default) is for people. Its layout may change between versions.
//! - `json` prints **one** JSON object on one line, followed by a newline, when the command
//!   has finished. Field names and meanings are documented per command and only ever
//!   gain fields; numbers carry their unit in the field name (`p99_us`, `duration_s`).
//! - `jsonl` prints one JSON object per line as results arrive (for commands that stream,
//!   such as a consumer). A command with a single result prints the same single line as
//!   `json`.
//!
//! Results go to stdout; logs and errors go to stderr, so stdout stays machine-readable.

use std::io::{self, Write};

use serde::Serialize;

/// The `--format` value of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    /// A short table for people; layout not stable. `table` is accepted as another name.
    #[default]
    #[value(alias = "table")]
    Text,
    /// One JSON object on one line, printed when the command finishes.
    Json,
    /// One JSON object per line, printed as results arrive.
    Jsonl,
}

/// A command result that can be printed in every [`OutputFormat`].
pub trait Report: Serialize {
    /// Writes the human-readable form, ending with a newline.
    ///
    /// # Errors
    /// Any error of `out`.
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()>;
}

/// Prints `report` to `out` in `format` and flushes `out`.
///
/// # Errors
/// Any error of `out`, or of serializing `report` (which a well-formed `Serialize` impl
/// never returns).
pub fn emit(report: &impl Report, format: OutputFormat, out: &mut impl Write) -> io::Result<()> {
    match format {
        OutputFormat::Text => report.write_text(out)?,
        OutputFormat::Json | OutputFormat::Jsonl => write_json_line(report, out)?,
    }
    out.flush()
}

/// Writes `value` as one line of compact JSON followed by `\n` (the `jsonl` record form).
///
/// # Errors
/// Any error of `out` or of serializing `value`.
pub fn write_json_line(value: &impl Serialize, out: &mut impl Write) -> io::Result<()> {
    serde_json::to_writer(&mut *out, value).map_err(io::Error::other)?;
    out.write_all(b"\n")
}

/// A two-column text table of labels and values, with the labels padded to one width.
///
/// ```
/// let mut table = quire_tools::output::Table::new();
/// table.row("throughput", "512.0 MB/s");
/// table.row("p99", "830 us");
/// let mut out = Vec::new();
/// table.write(&mut out).unwrap();
/// assert_eq!(String::from_utf8(out).unwrap(), "throughput  512.0 MB/s\np99         830 us\n");
/// ```
#[derive(Debug, Default, Clone)]
pub struct Table {
    rows: Vec<(String, String)>,
}

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a row.
    pub fn row(&mut self, label: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.rows.push((label.into(), value.into()));
        self
    }

    /// Writes every row as `label  value\n`, labels left-aligned to the widest one.
    ///
    /// # Errors
    /// Any error of `out`.
    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        let width = self
            .rows
            .iter()
            .map(|(label, _)| label.chars().count())
            .max()
            .unwrap_or(0);
        for (label, value) in &self.rows {
            writeln!(out, "{label:<width$}  {value}")?;
        }
        Ok(())
    }
}

/// `1048576` → `"1 MiB"`, `12288` → `"12 KiB"`, `1000` → `"1000 B"`: the largest unit the
/// size reaches, as a whole number; from 1 MiB up a size that is no whole number of that
/// unit is rounded to a tenth of it (`1200000000` → `"1.1 GiB"`, as a fallocated file sized
/// for the duration is), below 1 MiB it is given in bytes.
pub fn human_bytes(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes < 1 << shift {
            continue;
        }
        if bytes % (1 << shift) == 0 {
            return format!("{} {unit}", bytes >> shift);
        }
        if shift >= 20 {
            return format!("{:.1} {unit}", bytes as f64 / (1u64 << shift) as f64);
        }
        break;
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Example {
        ops: u64,
        p99_us: u64,
    }

    impl Report for Example {
        fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
            Table::new()
                .row("ops", self.ops.to_string())
                .row("p99", format!("{} us", self.p99_us))
                .write(out)
        }
    }

    #[test]
    fn json_and_jsonl_print_one_line() {
        let report = Example { ops: 3, p99_us: 40 };
        for format in [OutputFormat::Json, OutputFormat::Jsonl] {
            let mut out = Vec::new();
            emit(&report, format, &mut out).unwrap();
            assert_eq!(
                String::from_utf8(out).unwrap(),
                "{\"ops\":3,\"p99_us\":40}\n"
            );
        }
    }

    #[test]
    fn text_is_an_aligned_table() {
        let report = Example { ops: 3, p99_us: 40 };
        let mut out = Vec::new();
        emit(&report, OutputFormat::Text, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "ops  3\np99  40 us\n");
    }

    #[test]
    fn human_bytes_uses_the_largest_unit_reached() {
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(256 << 10), "256 KiB");
        assert_eq!(human_bytes(12288), "12 KiB");
        assert_eq!(human_bytes(1000), "1000 B");
        assert_eq!(human_bytes(1_200_000_000), "1.1 GiB");
        assert_eq!(human_bytes((3 << 20) + 1000), "3.0 MiB");
    }
}
