//! Producer and consumer throughput against a running cluster.
//!
//! ```text
//! cargo run --release -p quire-client --example client_bench -- \
//!     BROKERS [PRODUCERS=4] [MESSAGES_PER_PRODUCER=50000] [MESSAGE_BYTES=100] [TOPIC=bench]
//! ```
//!
//! Each producer sends its messages as fast as the producer's buffer lets it (with the
//! default batching settings), then awaits every acknowledgement; the run prints
//! messages/s, MB/s and the send-to-acknowledgement latency percentiles. Then one consumer
//! reads the topic back from the offset of the first acknowledged message and prints its
//! rate.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a measurement tool: a panic is a clear failure

use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_client::{Consumer, ConsumerConfig, Producer, ProducerConfig, StartFrom};
use quire_proto::Offset;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(brokers) = args.get(1) else {
        eprintln!("usage: client_bench BROKERS [PRODUCERS] [MESSAGES_PER_PRODUCER] [MESSAGE_BYTES] [TOPIC]");
        std::process::exit(2);
    };
    let brokers: Vec<String> = brokers.split(',').map(str::to_owned).collect();
    let producers: usize = arg(&args, 2, 4);
    let per_producer: usize = arg(&args, 3, 50_000);
    let size: usize = arg(&args, 4, 100);
    let topic: String = arg(&args, 5, "bench".to_owned());

    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..producers {
        let brokers = brokers.clone();
        let topic = topic.clone();
        tasks.push(tokio::spawn(async move {
            let p = Producer::connect(brokers, ProducerConfig::default())
                .await
                .expect("producer connects");
            let body = Bytes::from(vec![b'x'; size]);
            let mut pending = Vec::with_capacity(per_producer);
            for _ in 0..per_producer {
                let sent = Instant::now();
                let d = p.send(&topic, body.clone()).await.expect("queued");
                pending.push(tokio::spawn(async move {
                    let o = d.await.expect("acknowledged");
                    (o, sent.elapsed())
                }));
            }
            let mut out = Vec::with_capacity(per_producer);
            for h in pending {
                out.push(h.await.expect("task"));
            }
            out
        }));
    }
    let mut acks: Vec<(Offset, Duration)> = Vec::new();
    for t in tasks {
        acks.extend(t.await.expect("producer task"));
    }
    let elapsed = start.elapsed();
    let n = acks.len();
    let mut lat: Vec<Duration> = acks.iter().map(|(_, d)| *d).collect();
    lat.sort();
    let pct = |p: f64| lat[((n as f64 * p) as usize).min(n - 1)];
    println!(
        "produce: {n} messages of {size} B by {producers} producers in {:.2} s: {:.0} msg/s, {:.1} MB/s; \
         ack latency p50 {:?} p99 {:?} max {:?}",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64(),
        (n * size) as f64 / elapsed.as_secs_f64() / 1e6,
        pct(0.50),
        pct(0.99),
        lat[n - 1],
    );

    let first = acks.iter().map(|(o, _)| *o).min().expect("some message");
    let config = ConsumerConfig {
        fetch_max_messages: 8192,
        fetch_max_bytes: 8 * 1024 * 1024,
        fetch_wait_ms: 100,
        ..ConsumerConfig::default()
    };
    let mut c = Consumer::subscribe(brokers, &topic, StartFrom::Offset(first), config)
        .await
        .expect("subscribed");
    let start = Instant::now();
    let mut read = 0usize;
    while read < n {
        read += c.poll().await.expect("fetch").len();
    }
    let elapsed = start.elapsed();
    println!(
        "consume: {read} messages in {:.2} s: {:.0} msg/s",
        elapsed.as_secs_f64(),
        read as f64 / elapsed.as_secs_f64()
    );
}
