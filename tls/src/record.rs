//! TLS 1.3 record protection once the handshake is done (RFC 8446 §5.2–5.5), so that a
//! connection decrypts in place in its own read buffer and encrypts straight into its own
//! write buffer.
//!
//! rustls runs every handshake; [`crate::Stream`] then takes the traffic secrets out of it
//! through rustls's kernel-connection API (`rustls::kernel`, made for kTLS: rustls keeps the
//! key schedule — key updates, session tickets — and the caller protects the records). This
//! machine's kernel has no kTLS, and rustls's own buffered records cost a socket read per
//! 4 KiB, an allocation and two copies per received record and an allocation per sent one
//! (tools/README.md, "TLS on every link against plaintext"); here a record costs its AEAD
//! pass and one copy.
//!
//! What is implemented, and how:
//! - A record is `opaque_type = 23 (application_data) ‖ 0x0303 ‖ length (u16, at most 2^14 +
//!   256) ‖ AEAD(TLSInnerPlaintext)`, where the inner plaintext is the content, its real
//!   content type (one byte) and zero padding (§5.2). The additional data is the 5-byte
//!   header; the nonce is the write IV XOR the 64-bit record sequence number, left-padded
//!   (§5.3). We send no padding and take any.
//! - The sequence number counts records per direction from what rustls used in the
//!   handshake; a key update starts it at 0 (§5.3, §4.6.3).
//! - Received content types: application data (23) is handed out; an alert (21) ends the
//!   stream (close_notify) or fails it (any other, as rustls would report it); a handshake
//!   message (22) after the handshake is a NewSessionTicket (client side: handed to rustls
//!   for resumption) or a KeyUpdate (the receive key is updated; one with `update_requested`
//!   makes the writer update its own key before its next record, §4.6.3); anything else is an
//!   error.
//! - A sender updates its key before the cipher suite's confidentiality limit (RFC 8446 §5.5,
//!   as rustls counts it: `CipherSuiteCommon::confidentiality_limit` records).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use aws_lc_rs::aead::{
    Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305, NONCE_LEN,
};
use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{AlertDescription, ConnectionTrafficSecrets};

/// Bytes of a record header: type, version, length.
pub(crate) const HEADER_LEN: usize = 5;
/// Most content bytes in one record (RFC 8446 §5.1: 2^14).
pub(crate) const CONTENT_MAX: usize = 1 << 14;
/// Most bytes after the header of a protected record (RFC 8446 §5.2: 2^14 + 256).
pub(crate) const CIPHERTEXT_MAX: usize = CONTENT_MAX + 256;
/// The AEAD tag (16 bytes for all three TLS 1.3 suites rustls offers here).
pub(crate) const TAG_LEN: usize = 16;
/// Most bytes one protected record takes on the wire.
pub(crate) const RECORD_MAX: usize = HEADER_LEN + CIPHERTEXT_MAX;

/// Content types (RFC 8446 §5.1).
pub(crate) const ALERT: u8 = 21;
pub(crate) const HANDSHAKE: u8 = 22;
pub(crate) const APPLICATION_DATA: u8 = 23;

/// Handshake message types seen after the handshake (RFC 8446 §4).
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

/// Most bytes of post-handshake handshake messages held while they arrive in pieces (a
/// NewSessionTicket is a few hundred bytes; rustls bounds handshake messages at 64 KiB).
const POST_HANDSHAKE_MAX: usize = 64 * 1024;

/// Records sent before the confidentiality limit at which the sender updates its key: any
/// margin above the records one write makes ([`crate::stream`] makes at most 4) would do.
const KEY_UPDATE_MARGIN: u64 = 1 << 16;

/// One direction's traffic key, IV and record sequence number.
pub(crate) struct Keys {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
    /// Records this key may protect (the suite's confidentiality limit).
    limit: u64,
}

impl Keys {
    /// Keys from rustls's secrets, starting at record `seq`.
    ///
    /// # Errors
    /// `InvalidData` for a cipher suite this layer does not know (rustls offers only the
    /// three TLS 1.3 suites it does).
    pub(crate) fn new(
        seq: u64,
        secrets: &ConnectionTrafficSecrets,
        limit: u64,
    ) -> io::Result<Keys> {
        let (alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv),
            _ => return Err(invalid("a cipher suite the record layer does not know")),
        };
        let key = UnboundKey::new(alg, key.as_ref())
            .map_err(|_| invalid("a traffic key of the wrong length"))?;
        let iv: [u8; NONCE_LEN] = iv
            .as_ref()
            .try_into()
            .map_err(|_| invalid("a traffic IV of the wrong length"))?;
        Ok(Keys {
            key: LessSafeKey::new(key),
            iv,
            seq,
            limit,
        })
    }

    /// Whether the next record should go under a fresh key.
    pub(crate) fn near_limit(&self) -> bool {
        self.seq >= self.limit.saturating_sub(KEY_UPDATE_MARGIN)
    }

    /// The nonce of the next record, which it takes (RFC 8446 §5.3).
    fn next_nonce(&mut self) -> io::Result<Nonce> {
        if self.seq >= self.limit {
            return Err(invalid(
                "the TLS key reached its confidentiality limit without a key update",
            ));
        }
        let mut nonce = self.iv;
        for (n, s) in nonce[NONCE_LEN - 8..]
            .iter_mut()
            .zip(self.seq.to_be_bytes())
        {
            *n ^= s;
        }
        self.seq += 1;
        Ok(Nonce::assume_unique_for_key(nonce))
    }

    /// Appends one protected record of content type `typ` holding `content` (at most
    /// [`CONTENT_MAX`] bytes, gathered from the slices in order) to `out`.
    ///
    /// # Errors
    /// As [`Keys::seal_with`].
    pub(crate) fn seal<'a>(
        &mut self,
        typ: u8,
        content: impl IntoIterator<Item = &'a [u8]>,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        self.seal_with(typ, out, |out| {
            for part in content {
                out.extend_from_slice(part);
            }
        })
    }

    /// Appends one protected record of content type `typ` to `out`; `fill` appends its
    /// content (at most [`CONTENT_MAX`] bytes) to the vector it is given, and it is then
    /// encrypted where it lies.
    ///
    /// # Errors
    /// `InvalidData` past the confidentiality limit or for content over
    /// [`CONTENT_MAX`]; the AEAD's failure.
    pub(crate) fn seal_with(
        &mut self,
        typ: u8,
        out: &mut Vec<u8>,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<()> {
        let start = out.len();
        out.extend_from_slice(&[APPLICATION_DATA, 3, 3, 0, 0]);
        fill(out);
        let content_len = out.len() - start - HEADER_LEN;
        if content_len > CONTENT_MAX {
            out.truncate(start);
            return Err(invalid("a TLS record over 2^14 bytes of content"));
        }
        out.push(typ);
        let length = u16::try_from(content_len + 1 + TAG_LEN)
            .map_err(|_| invalid("a record over 2^14 bytes"))?;
        out[start + 3..start + HEADER_LEN].copy_from_slice(&length.to_be_bytes());
        let header: [u8; HEADER_LEN] = out[start..start + HEADER_LEN]
            .try_into()
            .map_err(|_| invalid("a record header"))?;
        let nonce = match self.next_nonce() {
            Ok(n) => n,
            Err(e) => {
                out.truncate(start);
                return Err(e);
            }
        };
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[start + HEADER_LEN..])
            .map_err(|_| invalid("the AEAD failed to seal a record"))?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Opens the record whose header is `header` and whose protected body is `body`, in
    /// place: its content type and the length of its content (at the front of `body`).
    ///
    /// # Errors
    /// `InvalidData` for a record that does not decrypt (`bad_record_mac`), that is all
    /// padding, or whose content is over 2^14 bytes (`record_overflow`).
    pub(crate) fn open(
        &mut self,
        header: [u8; HEADER_LEN],
        body: &mut [u8],
    ) -> io::Result<(u8, usize)> {
        let nonce = self.next_nonce()?;
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(header), body)
            .map_err(|_| tls_error(rustls::Error::DecryptError))?;
        let Some(typ_at) = plain.iter().rposition(|&b| b != 0) else {
            return Err(invalid("a TLS record with no content type (all padding)"));
        };
        // §5.4: the inner plaintext, padding included, is at most 2^14 + 1 bytes.
        if plain.len() > CONTENT_MAX + 1 {
            return Err(invalid("a TLS record over 2^14 bytes (record_overflow)"));
        }
        Ok((plain[typ_at], typ_at))
    }
}

/// What rustls keeps of a connection after its handshake: the key schedule.
pub(crate) enum Kernel {
    /// A connection we opened.
    Client(KernelConnection<ClientConnectionData>),
    /// A connection we accepted.
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    /// The negotiated suite's confidentiality limit, in records.
    pub(crate) fn confidentiality_limit(&self) -> u64 {
        let suite = match self {
            Kernel::Client(k) => k.negotiated_cipher_suite(),
            Kernel::Server(k) => k.negotiated_cipher_suite(),
        };
        suite
            .tls13()
            .map_or(u64::MAX, |s| s.common.confidentiality_limit)
    }

    fn update(&mut self, transmit: bool) -> io::Result<Keys> {
        let limit = self.confidentiality_limit();
        // Only a sender is bound by the confidentiality limit ([`crate::stream`]).
        let limit = if transmit { limit } else { u64::MAX };
        let (seq, secrets) = match (self, transmit) {
            (Kernel::Client(k), true) => k.update_tx_secret(),
            (Kernel::Client(k), false) => k.update_rx_secret(),
            (Kernel::Server(k), true) => k.update_tx_secret(),
            (Kernel::Server(k), false) => k.update_rx_secret(),
        }
        .map_err(tls_error)?;
        Keys::new(seq, &secrets, limit)
    }
}

/// What the two halves of a TLS connection share: rustls's key schedule (used only for key
/// updates and tickets, so the lock is not on the data path) and whether the peer asked for
/// a key update the writer has not made yet.
pub(crate) struct Shared {
    kernel: Mutex<Kernel>,
    update_requested: AtomicBool,
    /// The writer's next key update asks the peer to update too (tests set it).
    ask_peer: AtomicBool,
}

impl Shared {
    pub(crate) fn new(kernel: Kernel) -> Shared {
        Shared {
            kernel: Mutex::new(kernel),
            update_requested: AtomicBool::new(false),
            ask_peer: AtomicBool::new(false),
        }
    }

    /// Makes the writer update its key before its next record; with `ask_peer`, its
    /// KeyUpdate asks the peer to update its own (`update_requested`).
    #[cfg(test)]
    pub(crate) fn request_key_update(&self, ask_peer: bool) {
        self.ask_peer.store(ask_peer, Ordering::Release);
        self.update_requested.store(true, Ordering::Release);
    }

    fn kernel(&self) -> std::sync::MutexGuard<'_, Kernel> {
        match self.kernel.lock() {
            Ok(k) => k,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The writer's side of a key update (RFC 8446 §4.6.3): when the peer asked for one or
    /// `tx` nears its limit, appends a KeyUpdate (`update_not_requested`) under the old key
    /// to `out` and moves `tx` to the next key.
    ///
    /// # Errors
    /// rustls's refusal to update; the seal's errors.
    pub(crate) fn maybe_update_tx(&self, tx: &mut Keys, out: &mut Vec<u8>) -> io::Result<()> {
        let requested = self.update_requested.swap(false, Ordering::AcqRel);
        if !requested && !tx.near_limit() {
            return Ok(());
        }
        let ask = u8::from(self.ask_peer.swap(false, Ordering::AcqRel));
        tx.seal(HANDSHAKE, [&[KEY_UPDATE, 0, 0, 1, ask][..]], out)?;
        *tx = self.kernel().update(true)?;
        Ok(())
    }
}

/// Post-handshake handshake messages of the read side, gathered across records.
#[derive(Default)]
pub(crate) struct PostHandshake {
    pending: Vec<u8>,
}

impl PostHandshake {
    /// Whether part of a message is held (the next record must continue it).
    pub(crate) fn in_progress(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Takes the content of one handshake record; acts on each whole message in it.
    ///
    /// # Errors
    /// `InvalidData` for a message other than a NewSessionTicket (to a client) or a
    /// KeyUpdate, a malformed one, a KeyUpdate not at the end of its record, or more than
    /// 64 KiB of a message held.
    pub(crate) fn take(
        &mut self,
        content: &[u8],
        shared: &Shared,
        rx: &mut Keys,
    ) -> io::Result<()> {
        if self.pending.len() + content.len() > POST_HANDSHAKE_MAX {
            return Err(invalid("a post-handshake TLS message over 64 KiB"));
        }
        self.pending.extend_from_slice(content);
        let mut at = 0;
        while self.pending.len() - at >= 4 {
            let typ = self.pending[at];
            let len = usize::from(self.pending[at + 1]) << 16
                | usize::from(self.pending[at + 2]) << 8
                | usize::from(self.pending[at + 3]);
            let end = at + 4 + len;
            if end > self.pending.len() {
                break;
            }
            let body = &self.pending[at + 4..end];
            match typ {
                NEW_SESSION_TICKET => match &mut *shared.kernel() {
                    Kernel::Client(k) => k.handle_new_session_ticket(body).map_err(tls_error)?,
                    Kernel::Server(_) => {
                        return Err(invalid("a client sent a NewSessionTicket"));
                    }
                },
                KEY_UPDATE => {
                    // §5.1: a KeyUpdate must end its record (the next one is under the new
                    // key); §4.6.3: its one byte is 0 or 1.
                    if end != self.pending.len() || body.len() != 1 || body[0] > 1 {
                        return Err(invalid("a malformed TLS KeyUpdate"));
                    }
                    *rx = shared.kernel().update(false)?;
                    if body[0] == 1 {
                        shared.update_requested.store(true, Ordering::Release);
                    }
                }
                other => {
                    return Err(invalid_owned(format!(
                        "an unexpected TLS handshake message (type {other}) after the handshake"
                    )));
                }
            }
            at = end;
        }
        self.pending.drain(..at);
        Ok(())
    }
}

/// The error an alert from the peer gives, worded as rustls words it (`received fatal
/// alert: CertificateRequired`), which clients match on to explain a refusal.
pub(crate) fn alert_error(description: u8) -> io::Error {
    tls_error(rustls::Error::AlertReceived(AlertDescription::from(
        description,
    )))
}

/// A rustls error as an `InvalidData` `io::Error` carrying it (its wording is what clients
/// match on, as they did when tokio-rustls made these errors).
pub(crate) fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

pub(crate) fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn invalid_owned(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};

    fn keys(seq: u64, limit: u64) -> Keys {
        let secrets = ConnectionTrafficSecrets::Aes256Gcm {
            key: AeadKey::from([7u8; 32]),
            iv: Iv::from([9u8; NONCE_LEN]),
        };
        Keys::new(seq, &secrets, limit).expect("keys")
    }

    fn open_all(rx: &mut Keys, mut wire: &mut [u8]) -> Vec<(u8, Vec<u8>)> {
        let mut got = Vec::new();
        while !wire.is_empty() {
            let header: [u8; HEADER_LEN] = wire[..HEADER_LEN].try_into().expect("header");
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            let (record, rest) = wire.split_at_mut(HEADER_LEN + len);
            let (typ, n) = rx.open(header, &mut record[HEADER_LEN..]).expect("opens");
            got.push((typ, record[HEADER_LEN..HEADER_LEN + n].to_vec()));
            wire = rest;
        }
        got
    }

    #[test]
    fn sealed_records_open_in_order_with_their_types() {
        let (mut tx, mut rx) = (keys(3, u64::MAX), keys(3, u64::MAX));
        let mut wire = Vec::new();
        tx.seal(APPLICATION_DATA, [&b"hello "[..], b"world"], &mut wire)
            .expect("seals");
        tx.seal(ALERT, [&[1u8, 0][..]], &mut wire).expect("seals");
        tx.seal(APPLICATION_DATA, [&[][..]], &mut wire)
            .expect("seals");
        let got = open_all(&mut rx, &mut wire);
        assert_eq!(
            got,
            vec![
                (APPLICATION_DATA, b"hello world".to_vec()),
                (ALERT, vec![1, 0]),
                (APPLICATION_DATA, vec![]),
            ]
        );
        // The header is the wire's: type 23, version 0x0303, the protected length.
        assert_eq!(&wire[..3], &[APPLICATION_DATA, 3, 3]);
    }

    #[test]
    fn a_flipped_bit_a_replayed_or_reordered_record_does_not_open() {
        let mut tx = keys(0, u64::MAX);
        let mut one = Vec::new();
        tx.seal(APPLICATION_DATA, [&b"one"[..]], &mut one)
            .expect("seals");
        let mut two = Vec::new();
        tx.seal(APPLICATION_DATA, [&b"two"[..]], &mut two)
            .expect("seals");
        let open = |rx: &mut Keys, wire: &[u8]| {
            let mut wire = wire.to_vec();
            let header: [u8; HEADER_LEN] = wire[..HEADER_LEN].try_into().expect("header");
            rx.open(header, &mut wire[HEADER_LEN..]).map(|(t, _)| t)
        };
        // Out of order: record 1 under sequence number 0.
        assert!(open(&mut keys(0, u64::MAX), &two).is_err());
        // A bit flipped in the body, and in the header (the additional data).
        for at in [HEADER_LEN + 1, 4] {
            let mut bad = one.clone();
            bad[at] ^= 1;
            assert!(open(&mut keys(0, u64::MAX), &bad).is_err(), "flip at {at}");
        }
        let mut rx = keys(0, u64::MAX);
        assert_eq!(open(&mut rx, &one).expect("opens"), APPLICATION_DATA);
        assert_eq!(open(&mut rx, &two).expect("opens"), APPLICATION_DATA);
        // Replayed: the receiver has moved on to sequence number 2.
        assert!(open(&mut rx, &one).is_err());
    }

    #[test]
    fn a_key_past_its_confidentiality_limit_seals_nothing() {
        assert!(!keys(0, KEY_UPDATE_MARGIN + 2).near_limit());
        let mut tx = keys(0, 2);
        assert!(tx.near_limit(), "within the margin of the limit");
        let mut out = Vec::new();
        tx.seal(APPLICATION_DATA, [&b"a"[..]], &mut out)
            .expect("seals");
        tx.seal(APPLICATION_DATA, [&b"b"[..]], &mut out)
            .expect("seals");
        assert!(tx.seal(APPLICATION_DATA, [&b"c"[..]], &mut out).is_err());
    }

    #[test]
    fn alerts_read_as_rustls_words_them() {
        assert!(alert_error(116)
            .to_string()
            .contains("received fatal alert: CertificateRequired"));
    }
}
