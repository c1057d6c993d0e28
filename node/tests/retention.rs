//! Retention on a store, in-process: a Trim event is applied only once the store knows it
//! is stabilized (at or below both the HWM and the end of an append it accepted from the
//! same master); the whole segments below the trim point are deleted, never above the
//! learned HWM, and a read below the point is answered with no events and a
//! `first_offset` above `from` (the "trimmed" answer of docs/protocol.md), which
//! `quire_client::StoreClient::read` returns as `ClientError::Trimmed`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quire_client::{AppendOutcome, ClientError, StoreClient};
use quire_proto::{
    AppendRequest, BrokerId, Epoch, Event, EventBody, EventKind, Heartbeat, LogPosition, Offset,
    TrimEvent,
};

const EPOCH: Epoch = Epoch(3);

fn event(offset: u64, kind: EventKind, payload: Bytes) -> Event {
    Event {
        epoch: EPOCH,
        offset: Offset(offset),
        kind,
        payload: payload.into(),
    }
}

fn trim_event(offset: u64, before: u64) -> Event {
    let mut body = BytesMut::new();
    EventBody::Trim(TrimEvent::plain(Offset(before)))
        .encode(&mut body)
        .unwrap();
    event(offset, EventKind::Trim, body.freeze())
}

async fn append(c: &StoreClient, e: Event, hwm: Option<u64>) {
    let prev = e.offset.0.checked_sub(1).map(|o| LogPosition {
        epoch: EPOCH,
        offset: Offset(o),
    });
    let through = e.offset;
    let out = c
        .append(AppendRequest {
            epoch: EPOCH,
            prev,
            events: vec![e],
            hwm: hwm.map(Offset),
        })
        .await
        .unwrap();
    assert!(
        matches!(out, AppendOutcome::Persisted(ref p) if p.through_offset == Some(through)),
        "{out:?}"
    );
}

fn segment_bases(dir: &Path) -> BTreeSet<u64> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".log").map(|b| b.parse().unwrap())
        })
        .collect()
}

/// Reads from 0 until the store answers that the log starts at `want` (the trim runs on
/// the blocking pool after the HWM arrives); bounded by the test's timeout. The client
/// turns the store's trimmed answer (no events, `first_offset` above `from`) into
/// `ClientError::Trimmed`.
async fn wait_first_offset(c: &StoreClient, want: u64) {
    loop {
        match c.read(Offset(0), 100, 1 << 20).await {
            Err(ClientError::Trimmed {
                requested,
                first_offset,
            }) => {
                assert_eq!(requested, Offset(0));
                if first_offset == Offset(want) {
                    return;
                }
                assert!(
                    first_offset < Offset(want),
                    "trimmed too far: {first_offset}"
                );
            }
            Ok(r) => assert_eq!(r.first_offset, Offset(0), "{r:?}"),
            Err(e) => panic!("read failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stabilized_trim_event_deletes_whole_segments_and_reads_below_say_trimmed() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        quire_node::init(&quire_node::InitArgs {
            data_dir: data.clone(),
            learner: false,
        })
        .unwrap();
        let mut config = quire_node::NodeConfig::new(&data, "127.0.0.1:0");
        config.wal.segment_bytes_max = 64 * 1024;
        config.wal.stagger_rolls = false; // the test counts segments
        config.wal.io = quire_node::config::IoSetting::Sync;
        let wal_dir = data.join("wal");
        let node = quire_node::Node::start(config).await.unwrap();
        let c = StoreClient::connect(node.local_addr()).await.unwrap();

        // One 4 KiB block per event, 15 per segment after its header block: segments 0,
        // 15, 30.
        for o in 0..40u64 {
            let payload = Bytes::from(vec![u8::try_from(o).unwrap(); 3000]);
            append(&c, event(o, EventKind::Message, payload), None).await;
        }
        assert_eq!(segment_bases(&wal_dir), BTreeSet::from([0, 15, 30]));

        // A Trim to 20 at offset 40, not yet known stabilized: nothing goes.
        append(&c, trim_event(40, 20), Some(39)).await;
        // A heartbeat brings the HWM to 40: the trim is stabilized; segment 0 goes (20
        // is inside segment 15, which is kept whole).
        c.heartbeat(Heartbeat {
            epoch: EPOCH,
            hwm: Some(Offset(40)),
            master: BrokerId(1),
        })
        .await
        .unwrap();
        wait_first_offset(&c, 15).await;
        assert_eq!(segment_bases(&wal_dir), BTreeSet::from([15, 30]));
        let r = c.read(Offset(15), 100, 1 << 20).await.unwrap();
        assert_eq!(r.events.first().map(|e| e.offset), Some(Offset(15)));
        assert_eq!(r.events.len(), 26);
        assert_eq!(r.events[25].kind, EventKind::Trim);

        // A Trim to 1000 at offset 41 with the HWM at 41: capped at the HWM, so segment
        // 15 goes (30 <= 41) and segment 30, the last, stays.
        append(&c, trim_event(41, 1_000), Some(41)).await;
        c.heartbeat(Heartbeat {
            epoch: EPOCH,
            hwm: Some(Offset(41)),
            master: BrokerId(1),
        })
        .await
        .unwrap();
        wait_first_offset(&c, 30).await;
        assert_eq!(segment_bases(&wal_dir), BTreeSet::from([30]));
        let r = c.read(Offset(30), 100, 1 << 20).await.unwrap();
        assert_eq!(r.events.len(), 12);

        // After a restart the store starts at its first segment's base.
        drop(c);
        node.shutdown().await.unwrap();
        let mut config = quire_node::NodeConfig::new(&data, "127.0.0.1:0");
        config.wal.segment_bytes_max = 64 * 1024;
        config.wal.stagger_rolls = false; // the test counts segments
        config.wal.io = quire_node::config::IoSetting::Sync;
        let node = quire_node::Node::start(config).await.unwrap();
        let c = StoreClient::connect(node.local_addr()).await.unwrap();
        let t = c.tail().await.unwrap();
        assert_eq!(t.first_offset, Offset(30));
        match c.read(Offset(5), 100, 1 << 20).await {
            Err(ClientError::Trimmed { first_offset, .. }) => {
                assert_eq!(first_offset, Offset(30));
            }
            other => panic!("a read below the first offset gave {other:?}"),
        }
        drop(c);
        node.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
