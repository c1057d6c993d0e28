//! The tail-cut mark, in-process on the real disk (docs/protocol.md, "Tail-cut marks").
//!
//! Story (quire-sim seed 805 with tail flips): a bit flipped in a store's last durable
//! record — an event it had acked, part of a stabilized log. The WAL's recovery cannot tell
//! that from a torn write and cut the record; the store then granted the next master's
//! fence with a log lacking an event it acked, and that master overwrote a stabilized
//! event. Now the store writes a durable mark before the cut, reports it in every
//! `FenceGranted` (brokers count such a grant only when every store granted), keeps it
//! across restarts, and clears it once its durable log holds an entry of a later master.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use quire_client::{AppendOutcome, FenceOutcome, StoreClient};
use quire_proto::{
    AppendRequest, Epoch, Event, EventKind, FenceGranted, LogPosition, Offset, TailCut,
};
use quire_wal::RecordStatus;

fn append(epoch: u64, prev: Option<(u64, u64)>, payloads: &[&'static str]) -> AppendRequest {
    let first = prev.map_or(0, |(_, o)| o + 1);
    AppendRequest {
        epoch: Epoch(epoch),
        prev: prev.map(|(e, o)| LogPosition {
            epoch: Epoch(e),
            offset: Offset(o),
        }),
        events: payloads
            .iter()
            .enumerate()
            .map(|(i, p)| Event {
                epoch: Epoch(epoch),
                offset: Offset(first + i as u64),
                kind: EventKind::Message,
                payload: Bytes::from_static(p.as_bytes()).into(),
            })
            .collect(),
        hwm: None,
    }
}

fn config(data: &Path) -> quire_node::NodeConfig {
    let mut config = quire_node::NodeConfig::new(data, "127.0.0.1:0");
    config.wal.segment_bytes_max = 4 << 20;
    config.wal.io = quire_node::config::IoSetting::Sync;
    config
}

async fn granted(node: &quire_node::Node, epoch: u64) -> FenceGranted {
    let c = StoreClient::connect(node.local_addr()).await.unwrap();
    match c.fence(Epoch(epoch), None).await.unwrap() {
        FenceOutcome::Granted(g) => g,
        other => panic!("fence {epoch}: {other:?}"),
    }
}

/// Flips one bit in the payload of the last record of the log in `wal_dir`.
fn flip_last_record(wal_dir: &Path) {
    let mut last = None;
    quire_wal::inspect(wal_dir, |r| {
        if r.status == RecordStatus::Entry {
            last = Some((r.segment.to_path_buf(), r.position.0 + r.bytes - 1));
        }
    })
    .unwrap();
    let (segment, at) = last.expect("a record to flip");
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = usize::try_from(at).unwrap();
    bytes[at] ^= 0x04;
    std::fs::write(&segment, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_tail_is_marked_reported_kept_across_restarts_and_cleared_by_a_later_master() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        quire_node::init(&quire_node::InitArgs {
            data_dir: data.clone(),
            learner: false,
        })
        .unwrap();
        let mark_file = data.join(quire_node::tail_cut::TAIL_CUT_FILE_NAME);

        // Epoch 7 appends two events; both are acked (durable).
        let node = quire_node::Node::start(config(&data)).await.unwrap();
        let c = StoreClient::connect(node.local_addr()).await.unwrap();
        let outcome = c.append(append(7, None, &["a", "b"])).await.unwrap();
        assert!(
            matches!(outcome, AppendOutcome::Persisted(_)),
            "{outcome:?}"
        );
        assert_eq!(
            granted(&node, 7).await.tail_cut,
            None,
            "a repeated fence, no mark"
        );
        drop(c);
        node.shutdown().await.unwrap();
        assert!(!mark_file.exists());

        // A bit flips in the acked record at offset 1, the log's last.
        flip_last_record(&data.join("wal"));
        let node = quire_node::Node::start(config(&data)).await.unwrap();
        let expected = TailCut {
            offset: Offset(1),
            promised: Epoch(7),
        };
        assert_eq!(
            quire_node::tail_cut::load(&data).unwrap(),
            Some(expected),
            "the mark is on disk"
        );
        let g = granted(&node, 8).await;
        assert_eq!(
            g.last,
            Some(LogPosition {
                epoch: Epoch(7),
                offset: Offset(0)
            }),
            "the record was cut"
        );
        assert_eq!(g.tail_cut, Some(expected), "the grant reports the mark");
        node.shutdown().await.unwrap();

        // A restart finds nothing left to cut but keeps the mark.
        let node = quire_node::Node::start(config(&data)).await.unwrap();
        assert_eq!(granted(&node, 8).await.tail_cut, Some(expected));

        // An entry of epoch 8 (above the promise at the cut) is not enough until durable;
        // once acked, the mark is gone from the grant and from the disk.
        let c = StoreClient::connect(node.local_addr()).await.unwrap();
        let outcome = c.append(append(8, Some((7, 0)), &["c"])).await.unwrap();
        assert!(
            matches!(outcome, AppendOutcome::Persisted(_)),
            "{outcome:?}"
        );
        let mut cleared = false;
        for _ in 0..200 {
            if granted(&node, 9).await.tail_cut.is_none() {
                cleared = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            cleared,
            "the mark clears once a later master's entry is durable"
        );
        assert!(!mark_file.exists());
        drop(c);
        node.shutdown().await.unwrap();
        let node = quire_node::Node::start(config(&data)).await.unwrap();
        assert_eq!(
            granted(&node, 9).await.tail_cut,
            None,
            "also after a restart"
        );
        node.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}

/// The mark is written before the cut: a store that cannot write it does not start, and
/// its log keeps the tail for the next start to cut (and mark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_write_its_mark_does_not_cut_or_start() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        quire_node::init(&quire_node::InitArgs {
            data_dir: data.clone(),
            learner: false,
        })
        .unwrap();
        let node = quire_node::Node::start(config(&data)).await.unwrap();
        let c = StoreClient::connect(node.local_addr()).await.unwrap();
        let outcome = c.append(append(3, None, &["a", "b"])).await.unwrap();
        assert!(
            matches!(outcome, AppendOutcome::Persisted(_)),
            "{outcome:?}"
        );
        drop(c);
        node.shutdown().await.unwrap();
        flip_last_record(&data.join("wal"));

        // The mark's temp file name is taken by a directory: writing the mark fails.
        let blocker = data.join("tail_cut.tmp");
        std::fs::create_dir(&blocker).unwrap();
        let err = match quire_node::Node::start(config(&data)).await {
            Ok(_) => panic!("a store that cannot record its cut must not start"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains("tail-cut mark"), "{err}");
        let report = quire_wal::inspect(&data.join("wal"), |_| {}).unwrap();
        assert!(
            matches!(report.end, quire_wal::ScanEnd::TornTail(_)),
            "the tail is still there: {:?}",
            report.end
        );

        std::fs::remove_dir(&blocker).unwrap();
        let node = quire_node::Node::start(config(&data)).await.unwrap();
        assert_eq!(
            granted(&node, 4).await.tail_cut,
            Some(TailCut {
                offset: Offset(1),
                promised: Epoch(3)
            })
        );
        node.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
