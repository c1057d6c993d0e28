//! Bit flips in sealed segments: open must report corruption at the flipped record
//! (segment, position, offset), change nothing, and skip nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use proptest::prelude::*;
use quire_proto::{Epoch, Offset};
use quire_wal::{
    inspect, CorruptionKind, IoBackend, Position, RecordStatus, ScanEnd, Wal, WalError,
};

struct Entry {
    segment: usize,
    path: PathBuf,
    position: u64,
    bytes: u64,
    offset: Offset,
}

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".log")))
        .map(|e| {
            (
                e.file_name().into_string().unwrap(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_flipped_bit_in_a_sealed_segment_is_located_corruption(
        groups in proptest::collection::vec(proptest::collection::vec(0usize..300, 1..4), 36..48),
        pick: prop::sample::Index,
        bit: prop::sample::Index,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
        let mut next = 0u64;
        for g in &groups {
            let recs = g.iter().map(|&len| { let r = record(next, 1, len); next += 1; r }).collect();
            wal.append(Epoch(1), recs).wait().unwrap();
        }
        drop(wal);

        let mut entries = Vec::new();
        let report = inspect(dir.path(), |r| {
            if r.status == RecordStatus::Entry {
                entries.push(Entry {
                    segment: r.segment_index,
                    path: r.segment.to_path_buf(),
                    position: r.position.0,
                    bytes: r.bytes,
                    offset: r.header.unwrap().offset,
                });
            }
        }).unwrap();
        let sealed: Vec<&Entry> = entries.iter().filter(|e| e.segment + 1 < report.segments.len()).collect();
        prop_assume!(!sealed.is_empty());
        let victim = sealed[pick.index(sealed.len())];
        let bit = bit.index(victim.bytes as usize * 8) as u64;
        let mut bytes = fs::read(&victim.path).unwrap();
        let at = (victim.position + bit / 8) as usize;
        bytes[at] ^= 1 << (bit % 8);
        fs::write(&victim.path, &bytes).unwrap();
        let before = files(dir.path());

        let err = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap_err();
        match &err {
            WalError::Corruption { segment, position, offset, problem } => {
                prop_assert_eq!(segment, &victim.path);
                prop_assert_eq!(*position, Position(victim.position));
                prop_assert_eq!(*offset, victim.offset);
                prop_assert_eq!(*problem, CorruptionKind::BadRecordBeforeValid);
            }
            other => prop_assert!(false, "expected corruption, got {other}"),
        }
        prop_assert_eq!(&files(dir.path()), &before, "a failed open must not change the files");

        // The offline scan agrees, and stops at the same record.
        let report = inspect(dir.path(), |_| {}).unwrap();
        match report.end {
            ScanEnd::Corruption(WalError::Corruption { position, offset, .. }) => {
                prop_assert_eq!(position, Position(victim.position));
                prop_assert_eq!(offset, victim.offset);
            }
            other => prop_assert!(false, "inspect saw {other:?}"),
        }
        prop_assert_eq!(report.next, victim.offset);
        // Repair refuses to cut corruption.
        prop_assert!(quire_wal::repair_torn_tail(dir.path()).unwrap_err().is_corruption());
        prop_assert_eq!(files(dir.path()), before);
    }
}
