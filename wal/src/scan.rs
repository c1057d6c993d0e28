//! The recovery scan: walks every segment in name order, applies the rules that decide
//! which records are the log, and says where and how the log ends. Read-only.
//!
//! Rules (mirrored in `docs/format.md`):
//!
//! - Segments are read in base-offset order. The first segment's base is where the log
//!   starts. A later segment's base must not exceed the next expected offset (else a
//!   segment or the last records of the previous one are missing: corruption, located at
//!   the end of the previous segment's last record, unless neither it nor any later
//!   segment holds a valid record, which ends the log as a torn tail does,
//!   [`BadRecord::SegmentGap`]); a base
//!   below it means the segment was started by a truncation, and its first record must be
//!   an accepted truncation marker at exactly its base.
//! - A segment that starts with a [`SegmentHeader`] is version 2: its records start after
//!   the header and must carry its [`SegmentTag`]. Any other segment is version 1.
//! - Bytes that are not a record of this segment's life are skipped to the next multiple of
//!   [`PAD_GRANULE_BYTES`]: in version 1, zeros (padding and preallocated space); in
//!   version 2, anything that is not **ours** — a header whose tag field is not the
//!   segment's, unless it is a well-formed version-2 header at exactly the next expected
//!   offset whose checksum holds once the segment's tag field is put in place of its own.
//!   Zeros, a reused file's previous life and its payloads' bytes (forged headers
//!   included: their writer did not know the tag) are not ours; the records of this life
//!   are, and so is any of them with one bit flipped (a flip in the tag field is undone by
//!   the second test, a flip elsewhere leaves the tag).
//! - An event record counts only if its header is well-formed, its checksum holds and its
//!   offset is the next expected one.
//! - A truncation marker `{offset: x, epoch: w}` counts only if its checksum holds, the
//!   segment's base <= x <= the next expected offset, the log start <= x, `w` >= every
//!   epoch accepted so far (entries and markers), and — when an entry exists at `x` —
//!   `w` > that entry's epoch. It drops every entry from `x` on.
//! - The first record that does not count ends the log. If any well-formed record with a
//!   valid checksum lies after it (in the same segment or a later one), that is
//!   **corruption**, reported with segment, position and expected offset. Otherwise the
//!   rest is a **torn tail**.
//!
//! The scan never modifies anything; cutting a torn tail is `recovery.rs`'s job.

use std::io;
use std::path::{Path, PathBuf};

use quire_proto::{Epoch, LogPosition, Offset};

use crate::error::{CorruptionKind, WalError};
use crate::format::{
    self, align_up, Header, HeaderProblem, SegmentHeader, SegmentHeaderProblem, SegmentTag,
    HEADER_BYTES, PAD_GRANULE_BYTES, SEGMENT_HEADER_BYTES, SEGMENT_HEADER_ENCODED_BYTES,
};
use crate::index::EpochRuns;
use crate::segment::SegmentPath;
use crate::storage::{OpenMode, OsStorage, Storage, StorageFile};
use crate::{Mutations, Position};

/// Bytes read from a segment per read call during a scan.
const READ_WINDOW_BYTES: usize = 1 << 20;

/// What the scan decided about one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordStatus {
    /// An event that is part of the log (until a later marker drops it).
    Entry,
    /// An accepted truncation marker; `dropped` entries at or after its offset were dropped.
    Marker {
        /// How many entries it dropped.
        dropped: u64,
    },
    /// The record that ends the log: see [`ScanReport::end`] for whether it is a torn tail
    /// or corruption.
    Bad(BadRecord),
    /// A damaged entry the scan placed in the log anyway ([`DamagedRecords::Place`]): its
    /// bytes fail their checks, but the records around it prove which entry it is. Its
    /// offset is the one the log expected there, its epoch the one its neighbours allow.
    Damaged {
        /// The offset the log expected at this record.
        offset: Offset,
        /// The entry's epoch: its neighbours' when they agree, else the damaged header's
        /// (which lies between them).
        epoch: Epoch,
    },
}

/// What the scan does with a damaged record (one of this segment's life that fails its
/// checks) that valid records follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DamagedRecords {
    /// Stop the log there and report [`CorruptionKind::BadRecordBeforeValid`]: the tools'
    /// view, and what [`crate::Wal::open`] does unless told otherwise.
    #[default]
    Refuse,
    /// Place it in the log as [`RecordStatus::Damaged`] when the records around it prove
    /// which entry it is, and go on; listed in [`ScanReport::damaged`]. Rules (one damaged
    /// record at a time; anything else is refused as above):
    ///
    /// - it is not a segment's required first marker, and with its magic, version, tag
    ///   field and offset put back (the segment's constants, the offset expected there) its
    ///   header parses and is not a truncation marker's;
    /// - if it still fails its checksum, a length or epoch field one bit away from the
    ///   stored one with which the record checks out is the true one (one flipped bit in
    ///   either field is undone exactly);
    /// - the next valid record follows right after the record's extent, or after zeros to
    ///   the next granule and then only bytes that are not ours (a batch's padding) — or,
    ///   at the segment's end, starts the next segment — and is an entry at the next
    ///   offset;
    /// - its epoch is the checked one (which must lie between the previous entry's and
    ///   the next one's), else the one both neighbours have, else the header's when it lies
    ///   between theirs.
    ///
    /// A second damaged record in a row, a zeroed record, or damage the checksum cannot
    /// undo in a length field therefore still refuse. A store places damaged records and repairs them from its peers
    /// (docs/protocol.md, "Damaged records").
    Place,
}

/// Why a record does not count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadRecord {
    /// The file ends inside the header or the payload.
    Short,
    /// The header is malformed.
    Header(HeaderProblem),
    /// A well-formed header of another version or tag than the segment's: in version 2,
    /// bytes of an earlier life of the file (or a flipped bit in the tag field).
    OtherTag,
    /// The checksum does not match.
    Checksum,
    /// The checksum holds but the offset is not the next expected one.
    UnexpectedOffset {
        /// The offset the log expected.
        expected: Offset,
    },
    /// A truncation marker that the rules refuse.
    MarkerRefused,
    /// A segment named below the expected offset does not start with a marker at its base.
    SegmentStart,
    /// The last segment's file is shorter than any the WAL writes — empty, not a multiple
    /// of the alignment, or ending inside the last aligned write — so it was cut after the
    /// WAL wrote it (by hand, or by a damaged file system): records after the end may be
    /// lost, though what is left scans clean.
    FileCut {
        /// The file's length, in bytes.
        file_bytes: u64,
    },
    /// The log ends before the next segment's base, and that segment and every later one
    /// hold no valid record: a segment a roll named (the rename made durable by a later
    /// directory fsync) whose records, and the last ones of the segment before it, never
    /// became durable. Nothing to overwrite and no record removed: the empty segments are
    /// deleted, and the open's pre-cut hook is not called (no tail-cut mark: the log ends
    /// as cleanly as one whose unsynced tail was lost whole).
    SegmentGap {
        /// The base offset of the next segment.
        next_base: Offset,
    },
}

impl std::fmt::Display for BadRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadRecord::Short => write!(f, "file ends inside the record"),
            BadRecord::Header(p) => write!(f, "malformed header ({p:?})"),
            BadRecord::OtherTag => write!(f, "the record's version or tag is not the segment's"),
            BadRecord::Checksum => write!(f, "checksum mismatch"),
            BadRecord::UnexpectedOffset { expected } => {
                write!(f, "offset is not the expected {expected}")
            }
            BadRecord::MarkerRefused => write!(f, "truncation marker refused by the epoch rules"),
            BadRecord::FileCut { file_bytes } => write!(
                f,
                "the segment file was cut to {file_bytes} bytes after it was written (the WAL \
                 only writes whole, aligned, preallocated segments)"
            ),
            BadRecord::SegmentStart => write!(
                f,
                "segment does not start with the marker its name requires"
            ),
            BadRecord::SegmentGap { next_base } => write!(
                f,
                "the log ends before the next segment's base {next_base}, and no later segment \
                 holds a valid record"
            ),
        }
    }
}

/// One record as the scan met it, handed to the visitor of [`scan_dir`].
#[derive(Debug)]
pub struct ScannedRecord<'a> {
    /// Index of the segment in [`ScanReport::segments`].
    pub segment_index: usize,
    /// The segment file.
    pub segment: &'a Path,
    /// Byte position of the record in the segment.
    pub position: Position,
    /// The header, if it parsed.
    pub header: Option<Header>,
    /// Header plus payload in bytes (0 if the header did not parse).
    pub bytes: u64,
    /// Whether the checksum holds (false if the record is short or did not parse).
    pub checksum_ok: bool,
    /// The scan's decision.
    pub status: RecordStatus,
    /// The payload (empty if the record is short or did not parse).
    pub payload: &'a [u8],
}

impl ScannedRecord<'_> {
    /// The checksum of the record's content, whatever segment holds it
    /// ([`format::event_crc`]: no tag), for comparing logs across stores; `None` if the
    /// header did not parse.
    #[must_use]
    pub fn content_crc(&self) -> Option<u32> {
        let h = self.header?;
        Some(format::record_crc(
            SegmentTag::V1,
            h.epoch,
            h.offset,
            h.kind,
            self.payload,
        ))
    }
}

/// One segment's summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentReport {
    /// Base offset (from the name).
    pub base: Offset,
    /// The file.
    pub path: PathBuf,
    /// File size in bytes.
    pub file_bytes: u64,
    /// The segment's tag ([`SegmentTag::V1`] for a version-1 segment).
    pub tag: SegmentTag,
    /// Event records accepted in this segment (some may be dropped by later markers).
    pub entries: u64,
    /// Truncation markers accepted in this segment.
    pub markers: u64,
    /// End of the last accepted record (0 if none).
    pub end: Position,
}

impl SegmentReport {
    /// The segment's record format version.
    #[must_use]
    pub fn version(&self) -> u8 {
        self.tag.version()
    }
}

/// A torn tail: where the log's valid part ends and what follows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// Index of the segment in [`ScanReport::segments`].
    pub segment_index: usize,
    /// The segment that holds the tail.
    pub segment: PathBuf,
    /// Where the first record that does not count starts (the cut point).
    pub position: Position,
    /// The offset expected there.
    pub offset: Offset,
    /// Bytes to overwrite with zeros from `position` on: to the end of the last non-zero
    /// [`PAD_GRANULE_BYTES`] after it in version 1; in version 2, to the end of the last
    /// granule that starts with a header of ours (at least the bad record's header).
    pub bytes: u64,
    /// Why the record at `position` does not count.
    pub problem: BadRecord,
    /// Later segments holding no valid record, to be deleted with the cut.
    pub empty_segments_after: Vec<PathBuf>,
}

/// How the log ends.
#[derive(Clone, Debug)]
pub enum ScanEnd {
    /// After the last valid record there are only zeros.
    Clean,
    /// A torn tail (see [`TornTail`]).
    TornTail(TornTail),
    /// Corruption: a [`WalError::Corruption`] with its location.
    Corruption(WalError),
}

/// The result of a scan.
#[derive(Clone, Debug)]
pub struct ScanReport {
    /// Every segment, in base order.
    pub segments: Vec<SegmentReport>,
    /// The log's first offset.
    pub start: Offset,
    /// One past the last entry.
    pub next: Offset,
    /// The last entry.
    pub last: Option<LogPosition>,
    /// Entries in the log (after truncations).
    pub entries: u64,
    /// Accepted truncation markers.
    pub markers: u64,
    /// Highest epoch of any accepted record (entries and markers).
    pub max_epoch: Epoch,
    /// The epochs of the log's entries.
    pub epochs: EpochRuns,
    /// The offsets of [`RecordStatus::Damaged`] entries still in the log (a later
    /// truncation marker drops those it replaces), ascending. Always empty with
    /// [`DamagedRecords::Refuse`].
    pub damaged: Vec<Offset>,
    /// How the log ends.
    pub end: ScanEnd,
}

/// Reads a segment through a sliding window of [`READ_WINDOW_BYTES`].
struct SegmentReader<F> {
    file: F,
    len: u64,
    window: Vec<u8>,
    window_pos: u64,
    /// The segment's tag, from its header (V1 without one).
    tag: SegmentTag,
    /// Where records may start: 0 in version 1, after the header in version 2.
    data_start: u64,
    /// The header claims version 2 but is damaged.
    header_problem: Option<SegmentHeaderProblem>,
}

impl<F: StorageFile> SegmentReader<F> {
    fn open<S: Storage<File = F>>(storage: &S, path: &Path) -> Result<SegmentReader<F>, WalError> {
        let file = storage
            .open(path, OpenMode::Read)
            .map_err(|e| WalError::io("open", path, e))?;
        let len = file.size().map_err(|e| WalError::io("stat", path, e))?;
        let mut r = SegmentReader {
            file,
            len,
            window: Vec::new(),
            window_pos: 0,
            tag: SegmentTag::V1,
            data_start: 0,
            header_problem: None,
        };
        let n = usize::try_from(len.min(SEGMENT_HEADER_ENCODED_BYTES as u64))
            .expect("invariant: a header fits usize");
        let head = r.bytes(0, n).map_err(|e| WalError::io("read", path, e))?;
        match SegmentHeader::decode(head) {
            Ok(None) => {}
            Ok(Some(h)) => {
                r.tag = h.tag;
                r.data_start = SEGMENT_HEADER_BYTES.min(len);
            }
            Err(p) => r.header_problem = Some(p),
        }
        Ok(r)
    }

    /// Whether the bytes at `pos` are ours (see the module docs): always, if not all zero,
    /// in version 1; in version 2, a header with the segment's tag field, or a well-formed
    /// version-2 header at offset `expected`.
    fn ours(&mut self, pos: u64, expected: Offset) -> io::Result<bool> {
        let end = (pos + HEADER_BYTES as u64).min(self.len);
        if self.tag == SegmentTag::V1 {
            let granule_end = align_up(pos + 1, PAD_GRANULE_BYTES).min(self.len);
            return Ok(!self.all_zero(pos, granule_end)?);
        }
        if end < pos + HEADER_BYTES as u64 {
            // The file ends inside the header (cut short): anything but zeros may be ours.
            return Ok(!self.all_zero(pos, end)?);
        }
        let field = self.tag.field().to_le_bytes();
        let head = self.bytes(pos, HEADER_BYTES)?;
        if head[12..16] == field {
            return Ok(true);
        }
        // A record of this life whose tag field was damaged: a well-formed version-2 header
        // at the next expected offset whose checksum holds once the segment's field is put
        // back. A forged header (a payload's bytes, an earlier life) cannot pass: its
        // writer did not know the tag.
        let Ok(h) = format::decode_header(head) else {
            return Ok(false);
        };
        if h.version != format::VERSION || h.offset != expected {
            return Ok(false);
        }
        let total = h.record_bytes();
        if pos + total > self.len {
            return Ok(false);
        }
        let n = usize::try_from(total).expect("invariant: record length fits usize");
        let tag = self.tag;
        let mut record = self.bytes(pos, n)?.to_vec();
        record[12..16].copy_from_slice(&field);
        Ok(format::checksum_ok(tag, &record))
    }

    /// The bytes `[pos, pos + n)`, which must lie inside the file.
    fn bytes(&mut self, pos: u64, n: usize) -> io::Result<&[u8]> {
        debug_assert!(pos + n as u64 <= self.len);
        let have =
            pos >= self.window_pos && pos + n as u64 <= self.window_pos + self.window.len() as u64;
        if !have {
            let want = usize::try_from(self.len - pos)
                .unwrap_or(usize::MAX)
                .min(n.max(READ_WINDOW_BYTES));
            self.window.resize(want, 0);
            let mut filled = 0;
            while filled < want {
                let got = self
                    .file
                    .read_at(&mut self.window[filled..], pos + filled as u64)?;
                if got == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "segment shrank during the scan",
                    ));
                }
                filled += got;
            }
            self.window_pos = pos;
        }
        let start = usize::try_from(pos - self.window_pos).expect("invariant: inside the window");
        Ok(&self.window[start..start + n])
    }

    /// The header of the valid record (well-formed header, checksum ok) at `pos`, or why
    /// there is none (with the length the header claimed, if it parsed).
    fn probe(&mut self, pos: u64) -> io::Result<Result<Header, (BadRecord, Option<u64>)>> {
        if pos + HEADER_BYTES as u64 > self.len {
            return Ok(Err((BadRecord::Short, None)));
        }
        let h = match format::decode_header(self.bytes(pos, HEADER_BYTES)?) {
            Ok(h) => h,
            Err(p) => return Ok(Err((BadRecord::Header(p), None))),
        };
        let total = h.record_bytes();
        if h.version != self.tag.version() || h.tag_field != self.tag.field() {
            return Ok(Err((BadRecord::OtherTag, Some(total))));
        }
        if pos + total > self.len {
            return Ok(Err((BadRecord::Short, Some(total))));
        }
        let n = usize::try_from(total).expect("invariant: record length fits usize");
        let tag = self.tag;
        if !format::checksum_ok(tag, self.bytes(pos, n)?) {
            return Ok(Err((BadRecord::Checksum, Some(total))));
        }
        Ok(Ok(h))
    }

    /// The first valid record at a granule from `from` (a granule boundary) on, skipping
    /// granules that are not ours (padding, preallocated space, an earlier life): `None`
    /// if the segment ends first, `Some(None)` if bytes of ours that are not a valid record
    /// come first. `expected` is the offset a record there would have.
    fn next_valid(&mut self, from: u64, expected: Offset) -> io::Result<Option<Option<Header>>> {
        let mut g = from;
        while g < self.len {
            if let Ok(h) = self.probe(g)? {
                return Ok(Some(Some(h)));
            }
            if self.ours(g, expected)? {
                return Ok(Some(None));
            }
            g += PAD_GRANULE_BYTES;
        }
        Ok(None)
    }

    /// Whether a valid record starts at `pos`.
    fn valid_record_at(&mut self, pos: u64) -> io::Result<bool> {
        Ok(self.probe(pos)?.is_ok())
    }

    /// Whether the bytes `[from, to)` are all zero.
    fn all_zero(&mut self, from: u64, to: u64) -> io::Result<bool> {
        let n = usize::try_from(to - from).expect("invariant: a granule fits usize");
        Ok(self.bytes(from, n)?.iter().all(|&b| b == 0))
    }

    /// Looks past a bad record at `bad` (whose header said `len_hint` bytes, if it parsed;
    /// `expected` is the offset the log expected there): returns whether a valid record
    /// follows, and where the bytes to cut end ([`TornTail::bytes`]).
    fn look_past(
        &mut self,
        bad: u64,
        len_hint: Option<u64>,
        expected: Offset,
    ) -> io::Result<(bool, u64)> {
        let mut valid_after = false;
        if let Some(len) = len_hint {
            if len > 0 && bad + len < self.len && self.valid_record_at(bad + len)? {
                valid_after = true;
            }
        }
        let v1 = self.tag == SegmentTag::V1;
        let mut live_end = if v1 || bad >= self.len {
            bad
        } else {
            align_up(bad + HEADER_BYTES as u64, PAD_GRANULE_BYTES).min(self.len)
        };
        let mut pos = format::align_down(bad, PAD_GRANULE_BYTES).max(self.data_start);
        while pos < self.len {
            let end = (pos + PAD_GRANULE_BYTES).min(self.len);
            let live = if v1 {
                let n = usize::try_from(end - pos).expect("invariant: a granule fits usize");
                self.bytes(pos, n)?.iter().any(|&b| b != 0)
            } else {
                pos > bad && self.ours(pos, expected)?
            };
            if live {
                live_end = live_end.max(end);
                if !valid_after && pos > bad && self.valid_record_at(pos)? {
                    valid_after = true;
                }
            }
            pos = end;
        }
        Ok((valid_after, live_end))
    }
}

/// Walks the segments of `dir` on the real file system and calls `visit` for every record
/// met, in file order. See the module docs for the rules. Modifies nothing.
///
/// # Errors
/// Only I/O errors and a malformed directory. Corruption is not an error here: it is
/// reported in [`ScanReport::end`] so that a tool can show it.
pub fn scan_dir(
    dir: &Path,
    visit: &mut dyn FnMut(&ScannedRecord<'_>),
) -> Result<ScanReport, WalError> {
    scan_dir_in(&OsStorage, dir, visit)
}

/// [`scan_dir`], with damaged records treated as `damaged` says: with
/// [`DamagedRecords::Place`], the log quire-node would open (`quire wal verify` says
/// whether a store starts on a damaged log).
///
/// # Errors
/// As [`scan_dir`].
pub fn scan_dir_placing(
    dir: &Path,
    visit: &mut dyn FnMut(&ScannedRecord<'_>),
    damaged: DamagedRecords,
) -> Result<ScanReport, WalError> {
    let segments = crate::segment::list_segments_in(&OsStorage, dir)?;
    scan_segments_placing(&OsStorage, &segments, visit, Mutations::default(), damaged)
}

/// [`scan_dir`] on `storage`.
///
/// # Errors
/// As [`scan_dir`].
pub fn scan_dir_in<S: Storage>(
    storage: &S,
    dir: &Path,
    visit: &mut dyn FnMut(&ScannedRecord<'_>),
) -> Result<ScanReport, WalError> {
    let segments = crate::segment::list_segments_in(storage, dir)?;
    scan_segments_in(storage, &segments, visit, Mutations::default())
}

/// [`scan_dir`] over an explicit list of segments (sorted by base).
///
/// # Errors
/// As [`scan_dir`].
pub fn scan_segments(
    segments: &[SegmentPath],
    visit: &mut dyn FnMut(&ScannedRecord<'_>),
) -> Result<ScanReport, WalError> {
    scan_segments_in(&OsStorage, segments, visit, Mutations::default())
}

/// [`scan_segments`] on `storage`, with planted bugs switched on by `mutations` (tests
/// only; [`Mutations::default`] is the shipped behaviour).
///
/// # Errors
/// As [`scan_dir`].
pub fn scan_segments_in<S: Storage>(
    storage: &S,
    segments: &[SegmentPath],
    visit: &mut dyn FnMut(&ScannedRecord<'_>),
    mutations: Mutations,
) -> Result<ScanReport, WalError> {
    scan_segments_placing(storage, segments, visit, mutations, DamagedRecords::Refuse)
}

/// [`scan_segments_in`], with damaged records treated as `damaged` says.
///
/// # Errors
/// As [`scan_dir`].
pub fn scan_segments_placing<S: Storage>(
    storage: &S,
    segments: &[SegmentPath],
    visit: &mut dyn FnMut(&ScannedRecord<'_>),
    mutations: Mutations,
    damaged_rule: DamagedRecords,
) -> Result<ScanReport, WalError> {
    let start = segments.first().map_or(Offset::ZERO, |s| s.base);
    let mut epochs = EpochRuns::new(start);
    let mut max_epoch = Epoch::ZERO;
    let mut markers = 0u64;
    let mut reports = Vec::with_capacity(segments.len());
    let mut end = ScanEnd::Clean;
    let mut damaged = Vec::new();

    'segments: for (si, seg) in segments.iter().enumerate() {
        let mut reader = SegmentReader::open(storage, &seg.path)?;
        let mut report = SegmentReport {
            base: seg.base,
            path: seg.path.clone(),
            file_bytes: reader.len,
            tag: reader.tag,
            entries: 0,
            markers: 0,
            end: Position(0),
        };
        let io_err = |e: io::Error| WalError::io("read", &seg.path, e);
        let expected_at_start = epochs.next();
        if seg.base > expected_at_start {
            let (valid_after, empty) = holds_valid(storage, &segments[si..], expected_at_start)?;
            end = match reports.last() {
                // Nothing readable from here on: the log ends where the last segment's
                // records end, as at a torn tail (rule 4 of the module docs).
                Some(prev) if !valid_after => {
                    let prev: &SegmentReport = prev;
                    ScanEnd::TornTail(TornTail {
                        segment_index: si - 1,
                        segment: prev.path.clone(),
                        position: prev.end,
                        offset: expected_at_start,
                        bytes: 0,
                        problem: BadRecord::SegmentGap {
                            next_base: seg.base,
                        },
                        empty_segments_after: empty,
                    })
                }
                // Valid records follow: corruption, located where the missing entries
                // should begin — after the previous segment's last record.
                Some(prev) => ScanEnd::Corruption(WalError::Corruption {
                    segment: prev.path.clone(),
                    position: prev.end,
                    offset: expected_at_start,
                    problem: CorruptionKind::MissingRecords {
                        next_offset: seg.base,
                    },
                }),
                None => ScanEnd::Corruption(WalError::Corruption {
                    segment: seg.path.clone(),
                    position: Position(0),
                    offset: expected_at_start,
                    problem: CorruptionKind::MissingSegment,
                }),
            };
            for later in &segments[si..] {
                reports.push(SegmentReport {
                    base: later.base,
                    path: later.path.clone(),
                    file_bytes: storage.file_len(&later.path).unwrap_or(0),
                    tag: SegmentTag::V1,
                    entries: 0,
                    markers: 0,
                    end: Position(0),
                });
            }
            break 'segments;
        }
        // The format never goes back to version 1: a segment after a version-2 one without
        // a version-2 header had it damaged (a zeroed sector, a flipped magic), and reading
        // it as version 1 would hide its records. A file too short to hold a header was
        // cut (rule 5, `BadRecord::FileCut`): nothing is hidden in it.
        if reader.header_problem.is_none()
            && reader.tag == SegmentTag::V1
            && reader.len >= SEGMENT_HEADER_ENCODED_BYTES as u64
            && reports
                .last()
                .is_some_and(|r: &SegmentReport| r.tag != SegmentTag::V1)
        {
            reader.header_problem = Some(SegmentHeaderProblem::Missing);
        }
        if let Some(problem) = reader.header_problem {
            end = ScanEnd::Corruption(WalError::Corruption {
                segment: seg.path.clone(),
                position: Position(0),
                offset: expected_at_start,
                problem: CorruptionKind::SegmentHeader { problem },
            });
            reports.push(report);
            break 'segments;
        }
        let must_start_with_marker = seg.base < expected_at_start;
        let mut accepted_here = 0u64;
        let mut pos = reader.data_start;
        let mut bad: Option<(u64, BadRecord, Option<u64>)> = None;
        while pos < reader.len {
            let header = match reader.probe(pos).map_err(io_err)? {
                Ok(h) => h,
                Err((problem, len_hint)) => {
                    // Not a record: padding, preallocated space or (version 2) an earlier
                    // life of the file, up to the next granule (a batch's padding may be
                    // shorter than a header); or where the log ends.
                    let gap_end = align_up(pos + 1, PAD_GRANULE_BYTES).min(reader.len);
                    if !reader.ours(pos, epochs.next()).map_err(io_err)? {
                        pos = gap_end;
                        continue;
                    }
                    let placeable = damaged_rule == DamagedRecords::Place
                        && !(must_start_with_marker && accepted_here == 0);
                    let expected = epochs.next();
                    let prev_epoch = epochs.last().map_or(Epoch::ZERO, |p| p.epoch);
                    let placed = if placeable {
                        place_damaged(
                            storage,
                            &seg.path,
                            &mut reader,
                            segments.get(si + 1),
                            pos,
                            expected,
                            prev_epoch,
                        )?
                    } else {
                        None
                    };
                    if let Some(d) = placed {
                        epochs.push(expected, d.epoch);
                        report.entries += 1;
                        accepted_here += 1;
                        max_epoch = max_epoch.max(d.epoch);
                        damaged.push(expected);
                        visit(&ScannedRecord {
                            segment_index: si,
                            segment: &seg.path,
                            position: Position(pos),
                            header: d.header,
                            bytes: d.bytes,
                            checksum_ok: false,
                            status: RecordStatus::Damaged {
                                offset: expected,
                                epoch: d.epoch,
                            },
                            payload: &[],
                        });
                        pos += d.bytes;
                        report.end = Position(pos);
                        continue;
                    }
                    bad = Some((pos, problem, len_hint));
                    break;
                }
            };
            let total = header.record_bytes();
            let n = usize::try_from(total).expect("invariant: record length fits usize");
            let bytes = reader.bytes(pos, n).map_err(io_err)?;
            let expected = epochs.next();
            let status = if must_start_with_marker && accepted_here == 0 {
                if header.is_truncate_marker()
                    && header.offset == seg.base
                    && marker_ok(&header, seg.base, &epochs, max_epoch)
                {
                    None
                } else {
                    Some(BadRecord::SegmentStart)
                }
            } else if header.is_truncate_marker() {
                (!marker_ok(&header, seg.base, &epochs, max_epoch))
                    .then_some(BadRecord::MarkerRefused)
            } else {
                (header.offset != expected).then_some(BadRecord::UnexpectedOffset { expected })
            };
            if let Some(problem) = status {
                bad = Some((pos, problem, Some(total)));
                break;
            }
            let status = if header.is_truncate_marker() {
                let dropped = expected.0 - header.offset.0;
                epochs.truncate(header.offset);
                damaged.retain(|&o| o < header.offset);
                markers += 1;
                report.markers += 1;
                RecordStatus::Marker { dropped }
            } else {
                epochs.push(header.offset, header.epoch);
                report.entries += 1;
                RecordStatus::Entry
            };
            max_epoch = max_epoch.max(header.epoch);
            accepted_here += 1;
            visit(&ScannedRecord {
                segment_index: si,
                segment: &seg.path,
                position: Position(pos),
                header: Some(header),
                bytes: total,
                checksum_ok: true,
                status,
                payload: &bytes[HEADER_BYTES..],
            });
            pos += total;
            report.end = Position(pos);
        }
        if bad.is_none() && must_start_with_marker && accepted_here == 0 {
            bad = Some((0, BadRecord::SegmentStart, None));
        }
        if let Some((bad_pos, problem, len_hint)) = bad {
            // Tell the visitor about the record that ends the log.
            let (header, payload, checksum_ok) = match problem {
                BadRecord::Header(_) => (None, &[][..], false),
                _ if bad_pos + HEADER_BYTES as u64 <= reader.len => {
                    let h =
                        format::decode_header(reader.bytes(bad_pos, HEADER_BYTES).map_err(io_err)?)
                            .ok();
                    let total = h.map_or(0, |h| h.record_bytes());
                    if h.is_some() && bad_pos + total <= reader.len {
                        let n =
                            usize::try_from(total).expect("invariant: record length fits usize");
                        let tag = reader.tag;
                        let bytes = reader.bytes(bad_pos, n).map_err(io_err)?;
                        (h, &bytes[HEADER_BYTES..], format::checksum_ok(tag, bytes))
                    } else {
                        (h, &[][..], false)
                    }
                }
                _ => (None, &[][..], false),
            };
            visit(&ScannedRecord {
                segment_index: si,
                segment: &seg.path,
                position: Position(bad_pos),
                header,
                bytes: len_hint.unwrap_or(0),
                checksum_ok,
                status: RecordStatus::Bad(problem),
                payload,
            });
            let (valid_here, nonzero_end) = reader
                .look_past(bad_pos, len_hint, epochs.next())
                .map_err(io_err)?;
            let (valid_later, mut empty_after) = if valid_here {
                (true, Vec::new())
            } else {
                holds_valid(storage, &segments[si + 1..], epochs.next())?
            };
            let mut valid_after = valid_here || valid_later;
            let offset = epochs.next();
            if mutations.mid_log_bad_record_is_torn_tail {
                // Planted bug (tests only): whatever follows, call it a torn tail (and
                // drop every later segment with it, as a cut does).
                valid_after = false;
                empty_after = segments[si + 1..].iter().map(|s| s.path.clone()).collect();
            }
            // A valid record ahead of the expected offset after bytes that are not ours
            // (zeros): the entries between are missing, located where they should begin.
            let skipped_to = match (problem, header) {
                (BadRecord::UnexpectedOffset { expected }, Some(h)) if h.offset > expected => {
                    Some(h.offset)
                }
                _ => None,
            };
            end = if valid_after {
                ScanEnd::Corruption(match skipped_to {
                    Some(next_offset) => WalError::Corruption {
                        segment: seg.path.clone(),
                        position: if accepted_here > 0 {
                            report.end
                        } else {
                            Position(reader.data_start)
                        },
                        offset,
                        problem: CorruptionKind::MissingRecords { next_offset },
                    },
                    None => WalError::Corruption {
                        segment: seg.path.clone(),
                        position: Position(bad_pos),
                        offset,
                        problem: if problem == BadRecord::SegmentStart {
                            CorruptionKind::SegmentStart
                        } else {
                            CorruptionKind::BadRecordBeforeValid
                        },
                    },
                })
            } else {
                ScanEnd::TornTail(TornTail {
                    segment_index: si,
                    segment: seg.path.clone(),
                    position: Position(bad_pos),
                    offset,
                    bytes: nonzero_end.saturating_sub(bad_pos),
                    problem,
                    empty_segments_after: empty_after,
                })
            };
            reports.push(report);
            // Summaries of the later segments, for tools.
            for later in &segments[si + 1..] {
                let file_bytes = storage.file_len(&later.path).unwrap_or(0);
                reports.push(SegmentReport {
                    base: later.base,
                    path: later.path.clone(),
                    file_bytes,
                    tag: SegmentTag::V1,
                    entries: 0,
                    markers: 0,
                    end: Position(0),
                });
            }
            break 'segments;
        }
        reports.push(report);
    }

    let next = epochs.next();
    Ok(ScanReport {
        segments: reports,
        start,
        next,
        last: epochs.last(),
        entries: next.0 - start.0,
        markers,
        max_epoch,
        epochs,
        damaged,
        end,
    })
}

/// Whether the record at `pos` checks out with `head` in place of its header (the
/// length in `head` gives its extent).
fn checks_with<F: StorageFile>(
    reader: &mut SegmentReader<F>,
    pos: u64,
    head: &[u8; HEADER_BYTES],
) -> io::Result<bool> {
    let Ok(h) = format::decode_header(head) else {
        return Ok(false);
    };
    let total = h.record_bytes();
    if pos + total > reader.len {
        return Ok(false);
    }
    let n = usize::try_from(total).expect("invariant: record length fits usize");
    let tag = reader.tag;
    let mut record = reader.bytes(pos, n)?.to_vec();
    record[..HEADER_BYTES].copy_from_slice(head);
    Ok(format::checksum_ok(tag, &record))
}

/// A damaged record placed in the log ([`DamagedRecords::Place`]).
struct Placed {
    /// The entry's epoch.
    epoch: Epoch,
    /// The record's size (header and payload), from its length field.
    bytes: u64,
    /// The header as it reads on disk, if it parses.
    header: Option<Header>,
}

/// Whether the record of ours at `pos`, which fails its checks, can be placed in the log
/// as the entry at `expected` (the rules of [`DamagedRecords::Place`]). `next_segment` is
/// the segment after the reader's; `prev_epoch` the epoch of the entry before (zero at the
/// log's start).
fn place_damaged<S: Storage>(
    storage: &S,
    path: &Path,
    reader: &mut SegmentReader<S::File>,
    next_segment: Option<&SegmentPath>,
    pos: u64,
    expected: Offset,
    prev_epoch: Epoch,
) -> Result<Option<Placed>, WalError> {
    let io_err = |e: io::Error| WalError::io("read", path, e);
    if pos + HEADER_BYTES as u64 > reader.len {
        return Ok(None);
    }
    let mut head = [0u8; HEADER_BYTES];
    head.copy_from_slice(reader.bytes(pos, HEADER_BYTES).map_err(io_err)?);
    let on_disk = format::decode_header(&head).ok();
    // Magic, version, tag field and offset are known (the segment's constants, the offset
    // expected here): put back, the rest of the header says what the damage left.
    head[4..6].copy_from_slice(&format::MAGIC.to_le_bytes());
    head[6] = reader.tag.version();
    head[12..16].copy_from_slice(&reader.tag.field().to_le_bytes());
    head[24..32].copy_from_slice(&expected.0.to_le_bytes());
    // A damaged length or epoch field is one bit away from the true value, and with it
    // put back the record checks out again: then its extent and epoch are certain (a
    // checksum match, not a guess from the neighbours).
    let mut checked = checks_with(reader, pos, &head).map_err(io_err)?;
    for (field, bits) in [(8..12, 32), (16..24, 64)] {
        if checked {
            break;
        }
        for k in 0..bits {
            let mut candidate = head;
            candidate[field.start + k / 8] ^= 1 << (k % 8);
            if checks_with(reader, pos, &candidate).map_err(io_err)? {
                head = candidate;
                checked = true;
                break;
            }
        }
    }
    let Ok(h) = format::decode_header(&head) else {
        return Ok(None);
    };
    let total = h.record_bytes();
    if h.is_truncate_marker() || pos + total > reader.len {
        return Ok(None);
    }
    let next_offset = Offset(expected.0 + 1);
    let end = pos + total;
    // The next record: right after this one (same batch), or past the batch's zero
    // padding and any bytes not ours, or at the start of the next segment.
    let mut next = None;
    if end < reader.len {
        if let Ok(n) = reader.probe(end).map_err(io_err)? {
            next = Some(n);
        } else {
            let g = align_up(end, PAD_GRANULE_BYTES).min(reader.len);
            if !reader.all_zero(end, g).map_err(io_err)? {
                return Ok(None);
            }
            match reader.next_valid(g, next_offset).map_err(io_err)? {
                Some(Some(n)) => next = Some(n),
                Some(None) => return Ok(None),
                None => {}
            }
        }
    }
    if next.is_none() {
        let Some(seg) = next_segment.filter(|s| s.base == next_offset) else {
            return Ok(None);
        };
        let mut r = SegmentReader::open(storage, &seg.path)?;
        if r.header_problem.is_some() {
            return Ok(None);
        }
        let start = r.data_start;
        next = r
            .next_valid(start, next_offset)
            .map_err(|e| WalError::io("read", &seg.path, e))?
            .flatten();
    }
    let Some(n) = next.filter(|n| !n.is_truncate_marker() && n.offset == next_offset) else {
        return Ok(None);
    };
    let between = (prev_epoch..=n.epoch).contains(&h.epoch);
    let epoch = if checked {
        if !between {
            return Ok(None);
        }
        h.epoch
    } else if n.epoch == prev_epoch {
        prev_epoch
    } else if between {
        // Damaged in more than one field: the header's epoch, unchecked (a wrong one
        // leaves the record unrepairable, never overwritten with another entry).
        h.epoch
    } else {
        return Ok(None);
    };
    Ok(Some(Placed {
        epoch,
        bytes: total,
        header: on_disk,
    }))
}

/// Whether any of `segments` holds a valid record (one whose checksum holds, at any
/// granule; a damaged header counts as hiding some), and if none does, their paths (to be
/// deleted with a cut).
fn holds_valid<S: Storage>(
    storage: &S,
    segments: &[SegmentPath],
    next: Offset,
) -> Result<(bool, Vec<PathBuf>), WalError> {
    let mut empty = Vec::new();
    for later in segments {
        let mut r = SegmentReader::open(storage, &later.path)?;
        let start = r.data_start;
        let io_err = |e: io::Error| WalError::io("read", &later.path, e);
        let v = r.header_problem.is_some()
            || r.look_past(start, None, next).map_err(io_err)?.0
            || (start < r.len && r.valid_record_at(start).map_err(io_err)?);
        if v {
            return Ok((true, Vec::new()));
        }
        empty.push(later.path.clone());
    }
    Ok((false, empty))
}

/// The marker rule of the module docs.
fn marker_ok(header: &Header, segment_base: Offset, epochs: &EpochRuns, max_epoch: Epoch) -> bool {
    let x = header.offset;
    if x < segment_base || x < epochs.start() || x > epochs.next() || header.epoch < max_epoch {
        return false;
    }
    match epochs.epoch_at(x) {
        Some(entry_epoch) => header.epoch > entry_epoch,
        None => true,
    }
}
