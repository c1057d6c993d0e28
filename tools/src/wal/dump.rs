//! `quire wal dump DIR`: one line per record as the recovery scan meets it, in file order.
//!
//! Read-only (`quire_wal::inspect`). Lines are printed as the scan goes (text and
//! `jsonl`), so a large log streams; `--from` and `--count` choose which records are
//! printed, the scan itself always reads the whole log (its end is part of the output).
//!
//! # Output
//! Text: a header row, one row per record, then a `--` line with how the log ends. With
//! `--payload hex|utf8` the PAYLOAD column of an event shows its decoded fields
//! (`topic="t" producer_id=… sequence=3 message_bytes=5 message="hello"`, the message in
//! hex or as quoted UTF-8 with control characters escaped); a payload that does not decode
//! is shown raw (quoted and escaped in `utf8`).
//!
//! `--format jsonl`: one object per record, then one end object; `type` tells them apart.
//!
//! | field (`"type": "record"`) | meaning |
//! | --- | --- |
//! | `offset`, `epoch` | from the header (`null` if the header did not parse) |
//! | `kind`, `kind_name` | the kind byte and its name (`message`, ..., `truncate` for a WAL truncation marker, `unknown`) |
//! | `length` | payload bytes (from the header) |
//! | `record_bytes` | header + payload bytes (0 if the header did not parse) |
//! | `segment`, `position` | segment file name and byte position of the record in it |
//! | `checksum_ok` | whether the CRC-32C holds |
//! | `status` | `"entry"`, `"marker"` (a truncation marker; `dropped` entries) or `"bad"` (the record that ends the log; `problem` says why) |
//! | `payload` | with `--payload hex` or `utf8` only: the record's whole payload (for an event, its body with the binary header) |
//! | `event` | with `--payload hex` or `utf8`, for an entry whose payload decodes as the body of its event kind: the decoded event (see [`super::event`]: `kind_name`, `topic`, `producer_id`, `sequence`, `message`, ...) |
//! | `event_error` | with `--payload hex` or `utf8`, for an entry of an event kind whose payload does not decode: why (the payload is then only shown raw) |
//!
//! | field (`"type": "end"`) | meaning |
//! | --- | --- |
//! | `records_printed`, `records_scanned` | counts |
//! | `segments`, `first_offset`, `next_offset`, `entries` | the log the scan found |
//! | `last_offset`, `last_epoch` | its last entry (`null` if empty) |
//! | `end` | how the log ends (see [`super::EndSummary`]) |
//! | `live_holder` | `{pid, name}` of a running process holding the WAL's lock, or `null` |
//!
//! `--format json` prints one object `{"records": [...], "end": {...}}` at the end.

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::Context;
use quire_wal::{RecordStatus, ScannedRecord};
use serde::Serialize;

use super::event::{self, DecodedEvent};
use super::{file_name, kind_name, live_holder, warn_live, EndSummary, LiveHolder};
use crate::output::{write_json_line, OutputFormat};

/// How `dump` prints payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadMode {
    /// Not at all.
    #[default]
    None,
    /// Lowercase hex, two digits per byte; an event's message in hex beside its decoded
    /// fields.
    Hex,
    /// As UTF-8, invalid sequences replaced by U+FFFD (quoted and escaped in text output);
    /// an event's message as UTF-8 beside its decoded fields.
    Utf8,
}

/// What to dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpConfig {
    /// WAL directory or data directory.
    pub dir: PathBuf,
    /// Print records whose offset is at least this (records without a parsable header
    /// are always printed).
    pub from: Option<u64>,
    /// Print at most this many records.
    pub count: Option<u64>,
    /// Payload printing.
    pub payload: PayloadMode,
    /// Output format.
    pub format: OutputFormat,
}

/// One printed record; see the module docs.
#[derive(Debug, Clone, Serialize)]
pub struct DumpRecord {
    /// Always `"record"`.
    #[serde(rename = "type")]
    pub line_type: &'static str,
    /// Header offset.
    pub offset: Option<u64>,
    /// Header epoch.
    pub epoch: Option<u64>,
    /// Kind byte.
    pub kind: Option<u8>,
    /// Kind name.
    pub kind_name: Option<&'static str>,
    /// Payload length from the header, bytes.
    pub length: Option<u32>,
    /// Header + payload, bytes.
    pub record_bytes: u64,
    /// Segment file name.
    pub segment: String,
    /// Byte position in the segment.
    pub position: u64,
    /// Whether the checksum holds.
    pub checksum_ok: bool,
    /// `"entry"`, `"marker"` or `"bad"`.
    pub status: &'static str,
    /// Markers: entries dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
    /// Bad records: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// The payload in the chosen mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The payload decoded as the broker's event body (hex or utf8 mode, entries only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<DecodedEvent>,
    /// Why an entry of an event kind did not decode (hex or utf8 mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_error: Option<String>,
}

/// The last line; see the module docs.
#[derive(Debug, Clone, Serialize)]
pub struct DumpEnd {
    /// Always `"end"`.
    #[serde(rename = "type")]
    pub line_type: &'static str,
    /// Records printed.
    pub records_printed: u64,
    /// Records the scan met (including the bad one, if any).
    pub records_scanned: u64,
    /// Segment files.
    pub segments: usize,
    /// The log's first offset.
    pub first_offset: u64,
    /// One past its last entry.
    pub next_offset: u64,
    /// Entries in the log (after truncations).
    pub entries: u64,
    /// Offset of the last entry.
    pub last_offset: Option<u64>,
    /// Epoch of the last entry.
    pub last_epoch: Option<u64>,
    /// How the log ends.
    pub end: EndSummary,
    /// A running process holding the WAL's lock.
    pub live_holder: Option<LiveHolder>,
}

#[derive(Serialize)]
struct JsonDump<'a> {
    records: &'a [DumpRecord],
    end: &'a DumpEnd,
}

/// Whether a record of `kind` may carry users' SCRAM keys (StoredKey, ServerKey, salt): a
/// user event, or a trim event with a checkpoint or a part of one (byte 9 of a Trim body is
/// its checkpoint tag). Its raw payload is not printed; the decoded event, which leaves the
/// keys out, still is. The segment files hold them all the same: protect the data
/// directory.
fn holds_credentials(kind: u8, payload: &[u8]) -> bool {
    use quire_proto::EventKind;
    match EventKind::from_u8(kind) {
        Some(EventKind::UserAdmin) => true,
        Some(EventKind::Trim) => payload.get(9).is_none_or(|&tag| tag != 0),
        _ => false,
    }
}

impl DumpRecord {
    fn of(r: &ScannedRecord<'_>, payload: PayloadMode) -> DumpRecord {
        let (status, dropped, problem) = match r.status {
            RecordStatus::Entry => ("entry", None, None),
            RecordStatus::Marker { dropped } => ("marker", Some(dropped), None),
            RecordStatus::Bad(why) => ("bad", None, Some(why.to_string())),
            // The tools scan with `DamagedRecords::Refuse`: never met here.
            RecordStatus::Damaged { .. } => (
                "damaged",
                None,
                Some("fails its checks between valid neighbours".to_owned()),
            ),
        };
        let (event, event_error) = match (r.status, r.header) {
            (RecordStatus::Entry, Some(h)) => match event::decode(h.kind, r.payload, payload) {
                Ok(event) => (event, None),
                Err(why) => (None, Some(why)),
            },
            _ => (None, None),
        };
        DumpRecord {
            line_type: "record",
            offset: r.header.map(|h| h.offset.0),
            epoch: r.header.map(|h| h.epoch.0),
            kind: r.header.map(|h| h.kind),
            kind_name: r.header.map(|h| kind_name(h.kind)),
            length: r.header.map(|h| h.length),
            record_bytes: r.bytes,
            segment: file_name(r.segment),
            position: r.position.0,
            checksum_ok: r.checksum_ok,
            status,
            dropped,
            problem,
            payload: match payload {
                PayloadMode::None => None,
                _ if r
                    .header
                    .is_some_and(|h| holds_credentials(h.kind, r.payload)) =>
                {
                    Some(format!(
                        "<{} bytes not shown: they may hold SCRAM credentials>",
                        r.payload.len()
                    ))
                }
                PayloadMode::Hex => Some(hex(r.payload)),
                PayloadMode::Utf8 => Some(String::from_utf8_lossy(r.payload).into_owned()),
            },
            event,
            event_error,
        }
    }

    fn write_text(&self, out: &mut dyn Write, payload: PayloadMode) -> io::Result<()> {
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let kind = match (self.kind, self.kind_name) {
            (Some(k), Some(name)) => format!("{name}({k})"),
            _ => "-".to_owned(),
        };
        let status = match (&self.dropped, &self.problem) {
            (Some(d), _) => format!("{} dropped={d}", self.status),
            (_, Some(p)) => format!("{}: {p}", self.status),
            _ => self.status.to_owned(),
        };
        write!(
            out,
            "{:>12} {:>10} {:<18} {:>9} {:<24} {:>12} {:<3} {}",
            opt(self.offset),
            opt(self.epoch),
            kind,
            opt(self.length.map(u64::from)),
            self.segment,
            self.position,
            if self.checksum_ok { "ok" } else { "BAD" },
            status
        )?;
        match (&self.event, &self.payload, payload) {
            (Some(event), _, _) => {
                write!(out, " ")?;
                event.write_text(out, payload)?;
            }
            (None, Some(p), PayloadMode::Utf8) => write!(out, " {p:?}")?,
            (None, Some(p), _) => write!(out, " {p}")?,
            _ => {}
        }
        writeln!(out)
    }
}

fn text_header(out: &mut dyn Write, payload: PayloadMode) -> io::Result<()> {
    write!(
        out,
        "{:>12} {:>10} {:<18} {:>9} {:<24} {:>12} {:<3} STATUS",
        "OFFSET", "EPOCH", "KIND", "LENGTH", "SEGMENT", "POSITION", "CRC"
    )?;
    if payload != PayloadMode::None {
        write!(out, " PAYLOAD")?;
    }
    writeln!(out)
}

/// `bytes` in lowercase hex, two digits per byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// Runs `quire wal dump`, writing to `out`. A closed pipe (`| head`) ends the output
/// quietly.
///
/// # Errors
/// A bad directory, an I/O error reading the log, or writing to `out`.
pub fn run(config: &DumpConfig, out: &mut dyn Write) -> anyhow::Result<()> {
    let wal_dir = super::resolve_dir(&config.dir)?;
    let holder = live_holder(&wal_dir);
    if let Some(h) = &holder {
        warn_live(&wal_dir, h);
    }
    let mut printed = 0u64;
    let mut scanned = 0u64;
    let mut collected = Vec::new();
    let mut write_error: Option<io::Error> = None;
    let limit = config.count.unwrap_or(u64::MAX);
    if config.format == OutputFormat::Text {
        if let Err(e) = text_header(out, config.payload) {
            write_error = Some(e);
        }
    }
    let report = quire_wal::inspect(&wal_dir, |r| {
        scanned += 1;
        if write_error.is_some() || printed >= limit {
            return;
        }
        if let (Some(from), Some(h)) = (config.from, r.header) {
            if h.offset.0 < from {
                return;
            }
        }
        let record = DumpRecord::of(r, config.payload);
        printed += 1;
        let result = match config.format {
            OutputFormat::Text => record.write_text(out, config.payload),
            OutputFormat::Jsonl => write_json_line(&record, &mut &mut *out),
            OutputFormat::Json => {
                collected.push(record);
                Ok(())
            }
        };
        if let Err(e) = result {
            write_error = Some(e);
        }
    })
    .with_context(|| format!("cannot read the WAL in {}", wal_dir.display()))?;
    let end = DumpEnd {
        line_type: "end",
        records_printed: printed,
        records_scanned: scanned,
        segments: report.segments.len(),
        first_offset: report.start.0,
        next_offset: report.next.0,
        entries: report.entries,
        last_offset: report.last.map(|p| p.offset.0),
        last_epoch: report.last.map(|p| p.epoch.0),
        end: EndSummary::of(&report.end),
        live_holder: holder,
    };
    let result = match write_error {
        Some(e) => Err(e),
        None => match config.format {
            OutputFormat::Text => writeln!(
                out,
                "-- {printed} record(s) printed, {scanned} scanned; log [{}, {}), {} entries; \
                 end: {}",
                end.first_offset,
                end.next_offset,
                end.entries,
                end.end.describe()
            ),
            OutputFormat::Jsonl => write_json_line(&end, &mut &mut *out),
            OutputFormat::Json => write_json_line(
                &JsonDump {
                    records: &collected,
                    end: &end,
                },
                &mut &mut *out,
            ),
        }
        .and_then(|()| out.flush()),
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write the dump"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_that_may_hold_keys_are_known() {
        use quire_proto::{EventBody, Offset, TrimEvent};
        let plain = EventBody::Trim(TrimEvent::plain(Offset(5)))
            .to_payload()
            .unwrap()
            .to_bytes();
        let checkpoint = EventBody::Trim(TrimEvent {
            before: Offset(5),
            checkpoint: Some(Box::default()),
            part: None,
        })
        .to_payload()
        .unwrap()
        .to_bytes();
        assert!(!holds_credentials(5, &plain));
        assert!(holds_credentials(5, &checkpoint));
        assert!(holds_credentials(6, b"anything"));
        assert!(!holds_credentials(7, b"an acl entry"));
        assert!(!holds_credentials(1, b"a message"));
    }

    #[test]
    fn hex_is_lowercase_pairs() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }
}

#[cfg(test)]
mod record_tests {
    use std::path::Path;

    use bytes::BytesMut;
    use quire_proto::{encode_message_event, Epoch, Offset};
    use quire_wal::format::Header;
    use quire_wal::Position;

    use super::*;

    fn scanned<'a>(payload: &'a [u8], status: RecordStatus) -> ScannedRecord<'a> {
        ScannedRecord {
            segment_index: 0,
            segment: Path::new("/d/00000000000000000000.log"),
            position: Position(4096),
            header: Some(Header {
                crc: 0,
                version: 2,
                tag_field: 7,
                kind: 1,
                length: u32::try_from(payload.len()).unwrap(),
                epoch: Epoch(3),
                offset: Offset(9),
            }),
            bytes: 32 + payload.len() as u64,
            checksum_ok: true,
            status,
            payload,
        }
    }

    fn text(record: &DumpRecord, mode: PayloadMode) -> String {
        let mut out = Vec::new();
        record.write_text(&mut out, mode).unwrap();
        let line = String::from_utf8(out).unwrap();
        assert!(line.ends_with('\n'), "{line}");
        line.trim_end_matches('\n').to_owned()
    }

    /// A newcomer dumped a store with `--payload utf8` and saw the event header's bytes
    /// (version, topic length, producer id, sequence, length) as garbage before each
    /// message: the payload of a store's record is an event body, not the message.
    #[test]
    fn utf8_shows_a_message_event_decoded() {
        let mut payload = BytesMut::new();
        encode_message_event("numbers", 5, 1, b"hello", &mut payload).unwrap();
        let r = scanned(&payload, RecordStatus::Entry);
        let record = DumpRecord::of(&r, PayloadMode::Utf8);
        let line = text(&record, PayloadMode::Utf8);
        assert!(
            line.ends_with(
                r#"entry topic="numbers" producer_id=0000000000000005 sequence=1 message_bytes=5 message="hello""#
            ),
            "{line}"
        );
        let json = serde_json::to_value(&record).unwrap();
        // The fields that were there keep their names and meaning: `payload` is the
        // record's whole payload.
        assert_eq!(json["offset"], 9);
        assert_eq!(json["kind_name"], "message");
        assert_eq!(json["status"], "entry");
        assert_eq!(json["payload"], String::from_utf8_lossy(&payload).as_ref());
        assert_eq!(json["event"]["kind_name"], "message");
        assert_eq!(json["event"]["topic"], "numbers");
        assert_eq!(json["event"]["sequence"], 1);
        assert_eq!(json["event"]["message"], "hello");
        assert!(json.get("event_error").is_none(), "{json}");

        let json = serde_json::to_value(DumpRecord::of(&r, PayloadMode::None)).unwrap();
        assert!(
            json.get("payload").is_none() && json.get("event").is_none(),
            "{json}"
        );
    }

    #[test]
    fn a_payload_that_is_no_event_body_is_shown_raw() {
        let r = scanned(b"plain\ttext", RecordStatus::Entry);
        let record = DumpRecord::of(&r, PayloadMode::Utf8);
        assert!(
            text(&record, PayloadMode::Utf8).ends_with(r#"entry "plain\ttext""#),
            "{}",
            text(&record, PayloadMode::Utf8)
        );
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["payload"], "plain\ttext");
        assert!(json.get("event").is_none(), "{json}");
        assert!(
            json["event_error"]
                .as_str()
                .unwrap()
                .starts_with("not a message event body"),
            "{json}"
        );

        // The record that ends the log is never decoded: its bytes are not data.
        let mut payload = BytesMut::new();
        encode_message_event("t", 0, 0, b"x", &mut payload).unwrap();
        let r = scanned(&payload, RecordStatus::Bad(quire_wal::BadRecord::Checksum));
        let json = serde_json::to_value(DumpRecord::of(&r, PayloadMode::Utf8)).unwrap();
        assert!(
            json.get("event").is_none() && json.get("event_error").is_none(),
            "{json}"
        );
    }
}
