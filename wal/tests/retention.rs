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
        // One block per record, 15 per 64 KiB segment after its header block: segments 0,
        // 15, 30.
        append_range(&wal, 0, 40, 1, 3000);
        assert_eq!(segment_names(dir.path()), names(&[0, 15, 30]));

        // Nothing lies wholly below 10: no change.
        let r = wal.trim_before(Offset(10)).unwrap();
        assert_eq!((r.first_offset, r.segments_deleted), (Offset(0), 0));
        assert_eq!(segment_names(dir.path()), names(&[0, 15, 30]));

        // 20 is inside segment 15: only segment 0 goes; the start is 15, not 20.
        let r = wal.trim_before(Offset(20)).unwrap();
        assert_eq!((r.first_offset, r.segments_deleted), (Offset(15), 1));
        assert!(r.bytes_deleted >= 64 * 1024, "{r:?}");
        assert_eq!(segment_names(dir.path()), names(&[15, 30]));
        assert_eq!(wal.first_offset(), Offset(15));
        assert_eq!(wal.stats().segments_trimmed, 1);
        match wal.read(Offset(0), 10, 1 << 20) {
            Err(WalError::Trimmed { requested, first }) => {
                assert_eq!((requested, first), (Offset(0), Offset(15)));
            }
            other => panic!("expected Trimmed, got {other:?}"),
        }
        let expected: Vec<Event> = (15..40).map(|o| record(o, 1, 3000)).collect();
        assert_eq!(read_all(&wal), expected);
        assert_eq!(wal.entry_epoch(Offset(14)), None);
        assert_eq!(wal.entry_epoch(Offset(15)), Some(Epoch(1)));

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
        assert_eq!((rep.start, rep.next), (Offset(15), Offset(40)));
        let (wal, rec) = Wal::open(config(dir.path(), io)).unwrap();
        assert_eq!(rec.first, Offset(15));
        assert!(rec.torn_tail.is_none());
        assert_eq!(wal.first_offset(), Offset(15));
        assert_eq!(read_all(&wal), expected);

        // Appends continue; a trim far above the log keeps the last segment.
        append_range(&wal, 40, 42, 1, 3000);
        let r = wal.trim_before(Offset(1_000)).unwrap();
        assert_eq!((r.first_offset, r.segments_deleted), (Offset(30), 1));
        assert_eq!(segment_names(dir.path()), names(&[30]));
        let expected: Vec<Event> = (30..42).map(|o| record(o, 1, 3000)).collect();
        assert_eq!(read_all(&wal), expected);
        append_range(&wal, 42, 50, 1, 3000);
        drop(wal);
        let (wal, _) = Wal::open(config(dir.path(), io)).unwrap();
        assert_eq!(wal.first_offset(), Offset(30));
        assert_eq!(wal.next_offset(), Offset(50));
        let expected: Vec<Event> = (30..50).map(|o| record(o, 1, 3000)).collect();
        assert_eq!(read_all(&wal), expected);
    }
}

#[test]
fn trim_at_a_segment_base_deletes_the_segment_below_it() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    append_range(&wal, 0, 31, 1, 3000);
    assert_eq!(segment_names(dir.path()), names(&[0, 15, 30]));
    // Exactly 15: every entry of segment 0 is below it.
    let r = wal.trim_before(Offset(15)).unwrap();
    assert_eq!(r.first_offset, Offset(15));
    // 30 is the base of the segment holding the last durable entry: segment 15 goes,
    // segment 30 (one entry) stays.
    let r = wal.trim_before(Offset(30)).unwrap();
    assert_eq!(r.first_offset, Offset(30));
    assert_eq!(segment_names(dir.path()), names(&[30]));
    assert_eq!(read_all(&wal), vec![record(30, 1, 3000)]);
    // Reading at the durable end is still an empty answer, not an error.
    assert!(wal.read(Offset(31), 10, 1 << 20).unwrap().is_empty());
}
