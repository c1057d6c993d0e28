//! Graceful handoff on the real binaries (3 stores, 3 brokers, loopback): the master is asked
//! to hand over to a named slave while 4 producers send continuously.
//!
//! Fault: none — an operator's planned handoff under load. What must survive: every
//! acknowledged message, once, at its acknowledged offset, in each producer's order; no
//! producer gets an error answer other than a retriable `NotMaster` (which points at the
//! target, and the quire-client producer retries without surfacing it); the target is the
//! master afterwards and the old master follows it.

mod common;

use std::time::{Duration, Instant};

use common::{check_exactly_once, fetch_all, Client, Cluster, LoadDriver, Timing, WAIT};
use quire_proto::{Body, BrokerId, ErrorCode, HandoffRequest};

#[test]
fn proc_handoff_under_load_loses_nothing_and_producers_see_no_error() {
    let mut cluster = Cluster::new(3, 3, Timing::default());
    cluster.start_all();
    let old = cluster.settle();
    let target = (1..=3u16).find(|&b| b != old).expect("three brokers");
    let addrs: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    let load = LoadDriver::start(addrs, 1, 4);
    std::thread::sleep(Duration::from_millis(500));

    // A handoff to a broker that is not in the cluster, or asked of a slave, is refused.
    let old_addr = cluster.broker(old).addr.clone();
    let mut admin = Client::connect_with(&old_addr, WAIT).expect("connect");
    match admin.request(HandoffRequest { to: BrokerId(9) }) {
        Ok(Body::ErrorResponse(e)) => assert_eq!(e.code, ErrorCode::InvalidName),
        other => panic!("unknown target: {other:?}"),
    }
    let mut slave = Client::connect(&cluster.broker(target).addr.clone()).expect("connect");
    match slave.request(HandoffRequest { to: BrokerId(old) }) {
        Ok(Body::ErrorResponse(e)) => assert_eq!(e.code, ErrorCode::NotMaster),
        other => panic!("handoff asked of a slave: {other:?}"),
    }

    let asked = Instant::now();
    let done = match admin.request(HandoffRequest {
        to: BrokerId(target),
    }) {
        Ok(Body::HandoffResponse(r)) => r,
        other => panic!("handoff failed: {other:?}"),
    };
    let answered = asked.elapsed();
    assert_eq!(done.master, BrokerId(target));
    assert_eq!(done.epoch.broker(), BrokerId(target));
    std::thread::sleep(Duration::from_millis(500));
    let outcomes = load.stop();

    assert_eq!(
        cluster.wait_for_master(),
        target,
        "the target is the master"
    );
    let m = Client::connect(&old_addr)
        .and_then(|mut c| c.metadata())
        .expect("metadata");
    assert_eq!(
        m.master.map(|b| b.id),
        Some(BrokerId(target)),
        "the old master follows"
    );

    let mut acked_total = 0;
    for (i, o) in outcomes.iter().enumerate() {
        assert!(
            o.errors.is_empty(),
            "producer {}: errors {:?}",
            i + 1,
            o.errors
        );
        assert_eq!(o.transport, 0, "producer {}: lost connections", i + 1);
        assert!(!o.acked.is_empty(), "producer {} acked nothing", i + 1);
        acked_total += o.acked.len();
    }
    // The longest gap between two acknowledgements of any producer around the handoff.
    let pause_max = outcomes
        .iter()
        .flat_map(|o| o.ack_times.windows(2).map(|w| w[1].0 - w[0].0))
        .max()
        .unwrap_or_default();
    let not_master: u64 = outcomes.iter().map(|o| o.not_master).sum();
    eprintln!(
        "handoff: broker {old} -> {target}: answered after {answered:?}, pause reported {} µs, longest producer ack gap {pause_max:?}, {not_master} NotMaster answers retried, {acked_total} messages acked",
        done.pause_us
    );

    let mut c = Client::connect(&cluster.broker(target).addr.clone()).expect("connect");
    let fetched = fetch_all(&mut c, "t", acked_total);
    check_exactly_once(&outcomes, 1, &fetched);
    let metrics = cluster.broker(old).scrape();
    assert!(metrics.contains("quire_handoffs_total 1"), "{metrics}");
    assert!(metrics.contains("quire_handoff_duration_seconds_count 1"));
}
