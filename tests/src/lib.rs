//! quire-tests: the one harness for Quire's multi-process tests, and the fault tests
//! themselves (`tests/proc_*.rs`).
//!
//! Real `quire-node` stores and `quire-broker` brokers run on loopback, each in a temporary
//! directory, and are killed (SIGKILL) and cleaned up on drop, also when a test panics.
//! Every wait is bounded ([`WAIT`]). What the library holds:
//!
//! - [`process`]: where the binaries are, a child process with its log ([`Proc`]),
//!   signals, free ports;
//! - [`cluster`]: [`Cluster`] of [`StoreNode`]s and [`BrokerNode`]s with their [`Timing`];
//! - [`client`]: a minimal synchronous [`Client`] speaking quire-proto frames;
//! - [`load`]: continuous producers ([`LoadDriver`]) and [`check_exactly_once`];
//! - [`disk`]: disk faults done to a store from outside — a size-limited tmpfs, a
//!   ballast file, truncation and bit flips of segment files, `quire wal verify`, a
//!   store's tail, SIGTERM and wait;
//! - [`proxy`]: a fault-injecting TCP [`Proxy`] (pass, delay, drop, black-hole, per
//!   direction), and [`netfault`]: [`StoreLinks`], one proxy between each broker and each
//!   store, to cut one broker off from chosen stores.
//! - [`serial`]: [`proc_test`], the guard every multi-process test starts with (one at a
//!   time, a hard time bound), and [`wait_until`] / [`wait_for`], bounded waits on a condition;
//! - [`node`]: one `quire-node` alone ([`node::NodeProc`]) and appends built from
//!   quire-proto types, for the node's multi-process tests;
//! - [`http`]: a bounded GET on a metrics port, and the one metrics parser of the tests
//!   ([`http::metric`], [`http::metric_names`]);
//! - [`history`]: every produce attempt with its outcome ([`History`]) and the one checker
//!   of a run — the simulation's own (`quire_sim::Checker`) — via [`Cluster::check`].
//!
//! Other packages' multi-process tests (the `proc_*.rs` of broker, client, node and tools)
//! use it as a dev-dependency. It does not own the servers' logic and reaches into no
//! crate's internals: it talks to the processes over the wire, the command line and their
//! files.

#![allow(clippy::missing_panics_doc)] // test harness: a panic is a test failure

pub mod client;
pub mod cluster;
pub mod disk;
pub mod history;
pub mod http;
pub mod load;
pub mod netfault;
pub mod node;
pub mod process;
pub mod proxy;
pub mod serial;

use std::time::Duration;

pub use client::{fetch_all, payload, produce_answer, produce_request, Client, ProduceResult};
pub use cluster::{BrokerHandle, BrokerNode, Cluster, StoreNode, Timing, SETTLE_PRODUCER_ID};
pub use history::{Attempt, CheckReport, ConsumerReads, History, Outcome, OutcomeCounts};
pub use load::{check_exactly_once, ConsumerDriver, LoadDriver, ProducerOutcome, LOAD_BATCH};
pub use netfault::StoreLinks;
pub use process::{
    broker_bin, free_port, hermetic, node_bin, quire_bin, run_bounded, signal, stop, wait_bounded,
    Proc,
};
pub use proxy::{Direction, Fault, Proxy, ProxyStats};
pub use serial::{proc_test, proc_test_bounded, wait_for, wait_until, ProcTest, PROC_TEST_BOUND};

/// How long any single wait of the harness may take.
pub const WAIT: Duration = Duration::from_secs(30);
/// How long a probe (is this broker the master?) waits for an answer.
pub const PROBE_WAIT: Duration = Duration::from_secs(1);
