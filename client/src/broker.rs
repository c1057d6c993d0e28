//! [`BrokerClient`]: the typed client of one broker (`quire-broker`), over one
//! multiplexed [`Connection`].
//!
//! One request, one answer: produce, fetch, cursor commit and lookup, metadata. An
//! `ErrorResponse` becomes [`ClientError::Remote`] carrying the broker's `ErrorCode` (and,
//! for `NotMaster`, the master it names). This client talks to the broker it was connected
//! to and nothing else: finding the master, retrying and resending belong to
//! [`crate::discovery`], [`crate::producer`] and [`crate::consumer`].
//!
//! For pipelined produces, [`BrokerClient::start_produce`] returns once the request is
//! queued on the connection, so produces started in turn reach the broker in that order —
//! which is what keeps one producer's batches in sequence order on the wire.

use std::fmt;

use quire_proto::{
    Body, CommitCursorRequest, CursorRequest, FetchRequest, FetchResponse, Frame, FrameType,
    MetadataRequest, MetadataResponse, Offset, ProduceRequest, ProduceResponse,
};
use tokio::net::ToSocketAddrs;

use crate::conn::{ConnConfig, Connection, PendingReply};
use crate::error::{remote_or_unexpected, ClientError};

/// A produce on its way; see [`BrokerClient::start_produce`].
#[derive(Debug)]
pub struct PendingProduce {
    reply: PendingReply,
}

impl PendingProduce {
    /// Waits (at most until the connection's request timeout) for the broker's answer.
    ///
    /// # Errors
    /// [`ClientError::Remote`] for an `ErrorResponse` (e.g. `NotMaster`, `Timeout`,
    /// `NoQuorum`, `SequenceGap`, `MessageTooLarge`), [`ClientError::Timeout`], a lost
    /// connection, [`ClientError::UnexpectedResponse`].
    pub async fn wait(self) -> Result<ProduceResponse, ClientError> {
        match self.reply.wait().await?.body {
            Body::ProduceResponse(r) => Ok(r),
            other => Err(remote_or_unexpected(FrameType::ProduceRequest, other)),
        }
    }
}

/// A client of one broker. See the module docs.
#[derive(Debug)]
pub struct BrokerClient {
    conn: Connection,
}

impl BrokerClient {
    /// Connects to the broker at `addr` with the given bounds.
    ///
    /// # Errors
    /// [`ClientError::Connect`] or [`ClientError::ConnectTimeout`].
    pub async fn connect<A>(addr: A, config: ConnConfig) -> Result<BrokerClient, ClientError>
    where
        A: ToSocketAddrs + fmt::Display,
    {
        Ok(BrokerClient {
            conn: Connection::connect(addr, config).await?,
        })
    }

    /// Wraps an open connection.
    #[must_use]
    pub fn from_connection(conn: Connection) -> BrokerClient {
        BrokerClient { conn }
    }

    /// The underlying connection (for raw frames).
    #[must_use]
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The broker's address, as dialled.
    #[must_use]
    pub fn peer(&self) -> &str {
        self.conn.peer()
    }

    /// Queues a produce and returns once it is queued (produces started in turn are sent
    /// in that order); await the result for the broker's answer.
    ///
    /// # Errors
    /// [`ClientError::Wire`] if the request cannot be encoded (empty or long topic, too
    /// many messages, a message too large); a lost connection; [`ClientError::Timeout`]
    /// if the connection stayed full.
    pub async fn start_produce(
        &self,
        request: ProduceRequest,
    ) -> Result<PendingProduce, ClientError> {
        Ok(PendingProduce {
            reply: self.conn.send(request.into()).await?,
        })
    }

    /// Produces and waits for the answer: the batch's offsets once it is stabilized.
    ///
    /// # Errors
    /// As [`BrokerClient::start_produce`] and [`PendingProduce::wait`].
    pub async fn produce(&self, request: ProduceRequest) -> Result<ProduceResponse, ClientError> {
        self.start_produce(request).await?.wait().await
    }

    /// Fetches stabilized messages (the broker may hold the request up to `wait_ms`; the
    /// connection's request timeout must be longer than that).
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`] (`NotMaster`,
    /// `Internal` "retry", ...).
    pub async fn fetch(&self, request: FetchRequest) -> Result<FetchResponse, ClientError> {
        match self.request(request.into()).await?.body {
            Body::FetchResponse(r) => Ok(r),
            other => Err(remote_or_unexpected(FrameType::FetchRequest, other)),
        }
    }

    /// Durably sets `cursor` of `topic` to `offset` (the next log offset its consumer
    /// wants); returns once the commit is stabilized.
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`] (`NotMaster`,
    /// `Timeout`, `NoQuorum`, `InvalidName`, ...).
    pub async fn commit_cursor(
        &self,
        topic: &str,
        cursor: &str,
        offset: Offset,
    ) -> Result<(), ClientError> {
        let request = CommitCursorRequest {
            topic: topic.to_owned(),
            cursor: cursor.to_owned(),
            offset,
        };
        match self.request(request.into()).await?.body {
            Body::CommitCursorResponse(_) => Ok(()),
            other => Err(remote_or_unexpected(FrameType::CommitCursorRequest, other)),
        }
    }

    /// The committed offset of `cursor` on `topic` (`None`: never committed).
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`].
    pub async fn cursor(&self, topic: &str, cursor: &str) -> Result<Option<Offset>, ClientError> {
        let request = CursorRequest {
            topic: topic.to_owned(),
            cursor: cursor.to_owned(),
        };
        match self.request(request.into()).await?.body {
            Body::CursorResponse(r) => Ok(r.offset),
            other => Err(remote_or_unexpected(FrameType::CursorRequest, other)),
        }
    }

    /// The broker's view of the cluster (any broker answers, master or not).
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`].
    pub async fn metadata(&self) -> Result<MetadataResponse, ClientError> {
        match self.request(MetadataRequest::default().into()).await?.body {
            Body::MetadataResponse(r) => Ok(r),
            other => Err(remote_or_unexpected(FrameType::MetadataRequest, other)),
        }
    }

    /// Adds, replaces or removes a user (the master; returns once the change is
    /// stabilized, so every broker applies it).
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`] (`NotMaster`,
    /// `Unauthorized`, `LimitReached`, ...).
    pub async fn user_admin(&self, change: quire_proto::UserAdminEvent) -> Result<(), ClientError> {
        let body = Body::UserAdminRequest(quire_proto::UserAdminRequest(change));
        match self.request(body).await?.body {
            Body::AdminResponse(_) => Ok(()),
            other => Err(remote_or_unexpected(FrameType::UserAdminRequest, other)),
        }
    }

    /// Adds or removes an ACL entry (the master; returns once the change is stabilized).
    ///
    /// # Errors
    /// As [`BrokerClient::user_admin`].
    pub async fn acl_admin(&self, change: quire_proto::AclAdminEvent) -> Result<(), ClientError> {
        let body = Body::AclAdminRequest(quire_proto::AclAdminRequest(change));
        match self.request(body).await?.body {
            Body::AdminResponse(_) => Ok(()),
            other => Err(remote_or_unexpected(FrameType::AclAdminRequest, other)),
        }
    }

    /// Creates or deletes a topic (the master; returns once the change is stabilized).
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`] (`NotMaster`,
    /// `TopicExists`, `InvalidPartitions`, `UnknownTopic`, `LimitReached`,
    /// `Unauthorized`, ...).
    pub async fn topic_admin(
        &self,
        change: quire_proto::TopicAdminRequest,
    ) -> Result<(), ClientError> {
        match self.request(Body::TopicAdminRequest(change)).await?.body {
            Body::AdminResponse(_) => Ok(()),
            other => Err(remote_or_unexpected(FrameType::TopicAdminRequest, other)),
        }
    }

    /// Adds a store to the voter set or removes one (the master; returns once the `Config`
    /// event is stabilized). DESIGN.md "Membership changes".
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`] (`NotMaster`,
    /// `VoterChangeRefused`, `ChangeInProgress`, `StoreCatchingUp`, `Unauthorized`, ...).
    pub async fn change_voters(
        &self,
        change: quire_proto::VoterChangeRequest,
    ) -> Result<(), ClientError> {
        match self.request(Body::VoterChangeRequest(change)).await?.body {
            Body::AdminResponse(_) => Ok(()),
            other => Err(remote_or_unexpected(FrameType::VoterChangeRequest, other)),
        }
    }

    /// The topics the broker's state holds, by name.
    ///
    /// # Errors
    /// As [`BrokerClient::metadata`].
    pub async fn topics(&self) -> Result<Vec<String>, ClientError> {
        let body = MetadataRequest { topics: true }.into();
        match self.request(body).await?.body {
            Body::MetadataResponse(r) => Ok(r.topics),
            other => Err(remote_or_unexpected(FrameType::MetadataRequest, other)),
        }
    }

    /// The users and ACL entries the broker applied (any broker answers).
    ///
    /// # Errors
    /// A lost connection, [`ClientError::Timeout`], [`ClientError::Remote`]
    /// (`Unauthorized`).
    pub async fn describe_security(
        &self,
    ) -> Result<quire_proto::DescribeSecurityResponse, ClientError> {
        let body = Body::DescribeSecurityRequest(quire_proto::DescribeSecurityRequest);
        match self.request(body).await?.body {
            Body::DescribeSecurityResponse(r) => Ok(r),
            other => Err(remote_or_unexpected(
                FrameType::DescribeSecurityRequest,
                other,
            )),
        }
    }

    /// Sends any request body and returns the answer frame (`ErrorResponse` included).
    ///
    /// # Errors
    /// [`ClientError::Wire`], a lost connection, [`ClientError::Timeout`].
    pub async fn request(&self, body: Body) -> Result<Frame, ClientError> {
        self.conn.send(body).await?.wait().await
    }
}
