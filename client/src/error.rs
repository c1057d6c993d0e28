//! [`ClientError`]: every way a request of this crate can fail, and how the broker
//! clients sort failures into "retry against the master" and "give up"
//! ([`ClientError::disposition`]).

use std::io;
use std::sync::Arc;

use quire_proto::{
    Body, BrokerInfo, ErrorCode, ErrorDetail, ErrorResponse, FrameType, Offset, WireError,
};

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
    /// The offset asked for was deleted by retention (a broker's `Trimmed` answer to a
    /// fetch, or a store's read answered with its first offset above the one asked):
    /// read from `first_offset` on. Not retried: asking again cannot help.
    #[error("offset {requested} was trimmed by retention; the log starts at {first_offset}")]
    Trimmed {
        /// The offset asked for.
        requested: Offset,
        /// The lowest offset still held.
        first_offset: Offset,
    },
    /// The caller passed something this call does not send (e.g. an encoded body of the
    /// wrong frame type, an empty topic name, a message above `MESSAGE_BYTES_MAX`).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A setting is out of its range (the message names it and the range).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// Discovery found no broker that says it is the master, within its bound.
    #[error(
        "no master found among {brokers} broker address(es) after {rounds} round(s) in {elapsed_ms} ms{}",
        last_suffix(.last)
    )]
    NoMaster {
        /// Broker addresses known (given and learned).
        brokers: usize,
        /// Discovery rounds made (each asks every known broker).
        rounds: u32,
        /// Time spent, in milliseconds.
        elapsed_ms: u64,
        /// The last error met (a refused connect, a broker naming no master, ...).
        last: Option<Box<ClientError>>,
    },
    /// A request kept failing with retriable errors (lost master, `NotMaster`, `Timeout`,
    /// `NoQuorum`, ...) until its retry bound ran out.
    #[error("{op}: gave up after {attempts} attempt(s) in {elapsed_ms} ms: {last}")]
    RetriesExhausted {
        /// What was being done (`"fetch"`, `"commit cursor"`, ...).
        op: &'static str,
        /// Attempts made.
        attempts: u32,
        /// Time spent, in milliseconds.
        elapsed_ms: u64,
        /// The last error.
        last: Box<ClientError>,
    },
}

fn last_suffix(last: &Option<Box<ClientError>>) -> String {
    match last {
        Some(e) => format!("; last error: {e}"),
        None => String::new(),
    }
}

/// What a broker client does after a failed request ([`ClientError::disposition`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Find the master again (starting at `hint` when the broker named one), wait a
    /// backoff, and send the request again. The request may or may not have taken effect.
    Retry {
        /// The master a `NotMaster` answer named.
        hint: Option<BrokerInfo>,
    },
    /// Sending it again cannot help: report the error.
    Fatal,
}

impl ClientError {
    /// `true` when TLS refused the connection for a reason waiting will not fix: the
    /// server's certificate is not of the CA given or does not name the role expected, the
    /// server wants a client certificate this client lacks or does not accept the one it
    /// shows, or one side speaks TLS and the other does not. These are
    /// [`io::ErrorKind::PermissionDenied`] errors of [`ClientError::Connect`] or
    /// [`ClientError::Io`] (the connection sets that kind). Kafka's clients treat an SSL
    /// authentication failure the same way: not retried. A failed SASL login
    /// ([`crate::Connection::authenticate`]: an unknown user, a wrong password) is one too.
    #[must_use]
    pub fn is_tls_refusal(&self) -> bool {
        match self {
            ClientError::Connect { source, .. } | ClientError::Io { source, .. } => {
                source.kind() == io::ErrorKind::PermissionDenied
            }
            ClientError::RetriesExhausted { last, .. } => last.is_tls_refusal(),
            ClientError::NoMaster {
                last: Some(last), ..
            } => last.is_tls_refusal(),
            _ => false,
        }
    }

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

    /// The broker's error code, when the peer answered with an `ErrorResponse`.
    #[must_use]
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Remote(e) => Some(e.code),
            ClientError::Trimmed { .. } => Some(ErrorCode::Trimmed),
            ClientError::RetriesExhausted { last, .. } => last.code(),
            _ => None,
        }
    }

    /// Whether a broker request that failed this way is worth sending again, to the
    /// master found anew:
    ///
    /// - retry: a lost or refused connection, no response in time, no master found, and
    ///   the broker codes `NotMaster` (with its hint), `Timeout`, `NoQuorum`,
    ///   `Overloaded`, `ShuttingDown`, `Internal` (the broker says "retry" with it);
    /// - fatal: every other code (`MessageTooLarge`, `InvalidName`, `SequenceGap`,
    ///   `Malformed`, ...), undecodable or unexpected answers, invalid requests.
    #[must_use]
    pub fn disposition(&self) -> Disposition {
        match self {
            ClientError::Connect { .. }
            | ClientError::ConnectTimeout { .. }
            | ClientError::Io { .. }
            | ClientError::Closed { .. }
            | ClientError::Timeout { .. }
            | ClientError::NoMaster { .. } => Disposition::Retry { hint: None },
            ClientError::Remote(e) => match e.code {
                ErrorCode::NotMaster => Disposition::Retry {
                    hint: match &e.detail {
                        ErrorDetail::NotMaster { master, .. } => master.clone(),
                        _ => None,
                    },
                },
                ErrorCode::Timeout
                | ErrorCode::NoQuorum
                | ErrorCode::Overloaded
                | ErrorCode::ShuttingDown
                | ErrorCode::ConnectionTimeout
                | ErrorCode::Internal => Disposition::Retry { hint: None },
                _ => Disposition::Fatal,
            },
            ClientError::Wire(_)
            | ClientError::Trimmed { .. }
            | ClientError::UnexpectedResponse { .. }
            | ClientError::InvalidRequest(_)
            | ClientError::InvalidConfig(_)
            | ClientError::RetriesExhausted { .. } => Disposition::Fatal,
        }
    }
}

impl ClientError {
    /// `Some(first_offset)` when the request failed because retention deleted the offset
    /// asked for ([`ClientError::Trimmed`], or a `Trimmed` error answer that gave up a retry
    /// loop).
    #[must_use]
    pub fn trimmed_first_offset(&self) -> Option<Offset> {
        match self {
            ClientError::Trimmed { first_offset, .. } => Some(*first_offset),
            ClientError::Remote(e) => match e.detail {
                ErrorDetail::Trimmed { first_offset } => Some(first_offset),
                _ => None,
            },
            ClientError::RetriesExhausted { last, .. } => last.trimmed_first_offset(),
            _ => None,
        }
    }

    /// `Some(offset)` when a store answered that its copy of the record at `offset` is
    /// corrupt ([`ErrorCode::Corrupt`]): read that offset from another store.
    #[must_use]
    pub fn corrupt_offset(&self) -> Option<Offset> {
        match self {
            ClientError::Remote(e) => match e.detail {
                ErrorDetail::Corrupt { offset } if e.code == ErrorCode::Corrupt => Some(offset),
                _ => None,
            },
            _ => None,
        }
    }

    /// A broker's or store's error answer to a read from `requested`, typed: a `Trimmed`
    /// answer becomes [`ClientError::Trimmed`], anything else [`ClientError::Remote`].
    #[must_use]
    pub fn from_read_error(requested: Offset, e: ErrorResponse) -> ClientError {
        match e.detail {
            ErrorDetail::Trimmed { first_offset } if e.code == ErrorCode::Trimmed => {
                ClientError::Trimmed {
                    requested,
                    first_offset,
                }
            }
            _ => ClientError::Remote(Box::new(e)),
        }
    }
}

/// The error for a response body that does not answer `request`: the peer's
/// `ErrorResponse` as [`ClientError::Remote`], anything else as
/// [`ClientError::UnexpectedResponse`].
pub(crate) fn remote_or_unexpected(request: FrameType, body: Body) -> ClientError {
    match body {
        Body::ErrorResponse(e) => ClientError::Remote(Box::new(e)),
        other => ClientError::UnexpectedResponse {
            request,
            response: other.frame_type(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_proto::{BrokerId, Epoch};

    #[test]
    fn dispositions_follow_the_error_codes() {
        let remote = |code| ClientError::Remote(Box::new(ErrorResponse::new(code, "x")));
        for code in [
            ErrorCode::Timeout,
            ErrorCode::NoQuorum,
            ErrorCode::Overloaded,
            ErrorCode::ShuttingDown,
            ErrorCode::ConnectionTimeout,
            ErrorCode::Internal,
        ] {
            assert_eq!(
                remote(code).disposition(),
                Disposition::Retry { hint: None },
                "{code}"
            );
        }
        for code in [
            ErrorCode::MessageTooLarge,
            ErrorCode::InvalidName,
            ErrorCode::SequenceGap,
            ErrorCode::Malformed,
            ErrorCode::UnexpectedFrame,
        ] {
            assert_eq!(remote(code).disposition(), Disposition::Fatal, "{code}");
            assert_eq!(remote(code).code(), Some(code));
        }
        let hint = BrokerInfo {
            id: BrokerId(2),
            addr: "b2:1".into(),
        };
        let not_master = ClientError::Remote(Box::new(ErrorResponse::not_master(
            Epoch(5),
            Some(hint.clone()),
        )));
        assert_eq!(
            not_master.disposition(),
            Disposition::Retry { hint: Some(hint) }
        );
        let lost = ClientError::Closed {
            addr: "a".into(),
            reason: "r".into(),
        };
        assert_eq!(lost.disposition(), Disposition::Retry { hint: None });
        assert_eq!(lost.code(), None);
        assert_eq!(
            ClientError::InvalidRequest("x".into()).disposition(),
            Disposition::Fatal
        );
    }
}
