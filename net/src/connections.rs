//! [`ConnectionLimit`] and [`Acceptor`]: the bound on the connections a server holds open,
//! and the accept loop step that keeps it.
//!
//! ```text
//!            accept()
//!               │
//!   general pool free, and the peer's address
//!   under connections_per_address_max? ── yes ──> serve (any frames)
//!               │ no
//!   peer reserve free? ── yes ──> serve, but the first frame must be a cluster frame
//!               │ no                (Append, Fence, Read, Tail, Heartbeat, TakeOverNow)
//!               │                   within PEER_FIRST_FRAME_TIMEOUT, else refused
//!   refused: ErrorResponse Overloaded (request id 0), then closed
//! ```
//!
//! - **General pool**: `connections_max` connections of any kind (clients, tools, brokers).
//!   With a per-address bound ([`ConnectionLimit::with_per_address_max`], off by default
//!   as Kafka's `max.connections.per.ip` and Redpanda's `kafka_connections_max_per_ip`),
//!   one IP address holds at most that many of them, so a client that reconnects in a
//!   loop (each connection held until its timeout) cannot keep clients at other addresses
//!   out. An address at its bound still reaches the peer reserve, so a broker that shares
//!   a host (or loopback) with a hoarder keeps its links.
//! - **Peer reserve**: [`PEER_CONNECTIONS_RESERVE`] more, taken only when the general pool
//!   is full. The protocol carries no identity, so a connection cannot be told apart at
//!   accept; a reserve connection earns its place with its first frame, which must be one
//!   brokers send to stores and to each other ([`is_peer_frame`]) and must arrive within
//!   [`PEER_FIRST_FRAME_TIMEOUT`]. Idle sockets that fill the general pool therefore
//!   cannot keep a master from reaching its stores and slaves: the master's links send a
//!   heartbeat at least every `heartbeat`. This is a bound against hoarding, not
//!   authentication: a peer that speaks the protocol can still take reserve places (see
//!   docs/operations.md, "Trust").
//! - **Refused**: a connection beyond both is accepted (so the kernel's backlog drains and
//!   the accept loop never spins on it), sent one `ErrorResponse` `Overloaded` with request
//!   id 0 if the socket takes it without waiting, and closed; counted in
//!   `quire_connections_refused_total{reason}` (`connections_max`, `per_address` when the
//!   pool had room but not for that address — also for such a connection placed on the
//!   reserve that then sent no cluster frame — or `peer_reserve` for a reserve connection
//!   that sent no cluster frame in time) and logged at warn at most once
//!   per [`REFUSAL_LOG_INTERVAL`], with the number refused since the last line.
//! - **accept() errors** (EMFILE, ENFILE, ENOBUFS, …): the loop waits
//!   [`ACCEPT_ERROR_BACKOFF`] before the next accept, so a process out of descriptors does
//!   not spin; logged at warn at most once per [`REFUSAL_LOG_INTERVAL`].
//! - **Open-files limit**: [`fit_open_files_limit`] checks `RLIMIT_NOFILE` at start, raises
//!   the soft limit toward the hard one if it is too low for the bound, and otherwise
//!   lowers the effective `connections_max` (with a warning).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use quire_proto::{encode, ErrorCode, ErrorResponse, Frame, FrameType, RequestId};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default `connections_max`: connections of any kind open at once (each costs about
/// 20 KiB of memory and one file descriptor).
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;
/// Largest `connections_max` accepted.
pub const CONNECTIONS_MAX_LIMIT: usize = 1_000_000;
/// Connections beyond `connections_max` kept for cluster peers (brokers reaching stores
/// and each other). A cluster has at most a few dozen brokers, each with one connection
/// to every store and every other broker.
pub const PEER_CONNECTIONS_RESERVE: usize = 64;
/// How long a connection on the peer reserve may take to send its first (cluster) frame.
/// Above any master's heartbeat period, so a live master's link always proves itself.
pub const PEER_FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(5);
/// Wait after a failed `accept()` (out of descriptors, say) before the next one.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// Most one warn line per this long for refused connections, and for accept errors.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// File descriptors a server keeps for itself besides its connections: listeners, the
/// metrics responder's connections, outbound links, data files, the runtime's (epoll,
/// eventfd, io_uring), stdio.
pub const OWN_FDS_RESERVE: usize = 512;

/// `reason` of a connection refused because both the pool and the reserve were full.
pub const REFUSED_CONNECTIONS_MAX: &str = "connections_max";
/// `reason` of a connection refused because the pool had room, but not for its address
/// (it held `connections_per_address_max` places already), and the reserve was full.
pub const REFUSED_PER_ADDRESS: &str = "per_address";
/// `reason` of a reserve connection whose first frame was not a cluster frame, or did not
/// come in time.
pub const REFUSED_PEER_RESERVE: &str = "peer_reserve";
/// `reason` of a connection whose TLS handshake failed or did not finish in
/// [`TLS_HANDSHAKE_TIMEOUT`]: not TLS, no client certificate where one is required, a
/// certificate of another CA.
pub const REFUSED_TLS_HANDSHAKE: &str = "tls_handshake";
/// `reason` of a connection refused after its TLS handshake because the principal its
/// certificate names (the subject's common name) held `connections_per_principal_max`.
pub const REFUSED_PER_PRINCIPAL: &str = "per_principal";
/// Most TLS handshakes a server runs at once; more wait their turn, within the same
/// [`TLS_HANDSHAKE_TIMEOUT`]. A handshake holds rustls's buffers (up to a whole record of
/// 16 KiB, and the ClientHello's) before the peer has proved anything: this bounds that
/// memory to tens of MiB however many connections are opened and left half-way. One host
/// that holds every turn with stalled handshakes delays everyone's by up to the timeout:
/// `connections_per_address_max` is the defense against one host, as for plain connections.
pub const TLS_HANDSHAKES_MAX: usize = 1024;
/// The principal of a TLS peer that showed no certificate, or one without a common name.
pub const ANONYMOUS_PRINCIPAL: &str = "ANONYMOUS";
/// How long an admitted connection's TLS handshake may take (its wait for a turn included).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// `true` for the frames brokers send to stores and to other brokers (the frames that earn
/// a place on the peer reserve). Exhaustive on purpose: a new frame type must be sorted.
#[must_use]
pub fn is_peer_frame(frame_type: FrameType) -> bool {
    match frame_type {
        FrameType::AppendRequest
        | FrameType::FenceRequest
        | FrameType::ReadRequest
        | FrameType::TailRequest
        | FrameType::RepairRequest
        | FrameType::Heartbeat
        | FrameType::TakeOverNowRequest => true,
        FrameType::ErrorResponse
        | FrameType::PersistedAck
        | FrameType::AppendRejected
        | FrameType::FenceGranted
        | FrameType::FenceRefused
        | FrameType::ReadResponse
        | FrameType::TailResponse
        | FrameType::RepairResponse
        | FrameType::HeartbeatAck
        | FrameType::TakeOverNowResponse
        | FrameType::ProduceRequest
        | FrameType::ProduceResponse
        | FrameType::FetchRequest
        | FrameType::FetchResponse
        | FrameType::CommitCursorRequest
        | FrameType::CommitCursorResponse
        | FrameType::CursorRequest
        | FrameType::CursorResponse
        | FrameType::MetadataRequest
        | FrameType::MetadataResponse
        | FrameType::HandoffRequest
        | FrameType::HandoffResponse
        | FrameType::AuthenticateRequest
        | FrameType::AuthenticateResponse
        | FrameType::UserAdminRequest
        | FrameType::AclAdminRequest
        | FrameType::AdminResponse
        | FrameType::DescribeSecurityRequest
        | FrameType::DescribeSecurityResponse
        | FrameType::TopicAdminRequest
        | FrameType::VoterChangeRequest
        // An operator's audit tool, not a peer: it waits for a place in the pool.
        | FrameType::RangeDigestRequest
        | FrameType::RangeDigestResponse => false,
    }
}

/// `true` for the requests only a broker of the cluster may send: fences, appends, reads,
/// repairs and range digests to a store, heartbeats (with a slave's appends) and take-over requests to a broker — the
/// cluster frames ([`is_peer_frame`], which sorts every frame type) but for tails, which
/// operators' tools send too (with range digests: positions and checksums, never events).
/// Reads return the events themselves — every topic's messages and the users' credentials
/// — so they are a broker's alone (a break-it trial read a topic its ACL entries refused,
/// and every SCRAM key, from a store with a client certificate). On a listener that checks
/// client certificates, a peer whose certificate does not name the broker role gets
/// [`authorize`]'s `Unauthorized` for them.
///
/// Range digests too: a digest of a one-offset range is the record's CRC-32C, and the rest
/// of the record is known, so a client could test guesses at an event's contents offline
/// (a re-test recovered a short message, cursor commits and ACL entries that way). Auditing
/// a TLS cluster's stores takes a broker's certificate.
#[must_use]
pub fn is_broker_only_frame(frame_type: FrameType) -> bool {
    (is_peer_frame(frame_type) && frame_type != FrameType::TailRequest)
        || frame_type == FrameType::RangeDigestRequest
}

/// Checks a request against what the peer's certificate allows (see
/// [`is_broker_only_frame`]).
///
/// # Errors
/// The `Unauthorized` error to answer it with, naming the peer and the request.
pub fn authorize(peer: &quire_tls::PeerAuth, frame_type: FrameType) -> Result<(), ErrorResponse> {
    if frame_type == FrameType::HandoffRequest {
        // Moving mastership is an operator's act: on a listener that checks client
        // certificates, it takes one (of any role) until ACLs say more.
        if let quire_tls::PeerAuth::Checked { role: None, .. } = peer {
            return Err(ErrorResponse::new(
                quire_proto::ErrorCode::Unauthorized,
                format!(
                    "HandoffRequest needs a client certificate of the cluster's CA naming a role; {} may not send it",
                    peer.describe()
                ),
            ));
        }
        return Ok(());
    }
    if !is_broker_only_frame(frame_type) || peer.is_broker() {
        return Ok(());
    }
    Err(ErrorResponse::new(
        quire_proto::ErrorCode::Unauthorized,
        format!(
            "{frame_type:?} is for brokers of the cluster; {} may not send it (a certificate whose subject alternative names hold {} may)",
            peer.describe(),
            quire_tls::Role::Broker.uri()
        ),
    ))
}

/// Logs a request refused by [`authorize`] as a warning, at most one line per
/// [`REFUSAL_LOG_INTERVAL`] for the whole process (with how many were held back): a peer
/// that sends refused frames in a loop must not fill the disk with log lines. The refusals
/// are counted by the caller's metrics.
pub fn log_unauthorized(peer: &str, frame_type: FrameType, message: &str) {
    static LOG: Mutex<Option<Throttle>> = Mutex::new(None);
    let held_back = {
        let mut log = LOG.lock().unwrap_or_else(PoisonError::into_inner);
        log.get_or_insert_with(|| Throttle::new(REFUSAL_LOG_INTERVAL))
            .tick(Instant::now())
    };
    if let Some(held_back) = held_back {
        tracing::warn!(%peer, frame = ?frame_type, refused_since_last_line = held_back, "{message}");
    }
}

/// The connection metrics quire-net keeps (a server registers them in its registry).
#[derive(Clone, Debug, Default)]
pub struct AcceptMetrics {
    /// Connections closed at once, by `reason` ([`REFUSED_CONNECTIONS_MAX`],
    /// [`REFUSED_PER_ADDRESS`], [`REFUSED_PEER_RESERVE`], [`REFUSED_TLS_HANDSHAKE`]; each
    /// exported as 0 from registration on).
    pub refused: Family<[(&'static str, &'static str); 1], Counter>,
    /// `accept()` calls that failed (out of descriptors, …).
    pub accept_errors: Counter,
}

impl AcceptMetrics {
    /// Registers both in `r` as `connections_refused` and `accept_errors`.
    pub fn register(&self, r: &mut Registry) {
        for reason in [
            REFUSED_CONNECTIONS_MAX,
            REFUSED_PER_ADDRESS,
            REFUSED_PEER_RESERVE,
            REFUSED_TLS_HANDSHAKE,
            REFUSED_PER_PRINCIPAL,
        ] {
            let _ = self.refused.get_or_create(&[("reason", reason)]);
        }
        r.register(
            "connections_refused",
            "Connections closed at once: connections_max and the peer reserve were full (reason connections_max), the address held connections_per_address_max and the reserve was full (reason per_address), a reserve connection sent no cluster frame in time (reason peer_reserve), a TLS handshake failed (reason tls_handshake), or the principal a client certificate names held connections_per_principal_max (reason per_principal)",
            self.refused.clone(),
        );
        r.register(
            "accept_errors",
            "accept() calls that failed (out of file descriptors, ...); the server waited before accepting again",
            self.accept_errors.clone(),
        );
    }

    /// Connections refused for `reason` so far.
    #[must_use]
    pub fn refused_total(&self, reason: &'static str) -> u64 {
        self.refused.get_or_create(&[("reason", reason)]).get()
    }
}

/// A warn line at most once per interval; counts what it held back.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    held_back: u64,
}

impl Throttle {
    /// A throttle letting one line through per `every`.
    #[must_use]
    pub fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            last: None,
            held_back: 0,
        }
    }

    /// One more event at `now`: `Some(n)` if a line may be logged now, `n` being the events
    /// held back since the last line; `None` to stay quiet.
    pub fn tick(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                self.held_back += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held_back))
            }
        }
    }
}

#[derive(Debug)]
struct Inner {
    general: Arc<Semaphore>,
    /// Turns for TLS handshakes ([`TLS_HANDSHAKES_MAX`]).
    handshakes: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    connections_max: usize,
    reserve_max: usize,
    metrics: AcceptMetrics,
    refusals: Mutex<Throttle>,
    /// The frame a refused connection gets.
    refusal: Bytes,
    /// The frame a connection refused for its address gets.
    refusal_per_address: Bytes,
    /// Most general-pool places one IP address may hold; 0: no bound.
    per_address_max: usize,
    /// General-pool places held, by address (only with a per-address bound).
    per_address: Mutex<HashMap<IpAddr, usize>>,
    /// Most general-pool places one principal (a certificate's common name) may hold; 0:
    /// no bound.
    per_principal_max: usize,
    /// General-pool places held, by principal (only with a per-principal bound).
    per_principal: Mutex<HashMap<String, usize>>,
}

/// The server-wide bound on open connections; cheap to clone (all clones share it).
#[derive(Clone, Debug)]
pub struct ConnectionLimit {
    inner: Arc<Inner>,
}

impl ConnectionLimit {
    /// A bound of `connections_max` connections of any kind plus `reserve` for cluster
    /// peers.
    ///
    /// # Panics
    /// If `connections_max` is 0 or either is above what a semaphore holds (settings are
    /// checked first).
    #[must_use]
    pub fn new(connections_max: usize, reserve: usize, metrics: AcceptMetrics) -> ConnectionLimit {
        assert!(
            (1..=Semaphore::MAX_PERMITS).contains(&connections_max)
                && reserve <= Semaphore::MAX_PERMITS,
            "connection bound {connections_max} + {reserve} is out of range"
        );
        ConnectionLimit {
            inner: Arc::new(Inner {
                general: Arc::new(Semaphore::new(connections_max)),
                handshakes: Arc::new(Semaphore::new(TLS_HANDSHAKES_MAX)),
                reserve: Arc::new(Semaphore::new(reserve)),
                connections_max,
                reserve_max: reserve,
                metrics,
                refusals: Mutex::new(Throttle::new(REFUSAL_LOG_INTERVAL)),
                refusal: refusal_frame(refusal_error()),
                refusal_per_address: refusal_frame(per_address_error()),
                per_address_max: 0,
                per_address: Mutex::new(HashMap::new()),
                per_principal_max: 0,
                per_principal: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Bounds the general-pool places one IP address may hold to `max` (0: no bound, the
    /// default); see the module docs.
    ///
    /// # Panics
    /// If the limit was cloned already (set it before sharing).
    #[must_use]
    pub fn with_per_address_max(mut self, max: usize) -> ConnectionLimit {
        Arc::get_mut(&mut self.inner)
            .expect("invariant: the per-address bound is set before the limit is shared")
            .per_address_max = max;
        self
    }

    /// Bounds the general-pool places one principal (the common name of a verified client
    /// certificate) may hold to `max` (0: no bound, the default), checked once the TLS
    /// handshake has named it ([`ConnectionPermit::take_principal`]).
    ///
    /// # Panics
    /// If the limit was cloned already (set it before sharing).
    #[must_use]
    pub fn with_per_principal_max(mut self, max: usize) -> ConnectionLimit {
        Arc::get_mut(&mut self.inner)
            .expect("invariant: the per-principal bound is set before the limit is shared")
            .per_principal_max = max;
        self
    }

    /// Gives back one of `name`'s general-pool places.
    fn release_principal(&self, name: &str) {
        let mut held = self
            .inner
            .per_principal
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(name) {
            *count -= 1;
            if *count == 0 {
                held.remove(name);
            }
        }
    }

    /// Takes a general-pool place for `ip`, if the pool and `ip`'s share of it allow.
    /// `Err(true)` when only the per-address bound stood in the way.
    fn take_general(&self, ip: IpAddr) -> Result<(OwnedSemaphorePermit, Option<IpAddr>), bool> {
        let i = &self.inner;
        if i.per_address_max == 0 {
            return i
                .general
                .clone()
                .try_acquire_owned()
                .map(|p| (p, None))
                .map_err(|_| false);
        }
        let mut held = i.per_address.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.get(&ip).copied().unwrap_or(0);
        if count >= i.per_address_max {
            return Err(i.general.available_permits() > 0);
        }
        let permit = i.general.clone().try_acquire_owned().map_err(|_| false)?;
        held.insert(ip, count + 1);
        Ok((permit, Some(ip)))
    }

    /// Gives back one of `ip`'s general-pool places.
    fn release_address(&self, ip: IpAddr) {
        let mut held = self
            .inner
            .per_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&ip) {
            *count -= 1;
            if *count == 0 {
                held.remove(&ip);
            }
        }
    }

    /// The general pool's size.
    #[must_use]
    pub fn connections_max(&self) -> usize {
        self.inner.connections_max
    }

    /// Connections open now (pool and reserve).
    #[must_use]
    pub fn open(&self) -> usize {
        let i = &self.inner;
        (i.connections_max - i.general.available_permits())
            + (i.reserve_max - i.reserve.available_permits())
    }

    /// A place for a new connection from `peer`: from the pool (within the address's
    /// share, if bounded), else from the reserve.
    ///
    /// # Errors
    /// The refusal reason ([`REFUSED_CONNECTIONS_MAX`], or [`REFUSED_PER_ADDRESS`] when the
    /// pool had room but not for this address) when neither has a place.
    pub fn admit(&self, peer: SocketAddr) -> Result<ConnectionPermit, &'static str> {
        let i = &self.inner;
        let address_full = match self.take_general(peer.ip()) {
            Ok((p, address)) => {
                return Ok(ConnectionPermit {
                    _permit: p,
                    first_frame_by: None,
                    address,
                    over_address: false,
                    principal: None,
                    peer_is_broker: true,
                    limit: self.clone(),
                })
            }
            Err(address_full) => address_full,
        };
        match i.reserve.clone().try_acquire_owned() {
            Ok(p) => Ok(ConnectionPermit {
                _permit: p,
                first_frame_by: Some(tokio::time::Instant::now() + PEER_FIRST_FRAME_TIMEOUT),
                address: None,
                over_address: address_full,
                principal: None,
                peer_is_broker: true,
                limit: self.clone(),
            }),
            Err(_) if address_full => Err(REFUSED_PER_ADDRESS),
            Err(_) => Err(REFUSED_CONNECTIONS_MAX),
        }
    }

    /// Counts a refusal for `reason` and logs it (throttled).
    fn note_refused(&self, reason: &'static str, peer: SocketAddr) {
        let i = &self.inner;
        if let Some(held_back) = self.count_refusal(reason) {
            tracing::warn!(
                %peer,
                reason,
                open = self.open(),
                connections_max = i.connections_max,
                peer_reserve = i.reserve_max,
                refused_since_last_line = held_back,
                "refusing a connection: the server holds as many as it may"
            );
        }
    }

    /// Counts a refusal for `reason`; `Some(refusals held back since the last line)` when
    /// it may be logged now (one line per [`REFUSAL_LOG_INTERVAL`]).
    fn count_refusal(&self, reason: &'static str) -> Option<u64> {
        let i = &self.inner;
        i.metrics.refused.get_or_create(&[("reason", reason)]).inc();
        i.refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .tick(Instant::now())
    }

    /// Runs the TLS handshake of an admitted connection when the listener has TLS
    /// (`tls`), within [`TLS_HANDSHAKE_TIMEOUT`] (a reserve place: by its first frame's
    /// deadline, [`PEER_FIRST_FRAME_TIMEOUT`]); a plaintext listener passes the
    /// connection through. A failed handshake is counted as [`REFUSED_TLS_HANDSHAKE`] and
    /// logged (throttled, with rustls's reason), and gives `None`: drop the connection.
    pub async fn secure(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        tls: Option<&quire_tls::TlsAcceptor>,
        permit: &ConnectionPermit,
    ) -> Option<quire_tls::Stream> {
        let Some(tls) = tls else {
            return Some(quire_tls::Stream::Plain(tcp));
        };
        // A reserve place's handshake must end by its first frame's deadline.
        let mut deadline = tokio::time::Instant::now() + TLS_HANDSHAKE_TIMEOUT;
        if let Some(by) = permit.first_frame_deadline() {
            deadline = deadline.min(by);
        }
        let turn = tokio::time::timeout_at(deadline, self.inner.handshakes.clone().acquire_owned());
        let handshake = match turn.await {
            Ok(Ok(_turn)) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                tls.accept(tcp, left).await
            }
            Ok(Err(_)) | Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no turn for a TLS handshake in time (TLS_HANDSHAKES_MAX run at once)",
            )),
        };
        match handshake {
            Ok(stream) => Some(stream),
            Err(e) => {
                if let Some(held_back) = self.count_refusal(REFUSED_TLS_HANDSHAKE) {
                    let hint = if e.to_string().contains("InvalidContentType") {
                        "a plaintext client? "
                    } else {
                        ""
                    };
                    tracing::warn!(
                        %peer,
                        error = %format_args!("{hint}{e}"),
                        client_auth = tls.client_auth().as_str(),
                        refused_since_last_line = held_back,
                        "refusing a connection: its TLS handshake failed"
                    );
                }
                None
            }
        }
    }

    /// Refuses an accepted connection: one `Overloaded` error frame if the socket takes it
    /// without waiting, then the caller drops (closes) it.
    fn refuse(&self, stream: &TcpStream, peer: SocketAddr, reason: &'static str) {
        // The send buffer of a fresh socket is empty: the frame fits, or the peer is gone.
        let frame = if reason == REFUSED_PER_ADDRESS {
            &self.inner.refusal_per_address
        } else {
            &self.inner.refusal
        };
        let _ = stream.try_write(frame);
        self.note_refused(reason, peer);
    }
}

/// The error a refused connection gets (request id 0).
#[must_use]
pub fn refusal_error() -> ErrorResponse {
    ErrorResponse::new(
        ErrorCode::Overloaded,
        "too many connections: the server holds connections_max open; retry later",
    )
}

/// The error a reserve connection gets when its first frame is not a cluster frame, or
/// does not come within [`PEER_FIRST_FRAME_TIMEOUT`] (request id 0).
#[must_use]
pub fn peer_reserve_error() -> ErrorResponse {
    ErrorResponse::new(
        ErrorCode::Overloaded,
        "too many connections: the places left are kept for brokers and stores; retry later",
    )
}

/// The error a connection refused for its principal gets (request id 0).
#[must_use]
pub fn per_principal_error(name: &str) -> ErrorResponse {
    ErrorResponse::new(
        ErrorCode::Overloaded,
        format!("too many connections for principal {name:?}: it holds connections_per_principal_max open; close some, or retry later"),
    )
}

/// The error a connection refused for its address gets (request id 0).
#[must_use]
pub fn per_address_error() -> ErrorResponse {
    ErrorResponse::new(
        ErrorCode::Overloaded,
        "too many connections from your address: it holds connections_per_address_max open; close some, or retry later",
    )
}

fn refusal_frame(error: ErrorResponse) -> Bytes {
    let mut out = BytesMut::new();
    encode(&Frame::new(RequestId::CONNECTION, error), &mut out)
        .expect("invariant: a short ErrorResponse encodes");
    out.freeze()
}

/// One connection's place in the bound; dropping it frees the place.
#[derive(Debug)]
pub struct ConnectionPermit {
    _permit: OwnedSemaphorePermit,
    /// For a reserve place whose first frame has not come: when it must have come.
    first_frame_by: Option<tokio::time::Instant>,
    /// The address whose per-address count this place adds to (general pool, bounded).
    address: Option<IpAddr>,
    /// A reserve place taken because the address held its share while the pool had room:
    /// a refusal then says so (`per_address`), not that the places are kept for peers.
    over_address: bool,
    /// The principal whose per-principal count this place adds to.
    principal: Option<String>,
    /// Whether the peer may hold a reserve place: `false` once
    /// [`ConnectionPermit::admit_peer`] found a checked certificate that is no broker's.
    peer_is_broker: bool,
    limit: ConnectionLimit,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        if let Some(ip) = self.address {
            self.limit.release_address(ip);
        }
        if let Some(name) = self.principal.take() {
            self.limit.release_principal(&name);
        }
    }
}

impl ConnectionPermit {
    /// Records what the TLS handshake says of the peer: whether it may hold a reserve
    /// place (a broker, when certificates are checked), and counts the place against its
    /// principal under the per-principal bound ([`ConnectionLimit::with_per_principal_max`]).
    /// The principal is the certificate's common name; a peer that showed no certificate,
    /// or one without a common name, is [`ANONYMOUS_PRINCIPAL`] (one bound for all of
    /// them, as Kafka's `ANONYMOUS`). Always `Ok` without a bound, on a listener that checks
    /// no certificates, and on a reserve place held by a broker.
    ///
    /// # Errors
    /// The error to send (request id 0) before closing, when the principal holds its bound
    /// already; counted as [`REFUSED_PER_PRINCIPAL`] and logged (throttled).
    pub fn admit_peer(
        &mut self,
        peer: &quire_tls::PeerAuth,
        addr: SocketAddr,
    ) -> Result<(), ErrorResponse> {
        self.peer_is_broker = peer.is_broker();
        let max = self.limit.inner.per_principal_max;
        let quire_tls::PeerAuth::Checked { name, .. } = peer else {
            return Ok(());
        };
        let name = name.as_deref().unwrap_or(ANONYMOUS_PRINCIPAL).to_owned();
        let reserve_broker = self.first_frame_by.is_some() && self.peer_is_broker;
        if max == 0 || reserve_broker || self.principal.is_some() {
            return Ok(());
        }
        let mut held = self
            .limit
            .inner
            .per_principal
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = held.get(name.as_str()).copied().unwrap_or(0);
        if count >= max {
            drop(held);
            self.limit.note_refused(REFUSED_PER_PRINCIPAL, addr);
            return Err(per_principal_error(&name));
        }
        held.insert(name.clone(), count + 1);
        self.principal = Some(name);
        Ok(())
    }

    /// `true` while this is a reserve place still waiting for its first frame.
    #[must_use]
    pub fn is_on_probation(&self) -> bool {
        self.first_frame_by.is_some()
    }

    /// While on probation: the instant by which the first frame must have come.
    #[must_use]
    pub fn first_frame_deadline(&self) -> Option<tokio::time::Instant> {
        self.first_frame_by
    }

    /// Resolves when a reserve place's first frame is overdue; never on a pool place or
    /// once the first frame came (the future holds no borrow: race it against a read).
    pub fn first_frame_overdue(&self) -> impl std::future::Future<Output = ()> + 'static {
        let deadline = self.first_frame_by;
        async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        }
    }

    /// Checks a decoded frame against the place. Always `Ok` on a pool place, or once a
    /// reserve place's first frame was a cluster frame.
    ///
    /// # Errors
    /// The error to send (request id 0) before closing, if this is the first frame of a
    /// reserve place and not a cluster frame ([`is_peer_frame`]), or comes from a peer
    /// that [`ConnectionPermit::admit_peer`] found is no broker; counted and logged.
    pub fn check_frame(
        &mut self,
        frame_type: FrameType,
        peer: SocketAddr,
    ) -> Result<(), ErrorResponse> {
        if self.first_frame_by.is_none() {
            return Ok(());
        }
        // With client certificates checked, the reserve is a broker's: a stranger's cluster
        // frame (refused as Unauthorized anyway) or a client's read earns no place there.
        if is_peer_frame(frame_type) && self.peer_is_broker {
            self.first_frame_by = None;
            return Ok(());
        }
        Err(self.refuse_reserve(peer))
    }

    /// The first frame of a reserve place did not come in time: counts and logs it, and
    /// gives the error to send (request id 0) before closing.
    #[must_use]
    pub fn first_frame_timed_out(&self, peer: SocketAddr) -> ErrorResponse {
        self.refuse_reserve(peer)
    }

    /// Counts a reserve place that did not earn it, under the reason it was there for.
    fn refuse_reserve(&self, peer: SocketAddr) -> ErrorResponse {
        if self.over_address {
            self.limit.note_refused(REFUSED_PER_ADDRESS, peer);
            per_address_error()
        } else {
            self.limit.note_refused(REFUSED_PEER_RESERVE, peer);
            peer_reserve_error()
        }
    }
}

/// The accepting side of a listener under a [`ConnectionLimit`].
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    limit: ConnectionLimit,
    errors: Throttle,
}

impl Acceptor {
    /// Accepts on `listener` under `limit`.
    #[must_use]
    pub fn new(listener: TcpListener, limit: ConnectionLimit) -> Acceptor {
        Acceptor {
            listener,
            limit,
            errors: Throttle::new(REFUSAL_LOG_INTERVAL),
        }
    }

    /// The bound.
    #[must_use]
    pub fn limit(&self) -> &ConnectionLimit {
        &self.limit
    }

    /// The next connection admitted under the bound. Connections beyond it are refused on
    /// the way (error frame, close, count, throttled log); a failed `accept()` is counted,
    /// logged (throttled) and followed by an [`ACCEPT_ERROR_BACKOFF`] pause. Cancel safe:
    /// a connection is either returned or already refused.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr, ConnectionPermit) {
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => match self.limit.admit(peer) {
                    Ok(permit) => return (stream, peer, permit),
                    Err(reason) => self.limit.refuse(&stream, peer, reason),
                },
                Err(e) => {
                    self.limit.inner.metrics.accept_errors.inc();
                    if let Some(held_back) = self.errors.tick(Instant::now()) {
                        tracing::warn!(
                            error = %e,
                            failed_since_last_line = held_back,
                            backoff_ms = ACCEPT_ERROR_BACKOFF.as_millis() as u64,
                            "accept failed; pausing before the next accept"
                        );
                    }
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                }
            }
        }
    }
}

/// What [`fit_open_files_limit`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFilesPlan {
    /// Raise the soft `RLIMIT_NOFILE` to this, if `Some`.
    pub raise_soft_to: Option<u64>,
    /// The general pool's size to serve with (at most the one asked for).
    pub connections_max: usize,
}

/// Decides, from the soft and hard `RLIMIT_NOFILE`, how to hold `connections_max` plus
/// `reserve` connections plus [`OWN_FDS_RESERVE`] descriptors: raise the soft limit (up to
/// the hard one) if that is enough or helps, and lower the pool if even the hard limit is
/// too low (never below 1). Pure; [`fit_open_files_limit`] applies it.
#[must_use]
pub fn plan_open_files(
    connections_max: usize,
    reserve: usize,
    soft: u64,
    hard: u64,
) -> OpenFilesPlan {
    let extra = (reserve + OWN_FDS_RESERVE) as u64;
    let needed = connections_max as u64 + extra;
    let raise_soft_to = (soft < needed && hard > soft).then(|| needed.min(hard));
    let usable = raise_soft_to.unwrap_or(soft);
    let fits = usable.saturating_sub(extra).max(1);
    OpenFilesPlan {
        raise_soft_to,
        connections_max: connections_max.min(usize::try_from(fits).unwrap_or(usize::MAX)),
    }
}

/// Checks `RLIMIT_NOFILE` against `connections_max` plus `reserve` plus
/// [`OWN_FDS_RESERVE`], raises the soft limit if needed (up to the hard limit), and returns
/// the pool size the process can hold: `connections_max`, or less with a warning if the
/// hard limit is too low. If the limit cannot be read, returns `connections_max` as given.
#[must_use]
pub fn fit_open_files_limit(connections_max: usize, reserve: usize) -> usize {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid, writable rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot read RLIMIT_NOFILE; connections_max is not checked against it");
        return connections_max;
    }
    let plan = plan_open_files(connections_max, reserve, l.rlim_cur, l.rlim_max);
    let mut soft = l.rlim_cur;
    let mut effective = plan.connections_max;
    if let Some(to) = plan.raise_soft_to {
        let raised = libc::rlimit {
            rlim_cur: to,
            rlim_max: l.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; setrlimit only reads it.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::info!(
                from = soft,
                to,
                "raised the soft RLIMIT_NOFILE for connections_max"
            );
            soft = to;
        } else {
            tracing::warn!(error = %std::io::Error::last_os_error(), soft, "cannot raise the soft RLIMIT_NOFILE");
            effective = plan_open_files(connections_max, reserve, soft, soft).connections_max;
        }
    }
    if effective < connections_max {
        tracing::warn!(
            connections_max,
            serving_at_most = effective,
            rlimit_nofile_soft = soft,
            rlimit_nofile_hard = l.rlim_max,
            peer_reserve = reserve,
            own_fds = OWN_FDS_RESERVE,
            "the open-files limit cannot hold connections_max connections; lowering the bound (raise it with `ulimit -n` or LimitNOFILE=)"
        );
    }
    effective
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_lets_one_line_through_per_interval_and_counts_the_rest() {
        let mut t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.tick(t0), Some(0));
        assert_eq!(t.tick(t0 + Duration::from_secs(1)), None);
        assert_eq!(t.tick(t0 + Duration::from_secs(9)), None);
        assert_eq!(t.tick(t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(t.tick(t0 + Duration::from_secs(11)), None);
    }

    #[test]
    fn open_files_plan_raises_the_soft_limit_or_lowers_the_bound() {
        let extra = (64 + OWN_FDS_RESERVE) as u64;
        // Enough already.
        let p = plan_open_files(10_000, 64, 1 << 20, 1 << 20);
        assert_eq!(
            p,
            OpenFilesPlan {
                raise_soft_to: None,
                connections_max: 10_000
            }
        );
        // The usual 1024 soft limit under a high hard one: raise to just what is needed.
        let p = plan_open_files(10_000, 64, 1024, 1 << 20);
        assert_eq!(p.raise_soft_to, Some(10_000 + extra));
        assert_eq!(p.connections_max, 10_000);
        // Even the hard limit is too low: raise to it, and serve what fits.
        let p = plan_open_files(10_000, 64, 1024, 4096);
        assert_eq!(p.raise_soft_to, Some(4096));
        assert_eq!(p.connections_max, 4096 - extra as usize);
        // Soft = hard and too low: nothing to raise; never below one connection.
        let p = plan_open_files(10_000, 64, 100, 100);
        assert_eq!(
            p,
            OpenFilesPlan {
                raise_soft_to: None,
                connections_max: 1
            }
        );
    }

    #[test]
    fn every_frame_type_is_sorted_and_only_cluster_requests_are_peer_frames() {
        let peers: Vec<_> = FrameType::ALL
            .iter()
            .copied()
            .filter(|f| is_peer_frame(*f))
            .collect();
        assert!(peers.iter().all(|f| !f.is_response()));
        assert!(peers.contains(&FrameType::AppendRequest));
        assert!(peers.contains(&FrameType::Heartbeat));
        assert!(!is_peer_frame(FrameType::ProduceRequest));
        assert!(!is_peer_frame(FrameType::MetadataRequest));
    }

    #[test]
    fn refusal_frame_decodes_to_overloaded_with_request_id_zero() {
        let mut buf = BytesMut::from(&refusal_frame(refusal_error())[..]);
        let f = quire_proto::decode(&mut buf)
            .expect("decodes")
            .expect("whole");
        assert_eq!(f.request_id, RequestId::CONNECTION);
        let quire_proto::Body::ErrorResponse(e) = f.body else {
            panic!("not an error: {:?}", f.body)
        };
        assert_eq!(e.code, ErrorCode::Overloaded);
        assert!(buf.is_empty());
    }

    fn checked(name: Option<&str>, role: Option<quire_tls::Role>) -> quire_tls::PeerAuth {
        quire_tls::PeerAuth::Checked {
            name: name.map(str::to_owned),
            role,
        }
    }

    #[tokio::test]
    async fn with_certificates_checked_the_reserve_is_a_brokers() {
        use quire_tls::Role;
        let metrics = AcceptMetrics::default();
        let limit = ConnectionLimit::new(1, 2, metrics.clone());
        let peer: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let _pool = limit.admit(peer).expect("pool");
        // A client's certificate: its cluster frame earns no reserve place.
        let mut r = limit.admit(peer).expect("reserve");
        r.admit_peer(&checked(Some("tool"), Some(Role::Client)), peer)
            .expect("no principal bound");
        assert!(r.check_frame(FrameType::TailRequest, peer).is_err());
        assert_eq!(metrics.refused_total(REFUSED_PEER_RESERVE), 1);
        drop(r);
        // No certificate: the same.
        let mut r = limit.admit(peer).expect("reserve");
        r.admit_peer(&checked(None, None), peer).expect("no bound");
        assert!(r.check_frame(FrameType::Heartbeat, peer).is_err());
        drop(r);
        // A broker's certificate: the place is its.
        let mut r = limit.admit(peer).expect("reserve");
        r.admit_peer(&checked(Some("broker-1"), Some(Role::Broker)), peer)
            .expect("no bound");
        assert!(r.check_frame(FrameType::Heartbeat, peer).is_ok());
        // Without checked certificates, as before: any cluster frame.
        let mut r = limit.admit(peer).expect("reserve");
        r.admit_peer(&quire_tls::PeerAuth::Unchecked, peer)
            .expect("no bound");
        assert!(r.check_frame(FrameType::TailRequest, peer).is_ok());
    }

    #[tokio::test]
    async fn peers_without_a_named_certificate_share_the_anonymous_principals_bound() {
        let metrics = AcceptMetrics::default();
        let limit = ConnectionLimit::new(10, 0, metrics.clone()).with_per_principal_max(2);
        let peer: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let mut held = Vec::new();
        for auth in [
            checked(None, None),
            checked(None, Some(quire_tls::Role::Client)),
        ] {
            let mut p = limit.admit(peer).expect("pool");
            p.admit_peer(&auth, peer).expect("within the bound");
            held.push(p);
        }
        let mut third = limit.admit(peer).expect("pool");
        let e = third
            .admit_peer(&checked(None, None), peer)
            .expect_err("past the anonymous bound");
        assert!(e.message.contains(ANONYMOUS_PRINCIPAL), "{}", e.message);
        assert_eq!(metrics.refused_total(REFUSED_PER_PRINCIPAL), 1);
        // A named principal has its own bound.
        let mut named = limit.admit(peer).expect("pool");
        named
            .admit_peer(&checked(Some("tool"), None), peer)
            .expect("another principal");
        // A place given back is the anonymous principal's again.
        held.pop();
        let mut again = limit.admit(peer).expect("pool");
        again
            .admit_peer(&checked(None, None), peer)
            .expect("a place came back");
    }

    #[tokio::test]
    async fn pool_then_reserve_then_refused_and_places_come_back() {
        let metrics = AcceptMetrics::default();
        let limit = ConnectionLimit::new(2, 1, metrics.clone());
        let peer: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let a = limit.admit(peer).expect("pool");
        let b = limit.admit(peer).expect("pool");
        assert!(!a.is_on_probation() && !b.is_on_probation());
        let mut r = limit.admit(peer).expect("reserve");
        assert!(r.is_on_probation());
        assert!(r.first_frame_deadline().is_some());
        assert_eq!(
            limit.admit(peer).err(),
            Some(REFUSED_CONNECTIONS_MAX),
            "pool and reserve full"
        );
        assert_eq!(limit.open(), 3);
        // A cluster frame ends the probation; later frames of any type pass.
        assert!(r.check_frame(FrameType::Heartbeat, peer).is_ok());
        assert!(!r.is_on_probation());
        assert!(r.check_frame(FrameType::ProduceRequest, peer).is_ok());
        drop(r);
        // A client frame first on a reserve place is refused and counted.
        let mut r = limit.admit(peer).expect("reserve again");
        let e = r
            .check_frame(FrameType::ProduceRequest, peer)
            .expect_err("not a peer");
        assert_eq!(e.code, ErrorCode::Overloaded);
        assert_eq!(metrics.refused_total(REFUSED_PEER_RESERVE), 1);
        let _ = r.first_frame_timed_out(peer);
        assert_eq!(metrics.refused_total(REFUSED_PEER_RESERVE), 2);
        drop(r);
        drop(a);
        let c = limit.admit(peer).expect("a pool place came back");
        assert!(!c.is_on_probation());
        drop((b, c));
        assert_eq!(limit.open(), 0);
    }

    /// One address holds at most its share of the pool; others still get places; the
    /// address at its bound still reaches the reserve; places come back when dropped.
    #[tokio::test]
    async fn one_address_holds_at_most_its_share_of_the_pool() {
        let limit = ConnectionLimit::new(4, 1, AcceptMetrics::default()).with_per_address_max(2);
        let hoarder: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let other: SocketAddr = "127.0.0.2:1".parse().expect("addr");
        let h1 = limit.admit(hoarder).expect("pool");
        let h2 = limit.admit(SocketAddr::new(hoarder.ip(), 2)).expect("pool");
        assert!(!h1.is_on_probation() && !h2.is_on_probation());
        // The hoarder's third goes to the reserve (on probation), its fourth is refused
        // for its address while the pool still has room.
        let mut h3 = limit.admit(hoarder).expect("reserve");
        assert!(h3.is_on_probation());
        // A client frame there is refused as over its address's share, not as a
        // non-peer on the peer reserve.
        let e = h3
            .check_frame(FrameType::ProduceRequest, hoarder)
            .expect_err("not a peer");
        assert_eq!(e.message, per_address_error().message);
        assert_eq!(limit.inner.metrics.refused_total(REFUSED_PER_ADDRESS), 1);
        assert_eq!(limit.inner.metrics.refused_total(REFUSED_PEER_RESERVE), 0);
        assert_eq!(limit.admit(hoarder).err(), Some(REFUSED_PER_ADDRESS));
        // Another address gets the pool's places.
        let o1 = limit.admit(other).expect("pool for another address");
        let o2 = limit.admit(other).expect("pool for another address");
        assert!(!o1.is_on_probation() && !o2.is_on_probation());
        assert_eq!(limit.admit(other).err(), Some(REFUSED_CONNECTIONS_MAX));
        // A hoarder's place comes back to it when one of its connections ends.
        drop(h1);
        let h4 = limit.admit(hoarder).expect("its place came back");
        assert!(!h4.is_on_probation());
        drop((h2, h3, h4, o1, o2));
        assert_eq!(limit.open(), 0);
        assert!(limit.inner.per_address.lock().expect("lock").is_empty());
    }

    #[tokio::test]
    async fn acceptor_refuses_beyond_the_bound_with_an_error_frame() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("addr");
        let metrics = AcceptMetrics::default();
        let mut acceptor = Acceptor::new(listener, ConnectionLimit::new(1, 0, metrics.clone()));
        let _first = TcpStream::connect(addr).await.expect("connects");
        let mut second = TcpStream::connect(addr).await.expect("connects");
        let mut third = TcpStream::connect(addr).await.expect("connects");
        // Holds the first connection's place, then refuses the others on its way to a
        // connection that never comes.
        let accepting = tokio::spawn(async move {
            let held = acceptor.accept().await;
            let _never = acceptor.accept().await;
            drop(held);
        });
        for s in [&mut second, &mut third] {
            let mut got = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
                .await
                .expect("closed in time")
                .expect("reads");
            let mut buf = BytesMut::from(&got[..]);
            let f = quire_proto::decode(&mut buf)
                .expect("decodes")
                .expect("a whole frame");
            assert_eq!(f.request_id, RequestId::CONNECTION);
            assert!(
                matches!(f.body, quire_proto::Body::ErrorResponse(ref e) if e.code == ErrorCode::Overloaded)
            );
        }
        assert_eq!(metrics.refused_total(REFUSED_CONNECTIONS_MAX), 2);
        accepting.abort();
    }
}
