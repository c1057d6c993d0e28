//! The node on a fault-injecting disk (`quire_wal::disk::FaultDisk` over the real
//! synchronous disk), in-process:
//! - a WAL whose fdatasync fails stops taking appends — each is answered `LogFailed` — and
//!   keeps serving reads, tails and fences from what was durable;
//! - with a slow fdatasync, a fence is answered only after every append accepted before it
//!   is durable, and its grant names their last entry; a resent append whose events are
//!   all present is answered only once they are durable.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::time::Duration;

use bytes::Bytes;
use quire_client::{AppendOutcome, FenceOutcome, StoreClient};
use quire_proto::{AppendRequest, Epoch, Event, EventKind, LogPosition, Offset, RejectReason};
use quire_wal::disk::{open_disk, FaultDisk, FaultPlan};
use quire_wal::IoBackend;

fn append(epoch: u64, prev: Option<u64>, payloads: &[&'static str]) -> AppendRequest {
    let first = prev.map_or(0, |p| p + 1);
    AppendRequest {
        epoch: Epoch(epoch),
        prev: prev.map(|o| LogPosition {
            epoch: Epoch(epoch),
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

async fn start(dir: &tempfile::TempDir, plan: &std::sync::Arc<FaultPlan>) -> quire_node::Node {
    let data = dir.path().join("data");
    quire_node::init(&quire_node::InitArgs {
        data_dir: data.clone(),
        learner: false,
    })
    .unwrap();
    let mut config = quire_node::NodeConfig::new(&data, "127.0.0.1:0");
    config.wal.segment_bytes_max = 4 << 20;
    let (inner, _) = open_disk(IoBackend::Sync).unwrap();
    quire_node::Node::start_with_disk(config, Box::new(FaultDisk::new(inner, plan.clone())))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_waits_until_every_accepted_append_is_durable() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new();
        plan.slow_fdatasync(Duration::from_millis(50));
        let node = start(&dir, &plan).await;
        let c = StoreClient::connect(node.local_addr()).await.unwrap();

        // Five pipelined appends, then a resend of the first (all present, not durable
        // yet), then a fence — all queued before any fsync completes.
        let mut pending = Vec::new();
        for i in 0..5u64 {
            let prev = i.checked_sub(1);
            pending.push(c.start_append(append(2, prev, &["x"])).await.unwrap());
        }
        let resend = c.start_append(append(2, None, &["x"])).await.unwrap();
        let fence = c.fence(Epoch(9), None).await.unwrap();
        let FenceOutcome::Granted(g) = fence else {
            panic!("fence not granted: {fence:?}")
        };
        assert_eq!(
            g.last,
            Some(LogPosition {
                epoch: Epoch(2),
                offset: Offset(4)
            }),
            "the grant covers every append accepted before it"
        );
        // Responses on one connection arrive in the order the store sent them: by the time
        // the grant is here, the appends it waited for are answered, and durable.
        for (i, p) in pending.into_iter().enumerate() {
            let r = tokio::time::timeout(Duration::from_millis(1), p.wait())
                .await
                .expect("answered before the fence")
                .unwrap();
            assert!(matches!(r, AppendOutcome::Persisted(a) if a.through_offset == Some(Offset(i as u64))));
        }
        let r = tokio::time::timeout(Duration::from_millis(1), resend.wait())
            .await
            .expect("answered before the fence")
            .unwrap();
        assert!(matches!(r, AppendOutcome::Persisted(a) if a.through_offset == Some(Offset(0))));
        assert!(plan.fsyncs() >= 1);
        let r = c.read(Offset(0), 10, 1 << 20).await.unwrap();
        assert_eq!(r.events.len(), 5);
        // Fenced: the old epoch is refused.
        match c.append(append(2, Some(4), &["late"])).await.unwrap() {
            AppendOutcome::Rejected(r) => assert_eq!(r.reason, RejectReason::StaleEpoch),
            AppendOutcome::Persisted(p) => panic!("fenced store acked {p:?}"),
        }
        drop(c);
        node.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_log_refuses_appends_and_keeps_serving_reads() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        quire_node::init(&quire_node::InitArgs {
            data_dir: data.clone(),
            learner: false,
        })
        .unwrap();
        let mut config = quire_node::NodeConfig::new(&data, "127.0.0.1:0");
        config.wal.segment_bytes_max = 4 << 20;
        let plan = FaultPlan::new();
        let (inner, _) = open_disk(IoBackend::Sync).unwrap();
        let node = quire_node::Node::start_with_disk(
            config,
            Box::new(FaultDisk::new(inner, plan.clone())),
        )
        .await
        .unwrap();
        let c = StoreClient::connect(node.local_addr()).await.unwrap();

        // Durable before the fault; the store is ready (`GET /ready`).
        let ok = c.append(append(2, None, &["a", "b"])).await.unwrap();
        assert_eq!(node.metrics().readiness(), quire_net::Readiness::Ready);
        assert!(matches!(ok, AppendOutcome::Persisted(p) if p.through_offset == Some(Offset(1))));

        // The next fdatasync fails: the append it covers is refused, never acked.
        plan.fail_fdatasync(0, libc::EIO);
        match c.append(append(2, Some(1), &["c"])).await.unwrap() {
            AppendOutcome::Rejected(r) => {
                assert_eq!(r.reason, RejectReason::LogFailed);
                assert_eq!(
                    r.last.map(|l| l.offset),
                    Some(Offset(1)),
                    "last durable entry"
                );
            }
            AppendOutcome::Persisted(p) => panic!("acked an append whose fsync failed: {p:?}"),
        }
        // Not ready from now on, naming why.
        match node.metrics().readiness() {
            quire_net::Readiness::NotReady(why) => {
                assert!(why.contains("the log has failed"), "{why}");
            }
            quire_net::Readiness::Ready => panic!("a failed log reads as ready"),
        }
        // And every later one, at once.
        for _ in 0..3 {
            match c.append(append(2, Some(1), &["d"])).await.unwrap() {
                AppendOutcome::Rejected(r) => assert_eq!(r.reason, RejectReason::LogFailed),
                AppendOutcome::Persisted(p) => panic!("a failed log acked {p:?}"),
            }
        }

        // Reads, tails and fences still work, from what is durable.
        let r = c.read(Offset(0), 10, 1 << 20).await.unwrap();
        let got: Vec<&[u8]> = r.events.iter().map(|e| &e.payload.head()[..]).collect();
        assert_eq!(got, vec![&b"a"[..], &b"b"[..]]);
        let t = c.tail().await.unwrap();
        assert_eq!(t.last.map(|l| l.offset), Some(Offset(1)));
        match c.fence(Epoch(3), None).await.unwrap() {
            FenceOutcome::Granted(g) => assert_eq!(g.last.map(|l| l.offset), Some(Offset(1))),
            other => panic!("fence after failure: {other:?}"),
        }
        drop(c);
        assert!(
            node.shutdown().await.is_err(),
            "shutdown reports the failed WAL"
        );
    })
    .await
    .expect("bounded");
}

/// Story: a tester deleted a stopped store's `promised` file; the store started with
/// promise 0 although its log held entries of a later epoch, so it could have granted a
/// fence below one it had already granted. A store must refuse to start instead — and so
/// when its whole WAL directory is gone (`init` writes the file, so its absence says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_promised_epoch_file_stops_the_store_from_starting() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new();
        let node = start(&dir, &plan).await;
        let c = StoreClient::connect(node.local_addr()).await.unwrap();
        let outcome = c.append(append(7, None, &["a", "b"])).await.unwrap();
        assert!(
            matches!(outcome, AppendOutcome::Persisted(_)),
            "{outcome:?}"
        );
        drop(c);
        node.shutdown().await.unwrap();

        let wal_dir = dir.path().join("data").join("wal");
        let promised: Vec<_> = std::fs::read_dir(&wal_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .contains("promised")
            })
            .collect();
        assert_eq!(promised.len(), 1, "{promised:?}");
        std::fs::remove_file(&promised[0]).unwrap();

        let data = dir.path().join("data");
        // The start's error, which there must be.
        let refused = || async {
            let mut config = quire_node::NodeConfig::new(&data, "127.0.0.1:0");
            config.wal.segment_bytes_max = 4 << 20;
            match quire_node::Node::start(config).await {
                Ok(_) => panic!("a store that lost its promise or its WAL must refuse to start"),
                Err(e) => format!("{e:#}"),
            }
        };
        let text = refused().await;
        assert!(text.contains("no promised-epoch file"), "{text}");
        assert!(text.contains("replaced disk"), "{text}");

        // The whole WAL directory deleted (the break-it trial's `rm -rf DIR/wal`): the
        // store came back as an empty voter; it must refuse the same way.
        std::fs::remove_dir_all(&wal_dir).unwrap();
        let text = refused().await;
        assert!(text.contains("no promised-epoch file"), "{text}");
    })
    .await
    .expect("bounded");
}
