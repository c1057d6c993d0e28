//! The connection layer against a hand-driven peer on loopback: responses matched by
//! request id whatever their order, bounded waits, a peer that closes, and the vectored
//! fan-out path putting the same bytes on the wire as the contiguous one. (The typed
//! client against the real store is tested in quire-node's `proc_*` tests.)

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quire_client::{AppendOutcome, ClientError, ConnConfig, StoreClient};
use quire_proto::{
    decode, encode, encode_body, AppendRequest, Body, Epoch, Event, EventKind, Frame, Incarnation,
    Offset, PersistedAck, RequestId, StoreId, TailResponse, HEADER_BYTES,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BOUND: Duration = Duration::from_secs(10);

async fn listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

/// Reads `n` frames from `s`, returning them with the raw bytes of each.
async fn read_frames(s: &mut TcpStream, n: usize) -> Vec<(Frame, Vec<u8>)> {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    while out.len() < n {
        let before = buf.clone();
        match decode(&mut buf).unwrap() {
            Some(f) => {
                let used = before.len() - buf.len();
                out.push((f, before[..used].to_vec()));
            }
            None => {
                let got = tokio::time::timeout(BOUND, s.read_buf(&mut buf))
                    .await
                    .unwrap()
                    .unwrap();
                assert!(got > 0, "client closed early");
            }
        }
    }
    out
}

async fn write_frame(s: &mut TcpStream, frame: Frame) {
    let mut b = BytesMut::new();
    encode(&frame, &mut b).unwrap();
    s.write_all(&b).await.unwrap();
}

fn tail(promised: u64) -> TailResponse {
    TailResponse {
        last: None,
        promised: Epoch(promised),
        hwm: None,
        store_id: StoreId(1),
        incarnation: Incarnation(1),
        voter: true,
        first_offset: Offset(0),
    }
}

#[tokio::test]
async fn responses_are_matched_by_request_id_in_any_order() {
    let (l, addr) = listener().await;
    let peer = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let frames = read_frames(&mut s, 3).await;
        // Answer in reverse order, each with its own request id in `promised`.
        for (f, _) in frames.into_iter().rev() {
            write_frame(&mut s, Frame::new(f.request_id, tail(f.request_id.0))).await;
        }
        s
    });
    let c = StoreClient::connect(addr.as_str()).await.unwrap();
    let (a, b, d) = tokio::join!(c.tail(), c.tail(), c.tail());
    let mut got: Vec<u64> = [a, b, d]
        .into_iter()
        .map(|t| t.unwrap().promised.0)
        .collect();
    got.sort_unstable();
    assert_eq!(got, vec![1, 2, 3], "each call got the answer to its own id");
    drop(peer.await.unwrap());
}

#[tokio::test]
async fn every_wait_is_bounded_and_a_closed_peer_fails_everything() {
    let (l, addr) = listener().await;
    let peer = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        // Read one request and never answer it, then read one more and close.
        let _ = read_frames(&mut s, 1).await;
        let _ = read_frames(&mut s, 1).await;
        drop(s);
    });
    let config = ConnConfig {
        request_timeout: Duration::from_millis(200),
        ..ConnConfig::default()
    };
    let c = StoreClient::connect_with(addr.as_str(), config)
        .await
        .unwrap();
    match c.tail().await {
        Err(ClientError::Timeout { timeout_ms, .. }) => assert_eq!(timeout_ms, 200),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let err = c.tail().await.unwrap_err();
    assert!(err.is_connection_lost(), "{err:?}");
    peer.await.unwrap();
    // Once closed, calls fail at once with the same reason.
    let err = tokio::time::timeout(BOUND, c.tail())
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.is_connection_lost(), "{err:?}");
}

#[tokio::test]
async fn connect_errors_name_the_address() {
    // A port nobody listens on: bind, note the address, close.
    let (l, addr) = listener().await;
    drop(l);
    match StoreClient::connect(addr.as_str()).await {
        Err(ClientError::Connect { addr: a, .. }) => assert_eq!(a, addr),
        other => panic!("expected a connect error, got {other:?}"),
    }
}

#[tokio::test]
async fn the_vectored_fan_out_path_sends_the_same_bytes() {
    let big = Bytes::from(vec![0xAB; 10_000]); // a shared chunk, not copied
    let append = AppendRequest {
        epoch: Epoch(9),
        prev: None,
        events: vec![
            Event {
                epoch: Epoch(9),
                offset: Offset(0),
                kind: EventKind::Message,
                payload: Bytes::from_static(b"small").into(),
            },
            Event {
                epoch: Epoch(9),
                offset: Offset(1),
                kind: EventKind::Message,
                payload: big.into(),
            },
        ],
        hwm: Some(Offset(0)),
    };
    let (l, addr) = listener().await;
    let peer = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let frames = read_frames(&mut s, 2).await;
        for (f, _) in &frames {
            let ack = PersistedAck {
                epoch: Epoch(9),
                through_offset: Some(Offset(1)),
                store_id: StoreId(5),
                incarnation: Incarnation(6),
                voter: true,
                corrupt: None,
            };
            write_frame(&mut s, Frame::new(f.request_id, ack)).await;
        }
        frames
    });
    let c = StoreClient::connect(addr.as_str()).await.unwrap();
    let mut scratch = BytesMut::new();
    let body = encode_body(&Body::AppendRequest(append.clone()), &mut scratch).unwrap();
    assert!(body.chunks().len() > 1, "the big payload is its own chunk");
    let first = c.start_append_encoded(&body).await.unwrap();
    let second = c.start_append(append.clone()).await.unwrap();
    let (id1, id2) = (first.request_id(), second.request_id());
    for p in [first, second] {
        assert!(
            matches!(p.wait().await.unwrap(), AppendOutcome::Persisted(a) if a.store_id == StoreId(5))
        );
    }
    let frames = peer.await.unwrap();
    // Both arrived in the order they were started, with the same body.
    assert_eq!(frames[0].0.request_id, id1);
    assert_eq!(frames[1].0.request_id, id2);
    assert_eq!(frames[0].0.body, Body::AppendRequest(append.clone()));
    assert_eq!(frames[0].1[HEADER_BYTES..], frames[1].1[HEADER_BYTES..]);
    let mut expected = BytesMut::new();
    encode(&Frame::new(id1, append), &mut expected).unwrap();
    assert_eq!(frames[0].1, expected.to_vec());
    assert_ne!(id1, RequestId::CONNECTION);
}

#[tokio::test]
async fn an_encoded_body_of_another_type_is_refused() {
    let (l, addr) = listener().await;
    let _peer = tokio::spawn(async move { l.accept().await.map(|(s, _)| s) });
    let c = StoreClient::connect(addr.as_str()).await.unwrap();
    let mut scratch = BytesMut::new();
    let body = encode_body(&Body::TailRequest(quire_proto::TailRequest), &mut scratch).unwrap();
    assert!(matches!(
        c.start_append_encoded(&body).await,
        Err(ClientError::InvalidRequest(_))
    ));
}
