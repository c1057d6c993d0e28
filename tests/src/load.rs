//! Continuous producers against whichever broker serves ([`LoadDriver`]) and the
//! exactly-once check of what they were acknowledged.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_proto::{ErrorCode, Offset};

use crate::client::{payload, produce_answer, produce_request, Client};
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
    /// Starts producers `first_producer..first_producer + producers` on topic `t`.
    pub fn start(broker_addrs: Vec<String>, first_producer: u64, producers: u64) -> LoadDriver {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (first_producer..first_producer + producers)
            .map(|p| {
                let stop = stop.clone();
                let addrs = broker_addrs.clone();
                std::thread::spawn(move || run_producer(&addrs, p, &stop))
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

fn serving_master(addrs: &[String]) -> Option<(usize, Client)> {
    addrs.iter().enumerate().find_map(|(i, a)| {
        let mut c = Client::connect_with(a, PROBE_WAIT).ok()?;
        let m = c.metadata().ok()?;
        let me = m.master.as_ref()?;
        (me.addr == *a && c.is_serving()).then_some((i, c))
    })
}

fn run_producer(addrs: &[String], p: u64, stop: &std::sync::atomic::AtomicBool) -> ProducerOutcome {
    let mut out = ProducerOutcome::default();
    let mut seq = 0u64;
    let deadline = Instant::now() + WAIT * 4;
    'outer: loop {
        assert!(Instant::now() < deadline, "producer {p} made no progress");
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        let Some((broker, mut c)) = serving_master(addrs) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        loop {
            match c
                .request(produce_request("t", p, seq, LOAD_BATCH))
                .map(produce_answer)
            {
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
