//! One Kafka client connection: size-prefixed requests in, size-prefixed answers out, one
//! request at a time (Kafka's rule, so answers keep the requests' order).
//!
//! Bad input closes the connection (Kafka does the same, as a client cannot resynchronize
//! a stream it framed wrongly): a size prefix below 8 bytes or above
//! `request_bytes_max`, an unknown API key, a header or request that does not decode, or a
//! version outside what ApiVersions announced — except ApiVersions itself, which at an
//! unknown version is answered at version 0 with `UNSUPPORTED_VERSION` and the supported
//! ranges (KIP-511), so a newer client can fall back. Each closing is logged at debug with
//! the peer and the reason; nothing a client sends reaches the broker before its request
//! decodes whole.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::api::{self, Answer, KafkaRequest};
use crate::{Backend, KafkaSettings};

/// Bytes of a request before its header's variable part: size is not counted; api key
/// (2), version (2), correlation id (4).
const FIXED_HEADER_BYTES: usize = 8;

/// Serves `stream` until the client closes it, sends something unusable, or is idle too
/// long.
pub(crate) async fn serve<B: Backend>(
    stream: TcpStream,
    peer: SocketAddr,
    backend: B,
    settings: &Arc<KafkaSettings>,
    budget: &Arc<Semaphore>,
) {
    let _ = stream.set_nodelay(true);
    let (mut r, mut w) = stream.into_split();
    tracing::debug!(%peer, "Kafka client connected");
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
        // ≤ request_bytes_max, which the settings keep under the budget's u32 range.
        let Ok(permit) = budget
            .clone()
            .acquire_many_owned(u32::try_from(len).unwrap_or(u32::MAX))
            .await
        else {
            break "stopping".to_owned();
        };
        let mut buf = BytesMut::zeroed(len);
        match tokio::time::timeout(settings.request_timeout, r.read_exact(&mut buf)).await {
            Err(_) => break "request not whole in time".to_owned(),
            Ok(Err(_)) => break "closed inside a request".to_owned(),
            Ok(Ok(_)) => {}
        }
        let bytes = buf.freeze();
        let answer = match decode_and_serve(&backend, settings, bytes).await {
            Ok(a) => a,
            Err(why) => break why,
        };
        drop(permit);
        if let Some(frame) = answer {
            if let Err(e) = w.write_all(&frame).await {
                break format!("write failed: {e}");
            }
        }
    };
    tracing::debug!(%peer, reason = %why, "Kafka client connection closed");
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
    },
    /// ApiVersions at a version this listener does not serve: answered at version 0 with
    /// `UNSUPPORTED_VERSION` and the supported ranges (KIP-511).
    UnsupportedApiVersions {
        /// The request's correlation id.
        correlation_id: i32,
    },
}

/// Decodes one request (its bytes after the size prefix): header and body, without
/// serving it. Pure; what the fuzz target and the property tests drive.
///
/// # Errors
/// Why the connection must be closed: fewer than 8 bytes, an unknown API key, an API not
/// served, a version outside the announced range, or a header or body that does not
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
    let Some(range) = api::supported_versions(api_key) else {
        return Err(format!("{api_key:?} is not supported (docs/kafka.md)"));
    };
    if version < range.0 || version > range.1 {
        if api_key == ApiKey::ApiVersions {
            return Ok(Decoded::UnsupportedApiVersions { correlation_id });
        }
        return Err(format!(
            "{api_key:?} v{version} is outside the supported {}..={}",
            range.0, range.1
        ));
    }
    let header_version = api_key.request_header_version(version);
    RequestHeader::decode(&mut bytes, header_version)
        .map_err(|e| format!("{api_key:?} v{version}: bad request header: {e}"))?;
    let request = api::decode_body(api_key, version, bytes)
        .map_err(|e| format!("{api_key:?} v{version}: {e:#}"))?;
    Ok(Decoded::Request {
        version,
        correlation_id,
        api_key,
        request: Box::new(request),
    })
}

/// Decodes one request, serves it, and encodes the answer frame (size prefix included);
/// `Ok(None)` for a request that gets no answer (a produce with `acks=0`).
async fn decode_and_serve<B: Backend>(
    backend: &B,
    settings: &KafkaSettings,
    bytes: Bytes,
) -> Result<Option<Bytes>, String> {
    let (version, correlation_id, api_key, request) = match decode_request(bytes)? {
        Decoded::UnsupportedApiVersions { correlation_id } => {
            let body = api::api_versions_unsupported();
            return frame(correlation_id, 0, |buf| body.encode(buf, 0)).map(Some);
        }
        Decoded::Request {
            version,
            correlation_id,
            api_key,
            request,
        } => (version, correlation_id, api_key, request),
    };
    let answer = api::serve(backend, settings, version, *request)
        .await
        .map_err(|e| format!("{api_key:?} v{version}: {e}"))?;
    let header_version = api_key.response_header_version(version);
    match answer {
        Answer::None => Ok(None),
        Answer::Body(body) => frame(correlation_id, header_version, |buf| {
            buf.extend_from_slice(&body);
            Ok(())
        })
        .map(Some),
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
