//! The broker server: the network and disk layer around the pure cores.
//!
//! ```text
//!  clients, masters ──TCP──> conn (reader) ──Request──> actor ──> conn (writer) ──> answers
//!                                                         │  ▲
//!                    SlotSend (encoded appends) ◀─────────┘  │ Internal (answers, up/down,
//!  stores, brokers <──TCP── slot tasks ───────────────────────┘  fences, reads, fsyncs)
//! ```
//!
//! - [`conn`]: inbound connections (clients, and a master's appends to this slave);
//! - [`slots`]: outbound connections to every store and every other broker;
//! - [`actor`]: the one task that owns the role, the cores and the broker state;
//!
//! [`Broker::start`] binds the listeners, checks the data directory and starts the tasks.

mod actor;
mod catch_up;
mod conn;
mod local;
mod slots;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use crate::config::BrokerConfig;
use crate::core::SlotId;
use crate::durable::{self, ClusterFile, DirLock};
use crate::metrics::Metrics;
use quire_net::{Acceptor, ConnBytes, ConnectionLimit, ReadBudget, PEER_CONNECTIONS_RESERVE};

pub use crate::engine::recent::RECENT_BYTES_MAX_DEFAULT;
pub use actor::{
    BLOCKED_REQUESTS_MAX, FETCH_WAITERS_MAX, FETCH_WAIT_MS_MAX, SLAVE_READY_LAG_EVENTS_MAX,
};
pub use conn::{CONN_REQUESTS_MAX, CONN_RESPONSE_BYTES_MAX, WRITE_QUEUE_FRAMES_MAX};
pub use local::{LocalClient, LOCAL_REQUESTS_MAX};
pub use slots::{RECONNECT_BACKOFF_MAX, SLOT_QUEUE_MAX};

/// Requests queued for the actor, at most (readers wait beyond it).
pub const ACTOR_QUEUE_MAX: usize = 8192;
/// Internal messages queued for the actor, at most.
pub const INTERNAL_QUEUE_MAX: usize = 8192;
/// The broker-wide budget of produce bytes received and not yet answered (the master's
/// in-flight bound is the same size: readers stop reading producers beyond it).
pub const PRODUCE_BYTES_MAX: usize = 64 << 20;
/// How long a store or broker has to answer one request (an append, a fence, a read).
pub const PEER_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A running broker.
#[derive(Debug)]
pub struct Broker {
    local_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    kafka_addr: Option<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
    actor: JoinHandle<()>,
    metrics: Arc<Metrics>,
    /// The listener's TLS side; `None`: plaintext.
    tls: Option<quire_tls::TlsAcceptor>,
    /// The outgoing links' TLS side; `None`: plaintext.
    peer_tls: Option<quire_tls::TlsConnector>,
    _lock: DirLock,
}

impl Broker {
    /// Binds the listeners, checks the data directory (lock, epoch counter, cluster file)
    /// and starts every task. The broker starts as a slave. Nothing is written to the data
    /// directory unless both addresses could be bound.
    ///
    /// # Errors
    /// A data directory in use, damaged, or made for another cluster; an address that
    /// cannot be bound.
    pub async fn start(config: BrokerConfig) -> anyhow::Result<Broker> {
        // Bind first: a broker that cannot serve must not write its cluster file, or a retry
        // with other settings (another port, another store list) would be refused as
        // "created for another cluster".
        let tls = config.tls.acceptor().context("the [tls] settings")?;
        let peer_tls = config.tls.files.connector().context("the [tls] settings")?;
        let listener = TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let local_addr = listener.local_addr().context("reading the bound address")?;
        let kafka_listener = match &config.kafka_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding the Kafka address {addr}"))?,
            ),
            None => None,
        };
        let metrics_listener = match &config.metrics_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding the metrics address {addr}"))?,
            ),
            None => None,
        };
        let dir = config.data_dir.clone();
        let given = ClusterFile::new(&config.stores, &config.brokers, config.ack_quorum);
        let (lock, counter, cluster_file) = tokio::task::spawn_blocking(move || {
            let lock = durable::lock_dir(&dir)?;
            let counter = durable::load_epoch_counter(&dir)?;
            let cluster = durable::load_or_create_cluster(&dir, &given)?;
            Ok::<_, durable::DurableError>((lock, counter, cluster))
        })
        .await
        .context("checking the data directory")??;
        let metrics = Arc::new(Metrics::new());
        let mut tasks = Vec::new();
        let mut metrics_addr = None;
        if let Some(l) = metrics_listener {
            metrics_addr = Some(l.local_addr().context("reading the metrics address")?);
            tasks.push(tokio::spawn(quire_net::serve_metrics(l, metrics.clone())));
        }
        let (internal_tx, internal_rx) = mpsc::channel(INTERNAL_QUEUE_MAX);
        let (request_tx, request_rx) = mpsc::channel(ACTOR_QUEUE_MAX);
        // A store link takes only a server whose certificate names the store role, a broker
        // link the broker role: a client certificate of the same CA is no store.
        let store_config = slots::conn_config(
            PEER_REQUEST_TIMEOUT,
            peer_tls
                .clone()
                .map(|t| t.expecting(quire_tls::Role::Store)),
        );
        let broker_config = slots::conn_config(
            PEER_REQUEST_TIMEOUT,
            peer_tls
                .clone()
                .map(|t| t.expecting(quire_tls::Role::Broker)),
        );
        let store_slots = config.stores.len();
        let mut slot_addrs: Vec<String> = config.stores.clone();
        slot_addrs.extend(
            config
                .brokers
                .iter()
                .filter(|(b, _)| *b != config.id)
                .map(|(_, a)| a.clone()),
        );
        let slot_handles = slot_addrs
            .into_iter()
            .enumerate()
            .map(|(i, addr)| {
                let slot = SlotId(
                    u16::try_from(i)
                        .expect("invariant: slots <= SLOTS_MAX (checked by the config)"),
                );
                let config = if i < store_slots {
                    store_config.clone()
                } else {
                    broker_config.clone()
                };
                slots::spawn_slot(slot, addr, config, internal_tx.clone())
            })
            .collect();
        tracing::info!(
            id = config.id.0,
            listen = %local_addr,
            epoch_counter = counter,
            identities_known = cluster_file.identities.len(),
            "broker starting as a slave"
        );
        let kafka_addr = match &kafka_listener {
            Some(l) => Some(l.local_addr().context("reading the Kafka address")?),
            None => None,
        };
        // What Kafka clients' metadata names this broker by: its `kafka_brokers` entry,
        // else the bound address.
        let kafka_advertised = kafka_addr.map(|addr| {
            config
                .kafka_brokers
                .iter()
                .find(|(b, _)| *b == config.id)
                .map_or_else(|| addr.to_string(), |(_, a)| a.clone())
        });
        let cfg = Arc::new(config);
        let message_event_bytes_max = Arc::new(AtomicUsize::new(0));
        let security: crate::security::SecurityView = Arc::default();
        let actor = actor::Actor::new(actor::ActorInit {
            security: security.clone(),
            cfg: cfg.clone(),
            cluster_file,
            durable_counter: counter,
            slots: slot_handles,
            internal_tx,
            metrics: metrics.clone(),
            message_event_bytes_max: message_event_bytes_max.clone(),
            kafka_advertised,
        });
        let actor = tokio::spawn(actor.run(request_rx, internal_rx));
        let shared = conn::ConnShared {
            actor: request_tx,
            produce_bytes: Arc::new(Semaphore::new(PRODUCE_BYTES_MAX)),
            produce_bytes_max: PRODUCE_BYTES_MAX,
            metrics: metrics.clone(),
            read_budget: ReadBudget::new(
                cfg.read.read_buffer_bytes_max,
                metrics.read_budget.clone(),
            )
            .with_fair_share(cfg.connections_max + PEER_CONNECTIONS_RESERVE),
            read: cfg.read,
            message_event_bytes_max,
            fetch_responses: ConnBytes::new(cfg.fetch_responses_bytes_max),
            security,
            auth: Arc::new(cfg.auth.clone()),
            login_failures: Arc::default(),
        };
        if let Some(l) = kafka_listener {
            let addr = kafka_addr.expect("invariant: read when the listener was bound");
            let mut brokers: Vec<(u16, String)> = cfg
                .kafka_brokers
                .iter()
                .map(|(b, a)| (b.0, a.clone()))
                .collect();
            if !brokers.iter().any(|(b, _)| *b == cfg.id.0) {
                brokers.push((cfg.id.0, addr.to_string()));
            }
            let mut settings = quire_kafka::KafkaSettings::new(cfg.id.0, brokers, cluster_id(&cfg));
            settings.tls.clone_from(&tls);
            settings.connections_per_address_max = cfg.connections_per_address_max;
            match &tls {
                None => {
                    tracing::warn!(listen = %addr, "the Kafka listener is plaintext (docs/kafka.md): its clients act as ANONYMOUS unless they log in with SASL SCRAM, which plaintext does not protect ([tls] cert_file and key_file turn TLS on)")
                }
                Some(t) => {
                    tracing::info!(listen = %addr, client_auth = t.client_auth().as_str(), "the Kafka listener speaks TLS, as the client listener: a verified client certificate's holder is the principal, anyone else ANONYMOUS")
                }
            }
            tasks.push(tokio::spawn(quire_kafka::serve(
                l,
                LocalClient::new(shared.clone()),
                settings,
            )));
        }
        let connections_max =
            quire_net::fit_open_files_limit(cfg.connections_max, PEER_CONNECTIONS_RESERVE);
        let limit = ConnectionLimit::new(
            connections_max,
            PEER_CONNECTIONS_RESERVE,
            metrics.accept.clone(),
        )
        .with_per_address_max(cfg.connections_per_address_max)
        .with_per_principal_max(cfg.connections_per_principal_max);
        tracing::info!(
            connections_max,
            connections_per_address_max = cfg.connections_per_address_max,
            peer_reserve = PEER_CONNECTIONS_RESERVE,
            tls = tls.is_some(),
            client_auth = tls.as_ref().map(|t| t.client_auth().as_str()),
            peer_links_tls = peer_tls.is_some(),
            "accepting connections"
        );
        if tls.is_none() {
            tracing::warn!(listen = %local_addr, "the client and broker listener is plaintext ([tls] cert_file and key_file turn TLS on)");
        }
        if peer_tls.is_none() {
            tracing::warn!(
                "links to stores and brokers are plaintext ([tls] ca_file turns TLS on)"
            );
        }
        if cfg.auth.authorization {
            tracing::info!(super_users = %cfg.auth.super_users.join(","), "ACL entries are enforced (authorization = \"acl\")");
            if cfg.auth.super_users.is_empty() {
                tracing::warn!("authorization = \"acl\" without super_users: only an ACL entry with the admin operation can add users and entries; name an administrator (a certificate's common name) in super_users to bootstrap");
            }
        }
        tasks.push(tokio::spawn(accept_loop(
            Acceptor::new(listener, limit),
            shared,
            tls.clone(),
        )));
        Ok(Broker {
            local_addr,
            metrics_addr,
            kafka_addr,
            tasks,
            actor,
            metrics,
            tls,
            peer_tls,
            _lock: lock,
        })
    }

    /// Reads the TLS certificate and key files again (quire-broker does on SIGHUP): later
    /// handshakes, on the listener and on the links to stores and brokers, present them;
    /// open connections keep theirs. Nothing to do without TLS.
    ///
    /// Whether there was a certificate to read.
    ///
    /// # Errors
    /// A file that cannot be read or used; the certificate in use stays.
    pub fn reload_tls(&self) -> Result<bool, quire_tls::TlsError> {
        if let Some(t) = &self.tls {
            t.reload()?;
        }
        // The certificate shown on links to stores and brokers: the same files.
        if let Some(t) = &self.peer_tls {
            t.reload()?;
        }
        Ok(self.tls.is_some() || self.peer_tls.as_ref().is_some_and(|t| t.has_certificate()))
    }

    /// The address the broker listens on.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The Kafka listener's address, if there is one.
    #[must_use]
    pub fn kafka_addr(&self) -> Option<SocketAddr> {
        self.kafka_addr
    }

    /// The metrics address, if metrics are served.
    #[must_use]
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The broker's metrics.
    #[must_use]
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Stops accepting, stops the actor and every task.
    pub async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        self.actor.abort();
        let _ = self.actor.await;
    }
}

/// The cluster id Kafka clients are told: derived from the store list, which is fixed for
/// the cluster's life, so every broker tells the same one.
fn cluster_id(cfg: &BrokerConfig) -> String {
    format!(
        "quire-{:08x}",
        crc32c::crc32c(cfg.stores.join(",").as_bytes())
    )
}

impl quire_kafka::Backend for LocalClient {
    fn submit(
        &self,
        body: quire_proto::Body,
    ) -> impl std::future::Future<Output = quire_kafka::Pending> + Send {
        LocalClient::submit(self, body)
    }

    fn for_peer(&self, peer: &quire_tls::PeerAuth) -> Self {
        self.acting_as(crate::security::Principal::of(peer))
    }

    fn for_user(&self, user: String) -> Self {
        self.acting_as(crate::security::Principal::User(user))
    }

    fn scram_credential(&self, user: &str) -> Option<quire_proto::ScramCredential> {
        LocalClient::scram_credential(self, user)
    }

    fn login_blocked(&self, ip: std::net::IpAddr) -> Option<std::time::Duration> {
        LocalClient::login_blocked(self, ip)
    }

    fn login_failed(&self, ip: std::net::IpAddr) {
        LocalClient::login_failed(self, ip);
    }

    fn group_allowed(&self, group: &str) -> bool {
        LocalClient::group_allowed(self, group)
    }
}

/// Accepts connections under the bound (quire-net's [`Acceptor`]: beyond it they are
/// refused, and a failed `accept()` pauses the loop) and serves each on its own task.
async fn accept_loop(
    mut acceptor: Acceptor,
    shared: conn::ConnShared,
    tls: Option<quire_tls::TlsAcceptor>,
) {
    loop {
        let (stream, peer, permit) = acceptor.accept().await;
        let limit = acceptor.limit().clone();
        let tls = tls.clone();
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Some(stream) = limit.secure(stream, peer, tls.as_ref(), &permit).await {
                let auth = quire_tls::PeerAuth::of(&stream, tls.as_ref().map(|t| t.client_auth()));
                conn::serve(stream, auth, peer, permit, shared).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

    use clap::Parser;

    use super::*;
    use crate::config::BrokerConfig;
    use crate::{Cli, Command};

    /// A broker whose address is taken fails to start and writes nothing to its data
    /// directory, so a retry on a free port with the same directory starts (found by the
    /// new-user trial: the first, failed start had written the cluster file with the old
    /// addresses, and the retry was refused as "created for another cluster").
    #[tokio::test]
    async fn a_broker_that_cannot_bind_writes_no_cluster_file() {
        let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = busy.local_addr().unwrap().to_string();
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("b1");
        let args = |listen: &str| {
            let cli = Cli::parse_from([
                "quire-broker",
                "run",
                "--id",
                "1",
                "--data-dir",
                data.to_str().unwrap(),
                "--listen",
                listen,
                "--stores",
                "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
                "--brokers",
                &format!("1={listen}"),
            ]);
            let Command::Run(a) = cli.command;
            BrokerConfig::from_args(&a).unwrap()
        };
        let Err(err) = Broker::start(args(&taken)).await else {
            panic!("the port is taken");
        };
        assert!(format!("{err:#}").contains("binding"), "{err:#}");
        assert!(!data.join(durable::CLUSTER_FILE_NAME).exists());
    }
}
