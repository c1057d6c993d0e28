//! Fault: fdatasync EIO, then write EIO, on one store of three (`QUIRE_FAILPOINTS` on the
//! real `quire-node`), under 3 continuous producers; 2 brokers, Qa = 2.
//!
//! What must survive: the store fails its log (fail-stop: its durable log stops growing,
//! it never acknowledges the failed batch — checked at the store level by
//! node/tests/proc_failpoints.rs — and exits non-zero on SIGTERM); the cluster keeps
//! acknowledging on the two others; every acknowledged message is in the log once, at
//! its offset, in producer order; restarted without the fault, the store catches up.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::time::Instant;

use quire_node::failpoints::FAILPOINTS_ENV;
use quire_tests::disk::{
    check_no_acked_loss, log_count, max_acked, tail, terminate, wait_hwm_above, wait_store_through,
    wait_until,
};
use quire_tests::{Cluster, LoadDriver, Timing, WAIT};

/// Producers per round.
const PRODUCERS: u64 = 3;

#[test]
fn an_fsync_or_write_eio_fails_one_stores_log_and_the_cluster_continues() {
    let _t = quire_tests::proc_test();
    let mut c = Cluster::new(3, 2, Timing::default());
    let victim = 2;
    let log = c.stores[victim].dir.with_extension("log");
    c.start_all();
    c.settle();
    let mut rounds = Vec::new();

    for (round, spec) in ["wal_fdatasync=eio,after=30", "wal_write=eio,after=30"]
        .into_iter()
        .enumerate()
    {
        // The faulty store restarts with the failpoint armed: after 30 good operations
        // the next one fails.
        if c.stores[victim].proc.is_some() {
            c.stores[victim].kill9();
        }
        c.stores[victim].env = vec![(FAILPOINTS_ENV.to_owned(), spec.to_owned())];
        c.stores[victim].start();

        let first = 1 + round as u64 * PRODUCERS;
        let load = LoadDriver::start(&c, first, PRODUCERS);
        wait_until(&format!("{spec}: the store's WAL fails"), WAIT, || {
            (log_count(&log, "the WAL failed") > round).then_some(())
        });
        let failed_at = Instant::now();
        assert!(
            log_count(&log, "failpoint wal_") > round,
            "{spec}: the failure is the injected one"
        );
        let durable = tail(&c.stores[victim].addr)
            .expect("a failed store still answers Tail")
            .last
            .map(|l| l.offset.0);
        // The cluster goes on without it...
        let hwm = wait_hwm_above(&c, durable.map(|d| d + 200), WAIT);
        // ...and the failed store's durable log did not move: nothing after the failure was
        // made durable, so nothing was acknowledged by it.
        let later = tail(&c.stores[victim].addr)
            .expect("tail")
            .last
            .map(|l| l.offset.0);
        assert_eq!(later, durable, "{spec}: a failed log takes no append");
        let outcomes = load.stop();
        let after: usize = outcomes
            .iter()
            .map(|o| o.ack_times.iter().filter(|(t, _)| *t > failed_at).count())
            .sum();
        assert!(
            after > 0,
            "{spec}: producers were acknowledged after the failure"
        );
        eprintln!(
            "{spec}: store durable through {durable:?} when its log failed; HWM reached {hwm}; \
             {after} batches acknowledged after the failure"
        );
        assert!(
            !terminate(&mut c.stores[victim]),
            "{spec}: a store whose WAL failed exits non-zero"
        );
        rounds.push((first, outcomes));
    }

    // Restarted without a failpoint, the store catches up with everything acknowledged.
    c.stores[victim].env.clear();
    c.stores[victim].start();
    let last = rounds
        .iter()
        .filter_map(|(_, o)| max_acked(o))
        .max()
        .expect("acknowledged messages");
    wait_store_through(&c.stores[victim].addr, last, WAIT);
    let checked = check_no_acked_loss(&c, &rounds);
    eprintln!("checked {checked} acknowledged messages: none lost");
    assert!(checked > 0);
}
