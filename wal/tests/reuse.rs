//! Segment files reused under retention (docs/format.md, "Reuse"): a trimmed segment's
//! file becomes the next spare with only a new header written, and nothing of its earlier
//! life — not its records, not a record one of its payloads embeds, not a version-1
//! record — ever reads as a record of its current life. A damaged record of the current
//! life is still found: it is a torn tail (which quire-node marks), never taken for
//! left-over bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{append_range, config, read_all, record};
use quire_proto::{Epoch, Event, Offset};
use quire_wal::format::{self, SegmentTag};
use quire_wal::{inspect, IoBackend, RecordStatus, ScanEnd, Wal};

/// Every 3000-byte record takes one 4 KiB block: 15 per 64 KiB segment.
const LEN: usize = 3000;

/// A log of 0..`next` that has rolled onto at least one reused file, trimmed to keep its
/// last two segments. Returns the events it holds.
fn log_on_reused_files(dir: &Path) -> Vec<Event> {
    let (wal, _) = Wal::open(config(dir, IoBackend::Sync)).unwrap();
    let mut next = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while wal.stats().spares_reused == 0 || next < 120 {
        assert!(
            Instant::now() < deadline,
            "no spare was made from a reused file"
        );
        append_range(&wal, next, next + 5, 1, LEN);
        next += 5;
        wal.trim_before(Offset(next.saturating_sub(20))).unwrap();
    }
    // One more, so that the last segment has room after its last record.
    if next % 15 == 0 {
        append_range(&wal, next, next + 1, 1, LEN);
    }
    let s = wal.stats();
    assert!(s.segments_reused >= 1 && s.spares_reused >= 1, "{s:?}");
    println!(
        "segments trimmed {}, reused {}, spares made from reused files {}, zeros written {} B",
        s.segments_trimmed, s.segments_reused, s.spares_reused, s.spare_zero_bytes
    );
    let events = read_all(&wal);
    wal.close().unwrap();
    events
}

/// The last segment, its tag, and where the next block after its last record starts.
fn tail_of(dir: &Path) -> (PathBuf, SegmentTag, u64, Offset) {
    let mut end = 0;
    let report = inspect(dir, |r| {
        if r.status == RecordStatus::Entry {
            end = r.position.0 + r.bytes;
        }
    })
    .unwrap();
    assert!(matches!(report.end, ScanEnd::Clean), "{:?}", report.end);
    let last = report.segments.last().unwrap();
    assert!(
        format::align_up(end, 4096) < last.file_bytes,
        "room after the last record"
    );
    (
        last.path.clone(),
        last.tag,
        format::align_up(end, 4096),
        report.next,
    )
}

fn plant(path: &Path, position: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, position).unwrap();
    f.sync_all().unwrap();
}

fn encoded(tag: SegmentTag, offset: Offset) -> Vec<u8> {
    let payload = vec![0x5A; 100];
    let mut buf = vec![0u8; format::record_bytes(payload.len())];
    format::encode(&mut buf, tag, Epoch(1), offset, 1, &payload);
    buf
}

#[test]
fn a_log_on_reused_files_reads_back_whole_and_reopens_clean() {
    let dir = tempfile::tempdir().unwrap();
    let events = log_on_reused_files(dir.path());
    let (wal, rec) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    assert!(rec.torn_tail.is_none(), "{:?}", rec.torn_tail);
    assert_eq!(read_all(&wal), events);
    let first = events[0].offset.0;
    let next = first + events.len() as u64;
    append_range(&wal, next, next + 40, 2, LEN);
    let mut expected = events;
    expected.extend((next..next + 40).map(|o| record(o, 2, LEN)));
    assert_eq!(read_all(&wal), expected);
}

/// A well-formed record with exactly the next expected offset, left in the file by an
/// earlier life (another tag) or by a version-1 life, or embedded in a payload by a
/// producer who cannot know the tag: it never counts, and the log ends before it cleanly
/// (nothing to cut, no tail-cut mark) even where a record of this life would start —
/// unless its tag shares the segment's record field (then it is cut as a torn tail).
/// Appends write over it.
#[test]
fn a_record_from_another_life_never_counts_whatever_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let events = log_on_reused_files(dir.path());
    let (segment, tag, block, next) = tail_of(dir.path());
    assert_ne!(tag, SegmentTag::V1, "the last segment is version 2");
    let other = SegmentTag::new(tag.get() ^ (1 << 63)).unwrap();
    for (what, bytes) in [
        (
            "another tag with the same record field",
            encoded(other, next),
        ),
        (
            "another tag",
            encoded(SegmentTag::new(0xfeed_f00d).unwrap(), next),
        ),
        ("version 1", encoded(SegmentTag::V1, next)),
    ] {
        plant(&segment, block, &bytes);
        let (wal, rec) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
        // Only a header with the segment's record field (odds 2^-32 for an earlier life)
        // reads as a damaged record of this life: cut as a torn tail, the safe side.
        let same_field = what.contains("same record field");
        assert_eq!(
            rec.torn_tail.is_some(),
            same_field,
            "{what}: {:?}",
            rec.torn_tail
        );
        assert_eq!(wal.next_offset(), next, "{what}");
        assert_eq!(read_all(&wal), events, "{what}");
    }
    // The next append lands on it, and reads back as written.
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    append_range(&wal, next.0, next.0 + 1, 2, LEN);
    drop(wal);
    let (wal, rec) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    assert!(rec.torn_tail.is_none());
    assert_eq!(read_all(&wal).last(), Some(&record(next.0, 2, LEN)));
}

/// Damage to the current life is never mistaken for an earlier one: a record of the
/// segment's tag whose checksum fails, and the last record with one bit of its tag field
/// flipped, are both torn tails (reported to the pre-cut hook, where quire-node writes its
/// tail-cut mark), and a second open finds nothing more to cut.
#[test]
fn damage_to_the_current_life_is_a_torn_tail() {
    for case in [
        "bad checksum after the end",
        "tag bit flipped in the last record",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let events = log_on_reused_files(dir.path());
        let (segment, tag, block, next) = tail_of(dir.path());
        let expect_next = if case.starts_with("bad") {
            let mut bytes = encoded(tag, next);
            let n = bytes.len();
            bytes[n - 1] ^= 1;
            plant(&segment, block, &bytes);
            next
        } else {
            let mut last = None;
            inspect(dir.path(), |r| {
                if r.status == RecordStatus::Entry {
                    last = Some(r.position.0);
                }
            })
            .unwrap();
            let position = last.unwrap();
            let mut b = [0u8; 1];
            let f = std::fs::File::open(&segment).unwrap();
            f.read_exact_at(&mut b, position + 12).unwrap();
            plant(&segment, position + 12, &[b[0] ^ 0x10]);
            Offset(next.0 - 1)
        };
        let mut seen = Vec::new();
        let (wal, rec) = Wal::open_with_hook(config(dir.path(), IoBackend::Sync), None, &mut |t| {
            seen.push(t.offset);
            Ok(())
        })
        .unwrap();
        assert_eq!(
            seen,
            vec![expect_next],
            "{case}: the hook saw the torn tail"
        );
        assert!(rec.torn_tail.is_some(), "{case}");
        assert_eq!(wal.next_offset(), expect_next, "{case}");
        let kept = usize::try_from(expect_next.0 - events[0].offset.0).unwrap();
        assert_eq!(read_all(&wal), events[..kept], "{case}");
        drop(wal);
        let (_, rec) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
        assert!(
            rec.torn_tail.is_none(),
            "{case}: cut twice: {:?}",
            rec.torn_tail
        );
    }
}

/// A directory written by a build before segment headers: version-1 segments (records from
/// position 0, no tag) read as before; the last one keeps taking version-1 records until
/// it rolls, and the next segment is version 2.
#[test]
fn a_version_1_log_is_read_continued_and_rolled_onto_version_2() {
    let dir = tempfile::tempdir().unwrap();
    // What a version-1 WAL left: a 64 KiB segment with records 0..5 of 3000 bytes, one
    // 4 KiB block each, and zeros after them.
    let mut file = vec![0u8; 64 * 1024];
    for o in 0..5u64 {
        let e = record(o, 1, LEN);
        let at = usize::try_from(o).unwrap() * 4096;
        format::encode(
            &mut file[at..],
            SegmentTag::V1,
            e.epoch,
            e.offset,
            1,
            &e.payload.chunks().concat(),
        );
    }
    std::fs::write(dir.path().join("00000000000000000000.log"), &file).unwrap();
    let (wal, rec) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    assert!(rec.torn_tail.is_none(), "{:?}", rec.torn_tail);
    assert_eq!(wal.next_offset(), Offset(5));
    // 16 blocks per version-1 segment: 11 more fit, then a version-2 segment starts.
    append_range(&wal, 5, 30, 1, LEN);
    let expected: Vec<Event> = (0..30).map(|o| record(o, 1, LEN)).collect();
    assert_eq!(read_all(&wal), expected);
    drop(wal);
    let report = inspect(dir.path(), |_| {}).unwrap();
    assert!(matches!(report.end, ScanEnd::Clean), "{:?}", report.end);
    let versions: Vec<(u64, u8)> = report
        .segments
        .iter()
        .map(|s| (s.base.0, s.version()))
        .collect();
    assert_eq!(versions, vec![(0, 1), (16, 2)]);
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    assert_eq!(read_all(&wal), expected);
}
