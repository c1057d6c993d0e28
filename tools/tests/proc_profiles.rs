//! Profiles and `QUIRE_*` variables on the real `quire` binary against a real cluster (the
//! quire-tests harness: three stores, two brokers on loopback).
//!
//! Every client command (produce, consume, cluster status, cluster handoff, bench
//! cluster) is run with its brokers coming only from a profile, then only from
//! `QUIRE_BROKERS`; a dead broker in the profile is overridden by a good `QUIRE_BROKERS`,
//! a dead `QUIRE_BROKERS` by a good `-b`, the current profile by `--profile` and
//! `QUIRE_PROFILE`. With nothing anywhere, or a misspelt variable, the command fails at
//! once saying why. Last, `quire cluster up --detach --profile NAME` writes a profile that
//! `quire produce` then uses alone.
//!
//! Each command runs with `HOME` and `QUIRE_CONFIG_DIR` in a temporary directory and
//! every other `QUIRE_*` / `XDG_CONFIG_HOME` variable of the test's own environment
//! removed; every command is bounded, the cluster is killed on drop.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is a clear failure

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use quire_tests::cluster::{Cluster, Timing};
use quire_tests::process::{free_port, run_bounded};
use serde_json::Value;

/// Longest any one command may take.
const STEP_WAIT: Duration = Duration::from_secs(60);

/// A `quire` command with a clean client environment: HOME and QUIRE_CONFIG_DIR as given,
/// no other QUIRE_* or XDG_CONFIG_HOME variable, plus `vars`.
fn quire(home: &Path, config: &Path, vars: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quire"));
    for (name, _) in std::env::vars_os() {
        if name
            .to_string_lossy()
            .to_ascii_uppercase()
            .starts_with("QUIRE_")
        {
            cmd.env_remove(name);
        }
    }
    cmd.env_remove("XDG_CONFIG_HOME")
        .env("HOME", home)
        .env("QUIRE_CONFIG_DIR", config)
        .env("RUST_LOG", "warn")
        .envs(vars.iter().copied())
        .args(args);
    run_bounded(&mut cmd, STEP_WAIT)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({:?}):\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The environment one phase of the test runs its commands in.
struct Client {
    home: PathBuf,
    config: PathBuf,
    vars: Vec<(String, String)>,
}

impl Client {
    fn new(root: &Path, name: &str) -> Client {
        let home = root.join(name).join("home");
        let config = root.join(name).join("config");
        std::fs::create_dir_all(&home).unwrap();
        Client {
            home,
            config,
            vars: Vec::new(),
        }
    }

    fn var(mut self, name: &str, value: &str) -> Client {
        self.vars.push((name.to_owned(), value.to_owned()));
        self
    }

    fn run(&self, args: &[&str]) -> Output {
        let vars: Vec<(&str, &str)> = self
            .vars
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        quire(&self.home, &self.config, &vars, args)
    }

    /// Produces `n` messages to `topic` and consumes them back from the beginning, with
    /// `extra` flags on both; then asks `cluster status`.
    #[track_caller]
    fn round_trip(&self, topic: &str, n: usize, extra: &[&str], what: &str) {
        let count = n.to_string();
        let mut args = vec!["produce", "-t", topic, "--count", &count, "-f", "jsonl"];
        args.extend_from_slice(extra);
        let acks = ok(&self.run(&args), &format!("{what}: produce"));
        assert_eq!(acks.lines().count(), n, "{what}: {acks}");

        let mut args = vec![
            "consume",
            "-t",
            topic,
            "-o",
            "beginning",
            "-c",
            &count,
            "--timeout",
            "20s",
            "-f",
            "jsonl",
        ];
        args.extend_from_slice(extra);
        let lines = ok(&self.run(&args), &format!("{what}: consume"));
        let lines: Vec<Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), n, "{what}");
        assert_eq!(lines[n - 1]["payload"], format!("{:0100}", n - 1), "{what}");

        let mut args = vec!["cluster", "status", "-f", "json"];
        args.extend_from_slice(extra);
        let status: Value =
            serde_json::from_str(ok(&self.run(&args), &format!("{what}: status")).trim()).unwrap();
        assert!(
            status["master"]["id"].as_u64().is_some(),
            "{what}: {status}"
        );

        // The audit finds the stores through the same brokers. Its verdict may be
        // "degraded" (exit 4) for a moment while a store catches up; either way it read
        // all three stores.
        let mut args = vec!["cluster", "audit", "-f", "json"];
        args.extend_from_slice(extra);
        let out = self.run(&args);
        assert!(
            matches!(out.status.code(), Some(0 | 4)),
            "{what}: audit: {}",
            text(&out.stderr)
        );
        let audit: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
        assert_eq!(
            audit["stores"].as_array().map(Vec::len),
            Some(3),
            "{what}: {audit}"
        );
    }
}

#[test]
fn client_commands_take_their_brokers_from_a_profile_a_variable_or_a_flag() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 2, Timing::default());
    cluster.start_all();
    let master = cluster.wait_for_master();
    let good: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    let good = good.join(",");
    let dead = format!("127.0.0.1:{}", free_port());
    let root = tempfile::tempdir().unwrap();

    // Only a profile: the first one created becomes current.
    let only_profile = Client::new(root.path(), "profile");
    let created = ok(
        &only_profile.run(&["profile", "create", "good", "-b", &good]),
        "profile create",
    );
    assert!(created.contains("(current)"), "{created}");
    let list = ok(&only_profile.run(&["profile", "list"]), "profile list");
    assert!(list.starts_with("* good"), "{list}");
    only_profile.round_trip("from-profile", 20, &[], "profile only");
    let bench = ok(
        &only_profile.run(&[
            "bench",
            "cluster",
            "--duration",
            "1s",
            "--connect-timeout",
            "20s",
            "-f",
            "json",
        ]),
        "bench cluster",
    );
    let bench: Value = serde_json::from_str(bench.trim()).unwrap();
    assert!(bench["ops"].as_u64().unwrap_or(0) > 0, "{bench}");
    let to = cluster
        .brokers
        .iter()
        .map(|b| b.id)
        .find(|id| *id != master)
        .unwrap()
        .to_string();
    let handoff = ok(
        &only_profile.run(&["cluster", "handoff", "--to", &to, "-f", "json"]),
        "handoff",
    );
    let handoff: Value = serde_json::from_str(handoff.trim()).unwrap();
    assert_eq!(handoff["master"].to_string(), to, "{handoff}");

    // Only QUIRE_BROKERS, no profiles file at all.
    let only_env = Client::new(root.path(), "env").var("QUIRE_BROKERS", &good);
    only_env.round_trip("from-env", 10, &[], "QUIRE_BROKERS only");

    // A dead broker in the current profile, a good QUIRE_BROKERS: the variable wins. The
    // profile's short connect timeout would make a wrong choice fail quickly.
    let bad_profile = Client::new(root.path(), "bad-profile").var("QUIRE_BROKERS", &good);
    ok(
        &bad_profile.run(&[
            "profile",
            "create",
            "bad",
            "-b",
            &dead,
            "--connect-timeout",
            "2s",
        ]),
        "profile create bad",
    );
    bad_profile.round_trip(
        "env-over-profile",
        10,
        &[],
        "QUIRE_BROKERS over a bad profile",
    );

    // A dead QUIRE_BROKERS, a good flag: the flag wins.
    let bad_env = Client::new(root.path(), "bad-env")
        .var("QUIRE_BROKERS", &dead)
        .var("QUIRE_CONNECT_TIMEOUT", "2s");
    bad_env.round_trip(
        "flag-over-env",
        10,
        &["-b", &good],
        "-b over a bad QUIRE_BROKERS",
    );

    // --profile and QUIRE_PROFILE over the current (dead) profile.
    let chosen = Client::new(root.path(), "chosen");
    ok(
        &chosen.run(&[
            "profile",
            "create",
            "bad",
            "-b",
            &dead,
            "--connect-timeout",
            "2s",
        ]),
        "profile create bad",
    );
    ok(
        &chosen.run(&["profile", "create", "good", "--brokers", &good]),
        "profile create good",
    );
    chosen.round_trip(
        "by-flag",
        5,
        &["--profile", "good"],
        "--profile over current",
    );
    let chosen = chosen.var("QUIRE_PROFILE", "good");
    chosen.round_trip("by-env", 5, &[], "QUIRE_PROFILE over current");
    // QUIRE_TOPIC and QUIRE_FORMAT fill in --topic and --format.
    let topic = chosen
        .var("QUIRE_TOPIC", "by-env")
        .var("QUIRE_FORMAT", "jsonl");
    let acks = ok(
        &topic.run(&["produce", "--count", "3"]),
        "produce with QUIRE_TOPIC",
    );
    let acks: Vec<Value> = acks
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(acks.len(), 3);
    assert_eq!(acks[0]["topic"], "by-env");
    assert!(acks[0]["offset"].as_u64().is_some(), "{acks:?}");

    // Nothing anywhere: fails at once naming every place looked at.
    let nothing = Client::new(root.path(), "nothing");
    let out = nothing.run(&["cluster", "status"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("--brokers/-b") && err.contains("QUIRE_BROKERS"),
        "{err}"
    );
    assert!(
        err.contains(&nothing.config.join("profiles.toml").display().to_string()),
        "{err}"
    );

    // A misspelt variable is an error naming the right one, even with -b given.
    let typo = Client::new(root.path(), "typo").var("QUIRE_BROKRS", &good);
    let out = typo.run(&["cluster", "status", "-b", &good]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("QUIRE_BROKRS") && err.contains("did you mean QUIRE_BROKERS"),
        "{err}"
    );
}

#[test]
fn cluster_up_with_a_profile_writes_one_that_produce_uses_alone() {
    let _t = quire_tests::proc_test();
    let root = tempfile::tempdir().unwrap();
    let client = Client::new(root.path(), "up");
    let dir = root.path().join("cluster");
    let dir_text = dir.display().to_string();
    let up = client.run(&[
        "cluster",
        "up",
        "--detach",
        "--dir",
        &dir_text,
        "--stores",
        "3",
        "--brokers",
        "2",
        "--profile",
        "local",
    ]);
    // Stop the cluster whatever happens below.
    struct Down<'a>(&'a Client, String);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = self.0.run(&["cluster", "down", "--dir", &self.1]);
        }
    }
    let _down = Down(&client, dir_text.clone());
    let up = ok(&up, "cluster up --profile local");
    assert!(up.contains("profile local written in"), "{up}");
    let show: Value = serde_json::from_str(
        ok(
            &client.run(&["profile", "show", "-f", "json"]),
            "profile show",
        )
        .trim(),
    )
    .unwrap();
    assert_eq!(show["name"], "local");
    assert_eq!(show["current"], true);
    assert_eq!(show["brokers"].as_array().unwrap().len(), 2, "{show}");
    client.round_trip("up", 5, &[], "cluster up's profile");
    let down = ok(
        &client.run(&["cluster", "down", "--dir", &dir_text]),
        "cluster down",
    );
    assert!(down.contains("stopped"), "{down}");
    // The profile stays (a later `cluster up` on the same DIR reuses its ports).
    let list = ok(&client.run(&["profile", "list"]), "profile list");
    assert!(list.contains("* local"), "{list}");
}
