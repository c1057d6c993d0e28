//! A cluster of real stores and brokers on loopback in one temporary directory: start,
//! kill -9, restart each process (a store keeps its directory and address, a broker its
//! id, directory and address), find the master.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_proto::{
    Body, BrokerId, ErrorCode, Event, MetadataResponse, Offset, ProduceRequest, ProduceResponse,
    ReadRequest, TailRequest, TailResponse,
};

use crate::client::{produce_answer, Client};
use crate::history::{check, Attempt, CheckReport, ConsumerReads, FinalLog, History};
use crate::process::{broker_bin, free_port, node_bin, Proc};
use crate::{PROBE_WAIT, WAIT};

/// One store: its directory and address survive restarts.
#[derive(Debug)]
pub struct StoreNode {
    pub dir: PathBuf,
    pub addr: String,
    /// The `--config` file (shared by the cluster's stores unless a test points one
    /// store at its own).
    pub config: PathBuf,
    /// Extra environment of the next start (e.g. `QUIRE_FAILPOINTS`).
    pub env: Vec<(String, String)>,
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
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
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

/// One broker.
#[derive(Debug)]
pub struct BrokerNode {
    pub id: u16,
    pub addr: String,
    pub dir: PathBuf,
    args: Vec<String>,
    pub proc: Option<Proc>,
    /// How many times the test started this broker (its process's incarnation), shared with
    /// the producers that record it in the [`History`].
    incarnation: Arc<AtomicU32>,
}

impl BrokerNode {
    pub fn start(&mut self) {
        assert!(self.proc.is_none(), "broker {} already runs", self.id);
        // Counted before the process exists: a producer connected to it reads at least
        // this incarnation.
        self.incarnation.fetch_add(1, Ordering::SeqCst);
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

    /// Adds command-line arguments for the next start (flags given later win).
    pub fn add_args(&mut self, args: &[&str]) {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
    }

    pub fn is_running(&self) -> bool {
        self.proc.is_some()
    }

    /// The store addresses this broker is started with (`--stores`), in slot order.
    pub fn stores(&self) -> Vec<String> {
        self.args
            .iter()
            .skip_while(|a| *a != "--stores")
            .nth(1)
            .map(|list| list.split(',').map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Starts this broker with other store addresses (`--stores`), in the same slot order:
    /// each broker may reach a store at its own address (a proxy, see
    /// [`crate::netfault::StoreLinks`]). Its data directory pins the list, so set it before
    /// the broker's first start.
    pub fn set_stores(&mut self, addrs: &[String]) {
        assert!(self.proc.is_none(), "broker {} runs", self.id);
        let at = self
            .args
            .iter()
            .position(|a| a == "--stores")
            .expect("invariant: brokers are started with --stores");
        self.args[at + 1] = addrs.join(",");
    }

    /// How many times the test has started this broker (1: its first process).
    pub fn incarnation(&self) -> u32 {
        self.incarnation.load(Ordering::SeqCst)
    }

    /// Where producers find this broker: `(id, address, incarnation counter)`.
    pub fn handle(&self) -> BrokerHandle {
        BrokerHandle {
            id: self.id,
            addr: self.addr.clone(),
            incarnation: self.incarnation.clone(),
        }
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
        crate::http::get_ok(&addr, "/metrics")
    }
}

/// A broker as producer threads see it: its id, address and incarnation counter.
#[derive(Clone, Debug)]
pub struct BrokerHandle {
    /// Broker id (from 1).
    pub id: u16,
    /// Its client address.
    pub addr: String,
    incarnation: Arc<AtomicU32>,
}

impl BrokerHandle {
    /// A handle of broker `id` with no process behind it (for tests of the checker).
    #[cfg(test)]
    pub(crate) fn for_tests(id: u16) -> BrokerHandle {
        BrokerHandle {
            id,
            addr: String::new(),
            incarnation: Arc::new(AtomicU32::new(1)),
        }
    }

    /// How many times the test has started this broker so far.
    pub fn incarnation(&self) -> u32 {
        self.incarnation.load(Ordering::SeqCst)
    }
}

/// A cluster of stores and brokers in one temporary directory (removed on drop, after the
/// processes are killed).
#[derive(Debug)]
pub struct Cluster {
    pub stores: Vec<StoreNode>,
    pub brokers: Vec<BrokerNode>,
    /// Every produce attempt sent through the harness, with its outcome.
    pub history: History,
    /// Next sequence of the harness's own idempotent producer ([`SETTLE_PRODUCER_ID`]).
    settle_sequence: AtomicU64,
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
        crate::serial::forget_dir(self.root.path());
        if std::env::var_os("QUIRE_TEST_KEEP").is_some() {
            self.root.disable_cleanup(true);
            eprintln!("QUIRE_TEST_KEEP: kept {}", self.root.path().display());
        }
    }
}

impl Cluster {
    /// Initialises `stores` stores and prepares `brokers` brokers (ids 1..), starts nothing.
    pub fn new(stores: usize, brokers: u16, timing: Timing) -> Cluster {
        crate::client::set_client_tls(None);
        let root = tempfile::Builder::new()
            .prefix("quire-test-")
            .tempdir()
            .expect("temp dir");
        crate::serial::register_dir(root.path().to_owned());
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
                env: Vec::new(),
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
                    "--heartbeat".to_owned(),
                    format!("{}ms", timing.heartbeat_ms),
                    "--election-timeout".to_owned(),
                    format!("{}ms", timing.election_timeout_ms),
                    "--produce-timeout".to_owned(),
                    format!("{}ms", timing.produce_timeout_ms),
                    "--metrics-listen".to_owned(),
                    "127.0.0.1:0".to_owned(),
                ];
                BrokerNode {
                    id,
                    addr,
                    dir,
                    args,
                    proc: None,
                    incarnation: Arc::new(AtomicU32::new(0)),
                }
            })
            .collect();
        Cluster {
            stores: nodes,
            brokers,
            history: History::new(),
            settle_sequence: AtomicU64::new(0),
            root,
        }
    }

    /// [`Cluster::new`] with TLS on every link: a CA and certificates in `ROOT/tls`
    /// (`quire_tls::certs`), stores that require client certificates (their `[tls]` table),
    /// brokers that serve TLS and speak it to stores and brokers (`--cert-file`, ...), and
    /// this process's test clients speaking TLS with the broker certificate (they read the
    /// stores' logs, which only the broker role may; `client` and `client-2` are client
    /// principals for the tests to use). A later [`Cluster::set_store_config`] must keep
    /// the `[tls]` table ([`Cluster::store_tls_toml`]).
    pub fn new_tls(stores: usize, brokers: u16, timing: Timing) -> Cluster {
        use quire_tls::certs::{files_for, write_local};
        use quire_tls::Role;
        let mut cluster = Cluster::new(stores, brokers, timing);
        let dir = cluster.root.path().join("tls");
        write_local(
            &dir,
            &[
                ("store", Role::Store),
                ("broker", Role::Broker),
                ("client", Role::Client),
                ("client-2", Role::Client),
            ],
        )
        .expect("certificates");
        let toml = format!(
            "[wal]\nsegment_bytes_max = 16777216\n{}",
            cluster.store_tls_toml()
        );
        cluster.set_store_config(&toml);
        let broker = files_for(&dir, "broker");
        let path = |p: Option<PathBuf>| p.expect("file").display().to_string();
        let args = [
            "--cert-file".to_owned(),
            path(broker.cert),
            "--key-file".to_owned(),
            path(broker.key),
            "--ca-file".to_owned(),
            path(broker.ca),
        ];
        cluster.add_broker_args(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let client = files_for(&dir, "broker")
            .client_config()
            .expect("client configuration");
        crate::client::set_client_tls(client);
        cluster
    }

    /// The `[tls]` table of a [`Cluster::new_tls`] cluster's stores (empty for a plaintext
    /// cluster), to append to a store config.
    pub fn store_tls_toml(&self) -> String {
        let dir = self.root.path().join("tls");
        if !dir.exists() {
            return String::new();
        }
        let f = quire_tls::certs::files_for(&dir, "store");
        let path = |p: Option<PathBuf>| p.expect("file").display().to_string();
        format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\nca_file = {:?}\n",
            path(f.cert),
            path(f.key),
            path(f.ca)
        )
    }

    /// Replaces the stores' config file (TOML, e.g. a smaller `[wal] segment_bytes_max`);
    /// call before starting the stores.
    pub fn set_store_config(&mut self, toml: &str) {
        let path = self.root.path().join("store.toml");
        std::fs::write(&path, toml).expect("store config");
    }

    /// Gives every broker a Kafka listener on a free port (`--kafka-listen`, and every
    /// broker's address as `--kafka-brokers`); call before starting them. The bootstrap
    /// addresses, in broker id order.
    pub fn enable_kafka(&mut self) -> Vec<String> {
        let addrs: Vec<String> = self
            .brokers
            .iter()
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let list = self
            .brokers
            .iter()
            .zip(&addrs)
            .map(|(b, a)| format!("{}={a}", b.id))
            .collect::<Vec<_>>()
            .join(",");
        for (b, a) in self.brokers.iter_mut().zip(&addrs) {
            b.args.extend([
                "--kafka-listen".to_owned(),
                a.clone(),
                "--kafka-brokers".to_owned(),
                list.clone(),
            ]);
        }
        addrs
    }

    /// Adds flags to every broker's command line; call before starting them.
    pub fn add_broker_args(&mut self, args: &[&str]) {
        for b in &mut self.brokers {
            b.args.extend(args.iter().map(|a| (*a).to_owned()));
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

    /// Broker `id`, read-only (addresses, handles, metrics).
    ///
    /// # Panics
    /// If the cluster has no broker `id`.
    pub fn broker_node(&self, id: u16) -> &BrokerNode {
        self.brokers
            .iter()
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

    /// Waits until the running brokers agree on one master: one serves (as
    /// [`Cluster::wait_for_master`] finds it) and every other running broker's Metadata
    /// names it. Returns its id. After a master kill two slaves may race: the first winner
    /// can be deposed by the other's higher epoch a moment later, so a test that needs "the
    /// master and a broker that follows it" asks this, not the first master it saw. Panics
    /// with the last disagreement seen after [`WAIT`].
    pub fn wait_agreed_master(&self) -> u16 {
        let deadline = Instant::now() + WAIT;
        loop {
            let master = self.wait_for_master();
            let dissent = self
                .brokers
                .iter()
                .filter(|b| b.is_running() && b.id != master)
                .map(|b| {
                    let m =
                        Client::connect_with(&b.addr, PROBE_WAIT).and_then(|mut c| c.metadata());
                    (b.id, m)
                })
                .find(|(_, m)| {
                    !m.as_ref()
                        .is_ok_and(|m| m.master.as_ref().map(|b| b.id) == Some(BrokerId(master)))
                });
            let Some((id, m)) = dissent else {
                return master;
            };
            assert!(
                Instant::now() < deadline,
                "the brokers did not agree on a master within {WAIT:?}; last seen: master {master}, broker {id}'s metadata {m:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the restarted broker `id` follows the serving master: its Metadata
    /// names a master other than itself, the one [`Cluster::wait_for_master`] finds, with
    /// a high-water mark at or above `hwm` (if given). Returns that master's id. The master
    /// need not be the one elected right after a kill: a racing election may depose it.
    /// Panics with the last Metadata seen after [`WAIT`].
    pub fn wait_rejoined(&self, id: u16, hwm: Option<Offset>) -> u16 {
        let deadline = Instant::now() + WAIT;
        let addr = self.broker_node(id).addr.clone();
        loop {
            let master = self.wait_for_master();
            let m = Client::connect_with(&addr, PROBE_WAIT).and_then(|mut c| c.metadata());
            if let Ok(m) = &m {
                let follows =
                    master != id && m.master.as_ref().map(|b| b.id) == Some(BrokerId(master));
                if follows && m.hwm >= hwm {
                    return master;
                }
            }
            assert!(
                Instant::now() < deadline,
                "broker {id} did not rejoin within {WAIT:?}; last seen: master {master}, its metadata {m:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Cluster {
    /// Waits until a master acked a message of the harness's own producer (topic
    /// `__warmup`): after it the election is settled. Returns the master's id.
    pub fn settle(&self) -> u16 {
        self.produce_marker();
        self.wait_for_master()
    }

    /// Produces (until acknowledged) the next message of the harness's own idempotent
    /// producer [`SETTLE_PRODUCER_ID`] to topic `__warmup`; returns its offset.
    pub fn produce_marker(&self) -> Offset {
        let sequence = self.settle_sequence.fetch_add(1, Ordering::SeqCst);
        let r = self.produce_acked(&ProduceRequest {
            format: quire_proto::MessageFormat::Raw,
            topic: "__warmup".into(),
            producer_id: SETTLE_PRODUCER_ID,
            sequence,
            messages: vec![Bytes::from(format!("marker {sequence}"))],
        });
        r.base_offset
    }

    /// Sends `req` to the master until it is acked (a master elected a moment ago may still
    /// be deposed by a racing election: `NotMaster` is retried; so are `NoQuorum` and
    /// `Timeout`, whose outcome is unknown — a master whose stores stalled for an election
    /// timeout on a loaded machine steps down by check-quorum — and which the broker asks
    /// to retry with the same producer id and sequence: the retry is idempotent), within
    /// [`WAIT`]. Every attempt is recorded in [`Cluster::history`].
    pub fn produce_acked(&self, req: &ProduceRequest) -> ProduceResponse {
        let deadline = Instant::now() + WAIT;
        loop {
            let master = self.wait_for_master();
            let b = self.broker_node(master).handle();
            if let Ok(mut c) = Client::connect(&b.addr) {
                let incarnation = b.incarnation();
                let epoch = c.metadata().ok().map(|m| m.epoch);
                let answer = c.request(req.clone()).map(produce_answer);
                self.history
                    .record(Attempt::of(req, &b, incarnation, epoch, &answer));
                match answer {
                    Ok(Ok(r)) => return r,
                    Ok(Err(e))
                        if e.code == ErrorCode::NotMaster
                            || e.code == ErrorCode::NoQuorum
                            || e.code == ErrorCode::Timeout => {}
                    Ok(Err(e)) => panic!("produce failed: {e:?}"),
                    Err(_) => {}
                }
            }
            assert!(Instant::now() < deadline, "no master acked within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until each producer in `producers` (ids, as given to
    /// [`LoadDriver::start`](crate::LoadDriver::start)) has had `batches` more batches
    /// answered ok by broker `by` (by any broker if `None`) than when called: the load made
    /// progress. Reads [`Cluster::history`].
    ///
    /// # Panics
    /// If that did not happen within [`WAIT`]; the message names the producers and counts.
    pub fn wait_load_acked(&self, producers: std::ops::Range<u64>, by: Option<u16>, batches: u64) {
        let start: Vec<(u64, u64)> = producers
            .map(|p| (p, self.history.ok_batches(p, by)))
            .collect();
        let what = format!(
            "{batches} more acknowledged batches from each producer of {start:?} (producer, batches) by {}",
            by.map_or_else(|| "any broker".to_owned(), |b| format!("broker {b}"))
        );
        crate::wait_until(WAIT, &what, || {
            start
                .iter()
                .all(|&(p, n)| self.history.ok_batches(p, by) >= n + batches)
        });
    }

    /// Every broker as producer threads see it.
    pub fn broker_handles(&self) -> Vec<BrokerHandle> {
        self.brokers.iter().map(BrokerNode::handle).collect()
    }

    /// Store `index`'s state (`TailRequest`): its last entry, promised epoch, the HWM it
    /// heard, identity.
    ///
    /// # Errors
    /// A connection or read error (within [`WAIT`]), or an unexpected answer.
    pub fn store_tail(&self, index: usize) -> std::io::Result<TailResponse> {
        let mut c = Client::connect(&self.stores[index].addr)?;
        match c.request(TailRequest)? {
            Body::TailResponse(t) => Ok(t),
            other => Err(std::io::Error::other(format!("tail answered {other:?}"))),
        }
    }

    /// The master's Metadata (waits for a master, bounded by [`WAIT`]).
    pub fn master_metadata(&self) -> MetadataResponse {
        let deadline = Instant::now() + WAIT;
        loop {
            let master = self.wait_for_master();
            let addr = &self.broker_node(master).addr;
            if let Ok(m) = Client::connect(addr).and_then(|mut c| c.metadata()) {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "no master answered within {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (bounded by [`WAIT`]) until store `index` holds the log through `offset`.
    pub fn wait_store_holds(&self, index: usize, offset: Offset) {
        let deadline = Instant::now() + WAIT;
        loop {
            let last = self.store_tail(index).ok().and_then(|t| t.last);
            if last.is_some_and(|l| l.offset >= offset) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "store {index} did not catch up to {offset:?} within {WAIT:?} (last {last:?})"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Reads store `index`'s whole log over the wire (`ReadRequest`s from offset 0 to its
    /// last entry), bounded by [`WAIT`].
    ///
    /// # Errors
    /// A connection or read error, an unexpected answer, or a trimmed log (the check needs
    /// every offset from 0).
    pub fn read_store_log(&self, index: usize) -> std::io::Result<Vec<Event>> {
        let deadline = Instant::now() + WAIT;
        let mut c = Client::connect(&self.stores[index].addr)?;
        let mut events: Vec<Event> = Vec::new();
        loop {
            let from = Offset(events.len() as u64);
            let answer = c.request(ReadRequest {
                from,
                max_events: READ_EVENTS_MAX,
                max_bytes: READ_BYTES_MAX,
            })?;
            let Body::ReadResponse(r) = answer else {
                return Err(std::io::Error::other(format!("read answered {answer:?}")));
            };
            if r.first_offset != Offset::ZERO {
                return Err(std::io::Error::other(format!(
                    "store {index} trimmed its log below {:?}",
                    r.first_offset
                )));
            }
            if r.events.is_empty() {
                return Ok(events);
            }
            for (i, e) in r.events.into_iter().enumerate() {
                if e.offset != Offset(from.0 + i as u64) {
                    return Err(std::io::Error::other(format!(
                        "store {index} answered offset {:?} for {}",
                        e.offset,
                        from.0 + i as u64
                    )));
                }
                events.push(e);
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!(
                    "reading store {index}'s log took longer than {WAIT:?}"
                )));
            }
        }
    }

    /// Judges the run with the simulation's checker (see [`crate::history`]): produces a
    /// marker (everything at and below its offset is then stabilized), reads every running
    /// store's log and checks [`Cluster::history`] and `consumers` against them. Call it
    /// after the workload stopped.
    pub fn check(&self, consumers: &ConsumerReads) -> CheckReport {
        let marker = self.produce_marker();
        let stores = (0..self.stores.len())
            .filter(|&i| self.stores[i].proc.is_some())
            .map(|i| {
                let log = self
                    .read_store_log(i)
                    .unwrap_or_else(|e| panic!("reading store {i}'s log: {e}"));
                (u8::try_from(i).expect("few stores"), log)
            })
            .collect();
        let log = FinalLog {
            stabilized_through: marker,
            stores,
            fence_quorum: self.stores.len() / 2 + 1,
        };
        check(&self.history, &log, consumers)
    }
}

/// The producer id of the harness's own messages ([`Cluster::settle`], the marker of
/// [`Cluster::check`]); test producers use small ids.
pub const SETTLE_PRODUCER_ID: u64 = 1 << 62;
/// Events per `ReadRequest` of [`Cluster::read_store_log`].
const READ_EVENTS_MAX: u32 = 4096;
/// Payload bytes per `ReadRequest` of [`Cluster::read_store_log`].
const READ_BYTES_MAX: u32 = 1 << 20;
