//! A store that fell behind what the master keeps in memory catches up, on the real
//! binaries (3 `quire-node` stores, 1 `quire-broker`, loopback), with large events.
//!
//! The fault (found by an adversarial trial): store 2 is stopped (SIGSTOP) while 100
//! messages of 1 MB are acknowledged by the other two, then continued. The master keeps at
//! most 64 MiB of stabilized events in memory, so it sends store 2 what it lacks from a read
//! of another store. That catch-up append used to carry every event the master's core
//! planned (up to 1,024 of them, a gigabyte here): no frame could hold it, so it was dropped
//! at encoding and retried every second, forever, each retry's read holding its events in
//! memory (9 GB of RSS in the trial). The read now stops at 1 MiB and the append carries
//! what was read.
//!
//! What must hold: store 2's log reaches the other stores' last offset within a bound, and
//! every acknowledged message is fetched back in order. `quire cluster status` shows the
//! catch-up figures (issue 15 item 5): while store 2 is stopped, the bytes it lacks (about
//! the 100 MB it missed) and no estimate ("never": it acks nothing); once it caught up,
//! nothing to copy and an estimate of 0.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::time::Duration;

use bytes::Bytes;
use quire_proto::ProduceRequest;
use quire_tests::{fetch_all, produce_answer, Client, Cluster, Timing};

/// Messages produced while store 2 is stopped.
const MESSAGES: u64 = 100;
/// Bytes per message.
const MESSAGE_BYTES: usize = 1_000_000;
/// How long store 2 may take to catch up once continued.
const CATCH_UP_WAIT: Duration = Duration::from_secs(60);

/// Store 2's entry of `quire cluster status --format json` once `ok` holds for it (polled
/// for at most [`CATCH_UP_WAIT`]).
fn wait_status(
    broker: &str,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + CATCH_UP_WAIT;
    loop {
        let last = quire_tests::process::wait_cli_master(&[], broker, None)["stores"][2].clone();
        if ok(&last) {
            return last;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "waited {CATCH_UP_WAIT:?} for {what}, in vain; store 2 is shown as {last}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn message(seq: u64) -> Bytes {
    let mut m = vec![(seq % 251) as u8; MESSAGE_BYTES];
    m[..8].copy_from_slice(&seq.to_le_bytes());
    Bytes::from(m)
}

#[test]
fn proc_a_lagging_store_catches_up_from_another_store_with_large_events() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 1, Timing::default());
    cluster.start_all();
    cluster.settle();
    let addr = cluster.broker(1).addr.clone();
    let lagging = cluster.stores[2].pid().expect("store 2 runs");
    quire_tests::stop(lagging);

    let mut c = Client::connect(&addr).expect("connects");
    for seq in 0..MESSAGES {
        let answer = c
            .request(ProduceRequest {
                format: quire_proto::MessageFormat::Raw,
                topic: "big".into(),
                producer_id: 5,
                sequence: seq,
                messages: vec![message(seq)],
            })
            .map(produce_answer);
        assert!(matches!(answer, Ok(Ok(_))), "message {seq}: {answer:?}");
    }
    let stopped = wait_status(&addr, "store 2 shown stopped", |s| {
        s["catch_up_rate"] == 0 && s["catch_up_ms"].is_null()
    });
    let lag_bytes = stopped["lag_bytes"].as_u64().expect("bytes to copy");
    assert!(
        lag_bytes >= MESSAGES / 2 * MESSAGE_BYTES as u64,
        "store 2 lacks about {MESSAGES} MB: {stopped}"
    );
    let target = cluster
        .store_tail(0)
        .expect("store 0 answers")
        .last
        .expect("store 0 holds the messages")
        .offset;
    quire_tests::signal(lagging, libc::SIGCONT);
    quire_tests::wait_until(CATCH_UP_WAIT, "store 2 catching up", || {
        cluster
            .store_tail(2)
            .is_ok_and(|t| t.last.is_some_and(|l| l.offset >= target))
    });

    wait_status(&addr, "store 2 shown in sync", |s| {
        s["catch_up_ms"] == 0 && s["lag_bytes"] == 0 && s["state"] == "in sync"
    });

    let got = fetch_all(&mut c, "big", MESSAGES as usize);
    assert_eq!(got.len() as u64, MESSAGES);
    for (seq, (_, m)) in (0..).zip(&got) {
        assert_eq!(*m, message(seq), "message {seq}");
    }
}
