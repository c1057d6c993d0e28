//! Failpoints reach the real `quire-node` binary (`QUIRE_FAILPOINTS`, the `failpoints`
//! feature; see `node/src/failpoints.rs`).
//!
//! Fault: the store's WAL fails one fdatasync (EIO), or one write (EIO), of the batch
//! that carries a chosen append. What must hold: the store never acknowledges that append
//! (it is answered `LogFailed`), nor any later one; reads, tails and fences are still
//! served from the durable log; every append acknowledged before the fault is still there
//! after a restart without failpoints, and the restarted store takes appends again.
//!
//! In a build without the feature the same spec must make the node refuse to start (a
//! fault test must never pass without its fault).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use bytes::Bytes;
use quire_client::{AppendOutcome, FenceOutcome, StoreClient};
use quire_node::failpoints::{compiled_in, FAILPOINTS_ENV};
use quire_proto::{Epoch, Offset, RejectReason};
use quire_tests::node::*;

/// Appends one event per call, each waiting for its answer, so that each append is one
/// batch: one write and one fdatasync of the WAL, in order.
async fn append_one(c: &StoreClient, offset: u64, payload: &'static str) -> AppendOutcome {
    let prev = offset.checked_sub(1).map(|o| pos(2, o));
    c.append(append(
        2,
        prev,
        2,
        &[Bytes::from_static(payload.as_bytes())],
    ))
    .await
    .expect("append answered")
}

/// What `spec` fails, and how many appends succeed before it.
struct Case {
    spec: &'static str,
    acked_before: u64,
}

const CASES: [Case; 2] = [
    Case {
        spec: "wal_fdatasync=eio,after=3",
        acked_before: 3,
    },
    Case {
        spec: "wal_write=eio,after=2",
        acked_before: 2,
    },
];

#[test]
fn a_failed_fdatasync_or_write_is_never_acknowledged_and_the_acked_prefix_survives() {
    let _t = quire_tests::proc_test();
    if !compiled_in() {
        refuses_to_start_without_the_feature();
        return;
    }
    for case in CASES {
        one_case(&case);
    }
}

fn one_case(case: &Case) {
    let dir = TestDir::new();
    init(&dir.data(), false);
    let config = dir.config();
    let extra = ["--config", config.to_str().expect("utf-8 path")];
    let mut node = NodeProc::start_with_env(
        &dir.data(),
        &dir.log(),
        &extra,
        &[(FAILPOINTS_ENV, case.spec)],
    );
    let payloads = ["a", "b", "c", "d", "e", "f"];
    block_on(async {
        let c = StoreClient::connect(node.addr).await.expect("connect");
        for i in 0..case.acked_before {
            match append_one(&c, i, payloads[i as usize]).await {
                AppendOutcome::Persisted(p) => assert_eq!(p.through_offset, Some(Offset(i))),
                AppendOutcome::Rejected(r) => {
                    panic!("{}: append {i} before the fault: {r:?}", case.spec)
                }
            }
        }
        // The fault hits this append's batch: never acknowledged.
        let at = case.acked_before;
        match append_one(&c, at, payloads[at as usize]).await {
            AppendOutcome::Rejected(r) => {
                assert_eq!(r.reason, RejectReason::LogFailed, "{}", case.spec);
                assert_eq!(
                    r.last.map(|l| l.offset),
                    Some(Offset(at - 1)),
                    "{}: the rejection names the last durable entry",
                    case.spec
                );
            }
            AppendOutcome::Persisted(p) => {
                panic!(
                    "{}: acknowledged the batch whose I/O failed: {p:?}",
                    case.spec
                )
            }
        }
        // Fail-stop: no later append is taken, even at a valid position.
        for _ in 0..3 {
            match append_one(&c, at, "late").await {
                AppendOutcome::Rejected(r) => assert_eq!(r.reason, RejectReason::LogFailed),
                AppendOutcome::Persisted(p) => panic!("{}: a failed log acked {p:?}", case.spec),
            }
        }
        // Still serving what is durable.
        let tail = c.tail().await.expect("tail");
        assert_eq!(tail.last.map(|l| l.offset), Some(Offset(at - 1)));
        let r = c.read(Offset(0), 100, 1 << 20).await.expect("read");
        let got: Vec<&[u8]> = r.events.iter().map(|e| &e.payload.head()[..]).collect();
        let want: Vec<&[u8]> = payloads[..at as usize]
            .iter()
            .map(|p| p.as_bytes())
            .collect();
        assert_eq!(got, want, "{}", case.spec);
        match c.fence(Epoch(3), None).await.expect("fence") {
            FenceOutcome::Granted(g) => assert_eq!(g.last.map(|l| l.offset), Some(Offset(at - 1))),
            other => panic!("{}: fence after the failure: {other:?}", case.spec),
        }
    });
    assert_eq!(node.metric("quire_wal_failed"), 1.0, "{}", case.spec);
    let log = std::fs::read_to_string(dir.log()).unwrap_or_default();
    assert!(
        log.contains("failpoint") && log.contains("the WAL failed"),
        "{}: the log names the injected fault and the failure:\n{log}",
        case.spec
    );
    assert!(
        !node.terminate(),
        "{}: a store whose WAL failed exits with an error",
        case.spec
    );

    // Restart without failpoints: everything acknowledged is there, and appends resume.
    let node = NodeProc::start_with_env(&dir.data(), &dir.log(), &extra, &[]);
    block_on(async {
        let c = StoreClient::connect(node.addr).await.expect("connect");
        let r = c.read(Offset(0), 100, 1 << 20).await.expect("read");
        let got: Vec<&[u8]> = r.events.iter().map(|e| &e.payload.head()[..]).collect();
        let acked: Vec<&[u8]> = payloads[..case.acked_before as usize]
            .iter()
            .map(|p| p.as_bytes())
            .collect();
        assert!(
            got.starts_with(&acked),
            "{}: every acknowledged append survives: {got:?}",
            case.spec
        );
        // The failed batch was written but never made durable by this store: after the
        // restart it may be there or not; nothing beyond it is.
        assert!(
            got.len() as u64 <= case.acked_before + 1,
            "{}: {got:?}",
            case.spec
        );
        let next = got.len() as u64;
        let prev = next.checked_sub(1).map(|o| pos(2, o));
        let req = append(3, prev, 3, &[Bytes::from_static(b"after restart")]);
        match c.append(req).await.expect("append") {
            AppendOutcome::Persisted(p) => assert_eq!(p.through_offset, Some(Offset(next))),
            AppendOutcome::Rejected(r) => panic!("{}: after restart: {r:?}", case.spec),
        }
    });
}

fn refuses_to_start_without_the_feature() {
    let dir = TestDir::new();
    init(&dir.data(), false);
    let mut child = std::process::Command::new(bin())
        .args(["run", "--data-dir"])
        .arg(dir.data())
        .args(["--listen", "127.0.0.1:0"])
        .env(FAILPOINTS_ENV, "wal_fdatasync=eio")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn quire-node run");
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    while child.try_wait().expect("try_wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a node without the failpoints feature ran with {FAILPOINTS_ENV} set");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("without the `failpoints` feature"), "{err}");
}
