//! quire-kafka: a Kafka wire-protocol listener for a Quire broker, so that Kafka clients
//! (librdkafka and everything built on it, kcat, the Java client) produce to and consume
//! from Quire unchanged.
//!
//! ```text
//!  Kafka client ──TCP──> conn: 4-byte size, request header, body ──> api: one handler per API
//!                          (kafka-protocol decodes and encodes)         │
//!                                                                       ▼
//!                                                Backend::call(quire_proto::Body) ── the broker's
//!                                                produce / fetch / metadata path, as a native
//!                                                client's request (bounds, ACLs, quorum)
//! ```
//!
//! Mapping (docs/kafka.md has the whole table): every Quire topic is a Kafka topic with one
//! partition, 0, whose leader is the Quire master; a Kafka offset is the Quire log offset
//! of the record (topics share the log, so a topic's offsets have gaps, which Kafka clients
//! skip as they do after compaction). Each record of a produced batch is stored as one
//! Quire message of format [`quire_proto::MessageFormat::Kafka`] (its timestamp, key,
//! headers and value: [`quire_proto::KafkaRecord`]); a compressed batch is decompressed
//! first, so every record gets its own offset. A produce is answered once its records are
//! stabilized (on a quorum of stores) for `acks=1` and `acks=-1` alike, and not at all for
//! `acks=0`. A fetch returns stabilized records only, so `read_committed` and
//! `read_uncommitted` read the same.
//!
//! The codec is the `kafka-protocol` crate (generated from Kafka's message schemas), used
//! through a copy patched to bound what a request's counts and compressed batches can make
//! it allocate (third_party/kafka-protocol/QUIRE-PATCH.md).
//!
//! Bounds: [`KafkaSettings::request_bytes_max`] per request (a larger size prefix closes
//! the connection, as Kafka's `socket.request.max.bytes`), [`KafkaSettings::read_budget_bytes`]
//! of requests buffered across connections, [`KafkaSettings::connections_max`]
//! connections, requests read ahead at most 16 per connection and answered in their order
//! (Kafka's own rule), an idle timeout and a whole-request timeout.
//!
//! Consumer groups: the master is every group's coordinator ([`group`] holds membership
//! in memory; committed offsets are cursors in the replicated log).

mod admin;
mod api;
mod batch;
mod conn;
mod coordinator;
pub mod group;
mod sasl;
pub mod unsupported;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use quire_proto::Body;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use api::{supported_versions, KafkaRequest, SUPPORTED_APIS};
pub use batch::stored_records;
pub use conn::{decode_request, Decoded};

/// The answer to a request handed to the broker, still to come.
pub type Pending = std::pin::Pin<Box<dyn Future<Output = Body> + Send>>;

/// What the listener needs from a broker: one client request served as the broker serves
/// a native client's (the same bounds, ACL check, quorum and answers).
pub trait Backend: Clone + Send + Sync + 'static {
    /// Hands `body` (a client request: produce, fetch, metadata) to the broker and resolves
    /// once the broker has taken it — requests handed over one after another are served in
    /// that order (a produce's messages get offsets in it) — to the answer still to come:
    /// the response body, or an `ErrorResponse` body (`NotMaster`, `Timeout`, `Trimmed`,
    /// `Unauthorized`, `ShuttingDown`, …).
    fn submit(&self, body: Body) -> impl Future<Output = Pending> + Send;

    /// The same broker, its requests made on behalf of `peer`: the client a TLS handshake
    /// established (a verified certificate's holder is its principal for the broker's
    /// ACLs; anyone else is `ANONYMOUS`).
    #[must_use]
    fn for_peer(&self, peer: &quire_tls::PeerAuth) -> Self;

    /// The same broker, its requests made on behalf of `user`, who logged in with SASL
    /// SCRAM-SHA-256 ([`crate::sasl`]).
    #[must_use]
    fn for_user(&self, user: String) -> Self;

    /// The SCRAM-SHA-256 credential of `user` among the cluster's users (`quire user
    /// add`), if there is one.
    fn scram_credential(&self, user: &str) -> Option<quire_proto::ScramCredential>;

    /// How long logins from `ip` stay refused after too many failures, if they are.
    fn login_blocked(&self, ip: std::net::IpAddr) -> Option<Duration>;

    /// Counts a failed login from `ip`.
    fn login_failed(&self, ip: std::net::IpAddr);

    /// Whether the principal the requests are made for may be a member of consumer group
    /// `group` (join, sync, heartbeat, leave, describe, commit and read its offsets): the
    /// broker's ACL entries for groups, Kafka's `READ` on the group; always, on a broker
    /// that does not check ACLs.
    fn group_allowed(&self, group: &str) -> bool;

    /// [`Backend::submit`], then its answer.
    fn call(&self, body: Body) -> impl Future<Output = Body> + Send {
        async move { self.submit(body).await.await }
    }
}

/// Default of [`KafkaSettings::request_bytes_max`]: 16 MiB (Quire's frame bound; Kafka's
/// `socket.request.max.bytes` defaults to 100 MiB).
pub const REQUEST_BYTES_MAX_DEFAULT: usize = 16 << 20;
/// Default of [`KafkaSettings::read_budget_bytes`]: 64 MiB.
pub const READ_BUDGET_BYTES_DEFAULT: usize = 64 << 20;
/// Default of [`KafkaSettings::connections_max`].
pub const CONNECTIONS_MAX_DEFAULT: usize = 4096;
/// Default of [`KafkaSettings::idle_timeout`]: 10 minutes (Kafka's
/// `connections.max.idle.ms`).
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(600);
/// Default of [`KafkaSettings::request_timeout`]: 30 s.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// How long a Kafka client's TLS handshake may take.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How the listener runs.
#[derive(Clone, Debug)]
pub struct KafkaSettings {
    /// This broker's Quire broker id: the Kafka node id it is known by, and how it knows
    /// it is the master (the group coordinator).
    pub node_id: u16,
    /// Every broker's advertised Kafka address, `(Quire broker id, host:port)`, as Kafka
    /// clients are told in metadata answers (a broker missing here is not named to them).
    pub brokers: Vec<(u16, String)>,
    /// The cluster id told to clients (Metadata, DescribeCluster).
    pub cluster_id: String,
    /// Largest request accepted, in bytes (its size prefix; a larger one closes the
    /// connection).
    pub request_bytes_max: usize,
    /// Bytes of requests being read or served, across all connections; readers wait
    /// beyond it.
    pub read_budget_bytes: usize,
    /// Connections served at once; more are closed as they arrive.
    pub connections_max: usize,
    /// Connections from one IP address at once, at most (0: no bound); more from that
    /// address are closed as they arrive, so that one host cannot take every place (the
    /// broker's `connections_per_address_max`, as on its native listener).
    pub connections_per_address_max: usize,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// A request must arrive whole this long after its size prefix.
    pub request_timeout: Duration,
    /// TLS for the listener (the broker's `[tls]` certificate and client-certificate
    /// setting, as its native listener); `None`: plaintext.
    pub tls: Option<quire_tls::TlsAcceptor>,
}

impl KafkaSettings {
    /// Settings with every bound at its default.
    #[must_use]
    pub fn new(node_id: u16, brokers: Vec<(u16, String)>, cluster_id: String) -> KafkaSettings {
        KafkaSettings {
            node_id,
            brokers,
            cluster_id,
            request_bytes_max: REQUEST_BYTES_MAX_DEFAULT,
            read_budget_bytes: READ_BUDGET_BYTES_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_address_max: 0,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            tls: None,
        }
    }
}

/// Accepts Kafka clients on `listener` and serves each on its own task, until the task
/// running this is dropped or aborted.
pub async fn serve<B: Backend>(listener: TcpListener, backend: B, settings: KafkaSettings) {
    let shared = Arc::new(Listener {
        settings,
        groups: std::sync::Mutex::default(),
    });
    let _clock = AbortOnDrop(tokio::spawn(coordinator::run_clock(shared.clone())));
    let settings = &shared.settings;
    let budget = Arc::new(Semaphore::new(settings.read_budget_bytes));
    let per_address: Arc<std::sync::Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    let connections = Arc::new(Semaphore::new(settings.connections_max));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and the like: pause instead of spinning.
                tracing::warn!(error = %e, "Kafka listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max = settings.connections_max, "Kafka listener: too many connections, closing a new one");
            continue;
        };
        let Some(from_address) = PerAddress::take(
            &per_address,
            peer.ip(),
            settings.connections_per_address_max,
        ) else {
            tracing::warn!(%peer, max = settings.connections_per_address_max, "Kafka listener: too many connections from one address, closing a new one");
            continue;
        };
        let backend = backend.clone();
        let shared = shared.clone();
        let budget = budget.clone();
        tokio::spawn(async move {
            let tls = shared.settings.tls.as_ref();
            let stream = match tls {
                None => quire_tls::Stream::Plain(stream),
                Some(acceptor) => match acceptor.accept(stream, TLS_HANDSHAKE_TIMEOUT).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "Kafka listener: TLS handshake failed");
                        return;
                    }
                },
            };
            let auth =
                quire_tls::PeerAuth::of(&stream, tls.map(quire_tls::TlsAcceptor::client_auth));
            let backend = backend.for_peer(&auth);
            conn::serve(stream, peer, backend, &shared, &budget).await;
            drop(from_address);
            drop(permit);
        });
    }
}

/// What every connection of one listener shares: its settings and the group coordinator.
#[derive(Debug)]
pub(crate) struct Listener {
    pub settings: KafkaSettings,
    groups: std::sync::Mutex<group::Groups>,
}

impl Listener {
    /// The groups, locked (never held across an await).
    pub(crate) fn groups(&self) -> std::sync::MutexGuard<'_, group::Groups> {
        // A panic while holding the lock leaves the groups as they were between two
        // steps of the state machine: carry on with them.
        self.groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Who sent a request: its `client.id` (request header) and address.
#[derive(Clone, Debug, Default)]
pub(crate) struct Client {
    pub id: String,
    pub host: String,
}

/// One connection's place among its address's ([`KafkaSettings::connections_per_address_max`]),
/// given back when dropped.
struct PerAddress {
    counts: Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PerAddress {
    /// A place for a connection from `ip`, or `None` if it holds `max` already (0: no bound).
    fn take(
        counts: &Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>,
        ip: IpAddr,
        max: usize,
    ) -> Option<PerAddress> {
        let mut c = counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = c.entry(ip).or_default();
        if max > 0 && *n >= max {
            return None;
        }
        *n += 1;
        Some(PerAddress {
            counts: counts.clone(),
            ip,
        })
    }
}

impl Drop for PerAddress {
    fn drop(&mut self) {
        let mut c = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = c.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(&self.ip);
            }
        }
    }
}

/// Aborts a task when dropped (the coordinator's clock ends with the listener).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Host and port of `addr` ("host:port", IPv6 hosts in brackets) as Kafka metadata carries
/// them; `None` if it is not host:port.
#[must_use]
pub fn split_host_port(addr: &str) -> Option<(String, i32)> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Some((a.ip().to_string(), i32::from(a.port())));
    }
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| (host.to_owned(), i32::from(port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_holds_at_most_its_share_of_places() {
        let counts = Arc::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let held: Vec<PerAddress> = (0..3)
            .map(|_| PerAddress::take(&counts, a, 3).unwrap())
            .collect();
        assert!(PerAddress::take(&counts, a, 3).is_none());
        let other = PerAddress::take(&counts, b, 3);
        assert!(other.is_some(), "another address has its own places");
        drop(held);
        assert!(
            PerAddress::take(&counts, a, 3).is_some(),
            "given back when dropped"
        );
        assert!(PerAddress::take(&counts, a, 0).is_some(), "0: no bound");
    }

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(
            split_host_port("127.0.0.1:9092"),
            Some(("127.0.0.1".into(), 9092))
        );
        assert_eq!(split_host_port("[::1]:9092"), Some(("::1".into(), 9092)));
        assert_eq!(
            split_host_port("kafka-1.example:19092"),
            Some(("kafka-1.example".into(), 19092))
        );
        assert_eq!(split_host_port("nohost"), None);
        assert_eq!(split_host_port(":9092"), None);
        assert_eq!(split_host_port("h:99999"), None);
    }
}
