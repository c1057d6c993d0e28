//! Faults during a takeover, on the real binaries (3 stores, 3 brokers, loopback).
//!
//! Fault: the master is killed -9, and the slave that starts the takeover is killed -9 in the
//! middle of it — as soon as its epoch counter file shows the new counter, i.e. after it
//! made its epoch durable and while it fences, recovers or writes its epoch-start (a double
//! failover in quick succession). Both are restarted; then the third broker, now master, is
//! killed too, so one of the restarted brokers takes over. What must survive: every
//! acknowledged message of 2 continuous producers, once, at its acknowledged offset, in
//! producer order; every master's epoch is above the one before; the broker killed during
//! its takeover never goes back on its durable counter and, when it leads again, leads with
//! an epoch whose counter is above the one it was killed with (no epoch reused).

use std::time::{Duration, Instant};

use quire_broker::durable::load_epoch_counter;
use quire_proto::{BrokerId, Epoch};
use quire_tests::{fetch_all, Client, Cluster, LoadDriver, Timing, WAIT};

fn master_epoch(cluster: &mut Cluster, id: u16) -> Epoch {
    Client::connect(&cluster.broker(id).addr.clone())
        .and_then(|mut c| c.metadata())
        .expect("metadata")
        .epoch
}

fn wait_follows(cluster: &mut Cluster, id: u16, master: u16) {
    let deadline = Instant::now() + WAIT;
    loop {
        let m = Client::connect(&cluster.broker(id).addr.clone()).and_then(|mut c| c.metadata());
        if m.is_ok_and(|m| m.master.map(|b| b.id) == Some(BrokerId(master))) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "broker {id} does not follow {master}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn proc_new_master_killed_during_takeover_loses_nothing_and_never_reuses_an_epoch() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 3, Timing::default());
    cluster.start_all();
    let first = cluster.settle();
    let load = LoadDriver::start(&cluster, 1, 2);
    // The failovers happen under load: both producers are being acknowledged.
    cluster.wait_load_acked(1..3, Some(first), 5);
    let mut epochs = vec![master_epoch(&mut cluster, first)];

    let slaves: Vec<u16> = (1..=3).filter(|&b| b != first).collect();
    let before: Vec<u64> = slaves
        .iter()
        .map(|&b| load_epoch_counter(&cluster.broker(b).dir).expect("epoch file"))
        .collect();
    cluster.broker(first).kill9();
    // Kill the slave that starts the takeover as soon as its counter is durable.
    let deadline = Instant::now() + WAIT;
    let (victim, counter) = 'found: loop {
        for (i, &b) in slaves.iter().enumerate() {
            if let Ok(c) = load_epoch_counter(&cluster.broker(b).dir) {
                if c > before[i] {
                    cluster.broker(b).kill9();
                    break 'found (b, c);
                }
            }
        }
        assert!(Instant::now() < deadline, "no slave started a takeover");
        std::thread::sleep(Duration::from_millis(2));
    };
    let third = *slaves.iter().find(|&&b| b != victim).expect("two slaves");
    let second = cluster.wait_for_master();
    assert_eq!(second, third, "the last broker standing takes over");
    epochs.push(master_epoch(&mut cluster, second));

    cluster.broker(first).start();
    cluster.broker(victim).start();
    wait_follows(&mut cluster, first, second);
    wait_follows(&mut cluster, victim, second);
    let after = load_epoch_counter(&cluster.broker(victim).dir).expect("epoch file");
    assert!(
        after >= counter,
        "the durable counter went down: {counter} -> {after}"
    );

    // Keep only the victim and the master; kill the master: the victim must take over.
    cluster.broker(first).kill9();
    // The master serves on without it before it is killed in turn.
    cluster.wait_load_acked(1..3, Some(second), 3);
    cluster.broker(second).kill9();
    let last = cluster.wait_for_master();
    assert_eq!(last, victim);
    let e = master_epoch(&mut cluster, last);
    epochs.push(e);
    assert!(
        e.counter() > counter,
        "broker {victim} was killed with counter {counter} and now leads {e:?}"
    );
    // The load goes on through the last master, so the check covers what it acknowledged.
    cluster.wait_load_acked(1..3, Some(last), 3);
    let outcomes = load.stop();
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "epochs {epochs:?}");

    let acked: usize = outcomes.iter().map(|o| o.acked.len()).sum();
    let mut c = Client::connect(&cluster.broker(last).addr.clone()).expect("connect");
    let fetched = fetch_all(&mut c, "t", acked);
    // The one checker (the simulation's): it also sees a restarted broker acking in an
    // epoch its previous process used.
    let report = cluster.check(&vec![("t".to_owned(), fetched)]);
    eprintln!(
        "double failover: killed {first}, then {victim} during its takeover (counter {counter}); epochs {epochs:?}; {acked} acked; {report}"
    );
    report.assert_clean();
}
