//! Parsers for the quantities every `quire` command takes on its command line: durations
//! (`5s`, `500ms`) and byte sizes (`64KiB`, `1MB`).
//!
//! The one implementation lives in `quire_net::units`, so that `quire-node` and
//! `quire-broker` read their settings with the same spellings and error messages as the
//! `quire` CLI; this module re-exports it under its old path.

pub use quire_net::units::*;
