//! Multi-process tests of the broker's data path and failover with the real binaries on
//! loopback: 3 stores (`quire-node`) and 2 brokers (`quire-broker`), a minimal producer
//! and consumer speaking quire-proto frames. Bounded in time; no timing assertions.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use quire_proto::{Body, BrokerId, ErrorCode, MetadataResponse, Offset};
use quire_tests::{
    fetch_all, payload, produce_answer, produce_request, Client, Cluster, Timing, WAIT,
};

const TOPIC: &str = "orders";

/// Produces messages `from..to` of producer `p` in batches of `batch`, `window` requests
/// in flight, to whichever broker is master; a batch that fails (NotMaster, a lost
/// connection, NoQuorum) is resent with the same sequence until acked. Returns the offset
/// of every acked message by sequence. `between` runs after each acked batch (to inject
/// faults mid-load).
fn produce(
    cluster: &mut Cluster,
    p: u64,
    from: u64,
    to: u64,
    batch: u64,
    mut between: impl FnMut(&mut Cluster, u64),
) -> BTreeMap<u64, Offset> {
    let window = 8;
    let mut acked: BTreeMap<u64, Offset> = BTreeMap::new();
    let mut todo: VecDeque<u64> = (from..to).step_by(batch as usize).collect();
    let deadline = Instant::now() + WAIT * 2;
    'outer: while !todo.is_empty() {
        assert!(
            Instant::now() < deadline,
            "producing did not finish in time"
        );
        let master = cluster.wait_for_master();
        let addr = cluster.broker(master).addr.clone();
        let Ok(mut c) = Client::connect(&addr) else {
            continue;
        };
        let mut inflight: VecDeque<(u64, u64)> = VecDeque::new();
        loop {
            while inflight.len() < window {
                let Some(seq) = todo.pop_front() else { break };
                let n = batch.min(to - seq);
                match c.send(produce_request(TOPIC, p, seq, n)) {
                    Ok(id) => inflight.push_back((id, seq)),
                    Err(_) => {
                        todo.push_front(seq);
                        break;
                    }
                }
            }
            let Some((id, seq)) = inflight.pop_front() else {
                break 'outer;
            };
            let n = batch.min(to - seq);
            match c.recv(id).map(produce_answer) {
                Ok(Ok(r)) => {
                    assert_eq!(u64::from(r.count), n);
                    for i in 0..n {
                        let o = Offset(r.base_offset.0 + i);
                        if let Some(prev) = acked.insert(seq + i, o) {
                            assert_eq!(prev, o, "a retried batch must get its original offsets");
                        }
                    }
                    between(cluster, seq + n);
                }
                Ok(Err(e)) => {
                    assert!(
                        matches!(
                            e.code,
                            ErrorCode::NotMaster | ErrorCode::NoQuorum | ErrorCode::Timeout
                        ),
                        "unexpected produce error {e:?}"
                    );
                    // Resend this batch and everything after it, in order.
                    let mut again: Vec<u64> = vec![seq];
                    again.extend(inflight.iter().map(|&(_, s)| s));
                    for s in again.into_iter().rev() {
                        todo.push_front(s);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    continue 'outer;
                }
                Err(_) => {
                    let mut again: Vec<u64> = vec![seq];
                    again.extend(inflight.iter().map(|&(_, s)| s));
                    for s in again.into_iter().rev() {
                        todo.push_front(s);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    continue 'outer;
                }
            }
        }
    }
    acked
}

/// Checks that `fetched` holds every acked message exactly once, at its acked offset,
/// in offset order, with the right payload.
fn check_exactly_once(p: u64, acked: &BTreeMap<u64, Offset>, fetched: &[(Offset, bytes::Bytes)]) {
    for w in fetched.windows(2) {
        assert!(w[0].0 < w[1].0, "fetch returns increasing offsets");
    }
    let by_offset: BTreeMap<Offset, &bytes::Bytes> = fetched.iter().map(|(o, b)| (*o, b)).collect();
    for (&seq, &o) in acked {
        let got = by_offset
            .get(&o)
            .unwrap_or_else(|| panic!("acked message {seq} at offset {o} is missing"));
        assert_eq!(**got, payload(p, seq), "offset {o} holds another payload");
    }
    let mut seen = std::collections::BTreeSet::new();
    for (_, b) in fetched {
        assert!(seen.insert(b.clone()), "message {b:?} delivered twice");
    }
}

fn metadata(addr: &str) -> MetadataResponse {
    Client::connect(addr)
        .and_then(|mut c| c.metadata())
        .expect("metadata")
}

#[test]
fn proc_cluster_elects_a_master_produces_and_survives_a_store_kill() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 2, Timing::default());
    cluster.start_all();
    let master = cluster.settle();
    let slave = if master == 1 { 2 } else { 1 };

    // Every broker names the same master; the voters were bound at bootstrap.
    let m = metadata(&cluster.broker(slave).addr.clone());
    assert_eq!(m.master.map(|b| b.id), Some(BrokerId(master)));
    let mm = metadata(&cluster.broker(master).addr.clone());
    assert_eq!(mm.stores.len(), 3);
    assert!(
        mm.stores.iter().all(|s| s.voter && s.store_id.0 != 0),
        "{mm:?}"
    );

    // Produce 3000 messages; kill -9 one store a third of the way through.
    let mut killed = false;
    let acked = produce(&mut cluster, 7, 0, 3000, 50, |c, done| {
        if !killed && done >= 1000 {
            c.stores[2].kill9();
            killed = true;
        }
    });
    assert!(killed);
    assert_eq!(acked.len(), 3000);

    // Read them back from the master: exactly once, in order.
    let addr = cluster.broker(cluster.wait_for_master()).addr.clone();
    let mut c = Client::connect(&addr).expect("connect");
    let fetched = fetch_all(&mut c, TOPIC, 3000);
    assert_eq!(fetched.len(), 3000);
    check_exactly_once(7, &acked, &fetched);

    // A retried batch gets its original offsets, and nothing is written twice.
    let again = produce_answer(
        c.request(quire_tests::produce_request(TOPIC, 7, 1000, 50))
            .expect("answer"),
    )
    .expect("a retry is answered");
    assert_eq!(again.base_offset, acked[&1000]);
    let fetched = fetch_all(&mut c, TOPIC, 3000);
    assert_eq!(fetched.len(), 3000, "the retry wrote nothing");

    // The slave learns the HWM from the master's stream.
    let hwm = metadata(&addr).hwm;
    let deadline = Instant::now() + WAIT;
    loop {
        let s = metadata(&cluster.broker(slave).addr.clone());
        if s.hwm >= hwm {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slave never caught up: {s:?} vs {hwm:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The killed store comes back and catches up.
    cluster.stores[2].start();
    let end = metadata(&addr).hwm;
    let deadline = Instant::now() + WAIT;
    loop {
        let m = metadata(&addr);
        if m.stores[2].persisted >= end {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted store did not catch up: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn proc_master_kill_the_slave_takes_over_with_every_acked_message() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 2, Timing::default());
    cluster.start_all();
    let first = cluster.settle();
    let acked = produce(&mut cluster, 3, 0, 2000, 40, |_, _| {});
    assert_eq!(acked.len(), 2000);

    // Kill -9 the master in the middle of more load.
    let mut killed = false;
    let more = produce(&mut cluster, 3, 2000, 4000, 40, |c, done| {
        if !killed && done >= 2600 {
            c.broker(first).kill9();
            killed = true;
        }
    });
    assert!(killed);
    let second = cluster.wait_for_master();
    assert_ne!(second, first, "the slave took over");

    let mut all = acked;
    all.extend(more);
    assert_eq!(all.len(), 4000);
    let addr = cluster.broker(second).addr.clone();
    let mut c = Client::connect(&addr).expect("connect");
    let fetched = fetch_all(&mut c, TOPIC, 4000);
    check_exactly_once(3, &all, &fetched);
    assert_eq!(
        fetched.len(),
        4000,
        "nothing more than what was acked (each batch acked)"
    );

    // The old master restarts and rejoins as a slave that follows the new master.
    cluster.broker(first).start();
    let hwm = metadata(&addr).hwm;
    cluster.wait_rejoined(first, hwm);
    // And answers clients with the master's address.
    let mut old = Client::connect(&cluster.broker(first).addr.clone()).expect("connect");
    match old
        .request(quire_tests::produce_request(TOPIC, 3, 4000, 1))
        .expect("answer")
    {
        Body::ErrorResponse(e) => assert_eq!(e.code, ErrorCode::NotMaster),
        other => panic!("a slave answered a produce with {other:?}"),
    }
}

#[test]
fn proc_a_restarted_broker_rebuilds_everything_from_the_stores() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 2, Timing::default());
    cluster.start_all();
    cluster.settle();
    // More events than one takeover fetch (4096) carries.
    let acked = produce(&mut cluster, 11, 0, 10_000, 200, |_, _| {});
    assert_eq!(acked.len(), 10_000);
    let master = cluster.wait_for_master();
    let slave = if master == 1 { 2 } else { 1 };
    // Both brokers die; the slave comes back alone with nothing in memory: it takes over by
    // fetching the whole log from the stores and rebuilds the broker state from it.
    cluster.broker(master).kill9();
    cluster.broker(slave).kill9();
    cluster.broker(slave).start();
    let leader = cluster.wait_for_master();
    assert_eq!(leader, slave);
    let mut c = Client::connect(&cluster.broker(slave).addr.clone()).expect("connect");
    let fetched = fetch_all(&mut c, TOPIC, 10_000);
    assert_eq!(fetched.len(), 10_000);
    check_exactly_once(11, &acked, &fetched);
    // The rebuilt idempotent-producer table still answers a retry with its offsets.
    let again = produce_answer(
        c.request(quire_tests::produce_request(TOPIC, 11, 9_800, 200))
            .expect("answer"),
    )
    .expect("a retry is answered");
    assert_eq!(again.base_offset, acked[&9_800]);
}
