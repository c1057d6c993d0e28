//! Log truncation ("file order is authoritative"): an append at x <= last replaces the
//! suffix from x when its writer epoch justifies it, within a segment and below the
//! current segment's base, and recovery rebuilds exactly the same log from the files.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use common::*;
use proptest::prelude::*;
use quire_proto::{Epoch, Event, LogPosition, Offset};
use quire_wal::{inspect, IoBackend, RecordStatus, Wal, WalError};

fn segment_names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".log"))
        .collect()
}

/// What a reopened log must show: the same records, last entry and epochs.
fn assert_same_after_reopen(dir: &Path, io: IoBackend, expected: &[Event]) -> Wal {
    let (wal, report) = Wal::open(config(dir, io)).unwrap();
    assert!(report.torn_tail.is_none());
    assert_eq!(read_all(&wal), expected);
    assert_eq!(
        wal.last(),
        expected.last().map(|r| LogPosition {
            epoch: r.epoch,
            offset: r.offset
        })
    );
    for r in expected {
        assert_eq!(wal.entry_epoch(r.offset), Some(r.epoch));
    }
    wal
}

#[test]
fn truncation_within_a_segment_survives_reopen() {
    for io in backends() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(config(dir.path(), io)).unwrap();
        append_range(&wal, 0, 5, 1, 20);
        // Master 2 wrote 5..10; master 3 replaces them with entries of epoch 1 (a Raft
        // figure-7 case: the replacing entries are older than the ones they replace).
        for o in 5..10 {
            wal.append(Epoch(2), vec![record(o, 2, 20)]).wait().unwrap();
        }
        let replacing: Vec<Event> = (5..8).map(|o| record(o, 1, 30)).collect();
        assert_eq!(
            wal.append(Epoch(3), replacing.clone()).wait().unwrap(),
            Offset(7)
        );
        assert_eq!(
            wal.last(),
            Some(LogPosition {
                epoch: Epoch(1),
                offset: Offset(7)
            })
        );
        assert_eq!(wal.stats().truncations, 1);
        // A writer of epoch 2 may no longer truncate: epoch 3 was seen.
        let refused = wal
            .append(Epoch(2), vec![record(6, 2, 1)])
            .wait()
            .unwrap_err();
        assert!(
            matches!(refused, WalError::TruncationRefused { .. }),
            "{refused}"
        );
        wal.append(Epoch(3), vec![record(8, 3, 5)]).wait().unwrap();

        let mut expected: Vec<Event> = (0..5).map(|o| record(o, 1, 20)).collect();
        expected.extend(replacing);
        expected.push(record(8, 3, 5));
        assert_eq!(read_all(&wal), expected);
        drop(wal);
        let wal = assert_same_after_reopen(dir.path(), io, &expected);
        // The epoch rule survives the reopen too.
        assert!(matches!(
            wal.append(Epoch(2), vec![record(6, 2, 1)]).wait(),
            Err(WalError::TruncationRefused { .. })
        ));
    }
}

#[test]
fn truncation_below_the_current_segment_survives_reopen() {
    for io in backends() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(config(dir.path(), io)).unwrap();
        // 40 appends of one block each: 64 KiB segments hold 15 after their header
        // block, so 3 segments.
        append_range(&wal, 0, 40, 1, 3000);
        let before = segment_names(dir.path());
        assert!(before.len() >= 3, "{before:?}");
        // Replace from offset 10 (inside the first segment).
        let replacing: Vec<Event> = (10..13).map(|o| record(o, 2, 7)).collect();
        wal.append(Epoch(2), replacing.clone()).wait().unwrap();
        let after = segment_names(dir.path());
        assert!(after.contains("00000000000000000000.log"));
        assert!(after.contains("00000000000000000010.log"), "{after:?}");
        assert_eq!(after.len(), 2, "segments above 10 are deleted: {after:?}");
        let mut expected: Vec<Event> = (0..10).map(|o| record(o, 1, 3000)).collect();
        expected.extend(replacing);
        assert_eq!(read_all(&wal), expected);
        append_range(&wal, 13, 15, 2, 9);
        expected.extend((13..15).map(|o| record(o, 2, 9)));
        drop(wal);

        // The new segment starts with the marker, and the marker cuts the stale tail of
        // segment 0 (offsets 10..15 stay in that file, dropped).
        let mut markers = Vec::new();
        let rep = inspect(dir.path(), |r| {
            if let RecordStatus::Marker { dropped } = r.status {
                markers.push((
                    r.segment.file_name().unwrap().to_owned(),
                    r.position.0,
                    dropped,
                ));
            }
        })
        .unwrap();
        // The marker is the segment's first record, in the block after its header.
        assert_eq!(markers, vec![("00000000000000000010.log".into(), 4096, 5)]);
        assert_eq!(rep.next, Offset(15));
        let wal = assert_same_after_reopen(dir.path(), io, &expected);
        drop(wal);

        // Truncating exactly at a segment's base replaces that segment.
        let (wal, _) = Wal::open(config(dir.path(), io)).unwrap();
        wal.append(Epoch(3), vec![record(10, 3, 1)]).wait().unwrap();
        expected.truncate(10);
        expected.push(record(10, 3, 1));
        drop(wal);
        assert_same_after_reopen(dir.path(), io, &expected);
    }
}

#[test]
fn truncation_to_an_empty_log() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    append_range(&wal, 0, 3, 1, 10);
    wal.append(Epoch(5), vec![record(0, 4, 10)]).wait().unwrap();
    drop(wal);
    assert_same_after_reopen(dir.path(), IoBackend::Sync, &[record(0, 4, 10)]);
}

#[derive(Clone, Debug)]
enum Op {
    /// Append `n` records at the end, with the writer's epoch.
    Extend { n: usize, len: usize },
    /// A new writer with a higher epoch replaces the suffix from `back` entries before the
    /// end with `n` records of entry epoch `entry_epoch_from_writer` below its own.
    Replace {
        back: usize,
        n: usize,
        len: usize,
        lower: bool,
    },
    /// Close and reopen.
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..4, 0usize..2000).prop_map(|(n, len)| Op::Extend { n, len }),
        2 => (0usize..20, 1usize..4, 0usize..2000, any::<bool>()).prop_map(|(back, n, len, lower)| Op::Replace { back, n, len, lower }),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Random extends, truncations and reopens against a model: after every step the log
    /// equals the model, and a reopen from the files alone reproduces it exactly.
    #[test]
    fn recovery_reproduces_the_log(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
        let mut model: Vec<Event> = Vec::new();
        let mut writer = 1u64;
        for op in ops {
            match op {
                Op::Extend { n, len } => {
                    let start = model.len() as u64;
                    let recs: Vec<Event> = (0..n as u64).map(|i| record(start + i, writer, len)).collect();
                    wal.append(Epoch(writer), recs.clone()).wait().unwrap();
                    model.extend(recs);
                }
                Op::Replace { back, n, len, lower } => {
                    if model.is_empty() {
                        continue;
                    }
                    let x = model.len().saturating_sub(back + 1);
                    writer += 1;
                    // The replacing entries' epoch: the new writer's, or the epoch of the
                    // entry before x (lower than what they replace, figure 7).
                    let floor = if x == 0 { 1 } else { model[x - 1].epoch.0 };
                    let e = if lower { floor } else { writer };
                    let recs: Vec<Event> = (0..n as u64).map(|i| record(x as u64 + i, e, len)).collect();
                    let r = wal.append(Epoch(writer), recs.clone()).wait();
                    prop_assert!(r.is_ok(), "truncation at {x} by writer {writer}: {r:?}");
                    model.truncate(x);
                    model.extend(recs);
                }
                Op::Reopen => {
                    drop(wal);
                    let (w, rep) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
                    prop_assert!(rep.torn_tail.is_none());
                    wal = w;
                }
            }
            prop_assert_eq!(&read_all(&wal), &model);
        }
        drop(wal);
        let wal = assert_same_after_reopen(dir.path(), IoBackend::Sync, &model);
        drop(wal);
    }
}
