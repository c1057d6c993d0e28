//! Runs the real `quire bench wal` for a second on a temporary directory and checks its
//! output contract: one JSON object with every field, rates and latencies above zero, the
//! baseline when asked for, the rounds against both disk layouts with `--vs-disk`, and the
//! temporary WAL removed. No timing thresholds.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Upper bound for any one `quire` run in these tests; a run past it is killed and fails.
const RUN_TIME_MAX: Duration = Duration::from_secs(120);

fn wait_bounded(child: Child) -> Output {
    quire_tests::wait_bounded(child, RUN_TIME_MAX)
}

fn quire(args: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_quire"))
        .env_remove("RUST_LOG")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn quire");
    wait_bounded(child)
}

fn number(json: &Value, field: &str) -> f64 {
    json.get(field)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("field {field:?} missing or not a number in {json}"))
}

fn assert_run_fields(run: &Value, appenders: f64) {
    for field in [
        "mb_per_s",
        "mib_per_s",
        "disk_mb_per_s",
        "ops_per_s",
        "fsyncs_per_s",
        "events_per_fsync",
        "events_per_batch",
        "p50_us",
        "p99_us",
        "p999_us",
        "max_us",
        "mean_us",
        "duration_s",
        "events",
        "payload_bytes",
        "written_bytes",
        "fsyncs",
        "batches",
        "cpu_us_per_event",
    ] {
        assert!(number(run, field) > 0.0, "{field} not > 0 in {run}");
    }
    assert!(number(run, "p50_us") <= number(run, "p99_us"));
    assert!(number(run, "p99_us") <= number(run, "p999_us"));
    assert!(number(run, "p999_us") <= number(run, "max_us"));
    assert_eq!(number(run, "event_size"), 4096.0);
    assert_eq!(number(run, "appenders"), appenders);
    assert_eq!(number(run, "payload_bytes"), number(run, "events") * 4096.0);
    // Every event was covered by an fdatasync, so there are at most as many fsyncs.
    assert!(
        number(run, "fsyncs") <= number(run, "events") + 1.0,
        "{run}"
    );
    assert!(
        number(run, "written_bytes") >= number(run, "payload_bytes"),
        "{run}"
    );
    assert!(
        run["backend"] == "io_uring" || run["backend"] == "sync",
        "{run}"
    );
    assert!(run["cpu_by_thread"].is_array(), "{run}");
}

fn assert_empty(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "bench files left behind: {left:?}");
}

#[test]
fn bench_wal_json_has_every_field_and_the_baseline_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = bench_wal_json(
        dir.path(),
        &[
            "--duration",
            "1s",
            "--segment-size",
            "8MiB",
            "--baseline",
            "--baseline-duration",
            "500ms",
        ],
    );
    assert_eq!(json["bench"], "wal");
    assert_eq!(number(&json, "segment_bytes"), 8.0 * 1024.0 * 1024.0);
    assert_run_fields(&json, 8.0);
    assert_run_fields(&json["baseline"], 1.0);
    assert!(number(&json, "ratio_vs_baseline") > 0.0, "{json}");
    assert_empty(dir.path());
}

/// `quire bench wal --dir DIR --event-size 4KiB --appenders 8 ARGS --format json`: its one
/// line of JSON (the run must succeed).
fn bench_wal_json(dir: &Path, args: &[&str]) -> Value {
    let mut all = vec![
        "bench",
        "wal",
        "--dir",
        dir.to_str().expect("utf-8"),
        "--event-size",
        "4KiB",
        "--appenders",
        "8",
    ];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--format", "json"]);
    let out = quire(&all);
    let stdout = String::from_utf8(out.stdout.clone()).expect("utf-8");
    assert!(
        out.status.success(),
        "quire failed: {}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
    serde_json::from_str(&stdout).expect("json")
}

#[test]
fn bench_wal_text_prints_the_summary_with_the_ratio() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = quire(&[
        "bench",
        "wal",
        "--dir",
        dir.path().to_str().expect("utf-8"),
        "--duration",
        "500ms",
        "--baseline-duration",
        "300ms",
        "--event-size",
        "4KiB",
        "--appenders",
        "4",
        "--segment-size",
        "8MiB",
    ]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        stdout.starts_with("quire bench wal: 4 appender(s) of 4 KiB"),
        "{stdout}"
    );
    for label in [
        "throughput",
        "events",
        "fdatasyncs",
        "latency",
        "cpu",
        "baseline",
        "ratio",
    ] {
        assert!(
            stdout.lines().any(|l| l.starts_with(label)),
            "no {label} line:\n{stdout}"
        );
    }
    assert_empty(dir.path());
}

#[test]
fn bench_wal_refuses_bad_values() {
    let out = quire(&["bench", "wal", "--appenders", "0", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--appenders 0 is out of range"));
    let out = quire(&["bench", "wal", "--event-size", "64K"]);
    assert_eq!(out.status.code(), Some(2), "usage error");
}

/// `--vs-disk` runs, per round, the WAL, then `bench disk` on a pre-written file, then on a
/// new fallocated one; the report keeps the pre-written ratio under its old name and adds
/// the fallocated one, both the medians of their rounds, and the fallocated runs did not
/// wrap into blocks they had written.
#[test]
fn bench_wal_vs_disk_reports_both_disk_layouts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = |format: &'static str| {
        vec![
            "bench",
            "wal",
            "--dir",
            dir.path().to_str().expect("utf-8"),
            "--duration",
            "300ms",
            "--event-size",
            "4KiB",
            "--appenders",
            "1",
            "--segment-size",
            "8MiB",
            "--no-baseline",
            "--vs-disk",
            "--rounds",
            "3",
            "--format",
            format,
        ]
    };
    let out = quire(&args("json"));
    assert!(
        out.status.success(),
        "quire failed: {}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_run_fields(&json, 1.0);
    let vs_disk = &json["vs_disk"];
    assert_eq!(number(vs_disk, "block_size"), 4096.0);
    let rounds = vs_disk["rounds"].as_array().expect("rounds array");
    assert_eq!(rounds.len(), 3, "{json}");
    let median = |field: &str| {
        let mut values: Vec<f64> = rounds.iter().map(|r| number(r, field)).collect();
        values.sort_by(f64::total_cmp);
        values[1]
    };
    for round in rounds {
        for field in [
            "wal_mb_per_s",
            "disk_mb_per_s",
            "disk_p50_us",
            "ratio",
            "fresh_disk_mb_per_s",
            "fresh_disk_ops_per_s",
            "fresh_disk_p50_us",
            "fresh_ratio",
        ] {
            assert!(number(round, field) > 0.0, "{field} not > 0 in {round}");
        }
        assert_eq!(number(round, "fresh_disk_wraps"), 0.0, "{round}");
        let fresh_ratio = number(round, "wal_mb_per_s") / number(round, "fresh_disk_mb_per_s");
        assert!(
            (number(round, "fresh_ratio") - fresh_ratio).abs() <= 1e-9 * fresh_ratio,
            "{round}"
        );
    }
    assert_eq!(number(&json, "ratio_vs_disk"), median("ratio"), "{json}");
    assert_eq!(
        number(&json, "ratio_vs_fresh_disk"),
        median("fresh_ratio"),
        "{json}"
    );
    assert_empty(dir.path());

    let out = quire(&args("text"));
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let ratio = stdout
        .lines()
        .find(|l| l.starts_with("ratio") && l.contains("pre-written disk's MB/s"))
        .unwrap_or_else(|| panic!("no vs-disk ratio line:\n{stdout}"));
    assert!(
        ratio.contains("of a new fallocated file's (medians of 3 rounds)"),
        "{ratio}"
    );
    assert_empty(dir.path());
}

/// `--retain`: the run trims as it goes, and trimmed segments come back as spares; the
/// report counts them and gives the bytes written per payload byte.
#[test]
fn bench_wal_with_retention_reuses_segment_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = bench_wal_json(
        dir.path(),
        &[
            "--duration",
            "3s",
            "--segment-size",
            "1MiB",
            "--retain",
            "2MiB",
            "--no-baseline",
        ],
    );
    assert_run_fields(&json, 8.0);
    assert!(number(&json, "segments_trimmed") >= 1.0, "{json}");
    assert!(number(&json, "spares_reused") >= 1.0, "{json}");
    if !json["write_bytes_per_payload_byte"].is_null() {
        assert!(
            number(&json, "write_bytes_per_payload_byte") > 0.0,
            "{json}"
        );
    }
    assert_empty(dir.path());
}
