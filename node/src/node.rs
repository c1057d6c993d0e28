//! [`Node`]: a running store — identity loaded, WAL open, store actor, the store-protocol
//! listener and (optionally) the metrics listener.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use quire_wal::{Mutations, OsStorage, Wal};
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::config::{NodeConfig, SocketSettings};
use crate::conn::{self, ConnContext};
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::store::Store;
use quire_net::{Acceptor, ConnBytes, ConnectionLimit, ReadBudget, PEER_CONNECTIONS_RESERVE};

/// Pending connections the listen socket queues (the kernel caps it at `somaxconn`).
pub const LISTEN_BACKLOG: i32 = 4096;

/// A running node. Dropping it without [`Node::shutdown`] aborts its tasks.
#[derive(Debug)]
pub struct Node {
    local_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    identity: Identity,
    wal: Wal,
    metrics: Arc<Metrics>,
    accept: JoinHandle<()>,
    metrics_task: Option<JoinHandle<()>>,
    actor: JoinHandle<()>,
    /// The listener's TLS side; `None`: plaintext.
    tls: Option<quire_tls::TlsAcceptor>,
}

impl Node {
    /// Loads the data directory's identity, opens its WAL (running recovery) and promised
    /// epoch, binds the listeners and starts serving.
    ///
    /// # Errors
    /// An uninitialised or damaged data directory, a WAL that cannot be opened (locked,
    /// corrupt), an address that cannot be bound.
    pub async fn start(config: NodeConfig) -> anyhow::Result<Node> {
        Node::start_inner(config, None).await
    }

    /// [`Node::start`] with the WAL on the given disk implementation (`config.wal.io` is
    /// ignored): for tests that inject faults with `quire_wal::disk::FaultDisk`.
    ///
    /// # Errors
    /// As [`Node::start`].
    pub async fn start_with_disk(
        config: NodeConfig,
        disk: Box<dyn quire_wal::disk::Disk>,
    ) -> anyhow::Result<Node> {
        Node::start_inner(config, Some(disk)).await
    }

    async fn start_inner(
        config: NodeConfig,
        disk: Option<Box<dyn quire_wal::disk::Disk>>,
    ) -> anyhow::Result<Node> {
        let data_dir = config.data_dir.clone();
        let wal_config = config.wal_config();
        let (identity, wal, report, promised, mark) = tokio::task::spawn_blocking(move || {
            let disk = match disk {
                Some(d) => Some(d),
                None => crate::failpoints::disk_from_env(wal_config.io)?,
            };
            let opened = crate::startup::open_data_dir(
                OsStorage,
                &data_dir,
                wal_config,
                disk,
                Mutations::default(),
            )?;
            anyhow::Ok((
                opened.identity,
                opened.wal,
                opened.report,
                opened.promised,
                opened.tail_cut,
            ))
        })
        .await
        .context("start-up task failed")??;
        tracing::info!(
            data_dir = %config.data_dir.display(),
            store_id = format_args!("{:016x}", identity.store_id.0),
            incarnation = format_args!("{:016x}", identity.incarnation.0),
            role = %identity.role,
            promised = %promised.epoch(),
            tail_cut = ?mark,
            last = ?wal.last(),
            backend = wal.backend(),
            recovery = ?report,
            "store opened"
        );

        let mut metrics = Metrics::new();
        metrics.register_wal(wal.clone());
        let metrics = Arc::new(metrics);

        let tls = config.tls.acceptor().context("the [tls] settings")?;
        let listener = bind(&config.listen).await?;
        let local_addr = listener.local_addr().context("listener address")?;
        let metrics_listener = match &config.metrics_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let metrics_addr = match &metrics_listener {
            Some(l) => Some(l.local_addr().context("metrics listener address")?),
            None => None,
        };

        let (store, handle, rx) = Store::new(
            wal.clone(),
            config.data_dir.clone(),
            identity,
            promised,
            mark,
            metrics.clone(),
        );
        let actor = tokio::spawn(store.run(rx));
        let ctx = ConnContext {
            store: handle,
            wal: wal.clone(),
            limits: config.limits.clone(),
            metrics: metrics.clone(),
            read_budget: ReadBudget::new(
                config.limits.read_buffer_bytes_max,
                metrics.read_budget.clone(),
            )
            .with_fair_share(config.limits.connections_max + PEER_CONNECTIONS_RESERVE),
            read_responses: ConnBytes::new(config.limits.read_responses_bytes_max),
        };
        let connections_max = quire_net::fit_open_files_limit(
            config.limits.connections_max,
            PEER_CONNECTIONS_RESERVE,
        );
        let limit = ConnectionLimit::new(
            connections_max,
            PEER_CONNECTIONS_RESERVE,
            metrics.accept.clone(),
        )
        .with_per_address_max(config.limits.connections_per_address_max)
        .with_per_principal_max(config.limits.connections_per_principal_max);
        let accept = tokio::spawn(accept_loop(
            Acceptor::new(listener, limit),
            ctx,
            config.socket.clone(),
            tls.clone(),
        ));
        let metrics_task =
            metrics_listener.map(|l| tokio::spawn(quire_net::serve_metrics(l, metrics.clone())));
        tracing::info!(
            %local_addr,
            ?metrics_addr,
            connections_max,
            connections_per_address_max = config.limits.connections_per_address_max,
            peer_reserve = PEER_CONNECTIONS_RESERVE,
            tls = tls.is_some(),
            client_auth = tls.as_ref().map(|t| t.client_auth().as_str()),
            "serving"
        );
        match &tls {
            None => {
                tracing::warn!(%local_addr, "the store protocol listener is plaintext: anyone who reaches it can fence this store ([tls] cert_file and key_file turn TLS on)")
            }
            Some(t) if t.client_auth() == quire_tls::ClientAuth::None => {
                tracing::warn!(%local_addr, "the store protocol listener asks for no client certificates (client_auth = \"none\"): anyone who reaches it can fence this store")
            }
            Some(_) => {}
        }
        Ok(Node {
            local_addr,
            metrics_addr,
            identity,
            wal,
            metrics,
            accept,
            metrics_task,
            actor,
            tls,
        })
    }

    /// Reads the TLS certificate and key files again (quire-node does on SIGHUP): later
    /// handshakes present them; open connections keep theirs. Nothing to do on a
    /// plaintext listener.
    ///
    /// Whether there was a certificate to read.
    ///
    /// # Errors
    /// A file that cannot be read or used; the certificate in use stays.
    pub fn reload_tls(&self) -> Result<bool, quire_tls::TlsError> {
        match &self.tls {
            Some(t) => t.reload().map(|()| true),
            None => Ok(false),
        }
    }

    /// The address the store protocol is served on.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address metrics are served on, if any.
    #[must_use]
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The node's metrics (what `GET /metrics` serves).
    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The store's identity as loaded at start (its role may change to learner later).
    #[must_use]
    pub fn identity(&self) -> Identity {
        self.identity
    }

    /// Stops accepting, closes every connection, lets the store actor finish what the WAL
    /// has in flight, and closes the WAL (queued appends are written and fsynced first).
    ///
    /// # Errors
    /// If the WAL had failed.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.accept.abort();
        if let Some(m) = self.metrics_task.take() {
            m.abort();
        }
        let _ = (&mut self.accept).await;
        // Every connection (and so every handle to the actor) is gone: the actor drains.
        let _ = (&mut self.actor).await;
        let wal = self.wal.clone();
        tokio::task::spawn_blocking(move || wal.close())
            .await
            .context("WAL close task failed")?
            .context("closing the WAL")?;
        tracing::info!("store stopped");
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.accept.abort();
        if let Some(m) = &self.metrics_task {
            m.abort();
        }
    }
}

/// Binds a TCP listener with `SO_REUSEADDR` and a [`LISTEN_BACKLOG`] backlog.
async fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr)
        .await
        .with_context(|| format!("resolving {addr}"))?
        .collect();
    let mut last_error = None;
    for a in addrs {
        match bind_one(a) {
            Ok(l) => return Ok(l),
            Err(e) => last_error = Some(e),
        }
    }
    Err(match last_error {
        Some(e) => anyhow::Error::new(e).context(format!("binding {addr}")),
        None => anyhow::anyhow!("{addr} resolves to no address"),
    })
}

fn bind_one(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    TcpListener::from_std(socket.into())
}

fn configure(stream: &TcpStream, settings: &SocketSettings) -> std::io::Result<()> {
    let s = SockRef::from(stream);
    s.set_tcp_nodelay(true)?;
    if let Some(b) = settings.send_buffer_bytes {
        s.set_send_buffer_size(b)?;
    }
    if let Some(b) = settings.recv_buffer_bytes {
        s.set_recv_buffer_size(b)?;
    }
    Ok(())
}

/// Accepts connections under the bound (quire-net's [`Acceptor`]: beyond it they are
/// refused, and a failed `accept()` pauses the loop) and serves each on its own task;
/// aborting this task aborts every connection.
async fn accept_loop(
    mut acceptor: Acceptor,
    ctx: ConnContext,
    socket: SocketSettings,
    tls: Option<quire_tls::TlsAcceptor>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            (stream, peer, permit) = acceptor.accept() => {
                if let Err(e) = configure(&stream, &socket) {
                    tracing::warn!(%peer, error = %e, "cannot configure the socket");
                    continue;
                }
                ctx.metrics.connections_accepted.inc();
                ctx.metrics.connections_open.inc();
                tracing::debug!(%peer, reserve = permit.is_on_probation(), "connection opened");
                let ctx = ctx.clone();
                let tls = tls.clone();
                let limit = acceptor.limit().clone();
                connections.spawn(async move {
                    let metrics = ctx.metrics.clone();
                    if let Some(stream) = limit.secure(stream, peer, tls.as_ref(), &permit).await {
                        let auth = quire_tls::PeerAuth::of(&stream, tls.as_ref().map(|t| t.client_auth()));
                        conn::serve(stream, auth, peer, permit, ctx).await;
                    }
                    metrics.connections_open.dec();
                    tracing::debug!(%peer, "connection closed");
                });
            }
            Some(done) = connections.join_next(), if !connections.is_empty() => {
                if let Err(e) = done {
                    if e.is_panic() {
                        tracing::error!(error = %e, "a connection task panicked");
                    }
                }
            }
        }
    }
}
