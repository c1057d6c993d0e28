//! A TLS listener fed garbage: random bytes, a real ClientHello cut at every length, the
//! hello with bytes flipped, and a whole handshake followed by garbage frames. Each bad
//! handshake fails (within the handshake timeout, counted as `tls_handshake`) without a
//! panic; the frame reader behind a good handshake refuses bad frames with the same typed
//! errors as on plaintext; and a good client is served after all of it.
//!
//! Memory: each handshake holds at most `HANDSHAKE_BYTES_MAX` (96 KiB) of the peer's bytes,
//! and an established connection's reader at most `READ_BUFFER_BYTES` (four records); no
//! input here can make either grow.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::time::Duration;

use bytes::BytesMut;
use quire_net::{
    AcceptMetrics, BudgetMetrics, ConnectionLimit, FrameReader, ReadBudget, ReadError,
    ReadSettings, REFUSED_TLS_HANDSHAKE,
};
use quire_proto::{encode, Frame, RequestId, TailRequest, FRAME_BYTES_MAX};
use quire_tls::certs::{files_for, write_local};
use quire_tls::{Role, TlsAcceptor, TlsFiles};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Every wait of these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(20);

struct Server {
    addr: String,
    limit: ConnectionLimit,
    metrics: AcceptMetrics,
    tls: TlsAcceptor,
    listener: TcpListener,
}

async fn server(dir: &std::path::Path) -> (Server, TlsFiles) {
    write_local(dir, &[("store", Role::Store), ("broker", Role::Broker)]).unwrap();
    let tls = files_for(dir, "store")
        .acceptor(quire_tls::ClientAuth::Required)
        .unwrap()
        .unwrap();
    let metrics = AcceptMetrics::default();
    let limit = ConnectionLimit::new(64, 0, metrics.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (
        Server {
            addr,
            limit,
            metrics,
            tls,
            listener,
        },
        files_for(dir, "broker"),
    )
}

impl Server {
    /// Accepts one connection and runs its handshake: whether it succeeded.
    async fn handshake_once(&self) -> Option<quire_tls::Stream> {
        let (tcp, peer) = self.listener.accept().await.unwrap();
        let permit = self.limit.admit(peer).unwrap();
        self.limit.secure(tcp, peer, Some(&self.tls), &permit).await
    }
}

/// The first bytes a TLS client sends (its ClientHello), as captured by a plain listener.
async fn client_hello(client: &TlsFiles) -> Vec<u8> {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let connector = client.connector().unwrap().unwrap();
    let dial = tokio::spawn(async move {
        let tcp = TcpStream::connect(&addr).await.unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(2), connector.connect(&addr, tcp)).await;
    });
    let (mut s, _) = l.accept().await.unwrap();
    let mut hello = vec![0u8; 4096];
    let n = tokio::time::timeout(WAIT, s.read(&mut hello))
        .await
        .unwrap()
        .unwrap();
    hello.truncate(n);
    drop(s);
    let _ = dial.await;
    hello
}

/// Sends `bytes` and closes the write side; the server's handshake must fail.
async fn refused(server: &Server, bytes: Vec<u8>) {
    let addr = server.addr.clone();
    let send = tokio::spawn(async move {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let _ = s.write_all(&bytes).await;
        let _ = s.shutdown().await;
        // Read until the server closes, so the close is the server's.
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut sink)).await;
    });
    let done = tokio::time::timeout(WAIT, server.handshake_once())
        .await
        .expect("the handshake ends in time");
    assert!(done.is_none(), "a bad handshake was accepted");
    send.await.unwrap();
}

#[tokio::test]
async fn garbage_and_cut_handshakes_are_refused_and_a_good_client_is_served_after() {
    let dir = tempfile::tempdir().unwrap();
    let (server, broker) = server(dir.path()).await;
    let hello = client_hello(&broker).await;
    assert!(hello.len() > 100, "a ClientHello of {} bytes", hello.len());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(16);
    let mut cases = 0u64;

    // Random bytes, some starting like a TLS handshake record.
    for i in 0..40 {
        let len = rng.random_range(0..3000);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if i % 2 == 0 && bytes.len() >= 3 {
            bytes[..3].copy_from_slice(&[22, 3, 1]);
        }
        refused(&server, bytes).await;
        cases += 1;
    }
    // The hello cut short at every 7th length, and with one byte flipped.
    for cut in (0..hello.len()).step_by(7) {
        refused(&server, hello[..cut].to_vec()).await;
        cases += 1;
    }
    for _ in 0..40 {
        let mut bad = hello.clone();
        let at = rng.random_range(0..bad.len());
        bad[at] ^= 1 << rng.random_range(0..8);
        // A flip the server cannot see before the client's Finished still fails: this
        // client never answers the server's hello.
        refused(&server, bad).await;
        cases += 1;
    }
    assert_eq!(server.metrics.refused_total(REFUSED_TLS_HANDSHAKE), cases);

    // A whole handshake, then garbage frames: the reader's typed errors, as on plaintext.
    let connector = broker.connector().unwrap().unwrap();
    let addr = server.addr.clone();
    let client = tokio::spawn(async move {
        let tcp = TcpStream::connect(&addr).await.unwrap();
        let stream = connector.connect(&addr, tcp).await.unwrap();
        let (_r, mut w) = stream.into_split();
        let mut good = BytesMut::new();
        encode(&Frame::new(RequestId(7), TailRequest {}), &mut good).unwrap();
        w.write_all(&good).await.unwrap();
        w.write_all(&[0xAB; 64]).await.unwrap();
        w.flush().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    });
    let stream = tokio::time::timeout(WAIT, server.handshake_once())
        .await
        .unwrap()
        .expect("a good client's handshake");
    let (r, _w) = stream.into_split();
    let budget = ReadBudget::new(FRAME_BYTES_MAX, BudgetMetrics::default());
    let settings = ReadSettings {
        read_buffer_bytes_max: FRAME_BYTES_MAX,
        partial_frame_timeout_ms: 10_000,
        idle_timeout_ms: 60_000,
    };
    let mut reader = FrameReader::new(r, budget.clone(), &settings);
    let first = tokio::time::timeout(WAIT, reader.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.frame.request_id, RequestId(7));
    let second = tokio::time::timeout(WAIT, reader.next()).await.unwrap();
    assert!(
        matches!(second, Err(ReadError::Wire(_))),
        "garbage after a good frame: {second:?}"
    );
    drop(reader);
    assert_eq!(
        budget.available_bytes(),
        FRAME_BYTES_MAX,
        "budget given back"
    );
    client.await.unwrap();
}
