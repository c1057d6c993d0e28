//! The real io_uring + O_DIRECT path. Each test checks support first and says clearly when
//! it is missing (and then passes without testing anything).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use quire_proto::{Epoch, Offset};
use quire_wal::{IoBackend, Wal, WalConfig};

fn uring_or_skip(test: &str) -> bool {
    match quire_wal::disk::uring_available() {
        Ok(()) => true,
        Err(reason) => {
            eprintln!("SKIP {test}: io_uring is unavailable here: {reason}");
            false
        }
    }
}

#[test]
fn uring_backend_writes_with_o_direct() {
    if !uring_or_skip("uring_backend_writes_with_o_direct") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Uring)).unwrap();
    assert_eq!(wal.backend(), "io_uring");
    append_range(&wal, 0, 3, 1, 100);
    if wal.stats().direct_io {
        assert!(wal.alignment_bytes() >= 512 && wal.alignment_bytes().is_power_of_two());
    } else {
        eprintln!(
            "SKIP O_DIRECT check: the file system under {} refuses O_DIRECT",
            dir.path().display()
        );
    }
    // Batches are aligned and padded: 3 one-record appends take 3 blocks.
    let s = wal.stats();
    assert_eq!(s.batches, 3);
    assert_eq!(s.batch_bytes, 3 * wal.alignment_bytes());
}

#[test]
fn uring_pipelines_writes_behind_a_running_fdatasync() {
    if !uring_or_skip("uring_pipelines_writes_behind_a_running_fdatasync") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = WalConfig {
        segment_bytes_max: 4 << 20,
        // Every append is a full batch by itself, so it is written as soon as the previous
        // write completes, even while an fdatasync runs.
        batch_bytes_max: 8000,
        io: IoBackend::Uring,
        ..WalConfig::new(dir.path())
    };
    let (wal, _) = Wal::open(cfg).unwrap();
    let submit = Arc::new(Mutex::new(()));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (wal, submit) = (wal.clone(), submit.clone());
            std::thread::spawn(move || {
                for _ in 0..40 {
                    let fut = {
                        let _g = submit.lock().unwrap();
                        let o = wal.next_offset().0;
                        wal.append(Epoch(1), vec![record(o, 1, 8000)])
                    };
                    fut.wait().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = wal.stats();
    eprintln!("{s:?}");
    assert_eq!(s.appends, 640);
    // Writes went out while an fdatasync was running, and fdatasyncs covered several
    // batches each.
    assert!(s.pipelined_writes > 0, "{s:?}");
    assert!(s.fsyncs < s.batches, "{s:?}");
    assert_eq!(s.batches, 640);
    assert!(s.segments_created >= 2, "{s:?}");
    let all = read_all(&wal);
    assert_eq!(all.len(), 640);
    drop(wal);
    let (wal, rep) = Wal::open(config(dir.path(), IoBackend::Uring)).unwrap();
    assert!(rep.torn_tail.is_none());
    assert_eq!(read_all(&wal), all);
    assert_eq!(wal.next_offset(), Offset(640));
}
