//! Runs the real `quire` binary's `bench disk` the way a user does, on a temporary
//! directory, and checks its output contract: the JSON fields, the exit status and the
//! stderr message on bad input, and that the bench file is removed even on Ctrl-C.
//! No timing thresholds: every check is on values that must hold on any disk.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Upper bound for any one `quire` run in these tests; a run past it is killed and fails.
const RUN_TIME_MAX: Duration = Duration::from_secs(60);

fn quire() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_quire"));
    command.env_remove("RUST_LOG");
    command
}

/// Waits for `child` for at most [`RUN_TIME_MAX`], killing it (and failing) past that.
fn wait_bounded(child: Child) -> Output {
    quire_tests::wait_bounded(child, RUN_TIME_MAX)
}

fn run(args: &[&str]) -> Output {
    let child = quire()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn quire");
    wait_bounded(child)
}

/// True (after saying so) when the directory's file system refuses O_DIRECT, which is the
/// one environment problem these tests tolerate.
fn direct_io_unsupported(output: &Output) -> bool {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let unsupported = !output.status.success()
        && (stderr.contains("does not support direct I/O")
            || stderr.contains("does not support O_DIRECT"));
    if unsupported {
        eprintln!("SKIPPED: the temporary directory does not support O_DIRECT:\n{stderr}");
    }
    unsupported
}

fn assert_no_bench_file(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|entry| entry.expect("dir entry").file_name())
        .collect();
    assert!(left.is_empty(), "bench file left behind: {left:?}");
}

fn number(json: &serde_json::Value, field: &str) -> f64 {
    json.get(field)
        .and_then(serde_json::Value::as_f64)
        .unwrap_or_else(|| panic!("field {field:?} missing or not a number in {json}"))
}

#[test]
fn bench_disk_json_has_every_field_with_sane_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (fsync, qd) in [("every", "2"), ("none", "4")] {
        let output = run(&[
            "bench",
            "disk",
            "--dir",
            dir.path().to_str().expect("utf-8 tempdir"),
            "--block-size",
            "64KiB",
            "--qd",
            qd,
            "--fsync",
            fsync,
            "--duration",
            "1s",
            "--file-size",
            "16MiB",
            "--format",
            "json",
        ]);
        if direct_io_unsupported(&output) {
            return;
        }
        let stdout = String::from_utf8(output.stdout).expect("utf-8 stdout");
        assert!(
            output.status.success(),
            "quire failed: {}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(stdout.lines().count(), 1, "exactly one JSON line: {stdout}");
        let json: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");

        for field in [
            "mb_per_s",
            "mib_per_s",
            "ops_per_s",
            "p50_us",
            "p99_us",
            "p999_us",
            "max_us",
            "duration_s",
            "ops",
            "bytes",
            "alignment",
        ] {
            assert!(number(&json, field) > 0.0, "{field} not > 0 in {json}");
        }
        assert!(number(&json, "p50_us") <= number(&json, "p99_us"));
        assert!(number(&json, "p99_us") <= number(&json, "p999_us"));
        assert!(number(&json, "p999_us") <= number(&json, "max_us"));
        assert_eq!(json["bench"], "disk");
        assert_eq!(json["fsync"], fsync);
        assert_eq!(json["layout"], "prewritten", "the default layout");
        assert!(json["wraps"].is_u64(), "{json}");
        assert_eq!(number(&json, "block_size"), 65536.0);
        assert_eq!(number(&json, "qd"), qd.parse::<f64>().expect("qd"));
        assert_eq!(number(&json, "file_size"), 16.0 * 1024.0 * 1024.0);
        assert_eq!(number(&json, "bytes"), number(&json, "ops") * 65536.0);
        assert!(
            json["backend"] == "io_uring" || json["backend"] == "pwrite",
            "{json}"
        );
        let alignment = number(&json, "alignment") as u64;
        assert!(alignment >= 4096 && alignment.is_power_of_two(), "{json}");
        match fsync {
            "every" => {
                assert!(number(&json, "fsyncs_per_s") > 0.0, "{json}");
                assert_eq!(number(&json, "fsyncs"), number(&json, "ops"), "{json}");
            }
            _ => assert_eq!(number(&json, "fsyncs_per_s"), 0.0, "{json}"),
        }
        // Throughput is consistent with the counts it is computed from.
        let expected_mb_per_s = number(&json, "bytes") / number(&json, "duration_s") / 1e6;
        assert!((number(&json, "mb_per_s") - expected_mb_per_s).abs() < 1e-6 * expected_mb_per_s);
        assert_no_bench_file(dir.path());
    }
}

#[test]
fn bench_disk_text_output_is_a_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = run(&[
        "bench",
        "disk",
        "--dir",
        dir.path().to_str().expect("utf-8 tempdir"),
        "--block-size",
        "4KiB",
        "--duration",
        "300ms",
        "--file-size",
        "1MiB",
        "--backend",
        "pwrite",
    ]);
    if direct_io_unsupported(&output) {
        return;
    }
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).expect("utf-8 stdout");
    assert!(stdout.starts_with("quire bench disk: pwrite"), "{stdout}");
    for label in ["throughput", "writes", "fdatasyncs", "latency", "alignment"] {
        assert!(
            stdout.lines().any(|line| line.starts_with(label)),
            "no {label} line:\n{stdout}"
        );
    }
    assert_no_bench_file(dir.path());
}

/// `--layout fallocated`: the JSON names the layout, the file is sized past `--file-size` so
/// the run does not wrap into blocks it wrote, and the text says the file was not written.
#[test]
fn bench_disk_fallocated_layout_is_reported_and_does_not_wrap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = |format: &'static str| {
        vec![
            "bench",
            "disk",
            "--dir",
            dir.path().to_str().expect("utf-8 tempdir"),
            "--block-size",
            "64KiB",
            "--duration",
            "300ms",
            "--file-size",
            "1MiB",
            "--layout",
            "fallocated",
            "--format",
            format,
        ]
    };
    let output = run(&args("json"));
    if direct_io_unsupported(&output) {
        return;
    }
    assert!(
        output.status.success(),
        "quire failed: {}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("valid JSON");
    assert_eq!(json["layout"], "fallocated", "{json}");
    assert_eq!(number(&json, "wraps"), 0.0, "{json}");
    assert!(number(&json, "ops") > 0.0, "{json}");
    assert!(
        number(&json, "file_size") > 1024.0 * 1024.0,
        "sized for the duration, not the 1 MiB asked: {json}"
    );
    assert!(
        number(&json, "bytes") <= number(&json, "file_size"),
        "{json}"
    );
    assert_no_bench_file(dir.path());

    let output = run(&args("text"));
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).expect("utf-8 stdout");
    let file = stdout
        .lines()
        .find(|line| line.starts_with("file"))
        .unwrap_or_else(|| panic!("no file line:\n{stdout}"));
    assert!(file.contains("fallocated, not written"), "{file}");
    assert!(!file.contains("WRAPPED"), "{file}");
    assert_no_bench_file(dir.path());
}

#[test]
fn a_bad_size_exits_non_zero_with_a_message_on_stderr() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = run(&[
        "bench",
        "disk",
        "--dir",
        dir.path().to_str().expect("utf-8 tempdir"),
        "--block-size",
        "12q",
    ]);
    assert!(!output.status.success());
    assert_eq!(output.status.code(), Some(2), "clap usage errors exit 2");
    assert!(output.stdout.is_empty(), "nothing on stdout on error");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--block-size"), "{stderr}");
    assert!(stderr.contains("invalid size \"12q\""), "{stderr}");
    assert_no_bench_file(dir.path());
}

#[test]
fn a_bad_duration_and_an_ambiguous_unit_are_refused() {
    for (option, value, expected) in [
        ("--duration", "soon", "invalid duration \"soon\""),
        ("--file-size", "1G", "ambiguous"),
    ] {
        let output = run(&["bench", "disk", "--dir", "/tmp", option, value]);
        assert_eq!(output.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{stderr}");
    }
}

#[test]
fn a_runtime_error_exits_1_with_the_cause() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A missing --dir is created; one under a regular file cannot be.
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").expect("write");
    let impossible = file.join("sub");
    let output = run(&[
        "bench",
        "disk",
        "--dir",
        impossible.to_str().expect("utf-8 path"),
        "--duration",
        "1",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("quire: error: cannot create --dir") && stderr.contains("Not a directory"),
        "{stderr}"
    );
}

/// Ctrl-C in the middle of a run stops it with status 130 and still deletes the bench file.
#[test]
fn ctrl_c_stops_the_run_and_removes_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = quire()
        .args([
            "bench",
            "disk",
            "--dir",
            dir.path().to_str().expect("utf-8 tempdir"),
            "--block-size",
            "4KiB",
            "--duration",
            "50s",
            "--file-size",
            "1MiB",
            "--format",
            "json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn quire");
    // Wait until the measurement has started (the prefill log line is on stderr).
    let mut stderr = child.stderr.take().expect("stderr pipe");
    let mut seen = Vec::new();
    let started = Instant::now();
    let mut chunk = [0u8; 512];
    while !String::from_utf8_lossy(&seen).contains("measuring for") {
        assert!(
            started.elapsed() < RUN_TIME_MAX,
            "no measuring line: {}",
            String::from_utf8_lossy(&seen)
        );
        let n = stderr.read(&mut chunk).expect("read stderr");
        if n == 0 {
            let output = wait_bounded(child);
            if direct_io_unsupported(&Output {
                stderr: seen,
                ..output
            }) {
                return;
            }
            panic!("quire ended before measuring");
        }
        seen.extend_from_slice(&chunk[..n]);
    }
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
    // SAFETY: sending SIGINT to our own child process, whose pid we hold (not yet reaped).
    let rc = unsafe { libc::kill(pid, libc::SIGINT) };
    assert_eq!(rc, 0, "kill failed");
    let output = wait_bounded(child);
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).expect("read stderr");
    assert_eq!(output.status.code(), Some(130), "stderr: {rest}");
    assert!(output.stdout.is_empty(), "no result after Ctrl-C");
    assert!(rest.contains("interrupted"), "{rest}");
    assert_no_bench_file(dir.path());
}
