//! Helpers shared by the integration tests.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure
#![allow(dead_code)]

use std::path::Path;

use bytes::Bytes;
use quire_proto::{Epoch, Event, EventKind, Offset};
use quire_wal::{IoBackend, Wal, WalConfig};

/// A small configuration: 64 KiB segments, sync backend unless asked otherwise.
pub fn config(dir: &Path, io: IoBackend) -> WalConfig {
    WalConfig {
        segment_bytes_max: 64 * 1024,
        batch_bytes_max: 16 * 1024,
        io,
        ..WalConfig::new(dir)
    }
}

/// A record whose payload is derived from its offset and epoch, `len` bytes long.
pub fn record(offset: u64, epoch: u64, len: usize) -> Event {
    let payload: Vec<u8> = (0..len)
        .map(|i| (offset as usize * 31 + epoch as usize * 7 + i) as u8)
        .collect();
    Event {
        epoch: Epoch(epoch),
        offset: Offset(offset),
        kind: EventKind::Message,
        payload: Bytes::from(payload).into(),
    }
}

/// Appends records `from..to` with epoch `epoch`, one append each, waiting for each.
pub fn append_range(wal: &Wal, from: u64, to: u64, epoch: u64, len: usize) {
    for o in from..to {
        let last = wal
            .append(Epoch(epoch), vec![record(o, epoch, len)])
            .wait()
            .expect("append");
        assert_eq!(last, Offset(o));
    }
}

/// Every durable record of the log, read through the reader.
pub fn read_all(wal: &Wal) -> Vec<Event> {
    let mut out = Vec::new();
    let mut from = wal.first_offset();
    loop {
        let batch = wal.read(from, 1000, 1 << 30).expect("read");
        let Some(last) = batch.last() else { break };
        from = last.offset.next();
        out.extend(batch);
    }
    out
}

/// Installs a tracing subscriber once, so tests show the WAL's log lines.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("quire_wal=info")
        .try_init();
}

/// The backends to test: always `Sync`; `Uring` when this machine allows io_uring (a
/// clear skip line otherwise).
pub fn backends() -> Vec<IoBackend> {
    match quire_wal::disk::uring_available() {
        Ok(()) => vec![IoBackend::Sync, IoBackend::Uring],
        Err(reason) => {
            eprintln!("SKIP io_uring variant: io_uring is unavailable here: {reason}");
            vec![IoBackend::Sync]
        }
    }
}
