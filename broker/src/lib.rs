//! quire-broker: the master/slave broker. Its replication logic lives in [`core`] as pure
//! state machines (events in, commands out, no I/O); the server wraps them.

pub mod core;
