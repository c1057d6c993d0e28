//! quire-client: the client side of Quire's wire protocol.
//!
//! - [`conn`]: one multiplexed TCP connection — many requests in flight, matched to their
//!   responses by request id, every wait bounded. The building block of every client here.
//! - [`store`]: [`StoreClient`], a typed client of one event store (`quire-node`): append
//!   (also the vectored fan-out path), fence, read, tail, heartbeat.
//! - [`broker`]: [`BrokerClient`], a typed client of one broker: produce, fetch, cursor
//!   commit and lookup, metadata. No retries.
//! - [`discovery`]: [`Discovery`], from broker addresses to a connection to the master
//!   (metadata from any broker, `NotMaster` hints, bounded rounds with backoff).
//! - [`producer`]: [`Producer`], batching (size and linger), pipelined, idempotent produce
//!   that finds the master again and resends unacknowledged batches with their producer id
//!   and sequences after a failure.
//! - [`consumer`]: [`Consumer`], a long-polling subscription to one topic from an offset,
//!   the beginning, the end or a durable cursor, resuming after a failover where it was.
//!
//! Wire bytes come from `quire-proto` only; this crate adds sockets, tasks and timeouts.
//! It needs a Tokio runtime (with the `net`, `time` and `io-util` drivers).

pub mod broker;
pub mod conn;
pub mod consumer;
pub mod discovery;
mod error;
pub mod partitioner;
pub mod producer;
pub mod store;

pub use broker::{BrokerClient, PendingProduce};
pub use conn::{ConnConfig, Connection, PendingReply, ScramLogin};
pub use consumer::{Consumer, ConsumerConfig, Message, StartFrom};
pub use discovery::{Discovery, DiscoveryConfig, MasterConn};
pub use error::{ClientError, Disposition};
pub use partitioner::{murmur2, partition_for_key, StickyPartitioner};
pub use producer::{Delivery, ProduceError, Producer, ProducerConfig};
pub use store::{AppendOutcome, FenceOutcome, PendingAppend, StoreClient};
