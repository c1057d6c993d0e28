//! `quire-node run --print-config` and `quire-broker run --print-config` on the real
//! binaries: a setting from each layer (default, config file, `QUIRE_*` variable, flag)
//! shows up with its effective value and its source, the command exits 0 without serving,
//! a deprecated spelling is reported on stderr, and a typo fails naming the setting.

use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::Duration;

use quire_tests::{broker_bin, node_bin, run_bounded};

/// Longest a `--print-config` run may take (it starts no server).
const RUN_BOUND: Duration = Duration::from_secs(30);

fn run(cmd: &mut Command) -> Output {
    run_bounded(cmd, RUN_BOUND)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `KEY -> (VALUE, SOURCE)` from the JSON document.
fn settings(out: &Output) -> HashMap<String, (Option<String>, String)> {
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
    doc["settings"]
        .as_array()
        .expect("a settings array")
        .iter()
        .map(|s| {
            (
                s["key"].as_str().expect("key").to_owned(),
                (
                    s["value"].as_str().map(str::to_owned),
                    s["source"].as_str().expect("source").to_owned(),
                ),
            )
        })
        .collect()
}

#[test]
fn the_node_prints_each_setting_and_its_source() {
    let _t = quire_tests::proc_test();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:1\"\n[limits]\nconnections_max = 77\nidle_timeout_ms = 120000\n[wal]\nsegment_bytes_max = \"16MiB\"\nbatch_window = \"50us\"\n",
    )
    .expect("writes");
    let data = dir.path().join("data");
    let mut cmd = Command::new(node_bin());
    cmd.args(["run", "--print-config", "--format", "json", "--data-dir"])
        .arg(&data)
        .args(["--batch-window", "70us", "--config"])
        .arg(&config)
        .env("QUIRE_NODE_LISTEN", "127.0.0.1:2")
        .env("QUIRE_NODE_READ_BYTES_MAX", "2MiB");
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = settings(&out);
    let file = format!("file {}", config.display());
    let want = [
        (
            "data_dir",
            data.display().to_string(),
            "flag --data-dir".to_owned(),
        ),
        (
            "listen",
            "127.0.0.1:2".to_owned(),
            "env QUIRE_NODE_LISTEN".to_owned(),
        ),
        (
            "read_bytes_max",
            "2MiB".to_owned(),
            "env QUIRE_NODE_READ_BYTES_MAX".to_owned(),
        ),
        ("connections_max", "77".to_owned(), file.clone()),
        ("idle_timeout", "2m".to_owned(), file.clone()),
        ("segment_bytes_max", "16MiB".to_owned(), file.clone()),
        (
            "batch_window",
            "70us".to_owned(),
            "flag --batch-window".to_owned(),
        ),
        ("log_format", "pretty".to_owned(), "default".to_owned()),
        ("queue_bytes_max", "256MiB".to_owned(), "default".to_owned()),
    ];
    for (key, value, source) in want {
        assert_eq!(
            s.get(key),
            Some(&(Some(value), source)),
            "{key} in {}",
            text(&out.stdout)
        );
    }
    assert_eq!(s.get("metrics_listen"), Some(&(None, "default".to_owned())));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("warning: idle_timeout_ms (in ")
            && stderr.contains("use limits.idle_timeout = \"2m\""),
        "{stderr}"
    );
    assert!(!data.exists(), "--print-config starts nothing");

    // The text form: one aligned line per setting with its source.
    let mut cmd = Command::new(node_bin());
    cmd.args([
        "run",
        "--print-config",
        "--listen",
        "127.0.0.1:3",
        "--data-dir",
    ])
    .arg(&data);
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("listen "))
        .unwrap_or_else(|| panic!("no listen line in {stdout}"));
    assert!(
        line.contains("127.0.0.1:3") && line.ends_with("flag --listen"),
        "{line}"
    );
    assert!(stdout.contains("limits.partial_frame_timeout"), "{stdout}");

    // A typo in a variable fails, naming it and the setting it resembles.
    let mut cmd = Command::new(node_bin());
    cmd.args(["run", "--print-config"])
        .env("QUIRE_NODE_CONECTIONS_MAX", "5");
    let out = run(&mut cmd);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("QUIRE_NODE_CONECTIONS_MAX")
            && stderr.contains("did you mean QUIRE_NODE_CONNECTIONS_MAX?"),
        "{stderr}"
    );
}

#[test]
fn the_broker_prints_each_setting_and_its_source() {
    let _t = quire_tests::proc_test();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("broker.toml");
    std::fs::write(
        &config,
        "id = 1\nstores = [\"127.0.0.1:7101\"]\nbrokers = [\"1=127.0.0.1:7201\"]\nheartbeat = \"40ms\"\nretention_age = \"2h\"\n",
    )
    .expect("writes");
    let data = dir.path().join("broker");
    let mut cmd = Command::new(broker_bin());
    cmd.args(["run", "--print-config", "--format", "json", "--data-dir"])
        .arg(&data)
        .args(["--election-timeout", "900ms"])
        .env("QUIRE_BROKER_CONFIG", &config)
        .env("QUIRE_BROKER_HEARTBEAT", "60ms");
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = settings(&out);
    let file = format!("file {}", config.display());
    let want = [
        ("id", "1".to_owned(), file.clone()),
        (
            "heartbeat",
            "60ms".to_owned(),
            "env QUIRE_BROKER_HEARTBEAT".to_owned(),
        ),
        (
            "election_timeout",
            "900ms".to_owned(),
            "flag --election-timeout".to_owned(),
        ),
        ("retention_age", "2h".to_owned(), file.clone()),
        ("produce_timeout", "10s".to_owned(), "default".to_owned()),
        ("message_bytes_max", "1MiB".to_owned(), "default".to_owned()),
    ];
    for (key, value, source) in want {
        assert_eq!(
            s.get(key),
            Some(&(Some(value), source)),
            "{key} in {}",
            text(&out.stdout)
        );
    }
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["config"]["source"], "env QUIRE_BROKER_CONFIG");
    assert!(!data.exists(), "--print-config starts nothing");

    // A bad value fails, naming the setting, its source and the accepted form.
    let mut cmd = Command::new(broker_bin());
    cmd.args(["run", "--print-config", "--heartbeat", "50mss"]);
    let out = run(&mut cmd);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("heartbeat = \"50mss\" (flag --heartbeat)")
            && stderr.contains("a duration like 50ms, 10s, 2m"),
        "{stderr}"
    );
}
