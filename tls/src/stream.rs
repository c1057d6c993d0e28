//! One connection type for plaintext and TLS, split into halves that read and write apart.
//!
//! The server's frame reader waits until a socket is readable before it takes room in the
//! read budget, then reads without blocking (`readable` + `try_read`), so an idle
//! connection holds no budget. A TLS stream has no such readiness of its own: its
//! [`ReadHalf`] decrypts into a staging buffer of at most [`STAGED_BYTES`] when asked for
//! readiness, and `try_read` hands out of that buffer. So a TLS connection may hold up to
//! `STAGED_BYTES` outside the budget while bytes wait in it (it is given back once drained),
//! plus what rustls itself buffers (at most a record). Handshakes are bounded apart
//! (quire-net's `TLS_HANDSHAKES_MAX`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BufMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// Most decrypted bytes a TLS [`ReadHalf`] holds between readiness and reads: one TLS
/// record's plaintext (RFC 8446 §5.1: at most 2^14 bytes).
pub const STAGED_BYTES: usize = 16 * 1024;

type Tls = tokio_rustls::TlsStream<TcpStream>;

/// A connection: plaintext TCP, or TLS over TCP after its handshake.
#[derive(Debug)]
pub enum Stream {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS, handshake done.
    Tls(Box<Tls>),
}

impl Stream {
    /// The TCP socket underneath.
    #[must_use]
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
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
            Stream::Tls(s) => s
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.as_ref()),
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
                let (r, w) = tokio::io::split(*s);
                (
                    ReadHalf::Tls(Box::new(TlsRead {
                        half: r,
                        staged: Vec::new(),
                        start: 0,
                        eof: false,
                        error: None,
                    })),
                    WriteHalf::Tls(w),
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
    /// TLS: decrypted bytes staged on readiness.
    Tls(Box<TlsRead>),
}

/// The state of a TLS [`ReadHalf`].
#[derive(Debug)]
pub struct TlsRead {
    half: tokio::io::ReadHalf<Tls>,
    /// Decrypted bytes not handed out yet: `staged[start..]`.
    staged: Vec<u8>,
    start: usize,
    /// The peer closed (a TLS close_notify, or the TCP end).
    eof: bool,
    /// An error met while staging, handed out by the next read.
    error: Option<io::Error>,
}

impl TlsRead {
    fn pending(&self) -> usize {
        self.staged.len() - self.start
    }

    async fn stage(&mut self) {
        if self.pending() > 0 || self.eof || self.error.is_some() {
            return;
        }
        self.staged.clear();
        self.start = 0;
        self.staged.reserve_exact(STAGED_BYTES);
        // Cancel-safe: read_buf takes bytes only when it completes.
        match self
            .half
            .read_buf(&mut (&mut self.staged).limit(STAGED_BYTES))
            .await
        {
            Ok(0) => self.eof = true,
            Ok(_) => {}
            Err(e) => self.error = Some(e),
        }
    }

    fn take(&mut self, buf: &mut impl BufMut) -> io::Result<usize> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let n = self.pending().min(buf.remaining_mut());
        if n == 0 {
            if self.eof || buf.remaining_mut() == 0 {
                return Ok(0);
            }
            return Err(io::ErrorKind::WouldBlock.into());
        }
        buf.put_slice(&self.staged[self.start..self.start + n]);
        self.start += n;
        self.release_if_drained();
        Ok(n)
    }

    /// Gives the staging buffer back once it is drained, so an idle TLS connection holds
    /// none of it (a plaintext one holds nothing either); the next readiness allocates it
    /// again (one allocation per record read, beside rustls's decryption of it).
    fn release_if_drained(&mut self) {
        if self.pending() == 0 {
            self.staged = Vec::new();
            self.start = 0;
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
            ReadHalf::Tls(t) => {
                t.stage().await;
                Ok(())
            }
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
            ReadHalf::Tls(t) => {
                if let Some(e) = t.error.take() {
                    return Poll::Ready(Err(e));
                }
                if t.pending() > 0 {
                    let n = t.pending().min(buf.remaining());
                    buf.put_slice(&t.staged[t.start..t.start + n]);
                    t.start += n;
                    t.release_if_drained();
                    return Poll::Ready(Ok(()));
                }
                if t.eof {
                    return Poll::Ready(Ok(()));
                }
                Pin::new(&mut t.half).poll_read(cx, buf)
            }
        }
    }
}

/// The writing half of a [`Stream`]. Writes to a TLS half may stay in rustls's buffer
/// until the half is flushed: writers flush when their queue is empty.
#[derive(Debug)]
pub enum WriteHalf {
    /// Plaintext.
    Plain(OwnedWriteHalf),
    /// TLS.
    Tls(tokio::io::WriteHalf<Tls>),
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            WriteHalf::Tls(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WriteHalf::Plain(w) => w.is_write_vectored(),
            WriteHalf::Tls(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}
