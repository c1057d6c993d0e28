//! The producer and consumer against the real binaries: 3 `quire-node` stores and 2
//! `quire-broker` brokers on loopback. Four producers write to three topics while three
//! consumers read them; the master is killed with SIGKILL mid-stream. Every message must
//! be acknowledged, and every acknowledged message read back exactly once, in each
//! producer's order, at the offset its acknowledgement named.
//!
//! Binaries: found next to the test executable's directory (`target/<profile>/`), where
//! `cargo nextest run --workspace` (or `cargo test --workspace`) puts them; run
//! `cargo build -p quire-node -p quire-broker` (same profile and target directory) if one
//! is missing. Children are killed and the temporary directory removed on drop, also when
//! the test panics; every wait is bounded.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_client::{
    Consumer, ConsumerConfig, Discovery, DiscoveryConfig, Producer, ProducerConfig, StartFrom,
};
use quire_proto::Offset;
use tokio::sync::watch;

/// Longest single wait of the harness (a process printing its address, a master elected).
const WAIT: Duration = Duration::from_secs(30);
/// Bound of the whole scenario.
const TEST_BOUND: Duration = Duration::from_secs(240);

const PRODUCERS: usize = 4;
const TOPICS: [&str; 3] = ["orders", "payments", "audit"];
const MESSAGES_PER_PRODUCER: usize = 1_500;

fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    // target/<profile>/deps/<test> -> target/<profile>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable lives in target/<profile>/deps");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p {name}` with the same profile and target directory \
         (`cargo nextest run --workspace` builds it)",
        bin.display()
    );
    bin
}

/// A child process, SIGKILLed and reaped on drop; its stderr goes to a log file.
struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` and waits (bounded) for `listening on ADDR` on its stdout.
    fn start(name: &str, mut cmd: Command, log: PathBuf) -> (Proc, String) {
        let err = std::fs::File::create(&log).expect("log file");
        cmd.stdout(Stdio::piped()).stderr(err).stdin(Stdio::null());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let p = Proc {
            name: name.to_owned(),
            child: Some(child),
            log,
        };
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(a) = line.strip_prefix("listening on ") {
                        return (p, a.trim().to_owned());
                    }
                }
                Err(_) => panic!(
                    "{name} printed no address within {WAIT:?}; log:\n{}",
                    p.log_tail(30)
                ),
            }
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log_tail(&self, n: usize) -> String {
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
                "---- {} ({}) ----\n{}",
                self.name,
                self.log.display(),
                self.log_tail(25)
            );
        }
        self.kill9();
    }
}

/// 3 stores and 2 brokers in a temporary directory. Field order: processes are dropped
/// (killed) before the directory is removed.
struct Cluster {
    stores: Vec<Proc>,
    brokers: Vec<(u16, String, Option<Proc>)>,
    _root: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let root = tempfile::Builder::new()
            .prefix("quire-client-test-")
            .tempdir()
            .expect("temp dir");
        let node = binary("quire-node");
        let broker = binary("quire-broker");
        // Small segments: each one is zero-filled before it takes appends.
        let store_config = root.path().join("store.toml");
        std::fs::write(&store_config, "[wal]\nsegment_bytes_max = 16777216\n").unwrap();
        let mut stores = Vec::new();
        let mut store_addrs = Vec::new();
        for i in 0..3 {
            let dir = root.path().join(format!("store{i}"));
            let out = Command::new(&node)
                .args(["init", "--data-dir"])
                .arg(&dir)
                .output()
                .expect("quire-node init");
            assert!(
                out.status.success(),
                "quire-node init: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let mut cmd = Command::new(&node);
            cmd.args(["run", "--data-dir"])
                .arg(&dir)
                .args(["--listen", "127.0.0.1:0", "--config"])
                .arg(&store_config)
                .env("RUST_LOG", "info");
            let (p, addr) = Proc::start(
                &format!("store{i}"),
                cmd,
                root.path().join(format!("store{i}.log")),
            );
            stores.push(p);
            store_addrs.push(addr);
        }
        // Brokers must know each other's addresses before they start: free ports, bound
        // and released (another process could take one meanwhile; accepted here).
        let broker_addrs: Vec<(u16, String)> = (1..=2)
            .map(|id| {
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .expect("a free port")
                    .port();
                (id, format!("127.0.0.1:{port}"))
            })
            .collect();
        let broker_list = broker_addrs
            .iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut brokers = Vec::new();
        for (id, addr) in broker_addrs {
            let mut cmd = Command::new(&broker);
            cmd.arg("run")
                .args(["--id", &id.to_string(), "--data-dir"])
                .arg(root.path().join(format!("broker{id}")))
                .args(["--listen", &addr])
                .args(["--stores", &store_addrs.join(",")])
                .args(["--brokers", &broker_list])
                .args(["--heartbeat-ms", "50", "--election-timeout-ms", "600"])
                .args(["--produce-timeout-ms", "5000"])
                .env("RUST_LOG", "info");
            let (p, bound) = Proc::start(
                &format!("broker{id}"),
                cmd,
                root.path().join(format!("broker{id}.log")),
            );
            assert_eq!(bound, addr);
            brokers.push((id, addr, Some(p)));
        }
        Cluster {
            stores,
            brokers,
            _root: root,
        }
    }

    fn broker_addrs(&self) -> Vec<String> {
        self.brokers.iter().map(|(_, a, _)| a.clone()).collect()
    }

    fn kill_broker(&mut self, id: u16) {
        for (b, _, p) in &mut self.brokers {
            if *b == id {
                if let Some(mut p) = p.take() {
                    p.kill9();
                }
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, _, p) in &mut self.brokers {
            if let Some(p) = p.as_mut() {
                p.kill9();
            }
        }
        for s in &mut self.stores {
            s.kill9();
        }
    }
}

fn discovery_config() -> DiscoveryConfig {
    DiscoveryConfig {
        probe_timeout_ms: 1_000,
        backoff_initial_ms: 20,
        backoff_max_ms: 500,
        discovery_timeout_ms: WAIT.as_millis() as u64,
        ..DiscoveryConfig::default()
    }
}

fn payload(producer: usize, i: usize) -> Bytes {
    Bytes::from(format!("p{producer}-{i:06}"))
}

fn parse(payload: &[u8]) -> (usize, usize) {
    let s = std::str::from_utf8(payload).expect("utf-8 payload");
    let (p, i) = s
        .strip_prefix('p')
        .and_then(|s| s.split_once('-'))
        .expect("p<producer>-<index>");
    (p.parse().expect("producer"), i.parse().expect("index"))
}

/// One producer's run: every message to `TOPICS[(producer + i) % 3]`; returns
/// `(topic, payload, offset)` for each, in send order. Panics if one is not acknowledged.
async fn produce(
    brokers: Vec<String>,
    producer: usize,
    acked: Arc<AtomicUsize>,
) -> Vec<(usize, Bytes, Offset)> {
    let config = ProducerConfig {
        linger_ms: 2,
        in_flight_batches_max: 8,
        delivery_timeout_ms: 60_000,
        discovery: discovery_config(),
        ..ProducerConfig::default()
    };
    let p = Producer::connect(brokers, config)
        .await
        .expect("producer connects");
    let mut out = Vec::with_capacity(MESSAGES_PER_PRODUCER);
    let mut window = std::collections::VecDeque::new();
    for i in 0..MESSAGES_PER_PRODUCER {
        let topic = (producer + i) % TOPICS.len();
        let m = payload(producer, i);
        let d = p.send(TOPICS[topic], m.clone()).await.expect("queued");
        window.push_back((topic, m, d));
        // Keep a few hundred messages outstanding, so the failover meets batches in flight.
        while window.len() > 256 {
            let (t, m, d) = window.pop_front().expect("non-empty");
            let offset = d
                .await
                .unwrap_or_else(|e| panic!("{m:?} not acknowledged: {e}"));
            acked.fetch_add(1, Ordering::Relaxed);
            out.push((t, m, offset));
        }
        if i % 64 == 0 {
            // Spread the producers' sends over time.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    for (t, m, d) in window {
        let offset = d
            .await
            .unwrap_or_else(|e| panic!("{m:?} not acknowledged: {e}"));
        acked.fetch_add(1, Ordering::Relaxed);
        out.push((t, m, offset));
    }
    p.close().await.expect("flushed");
    out
}

fn consumer_config() -> ConsumerConfig {
    ConsumerConfig {
        fetch_max_messages: 200,
        fetch_wait_ms: 300,
        retry_timeout_ms: 60_000,
        discovery: discovery_config(),
        ..ConsumerConfig::default()
    }
}

fn cursor_name(topic: usize) -> StartFrom {
    StartFrom::Cursor(format!("{}-reader", TOPICS[topic]))
}

/// Reads `TOPICS[topic]` from its (never committed) cursor, i.e. from the beginning, until
/// `expected` names the topic's message count and that many have arrived; then one more
/// fetch (which must find nothing), and commits the cursor.
async fn consume(
    brokers: Vec<String>,
    topic: usize,
    mut expected: watch::Receiver<Option<[usize; TOPICS.len()]>>,
) -> Vec<(Offset, Bytes)> {
    let mut c = Consumer::subscribe(
        brokers,
        TOPICS[topic],
        cursor_name(topic),
        consumer_config(),
    )
    .await
    .expect("subscribed");
    assert_eq!(c.position(), Offset::ZERO);
    let mut got = Vec::new();
    loop {
        let done = expected
            .borrow_and_update()
            .is_some_and(|n| got.len() >= n[topic]);
        for m in c.poll().await.expect("fetch") {
            got.push((m.offset, m.payload));
        }
        if done {
            break;
        }
    }
    c.commit().await.expect("cursor committed");
    got
}

#[test]
fn proc_producers_and_consumers_survive_a_master_kill() {
    let mut cluster = Cluster::start();
    let brokers = cluster.broker_addrs();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let acked = Arc::new(AtomicUsize::new(0));
    let (expected_tx, expected_rx) = watch::channel(None);
    let total = PRODUCERS * MESSAGES_PER_PRODUCER;

    rt.block_on(async {
        tokio::time::timeout(TEST_BOUND, async {
            let producers: Vec<_> = (0..PRODUCERS)
                .map(|p| tokio::spawn(produce(brokers.clone(), p, acked.clone())))
                .collect();
            let consumers: Vec<_> = (0..TOPICS.len())
                .map(|t| tokio::spawn(consume(brokers.clone(), t, expected_rx.clone())))
                .collect();

            // Kill -9 the master once a third of the messages are acknowledged.
            let deadline = Instant::now() + WAIT * 2;
            while acked.load(Ordering::Relaxed) < total / 3 {
                assert!(
                    Instant::now() < deadline,
                    "producers stalled before the kill"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let discovery = Discovery::new(brokers.clone(), discovery_config()).unwrap();
            let master = discovery.find_master(None).await.expect("a master").master;
            let before = acked.load(Ordering::Relaxed);
            cluster.kill_broker(master.id.0);
            eprintln!(
                "killed master {} at {before} of {total} acknowledged messages",
                master.id.0
            );

            let mut sent: Vec<(usize, Bytes, Offset)> = Vec::new();
            for p in producers {
                sent.extend(p.await.expect("producer task"));
            }
            assert_eq!(sent.len(), total, "every message acknowledged");
            assert!(before < total, "the kill happened mid-stream");
            let new_master = discovery
                .find_master(None)
                .await
                .expect("a new master")
                .master;
            assert_ne!(new_master.id, master.id, "the other broker took over");

            let mut per_topic = [0usize; TOPICS.len()];
            for (t, _, _) in &sent {
                per_topic[*t] += 1;
            }
            expected_tx.send(Some(per_topic)).expect("consumers listen");
            let mut read = Vec::new();
            for c in consumers {
                read.push(c.await.expect("consumer task"));
            }

            // Acknowledged offsets are distinct.
            let mut acked_at: BTreeMap<Offset, (usize, Bytes)> = BTreeMap::new();
            for (t, m, o) in &sent {
                let earlier = acked_at.insert(*o, (*t, m.clone()));
                assert!(
                    earlier.is_none(),
                    "offset {o} acknowledged for two messages"
                );
            }
            for (t, got) in read.iter().enumerate() {
                let name = TOPICS[t];
                // Exactly the acknowledged messages of the topic, each at its acknowledged
                // offset, nothing twice.
                let want: Vec<(Offset, Bytes)> = acked_at
                    .iter()
                    .filter(|(_, (topic, _))| *topic == t)
                    .map(|(o, (_, m))| (*o, m.clone()))
                    .collect();
                assert_eq!(got.len(), want.len(), "{name}: message count read");
                assert!(
                    got.windows(2).all(|w| w[0].0 < w[1].0),
                    "{name}: offsets increase"
                );
                if *got != want {
                    let first = got.iter().zip(&want).position(|(a, b)| a != b);
                    panic!("{name}: read differs from acknowledged at index {first:?}");
                }
                // Each producer's messages in its send order.
                let mut last: HashMap<usize, usize> = HashMap::new();
                for (_, m) in got {
                    let (p, i) = parse(m);
                    if let Some(prev) = last.insert(p, i) {
                        assert!(prev < i, "{name}: producer {p} message {i} after {prev}");
                    }
                }
            }
            // The cursors the consumers committed lead past everything they read.
            for (t, got) in read.iter().enumerate() {
                let mut again = Consumer::subscribe(
                    brokers.clone(),
                    TOPICS[t],
                    cursor_name(t),
                    consumer_config(),
                )
                .await
                .expect("subscribed again");
                let last = got.last().map(|(o, _)| *o).expect("the topic has messages");
                assert!(
                    again.position() > last,
                    "{}: cursor at {}",
                    TOPICS[t],
                    again.position()
                );
                assert!(
                    again.poll().await.expect("fetch").is_empty(),
                    "{}: nothing after the cursor",
                    TOPICS[t]
                );
            }
        })
        .await
        .expect("the scenario finishes in bounded time");
    });
    drop(rt);
    drop(cluster);
}
