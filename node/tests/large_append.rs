//! A store whose segments are smaller than one append (a catch-up append from the master
//! may carry up to a frame's worth of events): the append is accepted, written across as
//! many segments as it needs, acked once, and read back whole, also after a restart.
//! Before the store split such appends, the WAL refused them as too large for a segment,
//! the store answered `Malformed`, and the master resent the same append forever.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::time::Duration;

use bytes::Bytes;
use quire_client::{AppendOutcome, StoreClient};
use quire_proto::{AppendRequest, Epoch, Event, EventKind, Offset};

const EPOCH: Epoch = Epoch(3);
/// 300 events of 3,000 bytes: about 900 KiB, 14 times the 64 KiB segment.
const EVENTS: u64 = 300;

async fn start(data: &std::path::Path) -> quire_node::Node {
    let mut config = quire_node::NodeConfig::new(data, "127.0.0.1:0");
    config.wal.segment_bytes_max = 64 * 1024;
    config.wal.stagger_rolls = false; // the test counts segments
    config.wal.io = quire_node::config::IoSetting::Sync;
    quire_node::Node::start(config).await.unwrap()
}

async fn read_all(c: &StoreClient) -> Vec<Event> {
    let mut events = Vec::new();
    while (events.len() as u64) < EVENTS {
        let r = c
            .read(Offset(events.len() as u64), 1_000, 1 << 20)
            .await
            .unwrap();
        assert!(
            !r.events.is_empty(),
            "the store holds fewer events than acked"
        );
        events.extend(r.events);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_larger_than_a_segment_is_written_across_segments_and_acked_once() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        quire_node::init(&quire_node::InitArgs {
            data_dir: data.clone(),
            learner: false,
        })
        .unwrap();
        let node = start(&data).await;
        let c = StoreClient::connect(node.local_addr()).await.unwrap();
        let events: Vec<Event> = (0..EVENTS)
            .map(|o| Event {
                epoch: EPOCH,
                offset: Offset(o),
                kind: EventKind::Message,
                payload: Bytes::from(vec![u8::try_from(o % 251).unwrap(); 3_000]).into(),
            })
            .collect();
        let out = c
            .append(AppendRequest {
                epoch: EPOCH,
                prev: None,
                events: events.clone(),
                hwm: None,
            })
            .await
            .unwrap();
        assert!(
            matches!(out, AppendOutcome::Persisted(ref p) if p.through_offset == Some(Offset(EVENTS - 1))),
            "{out:?}"
        );
        let segments = std::fs::read_dir(data.join("wal"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".log")
            })
            .count();
        assert!(segments > 1, "written across segments: {segments}");
        assert_eq!(read_all(&c).await, events);

        // The same after a restart: recovery reads every segment back.
        drop(c);
        node.shutdown().await.unwrap();
        let node = start(&data).await;
        let c = StoreClient::connect(node.local_addr()).await.unwrap();
        assert_eq!(read_all(&c).await, events);
        drop(c);
        node.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
