//! Outbound connections to the replication slots: every store, and every other broker.
//!
//! One task per slot keeps a connection up (reconnecting with a bounded backoff) and
//! publishes it in a shared cell, so fences, reads and fetches can use it from their own
//! tasks. Appends go through the slot's pipeline: the actor queues an encoded append
//! (never waiting: a full queue drops it, and the master core resends after its append
//! timeout); the task writes it behind this connection's own header (the body was encoded
//! once for every slot, the payloads are shared, not copied), and a forwarder awaits the
//! answers in send order and hands them to the actor with the append's identity.
//!
//! The actor hears [`Internal::SlotUp`] when a connection is established and
//! [`Internal::SlotDown`] when it is lost; every answer of a connection comes between the
//! two.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use quire_client::{ClientError, ConnConfig, FenceOutcome, StoreClient};
use quire_proto::{EncodedBody, Epoch, Frame, Offset, ReadResponse};
use tokio::sync::mpsc;

use crate::core::{AppendCommand, AppendId, SlotId};

/// Appends queued for one slot's writer, at most (the master core keeps far fewer in
/// flight per slot; the rest of the room absorbs heartbeats and resends).
pub const SLOT_QUEUE_MAX: usize = 256;
/// Longest wait between two connection attempts.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// First wait after a failed connection attempt.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(20);
/// How often an idle slot task checks its connection is still open.
const LIVENESS_CHECK: Duration = Duration::from_millis(100);

/// The identity of an append, echoed with its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AppendMeta {
    pub(crate) append: AppendId,
    pub(crate) epoch: Epoch,
    pub(crate) through: Option<Offset>,
}

impl AppendMeta {
    pub(crate) fn of(cmd: &AppendCommand) -> AppendMeta {
        AppendMeta {
            append: cmd.append,
            epoch: cmd.epoch,
            through: cmd.through(),
        }
    }
}

/// Messages from slot tasks and blocking helpers to the actor.
#[derive(Debug)]
pub(crate) enum Internal {
    /// A connection to `slot` is up.
    SlotUp { slot: SlotId },
    /// The connection to `slot` is gone.
    SlotDown { slot: SlotId },
    /// The answer (or failure) of an append.
    AppendAnswer {
        slot: SlotId,
        meta: AppendMeta,
        outcome: Result<Frame, ClientError>,
    },
    /// The answer to a fence of a takeover.
    FenceAnswer {
        slot: SlotId,
        epoch: Epoch,
        outcome: Result<FenceOutcome, ClientError>,
    },
    /// A takeover's read of the adopted store's tail.
    Fetched {
        slot: SlotId,
        epoch: Epoch,
        outcome: Result<ReadResponse, ClientError>,
    },
    /// The store asked for an append's events no longer holds them (retention).
    ReadTrimmed {
        cmd: AppendCommand,
        first_offset: quire_proto::Offset,
    },
    /// Events read from a store for an append whose events the master trimmed; `corrupt`:
    /// the source answered `Corrupt` for that offset (the read stopped there).
    ReadForAppend {
        cmd: AppendCommand,
        outcome: Result<Vec<quire_proto::Event>, String>,
        corrupt: Option<(SlotId, Offset)>,
    },
    /// A store answered a read `Corrupt` for its record at `offset`.
    StoreCorrupt { slot: SlotId, offset: Offset },
    /// The outcome of a [`crate::engine::Command::RepairRecord`].
    RepairDone {
        slot: SlotId,
        offset: Offset,
        outcome: Result<quire_proto::RepairResponse, String>,
    },
    /// A consumer fetch's store read found the record at `offset` damaged on `slot`'s
    /// store: the fetch is planned again, from another store.
    StoreFetchCorrupt {
        token: crate::engine::RequestToken,
        slot: SlotId,
        offset: Offset,
        req: quire_proto::FetchRequest,
        waiter: super::actor::Waiter,
        /// Times this fetch was planned again after a `Corrupt` answer, this one included.
        replans: usize,
    },
    /// A store's tail, for a bootstrap probe.
    TailAnswer {
        slot: SlotId,
        generation: u64,
        outcome: Result<quire_proto::TailResponse, ClientError>,
    },
    /// The target's answer to a handoff's `TakeOverNowRequest` (sent in `epoch`).
    HandoffAnswer {
        to: quire_proto::BrokerId,
        epoch: Epoch,
        outcome: Result<quire_proto::Body, String>,
    },
    /// The epoch counter is durable (or could not be made so).
    EpochPersisted {
        counter: u64,
        outcome: Result<(), String>,
    },
    /// The store identities are durable in the cluster file (or could not be made so).
    IdentitiesPersisted {
        /// The bootstrap attempt's epoch, if this completes a bootstrap.
        bootstrap_epoch: Option<Epoch>,
        outcome: Result<(), String>,
    },
}

/// What the actor sends a slot task.
#[derive(Debug)]
pub(crate) struct SlotSend {
    pub(crate) meta: AppendMeta,
    /// Shared by every slot the same append goes to (the chunks are not cloned per slot).
    pub(crate) body: Arc<EncodedBody>,
}

/// The actor's handle on one slot.
#[derive(Debug)]
pub(crate) struct SlotHandle {
    pub(crate) tx: mpsc::Sender<SlotSend>,
    pub(crate) client: Arc<Mutex<Option<Arc<StoreClient>>>>,
}

impl SlotHandle {
    /// The current connection, if one is up.
    pub(crate) fn client(&self) -> Option<Arc<StoreClient>> {
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Bounds of the outbound connections, and their TLS (`None`: plaintext).
pub(crate) fn conn_config(
    request_timeout: Duration,
    tls: Option<quire_tls::TlsConnector>,
) -> ConnConfig {
    ConnConfig {
        connect_timeout: Duration::from_secs(1),
        request_timeout,
        in_flight_requests_max: 1024,
        tls,
        sasl: None,
    }
}

/// Starts the task of one slot and returns its handle.
pub(crate) fn spawn_slot(
    slot: SlotId,
    addr: String,
    config: ConnConfig,
    internal: mpsc::Sender<Internal>,
) -> SlotHandle {
    let (tx, rx) = mpsc::channel(SLOT_QUEUE_MAX);
    let client = Arc::new(Mutex::new(None));
    tokio::spawn(slot_task(slot, addr, config, rx, client.clone(), internal));
    SlotHandle { tx, client }
}

async fn slot_task(
    slot: SlotId,
    addr: String,
    config: ConnConfig,
    mut rx: mpsc::Receiver<SlotSend>,
    cell: Arc<Mutex<Option<Arc<StoreClient>>>>,
    internal: mpsc::Sender<Internal>,
) {
    let mut backoff = RECONNECT_BACKOFF_MIN;
    let mut failures = 0u64;
    loop {
        let client = match StoreClient::connect_with(addr.as_str(), config.clone()).await {
            Ok(c) => Arc::new(c),
            Err(e) => {
                failures += 1;
                if failures == 1 || failures % 50 == 0 {
                    tracing::debug!(%slot, %addr, error = %e, failures, "cannot connect");
                }
                // Appends queued meanwhile were meant for a connection that does not
                // exist: the master core resends after its reconnect.
                while rx.try_recv().is_ok() {}
                if internal.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
                continue;
            }
        };
        if failures > 0 {
            tracing::info!(%slot, %addr, "connected");
        }
        failures = 0;
        backoff = RECONNECT_BACKOFF_MIN;
        while rx.try_recv().is_ok() {}
        *cell.lock().unwrap_or_else(PoisonError::into_inner) = Some(client.clone());
        if internal.send(Internal::SlotUp { slot }).await.is_err() {
            return;
        }
        let (fwd_tx, mut fwd_rx) =
            mpsc::channel::<(AppendMeta, quire_client::PendingReply)>(SLOT_QUEUE_MAX);
        let fwd_internal = internal.clone();
        let mut forwarder = tokio::spawn(async move {
            while let Some((meta, pending)) = fwd_rx.recv().await {
                let outcome = pending.wait().await;
                let lost = outcome.as_ref().is_err_and(|e| {
                    e.is_connection_lost() || matches!(e, ClientError::Timeout { .. })
                });
                if fwd_internal
                    .send(Internal::AppendAnswer {
                        slot,
                        meta,
                        outcome,
                    })
                    .await
                    .is_err()
                {
                    return;
                }
                if lost {
                    return;
                }
            }
        });
        let mut check = tokio::time::interval(LIVENESS_CHECK);
        loop {
            tokio::select! {
                m = rx.recv() => {
                    let Some(send) = m else {
                        forwarder.abort();
                        return;
                    };
                    match client.connection().send_encoded(&send.body).await {
                        Ok(pending) => {
                            if fwd_tx.send((send.meta, pending)).await.is_err() {
                                break;
                            }
                        }
                        Err(e) if e.is_connection_lost() => break,
                        Err(e) => {
                            tracing::debug!(%slot, error = %e, "append not sent");
                            if matches!(e, ClientError::Timeout { .. }) {
                                break;
                            }
                        }
                    }
                }
                _ = &mut forwarder => break,
                _ = check.tick() => {
                    if client.connection().close_reason().is_some() {
                        break;
                    }
                }
            }
        }
        forwarder.abort();
        *cell.lock().unwrap_or_else(PoisonError::into_inner) = None;
        if let Some(reason) = client.connection().close_reason() {
            tracing::info!(%slot, %addr, %reason, "connection lost");
        } else {
            tracing::info!(%slot, %addr, "connection dropped");
        }
        drop(client);
        if internal.send(Internal::SlotDown { slot }).await.is_err() {
            return;
        }
        tokio::time::sleep(RECONNECT_BACKOFF_MIN).await;
    }
}
