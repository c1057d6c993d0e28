//! Fault: one bit flips in a sealed segment of one store of three while it is down (a
//! random bit of a random record of a segment before the one holding the last record;
//! seeded, the seed is printed, `QUIRE_TEST_SEED` replays it), under 3 continuous
//! producers.
//!
//! What must survive: `quire wal verify` reports corruption (exit 1) located at that
//! record's segment, position and offset; the store, restarted, starts with that record
//! marked damaged (never as if the range were absent), a broker repairs it from another
//! store's copy, and `quire wal verify` is then clean; the cluster keeps acknowledging
//! throughout; every acknowledged message is in the log once, at its offset, in producer
//! order. (Two damaged records in a row, or a zeroed one, still refuse the start: the WAL
//! cannot tell where the record ends; the `wal` crate's tests cover those.)

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::process::Stdio;

use quire_proto::Offset;
use quire_tests::disk::{
    check_no_acked_loss, fetch_through, flip_bit, log_count, master_hwm, max_acked, records,
    segments, wait_hwm_above, wait_output, wait_until, wal_verify, Rng,
};
use quire_tests::node::metric_value;
use quire_tests::{Cluster, LoadDriver, Timing, WAIT};

const SEGMENT_BYTES: u64 = 64 << 10;
/// A WAL record's header, in bytes (docs/format.md).
const RECORD_HEADER_BYTES: u64 = 32;

#[test]
fn a_bit_flip_in_a_sealed_segment_is_located_then_repaired_from_the_others_at_start() {
    let _t = quire_tests::proc_test();
    let mut rng = Rng::from_env_or_clock("proc_bit_flip");
    let mut c = Cluster::new(3, 2, Timing::default());
    let victim = 2;
    let config = c.root.path().join("store-small-segments.toml");
    std::fs::write(
        &config,
        format!("[wal]\nsegment_bytes_max = {SEGMENT_BYTES}\n"),
    )
    .expect("config");
    c.stores[victim].config = config.clone();
    c.start_all();
    c.settle();
    let dir = c.stores[victim].dir.clone();

    let load = LoadDriver::start(&c, 1, 3);
    wait_until("the store fills three segments", WAIT * 2, || {
        (segments(&dir).len() >= 4).then_some(())
    });
    c.stores[victim].kill9();

    // Flip a bit of a record in a sealed segment: one before the segment of the log's last
    // record (a segment just started may still be empty), so valid records follow it.
    let sealed = sealed_records(&dir);
    assert!(!sealed.is_empty(), "sealed segments hold records");
    let r = &sealed[rng.below(sealed.len() as u64) as usize];
    flip_any(&mut rng, &dir, r);

    let v = wal_verify(&dir);
    assert_eq!(
        v.exit_code, 1,
        "verify reports corruption: {} {}",
        v.report, v.stderr
    );
    assert_eq!(v.report["result"], "corruption");
    let end = &v.report["end"];
    assert!(
        end["segment"]
            .as_str()
            .is_some_and(|s| s.ends_with(&r.segment)),
        "located in the flipped segment: {end}"
    );
    assert_eq!(
        end["position"].as_u64(),
        Some(r.position),
        "at the flipped record: {end}"
    );
    assert_eq!(end["offset"].as_u64(), Some(r.offset), "{end}");
    assert_eq!(
        v.report["repaired_at_start"],
        serde_json::json!([r.offset]),
        "verify says the store will start and repair it"
    );

    // The store starts with the record marked damaged and has it repaired.
    c.stores[victim].start();
    let log = c.stores[victim].proc.as_ref().expect("runs").log.clone();
    assert!(
        log_count(&log, "the log holds a damaged record") > 0,
        "the store names the damaged record at start"
    );
    wait_until("the damaged record is repaired", WAIT, || {
        (log_count(&log, "repaired a damaged record") > 0).then_some(())
    });

    // The cluster went on all along.
    let hwm = wait_hwm_above(&c, None, WAIT);
    wait_hwm_above(&c, Some(hwm + 200), WAIT);
    let outcomes = load.stop();
    let last = max_acked(&outcomes).expect("messages were acknowledged");
    c.wait_store_holds(victim, Offset(last));
    c.stores[victim].kill9();
    let v = wal_verify(&dir);
    assert_eq!(
        v.exit_code, 0,
        "the store verifies clean after the repair: {} {}",
        v.report, v.stderr
    );
    c.stores[victim].start();
    let checked = check_no_acked_loss(&c, &[(1, outcomes)]);
    eprintln!("checked {checked} acknowledged messages: none lost");
    assert!(checked > 0);
}

/// Flips a random bit of record `r` of the stopped store in `dir` (any byte: one flipped
/// bit is always placed at start, docs/format.md rule 4).
fn flip_any(rng: &mut Rng, dir: &std::path::Path, r: &quire_tests::disk::RecordAt) {
    let at = r.position + rng.below(r.bytes);
    let bit = rng.below(8) as u8;
    let path = dir.join("wal").join(&r.segment);
    let (before, after) = flip_bit(&path, at, bit).expect("flip");
    eprintln!(
        "flipped bit {bit} of byte {at} ({before:#04x} -> {after:#04x}) in {} of {} (record \
         at offset {}, position {}, {} bytes)",
        r.segment,
        dir.display(),
        r.offset,
        r.position,
        r.bytes
    );
}

/// Stops store `s` (SIGKILL), asserts that `quire wal verify` finds its log in `dir`
/// clean, and starts it again.
fn verify_clean_and_restart(c: &mut Cluster, s: usize, dir: &std::path::Path) {
    c.stores[s].kill9();
    let v = wal_verify(dir);
    assert_eq!(
        v.exit_code, 0,
        "store {s} verifies clean after its repairs: {} {}",
        v.report, v.stderr
    );
    c.stores[s].start();
}

/// The records of the stopped store in `dir` in segments before the one holding its last
/// record.
fn sealed_records(dir: &std::path::Path) -> Vec<quire_tests::disk::RecordAt> {
    let all = records(dir);
    let last_segment = all.last().expect("the store holds records").segment.clone();
    all.into_iter()
        .filter(|r| r.segment < last_segment)
        .collect()
}

/// Fault, in two rounds, under 2 producers: bits flip in sealed segments of 2 stores of 5
/// while both are down — first in different records, then in the same record on both (so
/// three copies of it are left). Records and bits are random (seeded).
///
/// What must survive: both stores start with the damaged records marked and repair them
/// from the other three; then both vote again — with two of the three other stores and the
/// master killed (SIGKILL), the slave's takeover needs both repaired stores' grants, and
/// completes, and producing goes on; `quire wal verify` is clean on both; every
/// acknowledged message is in the log once, at its offset, in producer order.
#[test]
fn bits_flipped_on_two_of_five_stores_are_repaired_at_start_and_both_vote_again() {
    let _t = quire_tests::proc_test();
    let mut rng = Rng::from_env_or_clock("proc_bit_flip_two_of_five");
    let mut c = Cluster::new(5, 2, Timing::default());
    c.set_store_config(&format!("[wal]\nsegment_bytes_max = {SEGMENT_BYTES}\n"));
    c.start_all();
    c.settle();
    let damaged = [3, 4];
    let dirs = damaged.map(|s| c.stores[s].dir.clone());
    let mut rounds = Vec::new();
    let mut producer = 1;
    let mut damaged_payload = 0;
    for (round, same) in [(1, false), (2, true)] {
        let load = LoadDriver::start(&c, producer, 2);
        let wanted = 4 * round;
        wait_until("both stores fill their segments", WAIT * 2, || {
            dirs.iter()
                .all(|d| segments(d).len() >= wanted)
                .then_some(())
        });
        for s in damaged {
            c.stores[s].kill9();
        }
        let (sa, sb) = (sealed_records(&dirs[0]), sealed_records(&dirs[1]));
        // In round 2, a record both hold in a sealed segment.
        let sa: Vec<_> = sa
            .into_iter()
            .filter(|r| !same || sb.iter().any(|o| o.offset == r.offset))
            .collect();
        let ra = sa[rng.below(sa.len() as u64) as usize].clone();
        let rb = if same {
            sb.iter()
                .find(|r| r.offset == ra.offset)
                .expect("both stores hold the record sealed")
                .clone()
        } else {
            let others: Vec<_> = sb.iter().filter(|r| r.offset != ra.offset).collect();
            (*others[rng.below(others.len() as u64) as usize]).clone()
        };
        flip_any(&mut rng, &dirs[0], &ra);
        flip_any(&mut rng, &dirs[1], &rb);
        damaged_payload += ra.bytes + rb.bytes - 2 * RECORD_HEADER_BYTES;
        for s in damaged {
            c.stores[s].start();
        }
        for s in damaged {
            let log = c.stores[s].proc.as_ref().expect("runs").log.clone();
            assert_eq!(
                log_count(&log, "the log holds a damaged record"),
                round,
                "store {s} names its damaged record at each start"
            );
            wait_until(
                &format!("store {s} repaired {round} record(s)"),
                WAIT,
                || (log_count(&log, "repaired a damaged record") >= round).then_some(()),
            );
        }
        rounds.push((producer, load.stop()));
        producer += 2;
    }

    // The repairs read the damaged records' copies and nothing more (the master ran them).
    let master = c.wait_for_master();
    let scrape = c.broker_node(master).scrape();
    let read = metric_value(&scrape, "quire_store_repair_read_bytes_total") as u64;
    let runs: f64 = ["repaired", "not_applied", "failed"]
        .iter()
        .map(|o| {
            metric_value(
                &scrape,
                &format!("quire_store_repairs_total{{outcome=\"{o}\"}}"),
            )
        })
        .sum();
    eprintln!(
        "the master's repairs read {read} payload bytes in {runs} runs, for 4 damaged records \
         of {damaged_payload} payload bytes"
    );
    assert!(
        read >= damaged_payload,
        "every damaged record was read once at least"
    );
    assert!(
        read <= damaged_payload * runs as u64,
        "each run read one record, never a range"
    );

    // Both vote again: without stores 0 and 1, a takeover needs 3 grants of 5, so stores 3
    // and 4 must both grant.
    c.stores[0].kill9();
    c.stores[1].kill9();
    c.broker(master).kill9();
    let new_master = c.wait_for_master();
    assert_ne!(new_master, master, "the slave took over");
    let load = LoadDriver::start(&c, producer, 1);
    let hwm = wait_hwm_above(&c, None, WAIT);
    wait_hwm_above(&c, Some(hwm + 100), WAIT);
    rounds.push((producer, load.stop()));

    for (s, dir) in damaged.into_iter().zip(&dirs) {
        let last = rounds
            .iter()
            .filter_map(|(_, o)| max_acked(o))
            .max()
            .expect("messages were acknowledged");
        c.wait_store_holds(s, Offset(last));
        verify_clean_and_restart(&mut c, s, dir);
    }
    c.stores[0].start();
    c.stores[1].start();
    let checked = check_no_acked_loss(&c, &rounds);
    eprintln!("checked {checked} acknowledged messages: none lost");
    assert!(checked > 0);
}

/// Fault, in two rounds, bits flipped in records of stores *while they run*. The brokers
/// keep no stabilized event in memory (`--recent-bytes-max 0`), so every fetch and every
/// catch-up reads a store. Records and bits are random (seeded).
///
/// Round 1: two records of store 0 (the store a master reads first), one in a sealed
/// segment and one in the segment appends go to, while store 2 is frozen (SIGSTOP) and
/// misses both. What must survive: store 2, thawed, catches up through both (read from
/// store 1) and holds store 1's log; a consumer reading the topic from offset 0 gets every
/// acknowledged message once, at its offset, never the bad bytes and never a gap; the
/// master repairs both of store 0's records from store 1's copies.
///
/// Round 2: one sealed record of store 0 and another of store 1 are damaged while the
/// master is frozen (so it cannot repair them); reads that are not the master's find the
/// damage (both stores answer `Corrupt`, and from then on grant no fence; `quire cluster
/// audit` is not healthy and names both); the master is killed with SIGKILL. What must survive: the slave's takeover is refused by stores 0 and
/// 1, repairs them from store 2, and completes.
///
/// Round 3: a record of store 1 is damaged and found by a read that is not the master's,
/// while the master runs: store 1 names it in its acks and the master repairs it.
///
/// In the end the consumer reads the same messages; `quire wal verify` is clean on stores
/// 0 and 1; the final check (history, consumers, all three logs) is clean.
#[test]
fn bits_flipped_in_running_stores_are_read_around_and_repaired_from_the_others() {
    let _t = quire_tests::proc_test();
    let mut rng = Rng::from_env_or_clock("proc_bit_flip_running");
    let mut c = Cluster::new(3, 2, Timing::default());
    let (victim, lagging) = (0, 2);
    c.set_store_config(&format!("[wal]\nsegment_bytes_max = {SEGMENT_BYTES}\n"));
    c.add_broker_args(&["--recent-bytes-max", "0"]);
    c.start_all();
    c.settle();
    let frozen_at = master_hwm(&c).unwrap_or(0);
    let lagging_pid = c.stores[lagging].pid().expect("store 2 runs");
    quire_tests::process::stop(lagging_pid);

    // Load until store 0 has sealed segments and a record well inside its active one.
    let dir0 = c.stores[victim].dir.clone();
    let mut rounds = Vec::new();
    let mut producer = 1;
    let (sealed, active) = loop {
        let load = LoadDriver::start(&c, producer, 3);
        wait_until("store 0 fills three segments", WAIT * 2, || {
            (segments(&dir0).len() >= 4).then_some(())
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        rounds.push((producer, load.stop()));
        producer += 3;
        let all = records(&dir0);
        let last = all.last().expect("store 0 holds records").clone();
        let (sealed, active): (Vec<_>, Vec<_>) = all
            .into_iter()
            .filter(|r| r.offset > frozen_at)
            .partition(|r| r.segment < last.segment);
        // Two pages clear of where appends go on.
        let active: Vec<_> = active
            .into_iter()
            .filter(|r| r.position + r.bytes + 8192 <= last.position)
            .collect();
        if !sealed.is_empty() && !active.is_empty() {
            break (sealed, active);
        }
        assert!(
            rounds.len() < 5,
            "no record to damage after {} rounds",
            rounds.len()
        );
    };
    let last = rounds
        .iter()
        .filter_map(|(_, o)| max_acked(o))
        .max()
        .expect("messages were acknowledged");
    let mut flip = |dir: &std::path::Path, records: &[quire_tests::disk::RecordAt]| {
        let r = &records[rng.below(records.len() as u64) as usize];
        let at = r.position + rng.below(r.bytes);
        let bit = rng.below(8) as u8;
        let (before, after) = flip_bit(&dir.join("wal").join(&r.segment), at, bit).expect("flip");
        eprintln!(
            "flipped bit {bit} of byte {at} ({before:#04x} -> {after:#04x}) in {} of the \
             running store {} (record at offset {}, position {}, {} bytes)",
            r.segment,
            dir.display(),
            r.offset,
            r.position,
            r.bytes
        );
        r.offset
    };
    flip(&dir0, &sealed);
    flip(&dir0, &active);

    // Store 2 thaws and catches up through both damaged records, from store 1.
    quire_tests::process::signal(lagging_pid, libc::SIGCONT);
    c.wait_store_holds(lagging, Offset(last));
    let good = c.read_store_log(1).expect("store 1's log");
    let caught_up = c.read_store_log(lagging).expect("store 2's log");
    let n = good.len().min(caught_up.len());
    assert!(n as u64 > last, "both hold the acknowledged log");
    assert!(
        good[..n] == caught_up[..n],
        "store 2 caught up with store 1's log, the damaged records included"
    );

    // A consumer from offset 0: every message.
    let fetched = fetch_through(&c, "t", last);
    let offsets: Vec<u64> = fetched.iter().map(|(o, _)| o.0).collect();
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]),
        "offsets ascend, none twice"
    );
    let log_of = |c: &Cluster, i: usize| c.stores[i].proc.as_ref().expect("runs").log.clone();
    let (log0, log1) = (log_of(&c, 0), log_of(&c, 1));
    let repaired = |log: &std::path::Path, n: usize| {
        wait_until(
            &format!("{} repaired {n} record(s)", log.display()),
            WAIT,
            || (log_count(log, "repaired a damaged record") >= n).then_some(()),
        );
    };
    assert!(
        log_count(&log0, "a read found a damaged record") > 0,
        "store 0 reported the damage"
    );
    repaired(&log0, 2);

    // Round 2: the master is frozen; stores 0 and 1 find damage through reads of their
    // own (an operator's tool, a slave's read), answer Corrupt, and stop voting.
    let master = c.wait_for_master();
    let master_pid = c.broker_node(master).pid().expect("the master runs");
    let dir1 = c.stores[1].dir.clone();
    let sealed_of = |dir: &std::path::Path| {
        let all = records(dir);
        let last = all.last().expect("holds records").segment.clone();
        all.into_iter()
            .filter(|r| r.segment < last && r.offset <= last_offset(&sealed))
            .collect::<Vec<_>>()
    };
    fn last_offset(records: &[quire_tests::disk::RecordAt]) -> u64 {
        records.iter().map(|r| r.offset).max().unwrap_or(0)
    }
    let (sealed0, sealed1) = (sealed_of(&dir0), sealed_of(&dir1));
    quire_tests::process::stop(master_pid);
    let damaged = [flip(&dir0, &sealed0), flip(&dir1, &sealed1)];
    for (store, offset) in [0, 1].into_iter().zip(damaged) {
        let mut client = quire_tests::Client::connect(&c.stores[store].addr).expect("connect");
        match client.request(quire_proto::ReadRequest {
            from: Offset(offset),
            max_events: 1,
            max_bytes: 1 << 20,
        }) {
            Ok(quire_proto::Body::ErrorResponse(e)) => {
                assert_eq!(e.code, quire_proto::ErrorCode::Corrupt, "{e:?}");
                assert_eq!(
                    e.detail,
                    quire_proto::ErrorDetail::Corrupt {
                        offset: Offset(offset)
                    }
                );
            }
            other => panic!("store {store} answered a read of its damaged record with {other:?}"),
        }
    }
    // An audit of the stores says so: not healthy, the two stores named.
    let stores_arg: Vec<String> = c.stores.iter().map(|s| s.addr.clone()).collect();
    let child = quire_tests::process::quire_command()
        .args(["cluster", "audit", "--format", "json", "--stores"])
        .arg(stores_arg.join(","))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start quire cluster audit");
    let out = wait_output(child, "quire cluster audit");
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the audit prints JSON");
    assert_ne!(report["verdict"], "healthy", "{report}");
    for store in [0, 1] {
        let error = report["stores"][store]["error"].as_str().unwrap_or("");
        assert!(
            error.contains("Corrupt"),
            "store {store}'s damage is a fault of its own: {report}"
        );
    }
    quire_tests::process::signal(master_pid, libc::SIGKILL);
    c.broker(master).kill9();
    let new_master = c.wait_for_master();
    assert_ne!(new_master, master);
    for log in [&log0, &log1] {
        assert!(
            log_count(
                log,
                "fence refused: a record of this store's log is damaged"
            ) > 0,
            "{} refused a fence while damaged",
            log.display()
        );
    }
    repaired(&log0, 3);
    repaired(&log1, 1);

    // Round 3: damage another read finds while the master runs reaches the master in the
    // store's acks (the settle produces some), and is repaired.
    let offset = flip(&dir1, &sealed_of(&dir1));
    let mut client = quire_tests::Client::connect(&c.stores[1].addr).expect("connect");
    let answer = client
        .request(quire_proto::ReadRequest {
            from: Offset(offset),
            max_events: 1,
            max_bytes: 1 << 20,
        })
        .expect("read");
    assert!(
        matches!(&answer, quire_proto::Body::ErrorResponse(e) if e.code == quire_proto::ErrorCode::Corrupt),
        "{answer:?}"
    );
    c.settle();
    repaired(&log1, 2);

    let upto = |v: &[(Offset, bytes::Bytes)]| -> Vec<(Offset, bytes::Bytes)> {
        v.iter().filter(|(o, _)| o.0 <= last).cloned().collect()
    };
    let again = fetch_through(&c, "t", last);
    assert!(
        upto(&again) == upto(&fetched),
        "the new master serves the same messages"
    );

    // Stores 0 and 1 are whole again: verify is clean and they start.
    for (store, dir) in [(0, &dir0), (1, &dir1)] {
        verify_clean_and_restart(&mut c, store, dir);
    }
    let checked = check_no_acked_loss(&c, &rounds);
    eprintln!("checked {checked} acknowledged messages: none lost");
    assert!(checked > 0);
}
