//! [`StoreClient`]: the typed client of one event store (`quire-node`), as a master
//! broker, a recovering slave or a tool uses it.
//!
//! One connection carries many requests at once (see [`crate::conn`]). For pipelined
//! appends, [`StoreClient::start_append`] returns as soon as the append is queued — so
//! appends started in turn reach the store in that order — and the returned
//! [`PendingAppend`] is awaited for the store's answer. The fan-out path,
//! [`StoreClient::start_append_encoded`], sends one [`EncodedBody`] (built once with
//! `quire_proto::encode_body`) behind this connection's own header with a vectored
//! write, so a master encodes each append once for all its stores.
//!
//! An `ErrorResponse` from the store becomes [`ClientError::Remote`], except `NotVoter` in
//! answer to a fence, which is [`FenceOutcome::NotVoter`] (an answer a broker acts on). A
//! failed log is not an error here: the store answers appends with `AppendRejected`
//! (reason `LogFailed`).

use std::fmt;

use quire_proto::{
    AppendRejected, AppendRequest, Body, EncodedBody, Epoch, ErrorCode, ErrorDetail, FenceGranted,
    FenceRefused, FenceRequest, Frame, FrameType, Heartbeat, HeartbeatAck, Incarnation, Offset,
    PersistedAck, RangeDigestRequest, RangeDigestResponse, ReadRequest, ReadResponse,
    RepairRequest, RepairResponse, StoreId, TailRequest, TailResponse,
};
use tokio::net::ToSocketAddrs;

use crate::conn::{ConnConfig, Connection, PendingReply};
use crate::error::{remote_or_unexpected, ClientError};

/// A store's answer to an append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppendOutcome {
    /// The events through `through_offset` are durable on the store.
    Persisted(PersistedAck),
    /// The store refused the append (stale epoch, log mismatch, failed log, overloaded).
    Rejected(AppendRejected),
}

/// A store's answer to a fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceOutcome {
    /// The store promised the epoch (durably) and reports its last entry.
    Granted(FenceGranted),
    /// The store has promised a higher epoch.
    Refused(FenceRefused),
    /// The store is a learner (new incarnation, or not the identity the broker expects):
    /// it never grants a fence and never counts toward a quorum.
    NotVoter {
        /// The store's identity.
        store_id: StoreId,
        /// Its incarnation.
        incarnation: Incarnation,
    },
}

/// An append on its way; see [`StoreClient::start_append`].
#[derive(Debug)]
pub struct PendingAppend {
    reply: PendingReply,
}

impl PendingAppend {
    /// The append's request id.
    #[must_use]
    pub fn request_id(&self) -> quire_proto::RequestId {
        self.reply.request_id()
    }

    /// Waits (at most until the request timeout) for the store's answer.
    ///
    /// # Errors
    /// [`ClientError::Timeout`], a lost connection, [`ClientError::Remote`] for an
    /// `ErrorResponse`, [`ClientError::UnexpectedResponse`].
    pub async fn wait(self) -> Result<AppendOutcome, ClientError> {
        match self.reply.wait().await?.body {
            Body::PersistedAck(a) => Ok(AppendOutcome::Persisted(a)),
            Body::AppendRejected(r) => Ok(AppendOutcome::Rejected(r)),
            other => Err(remote_or_unexpected(FrameType::AppendRequest, other)),
        }
    }
}

/// A client of one store. See the module docs.
#[derive(Debug)]
pub struct StoreClient {
    conn: Connection,
}

impl StoreClient {
    /// Connects with the default bounds ([`ConnConfig::default`]).
    ///
    /// # Errors
    /// [`ClientError::Connect`] or [`ClientError::ConnectTimeout`].
    pub async fn connect<A>(addr: A) -> Result<StoreClient, ClientError>
    where
        A: ToSocketAddrs + fmt::Display,
    {
        StoreClient::connect_with(addr, ConnConfig::default()).await
    }

    /// Connects with the given bounds.
    ///
    /// # Errors
    /// [`ClientError::Connect`] or [`ClientError::ConnectTimeout`].
    pub async fn connect_with<A>(addr: A, config: ConnConfig) -> Result<StoreClient, ClientError>
    where
        A: ToSocketAddrs + fmt::Display,
    {
        Ok(StoreClient {
            conn: Connection::connect(addr, config).await?,
        })
    }

    /// The underlying connection (for raw frames).
    #[must_use]
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The store's address.
    #[must_use]
    pub fn peer(&self) -> &str {
        self.conn.peer()
    }

    /// Queues an append and returns once it is queued (appends started in turn are sent
    /// in that order); await the result for the store's answer.
    ///
    /// # Errors
    /// [`ClientError::Wire`] if the append cannot be encoded; a lost connection;
    /// [`ClientError::Timeout`] if the connection stayed full.
    pub async fn start_append(&self, append: AppendRequest) -> Result<PendingAppend, ClientError> {
        Ok(PendingAppend {
            reply: self.conn.send(append.into()).await?,
        })
    }

    /// [`StoreClient::start_append`] for a body encoded once with `quire_proto::encode_body`
    /// (the fan-out path): written with one vectored write, payloads not copied.
    ///
    /// # Errors
    /// [`ClientError::InvalidRequest`] if `body` is not an `AppendRequest`; otherwise as
    /// [`StoreClient::start_append`].
    pub async fn start_append_encoded(
        &self,
        body: &EncodedBody,
    ) -> Result<PendingAppend, ClientError> {
        if body.frame_type() != FrameType::AppendRequest {
            return Err(ClientError::InvalidRequest(format!(
                "start_append_encoded needs an AppendRequest body, not {:?}",
                body.frame_type()
            )));
        }
        Ok(PendingAppend {
            reply: self.conn.send_encoded(body).await?,
        })
    }

    /// Appends and waits for the answer: [`AppendOutcome::Persisted`] once the events
    /// are durable on the store, or [`AppendOutcome::Rejected`].
    ///
    /// # Errors
    /// As [`StoreClient::start_append`] and [`PendingAppend::wait`].
    pub async fn append(&self, append: AppendRequest) -> Result<AppendOutcome, ClientError> {
        self.start_append(append).await?.wait().await
    }

    /// [`StoreClient::append`] for an encoded body.
    ///
    /// # Errors
    /// As [`StoreClient::start_append_encoded`] and [`PendingAppend::wait`].
    pub async fn append_encoded(&self, body: &EncodedBody) -> Result<AppendOutcome, ClientError> {
        self.start_append_encoded(body).await?.wait().await
    }

    /// Asks the store to promise `epoch`. `expected` is the identity this broker has
    /// bound to the store's address (`None` while bootstrapping).
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`] for an
    /// `ErrorResponse` other than `NotVoter`.
    pub async fn fence(
        &self,
        epoch: Epoch,
        expected: Option<(StoreId, Incarnation)>,
    ) -> Result<FenceOutcome, ClientError> {
        let frame = self
            .request(FenceRequest { epoch, expected }.into())
            .await?;
        match frame.body {
            Body::FenceGranted(g) => Ok(FenceOutcome::Granted(g)),
            Body::FenceRefused(r) => Ok(FenceOutcome::Refused(r)),
            Body::ErrorResponse(e) if e.code == ErrorCode::NotVoter => match e.detail {
                ErrorDetail::NotVoter {
                    store_id,
                    incarnation,
                } => Ok(FenceOutcome::NotVoter {
                    store_id,
                    incarnation,
                }),
                _ => Err(ClientError::Remote(Box::new(e))),
            },
            other => Err(remote_or_unexpected(FrameType::FenceRequest, other)),
        }
    }

    /// Reads durable events from `from`: at most `max_events`, and payload bytes up to
    /// `max_bytes` (at least one event if the store holds one at `from`). The store
    /// applies its own maxima too.
    ///
    /// # Errors
    /// [`ClientError::Trimmed`] when retention deleted `from` on this store (the answer held
    /// no event and a first offset above `from`); a lost connection,
    /// [`ClientError::Timeout`], [`ClientError::Remote`].
    pub async fn read(
        &self,
        from: Offset,
        max_events: u32,
        max_bytes: u32,
    ) -> Result<ReadResponse, ClientError> {
        let frame = self
            .request(
                ReadRequest {
                    from,
                    max_events,
                    max_bytes,
                }
                .into(),
            )
            .await?;
        match frame.body {
            Body::ReadResponse(r) if r.events.is_empty() && r.first_offset > from => {
                Err(ClientError::Trimmed {
                    requested: from,
                    first_offset: r.first_offset,
                })
            }
            Body::ReadResponse(r) => Ok(r),
            Body::ErrorResponse(e) => Err(ClientError::from_read_error(from, e)),
            other => Err(remote_or_unexpected(FrameType::ReadRequest, other)),
        }
    }

    /// The store's state: last entry, promised epoch, HWM heard, identity, voter.
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`].
    pub async fn tail(&self) -> Result<TailResponse, ClientError> {
        let frame = self.request(TailRequest.into()).await?;
        match frame.body {
            Body::TailResponse(t) => Ok(t),
            other => Err(remote_or_unexpected(FrameType::TailRequest, other)),
        }
    }

    /// The digest of the entries the store holds at offsets `from..=to` (read-only; see
    /// `quire_proto::digest`). The range must be non-empty and span at most
    /// `RANGE_DIGEST_OFFSETS_MAX` offsets.
    ///
    /// # Errors
    /// [`ClientError::Wire`] for a range the codec refuses, a lost connection,
    /// [`ClientError::Timeout`], [`ClientError::Remote`] (e.g. `UnexpectedFrame` from a store
    /// too old to serve it).
    pub async fn range_digest(
        &self,
        from: Offset,
        to: Offset,
    ) -> Result<RangeDigestResponse, ClientError> {
        let frame = self.request(RangeDigestRequest { from, to }.into()).await?;
        match frame.body {
            Body::RangeDigestResponse(r) => Ok(r),
            other => Err(remote_or_unexpected(FrameType::RangeDigestRequest, other)),
        }
    }

    /// Sends the store `good`, a good copy (read from another store) of a record the store
    /// answered `Corrupt` for; the store rewrites its damaged copy with it if it holds the
    /// same entry (docs/protocol.md, "Damaged records").
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`] (`Corrupt`:
    /// the rewrite did not read back; `LogFailed`; `Unauthorized` without the broker role).
    pub async fn repair(&self, good: quire_proto::Event) -> Result<RepairResponse, ClientError> {
        let frame = self.request(RepairRequest { event: good }.into()).await?;
        match frame.body {
            Body::RepairResponse(r) => Ok(r),
            other => Err(remote_or_unexpected(FrameType::RepairRequest, other)),
        }
    }

    /// Tells the store the master's HWM.
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`].
    pub async fn heartbeat(&self, heartbeat: Heartbeat) -> Result<HeartbeatAck, ClientError> {
        let frame = self.request(heartbeat.into()).await?;
        match frame.body {
            Body::HeartbeatAck(a) => Ok(a),
            other => Err(remote_or_unexpected(FrameType::Heartbeat, other)),
        }
    }

    async fn request(&self, body: Body) -> Result<Frame, ClientError> {
        self.conn.send(body).await?.wait().await
    }
}
