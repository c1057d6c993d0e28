//! The in-memory index: offset -> (segment, position, length), and offset -> epoch.
//!
//! Built from the log by the recovery scan at open, then extended by the commit thread as
//! batches become durable. It holds only durable entries; what has been accepted but is
//! not yet durable lives in the commit state (`commit.rs`). Nothing here touches a file
//! except to hold the read handles of the segments.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use quire_proto::{Epoch, LogPosition, Offset};

use crate::format::SegmentTag;
use crate::Position;

/// Epoch of every entry in `[start, next)`, stored as runs (epochs change rarely).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpochRuns {
    start: Offset,
    next: Offset,
    /// `(first offset of the run, epoch)`, offsets increasing, epochs non-decreasing.
    runs: Vec<(Offset, Epoch)>,
}

impl EpochRuns {
    /// An empty log starting at `start`.
    #[must_use]
    pub fn new(start: Offset) -> EpochRuns {
        EpochRuns {
            start,
            next: start,
            runs: Vec::new(),
        }
    }

    /// The first offset.
    #[must_use]
    pub fn start(&self) -> Offset {
        self.start
    }

    /// One past the last offset.
    #[must_use]
    pub fn next(&self) -> Offset {
        self.next
    }

    /// Whether no entry is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.next == self.start
    }

    /// The epoch of the entry at `offset`, if held.
    #[must_use]
    pub fn epoch_at(&self, offset: Offset) -> Option<Epoch> {
        if offset < self.start || offset >= self.next {
            return None;
        }
        let i = self.runs.partition_point(|(o, _)| *o <= offset);
        Some(self.runs[i - 1].1)
    }

    /// The last entry, if any.
    #[must_use]
    pub fn last(&self) -> Option<LogPosition> {
        let (_, epoch) = *self.runs.last()?;
        Some(LogPosition {
            epoch,
            offset: Offset(self.next.0 - 1),
        })
    }

    /// Appends the entry at `self.next()`.
    ///
    /// # Panics
    /// If `offset` is not `self.next()` (a bug in the caller's validation).
    pub fn push(&mut self, offset: Offset, epoch: Epoch) {
        assert_eq!(offset, self.next, "index entries must be contiguous");
        match self.runs.last() {
            Some(&(_, e)) if e == epoch => {}
            _ => self.runs.push((offset, epoch)),
        }
        self.next = offset.next();
    }

    /// Drops every entry below `start` (a retention trim): the log then starts at `start`.
    ///
    /// # Panics
    /// If `start` is below the current start or above `next` (a bug in the caller).
    pub fn trim_front(&mut self, start: Offset) {
        assert!(
            start >= self.start && start <= self.next,
            "a trim point lies inside the log"
        );
        // The run holding `start` becomes the first run, beginning at `start`.
        let first = self.runs.partition_point(|(o, _)| *o <= start);
        if first > 0 {
            self.runs.drain(..first - 1);
            self.runs[0].0 = start;
        }
        if start == self.next {
            self.runs.clear();
        }
        self.start = start;
    }

    /// Drops every entry at or after `offset`.
    pub fn truncate(&mut self, offset: Offset) {
        if offset >= self.next {
            return;
        }
        let offset = offset.max(self.start);
        let keep = self.runs.partition_point(|(o, _)| *o < offset);
        self.runs.truncate(keep);
        self.next = offset;
    }
}

/// A segment as the reader sees it; `F` is the storage's file type.
#[derive(Debug)]
pub struct IndexedSegment<F = File> {
    /// Base offset (from the name).
    pub base: Offset,
    /// Path of the file.
    pub path: PathBuf,
    /// A read handle (buffered I/O sees what the O_DIRECT writes put on disk).
    pub file: Arc<F>,
    /// The segment's tag, which every record read back must carry.
    pub tag: SegmentTag,
    /// Whether the segment holds a truncation marker (such a file is never reused).
    pub has_marker: bool,
}

/// Where one entry's record lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Index into [`Index::segments`].
    pub segment: u32,
    /// Byte position of the record header in the segment.
    pub position: u32,
    /// Header plus payload, in bytes.
    pub bytes: u32,
}

/// The durable index: every durable entry's location and epoch.
#[derive(Debug)]
pub struct Index<F = File> {
    /// Segments in base order; a `Location::segment` minus `first_segment_id` indexes
    /// this (ids stay stable when a trim removes segments at the front).
    segments: Vec<IndexedSegment<F>>,
    /// The id of `segments[0]`.
    first_segment_id: u32,
    locations: Vec<Location>,
    epochs: EpochRuns,
}

impl<F> Index<F> {
    /// An empty index of a log starting at `start`.
    #[must_use]
    pub fn new(start: Offset) -> Index<F> {
        Index {
            segments: Vec::new(),
            first_segment_id: 0,
            locations: Vec::new(),
            epochs: EpochRuns::new(start),
        }
    }

    /// The epochs of the indexed entries.
    #[must_use]
    pub fn epochs(&self) -> &EpochRuns {
        &self.epochs
    }

    /// The first offset.
    #[must_use]
    pub fn start(&self) -> Offset {
        self.epochs.start()
    }

    /// One past the last durable offset.
    #[must_use]
    pub fn next(&self) -> Offset {
        self.epochs.next()
    }

    /// The last durable entry.
    #[must_use]
    pub fn last(&self) -> Option<LogPosition> {
        self.epochs.last()
    }

    /// Adds a segment and returns its id for [`Location::segment`].
    pub fn add_segment(&mut self, segment: IndexedSegment<F>) -> u32 {
        self.segments.push(segment);
        let n = u32::try_from(self.segments.len()).expect("invariant: fewer than 2^32 segments");
        self.first_segment_id + n - 1
    }

    /// The segment with id `id`, if held.
    #[must_use]
    pub fn segment(&self, id: u32) -> Option<&IndexedSegment<F>> {
        let i = id.checked_sub(self.first_segment_id)?;
        self.segments.get(i as usize)
    }

    /// The segment with id `id`, to update its tag or marker flag.
    pub fn segment_mut(&mut self, id: u32) -> Option<&mut IndexedSegment<F>> {
        let i = id.checked_sub(self.first_segment_id)?;
        self.segments.get_mut(i as usize)
    }

    /// The held segments with their ids, in base order.
    pub fn segments(&self) -> impl Iterator<Item = (u32, &IndexedSegment<F>)> {
        (self.first_segment_id..).zip(self.segments.iter())
    }

    /// Removes the segments from id `from` on (files deleted by a truncation), dropping
    /// every entry they held and every entry after the first of them.
    pub fn remove_segments_from(&mut self, from: u32) {
        let Some(keep) = from.checked_sub(self.first_segment_id) else {
            return;
        };
        if keep as usize >= self.segments.len() {
            return;
        }
        let cut = self.locations.iter().position(|l| l.segment >= from);
        if let Some(i) = cut {
            self.truncate(Offset(self.start().0 + i as u64));
        }
        self.segments.truncate(keep as usize);
    }

    /// Removes the first `count` segments (a retention trim); the log then starts at the
    /// base of the segment after them. Returns the removed segments.
    ///
    /// # Panics
    /// If that would remove every segment, or the next segment's base is not a durable
    /// entry (the caller keeps the segment holding the log's durable end).
    pub fn trim_front(&mut self, count: usize) -> Vec<IndexedSegment<F>> {
        if count == 0 {
            return Vec::new();
        }
        assert!(count < self.segments.len(), "a trim keeps the last segment");
        let start = self.segments[count].base;
        assert!(
            start > self.start() && start < self.next(),
            "a trim leaves a durable entry at the new start"
        );
        let dropped =
            usize::try_from(start.0 - self.start().0).expect("invariant: the index fits memory");
        self.locations.drain(..dropped);
        self.epochs.trim_front(start);
        self.first_segment_id += u32::try_from(count).expect("invariant: fewer than 2^32 segments");
        self.segments.drain(..count).collect()
    }

    /// Records the entry at `self.next()`.
    ///
    /// # Panics
    /// If `offset` is not the next one or `segment` is unknown.
    pub fn push(
        &mut self,
        offset: Offset,
        epoch: Epoch,
        segment: u32,
        position: Position,
        bytes: u64,
    ) {
        assert!(self.segment(segment).is_some(), "unknown segment");
        self.epochs.push(offset, epoch);
        self.locations.push(Location {
            segment,
            position: u32::try_from(position.0)
                .expect("invariant: segments are smaller than 4 GiB"),
            bytes: u32::try_from(bytes).expect("invariant: records are smaller than 4 GiB"),
        });
    }

    /// Drops every entry at or after `offset`.
    pub fn truncate(&mut self, offset: Offset) {
        self.epochs.truncate(offset);
        let keep = usize::try_from(self.epochs.next().0 - self.epochs.start().0)
            .expect("invariant: index fits memory");
        self.locations.truncate(keep);
    }

    /// The location of the entry at `offset`, if durable.
    #[must_use]
    pub fn locate(&self, offset: Offset) -> Option<Location> {
        if offset < self.start() {
            return None;
        }
        let i = usize::try_from(offset.0 - self.start().0).ok()?;
        self.locations.get(i).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_runs_push_truncate_lookup() {
        let mut r = EpochRuns::new(Offset(0));
        assert_eq!(r.last(), None);
        for (o, e) in [(0, 1), (1, 1), (2, 3), (3, 3), (4, 7)] {
            r.push(Offset(o), Epoch(e));
        }
        assert_eq!(r.epoch_at(Offset(1)), Some(Epoch(1)));
        assert_eq!(r.epoch_at(Offset(3)), Some(Epoch(3)));
        assert_eq!(r.epoch_at(Offset(5)), None);
        assert_eq!(
            r.last(),
            Some(LogPosition {
                epoch: Epoch(7),
                offset: Offset(4)
            })
        );
        r.truncate(Offset(3));
        assert_eq!(
            r.last(),
            Some(LogPosition {
                epoch: Epoch(3),
                offset: Offset(2)
            })
        );
        r.truncate(Offset(2));
        assert_eq!(
            r.last(),
            Some(LogPosition {
                epoch: Epoch(1),
                offset: Offset(1)
            })
        );
        r.push(Offset(2), Epoch(2));
        assert_eq!(r.epoch_at(Offset(2)), Some(Epoch(2)));
        r.truncate(Offset(0));
        assert!(r.is_empty());
    }
}
