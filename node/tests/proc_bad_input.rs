//! Bad input against the real `quire-node` binary: every kind of broken frame, random
//! bytes, 1,000 idle connections and a peer that never reads its responses. Each gets an
//! error frame or a closed connection, is counted in /metrics, and leaves every other
//! connection — and the stored data — alone.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::io::Write as _;
use std::net::TcpStream as StdStream;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quire_client::{AppendOutcome, StoreClient};
use quire_proto::{
    decode, encode, Body, ErrorCode, Frame, FrameHeader, FrameType, LogId, Offset, RequestId,
    TailRequest, FRAME_BYTES_MAX, HEADER_BYTES,
};
use quire_tests::node::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IDLE_CONNECTIONS: usize = 1000;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Raises the soft open-files limit so the test can hold the idle connections.
fn ensure_open_files(needed: u64) {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid rlimit for getrlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
    if l.rlim_cur >= needed {
        return;
    }
    assert!(
        l.rlim_max >= needed,
        "this test needs {needed} open files; the hard limit is {} (raise it with ulimit -Hn)",
        l.rlim_max
    );
    let raised = libc::rlimit {
        rlim_cur: needed,
        rlim_max: l.rlim_max,
    };
    // SAFETY: `raised` is a valid rlimit; setrlimit only reads it.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) }, 0);
}

/// A frame with a sound header (its CRC is right) for any length, type and body CRC.
fn raw_frame(
    frame_bytes: u32,
    frame_type: u16,
    request_id: u64,
    body: &[u8],
    body_crc: Option<u32>,
) -> Vec<u8> {
    let header = FrameHeader {
        frame_bytes,
        frame_type,
        flags: 0,
        request_id: RequestId(request_id),
        log: LogId::ZERO,
        reserved: 0,
        body_crc: body_crc.unwrap_or_else(|| crc32c::crc32c(body)),
    };
    let mut out = header.encode().to_vec();
    out.extend_from_slice(body);
    out
}

fn sound_frame(frame_type: u16, request_id: u64, body: &[u8]) -> Vec<u8> {
    raw_frame(
        (HEADER_BYTES + body.len()) as u32,
        frame_type,
        request_id,
        body,
        None,
    )
}

fn tail_frame(request_id: u64) -> Vec<u8> {
    let mut b = BytesMut::new();
    encode(&Frame::new(RequestId(request_id), TailRequest), &mut b).unwrap();
    b.to_vec()
}

/// The next frame from `s`, or `None` at end of stream (bounded).
async fn next_frame(s: &mut TcpStream, buf: &mut BytesMut) -> Option<Frame> {
    loop {
        if let Some(f) = decode(buf).expect("the node sends sound frames") {
            return Some(f);
        }
        let n = tokio::time::timeout(IO_TIMEOUT, s.read_buf(buf))
            .await
            .expect("the node answered in time")
            .unwrap_or(0);
        if n == 0 {
            return None;
        }
    }
}

async fn expect_error(s: &mut TcpStream, buf: &mut BytesMut, request_id: u64, code: ErrorCode) {
    let f = next_frame(s, buf).await.expect("an error frame");
    assert_eq!(f.request_id, RequestId(request_id));
    match f.body {
        Body::ErrorResponse(e) => assert_eq!(e.code, code, "{}", e.message),
        other => panic!("expected an ErrorResponse, got {other:?}"),
    }
}

async fn expect_closed(s: &mut TcpStream, buf: &mut BytesMut) {
    assert!(
        next_frame(s, buf).await.is_none(),
        "the node should close this connection"
    );
}

/// Sends `bytes` on a new connection.
async fn send(node: &NodeProc, bytes: &[u8]) -> (TcpStream, BytesMut) {
    let mut s = TcpStream::connect(node.addr).await.expect("connect");
    s.write_all(bytes).await.expect("send");
    (s, BytesMut::new())
}

/// Checks that the connection still serves: a Tail is answered.
async fn still_serves(s: &mut TcpStream, buf: &mut BytesMut, request_id: u64) {
    s.write_all(&tail_frame(request_id))
        .await
        .expect("send tail");
    let f = next_frame(s, buf).await.expect("tail response");
    assert_eq!(f.request_id, RequestId(request_id));
    assert!(matches!(f.body, Body::TailResponse(_)), "{:?}", f.body);
}

fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn proc_bad_frames_and_idle_connections_leave_the_node_serving() {
    let _t = quire_tests::proc_test();
    ensure_open_files(IDLE_CONNECTIONS as u64 + 512);
    let dir = TestDir::new();
    init(&dir.data(), false);
    let node = NodeProc::start(&dir);
    block_on(async {
        // Some data first: it must be unchanged by everything below.
        let good = StoreClient::connect(node.addr).await.expect("connect");
        let first: Vec<Bytes> = (0..10)
            .map(|i| Bytes::from(format!("before-{i}")))
            .collect();
        let ack = good.append(append(3, None, 3, &first)).await.unwrap();
        assert!(matches!(ack, AppendOutcome::Persisted(_)));

        // 1,000 idle connections, held open for the rest of the test.
        let mut idle = Vec::with_capacity(IDLE_CONNECTIONS);
        for _ in 0..IDLE_CONNECTIONS {
            idle.push(StdStream::connect_timeout(&node.addr, IO_TIMEOUT).expect("idle connect"));
        }
        let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
        while node.metric("quire_connections_open") < IDLE_CONNECTIONS as f64 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "idle connections not all accepted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // Unknown frame type: an error for that request, and the connection goes on.
        let (mut s, mut b) = send(&node, &sound_frame(0x7777, 11, b"whatever")).await;
        expect_error(&mut s, &mut b, 11, ErrorCode::UnknownFrameType).await;
        still_serves(&mut s, &mut b, 12).await;

        // A length above FRAME_BYTES_MAX: the stream cannot be trusted; error 0 and close.
        let (mut s, mut b) = send(
            &node,
            &raw_frame(
                FRAME_BYTES_MAX as u32 + 1,
                FrameType::AppendRequest.as_u16(),
                21,
                &[],
                Some(0),
            ),
        )
        .await;
        expect_error(&mut s, &mut b, 0, ErrorCode::FrameTooLarge).await;
        expect_closed(&mut s, &mut b).await;

        // A length below the header.
        let (mut s, mut b) = send(
            &node,
            &raw_frame(10, FrameType::TailRequest.as_u16(), 31, &[], Some(0)),
        )
        .await;
        expect_error(&mut s, &mut b, 0, ErrorCode::Malformed).await;
        expect_closed(&mut s, &mut b).await;

        // An append whose event count is larger than its body can hold.
        let mut body = Vec::new();
        body.extend_from_slice(&3u64.to_le_bytes()); // epoch
        body.push(0); // prev: none
        body.push(0); // hwm: none
        body.extend_from_slice(&1000u32.to_le_bytes()); // 1000 events…
        body.extend_from_slice(&[0u8; 13]); // …in 13 bytes
        let (mut s, mut b) = send(
            &node,
            &sound_frame(FrameType::AppendRequest.as_u16(), 41, &body),
        )
        .await;
        expect_error(&mut s, &mut b, 41, ErrorCode::Malformed).await;
        still_serves(&mut s, &mut b, 42).await;

        // A bad body checksum: an error for that request, and the connection goes on.
        let tail = tail_frame(0);
        let (mut s, mut b) = send(
            &node,
            &raw_frame(
                HEADER_BYTES as u32 + 4,
                FrameType::TailRequest.as_u16(),
                51,
                &[1, 2, 3, 4],
                Some(0xdead_beef),
            ),
        )
        .await;
        expect_error(&mut s, &mut b, 51, ErrorCode::ChecksumMismatch).await;
        still_serves(&mut s, &mut b, 52).await;
        // A bad header checksum: close.
        let mut bad_header = tail.clone();
        bad_header[10] ^= 0x40;
        let (mut s, mut b) = send(&node, &bad_header).await;
        expect_error(&mut s, &mut b, 0, ErrorCode::ChecksumMismatch).await;
        expect_closed(&mut s, &mut b).await;

        // A truncated body, then the peer closes.
        let whole = sound_frame(FrameType::AppendRequest.as_u16(), 61, &[0u8; 100]);
        let (mut s, _) = send(&node, &whole[..HEADER_BYTES + 50]).await;
        s.shutdown().await.expect("shutdown");
        drop(s);

        // Random bytes, on several connections.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..5 {
            let junk: Vec<u8> = (0..4096).map(|_| xorshift(&mut seed) as u8).collect();
            let (mut s, mut b) = send(&node, &junk).await;
            expect_error(&mut s, &mut b, 0, ErrorCode::ChecksumMismatch).await;
            expect_closed(&mut s, &mut b).await;
        }

        // A valid frame the store does not serve (a response).
        let mut resp = BytesMut::new();
        encode(
            &Frame::new(
                RequestId(71),
                quire_proto::FenceRefused {
                    promised: quire_proto::Epoch(1),
                },
            ),
            &mut resp,
        )
        .unwrap();
        let (mut s, mut b) = send(&node, &resp).await;
        expect_error(&mut s, &mut b, 71, ErrorCode::UnexpectedFrame).await;
        still_serves(&mut s, &mut b, 72).await;

        // A sound append about a log this store does not host (log 7; its `prev` matches
        // log 0's end, so were the log id ignored it would be written): UnknownLog under
        // the request's log id, nothing written (checked below), and the connection goes
        // on.
        let mut other_log = BytesMut::new();
        let stray = [Bytes::from_static(b"for log 7")];
        encode(
            &Frame::on_log(
                LogId(7),
                RequestId(73),
                append(3, Some(pos(3, 9)), 3, &stray),
            ),
            &mut other_log,
        )
        .unwrap();
        let (mut s, mut b) = send(&node, &other_log).await;
        let f = next_frame(&mut s, &mut b).await.expect("an answer");
        assert_eq!((f.log, f.request_id), (LogId(7), RequestId(73)));
        match f.body {
            Body::ErrorResponse(e) => assert_eq!(e.code, ErrorCode::UnknownLog, "{}", e.message),
            other => panic!("expected UnknownLog, got {other:?}"),
        }
        still_serves(&mut s, &mut b, 74).await;

        // A peer of protocol version 1 (24-byte header, no log id) asking for the tail:
        // told its version is unsupported, at once, and closed.
        let mut v1 = Vec::new();
        v1.extend_from_slice(&24u32.to_le_bytes());
        v1.extend_from_slice(&FrameType::TailRequest.as_u16().to_le_bytes());
        v1.extend_from_slice(&[1, 0]); // version 1, no flags
        v1.extend_from_slice(&75u64.to_le_bytes());
        v1.extend_from_slice(&0u32.to_le_bytes());
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        let (mut s, mut b) = send(&node, &v1).await;
        expect_error(&mut s, &mut b, 0, ErrorCode::UnsupportedVersion).await;
        expect_closed(&mut s, &mut b).await;

        // The well-behaved client still appends and reads back; the data is intact.
        let more: Vec<Bytes> = (0..10).map(|i| Bytes::from(format!("after-{i}"))).collect();
        let ack = good
            .append(append(3, Some(pos(3, 9)), 3, &more))
            .await
            .unwrap();
        assert!(matches!(ack, AppendOutcome::Persisted(p) if p.through_offset == Some(Offset(19))));
        let fresh = StoreClient::connect(node.addr).await.expect("connect");
        let r = fresh.read(Offset(0), 100, 1 << 20).await.unwrap();
        let got: Vec<&[u8]> = r.events.iter().map(|e| &e.payload.head()[..]).collect();
        let want: Vec<&[u8]> = first.iter().chain(more.iter()).map(|p| &p[..]).collect();
        assert_eq!(got, want);

        // Every rejection is counted. The truncated frame is noticed when its connection
        // closes, so poll for it.
        let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
        loop {
            let m = node.http_get("/metrics");
            let count = |reason: &str| {
                metric_value(
                    &m,
                    &format!("quire_rejected_frames_total{{reason=\"{reason}\"}}"),
                )
            };
            let all = [
                ("unknown_frame_type", 1.0),
                ("frame_too_large", 1.0),
                ("frame_too_short", 1.0),
                ("malformed", 1.0),
                ("body_checksum", 1.0),
                ("header_checksum", 6.0),
                ("truncated", 1.0),
                ("unexpected_frame", 1.0),
                ("unknown_log", 1.0),
                ("unsupported_version", 1.0),
            ];
            let missing: Vec<_> = all.iter().filter(|(r, n)| count(r) < *n).collect();
            if missing.is_empty() {
                assert!(metric_value(&m, "quire_connections_open") >= IDLE_CONNECTIONS as f64);
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not counted: {missing:?}\n{m}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // The idle connections are still there and still served.
        let mut one = idle.pop().expect("idle");
        one.write_all(&tail_frame(81)).expect("send");
        drop(idle);
    });
}

#[test]
fn proc_a_peer_that_never_reads_is_dropped_and_others_go_on() {
    let _t = quire_tests::proc_test();
    // Small write queue and socket buffers so the non-reading peer fills them fast; the
    // smallest in-flight byte bound allowed (one maximal frame).
    let dir = TestDir::new();
    init(&dir.data(), false);
    let config = dir.root.path().join("slow.toml");
    std::fs::write(
        &config,
        format!(
            "{SMALL_CONFIG}[limits]\nwrite_queue_frames_max = 64\nin_flight_bytes_per_connection_max = {FRAME_BYTES_MAX}\n[socket]\nsend_buffer_bytes = 65536\nrecv_buffer_bytes = 65536\n"
        ),
    )
    .unwrap();
    let node = NodeProc::start_on(
        &dir.data(),
        &dir.log(),
        &["--config", config.to_str().unwrap()],
    );
    block_on(async {
        // The peer that never reads: a flood of tail requests.
        let mut slow = TcpStream::connect(node.addr).await.expect("connect");
        slow.set_nodelay(true).unwrap();
        let good = StoreClient::connect(node.addr).await.expect("connect");
        let mut flood = Vec::new();
        for i in 1..=2000u64 {
            flood.extend_from_slice(&tail_frame(i));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            // Writing fails once the node has closed the connection.
            let sent =
                tokio::time::timeout(Duration::from_millis(200), slow.write_all(&flood)).await;
            if matches!(sent, Ok(Err(_)))
                || node.metric("quire_connections_dropped_slow_total") >= 1.0
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the non-reading peer was never dropped"
            );
            // Meanwhile the good client is served.
            good.tail().await.expect("tail while a peer stalls");
        }
        let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
        while node.metric("quire_connections_dropped_slow_total") < 1.0 {
            assert!(tokio::time::Instant::now() < deadline, "not counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // Pipelined appends far beyond the in-flight byte bound: the node stops reading
        // that connection for a while, but every append completes.
        let payload = Bytes::from(vec![7u8; 1 << 20]);
        let mut pending = Vec::new();
        let mut prev = None;
        for i in 0..48u64 {
            pending.push(
                good.start_append(append(2, prev, 2, std::slice::from_ref(&payload)))
                    .await
                    .unwrap(),
            );
            prev = Some(pos(2, i));
        }
        for (i, p) in pending.into_iter().enumerate() {
            match p.wait().await.unwrap() {
                AppendOutcome::Persisted(a) => assert_eq!(a.through_offset, Some(Offset(i as u64))),
                AppendOutcome::Rejected(r) => panic!("append {i} rejected: {r:?}"),
            }
        }
        let r = good.read(Offset(40), 100, 64 << 20).await.unwrap();
        assert_eq!(r.events.len(), 8);
        assert!(r.events.iter().all(|e| e.payload == payload[..]));
    });
}
