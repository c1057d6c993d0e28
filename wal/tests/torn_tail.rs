//! Torn tails: cut the last segment at every byte of its last two records (and fill the
//! rest with zeros or garbage); reopening must keep exactly the complete records before the
//! cut, a second reopen must change nothing, and appends must continue.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use common::*;
use proptest::prelude::*;
use quire_proto::{Epoch, Event, Offset};
use quire_wal::{inspect, IoBackend, RecordStatus, Wal};

#[derive(Clone, Copy, Debug)]
enum Damage {
    /// The file ends at the cut.
    Truncate,
    /// Zeros from the cut to the end of the file.
    Zeros,
    /// Pseudo-random bytes from the cut to the end of the file.
    Garbage(u64),
}

struct Entry {
    segment: usize,
    position: u64,
    bytes: u64,
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.ends_with(".log") || n.ends_with(".prealloc"))
        })
        .map(|e| {
            (
                e.file_name().into_string().unwrap(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn segments_only(s: &BTreeMap<String, Vec<u8>>) -> BTreeMap<String, Vec<u8>> {
    s.iter()
        .filter(|(k, _)| k.ends_with(".log"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn restore(dir: &Path, files: &BTreeMap<String, Vec<u8>>) {
    for (name, bytes) in files {
        fs::write(dir.join(name), bytes).unwrap();
    }
}

/// The last segment's bytes after the damage.
fn damaged(original: &[u8], cut: u64, how: Damage) -> Vec<u8> {
    let mut bytes = original.to_vec();
    let cut = cut as usize;
    match how {
        Damage::Truncate => bytes.truncate(cut),
        Damage::Zeros => bytes[cut..].fill(0),
        Damage::Garbage(seed) => {
            let mut x = seed | 1;
            for b in &mut bytes[cut..] {
                // xorshift64
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
        }
    }
    bytes
}

fn build_log(dir: &Path, groups: &[Vec<usize>]) -> Vec<Event> {
    let (wal, _) = Wal::open(config(dir, IoBackend::Sync)).unwrap();
    let mut all = Vec::new();
    let mut next = 0u64;
    for g in groups {
        let recs: Vec<Event> = g
            .iter()
            .map(|&len| {
                let r = record(next, 1, len);
                next += 1;
                r
            })
            .collect();
        all.extend(recs.iter().cloned());
        wal.append(Epoch(1), recs).wait().unwrap();
    }
    wal.close().unwrap();
    all
}

fn check_cuts(groups: Vec<Vec<usize>>, seed: u64) {
    let src = tempfile::tempdir().unwrap();
    let all = build_log(src.path(), &groups);
    let mut entries = Vec::new();
    let report = inspect(src.path(), |r| {
        if r.status == RecordStatus::Entry {
            entries.push(Entry {
                segment: r.segment_index,
                position: r.position.0,
                bytes: r.bytes,
            });
        }
    })
    .unwrap();
    assert_eq!(entries.len(), all.len());
    let last_seg = report.segments.len() - 1;
    let last_path = report.segments[last_seg]
        .path
        .file_name()
        .unwrap()
        .to_owned();
    let in_last: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].segment == last_seg)
        .collect();
    let tail: Vec<usize> = in_last.iter().rev().take(2).rev().copied().collect();
    let pristine = snapshot(src.path());

    // Every byte position of the last two records, and the end of the last one.
    let mut cuts: Vec<u64> = tail
        .iter()
        .flat_map(|&i| entries[i].position..entries[i].position + entries[i].bytes)
        .collect();
    if let Some(&i) = tail.last() {
        cuts.push(entries[i].position + entries[i].bytes);
    }

    for (k, &cut) in cuts.iter().enumerate() {
        for how in [
            Damage::Truncate,
            Damage::Zeros,
            Damage::Garbage(seed ^ k as u64),
        ] {
            let dir = tempfile::tempdir().unwrap();
            restore(dir.path(), &pristine);
            let original = &pristine[last_path.to_str().unwrap()];
            let bytes = damaged(original, cut, how);
            fs::write(dir.path().join(&last_path), &bytes).unwrap();
            // A record survives if every one of its bytes is unchanged (zeros written over
            // zeros, or garbage that happens to match, change nothing), and so do all
            // records before it.
            let intact = |e: &Entry| {
                let (a, b) = (e.position as usize, (e.position + e.bytes) as usize);
                e.segment < last_seg || (b <= bytes.len() && bytes[a..b] == original[a..b])
            };
            let survivors: Vec<Event> = entries
                .iter()
                .zip(&all)
                .take_while(|(e, _)| intact(e))
                .map(|(_, r)| r.clone())
                .collect();

            let (wal, rep) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
            let got = read_all(&wal);
            if got != survivors {
                let pos: Vec<(u64, u64)> = tail
                    .iter()
                    .map(|&i| (entries[i].position, entries[i].bytes))
                    .collect();
                panic!(
                    "cut at {cut} ({how:?}): recovered {} records, expected {}; last two records (position, bytes): {pos:?}; report {rep:?}",
                    got.len(),
                    survivors.len()
                );
            }
            assert_eq!(rep.entries, survivors.len() as u64);
            drop(wal);
            let after_first = segments_only(&snapshot(dir.path()));

            let (wal, rep) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
            assert!(
                rep.torn_tail.is_none(),
                "second open cut again at {cut} ({how:?}): {:?}",
                rep.torn_tail
            );
            assert_eq!(
                segments_only(&snapshot(dir.path())),
                after_first,
                "second open changed the files"
            );
            assert_eq!(read_all(&wal), survivors);
            let next = survivors.len() as u64;
            assert_eq!(wal.next_offset(), Offset(next));
            let extra = record(next, 2, 33);
            assert_eq!(
                wal.append(Epoch(2), vec![extra.clone()]).wait().unwrap(),
                Offset(next)
            );
            let mut expected = survivors;
            expected.push(extra);
            assert_eq!(read_all(&wal), expected);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    #[test]
    fn torn_tail_keeps_exactly_the_complete_records(
        groups in proptest::collection::vec(proptest::collection::vec(0usize..24, 1..4), 18..30),
        seed: u64,
    ) {
        check_cuts(groups, seed);
    }
}

/// A last segment whose only record is torn at its first byte: the log continues at the
/// same offset.
#[test]
fn single_record_segment_torn_at_its_first_byte() {
    // Every append is padded to a 4 KiB block, so a 64 KiB segment holds 15 of them after
    // its 4 KiB header block, and the 16th starts a segment of its own.
    check_cuts((0..16).map(|_| vec![10]).collect(), 7);
}

/// The pre-cut hook (`Wal::open_with_hook`) sees the torn tail before anything changes:
/// when it fails, the open fails and the tail is still there; when it succeeds, the tail is
/// cut as by `Wal::open`, and a clean log never calls it. quire-node records its tail-cut
/// mark in this hook, so a crash between its mark and the cut never loses the mark.
#[test]
fn the_pre_cut_hook_runs_before_the_cut_and_a_failing_hook_cuts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    build_log(dir.path(), &[vec![40, 50], vec![60]]);
    let mut last = None;
    inspect(dir.path(), |r| {
        if r.status == RecordStatus::Entry {
            last = Some((r.segment.to_path_buf(), r.position.0, r.bytes));
        }
    })
    .unwrap();
    let (segment, position, bytes) = last.unwrap();
    // A bit flip in the last record reads as a torn tail.
    let mut file = fs::read(&segment).unwrap();
    file[usize::try_from(position + bytes - 1).unwrap()] ^= 1;
    fs::write(&segment, &file).unwrap();
    let before = segments_only(&snapshot(dir.path()));

    let mut seen = Vec::new();
    let failed = Wal::open_with_hook(config(dir.path(), IoBackend::Sync), None, &mut |t| {
        seen.push(t.offset);
        Err(quire_wal::WalError::Config(
            "the mark cannot be written".into(),
        ))
    });
    assert!(failed.is_err());
    assert_eq!(
        seen,
        vec![Offset(2)],
        "the hook saw where the cut would begin"
    );
    assert_eq!(
        segments_only(&snapshot(dir.path())),
        before,
        "a failing hook cuts nothing"
    );

    let mut seen = Vec::new();
    let (wal, rep) = Wal::open_with_hook(config(dir.path(), IoBackend::Sync), None, &mut |t| {
        seen.push(t.offset);
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, vec![Offset(2)]);
    assert_eq!(rep.torn_tail.map(|t| t.offset), Some(Offset(2)));
    assert_eq!(read_all(&wal).len(), 2);
    drop(wal);

    let (_wal, rep) = Wal::open_with_hook(config(dir.path(), IoBackend::Sync), None, &mut |_| {
        panic!("a clean log calls no hook")
    })
    .unwrap();
    assert!(rep.torn_tail.is_none());
}

/// A last segment cut after it was written — at a record boundary, so what is left scans
/// clean, or to nothing — lost records the WAL may have acknowledged: every segment the
/// WAL names is preallocated whole, so the open reports it as a cut (`BadRecord::FileCut`)
/// to the pre-cut hook (where quire-node writes its tail-cut mark), keeps what is left and
/// appends after it. An intact log calls no hook. (Found by the break-it trial: `truncate`
/// or `: >` on a store's last segment passed as a clean log.)
#[test]
fn a_last_segment_cut_by_hand_is_reported_to_the_hook_though_it_scans_clean() {
    for keep_records in [1usize, 0] {
        let dir = tempfile::tempdir().unwrap();
        build_log(dir.path(), &[vec![40, 50, 60]]);
        let mut ends = Vec::new();
        inspect(dir.path(), |r| {
            if r.status == RecordStatus::Entry {
                ends.push((r.segment.to_path_buf(), r.position.0 + r.bytes));
            }
        })
        .unwrap();
        let (segment, _) = ends.last().cloned().unwrap();
        let cut_at = if keep_records == 0 { 0 } else { ends[0].1 };
        let file = fs::OpenOptions::new().write(true).open(&segment).unwrap();
        file.set_len(cut_at).unwrap();
        drop(file);

        let mut seen = Vec::new();
        let (wal, rep) = Wal::open_with_hook(config(dir.path(), IoBackend::Sync), None, &mut |t| {
            seen.push((t.offset, t.problem));
            Ok(())
        })
        .unwrap();
        let expected = Offset(keep_records as u64);
        assert!(
            matches!(&seen[..], [(o, quire_wal::BadRecord::FileCut { file_bytes })] if *o == expected && *file_bytes == cut_at),
            "{seen:?}"
        );
        assert_eq!(rep.torn_tail.map(|t| t.offset), Some(expected));
        assert_eq!(read_all(&wal).len(), keep_records);
        drop(wal);
        // The tail was zero-extended: a second open finds an intact log.
        let (_wal, rep) =
            Wal::open_with_hook(config(dir.path(), IoBackend::Sync), None, &mut |_| {
                panic!("an intact log calls no hook")
            })
            .unwrap();
        assert!(rep.torn_tail.is_none());
    }
}
