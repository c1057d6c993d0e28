//! The broker engine: the broker's decisions as deterministic values (inputs in, commands
//! out), with no I/O, no clock, no task and no channel.
//!
//! A driver — the tokio actor in [`crate::server`], or the seeded simulation in quire-sim —
//! owns the sockets, the disk and the clock. It turns what happens (a request arrives, a
//! batch is stabilized, a timer fires) into calls carrying the time it read (`now_ms`, in
//! milliseconds on the driver's monotonic clock) and carries out the commands the engine
//! appends to a caller-owned `Vec`. A request is named by an opaque [`RequestToken`] the
//! driver allocates and maps to whatever answers it (a connection's responder, a simulated
//! client); the engine never sees a socket.
//!
//! Every engine value is self-contained (no globals, no shared state), so one process can
//! host one engine per log.
//!
//! What lives here so far:
//! - [`broker::Engine`]: the roles and their changes — follower, takeover, the cluster's
//!   bootstrap, master, step-down on a higher epoch, check-quorum, graceful handoff — and
//!   retention with its checkpoints, with the broker state every role applies stabilized
//!   events to and the master's write path inside it.
//! - [`writes::Writes`]: the master's write path — planning a produce (the idempotent
//!   producer's dedup against the applied table and the batches in flight, the per-message
//!   and in-flight byte bounds), proposing it to the [`crate::core::MasterCore`], the
//!   requests blocked until the master serves or has room, answering them when their events
//!   are stabilized, expiring them, and failing them when the master steps down.
//!
//! What does not live here yet (the tokio actor still decides it, through the engine's
//! accessors): fetch and its long-poll waiters, metrics and status.

pub mod broker;
pub mod recent;
pub mod writes;

#[cfg(test)]
mod broker_tests;
#[cfg(test)]
mod tests;

pub use broker::{
    Command, Engine, EngineConfig, FenceAnswer, FetchReply, HandoffDone, HandoffFailure,
    InboundAnswer, Mutations, RoleView, SlotAnswer, StoreFetch, TailAnswer, TakeoverRead,
    CHECKPOINT_PARTS_WRITE_MS_MAX, CHECKPOINT_PART_BYTES_DEFAULT, CHECKPOINT_PART_BYTES_MAX,
    FETCH_BYTES_MAX, FETCH_WAITERS_MAX, FETCH_WAIT_MS_MAX,
};
pub use writes::{
    Arrival, Gate, Reply, WriteCommand, WriteKind, WriteLimits, WriteRequest, Writes,
};

/// An opaque name for one client request, allocated by the driver (unique among the
/// requests it has handed to one engine and not yet seen answered). The engine answers it
/// exactly once, or never if the driver drops the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestToken(pub u64);
