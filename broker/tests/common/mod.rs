//! A harness for multi-process tests: real `quire-node` stores and `quire-broker` brokers
//! on loopback, each in a temporary directory, killed and cleaned up on drop (also when a
//! test panics), plus a minimal synchronous client speaking quire-proto frames directly.
//!
//! Where the binaries come from: `quire-broker` is this package's binary
//! (`CARGO_BIN_EXE_quire-broker`, built by cargo for integration tests). `quire-node` is
//! another package's binary: the harness looks for it next to the test executable's
//! directory (`target/<profile>/quire-node`). `cargo nextest run --workspace` and
//! `cargo test --workspace` build it (quire-node has integration tests of its own, which
//! makes cargo build its binary); for `cargo test -p quire-broker` alone the harness runs
//! `cargo build -p quire-node` (same profile and target directory) once if it is missing.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quire_proto::{
    decode, encode, Body, BrokerId, ErrorCode, ErrorResponse, FetchRequest, Frame, MetadataRequest,
    MetadataResponse, Offset, ProduceRequest, ProduceResponse, RequestId,
};

/// How long any single wait of the harness may take.
pub const WAIT: Duration = Duration::from_secs(30);
/// How long a probe (is this broker the master?) waits for an answer.
pub const PROBE_WAIT: Duration = Duration::from_secs(1);

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    // target/<profile>/deps/<test> -> target/<profile>
    exe.parent()
        .and_then(Path::parent)
        .expect("the test executable lives in target/<profile>/deps")
        .to_path_buf()
}

/// The `quire-node` binary, built if missing.
pub fn node_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = target_dir();
        let bin = dir.join("quire-node");
        if bin.exists() {
            return bin;
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let release = dir.file_name().is_some_and(|n| n == "release");
        let target = dir.parent().expect("target/<profile> has a parent");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", "quire-node", "--bin", "quire-node"])
            .env("CARGO_TARGET_DIR", target);
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status();
        assert!(
            bin.exists(),
            "the quire-node binary is missing at {} and building it failed ({status:?}): run `cargo build -p quire-node` (same profile and target directory) first",
            bin.display()
        );
        bin
    })
    .clone()
}

/// The `quire-broker` binary.
pub fn broker_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_quire-broker"))
}

/// A free loopback port for a server that must keep its address across restarts. Picked
/// at random below the kernel's ephemeral range (32768 and up on Linux), so the test's own
/// outgoing connections never take it between this check and the server's bind.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut x = seed.wrapping_add(n.wrapping_mul(0xbf58_476d_1ce4_e5b9));
        x ^= x >> 31;
        let port = 20_000 + (x % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000..32000");
}

/// A child process with its log file, killed on drop.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Option<Child>,
    pub log: PathBuf,
    /// The metrics address, if the process printed one.
    pub metrics: Option<String>,
}

impl Proc {
    /// Starts `cmd`, with stderr to `log`, and waits for `listening on ADDR` on stdout.
    fn start(name: &str, mut cmd: Command, log: PathBuf) -> (Proc, String) {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        cmd.stdout(Stdio::piped()).stderr(err).stdin(Stdio::null());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let mut p = Proc {
            name: name.to_owned(),
            child: Some(child),
            log,
            metrics: None,
        };
        let deadline = Instant::now() + WAIT;
        let mut addr = None;
        while addr.is_none() && Instant::now() < deadline {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    if let Some(a) = line.strip_prefix("listening on ") {
                        addr = Some(a.trim().to_owned());
                    }
                }
                Err(_) => break,
            }
        }
        // `metrics on ADDR` follows at once when metrics are served.
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            if let Some(m) = line.strip_prefix("metrics on ") {
                p.metrics = Some(m.trim().to_owned());
            }
        }
        match addr {
            Some(addr) => (p, addr),
            None => {
                let tail = p.log_tail(40);
                p.kill9();
                panic!("{name} did not print its address within {WAIT:?}; log:\n{tail}");
            }
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last `n` lines of the process's log.
    pub fn log_tail(&self, n: usize) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() && self.child.is_some() {
            eprintln!(
                "---- {} (last lines of {}) ----\n{}",
                self.name,
                self.log.display(),
                self.log_tail(30)
            );
        }
        self.kill9();
    }
}

/// One store: its directory and address survive restarts.
#[derive(Debug)]
pub struct StoreNode {
    pub dir: PathBuf,
    pub addr: String,
    config: PathBuf,
    pub proc: Option<Proc>,
    index: usize,
}

impl StoreNode {
    pub fn start(&mut self) {
        assert!(self.proc.is_none(), "store {} already runs", self.index);
        let mut cmd = Command::new(node_bin());
        cmd.args(["run", "--data-dir"])
            .arg(&self.dir)
            .args(["--listen", &self.addr, "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "info");
        let (p, addr) = Proc::start(
            &format!("store{}", self.index),
            cmd,
            self.dir.with_extension("log"),
        );
        assert_eq!(addr, self.addr);
        self.proc = Some(p);
    }

    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    /// The store's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(Proc::pid)
    }
}

/// Sends `sig` to a process this test started and still owns.
pub fn signal(pid: u32, sig: i32) {
    let pid = libc::pid_t::try_from(pid).expect("a pid fits in pid_t");
    // SAFETY: kill(2) with a pid this test started and has not reaped.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// SIGSTOPs a process this test started and waits (bounded by [`WAIT`]) until every one of
/// its threads is stopped. kill(2) only queues the signal: the target's threads stop when
/// they next enter the kernel, so a thread already running may still read a socket and
/// act on what arrives right after `kill` returns. A test that sends something "while the
/// process is frozen" must wait for this first.
pub fn stop(pid: u32) {
    signal(pid, libc::SIGSTOP);
    let deadline = Instant::now() + WAIT;
    loop {
        if all_threads_stopped(pid) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} did not stop within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether every thread of `pid` is in state `T` (stopped) in /proc/PID/task/*/stat.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut seen = 0;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return false;
        };
        // The state follows the command name, which is in parentheses and may hold spaces.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state != Some("T") {
            return false;
        }
        seen += 1;
    }
    seen > 0
}

/// One broker.
#[derive(Debug)]
pub struct BrokerNode {
    pub id: u16,
    pub addr: String,
    pub dir: PathBuf,
    args: Vec<String>,
    pub proc: Option<Proc>,
}

impl BrokerNode {
    pub fn start(&mut self) {
        assert!(self.proc.is_none(), "broker {} already runs", self.id);
        let mut cmd = Command::new(broker_bin());
        cmd.arg("run").args(&self.args).env(
            "RUST_LOG",
            std::env::var("QUIRE_TEST_LOG").unwrap_or_else(|_| "info".into()),
        );
        let (p, addr) = Proc::start(
            &format!("broker{}", self.id),
            cmd,
            self.dir.with_extension("log"),
        );
        assert_eq!(addr, self.addr);
        self.proc = Some(p);
    }

    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    pub fn is_running(&self) -> bool {
        self.proc.is_some()
    }

    /// The broker's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(Proc::pid)
    }

    /// `GET /metrics` from the running broker, as text.
    pub fn scrape(&self) -> String {
        let addr = self
            .proc
            .as_ref()
            .and_then(|p| p.metrics.clone())
            .expect("the broker serves metrics");
        let mut s = TcpStream::connect(&addr).expect("metrics connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("metrics request");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("metrics answer");
        out
    }
}

/// A cluster of stores and brokers in one temporary directory (removed on drop, after the
/// processes are killed).
#[derive(Debug)]
pub struct Cluster {
    pub stores: Vec<StoreNode>,
    pub brokers: Vec<BrokerNode>,
    // Declared last: dropped after the processes.
    pub root: tempfile::TempDir,
}

/// Timing settings of the brokers.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub heartbeat_ms: u64,
    pub election_timeout_ms: u64,
    pub produce_timeout_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat_ms: 50,
            election_timeout_ms: 600,
            produce_timeout_ms: 5_000,
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let procs = self
                .brokers
                .iter()
                .filter_map(|b| b.proc.as_ref())
                .chain(self.stores.iter().filter_map(|s| s.proc.as_ref()));
            for p in procs {
                eprintln!(
                    "---- {} (last lines of {}) ----\n{}",
                    p.name,
                    p.log.display(),
                    p.log_tail(30)
                );
            }
        }
        for b in &mut self.brokers {
            b.kill9();
        }
        for s in &mut self.stores {
            s.kill9();
        }
        if std::env::var_os("QUIRE_TEST_KEEP").is_some() {
            self.root.disable_cleanup(true);
            eprintln!("QUIRE_TEST_KEEP: kept {}", self.root.path().display());
        }
    }
}

impl Cluster {
    /// Initialises `stores` stores and prepares `brokers` brokers (ids 1..), starts nothing.
    pub fn new(stores: usize, brokers: u16, timing: Timing) -> Cluster {
        let root = tempfile::Builder::new()
            .prefix("quire-broker-test-")
            .tempdir()
            .expect("temp dir");
        let store_config = root.path().join("store.toml");
        std::fs::write(&store_config, "[wal]\nsegment_bytes_max = 16777216\n")
            .expect("store config");
        let mut nodes = Vec::new();
        for i in 0..stores {
            let dir = root.path().join(format!("store{i}"));
            let out = Command::new(node_bin())
                .args(["init", "--data-dir"])
                .arg(&dir)
                .output()
                .expect("quire-node init");
            assert!(
                out.status.success(),
                "init failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            nodes.push(StoreNode {
                dir,
                addr: format!("127.0.0.1:{}", free_port()),
                config: store_config.clone(),
                proc: None,
                index: i,
            });
        }
        let store_list = nodes
            .iter()
            .map(|s| s.addr.clone())
            .collect::<Vec<_>>()
            .join(",");
        let broker_addrs: Vec<(u16, String)> = (1..=brokers)
            .map(|id| (id, format!("127.0.0.1:{}", free_port())))
            .collect();
        let broker_list = broker_addrs
            .iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect::<Vec<_>>()
            .join(",");
        let brokers = broker_addrs
            .into_iter()
            .map(|(id, addr)| {
                let dir = root.path().join(format!("broker{id}"));
                let args = vec![
                    "--id".to_owned(),
                    id.to_string(),
                    "--data-dir".to_owned(),
                    dir.display().to_string(),
                    "--listen".to_owned(),
                    addr.clone(),
                    "--stores".to_owned(),
                    store_list.clone(),
                    "--brokers".to_owned(),
                    broker_list.clone(),
                    "--heartbeat-ms".to_owned(),
                    timing.heartbeat_ms.to_string(),
                    "--election-timeout-ms".to_owned(),
                    timing.election_timeout_ms.to_string(),
                    "--produce-timeout-ms".to_owned(),
                    timing.produce_timeout_ms.to_string(),
                    "--metrics-listen".to_owned(),
                    "127.0.0.1:0".to_owned(),
                ];
                BrokerNode {
                    id,
                    addr,
                    dir,
                    args,
                    proc: None,
                }
            })
            .collect();
        Cluster {
            stores: nodes,
            brokers,
            root,
        }
    }

    pub fn start_all(&mut self) {
        for s in &mut self.stores {
            s.start();
        }
        for b in &mut self.brokers {
            b.start();
        }
    }

    pub fn broker(&mut self, id: u16) -> &mut BrokerNode {
        self.brokers
            .iter_mut()
            .find(|b| b.id == id)
            .expect("a broker with that id")
    }

    /// Waits until a running broker says it is the master and serves (a produce-free
    /// check: its Metadata names itself and a Fetch is not refused with NotMaster).
    pub fn wait_for_master(&self) -> u16 {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            for b in self.brokers.iter().filter(|b| b.is_running()) {
                let Ok(mut c) = Client::connect_with(&b.addr, PROBE_WAIT) else {
                    continue;
                };
                let Ok(m) = c.metadata() else { continue };
                if m.master.as_ref().is_some_and(|m| m.id == BrokerId(b.id)) && c.is_serving() {
                    return b.id;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no master elected within {WAIT:?}");
    }
}

impl Cluster {
    /// Waits until a master acked a first message (to topic `__warmup`, not idempotent):
    /// after it the election is settled. Returns the master's id.
    pub fn settle(&self) -> u16 {
        self.produce_acked(&ProduceRequest {
            topic: "__warmup".into(),
            producer_id: 0,
            sequence: 0,
            messages: vec![Bytes::from_static(b"warmup")],
        });
        self.wait_for_master()
    }

    /// Sends `req` to the master until it is acked (a master elected a moment ago may still
    /// be deposed by a racing election: `NotMaster` is retried), within [`WAIT`].
    pub fn produce_acked(&self, req: &ProduceRequest) -> ProduceResponse {
        let deadline = Instant::now() + WAIT;
        loop {
            let master = self.wait_for_master();
            let addr = &self
                .brokers
                .iter()
                .find(|b| b.id == master)
                .expect("the master is a broker")
                .addr;
            if let Ok(mut c) = Client::connect(addr) {
                match c.request(req.clone()).map(produce_answer) {
                    Ok(Ok(r)) => return r,
                    Ok(Err(e)) if e.code == ErrorCode::NotMaster => {}
                    Ok(Err(e)) => panic!("produce failed: {e:?}"),
                    Err(_) => {}
                }
            }
            assert!(Instant::now() < deadline, "no master acked within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A minimal synchronous client of one broker speaking quire-proto frames.
#[derive(Debug)]
pub struct Client {
    stream: TcpStream,
    buf: BytesMut,
    next_id: u64,
    /// Answers read while waiting for another request's.
    stash: HashMap<u64, Body>,
}

impl Client {
    pub fn connect(addr: &str) -> std::io::Result<Client> {
        Client::connect_with(addr, WAIT)
    }

    /// Connects with `read_timeout` for every answer (short for probes: a stopped broker
    /// accepts connections but never answers).
    pub fn connect_with(addr: &str, read_timeout: Duration) -> std::io::Result<Client> {
        let stream = TcpStream::connect_timeout(
            &addr
                .parse()
                .map_err(|_| std::io::Error::other("bad address"))?,
            Duration::from_secs(2),
        )?;
        stream.set_read_timeout(Some(read_timeout))?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            buf: BytesMut::with_capacity(1 << 16),
            next_id: 1,
            stash: HashMap::new(),
        })
    }

    /// Sends a request; returns its id.
    pub fn send(&mut self, body: impl Into<Body>) -> std::io::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let mut out = BytesMut::new();
        encode(&Frame::new(RequestId(id), body), &mut out).map_err(std::io::Error::other)?;
        self.stream.write_all(&out)?;
        Ok(id)
    }

    /// Waits for the answer to request `id`.
    pub fn recv(&mut self, id: u64) -> std::io::Result<Body> {
        if let Some(b) = self.stash.remove(&id) {
            return Ok(b);
        }
        loop {
            match decode(&mut self.buf) {
                Ok(Some(frame)) => {
                    if frame.request_id.0 == id {
                        return Ok(frame.body);
                    }
                    self.stash.insert(frame.request_id.0, frame.body);
                    continue;
                }
                Ok(None) => {}
                Err(e) => return Err(std::io::Error::other(e)),
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "closed",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Whether an answer to `id` arrived unasked (while waiting for another).
    pub fn stashed(&self, id: u64) -> bool {
        self.stash.contains_key(&id)
    }

    pub fn request(&mut self, body: impl Into<Body>) -> std::io::Result<Body> {
        let id = self.send(body)?;
        self.recv(id)
    }

    pub fn metadata(&mut self) -> std::io::Result<MetadataResponse> {
        match self.request(MetadataRequest)? {
            Body::MetadataResponse(m) => Ok(m),
            other => Err(std::io::Error::other(format!(
                "metadata answered {other:?}"
            ))),
        }
    }

    /// Whether this broker serves clients (a zero-wait fetch is not refused).
    pub fn is_serving(&mut self) -> bool {
        matches!(
            self.request(FetchRequest {
                topic: "__probe".into(),
                from_offset: Offset(0),
                max_messages: 1,
                max_bytes: 1,
                wait_ms: 0,
            }),
            Ok(Body::FetchResponse(_))
        )
    }
}

/// What a produce came back with.
pub type ProduceResult = Result<ProduceResponse, ErrorResponse>;

/// Decodes a produce answer.
pub fn produce_answer(body: Body) -> ProduceResult {
    match body {
        Body::ProduceResponse(r) => Ok(r),
        Body::ErrorResponse(e) => Err(e),
        other => Err(ErrorResponse::new(
            ErrorCode::UnexpectedFrame,
            format!("{other:?}"),
        )),
    }
}

/// The payload of message `i` of producer `p`.
pub fn payload(p: u64, i: u64) -> Bytes {
    Bytes::from(format!("p{p}-m{i:08}"))
}

/// A produce request of `count` messages of producer `p` from sequence `seq`.
pub fn produce_request(topic: &str, p: u64, seq: u64, count: u64) -> ProduceRequest {
    ProduceRequest {
        topic: topic.into(),
        producer_id: p,
        sequence: seq,
        messages: (seq..seq + count).map(|i| payload(p, i)).collect(),
    }
}

/// Reads every message of `topic` from `from` until `want` messages were read or nothing
/// new comes within the wait; returns `(offset, payload)` pairs in order.
pub fn fetch_all(c: &mut Client, topic: &str, want: usize) -> Vec<(Offset, Bytes)> {
    let mut out = Vec::new();
    let mut next = Offset(0);
    let deadline = Instant::now() + WAIT;
    while out.len() < want && Instant::now() < deadline {
        match c.request(FetchRequest {
            topic: topic.into(),
            from_offset: next,
            max_messages: 1000,
            max_bytes: 1 << 20,
            wait_ms: 500,
        }) {
            Ok(Body::FetchResponse(r)) => {
                assert!(r.next_offset >= next, "next_offset never goes back");
                next = r.next_offset;
                out.extend(r.messages);
            }
            Ok(other) => panic!("fetch answered {other:?}"),
            Err(e) => panic!("fetch failed: {e}"),
        }
    }
    out
}

/// What one continuous producer of [`LoadDriver`] saw.
#[derive(Debug, Default)]
pub struct ProducerOutcome {
    /// Sequence → the offset its message was acknowledged at (a retry of a batch must get the
    /// same offsets: checked as it runs).
    pub acked: std::collections::BTreeMap<u64, Offset>,
    /// `NotMaster` answers (retried at the master found next).
    pub not_master: u64,
    /// Lost connections and unanswered requests (retried).
    pub transport: u64,
    /// Every other error answer: code and message.
    pub errors: Vec<(ErrorCode, String)>,
    /// When each acknowledgement arrived, and from which broker (index in the addresses).
    pub ack_times: Vec<(Instant, usize)>,
}

/// Producers that send batches of 10 continuously, one request in flight each, to
/// whichever broker serves; a failed batch is resent with the same sequence (idempotent
/// produce) until acknowledged, after the producer is stopped too.
pub struct LoadDriver {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<ProducerOutcome>>,
}

/// Messages per batch of a [`LoadDriver`] producer.
pub const LOAD_BATCH: u64 = 10;

impl LoadDriver {
    /// Starts producers `first_producer..first_producer + producers` on topic `t`.
    pub fn start(broker_addrs: Vec<String>, first_producer: u64, producers: u64) -> LoadDriver {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (first_producer..first_producer + producers)
            .map(|p| {
                let stop = stop.clone();
                let addrs = broker_addrs.clone();
                std::thread::spawn(move || run_producer(&addrs, p, &stop))
            })
            .collect();
        LoadDriver { stop, threads }
    }

    /// Stops the producers (each finishes its batch in flight) and returns what each saw.
    pub fn stop(self) -> Vec<ProducerOutcome> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.threads
            .into_iter()
            .map(|t| t.join().expect("a producer thread panicked"))
            .collect()
    }
}

fn serving_master(addrs: &[String]) -> Option<(usize, Client)> {
    addrs.iter().enumerate().find_map(|(i, a)| {
        let mut c = Client::connect_with(a, PROBE_WAIT).ok()?;
        let m = c.metadata().ok()?;
        let me = m.master.as_ref()?;
        (me.addr == *a && c.is_serving()).then_some((i, c))
    })
}

fn run_producer(addrs: &[String], p: u64, stop: &std::sync::atomic::AtomicBool) -> ProducerOutcome {
    let mut out = ProducerOutcome::default();
    let mut seq = 0u64;
    let deadline = Instant::now() + WAIT * 4;
    'outer: loop {
        assert!(Instant::now() < deadline, "producer {p} made no progress");
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        let Some((broker, mut c)) = serving_master(addrs) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        loop {
            match c
                .request(produce_request("t", p, seq, LOAD_BATCH))
                .map(produce_answer)
            {
                Ok(Ok(r)) => {
                    assert_eq!(u64::from(r.count), LOAD_BATCH, "producer {p} batch {seq}");
                    for i in 0..LOAD_BATCH {
                        let o = Offset(r.base_offset.0 + i);
                        if let Some(prev) = out.acked.insert(seq + i, o) {
                            assert_eq!(prev, o, "producer {p}: a retry got other offsets");
                        }
                    }
                    out.ack_times.push((Instant::now(), broker));
                    seq += LOAD_BATCH;
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break 'outer;
                    }
                }
                Ok(Err(e)) if e.code == ErrorCode::NotMaster => {
                    out.not_master += 1;
                    continue 'outer;
                }
                Ok(Err(e)) => {
                    out.errors.push((e.code, e.message));
                    continue 'outer;
                }
                Err(_) => {
                    out.transport += 1;
                    continue 'outer;
                }
            }
        }
    }
    out
}

/// Checks that every acknowledged message of every producer is in `fetched` exactly once,
/// at its acknowledged offset, and in each producer's order; no offset holds two events.
pub fn check_exactly_once(
    outcomes: &[ProducerOutcome],
    first_producer: u64,
    fetched: &[(Offset, Bytes)],
) {
    let by_offset: std::collections::BTreeMap<Offset, &Bytes> =
        fetched.iter().map(|(o, b)| (*o, b)).collect();
    assert_eq!(by_offset.len(), fetched.len(), "no offset served twice");
    let mut seen: HashMap<&Bytes, usize> = HashMap::new();
    for (_, b) in fetched {
        *seen.entry(b).or_default() += 1;
    }
    for (i, o) in outcomes.iter().enumerate() {
        let p = first_producer + i as u64;
        let mut last = None;
        for (&seq, off) in &o.acked {
            let want = payload(p, seq);
            assert_eq!(
                by_offset.get(off).map(|b| (*b).clone()),
                Some(want.clone()),
                "producer {p}: acked message {seq} at {off:?}"
            );
            assert_eq!(
                seen.get(&want),
                Some(&1),
                "producer {p}: message {seq} exactly once"
            );
            assert!(last < Some(*off), "producer {p}: offsets follow sequences");
            last = Some(*off);
        }
    }
}
