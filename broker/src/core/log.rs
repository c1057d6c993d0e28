//! The log as a broker core knows it: the epoch of every offset, and an in-memory suffix of
//! the events themselves.
//!
//! ```text
//!   offsets   0 ........................ mem_start ................ end
//!   epochs    known for every offset (runs: one (epoch, first offset) per epoch)
//!   events    trimmed: read them from a store   | in memory (Bytes handles)
//! ```
//!
//! Knowing every offset's epoch (one run per master, so a handful of entries) is what log
//! matching needs to name `prev` and to back up after a rejection (Raft §5.3), even for
//! offsets whose events were trimmed from memory. The events themselves are kept only from
//! `mem_start` on; older ranges are read from the stores that hold them.
//!
//! Invariants (asserted): offsets are contiguous from 0; epochs never go down along the
//! log; `mem_start <= end`; the in-memory events are exactly `mem_start..end`.
//!
//! A log can also start after a known entry ([`Log::starting_after`]): a slave that
//! rebuilds its state from a retention checkpoint holds nothing below it. Its entries up to
//! that one are stabilized (the same on every log), so their exact epochs do not matter;
//! the log reports the known entry's epoch for all of them (an upper bound: epochs never go
//! down), and they are never in memory.

use std::collections::VecDeque;

use quire_proto::{Epoch, LogPosition, Offset};

use super::event::{accounted_bytes, Event};

/// Epochs of offsets `0..end` and the events of `mem_start..end`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log {
    /// `(epoch, first offset of that epoch's run)`, strictly increasing in both.
    runs: Vec<(Epoch, Offset)>,
    /// The offset the next event takes (the log's length).
    end: Offset,
    /// Offset of `mem[0]` (equals `end` when nothing is in memory).
    mem_start: Offset,
    /// Epochs are exact from this offset on; below it (a log [`Log::starting_after`] a
    /// known entry) they are that entry's epoch, an upper bound.
    exact_from: Offset,
    /// Events `mem_start..end`.
    mem: VecDeque<Event>,
    /// Sum of [`accounted_bytes`](super::event::accounted_bytes) over `mem`.
    mem_bytes: u64,
}

impl Log {
    /// An empty log (the next event takes offset 0).
    #[must_use]
    pub fn new() -> Log {
        Log::default()
    }

    /// A log whose entries `0..=prev.offset` are stabilized and not held: its next event
    /// takes `prev.offset + 1`, and it reports `prev.epoch` for every entry up to `prev`
    /// (see the module docs).
    #[must_use]
    pub fn starting_after(prev: LogPosition) -> Log {
        let end = prev.offset.next();
        Log {
            runs: vec![(prev.epoch, Offset::ZERO)],
            end,
            mem_start: end,
            mem: VecDeque::new(),
            mem_bytes: 0,
            exact_from: end,
        }
    }

    /// A log holding `events` in memory.
    ///
    /// # Panics
    /// If the events are not contiguous from offset 0 or their epochs go down (as
    /// [`Log::append`]).
    #[must_use]
    pub fn from_events(events: impl IntoIterator<Item = Event>) -> Log {
        let mut log = Log::new();
        for e in events {
            log.append(e);
        }
        log
    }

    /// The offset the next event takes: the number of entries in the log.
    #[must_use]
    pub fn end(&self) -> Offset {
        self.end
    }

    /// Whether the log has no entry.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.end == Offset::ZERO
    }

    /// `(epoch, offset)` of the last entry, `None` for an empty log.
    #[must_use]
    pub fn last(&self) -> Option<LogPosition> {
        let last = self.end.0.checked_sub(1)?;
        self.position(Offset(last))
    }

    /// The first offset whose epoch [`Log::epoch_at`] reports exactly (0 unless the log
    /// started after a known entry: below it every entry reports that entry's epoch).
    #[must_use]
    pub fn exact_from(&self) -> Offset {
        self.exact_from
    }

    /// The epoch of the entry at `offset`, `None` past the end.
    #[must_use]
    pub fn epoch_at(&self, offset: Offset) -> Option<Epoch> {
        if offset >= self.end {
            return None;
        }
        let i = self.runs.partition_point(|&(_, first)| first <= offset);
        // invariant: runs[0] starts at offset 0 whenever the log is non-empty.
        Some(self.runs[i - 1].0)
    }

    /// `(epoch, offset)` of the entry at `offset`, `None` past the end.
    #[must_use]
    pub fn position(&self, offset: Offset) -> Option<LogPosition> {
        self.epoch_at(offset)
            .map(|epoch| LogPosition { epoch, offset })
    }

    /// The `prev` of an append whose first event is at `first`: the entry at `first - 1`,
    /// or `None` when `first` is 0.
    ///
    /// # Panics
    /// If `first > end` (there is no entry at `first - 1`).
    #[must_use]
    pub fn prev_of(&self, first: Offset) -> Option<LogPosition> {
        assert!(
            first <= self.end,
            "prev of {first} asked past the log end {}",
            self.end
        );
        let before = first.0.checked_sub(1)?;
        self.position(Offset(before))
    }

    /// Whether the log has an entry at `pos.offset` written in `pos.epoch`; by log matching
    /// (Raft §5.3) it then holds the same entries as any log with that entry, up to it.
    #[must_use]
    pub fn contains(&self, pos: LogPosition) -> bool {
        self.epoch_at(pos.offset) == Some(pos.epoch)
    }

    /// The last offset whose epoch is `<= epoch`, `None` if every entry is of a higher
    /// epoch (or the log is empty). Used for fast backup after a rejection.
    #[must_use]
    pub fn last_offset_with_epoch_at_most(&self, epoch: Epoch) -> Option<Offset> {
        let i = self.runs.partition_point(|&(e, _)| e <= epoch);
        if i == 0 {
            return None;
        }
        match self.runs.get(i) {
            Some(&(_, next_first)) => Some(Offset(next_first.0 - 1)),
            None => Some(Offset(self.end.0 - 1)),
        }
    }

    /// The first offset of every epoch's run, as `(epoch, first offset)`, in log order.
    pub fn epoch_runs(&self) -> impl Iterator<Item = LogPosition> + '_ {
        self.runs
            .iter()
            .map(|&(epoch, offset)| LogPosition { epoch, offset })
    }

    /// Offset of the oldest event still in memory (`end` when none is).
    #[must_use]
    pub fn mem_start(&self) -> Offset {
        self.mem_start
    }

    /// Bytes charged for the events in memory ([`accounted_bytes`](super::event::accounted_bytes)).
    #[must_use]
    pub fn mem_bytes(&self) -> u64 {
        self.mem_bytes
    }

    /// Number of events in memory.
    #[must_use]
    pub fn mem_len(&self) -> usize {
        self.mem.len()
    }

    /// The in-memory event at `offset`, `None` if it is trimmed or past the end.
    #[must_use]
    pub fn get(&self, offset: Offset) -> Option<&Event> {
        let i = offset.0.checked_sub(self.mem_start.0)?;
        self.mem.get(usize::try_from(i).ok()?)
    }

    /// Iterates the in-memory events from `first` (clamped to `mem_start`) to the end.
    pub fn iter_from(&self, first: Offset) -> impl Iterator<Item = &Event> + '_ {
        let skip = first.0.saturating_sub(self.mem_start.0);
        self.mem
            .iter()
            .skip(usize::try_from(skip).unwrap_or(usize::MAX))
    }

    /// Clones (handles only) in-memory events from `first` on: at most `count_max` events
    /// and, past the first, at most `bytes_max` accounted bytes. At least one event when
    /// `first` is in memory and `count_max > 0`; empty when `first` is trimmed or at the end.
    #[must_use]
    pub fn batch(&self, first: Offset, count_max: usize, bytes_max: u64) -> Vec<Event> {
        if first < self.mem_start {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut bytes = 0u64;
        for ev in self.iter_from(first).take(count_max) {
            let b = accounted_bytes(ev);
            if !out.is_empty() && bytes + b > bytes_max {
                break;
            }
            bytes += b;
            out.push(ev.clone());
        }
        out
    }

    /// Appends `event` at the end.
    ///
    /// # Panics
    /// If `event.offset != end` or its epoch is below the last entry's (a core bug: both are
    /// checked before any event from the network reaches a log).
    pub fn append(&mut self, event: Event) {
        assert_eq!(event.offset, self.end, "log append must be at the end");
        match self.runs.last() {
            Some(&(e, _)) if e == event.epoch => {}
            Some(&(e, _)) => {
                assert!(
                    event.epoch > e,
                    "epoch {} after {} goes down",
                    event.epoch,
                    e
                );
                self.runs.push((event.epoch, event.offset));
            }
            None => self.runs.push((event.epoch, event.offset)),
        }
        self.end = event.offset.next();
        self.mem_bytes += accounted_bytes(&event);
        self.mem.push_back(event);
    }

    /// Removes every entry at or after `offset` (log truncation after a conflict).
    ///
    /// # Panics
    /// If `offset > end`.
    pub fn truncate_from(&mut self, offset: Offset) {
        assert!(
            offset <= self.end,
            "truncate at {offset} past the end {}",
            self.end
        );
        let keep_runs = self.runs.partition_point(|&(_, first)| first < offset);
        self.runs.truncate(keep_runs);
        self.end = offset;
        if offset <= self.mem_start {
            self.mem.clear();
            self.mem_bytes = 0;
            self.mem_start = offset;
        } else {
            while self.mem_start.0 + self.mem.len() as u64 > offset.0 {
                let ev = self
                    .mem
                    .pop_back()
                    .expect("invariant: mem covers mem_start..end");
                self.mem_bytes -= accounted_bytes(&ev);
            }
        }
    }

    /// Drops from memory the events below `offset` (clamped to `end`); their epochs stay
    /// known. Never drops an entry from the log itself.
    pub fn trim_before(&mut self, offset: Offset) {
        let offset = offset.min(self.end);
        while self.mem_start < offset {
            let ev = self
                .mem
                .pop_front()
                .expect("invariant: mem covers mem_start..end");
            self.mem_bytes -= accounted_bytes(&ev);
            self.mem_start = self.mem_start.next();
        }
    }

    /// Drops the oldest in-memory event if it is at or below `limit`; returns its accounted
    /// bytes, or `None` if nothing was dropped.
    pub fn trim_one_at_most(&mut self, limit: Offset) -> Option<u64> {
        if self.mem.is_empty() || self.mem_start > limit {
            return None;
        }
        let ev = self.mem.pop_front().expect("invariant: mem is not empty");
        self.mem_bytes -= accounted_bytes(&ev);
        self.mem_start = self.mem_start.next();
        Some(accounted_bytes(&ev))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use bytes::Bytes;
    use quire_proto::EventKind;

    use super::*;

    /// An event with an empty payload.
    pub(crate) fn ev(epoch: u64, offset: u64) -> Event {
        Event {
            epoch: Epoch(epoch),
            offset: Offset(offset),
            kind: EventKind::Message,
            payload: Bytes::new().into(),
        }
    }

    /// A log with the given epochs at offsets 0, 1, ...
    pub(crate) fn log_of(epochs: &[u64]) -> Log {
        Log::from_events(epochs.iter().enumerate().map(|(i, &e)| ev(e, i as u64)))
    }

    fn pos(e: u64, o: u64) -> LogPosition {
        LogPosition {
            epoch: Epoch(e),
            offset: Offset(o),
        }
    }

    #[test]
    fn epochs_positions_and_backup_lookups() {
        let log = log_of(&[1, 1, 3, 3, 3, 7]);
        assert_eq!(log.end(), Offset(6));
        assert_eq!(log.last(), Some(pos(7, 5)));
        assert_eq!(log.epoch_at(Offset(1)), Some(Epoch(1)));
        assert_eq!(log.epoch_at(Offset(2)), Some(Epoch(3)));
        assert_eq!(log.epoch_at(Offset(6)), None);
        assert_eq!(log.prev_of(Offset(0)), None);
        assert_eq!(log.prev_of(Offset(3)), Some(pos(3, 2)));
        assert!(log.contains(pos(3, 4)));
        assert!(!log.contains(pos(1, 4)));
        assert_eq!(log.last_offset_with_epoch_at_most(Epoch(0)), None);
        assert_eq!(
            log.last_offset_with_epoch_at_most(Epoch(1)),
            Some(Offset(1))
        );
        assert_eq!(
            log.last_offset_with_epoch_at_most(Epoch(5)),
            Some(Offset(4))
        );
        assert_eq!(
            log.last_offset_with_epoch_at_most(Epoch(9)),
            Some(Offset(5))
        );
        assert_eq!(Log::new().last(), None);
    }

    #[test]
    fn a_log_starting_after_an_entry_matches_it_and_appends_after_it() {
        let mut log = Log::starting_after(pos(3, 9));
        assert_eq!(log.end(), Offset(10));
        assert_eq!(log.mem_start(), Offset(10));
        assert_eq!(log.last(), Some(pos(3, 9)));
        assert!(log.contains(pos(3, 9)));
        assert_eq!(log.prev_of(Offset(10)), Some(pos(3, 9)));
        assert!(
            log.get(Offset(9)).is_none(),
            "nothing below the start is held"
        );
        log.append(ev(3, 10));
        log.append(ev(4, 11));
        assert_eq!(log.last(), Some(pos(4, 11)));
        assert_eq!(log.iter_from(Offset::ZERO).count(), 2);
        log.truncate_from(Offset(11));
        assert_eq!(log.last(), Some(pos(3, 10)));
    }

    #[test]
    fn truncate_and_trim_keep_epochs_and_bytes_consistent() {
        let mut log = log_of(&[1, 1, 3, 3, 3, 7]);
        let per = accounted_bytes(&ev(0, 0));
        log.trim_before(Offset(3));
        assert_eq!(log.mem_start(), Offset(3));
        assert_eq!(log.mem_bytes(), 3 * per);
        assert!(log.get(Offset(2)).is_none());
        assert_eq!(log.get(Offset(3)).map(Event::position), Some(pos(3, 3)));
        // epochs of trimmed offsets are still known
        assert_eq!(log.prev_of(Offset(2)), Some(pos(1, 1)));
        assert!(log.batch(Offset(2), 10, u64::MAX).is_empty());
        assert_eq!(log.batch(Offset(3), 2, u64::MAX).len(), 2);
        assert_eq!(
            log.batch(Offset(3), 10, 0).len(),
            1,
            "at least one event per batch"
        );

        log.truncate_from(Offset(5));
        assert_eq!(log.last(), Some(pos(3, 4)));
        assert_eq!(log.epoch_runs().count(), 2);
        log.append(ev(9, 5));
        assert_eq!(log.last(), Some(pos(9, 5)));

        // truncating below the in-memory suffix empties memory
        log.truncate_from(Offset(1));
        assert_eq!(
            (log.end(), log.mem_start(), log.mem_bytes()),
            (Offset(1), Offset(1), 0)
        );
        assert_eq!(log.last(), Some(pos(1, 0)));
    }

    #[test]
    #[should_panic(expected = "goes down")]
    fn epochs_never_go_down() {
        let mut log = log_of(&[3]);
        log.append(ev(2, 1));
    }
}
