//! `quire bench node`: the real binary against an in-process node (no setup), and the
//! library against a node this test starts, spreading appends over several connections;
//! the store's log must then hold exactly the bench's events at consecutive offsets (the
//! resend-on-`LogMismatch` scheme never loses or duplicates an append). No timing
//! thresholds.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use quire_client::StoreClient;
use quire_proto::Offset;
use quire_tools::bench::node::{self, NodeBenchConfig};
use serde_json::Value;

/// Upper bound for any one `quire` run in these tests; a run past it is killed and fails.
const RUN_TIME_MAX: Duration = Duration::from_secs(120);

fn wait_bounded(child: Child) -> Output {
    quire_tests::wait_bounded(child, RUN_TIME_MAX)
}

fn number(json: &Value, field: &str) -> f64 {
    json.get(field)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("field {field:?} missing or not a number in {json}"))
}

#[test]
fn bench_node_in_process_json_has_every_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let child = Command::new(env!("CARGO_BIN_EXE_quire"))
        .env_remove("RUST_LOG")
        .args([
            "bench",
            "node",
            "--dir",
            dir.path().to_str().expect("utf-8"),
            "--duration",
            "1s",
            "--batch",
            "4",
            "--in-flight",
            "16",
            "--format",
            "json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn quire");
    let out = wait_bounded(child);
    assert!(
        out.status.success(),
        "quire failed: {}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
    let json: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(json["bench"], "node");
    assert_eq!(json["in_process"], true);
    assert_eq!(json["fsyncs_source"], "node_metrics");
    for field in [
        "mb_per_s",
        "ops_per_s",
        "events_per_s",
        "appends_per_s",
        "fsyncs_per_s",
        "events_per_fsync",
        "p50_us",
        "p99_us",
        "p999_us",
        "max_us",
        "duration_s",
        "events",
        "appends",
        "epoch",
    ] {
        assert!(number(&json, field) > 0.0, "{field} not > 0 in {json}");
    }
    assert_eq!(number(&json, "events"), 4.0 * number(&json, "appends"));
    assert_eq!(number(&json, "event_size"), 1024.0);
    assert!(number(&json, "p50_us") <= number(&json, "p999_us"));
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("read_dir").collect();
    assert!(
        left.is_empty(),
        "the node's directory was left behind: {left:?}"
    );
}

#[test]
fn appends_spread_over_connections_land_once_at_consecutive_offsets() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    quire_node::init(&quire_node::InitArgs {
        data_dir: data.clone(),
        learner: false,
    })
    .expect("init");
    let mut config = quire_node::NodeConfig::new(&data, "127.0.0.1:0");
    config.wal.segment_bytes_max = 8 << 20;
    let node = runtime
        .block_on(quire_node::Node::start(config))
        .expect("start the node");
    let addr = node.local_addr().to_string();

    // Twice: the second run starts after the first one's log, with a higher epoch.
    let mut expected_events = 0u64;
    let mut epochs = Vec::new();
    for _ in 0..2 {
        let report = node::run(&NodeBenchConfig {
            store: Some(addr.clone()),
            connections: 4,
            in_flight: 32,
            batch: 3,
            event_size: 100,
            duration: Duration::from_millis(700),
            ..NodeBenchConfig::default()
        })
        .expect("bench node");
        assert!(report.events > 0);
        assert_eq!(report.events, 3 * report.appends);
        assert!(!report.in_process);
        assert_eq!(
            report.fsyncs_source, None,
            "no --metrics for a remote store"
        );
        expected_events += 1 + report.events; // the warm-up append carries one event
        epochs.push(report.epoch);
    }
    assert!(epochs[1] > epochs[0], "{epochs:?}");

    runtime.block_on(async {
        let client = StoreClient::connect(addr.as_str()).await.expect("connect");
        let tail = client.tail().await.expect("tail");
        let last = tail.last.expect("the log is not empty");
        assert_eq!(
            last.offset.0 + 1,
            expected_events,
            "every event once, no gap"
        );
        assert_eq!(last.epoch.0, epochs[1]);
        // Read the whole log back: consecutive offsets, epochs never going down.
        let mut next = 0u64;
        let mut epoch = 0u64;
        while next < expected_events {
            let read = client
                .read(Offset(next), 4096, 8 << 20)
                .await
                .expect("read");
            assert!(!read.events.is_empty(), "nothing at {next}");
            for e in &read.events {
                assert_eq!(e.offset.0, next);
                assert!(e.epoch.0 >= epoch);
                assert_eq!(e.payload.len(), 100);
                epoch = e.epoch.0;
                next += 1;
            }
        }
    });
    runtime.block_on(node.shutdown()).expect("shutdown");
}
