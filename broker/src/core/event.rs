//! One log entry as the replication cores see it: the wire's [`Event`] itself
//! (`quire_proto::Event`, DESIGN.md "Vocabulary"), and what the cores charge for one.
//!
//! The payload is a [`bytes::Bytes`]: the cores clone the handle (a reference-count
//! increment), never the bytes, so an event received from a producer reaches every store and
//! slave without a copy.

pub use quire_proto::Event;

/// Bytes the cores charge for one event on top of its payload when they account memory and
/// bytes in flight (backpressure, batch bounds, retention). An estimate of the record header,
/// the wire framing and the bookkeeping per event, so a flood of empty events is bounded too.
pub const EVENT_OVERHEAD_BYTES: u64 = 64;

/// Bytes charged for `event`: its payload length plus [`EVENT_OVERHEAD_BYTES`].
#[must_use]
pub fn accounted_bytes(event: &Event) -> u64 {
    EVENT_OVERHEAD_BYTES + event.payload.len() as u64
}
