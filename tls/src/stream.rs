//! One connection type for plaintext and TLS, split into halves that read and write apart.
//!
//! The server's frame reader waits until a socket is readable before it takes room in the
//! read budget, then reads without blocking (`readable` + `try_read`), so an idle
//! connection holds no budget. A TLS [`ReadHalf`] keeps that shape: `readable` reads
//! ciphertext into the half's own buffer (at most [`READ_BUFFER_BYTES`]) and decrypts a
//! record in place; `try_read` copies its content out. So a busy TLS connection holds up to
//! `READ_BUFFER_BYTES` outside the budget, and an idle one nothing (the buffer is given back
//! whenever it is drained and the half waits). A TLS [`WriteHalf`] encrypts what it is given
//! into its own buffer (at most [`WRITE_AHEAD_BYTES`] of content per write) and sends it.
//! Records are protected by [`crate::record`] with the keys rustls negotiated; handshakes are
//! bounded apart (quire-net's `TLS_HANDSHAKES_MAX`, [`crate::TlsAcceptor::accept`]'s timeout).

use std::fmt;
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::BufMut;
use rustls::ExtractedSecrets;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::handshake::Handshaken;
use crate::record::{
    alert_error, invalid, Kernel, Keys, PostHandshake, Shared, ALERT, APPLICATION_DATA,
    CIPHERTEXT_MAX, CONTENT_MAX, HANDSHAKE, HEADER_LEN, RECORD_MAX, TAG_LEN,
};

/// Most ciphertext a TLS [`ReadHalf`] buffers: four whole records (about 66 KiB), read
/// from the socket in one call when they are there.
pub const READ_BUFFER_BYTES: usize = 4 * RECORD_MAX;

/// Most content a TLS [`WriteHalf`] takes per write, and encrypted bytes it holds before
/// it waits for the socket: four records (64 KiB; rustls's own default bound is the same).
pub const WRITE_AHEAD_BYTES: usize = 4 * CONTENT_MAX;

/// A connection: plaintext TCP, or TLS over TCP after its handshake.
#[derive(Debug)]
pub enum Stream {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS, handshake done.
    Tls(Box<TlsStream>),
}

/// A TLS connection after its handshake: the socket, each direction's keys, and what the
/// handshake left over.
pub struct TlsStream {
    tcp: TcpStream,
    rx: Keys,
    tx: Keys,
    shared: Arc<Shared>,
    leftover: Handshaken,
    peer_certificate: Option<Vec<u8>>,
}

impl fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsStream")
            .field("tcp", &self.tcp)
            .finish_non_exhaustive()
    }
}

impl TlsStream {
    /// A connection whose handshake rustls finished: `secrets` and `kernel` from its
    /// `dangerous_into_kernel_connection`, `leftover` from [`crate::handshake::drive`].
    ///
    /// # Errors
    /// `InvalidData` for a cipher suite the record layer does not know.
    pub(crate) fn new(
        tcp: TcpStream,
        secrets: ExtractedSecrets,
        kernel: Kernel,
        leftover: Handshaken,
        peer_certificate: Option<Vec<u8>>,
    ) -> io::Result<TlsStream> {
        let limit = kernel.confidentiality_limit();
        Ok(TlsStream {
            tcp,
            // The confidentiality limit binds the sender, who updates its key; a receiver
            // has no reason to refuse (rustls does not either).
            rx: Keys::new(secrets.rx.0, &secrets.rx.1, u64::MAX)?,
            tx: Keys::new(secrets.tx.0, &secrets.tx.1, limit)?,
            shared: Arc::new(Shared::new(kernel)),
            leftover,
            peer_certificate,
        })
    }
}

impl Stream {
    /// The TCP socket underneath.
    #[must_use]
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.tcp,
        }
    }

    /// Whether the connection is encrypted.
    #[must_use]
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// The certificate the peer presented (its leaf, DER), if the connection is TLS and
    /// the peer showed one (a server always does; a client when asked for it).
    #[must_use]
    pub fn peer_certificate(&self) -> Option<&[u8]> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(s) => s.peer_certificate.as_deref(),
        }
    }

    /// Read and write halves, used from two tasks.
    #[must_use]
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Plain(r), WriteHalf::Plain(w))
            }
            Stream::Tls(s) => {
                let TlsStream {
                    tcp,
                    rx,
                    tx,
                    shared,
                    leftover,
                    peer_certificate: _,
                } = *s;
                let (r, w) = tcp.into_split();
                (
                    ReadHalf::Tls(Box::new(TlsRead {
                        tcp: r,
                        rx,
                        shared: shared.clone(),
                        buf: leftover.ciphertext,
                        head: 0,
                        plain: 0..0,
                        early: leftover.plaintext,
                        early_at: 0,
                        post_handshake: PostHandshake::default(),
                        eof: false,
                        error: None,
                    })),
                    WriteHalf::Tls(Box::new(TlsWrite {
                        tcp: w,
                        tx,
                        shared,
                        out: Vec::new(),
                        sent: 0,
                        shut: false,
                    })),
                )
            }
        }
    }
}

/// The reading half of a [`Stream`].
#[derive(Debug)]
pub enum ReadHalf {
    /// Plaintext: the socket's own readiness.
    Plain(OwnedReadHalf),
    /// TLS: records decrypted in the half's buffer.
    Tls(Box<TlsRead>),
}

/// The state of a TLS [`ReadHalf`].
pub struct TlsRead {
    tcp: OwnedReadHalf,
    rx: Keys,
    shared: Arc<Shared>,
    /// Bytes from the socket: `buf[..head]` are records already opened, `buf[head..]`
    /// ciphertext not yet opened.
    buf: Vec<u8>,
    head: usize,
    /// The content of the last record opened not handed out yet (inside `buf[..head]`).
    plain: Range<usize>,
    /// Application data rustls decrypted during the handshake, handed out first.
    early: Vec<u8>,
    early_at: usize,
    post_handshake: PostHandshake,
    /// The peer closed (a TLS close_notify, or the TCP end).
    eof: bool,
    /// An error met while reading, handed out by the next read.
    error: Option<io::Error>,
}

impl fmt::Debug for TlsRead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsRead")
            .field("buffered", &(self.buf.len() - self.head))
            .field("eof", &self.eof)
            .finish_non_exhaustive()
    }
}

/// What a TLS read half can do now.
enum Next {
    /// Hand out [`TlsRead::data`].
    Data,
    /// The stream ended.
    Eof,
    /// Nothing until more bytes come from the socket.
    Blocked,
}

impl TlsRead {
    /// Opens buffered records until one has content to hand out, the stream ends or fails,
    /// or no whole record is buffered.
    fn next(&mut self) -> io::Result<Next> {
        loop {
            if self.early_at < self.early.len() || !self.plain.is_empty() {
                return Ok(Next::Data);
            }
            if let Some(e) = self.error.take() {
                self.eof = true;
                return Err(e);
            }
            if self.eof {
                return Ok(Next::Eof);
            }
            match self.open_one() {
                Ok(true) => {}
                Ok(false) => return Ok(Next::Blocked),
                Err(e) => self.error = Some(e),
            }
        }
    }

    /// Opens the next buffered record if it is whole: whether it did. An error for a
    /// record that is malformed, does not decrypt, or is an alert other than the end.
    fn open_one(&mut self) -> io::Result<bool> {
        let Some(header) = self.buf.get(self.head..self.head + HEADER_LEN) else {
            return Ok(false);
        };
        let header: [u8; HEADER_LEN] = header
            .try_into()
            .map_err(|_| invalid("a TLS record header"))?;
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        // After the handshake every record is protected: type application_data, version
        // 3.x, at most 2^14 + 256 bytes (RFC 8446 §5.2).
        if header[0] != APPLICATION_DATA || header[1] != 3 || len > CIPHERTEXT_MAX {
            return Err(invalid(
                "a malformed TLS record (not a protected record, or over 2^14 + 256 bytes)",
            ));
        }
        let body = self.head + HEADER_LEN;
        if self.buf.len() < body + len {
            // Not whole yet ([`TlsRead::make_room`] leaves room for all of it).
            return Ok(false);
        }
        let (typ, n) = self.rx.open(header, &mut self.buf[body..body + len])?;
        self.head = body + len;
        let content = body..body + n;
        // Handshake messages are not interleaved with other records (RFC 8446 §5.1).
        if typ != HANDSHAKE && self.post_handshake.in_progress() {
            return Err(invalid(
                "a TLS record in the middle of a post-handshake handshake message",
            ));
        }
        match typ {
            APPLICATION_DATA => self.plain = content,
            ALERT => match self.buf[content] {
                // close_notify: the end of the stream.
                [_, 0] => self.eof = true,
                // user_canceled comes before a close_notify (RFC 8446 §6.1).
                [_, 90] => {}
                [_, description] => return Err(alert_error(description)),
                _ => return Err(invalid("a malformed TLS alert")),
            },
            HANDSHAKE => {
                self.post_handshake
                    .take(&self.buf[content], &self.shared, &mut self.rx)?;
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("an unexpected TLS record of content type {other}"),
                ));
            }
        }
        Ok(true)
    }

    /// The content to hand out (after [`Next::Data`]).
    fn data(&self) -> &[u8] {
        if self.early_at < self.early.len() {
            &self.early[self.early_at..]
        } else {
            &self.buf[self.plain.clone()]
        }
    }

    /// Marks `n` bytes of [`TlsRead::data`] handed out.
    fn consume(&mut self, n: usize) {
        if self.early_at < self.early.len() {
            self.early_at += n;
            if self.early_at == self.early.len() {
                self.early = Vec::new();
                self.early_at = 0;
            }
        } else {
            self.plain.start += n;
        }
    }

    /// Makes room at the end of the buffer for a socket read (everything opened is
    /// handed out when this is called).
    fn make_room(&mut self) {
        if self.head == self.buf.len() {
            self.buf.clear();
            self.head = 0;
        } else if self.head > 0 && self.buf.capacity() - self.head < READ_BUFFER_BYTES / 2 {
            self.buf.drain(..self.head);
            self.head = 0;
        }
        self.plain = self.head..self.head;
        let want = READ_BUFFER_BYTES.saturating_sub(self.buf.len());
        self.buf.reserve(want);
    }

    /// Gives the buffer back when it holds nothing (before the half waits), so an idle
    /// TLS connection holds no buffer.
    fn release_if_drained(&mut self) {
        if self.head == self.buf.len() && self.plain.is_empty() {
            self.buf = Vec::new();
            self.head = 0;
            self.plain = 0..0;
        }
    }

    /// Takes the result of a socket read of `n` bytes. A TCP end between records without a
    /// close_notify is taken as the end of the stream, not as a truncation attack: Quire's
    /// frames carry their own lengths and every request its answer, so a cut between frames
    /// reads as a lost connection either way (the frame readers report a cut inside a frame).
    /// No alert is sent on a record error; the connection is dropped.
    fn received(&mut self, n: usize) {
        if n == 0 {
            if self.head < self.buf.len() {
                self.error = Some(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection in the middle of a TLS record",
                ));
            } else {
                self.eof = true;
            }
        }
    }

    /// Reads from the socket without waiting. `WouldBlock` if it has nothing.
    fn try_fill(&mut self) -> io::Result<()> {
        self.make_room();
        let n = self.tcp.try_read_buf(&mut self.buf)?;
        self.received(n);
        Ok(())
    }

    async fn readable(&mut self) -> io::Result<()> {
        loop {
            match self.next() {
                Ok(Next::Blocked) => {}
                // Data, the end, or an error: the next read hands it out.
                Ok(_) => return Ok(()),
                Err(e) => {
                    self.error = Some(e);
                    return Ok(());
                }
            }
            match self.try_fill() {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.release_if_drained();
                    self.tcp.readable().await?;
                }
                Err(e) => self.error = Some(e),
            }
        }
    }

    fn take(&mut self, out: &mut impl BufMut) -> io::Result<usize> {
        if !out.has_remaining_mut() {
            return Ok(0);
        }
        loop {
            match self.next()? {
                Next::Data => {
                    let data = self.data();
                    let n = data.len().min(out.remaining_mut());
                    out.put_slice(&data[..n]);
                    self.consume(n);
                    return Ok(n);
                }
                Next::Eof => return Ok(0),
                Next::Blocked => {
                    if let Err(e) = self.try_fill() {
                        if e.kind() == io::ErrorKind::WouldBlock {
                            self.release_if_drained();
                        }
                        return Err(e);
                    }
                }
            }
        }
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            match self.next()? {
                Next::Data => {
                    let data = self.data();
                    let n = data.len().min(out.remaining());
                    out.put_slice(&data[..n]);
                    self.consume(n);
                    return Poll::Ready(Ok(()));
                }
                Next::Eof => return Poll::Ready(Ok(())),
                Next::Blocked => {
                    self.make_room();
                    let len = self.buf.len();
                    let mut spare = ReadBuf::uninit(self.buf.spare_capacity_mut());
                    match Pin::new(&mut self.tcp).poll_read(cx, &mut spare) {
                        Poll::Pending => {
                            self.release_if_drained();
                            return Poll::Pending;
                        }
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Ready(Ok(())) => {
                            let n = spare.filled().len();
                            // SAFETY: `poll_read` initialised the first `n` bytes of the
                            // spare capacity (a ReadBuf's filled part is initialised), and
                            // `len + n` is within the capacity.
                            unsafe { self.buf.set_len(len + n) };
                            self.received(n);
                        }
                    }
                }
            }
        }
    }
}

impl ReadHalf {
    /// Waits until a read can make progress: bytes, the end of the stream or an error.
    /// Cancel-safe.
    ///
    /// # Errors
    /// The socket's readiness error (plaintext); a TLS error is handed out by the next
    /// read instead.
    pub async fn readable(&mut self) -> io::Result<()> {
        match self {
            ReadHalf::Plain(r) => r.readable().await,
            ReadHalf::Tls(t) => t.readable().await,
        }
    }

    /// Reads what is there without waiting into `buf`.
    ///
    /// # Errors
    /// [`io::ErrorKind::WouldBlock`] when nothing is there; the connection's error.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ReadHalf::Plain(r) => r.try_read(buf),
            ReadHalf::Tls(t) => t.take(&mut &mut buf[..]),
        }
    }

    /// Reads what is there without waiting onto the end of `buf`.
    ///
    /// # Errors
    /// As [`ReadHalf::try_read`].
    pub fn try_read_buf<B: BufMut>(&mut self, buf: &mut B) -> io::Result<usize> {
        match self {
            ReadHalf::Plain(r) => r.try_read_buf(buf),
            ReadHalf::Tls(t) => t.take(buf),
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Tls(t) => t.poll_read(cx, buf),
        }
    }
}

/// The writing half of a [`Stream`]. Writes to a TLS half may stay in its buffer until the
/// half is flushed: writers flush when their queue is empty.
#[derive(Debug)]
pub enum WriteHalf {
    /// Plaintext.
    Plain(OwnedWriteHalf),
    /// TLS.
    Tls(Box<TlsWrite>),
}

/// The state of a TLS [`WriteHalf`].
pub struct TlsWrite {
    tcp: OwnedWriteHalf,
    tx: Keys,
    shared: Arc<Shared>,
    /// Records not yet sent: `out[sent..]`.
    out: Vec<u8>,
    sent: usize,
    /// A close_notify is queued: nothing more may be written.
    shut: bool,
}

impl fmt::Debug for TlsWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsWrite")
            .field("unsent", &(self.out.len() - self.sent))
            .finish_non_exhaustive()
    }
}

impl TlsWrite {
    /// Sends buffered records until none is left (the buffer is then given back) or the
    /// socket takes no more.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.out = Vec::new();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Drops the records already sent from the front of the buffer.
    fn compact(&mut self) {
        if self.sent > 0 {
            self.out.drain(..self.sent);
            self.sent = 0;
        }
    }

    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.shut {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "write after the TLS stream was shut down",
            )));
        }
        if self.out.len() - self.sent >= WRITE_AHEAD_BYTES {
            ready!(self.poll_send(cx))?;
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        self.compact();
        self.shared.maybe_update_tx(&mut self.tx, &mut self.out)?;
        let take = total.min(WRITE_AHEAD_BYTES);
        let records = take.div_ceil(CONTENT_MAX);
        self.out
            .reserve(take + records * (HEADER_LEN + 1 + TAG_LEN));
        let mut parts = bufs.iter().map(|b| &b[..]);
        let mut part: &[u8] = &[];
        let mut left = take;
        while left > 0 {
            let mut need = left.min(CONTENT_MAX);
            left -= need;
            self.tx.seal_with(APPLICATION_DATA, &mut self.out, |out| {
                while need > 0 {
                    if part.is_empty() {
                        part = parts.next().unwrap_or_default();
                        continue;
                    }
                    let k = need.min(part.len());
                    out.extend_from_slice(&part[..k]);
                    part = &part[k..];
                    need -= k;
                }
            })?;
        }
        // Send what the socket takes now; the rest goes on the next write or flush.
        if let Poll::Ready(Err(e)) = self.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(take))
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.shut {
            ready!(self.poll_send(cx))?;
            // A close_notify (warning level): the peer sees the end of the stream.
            self.tx.seal(ALERT, [&[1u8, 0][..]], &mut self.out)?;
            self.shut = true;
        }
        ready!(self.poll_send(cx))?;
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Tls(w) => w.poll_write_vectored(cx, &[io::IoSlice::new(buf)]),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            WriteHalf::Tls(w) => w.poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WriteHalf::Plain(w) => w.is_write_vectored(),
            WriteHalf::Tls(_) => true,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Tls(w) => {
                ready!(w.poll_send(cx))?;
                Pin::new(&mut w.tcp).poll_flush(cx)
            }
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Tls(w) => w.poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::certs::{files_for, write_local};
    use crate::{ClientAuth, Role};

    const WAIT: Duration = Duration::from_secs(20);

    /// A TLS connection over loopback: (client side, server side).
    async fn pair() -> (Stream, Stream, tempfile::TempDir) {
        let (client, server, dir) = connect(false).await;
        (client, server.await.expect("server task"), dir)
    }

    /// A TCP relay that passes the client's first write (its hello) at once, then holds
    /// what the client sends for 300 ms and passes it in one write: the client's Finished
    /// and whatever follows it reach the server in one read.
    async fn coalescing_relay(to: String) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let (mut client, _) = listener.accept().await.expect("accept");
            let server = TcpStream::connect(&to).await.expect("connect");
            let (mut cr, mut cw) = client.split();
            let (mut sr, mut sw) = server.into_split();
            let down = tokio::io::copy(&mut sr, &mut cw);
            let up = async {
                let mut buf = vec![0u8; 64 * 1024];
                let n = cr.read(&mut buf).await.expect("hello");
                sw.write_all(&buf[..n]).await.expect("relay");
                let mut held = Vec::new();
                let _ = tokio::time::timeout(Duration::from_millis(300), async {
                    loop {
                        match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => held.extend_from_slice(&buf[..n]),
                        }
                    }
                })
                .await;
                sw.write_all(&held).await.expect("relay");
                let _ = tokio::io::copy(&mut cr, &mut sw).await;
                let _ = sw.shutdown().await;
            };
            let _ = tokio::join!(down, up);
        });
        addr
    }

    /// A client connected (through [`coalescing_relay`] with `coalesce`), and the server's
    /// side, whose handshake may still be running.
    async fn connect(
        coalesce: bool,
    ) -> (Stream, tokio::task::JoinHandle<Stream>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        write_local(
            dir.path(),
            &[("store-0", Role::Store), ("broker-1", Role::Broker)],
        )
        .expect("certificates");
        let acceptor = files_for(dir.path(), "store-0")
            .acceptor(ClientAuth::Required)
            .expect("acceptor")
            .expect("tls");
        let connector = files_for(dir.path(), "broker-1")
            .connector()
            .expect("connector")
            .expect("tls");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            acceptor.accept(tcp, WAIT).await.expect("server handshake")
        });
        let dial = if coalesce {
            coalescing_relay(addr.clone()).await
        } else {
            addr.clone()
        };
        let tcp = TcpStream::connect(&dial).await.expect("connect");
        let client = connector
            .connect(&addr, tcp)
            .await
            .expect("client handshake");
        (client, served, dir)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Reads to the end the way the servers' frame readers do: readiness, then `try_read_buf`.
    async fn read_all_by_readiness(r: &mut ReadHalf) -> io::Result<Vec<u8>> {
        let mut got = Vec::new();
        loop {
            r.readable().await?;
            loop {
                got.reserve(7_000);
                match r.try_read_buf(&mut got) {
                    Ok(0) => return Ok(got),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
    }

    /// Writes `data` in vectored writes of uneven slices (1 byte to 100 KB), updating the
    /// key mid-way (`ask_peer`: asking the peer to update too), then shuts down.
    async fn write_all_vectored(w: &mut WriteHalf, data: &[u8], ask_peer: bool) -> io::Result<()> {
        let sizes = [1usize, 7, 16_384, 16_385, 100_000, 3, 40_000];
        let mut at = 0;
        let mut round = 0;
        while at < data.len() {
            if round == 20 {
                let WriteHalf::Tls(t) = &*w else {
                    panic!("TLS")
                };
                t.shared.request_key_update(ask_peer);
            }
            let mut slices = Vec::new();
            let mut end = at;
            for s in sizes.iter().cycle().skip(round).take(5) {
                let next = (end + s).min(data.len());
                slices.push(io::IoSlice::new(&data[end..next]));
                end = next;
            }
            let n = w.write_vectored(&slices).await?;
            assert!(n > 0 || end == at);
            at += n;
            round += 1;
        }
        w.flush().await?;
        w.shutdown().await
    }

    #[tokio::test]
    async fn megabytes_cross_both_ways_through_key_updates_and_end_with_close_notify() {
        let (client, server, _dir) = pair().await;
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        let up = pattern(5_000_000, 1);
        let down = pattern(3_000_000, 2);
        let (up2, down2) = (up.clone(), down.clone());
        let server = tokio::spawn(async move {
            // The client's KeyUpdate asks the server to update too: its writer does before
            // its next record, and the client must then read under the new key.
            let read = read_all_by_readiness(&mut sr);
            let write = write_all_vectored(&mut sw, &down2, false);
            let (read, write) = tokio::join!(read, write);
            write.expect("server writes");
            read.expect("server reads")
        });
        let read = async {
            let mut got = Vec::new();
            cr.read_to_end(&mut got).await.map(|_| got)
        };
        let write = write_all_vectored(&mut cw, &up2, true);
        let (read, write) = tokio::time::timeout(WAIT, async { tokio::join!(read, write) })
            .await
            .expect("in time");
        write.expect("client writes");
        let down_got = read.expect("client reads");
        let up_got = tokio::time::timeout(WAIT, server)
            .await
            .expect("in time")
            .expect("server task");
        assert!(
            up_got == up,
            "the server read {} bytes, not the client's",
            up_got.len()
        );
        assert!(
            down_got == down,
            "the client read {} bytes, not the server's",
            down_got.len()
        );
    }

    /// The client's Finished, a KeyUpdate asking the server to update, data and a
    /// close_notify reach the server in one read: none of it is lost to the handshake, and
    /// the server's answer (under its updated key) reads at the client.
    #[tokio::test]
    async fn records_in_the_same_read_as_the_clients_finished_are_kept() {
        let (client, server, _dir) = connect(true).await;
        let (mut cr, mut cw) = client.into_split();
        let request = pattern(40_000, 3);
        let answer = pattern(30_000, 4);
        let (request2, answer2) = (request.clone(), answer.clone());
        let server = tokio::spawn(async move {
            let (mut sr, mut sw) = server.await.expect("server handshake").into_split();
            let got = read_all_by_readiness(&mut sr).await.expect("server reads");
            sw.write_all(&answer2).await.expect("server writes");
            sw.shutdown().await.expect("server shuts down");
            got
        });
        let WriteHalf::Tls(t) = &cw else {
            panic!("TLS")
        };
        t.shared.request_key_update(true);
        cw.write_all(&request2).await.expect("client writes");
        cw.shutdown().await.expect("client shuts down");
        let mut got = Vec::new();
        tokio::time::timeout(WAIT, cr.read_to_end(&mut got))
            .await
            .expect("in time")
            .expect("client reads");
        let up = tokio::time::timeout(WAIT, server)
            .await
            .expect("in time")
            .expect("server task");
        assert!(up == request, "the server read {} bytes", up.len());
        assert!(got == answer, "the client read {} bytes", got.len());
    }

    #[tokio::test]
    async fn garbage_after_the_handshake_is_a_typed_error_not_a_panic() {
        let bad: [&[u8]; 4] = [
            // A protected record that does not decrypt.
            &[
                23, 3, 3, 0, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                20,
            ],
            // A record longer than 2^14 + 256 bytes.
            &[23, 3, 3, 0x48, 0x01],
            // A plaintext handshake record after the handshake.
            &[22, 3, 3, 0, 1, 0],
            // The peer closes in the middle of a record (with the server's session tickets
            // unread, so the kernel may reset the connection instead).
            &[23, 3, 3, 0, 40, 1, 2],
        ];
        for bytes in bad {
            let (client, server, _dir) = pair().await;
            let (mut sr, _sw) = server.into_split();
            let mut sent = 0;
            while sent < bytes.len() {
                client.tcp().writable().await.expect("writable");
                sent += client.tcp().try_write(&bytes[sent..]).unwrap_or(0);
            }
            drop(client);
            let got = tokio::time::timeout(WAIT, read_all_by_readiness(&mut sr))
                .await
                .expect("in time");
            let e = got.expect_err("garbage is refused");
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::InvalidData
                        | io::ErrorKind::UnexpectedEof
                        | io::ErrorKind::ConnectionReset
                ),
                "{bytes:?}: {e}"
            );
        }
    }
}
