//! One log entry as the replication cores see it.
//!
//! An [`Event`] is `(epoch, offset, kind, payload)` (DESIGN.md "Vocabulary"). The payload is a
//! [`Bytes`]: the cores clone the handle (a reference-count increment), never the bytes, so an
//! event received from a producer reaches every store and slave without a copy.

use bytes::Bytes;
use quire_proto::{Epoch, EventKind, LogPosition, Offset};

/// Bytes the cores charge for one event on top of its payload when they account memory and
/// bytes in flight (backpressure, batch bounds, retention). An estimate of the record header,
/// the wire framing and the bookkeeping per event, so a flood of empty events is bounded too.
pub const EVENT_OVERHEAD_BYTES: u64 = 64;

/// One log entry.
///
/// `kind` is the event kind byte as stored in the WAL and sent on the wire
/// ([`EventKind::as_u8`]); the cores only ever interpret [`EventKind::EpochStart`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Epoch of the master that created the event.
    pub epoch: Epoch,
    /// The event's offset in the log.
    pub offset: Offset,
    /// The event kind byte.
    pub kind: u8,
    /// The payload, shared, never copied by the cores.
    pub payload: Bytes,
}

impl Event {
    /// `(epoch, offset)` of this event: what log matching compares.
    #[must_use]
    pub fn position(&self) -> LogPosition {
        LogPosition {
            epoch: self.epoch,
            offset: self.offset,
        }
    }

    /// Bytes charged for this event: payload length plus [`EVENT_OVERHEAD_BYTES`].
    #[must_use]
    pub fn accounted_bytes(&self) -> u64 {
        EVENT_OVERHEAD_BYTES + self.payload.len() as u64
    }

    /// The event kind, or `None` for a kind byte this build does not know.
    #[must_use]
    pub fn known_kind(&self) -> Option<EventKind> {
        EventKind::from_u8(self.kind)
    }
}
