//! A master that dies between "stabilized on Qa stores" and "producer acked", on the real
//! binaries (3 stores, 2 brokers, loopback).
//!
//! How the interleaving is forced: the test sends one produce, waits a chosen delay (0 to
//! 2 ms, varied per attempt), and SIGSTOPs the master. It then asks every store for its tail
//! (`TailRequest`): if at least Qa = 2 stores hold the new event durably and the producer has
//! no answer, the master is stopped exactly between the two steps, and it is killed -9 there.
//! (An attempt that stopped the master too early or too late is resumed with SIGCONT and the
//! next one uses another producer id.) What must survive: the producer's retry (same producer
//! id and sequence) at the new master is answered with the offset the stores hold the event
//! at, and a consumer finds the message exactly once, at that offset.

use std::time::{Duration, Instant};

use quire_proto::{Body, Offset, TailRequest};
use quire_tests::{
    fetch_all, payload, produce_answer, produce_request, Client, Cluster, Timing, WAIT,
};

const ATTEMPTS_MAX: u64 = 60;

fn tails(cluster: &Cluster) -> Vec<Option<Offset>> {
    cluster
        .stores
        .iter()
        .map(|s| {
            let mut c = Client::connect_with(&s.addr, WAIT).expect("connect to a store");
            match c.request(TailRequest) {
                Ok(Body::TailResponse(t)) => t.last.map(|l| l.offset),
                other => panic!("tail: {other:?}"),
            }
        })
        .collect()
}

#[test]
fn proc_master_killed_after_stabilized_before_ack_retry_gets_the_original_offset() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 2, Timing::default());
    cluster.start_all();
    let master = cluster.settle();
    let addr = cluster.broker(master).addr.clone();
    let pid = cluster.broker(master).pid().expect("the master runs");
    let delays_us = [0u64, 100, 200, 300, 500, 700, 1000, 1500, 2000];
    let mut hit = None;
    for attempt in 0..ATTEMPTS_MAX {
        let p = 100 + attempt;
        let before = tails(&cluster);
        let mut c = Client::connect_with(&addr, Duration::from_millis(200)).expect("connect");
        let id = c.send(produce_request("t", p, 0, 1)).expect("send");
        let delay = Duration::from_micros(delays_us[attempt as usize % delays_us.len()]);
        let t0 = Instant::now();
        while t0.elapsed() < delay {
            std::hint::spin_loop();
        }
        quire_tests::stop(pid);
        // A sleep on purpose: the appends the master sent before it stopped land on the
        // stores (nothing says none is left in flight); a read too early is only a miss.
        std::thread::sleep(Duration::from_millis(50));
        let after = tails(&cluster);
        // The stores that hold an event no store held before: a store still catching up
        // (its tail rising below the others') is not one of them.
        let high = before.iter().flatten().max().copied();
        let held: Vec<Offset> = after
            .iter()
            .flatten()
            .filter(|&&a| Some(a) > high)
            .copied()
            .collect();
        let answered = c.recv(id).is_ok();
        if held.len() >= 2 && !answered {
            assert!(
                held.windows(2).all(|w| w[0] == w[1]),
                "one new event: {held:?}"
            );
            hit = Some((p, held[0], attempt));
            break;
        }
        quire_tests::signal(pid, libc::SIGCONT);
        if !answered {
            let mut c2 = Client::connect(&addr).expect("connect");
            let r = c2
                .request(produce_request("t", p, 0, 1))
                .map(produce_answer);
            assert!(matches!(r, Ok(Ok(_))), "attempt {attempt}: {r:?}");
        }
    }
    let (p, offset, attempt) = hit.expect("never stopped the master between stabilized and acked");
    cluster.broker(master).kill9();
    let new = cluster.wait_for_master();
    assert_ne!(new, master);
    let r = cluster.produce_acked(&produce_request("t", p, 0, 1));
    assert_eq!(
        r.base_offset, offset,
        "the retry is answered with the original offset"
    );
    let mut c = Client::connect(&cluster.broker(new).addr.clone()).expect("connect");
    let fetched = fetch_all(
        &mut c,
        "t",
        usize::try_from(attempt + 1).unwrap_or(usize::MAX),
    );
    let copies: Vec<Offset> = fetched
        .iter()
        .filter(|(_, b)| *b == payload(p, 0))
        .map(|(o, _)| *o)
        .collect();
    assert_eq!(copies, vec![offset], "the message once, at its offset");
    eprintln!("stopped between stabilized and acked at attempt {attempt}; retry got {offset:?}");
}
