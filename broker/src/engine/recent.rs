//! [`RecentEvents`]: the most recent stabilized events, kept in memory to serve consumers
//! (fetches of older offsets are read from a store).
//!
//! The master core drops an event from its own memory as soon as every slot holds it, so
//! the broker keeps this separate, bounded window of stabilized events. Payloads are shared
//! [`bytes::Bytes`] handles: holding an event here costs no copy.

use std::collections::VecDeque;

use quire_proto::Offset;

use crate::core::event::accounted_bytes;
use crate::core::Event;

/// Default bound of [`RecentEvents`], in accounted bytes: 64 MiB.
pub const RECENT_BYTES_MAX_DEFAULT: u64 = 64 << 20;

/// A window of contiguous stabilized events, bounded in accounted bytes.
#[derive(Debug)]
pub(crate) struct RecentEvents {
    events: VecDeque<Event>,
    bytes: u64,
    bytes_max: u64,
}

impl RecentEvents {
    pub(crate) fn new(bytes_max: u64) -> RecentEvents {
        RecentEvents {
            events: VecDeque::new(),
            bytes: 0,
            bytes_max,
        }
    }

    /// Adds the next stabilized event; a gap (which a driver never makes) restarts the window.
    pub(crate) fn push(&mut self, event: Event) {
        let contiguous = self
            .events
            .back()
            .is_none_or(|last| last.offset.next() == event.offset);
        if !contiguous {
            self.clear();
        }
        self.bytes += accounted_bytes(&event);
        self.events.push_back(event);
        while self.bytes > self.bytes_max && self.events.len() > 1 {
            if let Some(old) = self.events.pop_front() {
                self.bytes -= accounted_bytes(&old);
            }
        }
    }

    /// The event at `offset`, if it is in the window.
    pub(crate) fn get(&self, offset: Offset) -> Option<&Event> {
        let first = self.events.front()?.offset;
        let i = usize::try_from(offset.0.checked_sub(first.0)?).ok()?;
        self.events.get(i)
    }

    pub(crate) fn clear(&mut self) {
        self.events.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use quire_proto::Epoch;

    use super::*;

    fn ev(o: u64) -> Event {
        Event {
            epoch: Epoch(1),
            offset: Offset(o),
            kind: quire_proto::EventKind::Message,
            payload: Bytes::from_static(b"0123456789").into(),
        }
    }

    #[test]
    fn keeps_the_newest_events_within_the_bound() {
        let per = accounted_bytes(&ev(0));
        let mut r = RecentEvents::new(3 * per);
        for o in 0..5 {
            r.push(ev(o));
        }
        assert!(r.get(Offset(1)).is_none());
        assert_eq!(r.get(Offset(2)).map(|e| e.offset), Some(Offset(2)));
        assert_eq!(r.get(Offset(4)).map(|e| e.offset), Some(Offset(4)));
        assert!(r.get(Offset(5)).is_none());
        r.push(ev(9));
        assert!(r.get(Offset(4)).is_none(), "a gap restarts the window");
        assert!(r.get(Offset(9)).is_some());
    }
}
