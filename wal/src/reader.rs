//! The reader: durable records by offset range, through the index.
//!
//! Reads use the segments' buffered read handles (kept in the index) with `pread`; the
//! commit thread's O_DIRECT writes are visible to them once complete, and only durable
//! entries are indexed. Records that lie close together in a segment are fetched with one
//! read and handed out as slices of one shared buffer (no per-record copy). Every record
//! read is checked again (checksum, offset, epoch) against the index.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use quire_proto::{Epoch, Event, EventKind, Offset};

use crate::error::{CorruptionKind, WalError};
use crate::format::{self, SegmentTag, HEADER_BYTES};
use crate::index::{Index, Location};
use crate::storage::StorageFile;
use crate::Position;

/// Records at most this many bytes apart in a segment are fetched with one read.
const READ_GAP_BYTES_MAX: u64 = 64 * 1024;

struct Wanted {
    offset: Offset,
    epoch: Epoch,
    loc: Location,
}

/// Reads durable records from `from` on: at most `max_events` records and, past the first
/// record, at most `max_bytes` payload bytes in total. A record that fails its checks
/// ends the read: the good records before it are returned, and a read that starts at it
/// fails with [`WalError::Corruption`] naming its offset.
///
/// A read that a retention trim overtakes — its records' file deleted, or handed over for
/// reuse and given a new header, while the read ran — fails with [`WalError::Trimmed`],
/// not with the corruption its checks then see.
pub(crate) fn read<F: StorageFile>(
    index: &std::sync::RwLock<Index<F>>,
    from: Offset,
    max_events: usize,
    max_bytes: u64,
) -> Result<Vec<Event>, WalError> {
    let result = read_checked(index, from, max_events, max_bytes);
    if let Err(WalError::Corruption { offset, .. }) = &result {
        let first = index
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .start();
        if *offset < first {
            return Err(WalError::Trimmed {
                requested: from,
                first,
            });
        }
    }
    result
}

fn read_checked<F: StorageFile>(
    index: &std::sync::RwLock<Index<F>>,
    from: Offset,
    max_events: usize,
    max_bytes: u64,
) -> Result<Vec<Event>, WalError> {
    let (wanted, files) = {
        let index = index
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if from < index.start() {
            return Err(WalError::Trimmed {
                requested: from,
                first: index.start(),
            });
        }
        if from > index.next() {
            return Err(WalError::OffsetOutOfRange {
                requested: from,
                first: index.start(),
                next: index.next(),
            });
        }
        let mut wanted = Vec::new();
        let mut payload = 0u64;
        let mut o = from;
        while o < index.next() && wanted.len() < max_events {
            let loc = index
                .locate(o)
                .expect("invariant: every offset below next is indexed");
            let epoch = index
                .epochs()
                .epoch_at(o)
                .expect("invariant: every offset below next has an epoch");
            let p = u64::from(loc.bytes) - HEADER_BYTES as u64;
            if !wanted.is_empty() && payload + p > max_bytes {
                break;
            }
            payload += p;
            wanted.push(Wanted {
                offset: o,
                epoch,
                loc,
            });
            o = o.next();
        }
        // Only the segments this read touches (usually one or two).
        let mut files: Vec<(u32, Arc<F>, PathBuf, SegmentTag)> = Vec::new();
        for w in &wanted {
            if files.last().is_none_or(|(id, ..)| *id != w.loc.segment) {
                let seg = index
                    .segment(w.loc.segment)
                    .expect("invariant: an indexed entry's segment is held");
                files.push((w.loc.segment, seg.file.clone(), seg.path.clone(), seg.tag));
            }
        }
        (wanted, files)
    };

    let mut out = Vec::with_capacity(wanted.len());
    let mut i = 0;
    while i < wanted.len() {
        // A run of records in one segment, close together.
        let first = &wanted[i].loc;
        let mut j = i + 1;
        let mut end = u64::from(first.position) + u64::from(first.bytes);
        while j < wanted.len() {
            let l = &wanted[j].loc;
            let gap_ok =
                u64::from(l.position) >= end && u64::from(l.position) - end <= READ_GAP_BYTES_MAX;
            if l.segment != first.segment || !gap_ok {
                break;
            }
            end = u64::from(l.position) + u64::from(l.bytes);
            j += 1;
        }
        let (_, file, path, tag) = files
            .iter()
            .find(|(id, ..)| *id == first.segment)
            .expect("invariant: every wanted segment was collected");
        let start = u64::from(first.position);
        let len = usize::try_from(end - start).expect("invariant: a read run fits memory");
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, start)
            .map_err(|e| WalError::io("read", path, e))?;
        let buf = Bytes::from(buf);
        for w in &wanted[i..j] {
            let at = usize::try_from(u64::from(w.loc.position) - start)
                .expect("invariant: inside the run");
            let rec_len = w.loc.bytes as usize;
            match check_record(&buf, at, rec_len, w, *tag, path) {
                Ok(event) => out.push(event),
                // The records before a bad one are good and are returned; the next read,
                // starting at the bad one, gets the error (a reader can then take that
                // offset from another replica instead of losing the whole range).
                Err(_) if !out.is_empty() => return Ok(out),
                Err(e) => return Err(e),
            }
        }
        i = j;
    }
    Ok(out)
}

/// The event of the record at `buf[at..at + rec_len]`, checked against what the index says
/// of it (`w`) and the segment's `tag`.
///
/// # Errors
/// [`WalError::Corruption`] naming the record's offset and position in `path`.
fn check_record(
    buf: &Bytes,
    at: usize,
    rec_len: usize,
    w: &Wanted,
    tag: SegmentTag,
    path: &Path,
) -> Result<Event, WalError> {
    let bytes = &buf[at..at + rec_len];
    let corruption = |problem| WalError::Corruption {
        segment: path.to_path_buf(),
        position: Position(u64::from(w.loc.position)),
        offset: w.offset,
        problem,
    };
    let h = format::decode_header(bytes).map_err(|_| corruption(CorruptionKind::ReadMismatch))?;
    if h.record_bytes() != rec_len as u64
        || h.offset != w.offset
        || h.epoch != w.epoch
        || !format::checksum_ok(tag, bytes)
    {
        return Err(corruption(CorruptionKind::ReadMismatch));
    }
    let kind = EventKind::from_u8(h.kind)
        .ok_or_else(|| corruption(CorruptionKind::UnknownEventKind { byte: h.kind }))?;
    Ok(Event {
        epoch: h.epoch,
        offset: h.offset,
        kind,
        payload: buf.slice(at + HEADER_BYTES..at + rec_len).into(),
    })
}
