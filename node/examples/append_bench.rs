//! Append throughput of one store, as a master drives it: one connection, a window of
//! pipelined appends, each acknowledged after its covering fdatasync.
//!
//! ```sh
//! cargo run --release -p quire-node --example append_bench -- [SECONDS] [IN_FLIGHT] [EVENTS_PER_APPEND] [PAYLOAD_BYTES] [DIR]
//! ```
//!
//! Starts a node in-process on a fresh store in DIR (default: a temp dir under the current
//! directory, on the same disk as the build), runs for SECONDS (default 5), and prints
//! appends/s, events/s, MB/s, the ack latency percentiles and the WAL's fsyncs and
//! group-commit sizes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a panic is a failed run

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_client::{AppendOutcome, StoreClient};
use quire_proto::{AppendRequest, Epoch, Event, EventKind, LogPosition, Offset};

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = arg(1, 5);
    let in_flight = arg(2, 64) as usize;
    let per_append = arg(3, 16);
    let payload_bytes = arg(4, 256) as usize;
    let root = match std::env::args().nth(5) {
        Some(d) => tempfile::Builder::new()
            .prefix("append-bench")
            .tempdir_in(d)
            .unwrap(),
        None => tempfile::Builder::new()
            .prefix("append-bench")
            .tempdir_in(".")
            .unwrap(),
    };
    let data = root.path().join("data");
    quire_node::init(&quire_node::InitArgs {
        data_dir: data.clone(),
        learner: false,
    })
    .unwrap();
    let mut config = quire_node::NodeConfig::new(&data, "127.0.0.1:0");
    config.wal.segment_bytes_max = 64 << 20;
    let node = quire_node::Node::start(config).await.unwrap();
    let client = StoreClient::connect(node.local_addr()).await.unwrap();

    let payload = Bytes::from(vec![0x5a; payload_bytes]);
    let epoch = Epoch(1);
    let mut next = 0u64;
    let mut window = VecDeque::new();
    let mut latencies_us = Vec::new();
    let (mut appends, mut events) = (0u64, 0u64);
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    loop {
        while window.len() < in_flight && Instant::now() < end {
            let prev = next.checked_sub(1).map(|o| LogPosition {
                epoch,
                offset: Offset(o),
            });
            let evs = (0..per_append)
                .map(|i| Event {
                    epoch,
                    offset: Offset(next + i),
                    kind: EventKind::Message,
                    payload: payload.clone().into(),
                })
                .collect();
            next += per_append;
            let req = AppendRequest {
                epoch,
                prev,
                events: evs,
                hwm: None,
            };
            window.push_back((Instant::now(), client.start_append(req).await.unwrap()));
        }
        let Some((sent, p)) = window.pop_front() else {
            break;
        };
        match p.wait().await.unwrap() {
            AppendOutcome::Persisted(_) => {}
            AppendOutcome::Rejected(r) => panic!("rejected: {r:?}"),
        }
        latencies_us.push(sent.elapsed().as_micros() as u64);
        appends += 1;
        events += per_append;
    }
    let secs = start.elapsed().as_secs_f64();
    latencies_us.sort_unstable();
    let pct = |p: f64| latencies_us[((latencies_us.len() as f64 - 1.0) * p) as usize];
    let metrics = node.metrics().encode().unwrap();
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    println!(
        "{appends} appends, {events} events of {payload_bytes} B in {secs:.2} s: {:.0} appends/s, {:.0} events/s, {:.1} MB/s payload",
        appends as f64 / secs,
        events as f64 / secs,
        (events as f64 * payload_bytes as f64) / secs / 1e6
    );
    println!(
        "ack latency µs: p50 {} p99 {} max {}",
        pct(0.5),
        pct(0.99),
        latencies_us.last().copied().unwrap_or(0)
    );
    let fsyncs = value("quire_wal_fsyncs_total");
    println!(
        "WAL: {fsyncs} fdatasyncs ({:.0} appends per fsync), {} batches, mean fsync {:.0} µs; node: {:.1} appends per durable wake-up",
        value("quire_wal_appends_total") / fsyncs.max(1.0),
        value("quire_wal_batches_total"),
        value("quire_wal_fsync_duration_seconds_sum") / fsyncs.max(1.0) * 1e6,
        value("quire_group_commit_appends_sum") / value("quire_group_commit_appends_count").max(1.0),
    );
    drop(client);
    node.shutdown().await.unwrap();
}
