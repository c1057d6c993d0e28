//! Segment rolls off the commit path (issue 17, item 2): a roll does not wait for the old
//! segment's batches to become durable, the new segment's name is made durable by a
//! directory fsync that runs beside the writes, and appends are still acknowledged in log
//! order, each only once its batch, every batch before it and its segment's name are
//! durable. With `stagger_rolls`, a fresh log's first segment ends at a point drawn from
//! the storage's randomness, so logs fed the same appends roll at different offsets.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::path::Path;

use bytes::Bytes;
use quire_proto::{Epoch, Event, EventKind, Offset};
use quire_wal::disk::{StepControl, StepDisk};
use quire_wal::{Append, CrashDisk, Mutations, Storage, Wal, WalConfig, SEGMENT_BYTES_MIN};

const DIR: &str = "/wal";

/// A 3000-byte record takes one 4 KiB block: a 64 KiB segment holds its header block and
/// 15 of them.
fn record(offset: u64) -> Event {
    Event {
        epoch: Epoch(1),
        offset: Offset(offset),
        kind: EventKind::Message,
        payload: Bytes::from(vec![u8::try_from(offset % 251).unwrap(); 3000]).into(),
    }
}

fn open(disk: &CrashDisk, stagger_rolls: bool) -> (Wal<CrashDisk>, StepControl) {
    disk.create_dir_all(Path::new(DIR)).unwrap();
    let (step, control) = StepDisk::new();
    let config = WalConfig {
        segment_bytes_max: SEGMENT_BYTES_MIN,
        batch_window_us: 0,
        stagger_rolls,
        ..WalConfig::new(DIR)
    };
    let (wal, _) = Wal::open_in(
        disk.clone(),
        config,
        Some(Box::new(step)),
        &mut |_| Ok(()),
        Mutations::default(),
    )
    .unwrap();
    (wal, control)
}

fn done(a: &mut Append) -> bool {
    match a.try_result() {
        None => false,
        Some(r) => {
            r.unwrap();
            true
        }
    }
}

/// The first segment fills while the fdatasync of its last batch is still running; the
/// next append rolls onto a new segment and is written at once, before that fdatasync
/// completes. The acknowledgements then come in log order, the new segment's only after
/// the directory fsync.
#[test]
fn a_roll_writes_on_while_the_old_segment_waits_for_its_fdatasync() {
    let disk = CrashDisk::new(7);
    let (wal, step) = open(&disk, false);
    for o in 0..14 {
        let a = wal.append(Epoch(1), vec![record(o)]);
        step.settle();
        step.complete_all_syncs();
        step.settle();
        a.wait().unwrap();
    }
    // Offset 14 is the first segment's last record: written, its fdatasync held.
    let mut last_old = wal.append(Epoch(1), vec![record(14)]);
    step.settle();
    assert_eq!(step.held_syncs(), 1);
    // Offset 15 does not fit: the roll renames the spare and writes at once.
    let mut first_new = wal.append(Epoch(1), vec![record(15)]);
    step.settle();
    let trace = disk.trace();
    let new_name = "00000000000000000015.log";
    let rename = trace
        .iter()
        .position(|op| op.starts_with("rename") && op.ends_with(new_name))
        .expect("the roll renamed the spare");
    assert!(
        trace[rename..]
            .iter()
            .any(|op| op.starts_with("write") && op.contains(new_name)),
        "the new segment is written before the old one's fdatasync completes: {trace:#?}"
    );
    assert!(
        !trace[rename..].iter().any(|op| op.starts_with("fsync dir")),
        "the directory fsync is not run in line with the roll"
    );
    // Held: the old segment's fdatasync, the new one's, and the directory's fsync.
    assert_eq!(step.held_syncs(), 3);
    assert!(!done(&mut last_old) && !done(&mut first_new));

    step.complete_sync(); // the old segment's fdatasync
    step.settle();
    assert!(done(&mut last_old));
    assert!(!done(&mut first_new));

    step.complete_sync(); // the new segment's fdatasync: its name is not durable yet
    step.settle();
    assert!(!done(&mut first_new));

    step.complete_sync(); // the directory fsync
    step.settle();
    assert!(done(&mut first_new));
    assert_eq!(disk.trace().last().unwrap(), "fsync dir /wal");
    wal.close().unwrap();
}

/// Where a fresh log first rolls, for a disk seeded `seed`.
fn first_roll(seed: u64, stagger_rolls: bool) -> u64 {
    let disk = CrashDisk::new(seed);
    let (wal, step) = open(&disk, stagger_rolls);
    for o in 0..40 {
        let a = wal.append(Epoch(1), vec![record(o)]);
        step.settle();
        step.complete_all_syncs();
        step.settle();
        a.wait().unwrap();
    }
    wal.close().unwrap();
    let mut names: Vec<String> = disk
        .list_dir(Path::new(DIR))
        .unwrap()
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| n.ends_with(".log"))
        .collect();
    names.sort();
    names[1].trim_end_matches(".log").parse().unwrap()
}

/// Without staggering every log rolls after 15 records; with it, the first roll comes
/// after 8 to 15 (the second half of the segment), at a point each disk's randomness picks.
#[test]
fn staggered_logs_roll_their_first_segment_at_different_points() {
    assert!((0..4).all(|seed| first_roll(seed, false) == 15));
    let points: Vec<u64> = (0..8).map(|seed| first_roll(seed, true)).collect();
    assert!(points.iter().all(|&p| (8..=15).contains(&p)), "{points:?}");
    let mut distinct = points.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() >= 3, "{points:?}");
}

/// The story of a finding (quire-sim liveness seed 2324): a roll renamed the spare and
/// wrote the new segment; then the fdatasyncs of both segments and the directory fsync
/// failed with EIO (the log failed), a later directory fsync for another file (the store's
/// promised epoch) made the rename durable, and the machine lost power keeping nothing
/// un-synced. The new segment's name survived without any of its records, and without the
/// old segment's last batch: its base lay past the log's end, and the open refused it as a
/// missing segment (corruption), so the store never started again. Nothing in it or after
/// it was ever acknowledged, and no record is removed: the log now ends there, the empty
/// segment is deleted, and the store is not marked (as when an unsynced tail is lost whole).
#[test]
fn a_named_segment_past_the_durable_end_ends_the_log_without_a_mark() {
    let disk = CrashDisk::new(11);
    let (wal, step) = open(&disk, false);
    for o in 0..14 {
        let a = wal.append(Epoch(1), vec![record(o)]);
        step.settle();
        step.complete_all_syncs();
        step.settle();
        a.wait().unwrap();
    }
    let last_old = wal.append(Epoch(1), vec![record(14)]);
    step.settle();
    let first_new = wal.append(Epoch(1), vec![record(15)]);
    step.settle();
    assert_eq!(step.held_syncs(), 3);
    disk.fail_syncs(Some(libc::EIO));
    step.complete_all_syncs();
    step.settle();
    disk.fail_syncs(None);
    assert!(last_old.wait().is_err() && first_new.wait().is_err());
    // Another file's directory fsync makes the roll's rename durable.
    let other = Path::new(DIR).join("promised_epoch");
    drop(
        disk.open(&other, quire_wal::storage::OpenMode::Create)
            .unwrap(),
    );
    disk.sync_dir(Path::new(DIR)).unwrap();
    drop(wal);
    disk.set_mode(quire_wal::storage::CrashMode::Durable);
    disk.crash();
    assert!(disk.exists(&Path::new(DIR).join("00000000000000000015.log")));

    let mut cuts: Vec<Offset> = Vec::new();
    let (wal, report) = Wal::open_in(
        disk.clone(),
        WalConfig {
            segment_bytes_max: SEGMENT_BYTES_MIN,
            batch_window_us: 0,
            ..WalConfig::new(DIR)
        },
        None,
        &mut |t| {
            cuts.push(t.offset);
            Ok(())
        },
        Mutations::default(),
    )
    .expect("the open ends the log there instead of refusing");
    // No record was removed: the pre-cut hook (quire-node's tail-cut mark) is not called.
    assert_eq!(cuts, []);
    let torn = report.torn_tail.clone().expect("reported");
    assert_eq!(
        (torn.offset, torn.problem),
        (
            Offset(14),
            quire_wal::BadRecord::SegmentGap {
                next_base: Offset(15)
            }
        )
    );
    assert_eq!(report.last.map(|l| l.offset), Some(Offset(13)));
    assert!(!disk.exists(&Path::new(DIR).join("00000000000000000015.log")));
    // The log takes appends from there on.
    wal.append(Epoch(1), vec![record(14)]).wait().unwrap();
    wal.close().unwrap();
}
