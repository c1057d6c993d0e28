//! Repeated kill -9 of the master under continuous load, on the real binaries (3 stores,
//! 3 brokers, loopback, the brokers' default timeouts: heartbeat_ms 100,
//! election_timeout_ms 1000).
//!
//! Fault: the master is killed -9 ten times while 4 producers send continuously; each killed
//! broker is restarted, must rejoin as a slave of the new master, and the new master is the
//! next one killed. What must survive: every acknowledged message, exactly once, at its
//! acknowledged offset, in each producer's order (a resent batch gets its original offsets);
//! a consumer reads all of them; no offset holds two payloads; every master has a new epoch.
//! The failover time (kill → first acknowledgement by another broker) is printed per kill,
//! with p50 and max; nothing is asserted about it.

use std::time::{Duration, Instant};

use quire_proto::BrokerId;
use quire_tests::{check_exactly_once, fetch_all, Client, Cluster, LoadDriver, Timing, WAIT};

const KILLS: usize = 10;

#[test]
fn proc_ten_master_kills_under_four_producers_lose_nothing() {
    let timing = Timing {
        heartbeat_ms: 100,
        election_timeout_ms: 1000,
        produce_timeout_ms: 10_000,
    };
    let mut cluster = Cluster::new(3, 3, timing);
    cluster.start_all();
    cluster.settle();
    let addrs: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    let load = LoadDriver::start(addrs.clone(), 1, 4);
    let mut kills = Vec::new();
    let mut epochs = Vec::new();
    for round in 0..KILLS {
        std::thread::sleep(Duration::from_millis(300));
        let master = cluster.wait_for_master();
        let m = Client::connect(&cluster.broker(master).addr.clone())
            .and_then(|mut c| c.metadata())
            .expect("metadata");
        epochs.push(m.epoch);
        cluster.broker(master).kill9();
        let killed_at = Instant::now();
        kills.push((killed_at, master));
        let next = cluster.wait_for_master();
        assert_ne!(next, master, "round {round}");
        cluster.broker(master).start();
        // The restarted broker rejoins as a slave of the new master.
        let deadline = Instant::now() + WAIT;
        loop {
            let m = Client::connect(&cluster.broker(master).addr.clone())
                .and_then(|mut c| c.metadata());
            if m.is_ok_and(|m| m.master.map(|b| b.id) == Some(BrokerId(next))) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: broker {master} did not rejoin"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let outcomes = load.stop();
    let last = cluster.wait_for_master();

    // Every master had its own epoch, each above the one before.
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "epochs {epochs:?}");

    // Failover time: the kill to the first acknowledgement by another broker.
    let mut took: Vec<Duration> = kills
        .iter()
        .map(|&(at, killed)| {
            let killed = usize::from(killed - 1);
            outcomes
                .iter()
                .flat_map(|o| o.ack_times.iter())
                .filter(|&&(t, b)| t > at && b != killed)
                .map(|&(t, _)| t - at)
                .min()
                .expect("an acknowledgement after every kill")
        })
        .collect();
    eprintln!("failover times (kill -> first new ack): {took:?}");
    took.sort();
    eprintln!(
        "failover p50 {:?} max {:?} over {} kills",
        took[took.len() / 2],
        took[took.len() - 1],
        took.len()
    );

    let acked: usize = outcomes.iter().map(|o| o.acked.len()).sum();
    for (i, o) in outcomes.iter().enumerate() {
        assert!(
            o.errors.iter().all(|(c, _)| c.as_u16() >= 200),
            "producer {}: {:?}",
            i + 1,
            o.errors
        );
    }
    let mut c = Client::connect(&cluster.broker(last).addr.clone()).expect("connect");
    let fetched = fetch_all(&mut c, "t", acked);
    check_exactly_once(&outcomes, 1, &fetched);
    let metrics = cluster.broker(last).scrape();
    assert!(metrics.contains("quire_failovers_total"), "{metrics}");
    assert!(metrics.contains("quire_failover_duration_seconds_count"));
}
