//! `quire demo --duration 10s --format json` on the real binary: it starts its own cluster
//! (3 stores, 3 brokers, copies of itself), kills the master partway, and must exit 0 with
//! a summary saying that messages were acknowledged, none lost, none duplicated, and a
//! failover was seen.
//!
//! Bounded: the run is killed past [`RUN_WAIT`]; the demo's own children die with it
//! (`PR_SET_PDEATHSIG`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is a clear failure

use std::process::Command;
use std::time::Duration;

use quire_tests::run_bounded;
use serde_json::Value;

/// Longest the whole demo may take (10 s of load, start-up, drain, stop, on a loaded machine).
const RUN_WAIT: Duration = Duration::from_secs(180);

#[test]
fn the_demo_loses_and_duplicates_nothing_across_a_master_kill() {
    let _t = quire_tests::proc_test();
    let out = run_bounded(
        Command::new(env!("CARGO_BIN_EXE_quire"))
            .args([
                "demo",
                "--duration",
                "10s",
                "--size",
                "512B",
                "--format",
                "json",
            ])
            .env("RUST_LOG", "warn"),
        RUN_WAIT,
    );
    let status = out.status;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = stdout.lines().last().unwrap_or_default();
    let summary: Value = serde_json::from_str(last).unwrap_or_else(|e| {
        panic!("last stdout line is not JSON ({e}): {stdout}\nstderr:\n{stderr}")
    });
    assert!(
        status.success(),
        "exit {status}; summary {summary}; stderr:\n{stderr}"
    );
    assert!(summary["acked"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(summary["lost"], 0, "{summary}");
    assert_eq!(summary["duplicates"], 0, "{summary}");
    assert_eq!(summary["out_of_order"], 0, "{summary}");
    assert_eq!(summary["misplaced"], 0, "{summary}");
    assert!(summary["failover_ms"].as_f64().unwrap() > 0.0, "{summary}");
    assert_ne!(summary["killed_broker"], summary["new_master"], "{summary}");
    for field in ["events_per_s", "p99_us"] {
        assert!(summary[field].as_f64().unwrap() > 0.0, "{field}: {summary}");
    }
    assert!(summary["consumed"].as_u64().unwrap() >= summary["acked"].as_u64().unwrap());
    assert_eq!(summary["ok"], true, "{summary}");
}
