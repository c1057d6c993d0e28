//! The producer and consumer against the real binaries: 3 `quire-node` stores and 2
//! `quire-broker` brokers on loopback. Four producers write to three topics while three
//! consumers read them; the master is killed with SIGKILL mid-stream. Every message must
//! be acknowledged, and every acknowledged message read back exactly once, in each
//! producer's order, at the offset its acknowledgement named.
//!
//! The processes run through the workspace's one harness (quire-tests): binaries from
//! `target/<profile>/`, children killed and the temporary directory removed on drop, also
//! when the test panics; every wait is bounded.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_client::{
    Consumer, ConsumerConfig, Discovery, DiscoveryConfig, Producer, ProducerConfig, StartFrom,
};
use quire_proto::Offset;
use quire_tests::{Cluster, Timing, WAIT};
use tokio::sync::watch;
/// Bound of the whole scenario.
const TEST_BOUND: Duration = Duration::from_secs(240);

const PRODUCERS: usize = 4;
const TOPICS: [&str; 3] = ["orders", "payments", "audit"];
const MESSAGES_PER_PRODUCER: usize = 1_500;

/// 3 stores and 2 brokers of the workspace's harness (quire-tests), all started.
fn start_cluster() -> Cluster {
    let mut cluster = Cluster::new(
        3,
        2,
        Timing {
            heartbeat_ms: 50,
            election_timeout_ms: 600,
            produce_timeout_ms: 5_000,
        },
    );
    cluster.start_all();
    cluster
}

fn discovery_config() -> DiscoveryConfig {
    DiscoveryConfig {
        probe_timeout_ms: 1_000,
        backoff_initial_ms: 20,
        backoff_max_ms: 500,
        discovery_timeout_ms: WAIT.as_millis() as u64,
        ..DiscoveryConfig::default()
    }
}

fn payload(producer: usize, i: usize) -> Bytes {
    Bytes::from(format!("p{producer}-{i:06}"))
}

fn parse(payload: &[u8]) -> (usize, usize) {
    let s = std::str::from_utf8(payload).expect("utf-8 payload");
    let (p, i) = s
        .strip_prefix('p')
        .and_then(|s| s.split_once('-'))
        .expect("p<producer>-<index>");
    (p.parse().expect("producer"), i.parse().expect("index"))
}

/// One producer's run: every message to `TOPICS[(producer + i) % 3]`; returns
/// `(topic, payload, offset)` for each, in send order. Panics if one is not acknowledged.
async fn produce(
    brokers: Vec<String>,
    producer: usize,
    acked: Arc<AtomicUsize>,
) -> Vec<(usize, Bytes, Offset)> {
    let config = ProducerConfig {
        linger_ms: 2,
        in_flight_batches_max: 8,
        delivery_timeout_ms: 60_000,
        discovery: discovery_config(),
        ..ProducerConfig::default()
    };
    let p = Producer::connect(brokers, config)
        .await
        .expect("producer connects");
    let mut out = Vec::with_capacity(MESSAGES_PER_PRODUCER);
    let mut window = std::collections::VecDeque::new();
    for i in 0..MESSAGES_PER_PRODUCER {
        let topic = (producer + i) % TOPICS.len();
        let m = payload(producer, i);
        let d = p.send(TOPICS[topic], m.clone()).await.expect("queued");
        window.push_back((topic, m, d));
        // Keep a few hundred messages outstanding, so the failover meets batches in flight.
        while window.len() > 256 {
            let (t, m, d) = window.pop_front().expect("non-empty");
            let offset = d
                .await
                .unwrap_or_else(|e| panic!("{m:?} not acknowledged: {e}"));
            acked.fetch_add(1, Ordering::Relaxed);
            out.push((t, m, offset));
        }
        if i % 64 == 0 {
            // Spread the producers' sends over time.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    for (t, m, d) in window {
        let offset = d
            .await
            .unwrap_or_else(|e| panic!("{m:?} not acknowledged: {e}"));
        acked.fetch_add(1, Ordering::Relaxed);
        out.push((t, m, offset));
    }
    p.close().await.expect("flushed");
    out
}

fn consumer_config() -> ConsumerConfig {
    ConsumerConfig {
        fetch_max_messages: 200,
        fetch_wait_ms: 300,
        retry_timeout_ms: 60_000,
        discovery: discovery_config(),
        ..ConsumerConfig::default()
    }
}

fn cursor_name(topic: usize) -> StartFrom {
    StartFrom::Cursor(format!("{}-reader", TOPICS[topic]))
}

/// Reads `TOPICS[topic]` from its (never committed) cursor, i.e. from the beginning, until
/// `expected` names the topic's message count and that many have arrived; then one more
/// fetch (which must find nothing), and commits the cursor.
async fn consume(
    brokers: Vec<String>,
    topic: usize,
    mut expected: watch::Receiver<Option<[usize; TOPICS.len()]>>,
) -> Vec<(Offset, Bytes)> {
    let mut c = Consumer::subscribe(
        brokers,
        TOPICS[topic],
        cursor_name(topic),
        consumer_config(),
    )
    .await
    .expect("subscribed");
    assert_eq!(c.position(), Offset::ZERO);
    let mut got = Vec::new();
    loop {
        let done = expected
            .borrow_and_update()
            .is_some_and(|n| got.len() >= n[topic]);
        for m in c.poll().await.expect("fetch") {
            got.push((m.offset, m.payload));
        }
        if done {
            break;
        }
    }
    c.commit().await.expect("cursor committed");
    got
}

#[test]
fn proc_producers_and_consumers_survive_a_master_kill() {
    let _t = quire_tests::proc_test();
    let mut cluster = start_cluster();
    let brokers: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let acked = Arc::new(AtomicUsize::new(0));
    let (expected_tx, expected_rx) = watch::channel(None);
    let total = PRODUCERS * MESSAGES_PER_PRODUCER;

    rt.block_on(async {
        tokio::time::timeout(TEST_BOUND, async {
            let producers: Vec<_> = (0..PRODUCERS)
                .map(|p| tokio::spawn(produce(brokers.clone(), p, acked.clone())))
                .collect();
            let consumers: Vec<_> = (0..TOPICS.len())
                .map(|t| tokio::spawn(consume(brokers.clone(), t, expected_rx.clone())))
                .collect();

            // Kill -9 the master once a third of the messages are acknowledged.
            let deadline = Instant::now() + WAIT * 2;
            while acked.load(Ordering::Relaxed) < total / 3 {
                assert!(
                    Instant::now() < deadline,
                    "producers stalled before the kill"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let discovery = Discovery::new(brokers.clone(), discovery_config()).unwrap();
            let master = discovery.find_master(None).await.expect("a master").master;
            let before = acked.load(Ordering::Relaxed);
            cluster.broker(master.id.0).kill9();
            eprintln!(
                "killed master {} at {before} of {total} acknowledged messages",
                master.id.0
            );

            let mut sent: Vec<(usize, Bytes, Offset)> = Vec::new();
            for p in producers {
                sent.extend(p.await.expect("producer task"));
            }
            assert_eq!(sent.len(), total, "every message acknowledged");
            assert!(before < total, "the kill happened mid-stream");
            let new_master = discovery
                .find_master(None)
                .await
                .expect("a new master")
                .master;
            assert_ne!(new_master.id, master.id, "the other broker took over");

            let mut per_topic = [0usize; TOPICS.len()];
            for (t, _, _) in &sent {
                per_topic[*t] += 1;
            }
            expected_tx.send(Some(per_topic)).expect("consumers listen");
            let mut read = Vec::new();
            for c in consumers {
                read.push(c.await.expect("consumer task"));
            }

            // Acknowledged offsets are distinct.
            let mut acked_at: BTreeMap<Offset, (usize, Bytes)> = BTreeMap::new();
            for (t, m, o) in &sent {
                let earlier = acked_at.insert(*o, (*t, m.clone()));
                assert!(
                    earlier.is_none(),
                    "offset {o} acknowledged for two messages"
                );
            }
            for (t, got) in read.iter().enumerate() {
                let name = TOPICS[t];
                // Exactly the acknowledged messages of the topic, each at its acknowledged
                // offset, nothing twice.
                let want: Vec<(Offset, Bytes)> = acked_at
                    .iter()
                    .filter(|(_, (topic, _))| *topic == t)
                    .map(|(o, (_, m))| (*o, m.clone()))
                    .collect();
                assert_eq!(got.len(), want.len(), "{name}: message count read");
                assert!(
                    got.windows(2).all(|w| w[0].0 < w[1].0),
                    "{name}: offsets increase"
                );
                if *got != want {
                    let first = got.iter().zip(&want).position(|(a, b)| a != b);
                    panic!("{name}: read differs from acknowledged at index {first:?}");
                }
                // Each producer's messages in its send order.
                let mut last: HashMap<usize, usize> = HashMap::new();
                for (_, m) in got {
                    let (p, i) = parse(m);
                    if let Some(prev) = last.insert(p, i) {
                        assert!(prev < i, "{name}: producer {p} message {i} after {prev}");
                    }
                }
            }
            // The cursors the consumers committed lead past everything they read.
            for (t, got) in read.iter().enumerate() {
                let mut again = Consumer::subscribe(
                    brokers.clone(),
                    TOPICS[t],
                    cursor_name(t),
                    consumer_config(),
                )
                .await
                .expect("subscribed again");
                let last = got.last().map(|(o, _)| *o).expect("the topic has messages");
                assert!(
                    again.position() > last,
                    "{}: cursor at {}",
                    TOPICS[t],
                    again.position()
                );
                assert!(
                    again.poll().await.expect("fetch").is_empty(),
                    "{}: nothing after the cursor",
                    TOPICS[t]
                );
            }
        })
        .await
        .expect("the scenario finishes in bounded time");
    });
    drop(rt);
    drop(cluster);
}
