//! The network commands (`produce`, `consume`, `bench cluster`, `cluster handoff`,
//! `cluster status`) pointed at an address where nothing listens.
//!
//! The story: a newcomer ran `quire produce --brokers 127.0.0.1:<wrong port>` and the
//! command sat silent for 30 s (`quire consume`: 60 s) before failing. Now the first failed
//! connect is reported on stderr at once — naming the address, the OS error and how long
//! it keeps retrying under which flag — and when that bound runs out the command fails
//! with the same facts and a non-zero status. Each run here has a short bound, and the
//! wait for it is bounded by [`RUN_TIME_MAX`]; nothing asserts how long a run took.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is a clear failure

use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::Duration;

/// Upper bound for any one `quire` run here; a run past it is killed and fails the test.
const RUN_TIME_MAX: Duration = Duration::from_secs(30);

/// `127.0.0.1:<port>` with nothing listening: a port the kernel just handed out, closed.
fn dead_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

fn quire(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quire"));
    cmd.env_remove("RUST_LOG").args(args);
    quire_tests::run_bounded(&mut cmd, RUN_TIME_MAX)
}

/// Fails, the note comes first and names the address, the error and the flag, and the
/// final error says the same.
fn assert_reported(out: &Output, addr: &str, flag: &str, bound: &str) {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    let note = lines
        .iter()
        .position(|l| l.contains("cannot reach the master yet"))
        .unwrap_or_else(|| panic!("no note on stderr:\n{err}"));
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("cannot reach the master yet"))
            .count(),
        1,
        "one note, not one per retry:\n{err}"
    );
    let failed = lines
        .iter()
        .position(|l| l.starts_with("quire: error:") && l.contains("no master reachable within"))
        .unwrap_or_else(|| panic!("no final error:\n{err}"));
    assert!(note < failed, "the note comes before the error:\n{err}");
    for line in [lines[note], lines[failed]] {
        assert!(line.contains(&format!("connect to {addr}")), "{line}");
        assert!(line.to_lowercase().contains("connection refused"), "{line}");
        assert!(line.contains(flag), "{line}");
        assert!(line.contains(bound), "{line}");
    }
}

#[test]
fn produce_to_a_port_with_nothing_listening_says_so_and_fails_within_its_bound() {
    let addr = dead_address();
    let out = quire(&[
        "produce",
        "--brokers",
        &addr,
        "--topic",
        "t",
        "--count",
        "1",
        "--connect-timeout",
        "700ms",
    ]);
    assert_reported(&out, &addr, "--connect-timeout", "700ms");
}

#[test]
fn consume_from_a_port_with_nothing_listening_says_so_and_fails_within_its_bound() {
    let addr = dead_address();
    let out = quire(&[
        "consume",
        "--brokers",
        &addr,
        "--topic",
        "t",
        "--from",
        "5",
        "--connect-timeout",
        "1s",
    ]);
    assert_reported(&out, &addr, "--connect-timeout", "1s");
}

#[test]
fn bench_cluster_against_a_port_with_nothing_listening_says_so_and_fails_within_its_bound() {
    let addr = dead_address();
    let out = quire(&[
        "bench",
        "cluster",
        "--brokers",
        &addr,
        "--duration",
        "1s",
        "--connect-timeout",
        "500ms",
    ]);
    assert_reported(&out, &addr, "--connect-timeout", "500ms");
}

#[test]
fn handoff_through_a_port_with_nothing_listening_names_its_timeout_flag() {
    let addr = dead_address();
    let out = quire(&[
        "cluster",
        "handoff",
        "--brokers",
        &addr,
        "--to",
        "2",
        "--timeout",
        "1s",
    ]);
    assert_reported(&out, &addr, "--timeout", "1s");
}

#[test]
fn status_of_a_port_with_nothing_listening_fails_naming_it() {
    let addr = dead_address();
    let out = quire(&["cluster", "status", "--brokers", &addr, "--timeout", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no broker answered"), "{err}");
    assert!(err.contains(&format!("connect to {addr}")), "{err}");
    assert!(err.to_lowercase().contains("connection refused"), "{err}");
}

#[test]
fn the_connect_timeout_and_its_default_are_in_the_help() {
    for command in [&["produce"][..], &["consume"], &["bench", "cluster"]] {
        let mut args = command.to_vec();
        args.push("--help");
        let out = quire(&args);
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{help}");
        let at = help
            .find("--connect-timeout <DURATION>")
            .unwrap_or_else(|| panic!("no --connect-timeout in {command:?} --help:\n{help}"));
        let option = &help[at..];
        let default = option.find("[default:").expect("a default shown");
        assert!(option[default..].starts_with("[default: 30s]"), "{option}");
        assert!(option[..default].contains("retried"), "{option}");
    }
}
