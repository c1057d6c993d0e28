//! Fault: one store of three runs out of disk space under 3 continuous producers. Its data
//! directory is a 16 MiB tmpfs mounted by the test (root only), filled by a ballast file
//! until 2.5 MiB are free, with 1 MiB segments: the store fills two segments, and preparing
//! the third fails with ENOSPC. Where mounting is not allowed the test falls back to a
//! failpoint (`wal_write=enospc`), and says so (`QUIRE_TEST_NO_MOUNT=1` forces it).
//!
//! What must survive: that store stops acknowledging (its log fails with "no space left
//! on device", its durable log stops growing); the cluster keeps acknowledging on the two
//! others; once the ballast is deleted (space freed) and the store restarted, it catches
//! up with everything acknowledged; every acknowledged message is in the log once, at its
//! offset, in producer order. The tmpfs is unmounted when the test ends, also on panic.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::time::Instant;

use quire_node::failpoints::FAILPOINTS_ENV;
use quire_tests::disk::{
    ballast, check_no_acked_loss, log_count, max_acked, segments, tail, terminate, wait_hwm_above,
    wait_store_through, wait_until, Tmpfs,
};
use quire_tests::{Cluster, LoadDriver, Timing, WAIT};

const SEGMENT_BYTES: u64 = 1 << 20;
const TMPFS_BYTES: u64 = 16 << 20;
const LEAVE_FREE_BYTES: u64 = 5 << 19; // 2.5 MiB: two segments fit, a third does not

#[test]
fn a_full_disk_stops_one_store_and_after_space_is_freed_it_catches_up() {
    let _t = quire_tests::proc_test();
    let mut c = Cluster::new(3, 2, Timing::default());
    let victim = 2;
    let config = c.root.path().join("store-small-segments.toml");
    std::fs::write(
        &config,
        format!("[wal]\nsegment_bytes_max = {SEGMENT_BYTES}\n"),
    )
    .expect("config");
    c.stores[victim].config = config;
    // Declared after the cluster, so dropped first: a lazy unmount, then the cluster kills
    // the processes and removes its directory.
    let mounted = if std::env::var_os("QUIRE_TEST_NO_MOUNT").is_some() {
        Err(std::io::Error::other("QUIRE_TEST_NO_MOUNT is set"))
    } else {
        Tmpfs::move_store(&c.stores[victim], TMPFS_BYTES)
    };
    let mount = match mounted {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!(
                "cannot mount a tmpfs here ({e}): falling back to the failpoint wal_write=enospc"
            );
            c.stores[victim].env = vec![(
                FAILPOINTS_ENV.to_owned(),
                "wal_write=enospc,after=200".to_owned(),
            )];
            None
        }
    };
    let ballast_file = mount.as_ref().map(|m| {
        let b = ballast(m.path(), LEAVE_FREE_BYTES).expect("ballast");
        eprintln!(
            "tmpfs {} MiB on {}: {} bytes free after the ballast",
            TMPFS_BYTES >> 20,
            m.path().display(),
            m.free_bytes().expect("statvfs")
        );
        b
    });
    let log = c.stores[victim].dir.with_extension("log");
    c.start_all();
    c.settle();

    let load = LoadDriver::start(&c, 1, 3);
    wait_until(
        "the store runs out of space and its log fails",
        WAIT * 2,
        || (log_count(&log, "the WAL failed") > 0).then_some(()),
    );
    let full_at = Instant::now();
    assert!(
        log_count(&log, "no space left on device") > 0,
        "the failure is ENOSPC"
    );
    let durable = tail(&c.stores[victim].addr)
        .expect("a failed store still answers Tail")
        .last
        .map(|l| l.offset.0);
    let segments_when_full = segments(&c.stores[victim].dir).len();
    let hwm = wait_hwm_above(&c, durable.map(|d| d + 200), WAIT);
    let later = tail(&c.stores[victim].addr)
        .expect("tail")
        .last
        .map(|l| l.offset.0);
    assert_eq!(later, durable, "a full store acknowledges nothing more");
    let first_round = load.stop();
    let after: usize = first_round
        .iter()
        .map(|o| o.ack_times.iter().filter(|(t, _)| *t > full_at).count())
        .sum();
    assert!(
        after > 0,
        "producers were acknowledged while the store was full"
    );
    eprintln!(
        "store full with {segments_when_full} segments, durable through {durable:?}; \
         the cluster went on to HWM {hwm}; {after} batches acknowledged meanwhile"
    );

    // Free the space (or disarm the failpoint), restart the store, keep producing: it
    // catches up and takes the new appends.
    assert!(
        !terminate(&mut c.stores[victim]),
        "a failed store exits non-zero"
    );
    if let Some(b) = &ballast_file {
        std::fs::remove_file(b).expect("delete the ballast");
    }
    c.stores[victim].env.clear();
    c.stores[victim].start();
    let load = LoadDriver::start(&c, 4, 3);
    let target = wait_hwm_above(&c, Some(hwm + 200), WAIT);
    wait_store_through(&c.stores[victim].addr, target, WAIT);
    let second_round = load.stop();
    let rounds = vec![(1, first_round), (4, second_round)];
    let last = rounds
        .iter()
        .filter_map(|(_, o)| max_acked(o))
        .max()
        .expect("acknowledged messages");
    wait_store_through(&c.stores[victim].addr, last, WAIT);
    if mount.is_some() {
        assert!(
            segments(&c.stores[victim].dir).len() > segments_when_full,
            "with space back the store rolled to a new segment"
        );
    }
    let checked = check_no_acked_loss(&c, &rounds);
    eprintln!("checked {checked} acknowledged messages: none lost");
    assert!(checked > 0);
    drop(mount);
}
