//! Large frame buffers are reused (quire_net::FramePool): a frame of 300 KiB is read into
//! the buffer an earlier frame of that size gave back once nothing held a slice of it, never
//! into one a kept slice still uses. A test binary of its own: the pool is process-wide.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quire_net::{BudgetMetrics, FramePool, FrameReader, ReadBudget, ReadSettings};
use quire_proto::{encode, Body, Frame, ProduceRequest, RequestId, FRAME_BYTES_MAX};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

const LEN: usize = 300 * 1024;

async fn produce(c: &mut TcpStream, id: u64) {
    let mut buf = BytesMut::new();
    let body = ProduceRequest {
        format: quire_proto::MessageFormat::Raw,
        topic: "t".into(),
        producer_id: 1,
        sequence: id,
        messages: vec![Bytes::from(vec![id as u8; LEN])],
    };
    encode(&Frame::new(RequestId(id), Body::from(body)), &mut buf).unwrap();
    c.write_all(&buf).await.unwrap();
}

async fn message(r: &mut FrameReader) -> Bytes {
    let got = tokio::time::timeout(Duration::from_secs(10), r.next())
        .await
        .expect("bounded")
        .unwrap();
    let Body::ProduceRequest(mut p) = got.frame.body else {
        panic!("expected a produce")
    };
    p.messages.pop().unwrap()
}

#[tokio::test]
async fn a_large_frame_reuses_a_buffer_only_once_no_slice_holds_it() {
    let budget = ReadBudget::new(FRAME_BYTES_MAX, BudgetMetrics::default());
    let settings = ReadSettings {
        read_buffer_bytes_max: FRAME_BYTES_MAX,
        partial_frame_timeout_ms: 5_000,
        idle_timeout_ms: 0,
    };
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (server, _) = l.accept().await.unwrap();
    let (r, _w) = quire_tls::Stream::Plain(server).into_split();
    let mut r = FrameReader::new(r, budget, &settings);

    produce(&mut c, 1).await;
    let a = message(&mut r).await;
    let a_at = a.as_ptr() as usize;
    assert_eq!(FramePool::global().bytes(), 0);
    // A is kept: B gets a buffer of its own, and A's bytes stay A's.
    produce(&mut c, 2).await;
    let b = message(&mut r).await;
    let b_at = b.as_ptr() as usize;
    assert!(b_at.abs_diff(a_at) >= LEN, "B was read over A's kept bytes");
    assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
    // A dropped: its buffer waits in the pool, and C is read into it.
    drop(a);
    assert!(FramePool::global().bytes() >= LEN);
    produce(&mut c, 3).await;
    let m = message(&mut r).await;
    assert_eq!(m.as_ptr() as usize, a_at, "C reuses A's buffer");
    assert_eq!(FramePool::global().bytes(), 0);
    assert!(m.iter().all(|&x| x == 3) && b.iter().all(|&x| x == 2));
}
