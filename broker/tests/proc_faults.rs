//! Multi-process tests of the broker's failure behaviour with the real binaries: no quorum,
//! a broker that knows no voters, bad client frames; and the cursor and metrics surfaces.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use quire_proto::{
    Body, BrokerId, CommitCursorRequest, CursorRequest, ErrorCode, FetchRequest, Offset,
};
use quire_tests::{
    fetch_all, payload, produce_answer, produce_request, Client, Cluster, Timing, WAIT,
};

#[test]
fn proc_no_quorum_fails_in_bounded_time_and_a_retry_is_written_once() {
    let _t = quire_tests::proc_test();
    let timing = Timing {
        produce_timeout_ms: 1_500,
        ..Timing::default()
    };
    let mut cluster = Cluster::new(3, 2, timing);
    cluster.start_all();
    let first = cluster.produce_acked(&produce_request("t", 5, 0, 100));
    assert_eq!(first.count, 100);
    let master = cluster.wait_for_master();
    let addr = cluster.broker(master).addr.clone();
    let mut c = Client::connect(&addr).expect("connect");

    // Two of three stores die: the produce is not acked, and fails with NoQuorum in time
    // (the produce timeout, or the master's check-quorum step-down, whichever comes first).
    cluster.stores[1].kill9();
    cluster.stores[2].kill9();
    let started = Instant::now();
    let failed_id = c.send(produce_request("t", 5, 100, 10)).expect("send");
    let err = produce_answer(c.recv(failed_id).expect("an answer comes"))
        .expect_err("two stores down: no ack");
    assert_eq!(err.code, ErrorCode::NoQuorum, "{err:?}");
    assert!(started.elapsed() < WAIT);
    // Metrics count it.
    let text = cluster.broker(master).scrape();
    assert!(
        text.contains("quire_produce_errors_total{code=\"no_quorum\"} 1"),
        "{text}"
    );

    // One store comes back: the retry with the same producer id and sequence is written
    // once, whether it joins the original (still in flight) or finds it stabilized. The
    // master stepped down when it lost its store quorum (check-quorum): the retry goes to
    // whichever broker leads once a quorum of stores is back.
    cluster.stores[1].start();
    let deadline = Instant::now() + WAIT;
    let (retry, mut rc) = loop {
        let leader = cluster.wait_for_master();
        let mut rc = Client::connect(&cluster.broker(leader).addr.clone()).expect("connect");
        match produce_answer(
            rc.request(produce_request("t", 5, 100, 10))
                .expect("answer"),
        ) {
            Ok(r) => break (r, rc),
            Err(e)
                if e.code == ErrorCode::NoQuorum
                    || e.code == ErrorCode::Timeout
                    || e.code == ErrorCode::NotMaster =>
            {
                assert!(Instant::now() < deadline, "producing did not resume");
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    };
    assert_eq!(retry.count, 10);
    let fetched = fetch_all(&mut rc, "t", 110);
    assert_eq!(fetched.len(), 110, "each message once");
    for (i, (_, m)) in fetched.iter().enumerate() {
        assert_eq!(*m, payload(5, i as u64));
    }
    // The failed request is never answered a second time (answers come in order on this
    // connection: one more round trip flushes anything sent before it).
    assert!(c.request(quire_proto::MetadataRequest::default()).is_ok());
    assert!(
        !c.stashed(failed_id),
        "a failed produce must never be acked later"
    );
}

#[test]
fn proc_stopped_stores_fail_the_produce_with_no_quorum_and_it_resumes() {
    let _t = quire_tests::proc_test();
    let timing = Timing {
        produce_timeout_ms: 1_500,
        ..Timing::default()
    };
    let mut cluster = Cluster::new(3, 1, timing);
    cluster.start_all();
    cluster.produce_acked(&produce_request("t", 6, 0, 10));
    let master = cluster.wait_for_master();
    let addr = cluster.broker(master).addr.clone();
    let mut c = Client::connect(&addr).expect("connect");
    // Two stores freeze: their connections stay open, but they ack nothing.
    let frozen: Vec<u32> = cluster.stores[..2]
        .iter()
        .map(|s| s.pid().expect("runs"))
        .collect();
    for &pid in &frozen {
        quire_tests::stop(pid);
    }
    let err = produce_answer(c.request(produce_request("t", 6, 10, 10)).expect("answer"))
        .expect_err("no quorum: no ack");
    assert_eq!(err.code, ErrorCode::NoQuorum, "{err:?}");
    for &pid in &frozen {
        quire_tests::signal(pid, libc::SIGCONT);
    }
    // The master stepped down when it lost its store quorum (check-quorum); with the stores
    // back it takes over again (it is the only broker), and the retry is written once.
    let deadline = Instant::now() + WAIT;
    loop {
        match produce_answer(c.request(produce_request("t", 6, 10, 10)).expect("answer")) {
            Ok(r) => {
                assert_eq!(r.count, 10);
                break;
            }
            Err(e) => {
                assert!(
                    e.code == ErrorCode::NoQuorum
                        || e.code == ErrorCode::Timeout
                        || e.code == ErrorCode::NotMaster,
                    "{e:?}"
                );
                assert!(Instant::now() < deadline, "producing did not resume");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    assert_eq!(fetch_all(&mut c, "t", 20).len(), 20);
}

#[test]
fn proc_a_broker_that_knows_no_voters_never_bootstraps_over_data() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 2, Timing::default());
    cluster.start_all();
    cluster.produce_acked(&produce_request("t", 9, 0, 20));
    let master = cluster.wait_for_master();
    let other = if master == 1 { 2 } else { 1 };
    let addr = cluster.broker(master).addr.clone();

    // Both brokers stop; the other one loses its data directory and comes back alone.
    cluster.broker(master).kill9();
    cluster.broker(other).kill9();
    let promised = |c: &Cluster| -> Vec<u64> {
        c.stores
            .iter()
            .map(|s| {
                match Client::connect(&s.addr).and_then(|mut c| c.request(quire_proto::TailRequest))
                {
                    Ok(Body::TailResponse(t)) => t.promised.0,
                    other => panic!("tail answered {other:?}"),
                }
            })
            .collect()
    };
    let before = promised(&cluster);
    let dir = cluster.broker(other).dir.clone();
    std::fs::remove_dir_all(&dir).expect("wipe the broker's directory");
    cluster.broker(other).start();
    // Several election timeouts pass: it never becomes master over the stores' data, and
    // it does not even fence them (it asks for their tails first).
    // A sleep on purpose: what is checked is that nothing happens while time passes.
    std::thread::sleep(Duration::from_millis(3_000));
    assert_eq!(
        promised(&cluster),
        before,
        "a broker that cannot bootstrap fences nothing"
    );
    let oaddr = cluster.broker(other).addr.clone();
    let mut oc = Client::connect(&oaddr).expect("connect");
    assert!(
        !oc.is_serving(),
        "a broker that knows no voters must not bootstrap"
    );
    let m = oc.metadata().expect("metadata");
    assert!(m.stores.iter().all(|s| !s.voter), "{m:?}");

    // The broker that knows the voters comes back and leads; the other learns the voters
    // from its stream.
    cluster.broker(master).start();
    let leader = cluster.wait_for_master();
    assert_eq!(leader, master);
    let deadline = Instant::now() + WAIT;
    loop {
        let m = oc.metadata().expect("metadata");
        if m.stores.iter().all(|s| s.voter)
            && m.master.as_ref().map(|b| b.id) == Some(BrokerId(master))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the voters were not learned: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut c = Client::connect(&addr).expect("connect");
    assert_eq!(fetch_all(&mut c, "t", 20).len(), 20);
}

#[test]
fn proc_cursors_metrics_and_bad_frames() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 2, Timing::default());
    cluster.start_all();
    let master = cluster.settle();
    let slave = if master == 1 { 2 } else { 1 };
    let addr = cluster.broker(master).addr.clone();
    let mut c = Client::connect(&addr).expect("connect");

    // A message above message_bytes_max (default 1 MiB) is refused at once, for good, and
    // the cluster goes on: it never reaches the stores (whose segments may be smaller).
    let mut big = produce_request("big", 9, 0, 1);
    big.messages = vec![bytes::Bytes::from(vec![7u8; (1 << 20) + 1])];
    let err = produce_answer(c.request(big).expect("answer")).expect_err("too large");
    assert_eq!(err.code, ErrorCode::MessageTooLarge, "{err:?}");
    let mut fits = produce_request("big", 9, 0, 1);
    fits.messages = vec![bytes::Bytes::from(vec![7u8; 1 << 20])];
    produce_answer(c.request(fits).expect("answer")).expect("a 1 MiB message is acked");

    // A cursor commit goes through the quorum path and reads back.
    match c
        .request(CommitCursorRequest {
            topic: "t".into(),
            cursor: "billing".into(),
            offset: Offset(42),
        })
        .expect("answer")
    {
        Body::CommitCursorResponse(_) => {}
        other => panic!("commit answered {other:?}"),
    }
    match c
        .request(CursorRequest {
            topic: "t".into(),
            cursor: "billing".into(),
        })
        .expect("answer")
    {
        Body::CursorResponse(r) => assert_eq!(r.offset, Some(Offset(42))),
        other => panic!("cursor answered {other:?}"),
    }
    // A slave refuses client reads with the master's address.
    let mut s = Client::connect(&cluster.broker(slave).addr.clone()).expect("connect");
    match s
        .request(FetchRequest {
            records: false,
            topic: "t".into(),
            from_offset: Offset(0),
            max_messages: 10,
            max_bytes: 1000,
            wait_ms: 0,
        })
        .expect("answer")
    {
        Body::ErrorResponse(e) => {
            assert_eq!(e.code, ErrorCode::NotMaster);
            match e.detail {
                quire_proto::ErrorDetail::NotMaster {
                    master: Some(m), ..
                } => {
                    assert_eq!(m.id, BrokerId(master));
                    assert_eq!(m.addr, addr);
                }
                other => panic!("no master hint: {other:?}"),
            }
        }
        other => panic!("a slave answered a fetch with {other:?}"),
    }

    // A long poll returns as soon as a message arrives.
    let poll = c
        .send(FetchRequest {
            records: false,
            topic: "later".into(),
            from_offset: Offset(0),
            max_messages: 10,
            max_bytes: 1 << 20,
            wait_ms: 20_000,
        })
        .expect("send");
    let mut p = Client::connect(&addr).expect("connect");
    produce_answer(
        p.request(produce_request("later", 0, 0, 1))
            .expect("answer"),
    )
    .expect("acked");
    match c.recv(poll).expect("answer") {
        Body::FetchResponse(r) => assert_eq!(r.messages.len(), 1),
        other => panic!("poll answered {other:?}"),
    }

    // Garbage on one connection: an error or a close, never an effect on the others.
    let mut bad = TcpStream::connect(&addr).expect("connect");
    bad.set_read_timeout(Some(WAIT)).expect("timeout");
    bad.write_all(&[0xAB; 200]).expect("write garbage");
    let mut buf = Vec::new();
    let _ = bad.read_to_end(&mut buf);
    // A sound header with an unknown frame type: answered with an error, connection kept.
    let mut q = Client::connect(&addr).expect("connect");
    let r = q.request(quire_proto::TailRequest).expect("answer");
    assert!(
        matches!(r, Body::ErrorResponse(ref e) if e.code == ErrorCode::UnexpectedFrame),
        "{r:?}"
    );
    assert!(
        q.metadata().is_ok(),
        "the connection survives a bad request"
    );
    assert!(c.metadata().is_ok(), "other clients are unaffected");

    // The metrics name the master and count what happened.
    let text = cluster.broker(master).scrape();
    for want in [
        "quire_is_master 1",
        "quire_failovers_total 1",
        "quire_produce_requests_total",
        "quire_produce_latency_seconds_bucket",
        "quire_quorum_wait_seconds_bucket",
        "quire_store_lag{store=",
        "quire_connections_open",
        "quire_failover_duration_seconds_count 1",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let slave_text = cluster.broker(slave).scrape();
    assert!(slave_text.contains("quire_is_master 0"), "{slave_text}");
}

#[test]
fn proc_a_wiped_store_is_a_learner_and_never_counts() {
    let _t = quire_tests::proc_test();
    let timing = Timing {
        produce_timeout_ms: 1_500,
        ..Timing::default()
    };
    let mut cluster = Cluster::new(3, 2, timing);
    cluster.start_all();
    let first = cluster.settle();
    cluster.produce_acked(&produce_request("t", 3, 0, 50));

    // Store 2 loses its disk and is initialised again: a new incarnation.
    cluster.stores[2].kill9();
    let dir = cluster.stores[2].dir.clone();
    std::fs::remove_dir_all(&dir).expect("wipe the store");
    let out = std::process::Command::new(quire_tests::node_bin())
        .args(["init", "--data-dir"])
        .arg(&dir)
        .output()
        .expect("quire-node init");
    assert!(out.status.success());
    cluster.stores[2].start();

    // The cluster keeps serving on the two voters; the wiped store receives the log as a
    // learner and is shown as one.
    cluster.produce_acked(&produce_request("t", 3, 50, 50));
    let addr = cluster.broker(first).addr.clone();
    let deadline = Instant::now() + WAIT;
    loop {
        let m = Client::connect(&addr)
            .and_then(|mut c| c.metadata())
            .expect("metadata");
        if !m.stores[2].voter && m.stores[2].persisted.is_some() {
            assert!(m.stores[0].voter && m.stores[1].voter, "{m:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the wiped store is not shown as a learner: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A failover: the new master's fence makes the wiped store a learner for good, and it
    // still serves on the two voters.
    cluster.broker(first).kill9();
    let second = cluster.settle();
    assert_ne!(second, first);
    cluster.produce_acked(&produce_request("t", 3, 100, 50));

    // With one voter down, the learner must not make up the quorum: producing fails.
    cluster.stores[0].kill9();
    let mut c = Client::connect(&cluster.broker(second).addr.clone()).expect("connect");
    let err = produce_answer(c.request(produce_request("t", 3, 150, 10)).expect("answer"))
        .expect_err("a learner never counts toward Qa");
    assert_eq!(err.code, ErrorCode::NoQuorum, "{err:?}");
    cluster.stores[0].start();
    // The master may have stepped down meanwhile (check-quorum): produce through whichever
    // broker leads once the voter is back.
    let fetched = {
        let deadline = Instant::now() + WAIT;
        loop {
            let leader = cluster.wait_for_master();
            if let Ok(mut c) = Client::connect(&cluster.broker(leader).addr.clone()) {
                if let Ok(Ok(_)) = c
                    .request(produce_request("t", 3, 150, 10))
                    .map(produce_answer)
                {
                    break fetch_all(&mut c, "t", 160);
                }
            }
            assert!(Instant::now() < deadline, "producing did not resume");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert_eq!(fetched.len(), 160);
    for (i, (_, m)) in fetched.iter().enumerate() {
        assert_eq!(*m, payload(3, i as u64));
    }
}
