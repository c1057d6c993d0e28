//! Quick throughput sanity check of the WAL (not a benchmark harness; `quire bench wal`
//! is the real one). Usage:
//!
//! ```text
//! cargo run --release -p quire-wal --example wal_throughput -- [DIR] [SECONDS] [uring|sync]
//! ```
//!
//! Runs three loads on a fresh directory under DIR (default /tmp) and prints appends/s:
//! one appender of 256 KiB events, one appender of 1 KiB events (one fsync per event), and
//! 64 appenders of 1 KiB events.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a tool: a panic is the error report

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_proto::{Epoch, Event, EventKind};
use quire_wal::{IoBackend, Wal, WalConfig};

fn run(base: &std::path::Path, io: IoBackend, appenders: usize, event_bytes: usize, secs: u64) {
    let dir = tempfile::tempdir_in(base).unwrap();
    let segment_mib: u64 = std::env::var("SEGMENT_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    let cfg = WalConfig {
        io,
        segment_bytes_max: segment_mib << 20,
        ..WalConfig::new(dir.path())
    };
    let (wal, _) = Wal::open(cfg).unwrap();
    // Let the first spare segment finish zero-filling before measuring.
    std::thread::sleep(Duration::from_millis(500 + 4 * segment_mib));
    let payload = Bytes::from(vec![0xA5u8; event_bytes]);
    let submit = Arc::new(Mutex::new(()));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let threads: Vec<_> = (0..appenders)
        .map(|_| {
            let (wal, submit, stop, payload) =
                (wal.clone(), submit.clone(), stop.clone(), payload.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let fut = {
                        let _g = submit.lock().unwrap();
                        let o = wal.next_offset();
                        wal.append(
                            Epoch(1),
                            vec![Event {
                                epoch: Epoch(1),
                                offset: o,
                                kind: EventKind::Message,
                                payload: payload.clone().into(),
                            }],
                        )
                    };
                    fut.wait().unwrap();
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let s = wal.stats();
    println!(
        "{:>6} {:>2} appenders x {:>6} B: {:>9.0} appends/s {:>8.1} MiB/s | {:>6} fsyncs ({:.1} appends/fsync, mean {:.0} us) {} batches, {} pipelined, {} segments",
        wal.backend(),
        appenders,
        event_bytes,
        s.appends as f64 / elapsed,
        s.payload_bytes as f64 / elapsed / (1 << 20) as f64,
        s.fsyncs,
        s.appends as f64 / s.fsyncs.max(1) as f64,
        s.fsync_us_sum as f64 / s.fsyncs.max(1) as f64,
        s.batches,
        s.pipelined_writes,
        s.segments_created,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let base = std::path::PathBuf::from(args.get(1).map_or("/tmp", String::as_str));
    let secs = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let io = match args.get(3).map(String::as_str) {
        Some("sync") => IoBackend::Sync,
        Some("uring") => IoBackend::Uring,
        _ => IoBackend::Auto,
    };
    run(&base, io, 1, 256 * 1024, secs);
    run(&base, io, 1, 1024, secs);
    run(&base, io, 64, 1024, secs);
}
