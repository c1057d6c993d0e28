//! confluent-kafka (Python on librdkafka 2.x, the library most non-Java Kafka clients are
//! built on) against the real binaries: 3 stores, 2 brokers, each with a Kafka listener on
//! loopback. The scenarios are in tests/kafka/clients.py; these tests drive them and check
//! what they report.
//!
//! What must hold:
//! - **Idempotent producer across a master kill.** 20,000 values produced with
//!   `enable.idempotence=true` (InitProducerId, up to 5 batches in flight). Once half are
//!   acknowledged, two of the three stores are frozen with SIGSTOP for 4 s, so the
//!   producer's requests time out and are sent again while their first copies wait in the
//!   master; then the master is killed with SIGKILL and the stores thaw. Every value is
//!   delivered, and the topic holds each value exactly once, in the order produced:
//!   retries of batches already in flight or written are joined to them or answered from
//!   the producer table, not written again, and no batch is applied over a gap.
//! - **A three-member consumer group.** Three members subscribe to three topics (one
//!   partition each): each gets one partition (round-robin assignor); every record is read
//!   once; DescribeGroups says Stable with three members holding the three partitions, and
//!   ListGroups lists the group. One member leaves: the other two take every partition and
//!   read nothing twice (they resume at the committed offsets).
//! - **Admin APIs and `quire topic`.** The admin client creates a topic (one partition),
//!   is refused three partitions (`INVALID_PARTITIONS`), a topic setting
//!   (`INVALID_CONFIG`) and a second create (`TOPIC_ALREADY_EXISTS`); validate-only,
//!   DescribeConfigs, DescribeCluster (the master as controller) and DeleteTopics work;
//!   CreatePartitions is refused. `quire topic create|list|delete` does the same from the
//!   CLI, with a typed error for an existing topic.
//! - **Offsets by time.** `offsets_for_times` (ListOffsets by timestamp) finds the first
//!   record at or after times before, at, between and after 100 records whose offsets
//!   interleave with another topic's; -1 after the last.
//! - **A live sparse topic.** A consumer at the end of a topic whose records are
//!   interleaved with another topic's reads every record with no error (librdkafka
//!   reported `MSG_SIZE_TOO_LARGE` on a third of its fetches before the skipped span was
//!   answered with a commit marker).
//! - **Committed offsets survive a master kill.** The master (the coordinator) is killed
//!   with SIGKILL; new records are produced; a member of the same group, on the new
//!   master, reads exactly the new records: the commits were stabilized in the log.
//!
//! confluent-kafka comes from PyPI (`.ci/run` installs it in a virtual environment and
//! names its interpreter in `QUIRE_KAFKA_PYTHON`; otherwise `python3`). Without it the
//! tests say so and pass, unless `QUIRE_REQUIRE_KAFKA_CLIENTS=1` makes that a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use quire_tests::process::{self, quire_command, run_bounded};
use quire_tests::{Cluster, Timing};
use serde_json::Value;

/// Longest a scenario may run.
const SCENARIO_BOUND: Duration = Duration::from_secs(150);

fn python() -> String {
    std::env::var("QUIRE_KAFKA_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn confluent_kafka_installed() -> bool {
    let found = Command::new(python())
        .args(["-c", "import confluent_kafka"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("QUIRE_REQUIRE_KAFKA_CLIENTS").is_none(),
            "confluent-kafka is required (QUIRE_REQUIRE_KAFKA_CLIENTS is set) but `{} -c 'import confluent_kafka'` fails",
            python()
        );
        eprintln!(
            "SKIPPED: python3 has no confluent-kafka (pip install confluent-kafka; .ci/run does)"
        );
    }
    found
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kafka/clients.py")
}

/// A running scenario: its stdout lines as they come, killed if dropped.
struct Scenario {
    child: Child,
    lines: mpsc::Receiver<String>,
    deadline: Instant,
    stderr: PathBuf,
}

impl Scenario {
    fn start(args: &[&str], stderr: PathBuf) -> Scenario {
        let mut child = Command::new(python())
            .arg(script())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Scenario {
            child,
            lines,
            deadline: Instant::now() + SCENARIO_BOUND,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The next line, or a panic with the scenario's stderr once the bound passes or the
    /// scenario ends.
    fn line(&mut self) -> String {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(l) => l,
            Err(e) => panic!("scenario: no line ({e:?}); stderr:\n{}", self.stderr()),
        }
    }

    /// Waits for the line `want`.
    fn expect(&mut self, want: &str) {
        loop {
            if self.line() == want {
                return;
            }
        }
    }

    /// The result: the JSON of the last line, after the scenario exited with success.
    fn result(mut self) -> Value {
        let mut last = String::new();
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => last = l,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("scenario did not finish; stderr:\n{}", self.stderr())
                }
            }
        }
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "scenario failed: {status}; stderr:\n{}",
            self.stderr()
        );
        serde_json::from_str(&last)
            .unwrap_or_else(|e| panic!("scenario result {last:?}: {e}; stderr:\n{}", self.stderr()))
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Produces `values` to `topic` with kcat, one record per line (acks=all).
fn kcat_produce(bootstrap: &str, topic: &str, values: &[String], dir: &std::path::Path) {
    let file = dir.join(format!("{topic}.{}.txt", values.len()));
    std::fs::write(&file, values.join("\n") + "\n").unwrap();
    let out = run_bounded(
        Command::new("kcat").args([
            "-b",
            bootstrap,
            "-P",
            "-t",
            topic,
            "-l",
            file.to_str().unwrap(),
            "-X",
            "message.timeout.ms=30000",
        ]),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("Delivery failed"),
        "kcat -P: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every value of `topic` from the beginning, read with kcat.
fn kcat_values(bootstrap: &str, topic: &str) -> Vec<String> {
    let out = run_bounded(
        Command::new("kcat").args([
            "-b",
            bootstrap,
            "-C",
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-q",
        ]),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "kcat -C: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn an_idempotent_producer_writes_each_record_once_in_order_across_a_master_kill() {
    let _guard = quire_tests::serial::proc_test();
    if !confluent_kafka_installed() {
        return;
    }
    let mut cluster = Cluster::new(3, 2, Timing::default());
    let kafka = cluster.enable_kafka();
    cluster.start_all();
    let master = cluster.wait_for_master();
    let both = kafka.join(",");
    const N: usize = 20_000;

    let mut producer = Scenario::start(
        &["idempotent", &both, "idem", &N.to_string()],
        cluster.root.path().join("idempotent.stderr"),
    );
    producer.expect("HALF");
    // Fault 1: two of the three stores freeze (SIGSTOP), so nothing is stabilized; the
    // producer's requests time out (request.timeout.ms = 1.5 s) and are sent again with
    // the same sequences while the first copies wait in the master.
    let frozen: Vec<u32> = cluster.stores[..2]
        .iter()
        .map(|s| s.pid().unwrap())
        .collect();
    for &pid in &frozen {
        process::stop(pid);
    }
    std::thread::sleep(Duration::from_secs(4));
    // Fault 2: SIGKILL the master with those batches in flight (written to the third
    // store only); the stores thaw and the other broker takes over.
    cluster.broker(master).kill9();
    for &pid in &frozen {
        process::signal(pid, libc::SIGCONT);
    }
    let new_master = cluster.wait_for_master();
    assert_ne!(new_master, master);
    let r = producer.result();
    assert_eq!(r["delivered"], N, "every record acknowledged: {r}");
    assert_eq!(r["failed"], 0, "{r}");

    let values = kcat_values(&both, "idem");
    let expected: Vec<String> = (0..N).map(|i| i.to_string()).collect();
    if values != expected {
        let mut seen = std::collections::HashMap::new();
        for v in &values {
            *seen.entry(v.as_str()).or_insert(0) += 1;
        }
        let twice = seen.values().filter(|&&c| c > 1).count();
        let missing = expected
            .iter()
            .filter(|v| !seen.contains_key(v.as_str()))
            .count();
        panic!(
            "{} values read, {twice} more than once, {missing} missing; not each once in order",
            values.len()
        );
    }
}

#[test]
fn a_three_member_group_balances_commits_and_resumes_on_a_new_master() {
    let _guard = quire_tests::serial::proc_test();
    if !confluent_kafka_installed() {
        return;
    }
    let mut cluster = Cluster::new(3, 2, Timing::default());
    let kafka = cluster.enable_kafka();
    cluster.start_all();
    let master = cluster.wait_for_master();
    let both = kafka.join(",");
    let dir = cluster.root.path().to_owned();
    let topics = ["ga", "gb", "gc"];
    const N: usize = 200;
    let batch = |t: &str, from: usize, n: usize| -> Vec<String> {
        (from..from + n).map(|i| format!("{t}-{i}")).collect()
    };

    // The group forms on empty topics, then the records are produced.
    let mut args = vec!["group-three", &both, "g3"];
    let n = N.to_string();
    args.push(&n);
    args.extend(topics);
    let mut group = Scenario::start(&args, dir.join("group-three.stderr"));
    group.expect("READY");
    for t in topics {
        kcat_produce(&both, t, &batch(t, 0, N), &dir);
    }
    let r = group.result();
    let assignments = r["assignments"].as_array().unwrap();
    let mut held: Vec<String> = assignments
        .iter()
        .map(|a| {
            let a = a.as_array().unwrap();
            assert_eq!(a.len(), 1, "one partition per member: {r}");
            a[0][0].as_str().unwrap().to_owned()
        })
        .collect();
    held.sort();
    assert_eq!(held, topics, "{r}");
    for t in topics {
        assert_eq!(
            strings(&r["values"][t]),
            batch(t, 0, N),
            "{t}: each record once, in order"
        );
    }
    assert_eq!(r["describe"]["members"], 3, "{r}");
    assert!(
        r["describe"]["state"].as_str().unwrap().contains("STABLE"),
        "{r}"
    );
    assert_eq!(
        r["describe"]["assigned"].as_array().unwrap().len(),
        3,
        "{r}"
    );
    assert!(strings(&r["listed"]).contains(&"g3".to_owned()), "{r}");
    // The admin client's offsets of the group, no partitions named: every topic it
    // committed in, at partition 0, past the records it read.
    let committed: Vec<(String, i64, i64)> = r["committed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c[0].as_str().unwrap().to_owned(),
                c[1].as_i64().unwrap(),
                c[2].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        committed.iter().map(|c| c.0.clone()).collect::<Vec<_>>(),
        topics,
        "{r}"
    );
    assert!(committed.iter().all(|c| c.1 == 0 && c.2 > 0), "{r}");
    let after: usize = r["after_leave"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_array().unwrap().len())
        .sum();
    assert_eq!(after, 3, "the two members left hold every partition: {r}");

    // Fault: SIGKILL the master, the group's coordinator. The commits are in the log.
    cluster.broker(master).kill9();
    let new_master = cluster.wait_for_master();
    assert_ne!(new_master, master);
    const M: usize = 50;
    for t in topics {
        kcat_produce(&both, t, &batch(t, N, M), &dir);
    }
    let m = M.to_string();
    let mut args = vec!["group-resume", &both, "g3", &m];
    args.extend(topics);
    let r = Scenario::start(&args, dir.join("group-resume.stderr")).result();
    for t in topics {
        assert_eq!(
            strings(&r["values"][t]),
            batch(t, N, M),
            "{t}: the new master's member resumes at the committed offset"
        );
    }
}

#[test]
fn admin_apis_the_topic_cli_offsets_by_time_and_a_live_sparse_topic() {
    let _guard = quire_tests::serial::proc_test();
    if !confluent_kafka_installed() {
        return;
    }
    let mut cluster = Cluster::new(3, 2, Timing::default());
    let kafka = cluster.enable_kafka();
    cluster.start_all();
    let master = cluster.wait_for_master();
    let both = kafka.join(",");
    let dir = cluster.root.path().to_owned();

    let r = Scenario::start(&["admin", &both], dir.join("admin.stderr")).result();
    assert_eq!(r["create"]["made"], "OK", "{r}");
    assert_eq!(r["create"]["wide"], "INVALID_PARTITIONS", "{r}");
    assert_eq!(r["create"]["compacted"], "INVALID_CONFIG", "{r}");
    assert_eq!(r["create_again"]["made"], "TOPIC_ALREADY_EXISTS", "{r}");
    assert_eq!(r["validate_only"]["checked"], "OK", "{r}");
    assert_eq!(
        strings(&r["listed"]),
        ["made"],
        "validate-only created nothing: {r}"
    );
    assert_eq!(r["configs"]["cleanup.policy"], "delete", "{r}");
    assert_eq!(r["cluster"]["nodes"], 2, "{r}");
    assert_eq!(r["cluster"]["controller"], master, "{r}");
    assert_eq!(r["partitions"]["made"], "INVALID_PARTITIONS", "{r}");
    assert_eq!(r["delete"]["made"], "OK", "{r}");
    assert_eq!(r["delete"]["missing"], "UNKNOWN_TOPIC_OR_PART", "{r}");
    assert!(strings(&r["listed_after"]).is_empty(), "{r}");

    // The same from the CLI.
    let brokers: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    let brokers = brokers.join(",");
    let topic = |args: &[&str]| {
        run_bounded(
            quire_command()
                .arg("topic")
                .args(args)
                .args(["--brokers", &brokers]),
            Duration::from_secs(30),
        )
    };
    let out = topic(&["create", "cli-made"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = topic(&["create", "cli-made"]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("TopicExists"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let wide = topic(&["create", "cli-wide", "--partitions", "4"]);
    assert!(String::from_utf8_lossy(&wide.stderr).contains("InvalidPartitions"));
    let listed = topic(&["list"]);
    assert_eq!(String::from_utf8_lossy(&listed.stdout), "cli-made\n");
    assert!(topic(&["delete", "cli-made"]).status.success());
    assert!(!topic(&["delete", "cli-made"]).status.success());

    // ListOffsets by timestamp, on a topic whose records interleave with another's.
    let r = Scenario::start(&["times", &both], dir.join("times.stderr")).result();
    for (name, got) in r.as_object().unwrap() {
        assert_eq!(got["found"], got["expected"], "{name}: {r}");
    }

    let r = Scenario::start(&["live-tail", &both, "4"], dir.join("live-tail.stderr")).result();
    assert_eq!(r["error_count"], 0, "{r}");
    assert!(r["read"].as_u64().unwrap() > 50, "{r}");
}
