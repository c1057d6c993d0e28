//! The deployment files in `deploy/` stay true:
//!
//! - every metric the Grafana dashboard (`deploy/grafana/quire.json`) queries is exported
//!   by a real store or broker (scraped from a running cluster after some traffic), so a
//!   renamed metric breaks this test instead of a panel;
//! - the systemd units pass `systemd-analyze verify` (where it is installed; otherwise a
//!   parse check, and the test says so);
//! - `deploy/prometheus.yml` parses as YAML (python3 with PyYAML where present, otherwise a
//!   shape check, and the test says so) and scrapes both jobs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use quire_tests::http::{get, metric_names};
use quire_tests::process::{broker_bin, node_bin, run_bounded};
use quire_tests::{Cluster, Timing};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The metric names in a PromQL expression: Quire's all start with `quire_` or
/// `process_` (label values in quotes are skipped).
fn names_in_query(expr: &str) -> Vec<String> {
    let mut unquoted = String::new();
    let mut in_quotes = false;
    for ch in expr.chars() {
        if ch == '"' {
            in_quotes = !in_quotes;
        } else if !in_quotes {
            unquoted.push(ch);
        }
    }
    unquoted
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("quire_") || t.starts_with("process_"))
        .map(str::to_owned)
        .collect()
}

/// Every `expr` of every panel (rows nest panels).
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::String(e)) = m.get("expr") {
                    out.push(e.clone());
                }
                m.values().for_each(|v| walk(v, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

#[test]
fn the_dashboard_queries_only_metrics_the_servers_export() {
    let _t = quire_tests::proc_test();
    let text = std::fs::read_to_string(deploy_dir().join("grafana/quire.json")).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard parses");
    let queries = dashboard_queries(&dashboard);
    assert!(
        queries.len() >= 10,
        "the dashboard has its panels: {queries:?}"
    );
    let used: BTreeSet<String> = queries.iter().flat_map(|q| names_in_query(q)).collect();

    let mut c = Cluster::new(3, 2, Timing::default());
    c.set_store_config("metrics_listen = \"127.0.0.1:0\"\n[wal]\nsegment_bytes_max = 16777216\n");
    c.start_all();
    let master = c.settle();
    for _ in 0..5 {
        c.produce_marker();
    }
    let mut exported = BTreeSet::new();
    let addrs = c
        .stores
        .iter()
        .filter_map(|s| s.proc.as_ref())
        .chain(c.brokers.iter().filter_map(|b| b.proc.as_ref()))
        .filter_map(|p| p.metrics.clone());
    for addr in addrs {
        let (code, scrape) = get(&addr, "/metrics").expect("a scrape");
        assert_eq!(code, 200);
        exported.extend(metric_names(&scrape));
    }
    let missing: Vec<&String> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics no server exports: {missing:?} (master: broker {master})"
    );
    eprintln!("{} metric names in the dashboard, all exported", used.len());
}

#[test]
fn the_systemd_units_verify() {
    let _t = quire_tests::proc_test();
    let units = ["quire-node.service", "quire-broker.service"];
    let dir = tempfile::tempdir().expect("temp dir");
    let mut paths = Vec::new();
    for unit in units {
        let text = std::fs::read_to_string(deploy_dir().join(unit)).expect("unit");
        for section in ["[Unit]", "[Service]", "[Install]"] {
            assert!(text.contains(section), "{unit}: no {section}");
        }
        for key in [
            "Type=exec",
            "User=quire",
            "Group=quire",
            "StateDirectory=",
            "LimitNOFILE=",
            "Restart=on-failure",
            "ProtectSystem=strict",
            "ExecStart=",
        ] {
            assert!(text.lines().any(|l| l.starts_with(key)), "{unit}: no {key}");
        }
        for line in text.lines().map(str::trim) {
            let ok = line.is_empty()
                || line.starts_with('#')
                || (line.starts_with('[') && line.ends_with(']'))
                || line.split_once('=').is_some_and(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric())
                });
            assert!(ok, "{unit}: not a unit-file line: {line:?}");
        }
        assert!(
            text.contains("--config /etc/quire/"),
            "{unit}: settings come from the config file"
        );
        // systemd-analyze checks that ExecStart's binary exists: point it at the built one.
        let text = text
            .replace("/usr/bin/quire-node", &node_bin().display().to_string())
            .replace("/usr/bin/quire-broker", &broker_bin().display().to_string());
        let path = dir.path().join(unit);
        std::fs::write(&path, text).expect("unit copy");
        paths.push(path);
    }
    let out = Command::new("systemd-analyze").arg("--version").output();
    if !out.is_ok_and(|o| o.status.success()) {
        eprintln!("systemd-analyze is not installed here: only the parse check ran");
        return;
    }
    let out = run_bounded(
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .args(&paths),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // It exits 0 on unknown keys and bad values but reports them: any line naming a unit
    // is a finding.
    let findings: Vec<&str> = stderr
        .lines()
        .filter(|l| units.iter().any(|u| l.contains(u)))
        .collect();
    assert!(
        out.status.success() && findings.is_empty(),
        "systemd-analyze verify: {stderr}"
    );
    eprintln!("systemd-analyze verify: both units clean");
}

#[test]
fn prometheus_yml_parses_and_scrapes_stores_and_brokers() {
    let _t = quire_tests::proc_test();
    let path = deploy_dir().join("prometheus.yml");
    let text = std::fs::read_to_string(&path).expect("prometheus.yml");
    for job in [
        "job_name: quire-store",
        "job_name: quire-broker",
        "scrape_configs:",
    ] {
        assert!(text.contains(job), "prometheus.yml: no {job:?}");
    }
    let script = "import sys, yaml\n\
                  c = yaml.safe_load(open(sys.argv[1]))\n\
                  jobs = [j['job_name'] for j in c['scrape_configs']]\n\
                  assert jobs == ['quire-store', 'quire-broker'], jobs\n\
                  assert all(j['static_configs'][0]['targets'] for j in c['scrape_configs'])\n\
                  print('ok')\n";
    let has_yaml = Command::new("python3")
        .args(["-c", "import yaml"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_yaml {
        eprintln!("python3 with PyYAML is not installed here: only the shape check ran");
        assert!(!text.contains('\t'), "YAML allows no tabs for indentation");
        return;
    }
    let out = run_bounded(
        Command::new("python3").args(["-c", script]).arg(&path),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "prometheus.yml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
