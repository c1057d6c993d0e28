//! The cluster-facing `quire` commands against a real cluster started from the `quire`
//! binary itself: three stores (`quire node init` + `quire node run --listen 127.0.0.1:0`)
//! and two brokers (`quire broker run`), all on loopback, in one temporary directory.
//!
//! Then, through the `quire` binary: `produce --count` (jsonl acks), `consume --from
//! beginning` (the same offsets and payloads in order), stdin mode round-tripping text lines,
//! a durable cursor continuing where the previous run stopped, an idle timeout before `-n`
//! failing, a start far beyond the high-water mark noted on stderr, `cluster status` naming
//! the master and three voting stores, `bench cluster` reporting non-zero figures and a
//! readable histogram file, a graceful handoff and one to a killed broker failing with its
//! name, and — with two stores killed — `produce` failing with every message reported as
//! outcome unknown.
//!
//! Every child is killed and the directory removed on drop, also when an assertion fails;
//! every wait is bounded.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is a clear failure

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Longest any single step (a process starting, a command finishing) may take.
const STEP_WAIT: Duration = Duration::from_secs(40);

fn quire() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quire"));
    cmd.env("RUST_LOG", "info");
    // The servers it starts read only the settings this test gives them.
    quire_tests::hermetic(&mut cmd);
    cmd
}

/// A loopback port for a broker, whose address must be known before it starts (it is its
/// name in every broker's `--brokers` list). Chosen below the ephemeral range (32768+ on
/// Linux) so no outgoing connection takes it between this check and the broker's bind.
fn free_port() -> u16 {
    let seed = u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    for n in 0..1000u64 {
        let mut x = seed.wrapping_add(n.wrapping_mul(0xbf58_476d_1ce4_e5b9));
        x ^= x >> 31;
        let port = 20_000 + (x % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000..32000");
}

/// A server process, SIGKILLed on drop.
struct Server {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Server {
    /// Starts `cmd` with stderr to `log` and waits for `listening on ADDR` on stdout.
    fn start(name: &str, mut cmd: Command, log: PathBuf) -> (Server, String) {
        let err = std::fs::File::create(&log).unwrap();
        cmd.stdout(Stdio::piped()).stderr(err).stdin(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let server = Server {
            name: name.to_owned(),
            child,
            log,
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + STEP_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(addr) = line.strip_prefix("listening on ") {
                        return (server, addr.trim().to_owned());
                    }
                }
                Err(_) => panic!(
                    "{name} printed no address within {STEP_WAIT:?}; log:\n{}",
                    server.log_text()
                ),
            }
        }
    }

    fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let text = self.log_text();
            let tail: Vec<&str> = text.lines().rev().take(25).collect();
            eprintln!("---- {} (last lines) ----", self.name);
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three stores and two brokers; servers are killed before the directory is removed.
struct Cluster {
    servers: Vec<Server>,
    brokers: String,
    // Declared last: dropped after the servers.
    root: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let root = tempfile::Builder::new()
            .prefix("quire-cli-test-")
            .tempdir()
            .unwrap();
        let config = root.path().join("store.toml");
        std::fs::write(&config, "[wal]\nsegment_bytes_max = 16777216\n").unwrap();
        let mut servers = Vec::new();
        let mut stores = Vec::new();
        for i in 0..3 {
            let dir = root.path().join(format!("store{i}"));
            let out = run(quire().args(["node", "init", "--data-dir"]).arg(&dir), None);
            assert!(out.status.success(), "node init: {}", stderr(&out));
            assert!(
                stdout(&out).contains("initialised store"),
                "{}",
                stdout(&out)
            );
            let mut cmd = quire();
            cmd.args(["node", "run", "--data-dir"])
                .arg(&dir)
                .args(["--listen", "127.0.0.1:0", "--config"])
                .arg(&config);
            let (s, addr) = Server::start(
                &format!("store{i}"),
                cmd,
                root.path().join(format!("store{i}.log")),
            );
            assert!(
                addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
                "{addr}"
            );
            servers.push(s);
            stores.push(addr);
        }
        let broker_addrs: Vec<String> = (0..2)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let list: Vec<String> = broker_addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        for (i, addr) in broker_addrs.iter().enumerate() {
            let id = (i + 1).to_string();
            let mut cmd = quire();
            cmd.args(["broker", "run", "--id", &id, "--data-dir"])
                .arg(root.path().join(format!("broker{id}")))
                .args(["--stores", &stores.join(",")])
                .args(["--brokers", &list.join(",")])
                .args(["--heartbeat", "50ms", "--election-timeout", "600ms"])
                .args(["--produce-timeout", "2s"]);
            let (b, got) = Server::start(
                &format!("broker{id}"),
                cmd,
                root.path().join(format!("broker{id}.log")),
            );
            assert_eq!(&got, addr);
            servers.push(b);
        }
        Cluster {
            servers,
            brokers: broker_addrs.join(","),
            root,
        }
    }

    /// `quire <args> --brokers <this cluster>` with `input` on stdin, bounded.
    fn quire(&self, args: &[&str], input: Option<&[u8]>) -> Output {
        assert!(!self.servers.is_empty());
        run(quire().args(args).args(["--brokers", &self.brokers]), input)
    }
}

/// Runs `cmd` to completion with `input` on stdin, killing it past [`STEP_WAIT`].
fn run(cmd: &mut Command, input: Option<&[u8]>) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().unwrap();
    if let Some(input) = input {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input).unwrap();
        // Dropping stdin closes it: end of input.
    }
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + STEP_WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned();
            panic!("{cmd:?} did not finish within {STEP_WAIT:?}; stderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json_lines(o: &Output) -> Vec<Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

fn offsets(lines: &[Value]) -> Vec<u64> {
    lines
        .iter()
        .map(|l| l["offset"].as_u64().expect("an offset"))
        .collect()
}

#[test]
fn cluster_commands_against_a_cluster_started_by_the_quire_binary() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::start();

    // Generated messages: one jsonl line per ack, distinct offsets, in send order.
    let produced = cluster.quire(
        &[
            "produce", "--topic", "numbers", "--count", "2000", "--size", "100", "--format",
            "jsonl",
        ],
        None,
    );
    assert!(produced.status.success(), "produce: {}", stderr(&produced));
    let acks = json_lines(&produced);
    assert_eq!(acks.len(), 2000, "{}", stderr(&produced));
    assert!(acks.iter().all(|a| a["topic"] == "numbers"));
    let acked = offsets(&acks);
    assert!(
        acked.windows(2).all(|w| w[0] < w[1]),
        "acks in send order, offsets distinct and increasing"
    );
    assert!(
        stderr(&produced).contains("2000 of 2000"),
        "{}",
        stderr(&produced)
    );

    // Read back from the beginning: exactly those offsets, in order, with their payloads.
    let consumed = cluster.quire(
        &[
            "consume",
            "--topic",
            "numbers",
            "--from",
            "beginning",
            "-n",
            "2000",
            "--format",
            "jsonl",
            "--timeout",
            "20s",
        ],
        None,
    );
    assert!(consumed.status.success(), "consume: {}", stderr(&consumed));
    let messages = json_lines(&consumed);
    assert_eq!(offsets(&messages), acked);
    for (i, m) in messages.iter().enumerate() {
        assert_eq!(m["payload"], format!("{i:0100}"), "message {i}");
        assert!(m.get("payload_hex").is_none());
    }

    // A reader that goes away (`quire consume | head -1`): the consumer ends quietly, with
    // status 0, at its next write (new messages are produced to cause one).
    {
        let mut child = quire()
            .args(["consume", "--topic", "numbers", "--from", "beginning"])
            .args(["--brokers", &cluster.brokers])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert_eq!(first.trim_end(), format!("{:0100}", 0));
        // The BufReader (and the pipe's read end with it) is dropped here.
        let deadline = Instant::now() + STEP_WAIT;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            let more = cluster.quire(
                &[
                    "produce", "--topic", "numbers", "--count", "100", "--size", "100",
                ],
                None,
            );
            assert!(more.status.success(), "produce: {}", stderr(&more));
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("consume did not end after its reader went away");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "status {status:?}; stderr:\n{err}");
        assert!(!err.contains("error"), "{err}");
    }

    // stdin mode: lines round-trip as text, an empty line included.
    let lines = ["hello", "wörld", "", "a line with spaces", "last"];
    let input = format!("{}\n", lines.join("\n"));
    let produced = cluster.quire(
        &["produce", "--topic", "lines", "--format", "jsonl"],
        Some(input.as_bytes()),
    );
    assert!(
        produced.status.success(),
        "produce stdin: {}",
        stderr(&produced)
    );
    assert_eq!(json_lines(&produced).len(), lines.len());
    let text = cluster.quire(
        &[
            "consume",
            "--topic",
            "lines",
            "--from",
            "beginning",
            "-n",
            "5",
            "--timeout",
            "20s",
        ],
        None,
    );
    assert!(text.status.success(), "consume text: {}", stderr(&text));
    assert_eq!(stdout(&text), input);

    // A durable cursor: the second run starts where the first one stopped.
    let first = cluster.quire(
        &[
            "consume",
            "--topic",
            "lines",
            "--cursor",
            "reader",
            "-n",
            "2",
            "--format",
            "jsonl",
            "--timeout",
            "20s",
        ],
        None,
    );
    assert!(first.status.success(), "cursor run 1: {}", stderr(&first));
    let first = json_lines(&first);
    assert_eq!(first.len(), 2);
    assert_eq!(first[0]["payload"], "hello");
    let second = cluster.quire(
        &[
            "consume",
            "--topic",
            "lines",
            "--cursor",
            "reader",
            "-n",
            "3",
            "--format",
            "jsonl",
            "--timeout",
            "20s",
        ],
        None,
    );
    assert!(second.status.success(), "cursor run 2: {}", stderr(&second));
    let payloads: Vec<Value> = json_lines(&second)
        .into_iter()
        .map(|m| m["payload"].clone())
        .collect();
    assert_eq!(payloads, vec!["", "a line with spaces", "last"]);

    // Fewer messages than -n before the idle timeout: a failure that says so.
    let short = cluster.quire(
        &[
            "consume",
            "--topic",
            "lines",
            "--from",
            "beginning",
            "-n",
            "6",
            "--timeout",
            "1s",
            "--format",
            "jsonl",
        ],
        None,
    );
    assert!(!short.status.success());
    assert!(
        stderr(&short).contains("only 5 of 6 messages"),
        "{}",
        stderr(&short)
    );
    assert_eq!(json_lines(&short).len(), 5);

    // A start far beyond the log's end: a note on stderr says what the run waits for,
    // instead of a silent wait; the idle timeout then ends it normally.
    let ahead = cluster.quire(
        &[
            "consume",
            "--topic",
            "lines",
            "--from",
            "1000000",
            "--timeout",
            "1s",
        ],
        None,
    );
    assert!(ahead.status.success(), "{}", stderr(&ahead));
    assert!(stdout(&ahead).is_empty(), "{}", stdout(&ahead));
    assert!(
        stderr(&ahead).contains("waiting for offset 1000000; the high-water mark is "),
        "{}",
        stderr(&ahead)
    );

    // Status: a master among the brokers, three voting stores, the HWM past what was acked.
    let status = cluster.quire(&["cluster", "status", "--format", "json"], None);
    assert!(status.status.success(), "status: {}", stderr(&status));
    let status: Value = serde_json::from_str(stdout(&status).trim()).unwrap();
    let master = &status["master"];
    assert!(master["id"].as_u64().is_some(), "{status}");
    let master_addr = master["addr"].as_str().unwrap();
    assert!(
        cluster.brokers.split(',').any(|b| b == master_addr),
        "{status}"
    );
    let stores = status["stores"].as_array().unwrap();
    assert_eq!(stores.len(), 3, "{status}");
    assert!(stores.iter().all(|s| s["role"] == "voter"), "{status}");
    assert!(stores.iter().all(|s| s["connected"] == true), "{status}");
    assert!(status["hwm"].as_u64().unwrap() >= *acked.last().unwrap());
    let brokers = status["brokers"].as_array().unwrap();
    assert_eq!(brokers.len(), 2, "{status}");
    // Every broker reports what it applied: the master, and the slave (which may trail).
    assert!(
        brokers.iter().all(|b| b["applied"].as_u64().is_some()),
        "{status}"
    );
    assert_eq!(
        brokers.iter().filter(|b| b["role"] == "master").count(),
        1,
        "{status}"
    );

    // Bench: a short closed-loop run with non-zero figures and a histogram file.
    let hdr = cluster.root.path().join("latency.hlog");
    let bench = cluster.quire(
        &[
            "bench",
            "cluster",
            "--producers",
            "2",
            "--event-size",
            "1KiB",
            "--batch",
            "64",
            "--duration",
            "2s",
            "--format",
            "json",
            "--hdr-out",
            hdr.to_str().unwrap(),
        ],
        None,
    );
    assert!(bench.status.success(), "bench: {}", stderr(&bench));
    let report: Value = serde_json::from_str(stdout(&bench).trim()).unwrap();
    for field in [
        "mb_per_s",
        "ops_per_s",
        "p50_us",
        "p99_us",
        "p999_us",
        "max_us",
        "cpu_s",
    ] {
        let v = report[field].as_f64().unwrap_or(0.0);
        assert!(v > 0.0, "{field} = {v} in {report}");
    }
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["bench"], "cluster");
    let log = std::fs::read_to_string(&hdr).unwrap();
    assert!(log.starts_with('#'), "{log}");
    assert!(log.contains("Tag=produce-to-ack,"), "{log}");
    assert_no_leftovers(cluster.root.path());

    // Fixed rate: every intended message of the period is sent and acknowledged, once.
    let paced = cluster.quire(
        &[
            "bench",
            "cluster",
            "--producers",
            "2",
            "--rate",
            "2000",
            "--duration",
            "1s",
            "--format",
            "json",
        ],
        None,
    );
    assert!(paced.status.success(), "bench --rate: {}", stderr(&paced));
    let report: Value = serde_json::from_str(stdout(&paced).trim()).unwrap();
    assert_eq!(report["mode"], "fixed_rate", "{report}");
    assert_eq!(report["target_rate"], 2000, "{report}");
    assert_eq!(report["ops"], 2000, "{report}");
    assert!(report["p50_us"].as_u64().unwrap() > 0, "{report}");

    // Graceful handoff: mastership moves to the other broker, which then serves produces.
    let status = cluster.quire(&["cluster", "status", "--format", "json"], None);
    assert!(status.status.success(), "status: {}", stderr(&status));
    let status: Value = serde_json::from_str(stdout(&status).trim()).unwrap();
    let before = status["master"]["id"].as_u64().unwrap();
    let target = if before == 1 { 2 } else { 1 };
    let handoff = cluster.quire(
        &[
            "cluster",
            "handoff",
            "--to",
            &target.to_string(),
            "--format",
            "json",
        ],
        None,
    );
    assert!(handoff.status.success(), "handoff: {}", stderr(&handoff));
    let report: Value = serde_json::from_str(stdout(&handoff).trim()).unwrap();
    assert_eq!(report["from"]["id"], before, "{report}");
    assert_eq!(report["master"], target, "{report}");
    assert!(report["epoch"].as_u64().unwrap() > status["epoch"].as_u64().unwrap());
    let status = cluster.quire(&["cluster", "status", "--format", "json"], None);
    let status: Value = serde_json::from_str(stdout(&status).trim()).unwrap();
    assert_eq!(status["master"]["id"], target, "{status}");
    let after = cluster.quire(
        &[
            "produce",
            "--topic",
            "after-handoff",
            "--count",
            "10",
            "--format",
            "jsonl",
        ],
        None,
    );
    assert!(
        after.status.success(),
        "produce after handoff: {}",
        stderr(&after)
    );
    assert_eq!(json_lines(&after).len(), 10);
    // A handoff to the master itself is refused with a clear error.
    let refused = cluster.quire(&["cluster", "handoff", "--to", &target.to_string()], None);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("already the master"),
        "{}",
        stderr(&refused)
    );

    // A handoff to a broker that is dead fails naming it (not a bare "Timeout"), and the
    // master serves on.
    let dead_index = cluster
        .servers
        .iter()
        .position(|s| s.name == format!("broker{before}"))
        .unwrap();
    let dead = cluster.servers.remove(dead_index);
    let dead_addr = cluster
        .brokers
        .split(',')
        .nth(before as usize - 1)
        .unwrap()
        .to_owned();
    drop(dead);
    let to_dead = cluster.quire(&["cluster", "handoff", "--to", &before.to_string()], None);
    assert!(!to_dead.status.success());
    let text = stderr(&to_dead);
    assert!(
        text.contains(&format!("handoff to broker {before} failed")),
        "{text}"
    );
    assert!(
        text.contains(&format!("broker {before} ({dead_addr})")),
        "{text}"
    );
    assert!(
        text.contains("not connected to the master") || text.contains("did not answer"),
        "{text}"
    );
    assert!(text.contains("[Timeout, code 206]"), "{text}");
    let status = cluster.quire(&["cluster", "status", "--format", "json"], None);
    let status: Value = serde_json::from_str(stdout(&status).trim()).unwrap();
    assert_eq!(
        status["master"]["id"], target,
        "the master serves on: {status}"
    );

    // Two of three stores gone: nothing is stabilized, no ack line is printed, and the
    // command fails saying every message's outcome is unknown (the broker may have written
    // them to the one store left).
    let gone: Vec<Server> = cluster.servers.drain(..2).collect();
    assert!(gone.iter().all(|s| s.name.starts_with("store")));
    drop(gone);
    let failed = cluster.quire(
        &[
            "produce",
            "--topic",
            "lost",
            "--count",
            "3",
            "--size",
            "10",
            "--delivery-timeout",
            "3s",
            "--format",
            "jsonl",
        ],
        None,
    );
    assert!(!failed.status.success(), "{}", stderr(&failed));
    assert!(stdout(&failed).is_empty(), "{}", stdout(&failed));
    assert!(
        stderr(&failed).contains("3 of 3 messages failed (3 outcome unknown"),
        "{}",
        stderr(&failed)
    );
    assert!(
        stderr(&failed).contains("failed: message 0 (outcome unknown"),
        "{}",
        stderr(&failed)
    );
}

/// The commands leave nothing behind in the cluster's directory but what the servers and
/// this test wrote.
fn assert_no_leftovers(root: &Path) {
    for entry in std::fs::read_dir(root).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let known =
            name.starts_with("store") || name.starts_with("broker") || name == "latency.hlog";
        assert!(known, "unexpected file {name} in the cluster directory");
    }
}
