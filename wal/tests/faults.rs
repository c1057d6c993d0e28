//! Failure injection through the disk trait: a failed write, a failed fdatasync and ENOSPC
//! each fail the log for good; no append pending at that moment resolves Ok; everything
//! acknowledged before survives a reopen.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use quire_proto::{Epoch, Offset};
use quire_wal::disk::{open_disk, FaultDisk, FaultPlan};
use quire_wal::{IoBackend, Wal, WalError};

#[derive(Clone, Copy, Debug)]
enum Fault {
    Write(i32),
    Fdatasync(i32),
}

/// Runs 16 concurrent appenders until the injected fault fails the log; returns the
/// results of every append, by offset.
fn run(io: IoBackend, fault: Fault) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new();
    let (inner, _) = open_disk(io).unwrap();
    let disk = Box::new(FaultDisk::new(inner, plan.clone()));
    let (wal, _) = Wal::open_with_disk(config(dir.path(), io), disk).unwrap();
    // Some clean history first.
    append_range(&wal, 0, 10, 1, 100);
    match fault {
        Fault::Write(errno) => plan.fail_write(5, errno),
        Fault::Fdatasync(errno) => plan.fail_fdatasync(5, errno),
    }

    let submit = Arc::new(Mutex::new(()));
    let results = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (wal, submit, results) = (wal.clone(), submit.clone(), results.clone());
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let (o, fut) = {
                        let _g = submit.lock().unwrap();
                        let o = wal.next_offset().0;
                        (o, wal.append(Epoch(1), vec![record(o, 1, 500)]))
                    };
                    let r = fut.wait();
                    let stop = r.is_err();
                    results.lock().unwrap().push((o, r));
                    if stop {
                        break;
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(plan.injected(), 1, "{fault:?}: the fault fired");
    assert!(wal.is_failed());
    let reason = wal.failure().unwrap();
    match fault {
        Fault::Write(libc::ENOSPC) => assert!(
            matches!(reason, WalError::NoSpace { op: "write", .. }),
            "{reason}"
        ),
        Fault::Write(_) => assert!(
            matches!(reason, WalError::Io { op: "write", .. }),
            "{reason}"
        ),
        Fault::Fdatasync(_) => assert!(
            matches!(
                reason,
                WalError::Io {
                    op: "fdatasync",
                    ..
                }
            ),
            "{reason}"
        ),
    }
    assert!(wal.stats().failed);

    let results = results.lock().unwrap();
    let ok: Vec<u64> = results
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(o, _)| *o)
        .collect();
    let failed: Vec<u64> = results
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(o, _)| *o)
        .collect();
    assert!(!failed.is_empty());
    for (_, r) in results.iter() {
        if let Err(e) = r {
            assert!(matches!(e, WalError::Failed { .. }), "{e}");
            if matches!(fault, Fault::Write(libc::ENOSPC)) {
                assert!(e.is_no_space(), "{e}");
            }
        }
    }
    // Acknowledgements are a prefix: nothing at or after the first failed append is Ok.
    let first_failed = *failed.iter().min().unwrap();
    assert!(
        ok.iter().all(|&o| o < first_failed),
        "an append after the failure point resolved Ok"
    );
    // Later appends fail at once, with the reason; the accepted view fell back to durable.
    let again = wal
        .append(Epoch(1), vec![record(wal.next_offset().0, 1, 1)])
        .wait();
    assert!(matches!(again, Err(WalError::Failed { .. })));
    assert_eq!(wal.last(), wal.last_durable());
    // Reads still work.
    let durable = read_all(&wal);
    let acked = 10 + ok.len() as u64;
    assert!(durable.len() as u64 >= acked);
    drop(wal);

    // Everything acknowledged is there after a reopen.
    let (wal, _) = Wal::open(config(dir.path(), IoBackend::Sync)).unwrap();
    let after = read_all(&wal);
    assert!(
        after.len() as u64 >= acked,
        "{fault:?}: {} records after reopen, {acked} acknowledged",
        after.len()
    );
    for (i, r) in after.iter().enumerate() {
        assert_eq!(*r, record(i as u64, 1, if i < 10 { 100 } else { 500 }));
    }
    // And the log takes appends again.
    let next = wal.next_offset();
    assert_eq!(
        wal.append(Epoch(1), vec![record(next.0, 1, 5)])
            .wait()
            .unwrap(),
        next
    );
}

#[test]
fn a_failed_write_fails_the_log() {
    for io in backends() {
        run(io, Fault::Write(libc::EIO));
    }
}

#[test]
fn a_failed_fdatasync_fails_the_log() {
    for io in backends() {
        run(io, Fault::Fdatasync(libc::EIO));
    }
}

#[test]
fn enospc_is_a_typed_error_and_keeps_what_was_acknowledged() {
    for io in backends() {
        run(io, Fault::Write(libc::ENOSPC));
    }
}

#[test]
fn pending_appends_fail_when_the_log_fails() {
    // One fdatasync fails while several appends are queued behind it: all of them fail.
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new();
    let (inner, _) = open_disk(IoBackend::Sync).unwrap();
    let (wal, _) = Wal::open_with_disk(
        config(dir.path(), IoBackend::Sync),
        Box::new(FaultDisk::new(inner, plan.clone())),
    )
    .unwrap();
    plan.fail_fdatasync(0, libc::EIO);
    let futs: Vec<_> = (0..20)
        .map(|o| wal.append(Epoch(1), vec![record(o, 1, 10)]))
        .collect();
    for f in futs {
        assert!(matches!(f.wait(), Err(WalError::Failed { .. })));
    }
    assert_eq!(wal.last_durable(), None);
    assert_eq!(wal.next_offset(), Offset(0));
}
