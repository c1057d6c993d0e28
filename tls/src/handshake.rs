//! TLS handshakes through rustls's unbuffered API: rustls decides every message, this module
//! moves bytes between it and the socket, in a buffer of its own. Whatever the peer sent
//! after the handshake stays in that buffer (ciphertext, or application data rustls already
//! decrypted) and is handed to the record layer ([`crate::record`]), so no byte is lost
//! when rustls hands the connection over.

use std::io;

use bytes::BufMut;
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, EncodeTlsData, UnbufferedStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::record::{invalid, tls_error};

/// Most bytes a handshake holds from the peer at once: rustls's bound on one handshake
/// message (64 KiB, a long certificate chain) plus a record's worth around it. A peer that
/// sends more before the handshake ends is refused.
pub(crate) const HANDSHAKE_BYTES_MAX: usize = 96 * 1024;

/// Bytes asked of the socket per read during a handshake.
const READ_CHUNK: usize = 16 * 1024;

/// The two sides of rustls's unbuffered connection, as the driver uses them.
pub(crate) trait Unbuffered {
    /// rustls's side data (client or server).
    type Data;
    /// `process_tls_records` of either side.
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
    /// Whether the handshake is still running.
    fn handshaking(&self) -> bool;
    /// Whether rustls has records queued to send (an alert after a failure).
    fn queued(&self) -> bool;
}

impl Unbuffered for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ClientConnectionData> {
        self.process_tls_records(incoming)
    }
    fn handshaking(&self) -> bool {
        self.is_handshaking()
    }
    fn queued(&self) -> bool {
        self.wants_write()
    }
}

impl Unbuffered for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ServerConnectionData> {
        self.process_tls_records(incoming)
    }
    fn handshaking(&self) -> bool {
        self.is_handshaking()
    }
    fn queued(&self) -> bool {
        self.wants_write()
    }
}

/// What a finished handshake leaves for the record layer.
#[derive(Debug, Default)]
pub(crate) struct Handshaken {
    /// Bytes received after the handshake's last message, not yet decrypted.
    pub(crate) ciphertext: Vec<u8>,
    /// Application data rustls decrypted while it finished the handshake.
    pub(crate) plaintext: Vec<u8>,
}

/// Runs `conn`'s handshake over `tcp` until both directions carry application data.
///
/// # Errors
/// rustls's failure (after sending the alert it queued, so the peer learns why), as
/// `InvalidData`; `UnexpectedEof` if the peer closes; `InvalidData` if it sends more than
/// [`HANDSHAKE_BYTES_MAX`] before the handshake ends; the socket's errors. No time bound:
/// callers bound the whole handshake.
pub(crate) async fn drive<C: Unbuffered>(
    conn: &mut C,
    tcp: &mut TcpStream,
) -> io::Result<Handshaken> {
    let mut incoming: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut outgoing: Vec<u8> = Vec::new();
    let mut plaintext: Vec<u8> = Vec::new();
    // rustls sees `incoming[..fed]`, whole records one at a time: it must not process a
    // record that follows the handshake's last (a KeyUpdate, a close_notify), which would
    // change its state after the keys are taken; the record layer reads those.
    let mut fed = 0;
    loop {
        let UnbufferedStatus { mut discard, state } = conn.process(&mut incoming[..fed]);
        let mut read_more = false;
        let mut failed = None;
        match state {
            Err(e) => failed = Some(e),
            Ok(ConnectionState::EncodeTlsData(mut s)) => encode(&mut s, &mut outgoing)?,
            Ok(ConnectionState::TransmitTlsData(s)) => {
                tcp.write_all(&outgoing).await?;
                outgoing.clear();
                s.done();
            }
            Ok(ConnectionState::BlockedHandshake) => read_more = true,
            Ok(ConnectionState::ReadTraffic(mut r)) => {
                while let Some(record) = r.next_record() {
                    let record = record.map_err(tls_error)?;
                    discard += record.discard;
                    if plaintext.len() + record.payload.len() > HANDSHAKE_BYTES_MAX {
                        return Err(invalid("too much data during the TLS handshake"));
                    }
                    plaintext.extend_from_slice(record.payload);
                }
            }
            // A server may send data before the client's Finished: the handshake is done
            // once rustls also receives, and until then it needs the peer's bytes.
            Ok(ConnectionState::WriteTraffic(_)) => read_more = true,
            Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the TLS handshake",
                ));
            }
            Ok(_) => {
                return Err(invalid(
                    "an unexpected state in the TLS handshake (early data is not offered)",
                ));
            }
        }
        incoming.drain(..discard);
        fed -= discard;
        if let Some(e) = failed {
            send_alert(conn, tcp, &mut incoming[..fed]).await;
            return Err(tls_error(e));
        }
        if read_more {
            if !conn.handshaking() {
                return Ok(Handshaken {
                    ciphertext: incoming,
                    plaintext,
                });
            }
            if let Some(end) = record_end(&incoming, fed) {
                fed = end;
                continue;
            }
            let room = HANDSHAKE_BYTES_MAX.saturating_sub(incoming.len());
            if room == 0 {
                return Err(invalid("a TLS handshake over 96 KiB"));
            }
            incoming.reserve(READ_CHUNK.min(room));
            let n = tcp
                .read_buf(&mut (&mut incoming).limit(READ_CHUNK.min(room)))
                .await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the TLS handshake",
                ));
            }
        }
    }
}

/// Where the whole record starting at `from` ends, if `buf` holds all of it.
fn record_end(buf: &[u8], from: usize) -> Option<usize> {
    let header = buf.get(from..from + 5)?;
    let end = from + 5 + usize::from(u16::from_be_bytes([header[3], header[4]]));
    (end <= buf.len()).then_some(end)
}

/// Encodes rustls's next handshake record onto the end of `out`.
fn encode<D>(s: &mut EncodeTlsData<'_, D>, out: &mut Vec<u8>) -> io::Result<()> {
    let start = out.len();
    loop {
        match s.encode(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return Ok(());
            }
            Err(EncodeError::InsufficientSize(e)) => out.resize(start + e.required_size, 0),
            Err(e) => return Err(io::Error::other(e.to_string())),
        }
    }
}

/// After a failed handshake, sends the alert rustls queued for the peer (best effort).
async fn send_alert<C: Unbuffered>(conn: &mut C, tcp: &mut TcpStream, incoming: &mut [u8]) {
    let mut alert = Vec::new();
    // Only what is queued: processing more input after a failure would fail again. A fatal
    // alert is one record; the bound only guards against a loop.
    for _ in 0..4 {
        if !conn.queued() {
            break;
        }
        match conn.process(incoming).state {
            Ok(ConnectionState::EncodeTlsData(mut s)) => {
                if encode(&mut s, &mut alert).is_err() {
                    break;
                }
            }
            _ => break,
        }
    }
    if !alert.is_empty() {
        let _ = tcp.write_all(&alert).await;
    }
}
