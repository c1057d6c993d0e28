//! SASL on the Kafka listener: SaslHandshake (version 1) and SaslAuthenticate (0–2)
//! carrying SCRAM-SHA-256 (RFC 5802, RFC 7677; Kafka's KIP-84), checked against the
//! cluster's users — the same credentials `quire user add` stores and the native listener
//! checks — so that a Kafka client logs in as a user and the broker's ACL entries for
//! that user apply to it.
//!
//! Logging in is optional, as on the native listener: a connection that does not is
//! `ANONYMOUS` (or the holder of its verified client certificate), and ACLs decide what
//! that may do. A failed exchange is answered `SASL_AUTHENTICATION_FAILED` and the
//! connection closed (Kafka's behaviour); an address with too many failures is refused
//! for the rest of the broker's window, as on the native listener.

use std::net::IpAddr;

use bytes::Bytes;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use quire_proto::SASL_MESSAGE_BYTES_MAX;
use quire_tls::scram::{ScramServer, MECHANISM};

/// How long a failed login's answer waits (the native listener's delay: each guess costs
/// the guesser that long on its connection).
pub(crate) const FAILURE_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

use crate::Backend;

/// Where a connection's SASL exchange is.
#[derive(Debug, Default)]
pub(crate) enum Sasl {
    /// Nothing asked yet.
    #[default]
    Idle,
    /// SaslHandshake chose SCRAM-SHA-256: the client-first message comes next.
    Handshaken,
    /// The server-first message was sent: the client-final message comes next.
    Challenged(Box<ScramServer>),
    /// Logged in (a second login is refused).
    Done,
}

/// The outcome of one SASL request.
pub(crate) struct SaslAnswer<T> {
    /// The response.
    pub response: T,
    /// The user logged in by this request.
    pub user: Option<String>,
    /// Close the connection after the answer (a failed login).
    pub close: bool,
}

/// SaslHandshake: SCRAM-SHA-256 is the one mechanism.
pub(crate) fn handshake(
    state: &mut Sasl,
    req: &SaslHandshakeRequest,
) -> SaslAnswer<SaslHandshakeResponse> {
    let mechanisms = vec![StrBytes::from_static_str(MECHANISM)];
    let (error, close) = if !matches!(state, Sasl::Idle) {
        (Some(ResponseError::IllegalSaslState), true)
    } else if &*req.mechanism != MECHANISM {
        (Some(ResponseError::UnsupportedSaslMechanism), true)
    } else {
        *state = Sasl::Handshaken;
        (None, false)
    };
    SaslAnswer {
        response: SaslHandshakeResponse::default()
            .with_error_code(error.map_or(0, |e| e.code()))
            .with_mechanisms(mechanisms),
        user: None,
        close,
    }
}

/// SaslAuthenticate: one step of the SCRAM exchange for a client at `ip`.
pub(crate) fn authenticate<B: Backend>(
    backend: &B,
    state: &mut Sasl,
    ip: IpAddr,
    req: &SaslAuthenticateRequest,
) -> SaslAnswer<SaslAuthenticateResponse> {
    let fail = |e: ResponseError, why: String| SaslAnswer {
        response: SaslAuthenticateResponse::default()
            .with_error_code(e.code())
            .with_error_message(Some(StrBytes::from_string(why))),
        user: None,
        close: true,
    };
    // Checked at every step, the proof's included: exchanges staged on many connections
    // before the address was blocked get no more guesses (found by a break-it trial).
    if let Some(left) = backend.login_blocked(ip) {
        *state = Sasl::Done;
        return fail(
            ResponseError::SaslAuthenticationFailed,
            format!(
                "too many failed logins from this address: try again in {} s",
                left.as_secs() + 1
            ),
        );
    }
    // A SCRAM message is a few hundred bytes; the server keeps the client-first message
    // until the exchange ends, so a long one would be held (a trial parked 46 MB a
    // connection with 15 MiB nonces).
    if req.auth_bytes.len() > SASL_MESSAGE_BYTES_MAX {
        backend.login_failed(ip);
        return fail(
            ResponseError::SaslAuthenticationFailed,
            format!("a SASL message of more than {SASL_MESSAGE_BYTES_MAX} bytes"),
        );
    }
    let Ok(message) = std::str::from_utf8(&req.auth_bytes) else {
        backend.login_failed(ip);
        return fail(
            ResponseError::SaslAuthenticationFailed,
            "the SASL message is not UTF-8".to_owned(),
        );
    };
    match std::mem::take(state) {
        Sasl::Handshaken => {
            match ScramServer::client_first(message, |u| backend.scram_credential(u)) {
                Ok((server, first)) => {
                    *state = Sasl::Challenged(Box::new(server));
                    SaslAnswer {
                        response: SaslAuthenticateResponse::default()
                            .with_auth_bytes(Bytes::from(first)),
                        user: None,
                        close: false,
                    }
                }
                Err(e) => {
                    backend.login_failed(ip);
                    fail(ResponseError::SaslAuthenticationFailed, e.to_string())
                }
            }
        }
        Sasl::Challenged(server) => match server.client_final(message) {
            Ok((user, last)) => {
                *state = Sasl::Done;
                SaslAnswer {
                    response: SaslAuthenticateResponse::default()
                        .with_auth_bytes(Bytes::from(last)),
                    user: Some(user),
                    close: false,
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "Kafka client's SCRAM proof refused");
                backend.login_failed(ip);
                // An unknown user and a wrong password read alike.
                fail(
                    ResponseError::SaslAuthenticationFailed,
                    "authentication failed: unknown user or wrong password".to_owned(),
                )
            }
        },
        other @ (Sasl::Idle | Sasl::Done) => {
            *state = other;
            fail(
                ResponseError::IllegalSaslState,
                "SaslAuthenticate outside an exchange (SaslHandshake first, once)".to_owned(),
            )
        }
    }
}
