//! A cluster of real stores and brokers on loopback in one temporary directory: start,
//! kill -9, restart each process (a store keeps its directory and address, a broker its
//! id, directory and address), find the master.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_proto::{BrokerId, ErrorCode, ProduceRequest, ProduceResponse};

use crate::client::{produce_answer, Client};
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
            .prefix("quire-test-")
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

    /// Replaces the stores' config file (TOML, e.g. a smaller `[wal] segment_bytes_max`);
    /// call before starting the stores.
    pub fn set_store_config(&mut self, toml: &str) {
        let path = self.root.path().join("store.toml");
        std::fs::write(&path, toml).expect("store config");
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
