//! [`ClientError`]: every way a request of this crate can fail.

use std::io;
use std::sync::Arc;

use quire_proto::{ErrorResponse, FrameType, WireError};

/// Why a client call failed. `Clone`: when a connection dies, every request in flight on
/// it gets the same error.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ClientError {
    /// The TCP connect failed.
    #[error("connect to {addr}: {source}")]
    Connect {
        /// The address dialled.
        addr: String,
        /// The socket error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The TCP connect did not complete in time.
    #[error("connect to {addr}: no answer within {timeout_ms} ms")]
    ConnectTimeout {
        /// The address dialled.
        addr: String,
        /// The bound that ran out, in milliseconds.
        timeout_ms: u64,
    },
    /// Reading or writing the socket failed; the connection is closed.
    #[error("connection to {addr}: {op}: {source}")]
    Io {
        /// The peer.
        addr: String,
        /// What was being done (`"read"`, `"write"`).
        op: &'static str,
        /// The socket error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The connection is closed (by the peer, after an error, or because the client was
    /// dropped); `reason` says which.
    #[error("connection to {addr} closed: {reason}")]
    Closed {
        /// The peer.
        addr: String,
        /// Why.
        reason: String,
    },
    /// No response arrived within the request timeout. The request may still take effect
    /// on the peer.
    #[error("request {request_id} to {addr}: no response within {timeout_ms} ms")]
    Timeout {
        /// The peer.
        addr: String,
        /// The request's id.
        request_id: u64,
        /// The bound that ran out, in milliseconds.
        timeout_ms: u64,
    },
    /// Encoding a request failed, or a response could not be decoded.
    #[error("wire: {0}")]
    Wire(#[from] WireError),
    /// The peer answered with an `ErrorResponse`.
    #[error("peer answered {}: {}", .0.code, .0.message)]
    Remote(Box<ErrorResponse>),
    /// The peer answered with a frame that does not answer this request.
    #[error("a {request:?} was answered with a {response:?}")]
    UnexpectedResponse {
        /// The request's frame type.
        request: FrameType,
        /// The response's frame type.
        response: FrameType,
    },
    /// The caller passed something this call does not send (e.g. an encoded body of the
    /// wrong frame type).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl ClientError {
    /// `true` when the connection is unusable after this error (reconnect to retry).
    #[must_use]
    pub fn is_connection_lost(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::ConnectTimeout { .. }
                | ClientError::Io { .. }
                | ClientError::Closed { .. }
        )
    }
}
