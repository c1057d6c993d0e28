//! Health checks, build facts and process metrics on the real binaries: 3 stores, 2 brokers.
//!
//! - `/healthz` answers 200 on every store and broker while it runs;
//! - a store is ready (`/ready` 200) once it serves; its log failing (an fdatasync EIO from
//!   `QUIRE_FAILPOINTS`, under load) turns it 503 naming the failed log, `/healthz` stays
//!   200; restarted on a good disk it is ready again;
//! - a broker is not ready before any master exists, and ready once the cluster has one;
//!   when the master is killed, the slave is not ready until its takeover completes, then
//!   ready as the new master;
//! - `quire_build_info` and the six `process_*` metrics are in a real scrape of both, and
//!   `--version` of the three binaries names a commit.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::process::Command;
use std::time::Duration;

use quire_node::failpoints::FAILPOINTS_ENV;
use quire_tests::disk::wait_until;
use quire_tests::http::{get, metric_names};
use quire_tests::process::{broker_bin, node_bin, quire_bin, run_bounded};
use quire_tests::{Cluster, LoadDriver, Timing, WAIT};

/// The stores serve metrics on an ephemeral port.
const STORE_CONFIG: &str =
    "metrics_listen = \"127.0.0.1:0\"\n[wal]\nsegment_bytes_max = 16777216\n";

const PROCESS_METRICS: [&str; 6] = [
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

fn metrics_addr(p: Option<&quire_tests::process::Proc>) -> String {
    p.and_then(|p| p.metrics.clone())
        .expect("the process serves metrics")
}

fn status(addr: &str, path: &str) -> (u16, String) {
    get(addr, path).unwrap_or_else(|| panic!("GET {path} on {addr}: no HTTP answer"))
}

fn check_standard_metrics(who: &str, addr: &str) {
    let (code, scrape) = status(addr, "/metrics");
    assert_eq!(code, 200, "{who}: /metrics");
    let names = metric_names(&scrape);
    for name in PROCESS_METRICS {
        assert!(names.contains(name), "{who}: no {name} in\n{scrape}");
    }
    let info = scrape
        .lines()
        .find(|l| l.starts_with("quire_build_info{"))
        .unwrap_or_else(|| panic!("{who}: no quire_build_info in\n{scrape}"));
    assert!(
        info.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
            && info.contains("commit=\"")
            && info.contains("rustc=\"")
            && info.ends_with(" 1"),
        "{who}: {info}"
    );
}

#[test]
fn stores_and_brokers_answer_healthz_and_ready_by_their_state() {
    let _t = quire_tests::proc_test();
    // A long election timeout: no master can exist in the moment after a broker starts.
    let timing = Timing {
        election_timeout_ms: 1500,
        ..Timing::default()
    };
    let mut c = Cluster::new(3, 2, timing);
    c.set_store_config(STORE_CONFIG);
    for s in &mut c.stores {
        s.start();
    }
    for (i, s) in c.stores.iter().enumerate() {
        let m = metrics_addr(s.proc.as_ref());
        assert_eq!(status(&m, "/healthz"), (200, "ok\n".into()), "store {i}");
        assert_eq!(
            status(&m, "/ready").0,
            200,
            "store {i}: an open log is ready"
        );
        assert_eq!(status(&m, "/nope").0, 404, "store {i}");
    }

    // Each broker, asked right after it starts, knows no master yet.
    for b in &mut c.brokers {
        b.start();
        let m = metrics_addr(b.proc.as_ref());
        let (code, why) = status(&m, "/ready");
        assert_eq!(code, 503, "broker {}: ready before any master: {why}", b.id);
        assert!(why.starts_with("not ready: "), "{why}");
        assert_eq!(status(&m, "/healthz").0, 200, "broker {}", b.id);
    }
    let master = c.wait_for_master();
    for b in &c.brokers {
        let m = metrics_addr(b.proc.as_ref());
        wait_until(
            &format!("broker {} ready once broker {master} is master", b.id),
            WAIT,
            || (status(&m, "/ready").0 == 200).then_some(()),
        );
    }
    check_standard_metrics("store 0", &metrics_addr(c.stores[0].proc.as_ref()));
    check_standard_metrics("master", &metrics_addr(c.broker_node(master).proc.as_ref()));

    // A store whose log fails is not ready, and says why; it still lives.
    let victim = 2;
    c.stores[victim].kill9();
    c.stores[victim].env = vec![(
        FAILPOINTS_ENV.to_owned(),
        "wal_fdatasync=eio,after=20".to_owned(),
    )];
    c.stores[victim].start();
    let m = metrics_addr(c.stores[victim].proc.as_ref());
    let load = LoadDriver::start(&c, 1, 2);
    let why = wait_until("the failed store's /ready turns 503", WAIT, || {
        let (code, body) = status(&m, "/ready");
        (code == 503).then_some(body)
    });
    load.stop();
    assert!(
        why.contains("the log has failed"),
        "the reason names the failed log: {why}"
    );
    assert_eq!(status(&m, "/healthz").0, 200, "a failed store is alive");
    eprintln!("failed store: {}", why.trim());

    // Fail-stop is for the process: restarted on a good disk, it is ready again.
    c.stores[victim].kill9();
    c.stores[victim].env.clear();
    c.stores[victim].start();
    let m = metrics_addr(c.stores[victim].proc.as_ref());
    wait_until("the restarted store is ready", WAIT, || {
        (status(&m, "/ready").0 == 200).then_some(())
    });

    // The master dies: the slave is not ready until its takeover completes.
    let master = c.wait_for_master();
    let slave = c
        .brokers
        .iter()
        .map(|b| b.id)
        .find(|&id| id != master)
        .expect("two brokers");
    let m = metrics_addr(c.broker_node(slave).proc.as_ref());
    c.broker(master).kill9();
    let mut not_ready = None;
    wait_until(
        "the slave turns not ready, then ready as the new master",
        WAIT,
        || {
            let (code, body) = status(&m, "/ready");
            if code == 503 && not_ready.is_none() {
                not_ready = Some(body);
            }
            (code == 200 && not_ready.is_some()).then_some(())
        },
    );
    eprintln!(
        "slave without a master: {}",
        not_ready.unwrap_or_default().trim()
    );
    assert_eq!(c.wait_for_master(), slave, "the slave took over");
}

#[test]
fn version_names_the_commit() {
    let _t = quire_tests::proc_test();
    for bin in [node_bin(), broker_bin(), quire_bin()] {
        let out = run_bounded(Command::new(&bin).arg("--version"), Duration::from_secs(10));
        assert!(out.status.success(), "{}", bin.display());
        let line = String::from_utf8_lossy(&out.stdout);
        assert!(
            line.contains(&format!("{} (commit ", env!("CARGO_PKG_VERSION"))),
            "{}: {line}",
            bin.display()
        );
    }
}
