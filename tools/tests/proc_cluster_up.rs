//! `quire cluster up --detach` on the real binary, then `produce`, `consume`, `cluster
//! status` and `cluster down` against it: afterwards none of the cluster's processes is
//! alive (checked by pid) and each store's log passes `quire wal verify`.
//!
//! Every command is bounded; if an assertion fails, the cluster's processes are killed by
//! pid (from `cluster.json`) and the directory is removed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is a clear failure

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use quire_tests::run_bounded;
use serde_json::Value;

/// Longest any one command may take.
const STEP_WAIT: Duration = Duration::from_secs(90);

fn quire(args: &[&str]) -> Output {
    run_bounded(
        Command::new(env!("CARGO_BIN_EXE_quire"))
            .args(args)
            .env("RUST_LOG", "warn"),
        STEP_WAIT,
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next()),
            Some("Z" | "X")
        ),
        Err(_) => false,
    }
}

/// Kills whatever `cluster.json` names on drop (a failed test leaves no process behind).
struct Guard {
    dir: tempfile::TempDir,
}

impl Guard {
    fn pids(&self) -> Vec<u32> {
        let Ok(s) = std::fs::read_to_string(self.dir.path().join("cluster.json")) else {
            return Vec::new();
        };
        let v: Value = serde_json::from_str(&s).unwrap_or(Value::Null);
        v["processes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p["pid"].as_u64())
                    .map(|p| p as u32)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for pid in self.pids() {
            let dir = self.dir.path().as_os_str().as_encoded_bytes().to_vec();
            // Only a process whose command line names this directory.
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.windows(dir.len()).any(|w| w == dir.as_slice()) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
    }
}

#[test]
fn a_detached_cluster_serves_then_goes_down_leaving_verifiable_logs() {
    let _t = quire_tests::proc_test();
    let guard = Guard {
        dir: tempfile::Builder::new()
            .prefix("quire-up-test-")
            .tempdir()
            .unwrap(),
    };
    let dir = guard.path().to_str().unwrap().to_owned();
    let up = quire(&[
        "cluster",
        "up",
        "--detach",
        "--dir",
        &dir,
        "--stores",
        "3",
        "--brokers",
        "2",
    ]);
    assert!(
        up.status.success(),
        "up: {}\n{}",
        text(&up.stdout),
        text(&up.stderr)
    );
    assert!(
        text(&up.stdout).contains("quire cluster down --dir"),
        "{}",
        text(&up.stdout)
    );
    // stdin is not a terminal: no question, only the command that saves a profile.
    assert!(
        text(&up.stdout).contains(
            "to save these brokers as a profile: quire profile create local --brokers 127.0.0.1:"
        ),
        "{}",
        text(&up.stdout)
    );
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(guard.path().join("cluster.json")).unwrap())
            .unwrap();
    let brokers: Vec<String> = file["brokers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(brokers.len(), 2, "{file}");
    let pids = guard.pids();
    assert_eq!(pids.len(), 5, "{file}");
    assert!(
        pids.iter().all(|p| alive(*p)),
        "every process runs after up exited"
    );
    let list = brokers.join(",");

    // A second `up` on the running cluster's directory is refused before it touches
    // anything (it would fail on the stores' locks after rewriting the ports), and the
    // cluster runs on.
    let again = quire(&["cluster", "up", "--detach", "--dir", &dir, "--brokers", "3"]);
    assert!(!again.status.success(), "{}", text(&again.stdout));
    assert!(
        text(&again.stderr).contains("already running"),
        "{}",
        text(&again.stderr)
    );
    assert!(
        pids.iter().all(|p| alive(*p)),
        "the running cluster is untouched"
    );

    let produced = quire(&[
        "produce",
        "--brokers",
        &list,
        "--topic",
        "t",
        "--count",
        "500",
        "--size",
        "64",
        "--format",
        "json",
    ]);
    assert!(
        produced.status.success(),
        "produce: {}",
        text(&produced.stderr)
    );
    let summary: Value = serde_json::from_str(text(&produced.stdout).trim()).unwrap();
    assert_eq!(summary["acked"], 500, "{summary}");

    // A short benchmark that also reports what it cost each of the cluster's processes.
    let bench = quire(&[
        "bench",
        "cluster",
        "--brokers",
        &list,
        "--cluster-dir",
        &dir,
        "--duration",
        "1s",
        "--format",
        "json",
    ]);
    assert!(bench.status.success(), "bench: {}", text(&bench.stderr));
    let report: Value = serde_json::from_str(text(&bench.stdout).trim()).unwrap();
    let servers = report["servers"].as_array().expect("servers reported");
    assert_eq!(servers.len(), 5, "{report}");
    assert_eq!(
        servers.iter().filter(|s| s["master"] == true).count(),
        1,
        "{report}"
    );
    assert!(
        report["servers_cpu_us_per_msg"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(
        report["master_minor_faults_per_msg"].as_f64().is_some(),
        "{report}"
    );

    let consumed = quire(&[
        "consume",
        "--brokers",
        &list,
        "--topic",
        "t",
        "--from",
        "beginning",
        "-n",
        "500",
        "--timeout",
        "20s",
        "--format",
        "jsonl",
    ]);
    assert!(
        consumed.status.success(),
        "consume: {}",
        text(&consumed.stderr)
    );
    let lines: Vec<Value> = text(&consumed.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 500);
    assert_eq!(lines[499]["payload"], format!("{:064}", 499));

    let status = quire(&["cluster", "status", "--brokers", &list, "--format", "json"]);
    assert!(status.status.success(), "status: {}", text(&status.stderr));
    let status: Value = serde_json::from_str(text(&status.stdout).trim()).unwrap();
    assert!(status["master"]["id"].as_u64().is_some(), "{status}");
    assert_eq!(status["stores"].as_array().unwrap().len(), 3, "{status}");

    let down = quire(&["cluster", "down", "--dir", &dir]);
    assert!(down.status.success(), "down: {}", text(&down.stderr));
    assert!(
        text(&down.stdout).contains("5 stopped cleanly"),
        "{}",
        text(&down.stdout)
    );
    for pid in &pids {
        assert!(!alive(*pid), "pid {pid} still runs after cluster down");
    }
    assert!(!guard.path().join("cluster.json").exists());

    for i in 0..3 {
        let store: PathBuf = guard.path().join(format!("store{i}"));
        let verify = quire(&["wal", "verify", store.to_str().unwrap()]);
        assert!(
            verify.status.success(),
            "wal verify store{i}: {}\n{}",
            text(&verify.stdout),
            text(&verify.stderr)
        );
    }

    // The stores' logs hold the messages as the broker's events: `wal dump --payload
    // utf8` shows each one's topic and text (not the event header's bytes before it).
    // Every acknowledged message is on a quorum (2) of the 3 stores; a third may lag.
    let expected: Vec<String> = (0..500).map(|i| format!("{i:064}")).collect();
    let mut complete = Vec::new();
    for i in 0..3 {
        let store: PathBuf = guard.path().join(format!("store{i}"));
        let dump = quire(&[
            "wal",
            "dump",
            store.to_str().unwrap(),
            "--payload",
            "utf8",
            "--format",
            "jsonl",
        ]);
        assert!(dump.status.success(), "wal dump: {}", text(&dump.stderr));
        let messages: Vec<String> = text(&dump.stdout)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["event"]["kind_name"] == "message" && r["event"]["topic"] == "t")
            .map(|r| r["event"]["message"].as_str().unwrap().to_owned())
            .collect();
        assert!(
            expected.starts_with(&messages),
            "store{i}: the messages of topic t, in log order: {messages:?}"
        );
        if messages.len() == expected.len() {
            complete.push(store);
        }
    }
    assert!(complete.len() >= 2, "{complete:?}");
    let dump = quire(&[
        "wal",
        "dump",
        complete[0].to_str().unwrap(),
        "--payload",
        "utf8",
    ]);
    assert!(dump.status.success(), "wal dump: {}", text(&dump.stderr));
    assert!(
        text(&dump.stdout).contains("topic=\"t\" producer_id="),
        "{}",
        text(&dump.stdout)
    );
    assert!(
        text(&dump.stdout).contains(&format!("message=\"{:064}\"", 499)),
        "{}",
        text(&dump.stdout)
    );

    // The cluster's directory (the parent of the stores' data directories) is no WAL:
    // an error with exit status 3, never "clean".
    let verify = quire(&["wal", "verify", &dir]);
    assert_eq!(verify.status.code(), Some(3), "{verify:?}");
    assert!(
        text(&verify.stderr).contains("holds no WAL"),
        "{}",
        text(&verify.stderr)
    );

    // A second `down` finds no cluster file: an error that says so.
    let again = quire(&["cluster", "down", "--dir", &dir]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("cluster.json"),
        "{}",
        text(&again.stderr)
    );
}
