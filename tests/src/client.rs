//! A minimal synchronous client of one broker speaking quire-proto frames directly (no
//! retries, no discovery: a test sees every answer), and the payloads tests send.
//!
//! Over TLS when [`set_client_tls`] gave it a configuration (a TLS cluster,
//! [`crate::Cluster::new_tls`], does): every client this process connects after that uses
//! it, until it is set back to `None` (a plaintext [`crate::Cluster::new`] does).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quire_proto::{
    decode, encode, Body, ErrorCode, ErrorResponse, FetchRequest, Frame, MetadataRequest,
    MetadataResponse, Offset, ProduceRequest, ProduceResponse, RequestId,
};

use crate::WAIT;

static CLIENT_TLS: Mutex<Option<Arc<rustls::ClientConfig>>> = Mutex::new(None);

/// The TLS configuration of the clients connected from now on; `None`: plaintext.
pub fn set_client_tls(config: Option<Arc<rustls::ClientConfig>>) {
    *CLIENT_TLS.lock().unwrap_or_else(PoisonError::into_inner) = config;
}

/// A connection, plaintext or TLS (rustls driven synchronously).
#[derive(Debug)]
enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// A minimal synchronous client of one broker speaking quire-proto frames.
#[derive(Debug)]
pub struct Client {
    stream: Conn,
    buf: BytesMut,
    next_id: u64,
    /// Answers read while waiting for another request's.
    stash: HashMap<u64, Body>,
}

impl Client {
    pub fn connect(addr: &str) -> std::io::Result<Client> {
        Client::connect_with(addr, WAIT)
    }

    /// Connects with `read_timeout` for every answer (short for probes: a stopped broker
    /// accepts connections but never answers).
    pub fn connect_with(addr: &str, read_timeout: Duration) -> std::io::Result<Client> {
        let stream = TcpStream::connect_timeout(
            &addr
                .parse()
                .map_err(|_| std::io::Error::other("bad address"))?,
            Duration::from_secs(2),
        )?;
        stream.set_read_timeout(Some(read_timeout))?;
        stream.set_nodelay(true)?;
        let tls = CLIENT_TLS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let stream = match tls {
            None => Conn::Plain(stream),
            Some(config) => {
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_owned();
                let name =
                    rustls::pki_types::ServerName::try_from(host).map_err(std::io::Error::other)?;
                let conn =
                    rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
                Conn::Tls(Box::new(rustls::StreamOwned::new(conn, stream)))
            }
        };
        Ok(Client {
            stream,
            buf: BytesMut::with_capacity(1 << 16),
            next_id: 1,
            stash: HashMap::new(),
        })
    }

    /// Sends a request; returns its id.
    pub fn send(&mut self, body: impl Into<Body>) -> std::io::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let mut out = BytesMut::new();
        encode(&Frame::new(RequestId(id), body), &mut out).map_err(std::io::Error::other)?;
        self.stream.write_all(&out)?;
        self.stream.flush()?;
        Ok(id)
    }

    /// Waits for the answer to request `id`.
    pub fn recv(&mut self, id: u64) -> std::io::Result<Body> {
        if let Some(b) = self.stash.remove(&id) {
            return Ok(b);
        }
        loop {
            match decode(&mut self.buf) {
                Ok(Some(frame)) => {
                    if frame.request_id.0 == id {
                        return Ok(frame.body);
                    }
                    self.stash.insert(frame.request_id.0, frame.body);
                    continue;
                }
                Ok(None) => {}
                Err(e) => return Err(std::io::Error::other(e)),
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "closed",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Whether an answer to `id` arrived unasked (while waiting for another).
    pub fn stashed(&self, id: u64) -> bool {
        self.stash.contains_key(&id)
    }

    pub fn request(&mut self, body: impl Into<Body>) -> std::io::Result<Body> {
        let id = self.send(body)?;
        self.recv(id)
    }

    pub fn metadata(&mut self) -> std::io::Result<MetadataResponse> {
        match self.request(MetadataRequest::default())? {
            Body::MetadataResponse(m) => Ok(m),
            other => Err(std::io::Error::other(format!(
                "metadata answered {other:?}"
            ))),
        }
    }

    /// Whether this broker serves clients (a zero-wait fetch is answered, or refused only
    /// because retention trimmed offset 0).
    pub fn is_serving(&mut self) -> bool {
        match self.request(FetchRequest {
            records: false,
            topic: "__probe".into(),
            from_offset: Offset(0),
            max_messages: 1,
            max_bytes: 1,
            wait_ms: 0,
        }) {
            Ok(Body::FetchResponse(_)) => true,
            // Retention trimmed offset 0: the broker serves, the range is gone.
            Ok(Body::ErrorResponse(e)) => e.code == ErrorCode::Trimmed,
            _ => false,
        }
    }
}

/// What a produce came back with.
pub type ProduceResult = Result<ProduceResponse, ErrorResponse>;

/// Decodes a produce answer.
pub fn produce_answer(body: Body) -> ProduceResult {
    match body {
        Body::ProduceResponse(r) => Ok(r),
        Body::ErrorResponse(e) => Err(e),
        other => Err(ErrorResponse::new(
            ErrorCode::UnexpectedFrame,
            format!("{other:?}"),
        )),
    }
}

/// The payload of message `i` of producer `p`.
pub fn payload(p: u64, i: u64) -> Bytes {
    Bytes::from(format!("p{p}-m{i:08}"))
}

/// A produce request of `count` messages of producer `p` from sequence `seq`.
pub fn produce_request(topic: &str, p: u64, seq: u64, count: u64) -> ProduceRequest {
    ProduceRequest {
        format: quire_proto::MessageFormat::Raw,
        topic: topic.into(),
        producer_id: p,
        sequence: seq,
        messages: (seq..seq + count).map(|i| payload(p, i)).collect(),
    }
}

/// Reads every message of `topic` from `from` until `want` messages were read or nothing
/// new comes within the wait; returns `(offset, payload)` pairs in order.
pub fn fetch_all(c: &mut Client, topic: &str, want: usize) -> Vec<(Offset, Bytes)> {
    let mut out = Vec::new();
    let mut next = Offset(0);
    let deadline = Instant::now() + WAIT;
    while out.len() < want && Instant::now() < deadline {
        match c.request(FetchRequest {
            records: false,
            topic: topic.into(),
            from_offset: next,
            max_messages: 1000,
            max_bytes: 1 << 20,
            wait_ms: 500,
        }) {
            Ok(Body::FetchResponse(r)) => {
                assert!(r.next_offset >= next, "next_offset never goes back");
                next = r.next_offset;
                out.extend(r.messages);
            }
            Ok(other) => panic!("fetch answered {other:?}"),
            Err(e) => panic!("fetch failed: {e}"),
        }
    }
    out
}
