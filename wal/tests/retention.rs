//! Retention: `Wal::trim_before` deletes whole segments below the trim point, never the
//! last one or one holding an entry at or above the point; the log then starts at the
//! first remaining segment's base, reads below it fail with `Trimmed`, and a reopen (and
//! the offline `inspect`) see the same start with nothing taken for corruption.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use common::*;
use quire_proto::{Epoch, Event, Offset};
use quire_wal::{inspect, IoBackend, ScanEnd, Wal, WalError};

fn segment_names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".log"))
        .collect()
}

fn names(bases: &[u64]) -> BTreeSet<String> {
    bases.iter().map(|b| format!("{b:020}.log")).collect()
}

#[test]
fn trim_deletes_whole_segments_below_the_point_and_survives_reopen() {
    for io in backends() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(config(dir.path(), io)).unwrap();
        // One block per record, 16 per 64 KiB segment: segments 0, 16, 32.
        append_range(&wal, 0, 40, 1, 3000);
        assert_eq!(segment_names(dir.path()), names(&[0, 16, 32]));

        // Nothing lies wholly below 10: no change.
        let r = wal.trim_before(Offset(10)).unwrap();
        assert_eq!((r.first_offset, r.segments_deleted), (Offset(0), 0));
        assert_eq!(segment_names(dir.path()), names(&[0, 16, 32]));

        // 20 is inside segment 16: only segment 0 goes; the start is 16, not 20.
        let r = wal.trim_before(Offset(20)).unwrap();
        assert_eq!((r.first_offset, r.segments_deleted), (Offset(16), 1));
        assert!(r.bytes_deleted >= 64 * 1024, "{r:?}");
        assert_eq!(segment_names(dir.path()), names(&[16, 32]));
        assert_eq!(wal.first_offset(), Offset(16));
        assert_eq!(wal.stats().segments_trimmed, 1);
        match wal.read(Offset(0), 10, 1 << 20) {
            Err(WalError::Trimmed { requested, first }) => {
                assert_eq!((requested, first), (Offset(0), Offset(16)));
            }
            other => panic!("expected Trimmed, got {other:?}"),
        }
        let expected: Vec<Event> = (16..40).map(|o| record(o, 1, 3000)).collect();
        assert_eq!(read_all(&wal), expected);
        assert_eq!(wal.entry_epoch(Offset(15)), None);
        assert_eq!(wal.entry_epoch(Offset(16)), Some(Epoch(1)));

        // A truncation below the trim point is refused and changes nothing.
        let err = wal
            .append(Epoch(2), vec![record(3, 2, 10)])
            .wait()
            .unwrap_err();
        assert!(
            matches!(err, WalError::TruncateBelowStart { .. }),
            "{err:?}"
        );
        drop(wal);

        // Reopen: the start is the first segment's base, nothing is corruption.
        let rep = inspect(dir.path(), |_| {}).unwrap();
        assert!(matches!(rep.end, ScanEnd::Clean), "{:?}", rep.end);
        assert_eq!((rep.start, rep.next), (Offset(16), Offset(40)));
        let (wal, rec) = Wal::open(config(dir.path(), io)).unwrap();
        assert_eq!(rec.first, Offset(16));
        assert!(rec.torn_tail.is_none());
        assert_eq!(wal.first_offset(), Offset(16));
        assert_eq!(read_all(&wal), expected);

        // Appends continue; a trim far above the log keeps the last segment.
        append_range(&wal, 40, 42, 1, 3000);
        let r = wal.trim_before(Offset(1_000)).unwrap();
        assert_eq!((r.first_offset, r.segments_deleted), (Offset(32), 1));
        assert_eq!(segment_names(dir.path()), names(&[32]));
        let expected: Vec<Event> = (32..42).map(|o| record(o, 1, 3000)).collect();
        assert_eq!(read_all(&wal), expected);
        append_range(&wal, 42, 50, 1, 3000);
        drop(wal);
        let (wal, _) = Wal::open(config(dir.path(), io)).unwrap();
        assert_eq!(wal.first_offset(), Offset(32));
        assert_eq!(wal.next_offset(), Offset(50));
        let expected: Vec<Event> = (32..50).map(|o| record(o, 1, 3000)).collect();
        assert_eq!(read_all(&wal), expected);
    }
}

#[test]
fn trim_at_a_segment_base_deletes_the_segment_below_it() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    append_range(&wal, 0, 33, 1, 3000);
    assert_eq!(segment_names(dir.path()), names(&[0, 16, 32]));
    // Exactly 16: every entry of segment 0 is below it.
    let r = wal.trim_before(Offset(16)).unwrap();
    assert_eq!(r.first_offset, Offset(16));
    // 32 is the base of the segment holding the last durable entry: segment 16 goes,
    // segment 32 (one entry) stays.
    let r = wal.trim_before(Offset(32)).unwrap();
    assert_eq!(r.first_offset, Offset(32));
    assert_eq!(segment_names(dir.path()), names(&[32]));
    assert_eq!(read_all(&wal), vec![record(32, 1, 3000)]);
    // Reading at the durable end is still an empty answer, not an error.
    assert!(wal.read(Offset(33), 10, 1 << 20).unwrap().is_empty());
}
