//! `quire bench report --duration 500ms --format json --out FILE` on the real binary: every
//! benchmark runs (disk, wal, node, and a local cluster it starts and stops), the JSON has
//! eight rows with positive figures and ratios, the raw disk's best row has ratio 1, and the
//! Markdown file holds the table and the machine. Bounded; the temporary directory is left
//! empty by the benchmarks (each removes what it wrote).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is a clear failure

use std::process::Command;
use std::time::Duration;

use quire_tests::run_bounded;
use serde_json::Value;

const RUN_WAIT: Duration = Duration::from_secs(240);

#[test]
fn the_report_runs_every_benchmark_and_gives_ratios_to_the_disk() {
    let _t = quire_tests::proc_test();
    let dir = tempfile::Builder::new()
        .prefix("quire-report-test-")
        .tempdir()
        .unwrap();
    let out = dir.path().join("report.md");
    let data = dir.path().join("data");
    let run = run_bounded(
        Command::new(env!("CARGO_BIN_EXE_quire"))
            .args([
                "bench",
                "report",
                "--duration",
                "500ms",
                "--format",
                "json",
                "--dir",
            ])
            .arg(&data)
            .arg("--out")
            .arg(&out)
            .env("RUST_LOG", "warn"),
        RUN_WAIT,
    );
    let status = run.status;
    let text = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(status.success(), "exit {status}: {text}");
    let report: Value = serde_json::from_str(text.trim()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let benches: Vec<&str> = rows.iter().map(|r| r["bench"].as_str().unwrap()).collect();
    assert_eq!(
        benches,
        ["disk", "disk", "wal", "wal", "node", "node", "cluster", "cluster"],
        "{report}"
    );
    for r in rows {
        assert!(r["mb_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["ratio_to_disk"].as_f64().unwrap() > 0.0, "{r}");
    }
    let best = rows[..2]
        .iter()
        .map(|r| r["ratio_to_disk"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!((best - 1.0).abs() < 1e-9, "{report}");
    assert!(report["machine"]["cpus"].as_u64().unwrap() > 0);
    assert!(report["machine"]["logical_block_bytes"].as_u64().unwrap() >= 512);
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(md.contains("| bench | setup | MB/s |"), "{md}");
    assert_eq!(
        md.lines().filter(|l| l.starts_with("| cluster |")).count(),
        2,
        "{md}"
    );
    assert!(md.contains("Kernel "), "{md}");
}
