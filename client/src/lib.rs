//! quire-client: the client side of Quire's wire protocol.
//!
//! - [`conn`]: one multiplexed TCP connection — many requests in flight, matched to their
//!   responses by request id, every wait bounded. The building block of every client here.
//! - [`store`]: [`StoreClient`], a typed client of one event store (`quire-node`): append
//!   (also the vectored fan-out path), fence, read, tail, heartbeat.
//!
//! Wire bytes come from `quire-proto` only; this crate adds sockets, tasks and timeouts.
//! It needs a Tokio runtime (with the `net`, `time` and `io-util` drivers).

pub mod conn;
mod error;
pub mod store;

pub use conn::{ConnConfig, Connection, PendingReply};
pub use error::ClientError;
pub use store::{AppendOutcome, FenceOutcome, PendingAppend, StoreClient};
