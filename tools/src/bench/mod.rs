//! `quire bench ...`: benchmarks that measure Quire's parts against the physical limit.
//!
//! Each benchmark is a submodule with a plain configuration struct, a `run` function that
//! returns a [`crate::output::Report`], and no clap types in its API, so tests and other
//! commands can call it directly. Today: [`disk`] (raw O_DIRECT writes, the yardstick
//! `fio` also measures). `bench wal` and `bench node` are to come.

pub mod cluster;
pub mod disk;
