//! `quire bench ...`: benchmarks that measure Quire's parts against the physical limit.
//!
//! Each benchmark is a submodule with a plain configuration struct, a `run` function that
//! returns a [`crate::output::Report`], and no clap types in its API, so tests and other
//! commands can call it directly. Today: [`disk`] (raw O_DIRECT writes, the yardstick
//! `fio` also measures), [`wal`] (appends through quire-wal, group commit vs one fdatasync
//! per event), [`logs`] (the disk layouts a store could give many logs), [`node`] (appends through a quire-node over TCP); [`cpu`] measures the CPU
//! a run spends, [`cli`] declares the arguments of `bench wal` and `bench node`; [`report`]
//! runs them all (and `bench cluster` on a local cluster) into one Markdown table.

pub mod cli;
pub mod cluster;
pub mod cpu;
pub mod disk;
pub mod logs;
pub mod node;
pub mod report;
pub mod servers;
pub mod wal;
