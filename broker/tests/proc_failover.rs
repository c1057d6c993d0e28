//! Multi-process failover tests with the real binaries: a stopped (SIGSTOP) master that
//! wakes up after a slave took over, and three brokers where two slaves race for a dead
//! master's place.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use quire_proto::{Body, BrokerId, ErrorCode, Offset};
use quire_tests::{
    fetch_all, payload, produce_answer, produce_request, Client, Cluster, Timing, WAIT,
};

/// Produces `count` messages of producer `p` from `from` in batches of 20, one request at
/// a time, to whichever broker serves, retrying a batch (same sequence) until it is acked.
fn produce_all(cluster: &mut Cluster, p: u64, from: u64, count: u64) -> BTreeMap<u64, Offset> {
    produce_batches(cluster, p, from, count, 20)
}

/// [`produce_all`] with batches of `batch` messages (a retry resends the same batches).
fn produce_batches(
    cluster: &mut Cluster,
    p: u64,
    from: u64,
    count: u64,
    batch: u64,
) -> BTreeMap<u64, Offset> {
    let mut acked = BTreeMap::new();
    let mut seq = from;
    let deadline = Instant::now() + WAIT;
    while seq < from + count {
        assert!(Instant::now() < deadline, "producing did not finish");
        let master = cluster.wait_for_master();
        let Ok(mut c) = Client::connect(&cluster.broker(master).addr.clone()) else {
            continue;
        };
        while seq < from + count {
            let n = batch.min(from + count - seq);
            match c
                .request(produce_request("t", p, seq, n))
                .map(produce_answer)
            {
                Ok(Ok(r)) => {
                    for i in 0..n {
                        acked.insert(seq + i, Offset(r.base_offset.0 + i));
                    }
                    seq += n;
                }
                _ => break,
            }
        }
    }
    acked
}

fn check(p: u64, acked: &BTreeMap<u64, Offset>, fetched: &[(Offset, bytes::Bytes)]) {
    let by_offset: BTreeMap<Offset, &bytes::Bytes> = fetched.iter().map(|(o, b)| (*o, b)).collect();
    assert_eq!(by_offset.len(), fetched.len(), "no offset twice");
    for (&seq, o) in acked {
        assert_eq!(
            by_offset.get(o).map(|b| (*b).clone()),
            Some(payload(p, seq)),
            "acked message {seq} at {o}"
        );
    }
    let mut payloads: Vec<&bytes::Bytes> = fetched.iter().map(|(_, b)| b).collect();
    payloads.sort();
    payloads.dedup();
    assert_eq!(payloads.len(), fetched.len(), "no message twice");
}

fn signal(b: &quire_tests::BrokerNode, sig: i32) {
    quire_tests::signal(b.pid().expect("the broker runs"), sig);
}

/// The produce is sent only once every thread of the old master is stopped: session 1 saw
/// this test "fail" about half the time because kill(2) returns before the target's threads
/// stop, so the master could still take the produce, append it to the stores and freeze
/// before the acks came back. The new master then rightly adopted those events (they were
/// on Qa stores before the fence) and the woken master's ack of them was correct; the test,
/// not the broker, was wrong. `quire_tests::stop` closes that window.
#[test]
fn proc_a_stopped_master_wakes_up_fenced_acks_nothing_and_follows() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 2, Timing::default());
    cluster.start_all();
    let old = cluster.settle();
    let acked = produce_all(&mut cluster, 1, 0, 200);

    // Freeze the master past the election timeout; send it a produce while it is frozen.
    let old_addr = cluster.broker(old).addr.clone();
    let mut frozen = Client::connect(&old_addr).expect("connect");
    quire_tests::stop(cluster.broker(old).pid().expect("the broker runs"));
    let stale = frozen.send(produce_request("t", 2, 0, 5)).expect("send");
    let new = {
        let deadline = Instant::now() + WAIT;
        loop {
            let serving = cluster
                .brokers
                .iter()
                .filter(|b| b.id != old)
                .find(|b| {
                    Client::connect_with(&b.addr, quire_tests::PROBE_WAIT)
                        .is_ok_and(|mut c| c.is_serving())
                })
                .map(|b| b.id);
            if let Some(id) = serving {
                break id;
            }
            assert!(Instant::now() < deadline, "no slave took over");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let more = produce_all(&mut cluster, 1, 200, 200);

    // Wake the old master: it learns the higher epoch from the stores, acks nothing, and
    // follows the new master.
    signal(cluster.broker(old), libc::SIGCONT);
    match frozen.recv(stale).expect("an answer") {
        Body::ErrorResponse(e) => assert_eq!(e.code, ErrorCode::NotMaster, "{e:?}"),
        other => panic!("a fenced master answered {other:?}"),
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let m = Client::connect(&old_addr)
            .and_then(|mut c| c.metadata())
            .expect("metadata");
        if m.master.as_ref().map(|b| b.id) == Some(BrokerId(new)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old master did not follow: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut all = acked;
    all.extend(more);
    let mut c = Client::connect(&cluster.broker(new).addr.clone()).expect("connect");
    let fetched = fetch_all(&mut c, "t", 400);
    check(1, &all, &fetched);
    assert!(
        !fetched.iter().any(|(_, b)| *b == payload(2, 0)),
        "the produce sent to the frozen master must not be in the log as acked"
    );
}

#[test]
fn proc_three_brokers_two_slaves_race_and_one_wins() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 3, Timing::default());
    cluster.start_all();
    let first = cluster.settle();
    let acked = produce_all(&mut cluster, 4, 0, 300);
    cluster.broker(first).kill9();
    let took_over = cluster.wait_for_master();
    assert_ne!(took_over, first);
    let more = produce_all(&mut cluster, 4, 300, 300);
    // The third broker follows the winner. The winner is the master both slaves agree on,
    // not necessarily the first one seen serving: when both stood, the higher epoch may
    // depose the first winner a moment later (a race the protocol allows; what was acked
    // is checked below either way).
    let second = cluster.wait_agreed_master();
    assert_ne!(second, first);
    let third = (1..=3u16)
        .find(|&b| b != first && b != second)
        .expect("three brokers");
    // Kill the second master too: the last broker takes over with everything.
    cluster.broker(second).kill9();
    let last = cluster.wait_for_master();
    assert_eq!(last, third);
    let mut all = acked;
    all.extend(more);
    let mut c = Client::connect(&cluster.broker(third).addr.clone()).expect("connect");
    let fetched = fetch_all(&mut c, "t", 600);
    assert_eq!(fetched.len(), 600);
    check(4, &all, &fetched);
}

#[test]
fn proc_repeated_master_kills_under_load_lose_nothing() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 3, Timing::default());
    cluster.start_all();
    cluster.settle();
    let mut all = BTreeMap::new();
    let mut seq = 0u64;
    for round in 0..5u64 {
        // Load, then kill the master in the middle of more load, restart it as a slave.
        all.extend(produce_all(&mut cluster, 8, seq, 150));
        seq += 150;
        let master = cluster.wait_for_master();
        let addr = cluster.broker(master).addr.clone();
        let mut c = Client::connect(&addr).expect("connect");
        let mut ids = Vec::new();
        for i in 0..5 {
            ids.push((
                seq + i * 10,
                c.send(produce_request("t", 8, seq + i * 10, 10))
                    .expect("send"),
            ));
        }
        cluster.broker(master).kill9();
        // Whatever was acked before the kill counts; the rest is resent (same sequences).
        for (s, id) in ids {
            if let Ok(Ok(r)) = c.recv(id).map(produce_answer) {
                for i in 0..10 {
                    all.insert(s + i, Offset(r.base_offset.0 + i));
                }
            }
        }
        // The same batches as before the kill (a retry resends the same batch).
        let resent = produce_batches(&mut cluster, 8, seq, 50, 10);
        for (s, o) in resent {
            if let Some(prev) = all.insert(s, o) {
                assert_eq!(
                    prev, o,
                    "round {round}: a retry of an acked batch got other offsets"
                );
            }
        }
        seq += 50;
        cluster.broker(master).start();
    }
    let master = cluster.wait_for_master();
    let mut c = Client::connect(&cluster.broker(master).addr.clone()).expect("connect");
    let fetched = fetch_all(&mut c, "t", all.len());
    assert_eq!(fetched.len(), all.len(), "every acked message, once");
    check(8, &all, &fetched);
}
