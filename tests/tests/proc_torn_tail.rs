//! Fault: a torn tail on one store of three, under 3 continuous producers. First the
//! store is killed -9 in the middle of appending (twice); then, eight times, it is killed
//! -9 and, while it is down, its last segment is truncated at a random position: inside a
//! random record of that segment (a torn write) on every other round, anywhere in its
//! written bytes on the others (seeded: the seed is printed, `QUIRE_TEST_SEED` replays it).
//!
//! What must survive: `quire wal verify` on the damaged directory finds a clean end or a
//! torn tail, never corruption; the restarted store recovers (cutting the torn tail),
//! catches up with the HWM while producers keep going, and once the load stops and it is
//! shut down cleanly, `quire wal verify` on its data directory is clean; every
//! acknowledged message is in the log once, at its offset, in producer order.
//!
//! Cutting records a store acknowledged is a disk that lost acknowledged data: safe here
//! because the master stays up and resends, and across a failover because the store then
//! carries a tail-cut mark (docs/protocol.md, "Tail-cut marks").

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use quire_tests::disk::{
    check_no_acked_loss, log_count, max_acked, records, segments, terminate, truncate,
    wait_hwm_above, wait_store_through, wal_verify, written_bytes, Rng,
};
use quire_tests::{Cluster, LoadDriver, Timing, WAIT};

const SEGMENT_BYTES: u64 = 256 << 10;
const PRODUCERS: u64 = 3;
const KILLS: usize = 2;
const TRUNCATIONS: usize = 8;

#[test]
fn a_store_with_a_torn_tail_recovers_catches_up_and_verifies_clean() {
    let _t = quire_tests::proc_test();
    let mut rng = Rng::from_env_or_clock("proc_torn_tail");
    let mut c = Cluster::new(3, 2, Timing::default());
    let victim = 2;
    let config = c.root.path().join("store-small-segments.toml");
    std::fs::write(
        &config,
        format!("[wal]\nsegment_bytes_max = {SEGMENT_BYTES}\n"),
    )
    .expect("config");
    c.stores[victim].config = config;
    let log = c.stores[victim].dir.with_extension("log");
    c.start_all();
    c.settle();
    let mut rounds = Vec::new();
    let (mut torn, mut clean_cuts) = (0, 0);

    for round in 0..KILLS + TRUNCATIONS {
        let first = 1 + round as u64 * PRODUCERS;
        let load = LoadDriver::start(&c, first, PRODUCERS);
        // Mid-append: the cluster is acknowledging when the store dies.
        let hwm = wait_hwm_above(&c, None, WAIT);
        wait_hwm_above(&c, Some(hwm + 100), WAIT);
        c.stores[victim].kill9();
        let dir = c.stores[victim].dir.clone();
        let mut inside_record = false;
        let what = if round < KILLS {
            format!("round {round}: kill -9 mid-append")
        } else {
            let last = segments(&dir).pop().expect("the store has a segment");
            let name = last
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let written = written_bytes(&last).expect("read the segment");
            // Every other round cuts inside a record of the last segment (a torn write);
            // the others anywhere in its written bytes (often in a batch's zero padding,
            // which loses whole batches and leaves a clean end).
            let in_segment: Vec<_> = records(&dir)
                .into_iter()
                .filter(|r| r.segment == name)
                .collect();
            let at = if round % 2 == 0 && !in_segment.is_empty() {
                let r = &in_segment[rng.below(in_segment.len() as u64) as usize];
                inside_record = true;
                r.position + 1 + rng.below(r.bytes - 1)
            } else {
                rng.below(written + 1)
            };
            truncate(&last, at).expect("truncate");
            format!(
                "round {round}: kill -9, then {name} cut to {at} of its {written} written bytes"
            )
        };
        let v = wal_verify(&dir);
        assert!(
            v.exit_code == 0 || v.exit_code == 2,
            "{what}: quire wal verify must find a clean end or a torn tail, never corruption: \
             {} {}",
            v.report,
            v.stderr
        );
        if inside_record {
            assert_eq!(
                v.exit_code, 2,
                "{what}: a cut inside a record is a torn tail: {}",
                v.report
            );
        }
        if v.exit_code == 2 {
            torn += 1;
        } else {
            clean_cuts += 1;
        }
        let cuts_before = log_count(&log, "cut the torn tail");
        c.stores[victim].start();
        if v.exit_code == 2 {
            assert_eq!(
                log_count(&log, "cut the torn tail"),
                cuts_before + 1,
                "{what}: the restarted store cut the torn tail and said so"
            );
        }
        // Catches up while producers keep going.
        let target = wait_hwm_above(&c, Some(hwm + 200), WAIT);
        wait_store_through(&c.stores[victim].addr, target, WAIT);
        eprintln!(
            "{what}: verify said {}; caught up through {target}",
            v.report["result"]
        );
        rounds.push((first, load.stop()));
    }

    let last = rounds
        .iter()
        .filter_map(|(_, o)| max_acked(o))
        .max()
        .expect("acknowledged messages");
    wait_store_through(&c.stores[victim].addr, last, WAIT);
    assert!(
        terminate(&mut c.stores[victim]),
        "a clean shutdown of the recovered store"
    );
    let v = wal_verify(&c.stores[victim].dir);
    assert_eq!(
        v.exit_code, 0,
        "quire wal verify after recovery: {} {}",
        v.report, v.stderr
    );
    assert!(v.report["last_offset"].as_u64() >= Some(last));
    let checked = check_no_acked_loss(&c, &rounds);
    eprintln!(
        "{} kills, {TRUNCATIONS} truncations ({torn} verified as torn tails, {clean_cuts} \
         clean); checked {checked} acknowledged messages: none lost",
        KILLS + TRUNCATIONS
    );
    assert!(checked > 0);
}
