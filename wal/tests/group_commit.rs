//! Group commit: many concurrent appenders share fdatasyncs.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use quire_proto::{Epoch, Offset};
use quire_wal::{IoBackend, Wal, WalConfig};

const APPENDERS: usize = 64;
const APPENDS_EACH: usize = 20;

fn run(io: IoBackend) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = WalConfig {
        segment_bytes_max: 1 << 20,
        batch_bytes_max: 256 * 1024,
        io,
        ..WalConfig::new(dir.path())
    };
    let (wal, _) = Wal::open(cfg).unwrap();
    // Offsets must be handed out in order: the submission is serialised, the wait is not.
    let submit = Arc::new(Mutex::new(()));
    let threads: Vec<_> = (0..APPENDERS)
        .map(|_| {
            let wal = wal.clone();
            let submit = submit.clone();
            std::thread::spawn(move || {
                for _ in 0..APPENDS_EACH {
                    let fut = {
                        let _g = submit.lock().unwrap();
                        let o = wal.next_offset().0;
                        wal.append(Epoch(1), vec![record(o, 1, 1024)])
                    };
                    fut.wait().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = wal.stats();
    let appends = (APPENDERS * APPENDS_EACH) as u64;
    assert_eq!(stats.appends, appends);
    assert_eq!(stats.records, appends);
    eprintln!(
        "{io:?}: {} appends, {} batches, {} fsyncs, {} pipelined writes",
        stats.appends, stats.batches, stats.fsyncs, stats.pipelined_writes
    );
    // Far fewer fsyncs than appends: at least 8 appends share one on average.
    assert!(
        stats.fsyncs * 8 <= appends,
        "{} fsyncs for {appends} appends",
        stats.fsyncs
    );
    let all = read_all(&wal);
    assert_eq!(all.len() as u64, appends);
    for (i, r) in all.iter().enumerate() {
        assert_eq!(*r, record(i as u64, 1, 1024));
    }
    assert_eq!(
        wal.last_durable().map(|l| l.offset),
        Some(Offset(appends - 1))
    );
}

#[test]
fn sixty_four_appenders_share_fsyncs() {
    for io in backends() {
        run(io);
    }
}
