//! The real `quire-node` binary over TCP: durability across kill -9, fences, log matching
//! and truncation, store identity. Each test starts its own node on 127.0.0.1:0.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quire_client::{AppendOutcome, ClientError, FenceOutcome, StoreClient};
use quire_proto::{
    AppendRejected, BrokerId, Epoch, Heartbeat, Incarnation, LogPosition, Offset, PersistedAck,
    RejectReason,
};
use quire_tests::node::*;
use tokio::sync::Mutex;

async fn connect(node: &NodeProc) -> StoreClient {
    StoreClient::connect(node.addr).await.expect("connect")
}

fn persisted(o: AppendOutcome) -> PersistedAck {
    match o {
        AppendOutcome::Persisted(p) => p,
        AppendOutcome::Rejected(r) => panic!("expected Persisted, got {r:?}"),
    }
}

fn rejected(o: AppendOutcome) -> AppendRejected {
    match o {
        AppendOutcome::Rejected(r) => r,
        AppendOutcome::Persisted(p) => panic!("expected Rejected, got {p:?}"),
    }
}

/// Reads the whole durable log through `client`, page by page.
async fn read_all(client: &StoreClient) -> Vec<(u64, u64, Bytes)> {
    let mut out = Vec::new();
    let mut from = 0u64;
    loop {
        let r = client
            .read(Offset(from), 1000, 1 << 20)
            .await
            .expect("read");
        if r.events.is_empty() {
            return out;
        }
        for e in r.events {
            assert_eq!(e.offset.0, from, "read returns consecutive offsets");
            out.push((e.offset.0, e.epoch.0, e.payload.to_bytes()));
            from += 1;
        }
    }
}

/// The log a test builds, shared by concurrent appenders.
struct Builder {
    last: Option<LogPosition>,
    /// Payload expected at each offset.
    payloads: Vec<Bytes>,
    /// Highest offset acked by a PersistedAck.
    acked: Option<u64>,
}

const EPOCH: u64 = 0x1_0001;

/// Appends `batches` batches of `per_batch` events from one connection, chaining on the
/// shared builder. An append that arrives before the one it chains on (they travel on
/// different connections) gets LogMismatch and is resent as is, as a master would.
async fn appender(
    client: Arc<StoreClient>,
    builder: Arc<Mutex<Builder>>,
    conn: usize,
    batches: usize,
    per_batch: usize,
) -> Result<(), ClientError> {
    let mut pending = Vec::new();
    for b in 0..batches {
        {
            let mut g = builder.lock().await;
            let first = g.last.map_or(0, |p| p.offset.0 + 1);
            let payloads: Vec<Bytes> = (0..per_batch)
                .map(|i| {
                    Bytes::from(format!(
                        "c{conn}-b{b}-e{i}-{}",
                        "x".repeat((b * 7 + i) % 200)
                    ))
                })
                .collect();
            let req = append(EPOCH, g.last, EPOCH, &payloads);
            g.payloads.extend(payloads);
            g.last = Some(pos(EPOCH, first + per_batch as u64 - 1));
            // Queue it while holding the builder, so this connection's appends leave in
            // log order.
            pending.push((req.clone(), client.start_append(req).await?));
        }
        // Keep a few appends in flight per connection.
        if pending.len() >= 4 {
            let (req, p) = pending.remove(0);
            settle(&client, &builder, req, p).await?;
        }
    }
    for (req, p) in pending {
        settle(&client, &builder, req, p).await?;
    }
    Ok(())
}

async fn settle(
    client: &StoreClient,
    builder: &Mutex<Builder>,
    req: quire_proto::AppendRequest,
    mut p: quire_client::PendingAppend,
) -> Result<(), ClientError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match p.wait().await? {
            AppendOutcome::Persisted(ack) => {
                assert_eq!(ack.through_offset, req.through_offset());
                assert!(ack.voter);
                let through = ack.through_offset.expect("events").0;
                let mut g = builder.lock().await;
                g.acked = Some(g.acked.map_or(through, |a| a.max(through)));
                return Ok(());
            }
            AppendOutcome::Rejected(r) => {
                assert_eq!(r.reason, RejectReason::LogMismatch, "{r:?}");
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "append never matched"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
                p = client.start_append(req.clone()).await?;
            }
        }
    }
}

#[test]
fn proc_appends_from_three_connections_survive_kill_9() {
    let _t = quire_tests::proc_test();
    let dir = TestDir::new();
    init(&dir.data(), false);
    let node = NodeProc::start(&dir);
    let addr = node.addr;
    let node = Arc::new(std::sync::Mutex::new(Some(node)));
    block_on(async move {
        let builder = Arc::new(Mutex::new(Builder {
            last: None,
            payloads: Vec::new(),
            acked: None,
        }));
        // Phase 1: three connections append concurrently; all acked.
        let mut tasks = Vec::new();
        for c in 0..3 {
            let client = Arc::new(StoreClient::connect(addr).await.expect("connect"));
            tasks.push(tokio::spawn(appender(client, builder.clone(), c, 40, 25)));
        }
        for t in tasks {
            t.await.expect("task").expect("appends");
        }
        let (expected, acked) = {
            let g = builder.lock().await;
            (g.payloads.clone(), g.acked)
        };
        assert_eq!(acked, Some(expected.len() as u64 - 1));
        let reader = StoreClient::connect(addr).await.expect("connect");
        let log = read_all(&reader).await;
        assert_eq!(log.len(), expected.len());
        for (o, e, p) in &log {
            assert_eq!(*e, EPOCH);
            assert_eq!(p, &expected[*o as usize], "payload at {o}");
        }
        let metrics_before = node.lock().unwrap().as_ref().unwrap().http_get("/metrics");
        assert!(metric_value(&metrics_before, "quire_appends_persisted_total") >= 120.0);
        let fsyncs = metric_value(&metrics_before, "quire_wal_fsyncs_total");
        assert!(fsyncs >= 1.0);
        assert_eq!(
            metric_value(&metrics_before, "quire_wal_fsync_duration_seconds_count"),
            fsyncs
        );
        assert!(metric_value(&metrics_before, "quire_group_commit_appends_count") >= 1.0);
        // The stage sums are exported and have seen the appends.
        for stage in [
            "quire_wal_append_prepare_seconds_total",
            "quire_wal_append_queue_seconds_total",
            "quire_wal_batch_encode_seconds_total",
            "quire_wal_write_seconds_total",
        ] {
            assert!(metric_value(&metrics_before, stage) > 0.0, "{stage}");
        }
        assert_eq!(
            metric_value(&metrics_before, "quire_log_last_durable_offset"),
            expected.len() as f64 - 1.0
        );

        // Phase 2: append again from three connections and kill -9 the node while they
        // run: every event acked before the kill must be there after the restart.
        let mut tasks = Vec::new();
        for c in 0..3 {
            let client = Arc::new(StoreClient::connect(addr).await.expect("connect"));
            tasks.push(tokio::spawn(appender(
                client,
                builder.clone(),
                c + 3,
                1000,
                10,
            )));
        }
        let target = expected.len() as u64 + 200;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while builder.lock().await.acked.unwrap_or(0) < target {
            assert!(
                tokio::time::Instant::now() < deadline,
                "phase 2 made no progress"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        node.lock().unwrap().as_mut().unwrap().kill9();
        for t in tasks {
            // Each appender stops with a connection error (or finished in time).
            let _ = t.await.expect("task");
        }
        let (expected, acked) = {
            let g = builder.lock().await;
            (g.payloads.clone(), g.acked.expect("acked"))
        };
        drop(reader);
        let restarted = node.lock().unwrap().take().unwrap().restart();
        let reader = StoreClient::connect(restarted.addr).await.expect("connect");
        let log = read_all(&reader).await;
        assert!(
            log.len() as u64 > acked,
            "acked through {acked}, but the log holds {} events after restart",
            log.len()
        );
        for (o, _, p) in &log {
            assert_eq!(p, &expected[*o as usize], "payload at {o} after restart");
        }
        let tail = reader.tail().await.expect("tail");
        assert_eq!(tail.last.map(|l| l.offset.0), Some(log.len() as u64 - 1));
        *node.lock().unwrap() = Some(restarted);
    });
}

#[test]
fn proc_fence_refuses_lower_epochs_also_after_restart() {
    let _t = quire_tests::proc_test();
    let dir = TestDir::new();
    init(&dir.data(), false);
    let mut node = NodeProc::start(&dir);
    block_on(async {
        let c = connect(&node).await;
        let three: Vec<Bytes> = (0..3).map(|i| Bytes::from(format!("e{i}"))).collect();
        persisted(c.append(append(5, None, 5, &three)).await.unwrap());

        let FenceOutcome::Granted(g) = c.fence(Epoch(7), None).await.unwrap() else {
            panic!("fence 7 not granted")
        };
        assert_eq!(g.epoch, Epoch(7));
        assert_eq!(g.last, Some(pos(5, 2)));
        let t = c.tail().await.unwrap();
        assert_eq!((g.store_id, g.incarnation), (t.store_id, t.incarnation));
        assert_eq!(t.promised, Epoch(7));

        for e in [5, 6] {
            let r = rejected(
                c.append(append(e, Some(pos(5, 2)), 5, &three))
                    .await
                    .unwrap(),
            );
            assert_eq!(r.reason, RejectReason::StaleEpoch);
            assert_eq!(r.promised, Epoch(7));
            assert_eq!(r.last, Some(pos(5, 2)));
        }
        // The same fence again (its first grant may have been lost): granted.
        assert!(
            matches!(c.fence(Epoch(7), None).await.unwrap(), FenceOutcome::Granted(g) if g.last == Some(pos(5, 2)))
        );
        assert_eq!(
            c.fence(Epoch(6), None).await.unwrap(),
            FenceOutcome::Refused(quire_proto::FenceRefused { promised: Epoch(7) })
        );
    });
    node = node.restart();
    block_on(async {
        let c = connect(&node).await;
        let one = [Bytes::from_static(b"late")];
        let r = rejected(c.append(append(5, Some(pos(5, 2)), 5, &one)).await.unwrap());
        assert_eq!(r.reason, RejectReason::StaleEpoch);
        assert_eq!(c.tail().await.unwrap().promised, Epoch(7));
        assert!(matches!(
            c.fence(Epoch(6), None).await.unwrap(),
            FenceOutcome::Refused(_)
        ));
        assert!(matches!(
            c.fence(Epoch(7), None).await.unwrap(),
            FenceOutcome::Granted(_)
        ));
        // The new master appends.
        let ack = persisted(c.append(append(7, Some(pos(5, 2)), 7, &one)).await.unwrap());
        assert_eq!(ack.through_offset, Some(Offset(3)));
        assert_eq!(ack.epoch, Epoch(7));

        // Heartbeats: the HWM is learned only from epochs at or above the promise, and
        // only rises; the ack reports the promised epoch and the last entry.
        let hb = |epoch, hwm: Option<u64>| Heartbeat {
            epoch: Epoch(epoch),
            hwm: hwm.map(Offset),
            master: BrokerId(1),
        };
        let a = c.heartbeat(hb(5, Some(100))).await.unwrap();
        assert_eq!(a.epoch, Epoch(7));
        assert_eq!(a.last, Some(pos(7, 3)));
        assert_eq!(
            c.tail().await.unwrap().hwm,
            None,
            "a stale master's HWM is ignored"
        );
        c.heartbeat(hb(7, Some(2))).await.unwrap();
        assert_eq!(c.tail().await.unwrap().hwm, Some(Offset(2)));
        c.heartbeat(hb(7, Some(1))).await.unwrap();
        assert_eq!(c.tail().await.unwrap().hwm, Some(Offset(2)));
        // Appends carry the HWM too.
        let mut a = append(7, Some(pos(7, 3)), 7, &one);
        a.hwm = Some(Offset(3));
        persisted(c.append(a).await.unwrap());
        assert_eq!(c.tail().await.unwrap().hwm, Some(Offset(3)));
    });
}

#[test]
fn proc_log_matching_and_truncation_survive_restart() {
    let _t = quire_tests::proc_test();
    let dir = TestDir::new();
    init(&dir.data(), false);
    let mut node = NodeProc::start(&dir);
    block_on(async {
        let c = connect(&node).await;
        let five: Vec<Bytes> = (0..5).map(|i| Bytes::from(format!("old{i}"))).collect();
        let ack = persisted(c.append(append(5, None, 5, &five)).await.unwrap());
        assert_eq!(ack.through_offset, Some(Offset(4)));

        // prev past the end, and prev with the wrong epoch: rejected with the last entry.
        for prev in [pos(5, 9), pos(4, 2)] {
            let r = rejected(
                c.append(append(5, Some(prev), 5, &five[..1]))
                    .await
                    .unwrap(),
            );
            assert_eq!(r.reason, RejectReason::LogMismatch);
            assert_eq!(r.last, Some(pos(5, 4)));
        }

        // A resend of what is already there is acked through its own end (2), not the
        // store's log end (4).
        let ack = persisted(
            c.append(append(5, Some(pos(5, 0)), 5, &five[1..3]))
                .await
                .unwrap(),
        );
        assert_eq!(ack.through_offset, Some(Offset(2)));

        // A higher epoch at an earlier offset truncates the suffix.
        let new: Vec<Bytes> = (0..2).map(|i| Bytes::from(format!("new{i}"))).collect();
        let ack = persisted(c.append(append(7, Some(pos(5, 1)), 7, &new)).await.unwrap());
        assert_eq!(ack.through_offset, Some(Offset(3)));
        let log = read_all(&c).await;
        let want = |log: &[(u64, u64, Bytes)]| {
            let got: Vec<(u64, u64, &[u8])> =
                log.iter().map(|(o, e, p)| (*o, *e, &p[..])).collect();
            assert_eq!(
                got,
                vec![
                    (0, 5, &b"old0"[..]),
                    (1, 5, &b"old1"[..]),
                    (2, 7, &b"new0"[..]),
                    (3, 7, &b"new1"[..]),
                ]
            );
        };
        want(&log);
        // The old epoch is fenced by the append (promised rose to 7).
        let r = rejected(
            c.append(append(5, Some(pos(5, 4)), 5, &five[..1]))
                .await
                .unwrap(),
        );
        assert_eq!(r.reason, RejectReason::StaleEpoch);

        // Pipelined appends: ten in flight at once, each chaining on the previous one
        // before any is durable.
        let mut pending = Vec::new();
        let mut prev = pos(7, 3);
        for i in 0..10u64 {
            let p = [Bytes::from(format!("p{i}"))];
            pending.push(c.start_append(append(7, Some(prev), 7, &p)).await.unwrap());
            prev = pos(7, 4 + i);
        }
        for (i, p) in pending.into_iter().enumerate() {
            let ack = persisted(p.wait().await.unwrap());
            assert_eq!(ack.through_offset, Some(Offset(4 + i as u64)));
        }
        assert_eq!(read_all(&c).await.len(), 14);

        // Reads are bounded by events and by payload bytes (at least one event), and
        // empty outside the log.
        let r = c.read(Offset(4), 3, 1 << 20).await.unwrap();
        let offsets: Vec<u64> = r.events.iter().map(|e| e.offset.0).collect();
        assert_eq!(offsets, vec![4, 5, 6]);
        assert_eq!(r.last, Some(pos(7, 13)));
        assert_eq!(r.first_offset, Offset(0));
        let r = c.read(Offset(4), 100, 1).await.unwrap();
        assert_eq!(r.events.len(), 1);
        let r = c.read(Offset(4), 100, 5).await.unwrap();
        assert_eq!(r.events.len(), 2, "p0 and p1 are 2 bytes each");
        assert!(c
            .read(Offset(14), 100, 1 << 20)
            .await
            .unwrap()
            .events
            .is_empty());
        assert!(c
            .read(Offset(1000), 100, 1 << 20)
            .await
            .unwrap()
            .events
            .is_empty());
        assert!(c
            .read(Offset(0), 0, 1 << 20)
            .await
            .unwrap()
            .events
            .is_empty());
    });
    node = node.restart();
    block_on(async {
        let c = connect(&node).await;
        let log = read_all(&c).await;
        assert_eq!(log.len(), 14);
        assert_eq!(log[1].1, 5);
        assert_eq!(&log[2].2[..], b"new0");
        assert_eq!(c.tail().await.unwrap().last, Some(pos(7, 13)));
    });
}

/// A fence that expects another identity at this address (a wiped disk's old one, or a
/// voter set that names another store here) is refused `NotVoter`, and nothing is
/// recorded: the store stays a voter directory, also after a restart, and a fence that
/// expects its own identity (a voter set that names it) is granted.
#[test]
fn proc_identity_mismatch_refuses_that_fence_and_records_nothing() {
    let _t = quire_tests::proc_test();
    let dir = TestDir::new();
    init(&dir.data(), false);
    let mut node = NodeProc::start(&dir);
    let one = [Bytes::from_static(b"a")];
    let me = block_on_value(async {
        let c = connect(&node).await;
        let ack = persisted(c.append(append(3, None, 3, &one)).await.unwrap());
        assert!(ack.voter);
        let t = c.tail().await.unwrap();
        assert!(t.voter);
        let me = (t.store_id, t.incarnation);
        // The right identity: granted.
        assert!(matches!(
            c.fence(Epoch(4), Some(me)).await.unwrap(),
            FenceOutcome::Granted(_)
        ));
        // Another identity expected at this address: not a voter for that fence.
        let wrong = (me.0, Incarnation(me.1 .0 ^ 1));
        assert_eq!(
            c.fence(Epoch(5), Some(wrong)).await.unwrap(),
            FenceOutcome::NotVoter {
                store_id: me.0,
                incarnation: me.1
            }
        );
        assert_eq!(
            c.tail().await.unwrap().promised,
            Epoch(4),
            "nothing promised"
        );
        let ack = persisted(c.append(append(4, Some(pos(3, 0)), 4, &one)).await.unwrap());
        assert!(ack.voter, "still a voter directory");
        me
    });
    node = node.restart();
    block_on(async {
        let c = connect(&node).await;
        assert!(c.tail().await.unwrap().voter);
        assert!(matches!(
            c.fence(Epoch(9), Some(me)).await.unwrap(),
            FenceOutcome::Granted(_)
        ));
        assert_eq!(c.tail().await.unwrap().promised, Epoch(9));
    });
}

#[test]
fn proc_learner_from_init_and_cli_refusals() {
    let _t = quire_tests::proc_test();
    // init --learner: a learner from the start.
    let dir = TestDir::new();
    init(&dir.data(), true);
    let node = NodeProc::start(&dir);
    block_on(async {
        let c = connect(&node).await;
        let ack = persisted(
            c.append(append(2, None, 2, &[Bytes::from_static(b"x")]))
                .await
                .unwrap(),
        );
        assert!(!ack.voter);
        assert!(matches!(
            c.fence(Epoch(3), None).await.unwrap(),
            FenceOutcome::NotVoter { .. }
        ));
    });
    drop(node);

    // init on a non-empty directory (an existing store, or anything else) fails.
    let out = run_cli(&["init", "--data-dir", dir.data().to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not empty"), "{err}");

    // run on a directory that was never initialised fails and says what to do.
    let empty = dir.root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = run_cli(&[
        "run",
        "--data-dir",
        empty.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("never initialised") && err.contains("quire-node init"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&empty).unwrap().count(),
        0,
        "run must not write into it"
    );
}

fn block_on_value<T: Send + 'static, F: std::future::Future<Output = T>>(f: F) -> T {
    let mut out = None;
    block_on(async {
        out = Some(f.await);
    });
    out.expect("set")
}
