//! Continuous producers against whichever broker serves ([`LoadDriver`]) and the
//! exactly-once check of what they were acknowledged.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_proto::{Epoch, ErrorCode, Offset};

use crate::client::{payload, produce_answer, produce_request, Client};
use crate::cluster::{BrokerHandle, Cluster};
use crate::history::{Attempt, History};
use crate::{PROBE_WAIT, WAIT};

/// What one continuous producer of [`LoadDriver`] saw.
#[derive(Debug, Default)]
pub struct ProducerOutcome {
    /// Sequence → the offset its message was acknowledged at (a retry of a batch must get the
    /// same offsets: checked as it runs).
    pub acked: std::collections::BTreeMap<u64, Offset>,
    /// `NotMaster` answers (retried at the master found next).
    pub not_master: u64,
    /// Lost connections and unanswered requests (retried).
    pub transport: u64,
    /// Every other error answer: code and message.
    pub errors: Vec<(ErrorCode, String)>,
    /// When each acknowledgement arrived, and from which broker (index in the addresses).
    pub ack_times: Vec<(Instant, usize)>,
}

/// Producers that send batches of 10 continuously, one request in flight each, to
/// whichever broker serves; a failed batch is resent with the same sequence (idempotent
/// produce) until acknowledged, after the producer is stopped too.
#[derive(Debug)]
pub struct LoadDriver {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<ProducerOutcome>>,
}

/// Messages per batch of a [`LoadDriver`] producer.
pub const LOAD_BATCH: u64 = 10;

impl LoadDriver {
    /// Starts producers `first_producer..first_producer + producers` on topic `t`, sending
    /// to `cluster`'s brokers; every attempt is recorded in the cluster's history.
    pub fn start(cluster: &Cluster, first_producer: u64, producers: u64) -> LoadDriver {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let brokers = cluster.broker_handles();
        let threads = (first_producer..first_producer + producers)
            .map(|p| {
                let stop = stop.clone();
                let brokers = brokers.clone();
                let history = cluster.history.clone();
                std::thread::spawn(move || run_producer(&brokers, &history, p, &stop))
            })
            .collect();
        LoadDriver { stop, threads }
    }

    /// Stops the producers (each finishes its batch in flight) and returns what each saw.
    pub fn stop(self) -> Vec<ProducerOutcome> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.threads
            .into_iter()
            .map(|t| t.join().expect("a producer thread panicked"))
            .collect()
    }
}

/// The first broker that says it is the master and serves: its index in `brokers`, a
/// connection to it (reads time out after [`PROBE_WAIT`]: a produce answered later is
/// retried on a new connection), its incarnation and epoch.
pub fn serving_master(brokers: &[BrokerHandle]) -> Option<(usize, Client, u32, Epoch)> {
    brokers.iter().enumerate().find_map(|(i, b)| {
        let mut c = Client::connect_with(&b.addr, PROBE_WAIT).ok()?;
        let incarnation = b.incarnation();
        let m = c.metadata().ok()?;
        let me = m.master.as_ref()?;
        if me.addr != b.addr || !c.is_serving() {
            return None;
        }
        Some((i, c, incarnation, m.epoch))
    })
}

fn run_producer(
    brokers: &[BrokerHandle],
    history: &History,
    p: u64,
    stop: &std::sync::atomic::AtomicBool,
) -> ProducerOutcome {
    let mut out = ProducerOutcome::default();
    let mut seq = 0u64;
    let deadline = Instant::now() + WAIT * 4;
    'outer: loop {
        assert!(Instant::now() < deadline, "producer {p} made no progress");
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        let Some((broker, mut c, incarnation, epoch)) = serving_master(brokers) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        loop {
            let req = produce_request("t", p, seq, LOAD_BATCH);
            let answer = c.request(req.clone()).map(produce_answer);
            history.record(Attempt::of(
                &req,
                &brokers[broker],
                incarnation,
                Some(epoch),
                &answer,
            ));
            match answer {
                Ok(Ok(r)) => {
                    assert_eq!(u64::from(r.count), LOAD_BATCH, "producer {p} batch {seq}");
                    for i in 0..LOAD_BATCH {
                        let o = Offset(r.base_offset.0 + i);
                        if let Some(prev) = out.acked.insert(seq + i, o) {
                            assert_eq!(prev, o, "producer {p}: a retry got other offsets");
                        }
                    }
                    out.ack_times.push((Instant::now(), broker));
                    seq += LOAD_BATCH;
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break 'outer;
                    }
                }
                Ok(Err(e)) if e.code == ErrorCode::NotMaster => {
                    out.not_master += 1;
                    continue 'outer;
                }
                Ok(Err(e)) => {
                    out.errors.push((e.code, e.message));
                    continue 'outer;
                }
                Err(_) => {
                    out.transport += 1;
                    continue 'outer;
                }
            }
        }
    }
    out
}

/// Checks that every acknowledged message of every producer is in `fetched` exactly once,
/// at its acknowledged offset, and in each producer's order; no offset holds two events.
pub fn check_exactly_once(
    outcomes: &[ProducerOutcome],
    first_producer: u64,
    fetched: &[(Offset, Bytes)],
) {
    let by_offset: std::collections::BTreeMap<Offset, &Bytes> =
        fetched.iter().map(|(o, b)| (*o, b)).collect();
    assert_eq!(by_offset.len(), fetched.len(), "no offset served twice");
    let mut seen: HashMap<&Bytes, usize> = HashMap::new();
    for (_, b) in fetched {
        *seen.entry(b).or_default() += 1;
    }
    for (i, o) in outcomes.iter().enumerate() {
        let p = first_producer + i as u64;
        let mut last = None;
        for (&seq, off) in &o.acked {
            let want = payload(p, seq);
            assert_eq!(
                by_offset.get(off).map(|b| (*b).clone()),
                Some(want.clone()),
                "producer {p}: acked message {seq} at {off:?}"
            );
            assert_eq!(
                seen.get(&want),
                Some(&1),
                "producer {p}: message {seq} exactly once"
            );
            assert!(last < Some(*off), "producer {p}: offsets follow sequences");
            last = Some(*off);
        }
    }
}

/// A consumer that reads topic `t` from offset 0 continuously, from whichever broker serves
/// (following failovers: it resumes at the next offset it wants on the new master), and
/// keeps every `(offset, message)` it was served, for [`crate::Cluster::check`].
#[derive(Debug)]
pub struct ConsumerDriver {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(Offset, Bytes)>>,
}

/// Longest a fetch of [`ConsumerDriver`] is held by the broker waiting for new messages.
const CONSUMER_FETCH_WAIT_MS: u32 = 200;

impl ConsumerDriver {
    /// Starts reading `topic` from offset 0.
    pub fn start(cluster: &Cluster, topic: &str) -> ConsumerDriver {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let brokers = cluster.broker_handles();
        let topic = topic.to_owned();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || run_consumer(&brokers, &topic, &flag));
        ConsumerDriver { stop, thread }
    }

    /// Stops reading; returns what was served, in order.
    pub fn stop(self) -> Vec<(Offset, Bytes)> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("the consumer thread panicked")
    }
}

fn run_consumer(
    brokers: &[BrokerHandle],
    topic: &str,
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<(Offset, Bytes)> {
    let mut reads = Vec::new();
    let mut next = Offset(0);
    // Bounded like the producers: a consumer that cannot find a master for this long fails.
    let mut last_progress = Instant::now();
    'outer: while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            last_progress.elapsed() < WAIT * 2,
            "the consumer found no serving broker for {:?}",
            WAIT * 2
        );
        let Some((_, mut c, _, _)) = serving_master(brokers) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let answer = c.request(quire_proto::FetchRequest {
                records: false,
                topic: topic.into(),
                from_offset: next,
                max_messages: 1000,
                max_bytes: 1 << 20,
                wait_ms: CONSUMER_FETCH_WAIT_MS,
            });
            match answer {
                Ok(quire_proto::Body::FetchResponse(r)) => {
                    assert!(r.next_offset >= next, "next_offset never goes back");
                    next = r.next_offset;
                    reads.extend(r.messages);
                    last_progress = Instant::now();
                }
                // NotMaster, a lost connection, a timeout: find the master again.
                _ => continue 'outer,
            }
        }
    }
    reads
}
