//! quire-proto: the vocabulary types every Quire crate shares, and (as the wire
//! protocol lands) the one codec for every frame on the wire.
//!
//! This crate is pure: no sockets, no async runtime, no file I/O. It owns the bytes of
//! the protocol and the newtypes of DESIGN.md's vocabulary ([`Offset`], [`Epoch`], …);
//! it does not own what a node or a broker does with them.

pub mod types;

pub use types::{BrokerId, Epoch, EventKind, Incarnation, LogPosition, Offset, StoreId};
