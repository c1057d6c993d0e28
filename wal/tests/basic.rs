//! The whole API over the sync backend: append, read, reopen, validation, rolls.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

mod common;

use common::*;
use quire_proto::{Epoch, Event, EventKind, LogPosition, Offset};
use quire_wal::{IoBackend, Wal, WalError};

#[test]
fn append_read_reopen() {
    init_tracing();
    for io in backends() {
        append_read_reopen_with(io);
    }
}

fn append_read_reopen_with(io: IoBackend) {
    let dir = tempfile::tempdir().unwrap();
    let (wal, report) = Wal::open(config(dir.path(), io)).unwrap();
    assert_eq!(report.last, None);
    assert_eq!(wal.next_offset(), Offset(0));
    append_range(&wal, 0, 50, 1, 3000); // ~150 KB: several 64 KiB segments
    assert_eq!(
        wal.last(),
        Some(LogPosition {
            epoch: Epoch(1),
            offset: Offset(49)
        })
    );
    assert_eq!(wal.last_durable(), wal.last());
    let all = read_all(&wal);
    assert_eq!(all.len(), 50);
    for (i, r) in all.iter().enumerate() {
        assert_eq!(*r, record(i as u64, 1, 3000));
    }
    assert!(wal.stats().segments_created >= 3, "{:?}", wal.stats());
    drop(wal);

    let (wal, report) = Wal::open(config(dir.path(), io)).unwrap();
    assert_eq!(report.torn_tail, None);
    assert_eq!(report.entries, 50);
    assert_eq!(read_all(&wal), all);
    append_range(&wal, 50, 60, 2, 10);
    assert_eq!(wal.entry_epoch(Offset(49)), Some(Epoch(1)));
    assert_eq!(wal.entry_epoch(Offset(50)), Some(Epoch(2)));
    assert_eq!(wal.entry_epoch(Offset(60)), None);
}

#[test]
fn read_limits() {
    for io in backends() {
        read_limits_with(io);
    }
}

fn read_limits_with(io: IoBackend) {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), io)).unwrap();
    append_range(&wal, 0, 10, 1, 100);
    assert_eq!(wal.read(Offset(3), 4, 1 << 20).unwrap().len(), 4);
    // max_bytes bounds the payload, but the first record always comes.
    assert_eq!(wal.read(Offset(3), 100, 250).unwrap().len(), 2);
    assert_eq!(wal.read(Offset(3), 100, 1).unwrap().len(), 1);
    assert!(wal.read(Offset(10), 100, 1).unwrap().is_empty());
    assert!(matches!(
        wal.read(Offset(11), 1, 1),
        Err(WalError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn validation_errors_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    append_range(&wal, 0, 5, 3, 10);
    let e = |r: Result<Offset, WalError>| r.unwrap_err();
    assert!(matches!(
        e(wal.append(Epoch(3), vec![]).wait()),
        WalError::EmptyAppend
    ));
    assert!(matches!(
        e(wal.append(Epoch(3), vec![record(6, 3, 1)]).wait()),
        WalError::Gap { .. }
    ));
    assert!(matches!(
        e(wal
            .append(Epoch(3), vec![record(5, 3, 1), record(7, 3, 1)])
            .wait()),
        WalError::NotConsecutive { index: 1, .. }
    ));
    assert!(matches!(
        e(wal.append(Epoch(2), vec![record(5, 3, 1)]).wait()),
        WalError::EpochAboveWriter { .. }
    ));
    assert!(matches!(
        e(wal.append(Epoch(3), vec![record(5, 2, 1)]).wait()),
        WalError::EpochRegression { .. }
    ));
    // Same writer epoch as the entry at x: no truncation.
    assert!(matches!(
        e(wal.append(Epoch(3), vec![record(2, 3, 1)]).wait()),
        WalError::TruncationRefused { .. }
    ));
    let too_big = record(5, 3, 70 * 1024);
    assert!(matches!(
        e(wal.append(Epoch(3), vec![too_big]).wait()),
        WalError::TooLarge { what: "append", .. }
    ));
    assert_eq!(
        wal.last(),
        Some(LogPosition {
            epoch: Epoch(3),
            offset: Offset(4)
        })
    );
    assert_eq!(wal.stats().appends_refused, 7);
    append_range(&wal, 5, 6, 3, 10);
}

#[test]
fn many_records_in_one_append_and_async_poll() {
    for io in backends() {
        many_records_with(io);
    }
}

fn many_records_with(io: IoBackend) {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), io)).unwrap();
    let recs: Vec<_> = (0..100).map(|o| record(o, 1, 50)).collect();
    let fut = wal.append(Epoch(1), recs);
    // Drive the future with a minimal executor: poll, park until woken.
    let got = block_on(fut).unwrap();
    assert_eq!(got, Offset(99));
    assert_eq!(read_all(&wal).len(), 100);
}

#[test]
fn second_open_is_locked_out() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    assert!(matches!(
        Wal::open(config(dir.path(), IoBackend::Sync)),
        Err(WalError::Locked { .. })
    ));
    wal.close().unwrap();
    assert!(matches!(
        wal.append(Epoch(1), vec![record(0, 1, 1)]).wait(),
        Err(WalError::Closed)
    ));
    drop(wal);
    Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
}

fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Regression: a batch that ends fewer than 32 bytes before a block boundary leaves a
/// padding gap shorter than a record header. The first scan read a whole header there,
/// saw the next batch's checksum bytes after the zeros, and called a healthy log corrupt.
/// Found by the truncation model test (a 4066-byte batch: marker plus two records).
#[test]
fn padding_shorter_than_a_header_is_still_padding() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    let align = wal.alignment_bytes() as usize;
    for gap in [1usize, 5, 6, 31, 32, 33] {
        let o = wal.next_offset().0;
        // One record filling its block up to `gap` bytes before the boundary.
        wal.append(Epoch(1), vec![record(o, 1, align - gap - 32)])
            .wait()
            .unwrap();
        wal.append(Epoch(1), vec![record(o + 1, 1, 7)])
            .wait()
            .unwrap();
    }
    let all = read_all(&wal);
    drop(wal);
    let (wal, report) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    assert!(report.torn_tail.is_none());
    assert_eq!(read_all(&wal), all);
}

#[test]
fn dropping_the_last_handle_finishes_queued_appends() {
    for io in backends() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(config(dir.path(), io)).unwrap();
        let futs: Vec<_> = (0..50)
            .map(|o| wal.append(Epoch(1), vec![record(o, 1, 100)]))
            .collect();
        drop(wal);
        for (o, f) in futs.into_iter().enumerate() {
            assert_eq!(f.wait().unwrap(), Offset(o as u64));
        }
        let (wal, _) = Wal::open(config(dir.path(), io)).unwrap();
        assert_eq!(read_all(&wal).len(), 50);
    }
}

/// Payloads large enough for the non-temporal copy (4 KiB and up), packed several to an
/// append so that they start at every alignment in the batch buffer, each with bytes that
/// differ everywhere (no short period that a misplaced block could match): all read back
/// exactly, before and after a reopen (whose scan checks every checksum).
#[test]
fn large_payloads_at_every_alignment_read_back_exactly() {
    init_tracing();
    for io in backends() {
        large_payloads_with(io);
    }
}

fn large_payloads_with(io: IoBackend) {
    fn noise(offset: u64, len: usize) -> bytes::Bytes {
        let mut x = offset.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = quire_wal::WalConfig {
        segment_bytes_max: 4 << 20,
        batch_bytes_max: 1 << 20,
        ..config(dir.path(), io)
    };
    let (wal, _) = Wal::open(cfg.clone()).unwrap();
    let sizes = [
        4096,
        4097,
        4111,
        5000,
        8191,
        65_536 + 13,
        100_003,
        4096 + 64 + 7,
    ];
    let mut expected = Vec::new();
    let mut offset = 0u64;
    for round in 0..6 {
        let records: Vec<_> = sizes
            .iter()
            .skip(round)
            .map(|&len| {
                let r = Event {
                    epoch: Epoch(1),
                    offset: Offset(offset),
                    kind: EventKind::Message,
                    payload: noise(offset, len).into(),
                };
                offset += 1;
                r
            })
            .collect();
        expected.extend(records.iter().cloned());
        wal.append(Epoch(1), records).wait().unwrap();
    }
    assert_eq!(read_all(&wal), expected);
    drop(wal);
    let (wal, report) = Wal::open(cfg).unwrap();
    assert_eq!(report.torn_tail, None);
    assert_eq!(read_all(&wal), expected);
}

/// A record whose checksum is good but whose kind byte this build does not know (a newer
/// build's event, or bytes not written by Quire) opens fine — the scan checks framing, not
/// meaning — and a read that reaches it is a typed corruption error naming the record and
/// the byte, never a panic or a record of some other kind; reads around it succeed.
#[test]
fn a_record_of_an_unknown_kind_reads_as_a_typed_error() {
    use std::os::unix::fs::FileExt;

    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
        append_range(&wal, 0, 3, 1, 40);
        wal.close().unwrap();
    }
    let mut target = None;
    let scan = quire_wal::scan::scan_dir(dir.path(), &mut |r| {
        if r.header.is_some_and(|h| h.offset == Offset(1)) {
            target = Some((r.segment.to_path_buf(), r.position.0, r.payload.to_vec()));
        }
    })
    .unwrap();
    let (segment, position, payload) = target.expect("offset 1 was written");
    let tag = scan.segments[0].tag;
    let mut record = vec![0u8; quire_wal::format::record_bytes(payload.len())];
    quire_wal::format::encode(&mut record, tag, Epoch(1), Offset(1), 0x42, &payload);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap();
    file.write_all_at(&record, position).unwrap();
    file.sync_all().unwrap();

    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    assert_eq!(wal.read(Offset(0), 1, 1 << 20).unwrap().len(), 1);
    match wal.read(Offset(1), 1, 1 << 20) {
        Err(WalError::Corruption {
            offset,
            problem: quire_wal::CorruptionKind::UnknownEventKind { byte: 0x42 },
            ..
        }) => assert_eq!(offset, Offset(1)),
        other => panic!("expected an unknown-kind corruption error, got {other:?}"),
    }
    // A read across it stops before it: the good record is returned, not the error.
    let before = wal.read(Offset(0), 3, 1 << 20).unwrap();
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].offset, Offset(0));
    assert_eq!(wal.read(Offset(2), 1, 1 << 20).unwrap().len(), 1);
}

/// A bit flipped in a durable record while the log is open (the page cache the reader
/// shares with the disk now holds the bad byte): a read across it returns the good records
/// before it, a read that starts at it fails with a located `ReadMismatch` (never "absent",
/// never the bad bytes), and the records after it still read back.
#[test]
fn a_bit_flipped_at_run_time_ends_reads_at_the_bad_record() {
    use std::os::unix::fs::FileExt;

    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    append_range(&wal, 0, 10, 1, 100);
    let mut target = None;
    quire_wal::scan::scan_dir(dir.path(), &mut |r| {
        if r.header.is_some_and(|h| h.offset == Offset(6)) {
            target = Some((r.segment.to_path_buf(), r.position.0));
        }
    })
    .unwrap();
    let (segment, position) = target.expect("offset 6 was written");
    assert!(wal.corrupt_records().is_empty());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&segment)
        .unwrap();
    let at = position + quire_wal::format::HEADER_BYTES as u64 + 17;
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0x10], at).unwrap();

    let got = wal.read(Offset(2), 100, 1 << 20).unwrap();
    let offsets: Vec<u64> = got.iter().map(|e| e.offset.0).collect();
    assert_eq!(offsets, vec![2, 3, 4, 5]);
    match wal.read(Offset(6), 100, 1 << 20) {
        Err(WalError::Corruption {
            offset,
            problem: quire_wal::CorruptionKind::ReadMismatch,
            ..
        }) => assert_eq!(offset, Offset(6)),
        other => panic!("expected a located read mismatch, got {other:?}"),
    }
    let after = wal.read(Offset(7), 100, 1 << 20).unwrap();
    assert_eq!(after.len(), 3);
    assert_eq!(after[0].offset, Offset(7));
    // The log remembers what its reads found, for the store not to vote with it.
    assert_eq!(wal.corrupt_records(), vec![Offset(6)]);
}

/// Spares prepared by `fallocate` alone (`SpareFill::Allocate`): appends go into unwritten
/// extents across several segments, nothing is zero-filled, and the log reads back whole
/// before and after a reopen (unwritten extents read as zeros, so the scan ends cleanly).
#[test]
fn a_log_on_allocated_spares_reads_back_after_a_reopen() {
    for io in common::backends() {
        let dir = tempfile::tempdir().unwrap();
        let config = quire_wal::WalConfig {
            spare_fill: quire_wal::SpareFill::Allocate,
            ..common::config(dir.path(), io)
        };
        let (wal, _) = Wal::open(config.clone()).unwrap();
        common::append_range(&wal, 0, 60, 1, 3000);
        let stats = wal.stats();
        assert!(stats.segments_created >= 3, "{stats:?}");
        assert_eq!(stats.spare_zero_bytes, 0, "{stats:?}");
        let before = common::read_all(&wal);
        wal.close().unwrap();
        drop(wal);
        let (wal, report) = Wal::open(config).unwrap();
        assert!(report.torn_tail.is_none(), "{report:?}");
        assert_eq!(common::read_all(&wal), before);
        assert_eq!(before.len(), 60);
        common::append_range(&wal, 60, 65, 1, 3000);
        wal.close().unwrap();
    }
}

/// A damaged header on the newest segment is corruption, never a torn tail: with one bit
/// of its magic flipped, or its first sector zeroed, the segment could pass for a
/// version-1 segment, its records would be invisible and a cut would delete them. The
/// open refuses, and the files are left as they were.
#[test]
fn a_damaged_header_on_the_last_segment_refuses_the_open() {
    use std::os::unix::fs::FileExt;
    for (what, damage) in [
        ("a flipped magic bit", 0usize),
        ("a zeroed first sector", 1usize),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (config, last) = log_of_segments(dir.path());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&last)
            .unwrap();
        if damage == 0 {
            let mut byte = [0u8; 1];
            file.read_exact_at(&mut byte, 4).unwrap();
            file.write_all_at(&[byte[0] ^ 1], 4).unwrap();
        } else {
            file.write_all_at(&[0u8; 512], 0).unwrap();
        }
        file.sync_all().unwrap();
        let before = std::fs::read(&last).unwrap();
        let expected = if damage == 0 {
            quire_wal::format::SegmentHeaderProblem::BadMagic
        } else {
            quire_wal::format::SegmentHeaderProblem::Missing
        };
        match Wal::open(config) {
            Err(WalError::Corruption {
                problem: quire_wal::CorruptionKind::SegmentHeader { problem },
                ..
            }) => assert_eq!(problem, expected, "{what}"),
            other => panic!("{what}: expected a segment-header corruption, got {other:?}"),
        }
        assert_eq!(
            std::fs::read(&last).unwrap(),
            before,
            "{what}: the file changed"
        );
    }
}

/// Two faults at once: the last segment cut to nothing (acknowledged records gone) and an
/// empty file named past the end. The gap rule deletes the empty file, and because the
/// segment before the gap was cut short, the pre-cut hook (quire-node's tail-cut mark)
/// is still called: the store must not vote as if its log were whole.
#[test]
fn a_gap_after_a_cut_segment_still_marks_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (config, last) = log_of_segments(dir.path());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(0)
        .unwrap();
    let stray = dir
        .path()
        .join(quire_wal::segment::segment_name(Offset(1000)));
    std::fs::File::create(&stray).unwrap();
    let mut marks = Vec::new();
    let (_wal, report) = Wal::open_in(
        quire_wal::OsStorage,
        config,
        None,
        &mut |t| {
            marks.push(t.offset);
            Ok(())
        },
        quire_wal::Mutations::default(),
    )
    .unwrap();
    let torn = report.torn_tail.expect("a torn tail is reported");
    assert!(
        matches!(torn.problem, quire_wal::BadRecord::SegmentGap { .. }),
        "{torn:?}"
    );
    assert_eq!(marks.len(), 1, "the store is marked");
    assert!(!stray.exists(), "the empty segment past the end is deleted");
}

/// Writes 60 records of 3,000 bytes in `dir` (several 64 KiB segments, sync backend) and
/// closes the log. Returns its configuration and the newest segment's path.
fn log_of_segments(dir: &std::path::Path) -> (quire_wal::WalConfig, std::path::PathBuf) {
    let config = common::config(dir, IoBackend::Sync);
    let (wal, _) = Wal::open(config.clone()).unwrap();
    common::append_range(&wal, 0, 60, 1, 3000);
    wal.close().unwrap();
    drop(wal);
    let scan = quire_wal::scan::scan_dir(dir, &mut |_| {}).unwrap();
    assert!(scan.segments.len() >= 3, "{:?}", scan.segments.len());
    (config, scan.segments.last().unwrap().path.clone())
}

/// Flips one bit of the durable record at `offset` (bit 0 of its sixth payload byte)
/// through the file system while the log is open (the reader sees it through the page
/// cache).
fn flip_record_at_run_time(dir: &std::path::Path, offset: u64) {
    flip_record_bit(dir, offset, quire_wal::format::HEADER_BYTES as u64 + 5, 0);
}

/// Flips bit `bit` of byte `at` (counted from the record's start) of the durable record at
/// `offset`, through the file system while the log is open.
fn flip_record_bit(dir: &std::path::Path, offset: u64, at: u64, bit: u8) {
    use std::os::unix::fs::FileExt;

    let mut target = None;
    quire_wal::scan::scan_dir(dir, &mut |r| {
        if r.header.is_some_and(|h| h.offset == Offset(offset)) {
            target = Some((r.segment.to_path_buf(), r.position.0));
        }
    })
    .unwrap();
    let (segment, position) = target.expect("the offset was written");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(segment)
        .unwrap();
    let at = position + at;
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ (1 << bit)], at).unwrap();
}

/// A truncation replaces the entries from its offset on: a damaged one among them is no
/// longer damaged (the store would otherwise refuse fences for an entry it no longer has).
#[test]
fn a_truncation_forgets_the_damaged_records_it_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    append_range(&wal, 0, 20, 1, 40);
    for o in [15, 5] {
        flip_record_at_run_time(dir.path(), o);
        assert!(wal.read(Offset(o), 1, 1 << 20).is_err());
    }
    assert_eq!(wal.corrupt_records(), vec![Offset(5), Offset(15)]);
    assert_eq!(wal.first_corrupt_record(), Some(Offset(5)));
    // A master of epoch 2 replaces the suffix from 10.
    wal.append(Epoch(2), vec![record(10, 2, 40)])
        .wait()
        .unwrap();
    assert_eq!(wal.corrupt_records(), vec![Offset(5)]);
    assert_eq!(wal.first_corrupt_record(), Some(Offset(5)));
    wal.append(Epoch(3), vec![record(3, 3, 40)]).wait().unwrap();
    assert!(wal.corrupt_records().is_empty());
    assert_eq!(wal.first_corrupt_record(), None);
}

/// At an epoch boundary the neighbours' epochs differ: a damaged epoch field is still
/// put back exactly (the checksum tells which one-bit change is the record's), so the
/// damaged entry opens with its own epoch and is repaired; as is a damaged length field
/// of a batch's last record (zeros follow it, so its extent alone proves nothing).
#[test]
fn a_damaged_epoch_or_length_field_at_a_boundary_opens_with_the_true_value() {
    use quire_proto::RepairOutcome;

    let dir = tempfile::tempdir().unwrap();
    let placing = quire_wal::WalConfig {
        damaged_records: quire_wal::DamagedRecords::Place,
        ..config(dir.path(), IoBackend::Sync)
    };
    let (wal, _) = Wal::open(placing.clone()).unwrap();
    append_range(&wal, 0, 10, 65538, 185);
    append_range(&wal, 10, 20, 131073, 185);
    wal.close().unwrap();
    drop(wal);
    // (offset, byte, bit): the last entry of epoch 65538 and the first of 131073 (epoch
    // field, low byte), and a batch's last record (length field: 185 -> 187).
    for (offset, at, bit) in [(9, 16, 0), (10, 16, 0), (10, 16, 1), (5, 8, 1)] {
        flip_record_bit(dir.path(), offset, at, bit);
        let (wal, report) = Wal::open(placing.clone()).unwrap();
        assert_eq!(
            report.damaged,
            vec![Offset(offset)],
            "offset {offset} byte {at}"
        );
        let epoch = if offset < 10 { 65538 } else { 131073 };
        assert_eq!(wal.entry_epoch(Offset(offset)), Some(Epoch(epoch)));
        assert_eq!(
            wal.repair_record(&record(offset, epoch, 185)).unwrap(),
            RepairOutcome::Repaired,
            "offset {offset} byte {at} bit {bit}"
        );
        wal.close().unwrap();
    }
    let (wal, report) = Wal::open(placing).unwrap();
    assert!(report.damaged.is_empty());
    assert_eq!(read_all(&wal).len(), 20);
}

/// Whichever bit of a record one flip hits (its checksum, any header field, its payload),
/// the damaged record is refused to readers and the good copy repairs it.
#[test]
fn a_flip_of_any_bit_of_a_record_is_repaired_by_the_good_copy() {
    use quire_proto::RepairOutcome;

    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    append_range(&wal, 0, 20, 1, 40);
    let good = record(7, 1, 40);
    let bytes = quire_wal::format::HEADER_BYTES as u64 + 40;
    for at in 0..bytes {
        for bit in [0, 5, 7] {
            flip_record_bit(dir.path(), 7, at, bit);
            assert!(
                wal.read(Offset(7), 1, 1 << 20).is_err(),
                "bit {bit} of byte {at}: the damaged record is not served"
            );
            assert_eq!(
                wal.repair_record(&good).unwrap(),
                RepairOutcome::Repaired,
                "bit {bit} of byte {at}"
            );
            assert_eq!(wal.read(Offset(7), 1, 1 << 20).unwrap(), vec![good.clone()]);
        }
    }
    assert!(wal.corrupt_records().is_empty());
}

/// A damaged record is rewritten in place from a good copy, in a sealed segment and in the
/// one appends go to: only the same entry (same epoch and size, and agreeing with what the
/// damaged record still shows) is written; afterwards it reads back, leaves the damaged
/// list, appends go on, and the log reopens clean.
#[test]
fn a_damaged_record_is_repaired_in_place_from_a_good_copy() {
    use quire_proto::RepairOutcome;

    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    append_range(&wal, 0, 300, 1, 1000);
    assert!(
        quire_wal::scan::scan_dir(dir.path(), &mut |_| {})
            .unwrap()
            .segments
            .len()
            >= 4
    );
    let good = record(10, 1, 1000);
    flip_record_at_run_time(dir.path(), 10);
    assert!(matches!(
        wal.read(Offset(10), 1, 1 << 20),
        Err(WalError::Corruption {
            offset: Offset(10),
            ..
        })
    ));
    assert_eq!(wal.corrupt_records(), vec![Offset(10)]);

    // Not the same entry: nothing written.
    let other_epoch = Event {
        epoch: Epoch(2),
        ..good.clone()
    };
    assert_eq!(
        wal.repair_record(&other_epoch).unwrap(),
        RepairOutcome::OtherEntry
    );
    assert_eq!(
        wal.repair_record(&record(10, 1, 999)).unwrap(),
        RepairOutcome::OtherEntry
    );
    assert_eq!(
        wal.repair_record(&record(5000, 1, 1000)).unwrap(),
        RepairOutcome::NotHeld
    );
    assert!(wal.read(Offset(10), 1, 1 << 20).is_err());

    // The good copy: rewritten, read back, forgotten as damaged.
    assert_eq!(wal.repair_record(&good).unwrap(), RepairOutcome::Repaired);
    assert_eq!(
        wal.read(Offset(10), 1, 1 << 20).unwrap(),
        vec![good.clone()]
    );
    assert!(wal.corrupt_records().is_empty());
    assert_eq!(
        wal.repair_record(&good).unwrap(),
        RepairOutcome::AlreadyGood
    );

    // A copy that differs from what the damaged record still shows is refused: here the
    // flip hit the payload, so the stored checksum is the good copy's, and a copy of the
    // same size and epoch with another payload or kind is not this entry.
    flip_record_at_run_time(dir.path(), 12);
    assert!(wal.read(Offset(12), 1, 1 << 20).is_err());
    let forged = Event {
        payload: bytes::Bytes::from(vec![0x5a; 1000]).into(),
        ..record(12, 1, 1000)
    };
    assert_eq!(
        wal.repair_record(&forged).unwrap(),
        RepairOutcome::OtherEntry
    );
    let other_kind = Event {
        kind: EventKind::CursorCommit,
        ..record(12, 1, 1000)
    };
    assert_eq!(
        wal.repair_record(&other_kind).unwrap(),
        RepairOutcome::OtherEntry
    );
    assert_eq!(
        wal.repair_record(&record(12, 1, 1000)).unwrap(),
        RepairOutcome::Repaired
    );
    // ... and a good record is not "repaired" with other bytes.
    assert_eq!(
        wal.repair_record(&forged).unwrap(),
        RepairOutcome::OtherEntry
    );

    // The segment appends go to is repaired in place too (its blocks are never written
    // again), and appends after it go on.
    flip_record_at_run_time(dir.path(), 297);
    assert!(wal.read(Offset(297), 1, 1 << 20).is_err());
    assert_eq!(
        wal.repair_record(&record(297, 1, 1000)).unwrap(),
        RepairOutcome::Repaired
    );
    assert!(wal.corrupt_records().is_empty());
    append_range(&wal, 300, 400, 1, 1000);
    wal.close().unwrap();
    drop(wal);
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    let all = read_all(&wal);
    assert_eq!(all.len(), 400);
    assert!(all
        .iter()
        .enumerate()
        .all(|(i, e)| *e == record(i as u64, 1, 1000)));
}
