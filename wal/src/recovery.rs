//! Recovery at open, and the offline repair: scan, cut a torn tail durably, rebuild the
//! index.
//!
//! A torn tail is cut by writing zeros over it (through the page cache, then fdatasync),
//! so the segment keeps its preallocated, written blocks; a segment whose first record is
//! torn is deleted instead, as are later segments that hold no valid record, and the
//! directory is fsynced. Every cut is logged with file, position and bytes. Corruption is
//! never cut: it is returned as a located [`WalError::Corruption`] and nothing changes.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quire_proto::{Epoch, LogPosition, Offset};

use crate::error::WalError;
use crate::format::SegmentTag;
use crate::index::{Index, IndexedSegment};
use crate::scan::{self, BadRecord, RecordStatus, ScanEnd, ScanReport, TornTail};
use crate::segment::{self, DirLock, SegmentPath};
use crate::storage::{OpenMode, OsStorage, Storage, StorageFile};
use crate::{Mutations, Position};

/// What recovery found and did at open.
#[derive(Clone, Debug)]
pub struct RecoveryReport {
    /// Segments in the directory after recovery.
    pub segments: usize,
    /// The log's first offset.
    pub first: Offset,
    /// The last entry after recovery.
    pub last: Option<LogPosition>,
    /// Entries in the log.
    pub entries: u64,
    /// Truncation markers met.
    pub markers: u64,
    /// The torn tail that was cut, if any.
    pub torn_tail: Option<TornTail>,
    /// Damaged entries placed in the log ([`crate::DamagedRecords::Place`]), ascending; at
    /// most [`crate::CORRUPT_RECORDS_MAX`] listed (reads find any others).
    pub damaged: Vec<Offset>,
    /// How long the scan and the cut took.
    pub duration: Duration,
}

/// The segment appends continue in.
#[derive(Debug)]
pub(crate) struct Tail {
    pub index_id: u32,
    pub base: Offset,
    pub path: std::path::PathBuf,
    /// Where the next batch goes (a multiple of the alignment).
    pub write_position: u64,
    /// The segment's tag.
    pub tag: SegmentTag,
    /// Usable bytes of the file (a multiple of the alignment).
    pub capacity: u64,
}

#[derive(Debug)]
pub(crate) struct Recovered<F> {
    pub index: Index<F>,
    pub max_epoch: Epoch,
    pub tail: Option<Tail>,
    pub report: RecoveryReport,
}

/// Opens a segment for reading by the reader: buffered, readahead off (the blocks after
/// the durable end are written concurrently by the commit thread).
pub(crate) fn open_for_read<S: Storage>(
    storage: &S,
    path: &Path,
) -> Result<Arc<S::File>, WalError> {
    let f = storage
        .open(path, OpenMode::ReadRandom)
        .map_err(|e| WalError::io("open", path, e))?;
    Ok(Arc::new(f))
}

/// Called by recovery with the torn tail it is about to cut, before anything on disk
/// changes; an error stops the open with nothing cut. Not called for a
/// [`BadRecord::SegmentGap`]: that cut only deletes segments holding no valid record and
/// leaves every record in place, as a log whose unsynced tail was lost whole ends cleanly. A store uses it to record durably
/// that it cut a tail (quire-node's tail-cut mark), so that a crash right after the cut
/// cannot make it forget.
pub type BeforeCut<'a> = &'a mut dyn FnMut(&TornTail) -> Result<(), WalError>;

/// Scans `dir`, cuts a torn tail (after `before_cut` returned `Ok`), extends the last
/// segment to `segment_bytes` with written zeros if it is shorter, and builds the index.
/// The caller holds the lock.
pub(crate) fn recover<S: Storage>(
    storage: &S,
    dir: &Path,
    segment_bytes: u64,
    align: u64,
    before_cut: BeforeCut<'_>,
    mutations: Mutations,
    damaged_rule: crate::DamagedRecords,
) -> Result<Recovered<S::File>, WalError> {
    let started = Instant::now();
    let segments = segment::list_segments_in(storage, dir)?;
    let start = segments.first().map_or(Offset::ZERO, |s| s.base);
    let mut index = Index::new(start);
    for s in &segments {
        index.add_segment(IndexedSegment {
            base: s.base,
            path: s.path.clone(),
            file: open_for_read(storage, &s.path)?,
            // Both from the scan, below.
            tag: SegmentTag::V1,
            has_marker: false,
        });
    }
    let report = scan::scan_segments_placing(
        storage,
        &segments,
        &mut |r| match r.status {
            RecordStatus::Damaged { offset, epoch } => {
                let seg =
                    u32::try_from(r.segment_index).expect("invariant: fewer than 2^32 segments");
                index.push(offset, epoch, seg, r.position, r.bytes);
            }
            RecordStatus::Entry => {
                let h = r
                    .header
                    .expect("invariant: an accepted record has a header");
                let seg =
                    u32::try_from(r.segment_index).expect("invariant: fewer than 2^32 segments");
                index.push(h.offset, h.epoch, seg, r.position, r.bytes);
            }
            RecordStatus::Marker { .. } => {
                let h = r
                    .header
                    .expect("invariant: an accepted record has a header");
                index.truncate(h.offset);
            }
            RecordStatus::Bad(_) => {}
        },
        mutations,
        damaged_rule,
    )?;
    for (i, r) in report.segments.iter().enumerate() {
        let id = u32::try_from(i).expect("invariant: fewer than 2^32 segments");
        if let Some(seg) = index.segment_mut(id) {
            seg.tag = r.tag;
            seg.has_marker = r.markers > 0;
        }
    }
    let torn = match &report.end {
        ScanEnd::Clean => file_cut(&report, align, index.next()),
        ScanEnd::Corruption(e) => return Err(e.clone()),
        ScanEnd::TornTail(t) => Some(t.clone()),
    };
    let mut deleted_from = None;
    if let Some(t) = &torn {
        // A gap after a segment that ends cleanly is a roll whose records were all lost
        // unsynced: nothing acknowledged is missing, so no mark. After a segment that was
        // cut short, acknowledged records may be gone: mark, as for a cut last segment.
        let gap_after_cut = matches!(t.problem, BadRecord::SegmentGap { .. })
            && report
                .segments
                .get(t.segment_index)
                .is_some_and(|s| is_cut(s, align));
        if !matches!(t.problem, BadRecord::SegmentGap { .. }) || gap_after_cut {
            before_cut(t)?;
        }
        let deleted = if matches!(t.problem, BadRecord::FileCut { .. }) {
            // Nothing to overwrite: the bytes are gone. The hook marked the store (its log
            // may lack records it acked); the tail is zero-extended below.
            tracing::warn!(
                segment = %t.segment.display(),
                problem = %t.problem,
                expected_offset = t.offset.0,
                "cut the torn tail of the log: the last segment was cut short after it was written (nothing left to overwrite); records after its end may be lost"
            );
            0
        } else {
            cut(storage, dir, t)?
        };
        if deleted > 0 {
            let first_deleted = segments.len() - deleted;
            index.remove_segments_from(
                u32::try_from(first_deleted).expect("invariant: fewer than 2^32 segments"),
            );
            deleted_from = Some(first_deleted);
        }
    }
    let remaining = deleted_from.unwrap_or(segments.len());
    if remaining == 0 {
        // Nothing is left: the log starts afresh at offset 0, as a reopen would see it.
        index = Index::new(Offset::ZERO);
    }
    let tail = match remaining.checked_sub(1) {
        None => None,
        Some(i) => Some(prepare_tail(
            storage,
            &segments[i],
            &report,
            i,
            segment_bytes,
            align,
        )?),
    };
    Ok(Recovered {
        max_epoch: report.max_epoch,
        report: RecoveryReport {
            segments: remaining,
            first: index.start(),
            last: index.last(),
            entries: index.next().0 - index.start().0,
            markers: report.markers,
            torn_tail: torn,
            damaged: report
                .damaged
                .iter()
                .copied()
                .filter(|&o| o >= index.start() && o < index.next())
                .take(crate::CORRUPT_RECORDS_MAX)
                .collect(),
            duration: started.elapsed(),
        },
        index,
        tail,
    })
}

/// A last segment cut after the WAL wrote it ([`BadRecord::FileCut`]): every segment the
/// WAL names is preallocated whole and zero-filled at a multiple of the alignment, and
/// every write ends on an aligned boundary, so a last segment that is empty, of a length
/// that is not a multiple of `align`, or shorter than the end of its last aligned write
/// lost bytes the WAL wrote. `next`: the offset after the last valid record.
fn file_cut(report: &ScanReport, align: u64, next: Offset) -> Option<TornTail> {
    let i = report.segments.len().checked_sub(1)?;
    let s = &report.segments[i];
    is_cut(s, align).then(|| TornTail {
        segment_index: i,
        segment: s.path.clone(),
        position: s.end,
        offset: next,
        bytes: 0,
        problem: BadRecord::FileCut {
            file_bytes: s.file_bytes,
        },
        empty_segments_after: Vec::new(),
    })
}

/// Whether segment `s` is shorter than any file the WAL writes (see [`file_cut`]).
fn is_cut(s: &crate::scan::SegmentReport, align: u64) -> bool {
    s.file_bytes == 0
        || s.file_bytes % align != 0
        || s.file_bytes < crate::format::align_up(s.end.0, align)
}

/// Zero-extends `path` to a multiple of the page size (4096 bytes), durably.
fn pad_to_page<S: Storage>(storage: &S, path: &Path) -> Result<(), WalError> {
    let file = storage
        .open(path, OpenMode::Write)
        .map_err(|e| WalError::io("open", path, e))?;
    let len = file.size().map_err(|e| WalError::io("stat", path, e))?;
    let padded = crate::format::align_up(len, 4096);
    if padded > len {
        segment::write_zeros(&file, len, padded).map_err(|e| WalError::io("zero-fill", path, e))?;
        file.sync_all()
            .map_err(|e| WalError::io("fsync", path, e))?;
    }
    Ok(())
}

fn prepare_tail<S: Storage>(
    storage: &S,
    seg: &SegmentPath,
    report: &ScanReport,
    i: usize,
    segment_bytes: u64,
    align: u64,
) -> Result<Tail, WalError> {
    let end = report.segments.get(i).map_or(0, |s| s.end.0);
    let file = storage
        .open(&seg.path, OpenMode::Write)
        .map_err(|e| WalError::io("open", &seg.path, e))?;
    let len = file
        .size()
        .map_err(|e| WalError::io("stat", &seg.path, e))?;
    if len < segment_bytes {
        // A short last segment (cut by hand, or preallocated by an older configuration):
        // write zeros so that appends land in written blocks, as in a fresh segment.
        segment::write_zeros(&file, len, segment_bytes)
            .map_err(|e| WalError::io("zero-fill", &seg.path, e))?;
        file.sync_all()
            .map_err(|e| WalError::io("fsync", &seg.path, e))?;
    }
    let capacity = crate::format::align_down(len.max(segment_bytes), align);
    let tag = report.segments.get(i).map_or(SegmentTag::V1, |s| s.tag);
    Ok(Tail {
        index_id: u32::try_from(i).expect("invariant: fewer than 2^32 segments"),
        base: seg.base,
        path: seg.path.clone(),
        write_position: crate::format::align_up(end.max(tag.data_start(align)), align)
            .min(capacity),
        capacity,
        tag,
    })
}

/// Cuts a torn tail durably. Returns how many segments at the end of the directory were
/// deleted.
fn cut<S: Storage>(storage: &S, dir: &Path, t: &TornTail) -> Result<usize, WalError> {
    let mut deleted = 0;
    // Later, empty segments first (highest base first), so that a crash in between
    // never leaves a gap.
    for p in t.empty_segments_after.iter().rev() {
        storage
            .remove_file(p)
            .map_err(|e| WalError::io("remove", p, e))?;
        deleted += 1;
    }
    if matches!(t.problem, BadRecord::SegmentGap { .. }) {
        // The segment the log ends in is whole: only the empty ones after it go.
    } else if t.position == Position(0) {
        storage
            .remove_file(&t.segment)
            .map_err(|e| WalError::io("remove", &t.segment, e))?;
        deleted += 1;
    } else {
        let f = storage
            .open(&t.segment, OpenMode::Write)
            .map_err(|e| WalError::io("open", &t.segment, e))?;
        segment::write_zeros(&f, t.position.0, t.position.0 + t.bytes)
            .map_err(|e| WalError::io("write zeros", &t.segment, e))?;
        f.sync_data()
            .map_err(|e| WalError::io("fdatasync", &t.segment, e))?;
    }
    if deleted > 0 {
        segment::fsync_dir_in(storage, dir)?;
    }
    tracing::warn!(
        segment = %t.segment.display(),
        position = t.position.0,
        bytes_cut = t.bytes,
        expected_offset = t.offset.0,
        problem = %t.problem,
        segments_deleted = deleted,
        "cut the torn tail of the log"
    );
    Ok(deleted)
}

/// What [`repair_torn_tail`] did.
#[derive(Clone, Debug)]
pub struct RepairReport {
    /// The torn tail that was cut, or `None` if the log ended cleanly.
    pub cut: Option<TornTail>,
    /// The last entry after the repair.
    pub last: Option<LogPosition>,
}

/// Offline repair: cuts a torn tail of the log in `dir` (the same cut [`crate::Wal::open`]
/// makes) and nothing else. Takes the directory lock. It calls no pre-cut hook: a caller
/// repairing a quire-node store's WAL records the store's tail-cut mark first (`quire wal
/// repair` does, docs/protocol.md "Tail-cut marks").
///
/// # Errors
/// [`WalError::Corruption`] (and no change) if the log is corrupt rather than torn;
/// [`WalError::Locked`] if a `Wal` has the directory open; I/O errors.
pub fn repair_torn_tail(dir: &Path) -> Result<RepairReport, WalError> {
    repair_torn_tail_in(&OsStorage, dir)
}

/// [`repair_torn_tail`] on `storage`.
///
/// # Errors
/// As [`repair_torn_tail`].
pub fn repair_torn_tail_in<S: Storage>(storage: &S, dir: &Path) -> Result<RepairReport, WalError> {
    let _lock = DirLock::acquire_in(storage, dir)?;
    let report = inspect_in(storage, dir, |_| {})?;
    match report.end {
        ScanEnd::Clean => Ok(RepairReport {
            cut: None,
            last: report.last,
        }),
        ScanEnd::Corruption(e) => Err(e),
        ScanEnd::TornTail(t) => {
            if !matches!(t.problem, BadRecord::FileCut { .. }) {
                cut(storage, dir, &t)?;
            }
            if t.position.0 > 0 {
                // A file cut short (by hand, with the torn bytes) gets its zeros back to a
                // whole page, so the next scan reads an intact, if short, last segment.
                pad_to_page(storage, &t.segment)?;
            }
            Ok(RepairReport {
                cut: Some(t),
                last: report.last,
            })
        }
    }
}

/// Offline, read-only walk of the log in `dir` for tools (`quire wal dump|verify|stat`):
/// calls `visit` for every record in file order, with its segment, position, length,
/// checksum status and the scan's decision, and returns the summary (torn tail or
/// corruption with their locations; a last segment cut after it was written is reported
/// as a torn tail with [`BadRecord::FileCut`], as [`crate::Wal::open`] reports it to its
/// hook). Modifies nothing and takes no lock.
///
/// # Errors
/// I/O errors and a malformed directory; corruption is reported in the returned
/// [`ScanReport::end`], not as an error.
pub fn inspect(
    dir: &Path,
    visit: impl FnMut(&scan::ScannedRecord<'_>),
) -> Result<ScanReport, WalError> {
    inspect_in(&OsStorage, dir, visit)
}

/// [`inspect`] on `storage`.
///
/// # Errors
/// As [`inspect`].
pub fn inspect_in<S: Storage>(
    storage: &S,
    dir: &Path,
    mut visit: impl FnMut(&scan::ScannedRecord<'_>),
) -> Result<ScanReport, WalError> {
    let mut report = scan::scan_dir_in(storage, dir, &mut visit)?;
    if matches!(report.end, ScanEnd::Clean) {
        // Offline the WAL's alignment is unknown; every alignment it uses is a multiple
        // of the page size, so a file the page size calls cut was cut.
        let next = report
            .last
            .map(|l| l.offset.next())
            .or_else(|| report.segments.first().map(|s| s.base))
            .unwrap_or(Offset::ZERO);
        if let Some(t) = file_cut(&report, 4096, next) {
            report.end = ScanEnd::TornTail(t);
        }
    }
    Ok(report)
}
