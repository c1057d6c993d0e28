//! [`Connection`]: one TCP connection carrying many requests at once.
//!
//! Every request gets a fresh [`RequestId`] (a counter from 1; 0 is reserved for
//! connection-level errors). A request is sent by queueing its frame — header and body
//! chunks — to the connection's **writer task**, which gathers queued frames into vectored
//! writes; its response is delivered by the **reader task**, which decodes frames and
//! resolves the waiting request's one-shot channel by id. Requests queued one after the
//! other (each `send_*` awaited before the next) reach the peer in that order.
//!
//! Bounds: at most [`ConnConfig::in_flight_requests_max`] requests wait for a response
//! (more wait for a slot), at most [`WRITE_QUEUE_FRAMES_MAX`] frames wait for the writer,
//! and every wait — connect, a slot, the queue, the response — ends at the configured
//! timeout. When the connection fails, every waiting request gets the same
//! [`ClientError`]; dropping the [`Connection`] closes it.
//!
//! What this module does not do: reconnect, retry, or interpret bodies (that is
//! [`crate::store`]'s and the later producer/consumer clients' job).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use quire_proto::{
    decode, encode, frame_bytes_announced, Body, EncodedBody, ErrorResponse, Flags, Frame,
    FrameType, LogId, RequestId, WireError,
};
use quire_tls::{ReadHalf, Stream, WriteHalf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{timeout_at, Instant};

use crate::error::ClientError;

/// Frames queued for the writer task, at most.
pub const WRITE_QUEUE_FRAMES_MAX: usize = 1024;

/// Most buffers handed to one vectored write (Linux's `IOV_MAX`).
pub const IOV_MAX: usize = 1024;

/// Bytes the reader asks the socket for at a time (the buffer grows to a whole frame,
/// bounded by `FRAME_BYTES_MAX`, when one needs it).
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Bounds of one connection. Times are durations; see the module docs.
#[derive(Clone, Debug)]
pub struct ConnConfig {
    /// How long a TCP connect may take. Default 5 s.
    pub connect_timeout: Duration,
    /// How long a request may wait, from the call to its response (queueing included).
    /// Default 10 s.
    pub request_timeout: Duration,
    /// Most requests waiting for a response at once. Default 4096.
    pub in_flight_requests_max: usize,
    /// TLS for the connection: `None` (the default) is plaintext. The handshake counts
    /// against `connect_timeout`.
    pub tls: Option<quire_tls::TlsConnector>,
    /// A user to authenticate as with SCRAM-SHA-256 once connected (`None`, the default:
    /// none; the connection acts as its certificate's holder, or `ANONYMOUS`). The
    /// exchange counts against `connect_timeout`.
    pub sasl: Option<ScramLogin>,
}

/// A user name and password for SCRAM-SHA-256. The password stays in this process: only a
/// proof derived from it is sent.
#[derive(Clone)]
pub struct ScramLogin {
    /// The user.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl fmt::Debug for ScramLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramLogin")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl Default for ConnConfig {
    fn default() -> Self {
        ConnConfig {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            in_flight_requests_max: 4096,
            tls: None,
            sasl: None,
        }
    }
}

type Waiter = oneshot::Sender<Result<Frame, ClientError>>;

#[derive(Debug)]
struct Shared {
    addr: String,
    next_id: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    waiting: HashMap<RequestId, Waiter>,
    closed: Option<ClientError>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the connection closed with `error` (the first error wins) and fails every
    /// waiting request with it.
    fn close(&self, error: ClientError) {
        let waiting = {
            let mut st = self.lock();
            if st.closed.is_none() {
                tracing::debug!(peer = %self.addr, %error, "connection closed");
                st.closed = Some(error);
            }
            std::mem::take(&mut st.waiting)
        };
        let error = self.lock().closed.clone();
        if let Some(error) = error {
            for (_, w) in waiting {
                let _ = w.send(Err(error.clone()));
            }
        }
    }

    fn closed(&self, reason: &str) -> ClientError {
        ClientError::Closed {
            addr: self.addr.clone(),
            reason: reason.to_owned(),
        }
    }

    fn resolve(&self, id: RequestId, result: Result<Frame, ClientError>) {
        let waiter = self.lock().waiting.remove(&id);
        match waiter {
            Some(w) => {
                let _ = w.send(result);
            }
            None => {
                tracing::debug!(peer = %self.addr, request_id = id.0, "response for no waiting request")
            }
        }
    }
}

/// One multiplexed connection. See the module docs.
#[derive(Debug)]
pub struct Connection {
    shared: Arc<Shared>,
    out: mpsc::Sender<Vec<Bytes>>,
    slots: Arc<Semaphore>,
    config: ConnConfig,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
        self.shared
            .close(self.shared.closed("the client was dropped"));
    }
}

impl Connection {
    /// Connects to `addr` (with `TCP_NODELAY`) and starts the reader and writer tasks.
    ///
    /// # Errors
    /// [`ClientError::Connect`] or [`ClientError::ConnectTimeout`].
    pub async fn connect<A>(addr: A, config: ConnConfig) -> Result<Connection, ClientError>
    where
        A: ToSocketAddrs + fmt::Display,
    {
        let name = addr.to_string();
        let connect = async {
            let tcp = TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            match &config.tls {
                None => Ok(Stream::Plain(tcp)),
                Some(tls) => tls.connect(&name, tcp).await.map_err(|e| {
                    // What rustls says of a server that answers the hello in plaintext.
                    let text = e.to_string();
                    let hint = if text.contains("corrupt message") {
                        " (a plaintext server? it says so in its log at start)"
                    } else if text.contains("UnknownIssuer") || text.contains("BadSignature") {
                        " (the server's certificate is not of the CA given: --tls-ca, QUIRE_TLS_CA)"
                    } else {
                        ""
                    };
                    // A certificate or protocol mismatch: waiting will not fix it
                    // (ClientError::is_tls_refusal).
                    let refused = e.kind() == io::ErrorKind::PermissionDenied
                        || text.contains("corrupt message")
                        || text.contains("invalid peer certificate");
                    let kind = if refused {
                        io::ErrorKind::PermissionDenied
                    } else {
                        e.kind()
                    };
                    io::Error::new(kind, format!("TLS handshake: {e}{hint}"))
                }),
            }
        };
        let deadline = Instant::now() + config.connect_timeout;
        let stream = match timeout_at(deadline, connect).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(ClientError::Connect {
                    addr: name,
                    source: Arc::new(e),
                })
            }
            Err(_) => {
                return Err(ClientError::ConnectTimeout {
                    addr: name,
                    timeout_ms: millis(config.connect_timeout),
                })
            }
        };
        let login = config.sasl.clone();
        let timeout_ms = millis(config.connect_timeout);
        let conn = Connection::from_stream(stream, name.clone(), config);
        if let Some(login) = login {
            match timeout_at(deadline, conn.authenticate(&login)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(ClientError::ConnectTimeout {
                        addr: name,
                        timeout_ms,
                    })
                }
            }
        }
        Ok(conn)
    }

    /// Runs a SCRAM-SHA-256 exchange as `login` on this connection (RFC 5802; see
    /// `quire_tls::scram`): the broker then treats the connection as that user.
    ///
    /// # Errors
    /// [`ClientError::Connect`] of kind `PermissionDenied` (so
    /// [`ClientError::is_tls_refusal`] holds: retrying will not help) when the broker
    /// refuses the user or password, or cannot prove it holds the user's credential; the
    /// connection's own errors otherwise.
    pub async fn authenticate(&self, login: &ScramLogin) -> Result<(), ClientError> {
        use quire_tls::scram::{ScramClient, MECHANISM};
        let refused = |why: String| ClientError::Connect {
            addr: self.shared.addr.clone(),
            source: Arc::new(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "SASL {MECHANISM} authentication as user {:?} failed: {why}",
                    login.user
                ),
            )),
        };
        let step = |message: String| async move {
            let frame = self
                .send(Body::AuthenticateRequest(
                    quire_proto::AuthenticateRequest {
                        mechanism: MECHANISM.to_owned(),
                        message: message.into(),
                    },
                ))
                .await?
                .wait()
                .await?;
            match frame.body {
                Body::AuthenticateResponse(r) => String::from_utf8(r.message.to_vec())
                    .map_err(|_| refused("the broker's SCRAM message is not UTF-8".to_owned())),
                Body::ErrorResponse(e) => Err(refused(e.message)),
                other => Err(refused(format!(
                    "the broker answered {:?} (a broker before users and ACLs?)",
                    other.frame_type()
                ))),
            }
        };
        let (client, first) =
            ScramClient::start(&login.user, &login.password).map_err(|e| refused(e.to_string()))?;
        let server_first = step(first).await?;
        let (client, last) = client
            .server_first(&server_first)
            .map_err(|e| refused(e.to_string()))?;
        let server_final = step(last).await?;
        client
            .server_final(&server_final)
            .map_err(|e| refused(e.to_string()))
    }

    /// Wraps a connected stream, plaintext or TLS (`addr` names the peer in errors).
    #[must_use]
    pub fn from_stream(stream: Stream, addr: String, config: ConnConfig) -> Connection {
        let shared = Arc::new(Shared {
            addr,
            next_id: AtomicU64::new(1),
            state: Mutex::new(State::default()),
        });
        let (read_half, write_half) = stream.into_split();
        let (out, out_rx) = mpsc::channel(WRITE_QUEUE_FRAMES_MAX);
        let reader = tokio::spawn(read_loop(read_half, shared.clone()));
        let writer = tokio::spawn(write_loop(write_half, out_rx, shared.clone()));
        let slots = Arc::new(Semaphore::new(config.in_flight_requests_max.max(1)));
        Connection {
            shared,
            out,
            slots,
            config,
            reader,
            writer,
        }
    }

    /// The peer's address, as given to [`Connection::connect`].
    #[must_use]
    pub fn peer(&self) -> &str {
        &self.shared.addr
    }

    /// The bounds in force.
    #[must_use]
    pub fn config(&self) -> &ConnConfig {
        &self.config
    }

    /// The error that closed the connection, if it is closed.
    #[must_use]
    pub fn close_reason(&self) -> Option<ClientError> {
        self.shared.lock().closed.clone()
    }

    /// Queues `body` as a request (encoded into one buffer) and returns the handle to
    /// await its response. Returns once the frame is queued for the writer: requests
    /// queued in turn are sent in that order.
    ///
    /// # Errors
    /// [`ClientError::Wire`] if `body` cannot be encoded; [`ClientError::Closed`] (or the
    /// error that closed the connection); [`ClientError::Timeout`] if no slot or queue
    /// space freed up within the request timeout.
    pub async fn send(&self, body: Body) -> Result<PendingReply, ClientError> {
        self.send_on(LogId::ZERO, body).await
    }

    /// As [`Connection::send`], for a request about `log` (the frame header's log id).
    ///
    /// # Errors
    /// As [`Connection::send`].
    pub async fn send_on(&self, log: LogId, body: Body) -> Result<PendingReply, ClientError> {
        let request_type = body.frame_type();
        let mut frame = Frame::on_log(log, RequestId::CONNECTION, body);
        self.send_parts(request_type, move |id| {
            frame.request_id = id;
            let mut buf = BytesMut::new();
            encode(&frame, &mut buf)?;
            Ok(vec![buf.freeze()])
        })
        .await
    }

    /// Queues an already encoded body (the fan-out path: one [`EncodedBody`] sent to many
    /// peers) behind its own header; the writer sends header and chunks with a vectored
    /// write, copying nothing.
    ///
    /// # Errors
    /// As [`Connection::send`], without the encoding errors.
    pub async fn send_encoded(&self, body: &EncodedBody) -> Result<PendingReply, ClientError> {
        self.send_encoded_on(LogId::ZERO, body).await
    }

    /// As [`Connection::send_encoded`], for a request about `log`.
    ///
    /// # Errors
    /// As [`Connection::send_encoded`].
    pub async fn send_encoded_on(
        &self,
        log: LogId,
        body: &EncodedBody,
    ) -> Result<PendingReply, ClientError> {
        let body = body.clone();
        self.send_parts(body.frame_type(), move |id| {
            let mut parts = Vec::with_capacity(1 + body.chunks().len());
            parts.push(Bytes::copy_from_slice(&body.header(log, id, Flags::NONE)));
            parts.extend(body.chunks().iter().cloned());
            Ok(parts)
        })
        .await
    }

    async fn send_parts(
        &self,
        request_type: FrameType,
        parts: impl FnOnce(RequestId) -> Result<Vec<Bytes>, ClientError>,
    ) -> Result<PendingReply, ClientError> {
        let deadline = Instant::now() + self.config.request_timeout;
        let timeout_ms = millis(self.config.request_timeout);
        let permit = match timeout_at(deadline, self.slots.clone().acquire_owned()).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return Err(self.shared.closed("the client was dropped")),
            Err(_) => {
                return Err(ClientError::Timeout {
                    addr: self.shared.addr.clone(),
                    request_id: 0,
                    timeout_ms,
                })
            }
        };
        let id = self.next_id();
        let parts = parts(id)?;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.shared.lock();
            if let Some(e) = &st.closed {
                return Err(e.clone());
            }
            st.waiting.insert(id, tx);
        }
        let pending = PendingReply {
            shared: self.shared.clone(),
            id,
            rx: Some(rx),
            deadline,
            timeout_ms,
            request_type,
            _slot: permit,
        };
        match timeout_at(deadline, self.out.send(parts)).await {
            Ok(Ok(())) => Ok(pending),
            Ok(Err(_)) => Err(self
                .close_reason()
                .unwrap_or_else(|| self.shared.closed("the writer stopped"))),
            Err(_) => Err(ClientError::Timeout {
                addr: self.shared.addr.clone(),
                request_id: id.0,
                timeout_ms,
            }),
        }
    }

    fn next_id(&self) -> RequestId {
        loop {
            let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
            if id != RequestId::CONNECTION.0 {
                return RequestId(id);
            }
        }
    }
}

/// A request on its way: await [`PendingReply::wait`] for the response. Dropping it
/// forgets the request (a late response is then discarded).
#[derive(Debug)]
pub struct PendingReply {
    shared: Arc<Shared>,
    id: RequestId,
    rx: Option<oneshot::Receiver<Result<Frame, ClientError>>>,
    deadline: Instant,
    timeout_ms: u64,
    request_type: FrameType,
    _slot: OwnedSemaphorePermit,
}

impl Drop for PendingReply {
    fn drop(&mut self) {
        self.shared.lock().waiting.remove(&self.id);
    }
}

impl PendingReply {
    /// The request's id.
    #[must_use]
    pub fn request_id(&self) -> RequestId {
        self.id
    }

    /// The request's frame type.
    #[must_use]
    pub fn request_type(&self) -> FrameType {
        self.request_type
    }

    /// Waits for the response frame (any body, `ErrorResponse` included), at most until
    /// the request's deadline.
    ///
    /// # Errors
    /// [`ClientError::Timeout`], or the error that closed the connection.
    pub async fn wait(mut self) -> Result<Frame, ClientError> {
        let Some(rx) = self.rx.take() else {
            return Err(self.shared.closed("response already taken"));
        };
        match timeout_at(self.deadline, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(self
                .shared
                .lock()
                .closed
                .clone()
                .unwrap_or_else(|| self.shared.closed("the reader stopped"))),
            Err(_) => Err(ClientError::Timeout {
                addr: self.shared.addr.clone(),
                request_id: self.id.0,
                timeout_ms: self.timeout_ms,
            }),
        }
    }
}

async fn read_loop(mut r: ReadHalf, shared: Arc<Shared>) {
    let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    loop {
        loop {
            match decode(&mut buf) {
                Ok(Some(frame)) => dispatch(&shared, frame),
                Ok(None) => break,
                Err(e @ WireError::BadFrame { request_id, .. }) => {
                    tracing::warn!(peer = %shared.addr, error = %e, "undecodable response");
                    shared.resolve(request_id, Err(ClientError::Wire(e)));
                }
                Err(e) => {
                    shared.close(ClientError::Wire(e));
                    return;
                }
            }
        }
        // The decoder reserves nothing; the client trusts the server it chose to connect to
        // with the room a frame announces (bounded by FRAME_BYTES_MAX), so a large response
        // is read without copying its growing buffer again and again. Servers do not extend
        // this trust to their peers (quire-net's FrameReader).
        if let Ok(Some(frame_bytes)) = frame_bytes_announced(&buf) {
            buf.reserve(frame_bytes.saturating_sub(buf.len()));
        }
        if buf.capacity() - buf.len() < READ_CHUNK_BYTES / 4 {
            buf.reserve(READ_CHUNK_BYTES);
        }
        match r.read_buf(&mut buf).await {
            Ok(0) => {
                if is_tls_alert(&buf) {
                    shared.close(ClientError::Io {
                        addr: shared.addr.clone(),
                        op: "read",
                        source: Arc::new(io::Error::new(
                            io::ErrorKind::PermissionDenied,
                            "the peer answered with a TLS alert: it serves TLS (give the CA its certificate chains to: --tls-ca or QUIRE_TLS_CA)",
                        )),
                    });
                    return;
                }
                let reason = if buf.is_empty() {
                    "the peer closed the connection"
                } else {
                    "the peer closed the connection in the middle of a frame"
                };
                shared.close(shared.closed(reason));
                return;
            }
            Ok(_) => {}
            Err(e) => {
                // TLS 1.3 tells a client its certificate was refused only after the
                // handshake, as an alert on its first read.
                let e = match e.to_string() {
                    t if t.contains("CertificateRequired") => io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("{t} (the server requires a client certificate: --tls-cert and --tls-key, or QUIRE_TLS_CERT and QUIRE_TLS_KEY)"),
                    ),
                    t if t.contains("UnknownCA") || t.contains("BadCertificate") => io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("{t} (the server does not accept this client certificate: not of its CA)"),
                    ),
                    _ => e,
                };
                shared.close(ClientError::Io {
                    addr: shared.addr.clone(),
                    op: "read",
                    source: Arc::new(e),
                });
                return;
            }
        }
    }
}

/// Whether `bytes` begin as a TLS alert record (content type 21, version 3.x: RFC 8446
/// §5.1), which is what a TLS server sends a plaintext client before it closes.
fn is_tls_alert(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && bytes[0] == 21 && bytes[1] == 3
}

fn dispatch(shared: &Shared, frame: Frame) {
    if !frame.frame_type().is_response() {
        shared.close(shared.closed(&format!(
            "the peer sent a request ({:?}) on a client connection",
            frame.frame_type()
        )));
        return;
    }
    if frame.request_id == RequestId::CONNECTION {
        let error = match frame.body {
            Body::ErrorResponse(e) => ClientError::Remote(Box::new(e)),
            other => ClientError::Remote(Box::new(ErrorResponse::new(
                quire_proto::ErrorCode::UnexpectedFrame,
                format!("{:?} with request id 0", other.frame_type()),
            ))),
        };
        shared.close(error);
        return;
    }
    shared.resolve(frame.request_id, Ok(frame));
}

async fn write_loop(mut w: WriteHalf, mut rx: mpsc::Receiver<Vec<Bytes>>, shared: Arc<Shared>) {
    let mut queue: VecDeque<Bytes> = VecDeque::new();
    while let Some(parts) = rx.recv().await {
        queue.extend(parts);
        while queue.len() < IOV_MAX {
            match rx.try_recv() {
                Ok(parts) => queue.extend(parts),
                Err(_) => break,
            }
        }
        if let Err(e) = write_all_vectored(&mut w, &mut queue).await {
            shared.close(ClientError::Io {
                addr: shared.addr.clone(),
                op: "write",
                source: Arc::new(e),
            });
            return;
        }
    }
    let _ = w.shutdown().await;
}

/// Writes every buffer of `queue` (emptying it) with vectored writes of at most
/// [`IOV_MAX`] buffers each.
///
/// # Errors
/// The socket's error; `WriteZero` if the socket accepts nothing.
pub async fn write_all_vectored<W>(w: &mut W, queue: &mut VecDeque<Bytes>) -> io::Result<()>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    while !queue.is_empty() {
        let written = {
            let slices: Vec<IoSlice<'_>> = queue
                .iter()
                .take(IOV_MAX)
                .map(|b| IoSlice::new(b))
                .collect();
            w.write_vectored(&slices).await?
        };
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the socket accepted no bytes",
            ));
        }
        let mut left = written;
        while left > 0 {
            let front = queue
                .front_mut()
                .expect("invariant: written bytes came from queued buffers");
            if front.len() <= left {
                left -= front.len();
                queue.pop_front();
            } else {
                front.advance(left);
                left = 0;
            }
        }
    }
    // A TLS writer may keep the last bytes in its buffer until flushed (a no-op on TCP).
    w.flush().await
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
