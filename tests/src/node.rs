//! One store alone, for the node's multi-process tests (`node/tests/proc_*.rs`): runs the
//! real `quire-node` binary on 127.0.0.1 with ephemeral ports, in a temporary directory,
//! and kills it (and removes the directory) on drop, also when the test panics. Every wait
//! is bounded. Also: appends and events built from quire-proto types, and a bounded
//! runtime for an async test body ([`block_on`]).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::Proc;
use bytes::Bytes;
use quire_proto::{AppendRequest, Epoch, Event, EventKind, LogPosition, Offset};

/// How long the node may take to start and print its address.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound of one whole test body.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(45);

/// The `quire-node` binary (see [`crate::node_bin`]).
pub fn bin() -> PathBuf {
    crate::node_bin()
}

/// A temporary directory with a store data directory (`data/`) and the node's log file.
#[derive(Debug)]
pub struct TestDir {
    pub root: tempfile::TempDir,
}

impl Default for TestDir {
    fn default() -> TestDir {
        TestDir::new()
    }
}

impl TestDir {
    /// A new, empty temporary directory (removed on drop).
    ///
    /// # Panics
    /// If the temp dir cannot be created.
    pub fn new() -> TestDir {
        TestDir {
            root: tempfile::Builder::new()
                .prefix("quire-node-test")
                .tempdir()
                .expect("temp dir"),
        }
    }

    pub fn data(&self) -> PathBuf {
        self.root.path().join("data")
    }

    pub fn log(&self) -> PathBuf {
        self.root.path().join("node.log")
    }

    /// A config file with small segments (the default 256 MiB preallocation is wasted on
    /// a test), written on first use.
    pub fn config(&self) -> PathBuf {
        let path = self.root.path().join("node.toml");
        if !path.exists() {
            fs::write(&path, SMALL_CONFIG).expect("config file");
        }
        path
    }
}

/// Settings for tests: 4 MiB segments, the rest default.
pub const SMALL_CONFIG: &str = "[wal]\nsegment_bytes_max = 4194304\n";

/// Runs `quire-node ARGS` to completion (bounded) and returns its output.
pub fn run_cli(args: &[&str]) -> Output {
    crate::run_bounded(Command::new(bin()).args(args), START_TIMEOUT)
}

/// `quire-node init --data-dir DIR [--learner]`, which must succeed.
pub fn init(dir: &Path, learner: bool) {
    let d = dir.to_str().expect("utf-8 path");
    let mut args = vec!["init", "--data-dir", d];
    if learner {
        args.push("--learner");
    }
    let out = run_cli(&args);
    assert!(
        out.status.success(),
        "init failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running `quire-node run` (a process of the workspace's harness, quire-tests), killed
/// with SIGKILL on drop.
#[derive(Debug)]
pub struct NodeProc {
    proc: Proc,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    data: PathBuf,
    log: PathBuf,
    extra: Vec<String>,
    env: Vec<(String, String)>,
}

impl NodeProc {
    /// Starts the node on `dir`'s data directory and waits (bounded) for its addresses.
    pub fn start(dir: &TestDir) -> NodeProc {
        let config = dir.config();
        NodeProc::start_on(
            &dir.data(),
            &dir.log(),
            &["--config", config.to_str().expect("utf-8 path")],
        )
    }

    pub fn start_on(data: &Path, log: &Path, extra: &[&str]) -> NodeProc {
        NodeProc::start_with_env(data, log, extra, &[])
    }

    /// [`NodeProc::start_on`] with extra environment variables (e.g. `QUIRE_FAILPOINTS`),
    /// kept for [`NodeProc::restart`].
    pub fn start_with_env(
        data: &Path,
        log: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> NodeProc {
        let mut cmd = Command::new(bin());
        cmd.args([
            "run",
            "--data-dir",
            data.to_str().expect("utf-8 path"),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied());
        // The node prints `listening on ADDR` and `metrics on ADDR` in one write.
        let (proc, addr) = Proc::start("quire-node", cmd, log.to_path_buf());
        let metrics = proc
            .metrics
            .as_deref()
            .expect("the node printed its metrics address")
            .parse()
            .expect("metrics address");
        NodeProc {
            addr: addr.parse().expect("listen address"),
            metrics,
            proc,
            data: data.to_path_buf(),
            log: log.to_path_buf(),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    /// SIGTERM, then waits (bounded by [`START_TIMEOUT`]) for the process to exit; returns
    /// whether it exited with success.
    pub fn terminate(&mut self) -> bool {
        if !self.proc.is_running() {
            return false;
        }
        self.proc
            .terminate(START_TIMEOUT)
            .unwrap_or_else(|| panic!("the node did not stop within {START_TIMEOUT:?} of SIGTERM"))
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        self.proc.kill9();
    }

    /// Kills the node and starts it again on the same data directory.
    pub fn restart(mut self) -> NodeProc {
        self.kill9();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        NodeProc::start_with_env(&self.data.clone(), &self.log.clone(), &extra, &env)
    }

    /// `GET path` on the metrics listener; returns the body.
    pub fn http_get(&self, path: &str) -> String {
        http_get(self.metrics, path)
    }

    /// The value of the metric line that starts with `prefix` (e.g.
    /// `quire_rejected_frames_total{reason="body_checksum"}`), or 0 if absent.
    pub fn metric(&self, prefix: &str) -> f64 {
        metric_value(&self.http_get("/metrics"), prefix)
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "---- node log ({}) ----\n{}",
                self.log.display(),
                fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// `GET path` on a node's metrics listener; the body of its `200` answer
/// ([`crate::http::get_ok`], which fails the test on anything else).
pub fn http_get(addr: SocketAddr, path: &str) -> String {
    crate::http::get_ok(&addr.to_string(), path)
}

/// The value of the sample `prefix` (a name with its labels, as printed) in a scrape, or 0
/// if absent: [`crate::http::metric`].
pub fn metric_value(body: &str, prefix: &str) -> f64 {
    crate::http::metric(body, prefix).unwrap_or(0.0)
}

/// Runs an async test body on a fresh runtime, bounded by [`TEST_TIMEOUT`].
pub fn block_on<F: std::future::Future<Output = ()>>(f: F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(TEST_TIMEOUT, f)
            .await
            .expect("the test body took longer than TEST_TIMEOUT");
    });
}

/// An event at `offset` of `epoch` with payload `payload`.
pub fn event(epoch: u64, offset: u64, payload: impl Into<Bytes>) -> Event {
    Event {
        epoch: Epoch(epoch),
        offset: Offset(offset),
        kind: EventKind::Message,
        payload: payload.into().into(),
    }
}

pub fn pos(epoch: u64, offset: u64) -> LogPosition {
    LogPosition {
        epoch: Epoch(epoch),
        offset: Offset(offset),
    }
}

/// An append of `epoch` after `prev` with one event per payload, all of `event_epoch`.
pub fn append(
    epoch: u64,
    prev: Option<LogPosition>,
    event_epoch: u64,
    payloads: &[Bytes],
) -> AppendRequest {
    let first = prev.map_or(0, |p| p.offset.0 + 1);
    AppendRequest {
        epoch: Epoch(epoch),
        prev,
        events: payloads
            .iter()
            .enumerate()
            .map(|(i, p)| event(event_epoch, first + i as u64, p.clone()))
            .collect(),
        hwm: None,
    }
}
