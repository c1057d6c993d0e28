//! One Kafka client connection: size-prefixed requests in, size-prefixed answers out, one
//! request at a time (Kafka's rule, so answers keep the requests' order).
//!
//! A request for an API ApiVersions does not announce, or at a version outside the
//! announced range, is answered with `UNSUPPORTED_VERSION` ([`crate::unsupported`]), and
//! ApiVersions itself at an unknown version at version 0 with the supported ranges
//! (KIP-511), so a newer client can fall back.
//!
//! Bad input closes the connection (Kafka does the same, as a client cannot resynchronize
//! a stream it framed wrongly): a size prefix below 8 bytes or above
//! `request_bytes_max`, an API key or version the codec does not know (so no response
//! can be framed for it), or a header or request that does not decode. Each closing is
//! logged at debug with the peer and the reason; nothing a client sends reaches the broker
//! before its request decodes whole.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ProduceRequest, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::api::{self, Answer, KafkaRequest};
use crate::sasl;
use crate::{Backend, Client, KafkaSettings, Listener};

/// Bytes of a request before its header's variable part: size is not counted; api key
/// (2), version (2), correlation id (4).
const FIXED_HEADER_BYTES: usize = 8;

/// Requests of one connection being served at once, at most: they are read ahead and
/// answered in order (the reader waits beyond it).
pub const PIPELINE_MAX: usize = 16;
/// Bytes of a request body read (and taken from the read budget) at a time, so a client
/// that announces a large request and sends nothing holds no more than this.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// A request read and started, whose answer the writer waits for in turn.
struct InFlight {
    correlation_id: i32,
    header_version: i16,
    what: String,
    answer: api::Finishing,
    /// Its share of the read budget (the listener's and the connection's), given back once
    /// answered.
    _budget: Held,
}

/// Read-budget permits a request holds: the listener-wide budget's and its connection's.
type Held = (
    tokio::sync::OwnedSemaphorePermit,
    tokio::sync::OwnedSemaphorePermit,
);

/// Serves `stream` until the client closes it, sends something unusable, or is idle too
/// long. Requests are read ahead, up to [`PIPELINE_MAX`]: a produce is handed to the broker
/// as it is read (so a connection's produces reach the log in the order sent), and the
/// answers are written in the order of the requests, as Kafka requires.
pub(crate) async fn serve<B: Backend>(
    stream: quire_tls::Stream,
    peer: SocketAddr,
    backend: B,
    shared: &Arc<Listener>,
    budget: &Arc<Semaphore>,
) {
    let settings = &shared.settings;
    let client_host = peer.ip().to_string();
    let _ = stream.tcp().set_nodelay(true);
    let (mut r, mut w) = stream.into_split();
    let mut backend = backend;
    let mut sasl_state = sasl::Sasl::default();
    tracing::debug!(%peer, "Kafka client connected");
    let (tx, mut rx) = tokio::sync::mpsc::channel::<InFlight>(PIPELINE_MAX);
    // What one connection's requests may hold of the listener's read budget at once: one
    // largest request. Answers the client does not read keep theirs (a break-it trial's
    // client that never read held all 64 MiB, and every other client waited).
    let own = Arc::new(Semaphore::new(
        settings.request_bytes_max.min(settings.read_budget_bytes),
    ));
    let write_timeout = settings.request_timeout;
    let writer = tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            let answer = match f.answer.await {
                Ok(a) => a,
                Err(e) => return format!("{}: {e:#}", f.what),
            };
            let body = match answer {
                Answer::None => continue,
                Answer::Body(body) => body,
            };
            let frame = match frame(f.correlation_id, f.header_version, |buf| {
                buf.extend_from_slice(&body);
                Ok(())
            }) {
                Ok(frame) => frame,
                Err(why) => return why,
            };
            // A client that stops reading its answers is dropped once one has waited this
            // long, and so gives back its share of the read budget.
            match tokio::time::timeout(write_timeout, w.write_all(&frame)).await {
                Err(_) => return "an answer not read in time".to_owned(),
                Ok(Err(e)) => return format!("write failed: {e}"),
                Ok(Ok(())) => {}
            }
        }
        "closed".to_owned()
    });
    let why = loop {
        let mut size = [0u8; 4];
        match tokio::time::timeout(settings.idle_timeout, r.read_exact(&mut size)).await {
            Err(_) => break "idle".to_owned(),
            Ok(Err(_)) => break "closed".to_owned(),
            Ok(Ok(_)) => {}
        }
        let size = i32::from_be_bytes(size);
        let Ok(len) = usize::try_from(size) else {
            break format!("negative request size {size}");
        };
        if len < FIXED_HEADER_BYTES || len > settings.request_bytes_max {
            break format!(
                "request size {len} outside {FIXED_HEADER_BYTES}..={}",
                settings.request_bytes_max
            );
        }
        let (buf, permit) = match read_body(&mut r, len, settings, budget, &own).await {
            Ok(b) => b,
            Err(why) => break why,
        };
        let decoded = match decode_request(buf.freeze()) {
            Ok(d) => d,
            Err(why) => break why,
        };
        let mut close = None;
        let (correlation_id, header_version, what, answer) = match decoded {
            Decoded::Request {
                version,
                correlation_id,
                api_key,
                request,
                ..
            } if matches!(
                *request,
                KafkaRequest::SaslHandshake(_) | KafkaRequest::SaslAuthenticate(_)
            ) =>
            {
                // Answered here, in order: a login changes who the connection's later
                // requests are made for.
                let (answer, user, failed) = match *request {
                    KafkaRequest::SaslHandshake(req) => {
                        let a = sasl::handshake(&mut sasl_state, &req);
                        (api::encoded(&a.response, version), a.user, a.close)
                    }
                    KafkaRequest::SaslAuthenticate(req) => {
                        let a = sasl::authenticate(&backend, &mut sasl_state, peer.ip(), &req);
                        (api::encoded(&a.response, version), a.user, a.close)
                    }
                    _ => unreachable!("matched above"),
                };
                if let Some(user) = user {
                    tracing::debug!(%peer, %user, "Kafka client logged in");
                    backend = backend.for_user(user);
                }
                if failed {
                    close = Some(format!("{api_key:?} refused"));
                }
                let answer: api::Finishing = if failed {
                    Box::pin(async move {
                        tokio::time::sleep(sasl::FAILURE_DELAY).await;
                        answer
                    })
                } else {
                    Box::pin(std::future::ready(answer))
                };
                (
                    correlation_id,
                    api_key.response_header_version(version),
                    format!("{api_key:?} v{version}"),
                    answer,
                )
            }
            other => match start(&backend, shared, &client_host, other).await {
                Ok(s) => s,
                Err(why) => break why,
            },
        };
        let f = InFlight {
            correlation_id,
            header_version,
            what,
            answer,
            _budget: permit,
        };
        if tx.send(f).await.is_err() {
            break "the writer stopped".to_owned();
        }
        if let Some(why) = close {
            break why;
        }
    };
    drop(tx);
    // Answers already started are written, then the connection closes.
    let written = writer
        .await
        .unwrap_or_else(|e| format!("writer failed: {e}"));
    tracing::debug!(%peer, reason = %why, writer = %written, "Kafka client connection closed");
}

/// Reads a `len`-byte request body, taking the read budget as bytes arrive: the
/// connection's own (`own`) first, then the listener's (`budget`).
async fn read_body(
    r: &mut quire_tls::ReadHalf,
    len: usize,
    settings: &KafkaSettings,
    budget: &Arc<Semaphore>,
    own: &Arc<Semaphore>,
) -> Result<(BytesMut, Held), String> {
    let deadline = tokio::time::Instant::now() + settings.request_timeout;
    let mut buf = BytesMut::with_capacity(len.min(READ_CHUNK_BYTES));
    let mut held: Option<Held> = None;
    while buf.len() < len {
        let n = (len - buf.len()).min(READ_CHUNK_BYTES);
        // n ≤ 64 KiB: fits the budgets' u32 permits.
        let n32 = u32::try_from(n).unwrap_or(u32::MAX);
        let take = async {
            let mine = own.clone().acquire_many_owned(n32).await?;
            let shared = budget.clone().acquire_many_owned(n32).await?;
            Ok::<_, tokio::sync::AcquireError>((shared, mine))
        };
        let permit = match tokio::time::timeout_at(deadline, take).await {
            Err(_) => return Err("request not whole in time (read budget)".to_owned()),
            Ok(Err(_)) => return Err("stopping".to_owned()),
            Ok(Ok(p)) => p,
        };
        match held.as_mut() {
            Some(h) => {
                h.0.merge(permit.0);
                h.1.merge(permit.1);
            }
            None => held = Some(permit),
        }
        let start = buf.len();
        buf.resize(start + n, 0);
        match tokio::time::timeout_at(deadline, r.read_exact(&mut buf[start..])).await {
            Err(_) => return Err("request not whole in time".to_owned()),
            Ok(Err(_)) => return Err("closed inside a request".to_owned()),
            Ok(Ok(_)) => {}
        }
    }
    let held = held.ok_or_else(|| "empty request".to_owned())?;
    Ok((buf, held))
}

/// A request as read off a connection.
#[derive(Debug)]
pub enum Decoded {
    /// A request to serve: its API version, correlation id and body.
    Request {
        /// The request's API version.
        version: i16,
        /// The request's correlation id (echoed in the answer).
        correlation_id: i32,
        /// The API key.
        api_key: ApiKey,
        /// The body.
        request: Box<KafkaRequest>,
        /// The request header's `client_id` (empty for none).
        client_id: String,
    },
    /// ApiVersions at a version this listener does not serve: answered at version 0 with
    /// `UNSUPPORTED_VERSION` and the supported ranges (KIP-511).
    UnsupportedApiVersions {
        /// The request's correlation id.
        correlation_id: i32,
    },
    /// A request for an API not served, or at a version outside the served range, but
    /// one the codec reads: answered with `UNSUPPORTED_VERSION` ([`crate::unsupported`]).
    Unsupported {
        /// The request's correlation id.
        correlation_id: i32,
        /// The API key.
        api_key: ApiKey,
        /// The request's API version.
        version: i16,
        /// The response body, encoded at `version`; `None` for a produce with `acks=0`,
        /// which is never answered.
        answer: Option<BytesMut>,
    },
}

/// Decodes one request (its bytes after the size prefix): header and body, without
/// serving it. Pure; what the fuzz target and the property tests drive.
///
/// # Errors
/// Why the connection must be closed: fewer than 8 bytes, an API key or version the codec
/// does not know, an API only brokers send each other, or a header or body that does not
/// decode.
pub fn decode_request(mut bytes: Bytes) -> Result<Decoded, String> {
    if bytes.len() < FIXED_HEADER_BYTES {
        return Err(format!("a request of {} bytes has no header", bytes.len()));
    }
    let key = i16::from_be_bytes([bytes[0], bytes[1]]);
    let version = i16::from_be_bytes([bytes[2], bytes[3]]);
    let correlation_id = i32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let Ok(api_key) = ApiKey::try_from(key) else {
        return Err(format!("unknown API key {key}"));
    };
    let served =
        api::supported_versions(api_key).is_some_and(|(lo, hi)| (lo..=hi).contains(&version));
    if !served && api_key == ApiKey::ApiVersions {
        return Ok(Decoded::UnsupportedApiVersions { correlation_id });
    }
    let codec = api_key.valid_versions();
    if version < codec.min || version > codec.max {
        return Err(format!(
            "{api_key:?} v{version} is outside what the codec reads ({}..={})",
            codec.min, codec.max
        ));
    }
    let header_version = api_key.request_header_version(version);
    let header = RequestHeader::decode(&mut bytes, header_version)
        .map_err(|e| format!("{api_key:?} v{version}: bad request header: {e}"))?;
    if !served {
        if !crate::unsupported::answerable(api_key) {
            return Err(format!("{api_key:?} is not served on a client listener"));
        }
        if bytes.len() > crate::unsupported::REQUEST_BYTES_MAX {
            return Err(format!(
                "{api_key:?} v{version} (not served) of {} bytes: at most {} are answered",
                bytes.len(),
                crate::unsupported::REQUEST_BYTES_MAX
            ));
        }
        let unanswered = api_key == ApiKey::Produce
            && ProduceRequest::decode(&mut bytes.clone(), version).is_ok_and(|p| p.acks == 0);
        let answer = crate::unsupported::answer(api_key, version, bytes)
            .map_err(|e| format!("{api_key:?} v{version} (not served): {e:#}"))?;
        let answer = (!unanswered).then_some(answer);
        return Ok(Decoded::Unsupported {
            correlation_id,
            api_key,
            version,
            answer,
        });
    }
    let request = api::decode_body(api_key, version, bytes)
        .map_err(|e| format!("{api_key:?} v{version}: {e:#}"))?;
    Ok(Decoded::Request {
        version,
        correlation_id,
        api_key,
        request: Box::new(request),
        client_id: header.client_id.map(|c| c.to_string()).unwrap_or_default(),
    })
}

/// Decodes one request and starts it: its correlation id, response header version, a
/// name for logs, and the answer to come (an ApiVersions at a version not served is
/// answered at once, at version 0).
async fn start<B: Backend>(
    backend: &B,
    shared: &Arc<Listener>,
    client_host: &str,
    decoded: Decoded,
) -> Result<(i32, i16, String, api::Finishing), String> {
    match decoded {
        Decoded::UnsupportedApiVersions { correlation_id } => {
            let mut body = BytesMut::new();
            api::api_versions_unsupported()
                .encode(&mut body, 0)
                .map_err(|e| format!("cannot encode ApiVersions: {e}"))?;
            let answer: api::Finishing = Box::pin(std::future::ready(Ok(Answer::Body(body))));
            Ok((correlation_id, 0, "ApiVersions".to_owned(), answer))
        }
        Decoded::Unsupported {
            correlation_id,
            api_key,
            version,
            answer,
        } => {
            tracing::debug!(?api_key, version, "answered UNSUPPORTED_VERSION");
            let answer = answer.map_or(Answer::None, Answer::Body);
            let answer: api::Finishing = Box::pin(std::future::ready(Ok(answer)));
            Ok((
                correlation_id,
                api_key.response_header_version(version),
                format!("{api_key:?} v{version} (not served)"),
                answer,
            ))
        }
        Decoded::Request {
            version,
            correlation_id,
            api_key,
            request,
            client_id,
        } => {
            let client = Client {
                id: client_id,
                host: client_host.to_owned(),
            };
            let answer = api::start(backend, shared, client, version, *request).await;
            Ok((
                correlation_id,
                api_key.response_header_version(version),
                format!("{api_key:?} v{version}"),
                answer,
            ))
        }
    }
}

/// A response frame: size, response header, and the body `encode` writes.
fn frame(
    correlation_id: i32,
    header_version: i16,
    encode: impl FnOnce(&mut BytesMut) -> anyhow::Result<()>,
) -> Result<Bytes, String> {
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, header_version)
        .map_err(|e| format!("cannot encode the response header: {e}"))?;
    encode(&mut buf).map_err(|e| format!("cannot encode the response: {e}"))?;
    let size = i32::try_from(buf.len() - 4).map_err(|_| "response over 2 GiB".to_owned())?;
    buf[..4].copy_from_slice(&size.to_be_bytes());
    Ok(buf.freeze())
}
