//! The answering side of a connection: [`ConnBytes`], the per-connection bound on the
//! bytes of requests being served **and of their responses until they are written to the
//! socket**, the [`OutFrame`] a response is queued as, and [`write_frames`], which writes
//! queued frames and gives their bytes back as they leave.
//!
//! ```text
//!  reader ── acquire(cost) ──▶ request served ──▶ OutFrame{parts, held} ──▶ queue ──▶ write_frames
//!   (waits while the          (store, a read                 (try_send only)        (drops a frame,
//!    connection's bytes        task, the actor)                                       and so its held
//!    are used up)                                                                     bytes, once the
//!                                                                                     socket took it)
//! ```
//!
//! A server takes a [`BytesHeld`] for each request before serving it (its frame bytes, or
//! the bound of the response it may produce, such as a read's), keeps it while the request
//! is served, and moves it into the response's [`OutFrame`]; [`BytesHeld::fit`] resizes it
//! to the response's encoded length first, without waiting. So a peer that sends requests
//! and never reads the answers stops being read once `bytes_max` of answers wait for it
//! (TCP pushes back on it), instead of making the server queue responses without limit;
//! the writer then closes it after [`WRITE_STALL_TIMEOUT`] without progress.
//!
//! What it does not own: how a response is encoded (`quire-proto`), the queue between
//! whoever answers and the writer (each server's, bounded in frames), and when a
//! connection is closed.
//!
//! The bound is exact for responses no larger than the bytes their request held; a
//! response that is larger takes the difference if it is free and otherwise goes out
//! over the bound (only ever by what its request could not foresee: an error text, an
//! event larger than a read's byte bound).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long one socket write may make no progress before the connection is closed.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Buffers handed to one vectored write at most (Linux's `IOV_MAX`).
pub const IOV_MAX: usize = 1024;

/// Where the answering side reports itself (a server registers it in its own registry).
#[derive(Clone, Debug, Default)]
pub struct ResponseMetrics {
    /// Bytes of encoded responses queued and not yet written to their sockets, across all
    /// connections.
    pub queued_bytes: Gauge,
}

impl ResponseMetrics {
    /// Registers the gauge in `r` (under the registry's prefix) as
    /// `response_bytes_queued`, the name node and broker both expose.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "response_bytes_queued",
            "Bytes of encoded responses queued for their connections and not yet written to the socket",
            self.queued_bytes.clone(),
        );
    }
}

/// One connection's byte bound; cheap to clone (all clones share it).
#[derive(Clone, Debug)]
pub struct ConnBytes {
    sem: Arc<Semaphore>,
    bytes_max: usize,
}

impl ConnBytes {
    /// A bound of `bytes_max` bytes.
    ///
    /// # Panics
    /// If `bytes_max` is 0 or above `u32::MAX` (settings are checked before).
    #[must_use]
    pub fn new(bytes_max: usize) -> ConnBytes {
        assert!(
            (1..=u32::MAX as usize).contains(&bytes_max),
            "a connection's byte bound of {bytes_max} is outside 1..={}",
            u32::MAX
        );
        ConnBytes {
            sem: Arc::new(Semaphore::new(bytes_max)),
            bytes_max,
        }
    }

    /// The bound, in bytes.
    #[must_use]
    pub fn bytes_max(&self) -> usize {
        self.bytes_max
    }

    /// Bytes free now.
    #[must_use]
    pub fn available_bytes(&self) -> usize {
        self.sem.available_permits()
    }

    /// Takes `bytes` (at least 1, at most the whole bound), waiting while they are not
    /// free. Cancel-safe: a caller that stops waiting takes nothing.
    pub async fn acquire(&self, bytes: usize) -> BytesHeld {
        let n = u32::try_from(bytes.clamp(1, self.bytes_max))
            .expect("invariant: bytes_max is at most u32::MAX");
        let permit = self
            .sem
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("invariant: a connection's byte semaphore is never closed");
        BytesHeld {
            permit,
            sem: self.sem.clone(),
        }
    }
}

/// Bytes of a [`ConnBytes`] held; given back when dropped.
#[derive(Debug)]
pub struct BytesHeld {
    permit: OwnedSemaphorePermit,
    sem: Arc<Semaphore>,
}

impl BytesHeld {
    /// Bytes held.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.permit.num_permits()
    }

    /// Resizes the charge to `bytes` (at least 1) without waiting: gives back what is held
    /// beyond it, or takes the difference if it is free now (if not, keeps what it holds).
    pub fn fit(&mut self, bytes: usize) {
        let bytes = bytes.max(1);
        let held = self.bytes();
        if bytes < held {
            drop(self.permit.split(held - bytes));
        } else if bytes > held {
            let Ok(more) = u32::try_from(bytes - held) else {
                return;
            };
            if let Ok(p) = self.sem.clone().try_acquire_many_owned(more) {
                self.permit.merge(p);
            }
        }
    }
}

/// One encoded response queued for a connection's writer, with what it holds until the
/// socket took its last byte.
#[derive(Debug)]
pub struct OutFrame {
    parts: VecDeque<Bytes>,
    /// Bytes not yet written (counted in the queued-bytes gauge).
    bytes_left: usize,
    gauge: Gauge,
    _held: Option<BytesHeld>,
    _held_shared: Option<BytesHeld>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl OutFrame {
    /// A frame of `parts` (header first), counted in `metrics` until written or dropped.
    #[must_use]
    pub fn new(parts: Vec<Bytes>, metrics: &ResponseMetrics) -> OutFrame {
        let bytes_left = parts.iter().map(Bytes::len).sum();
        metrics
            .queued_bytes
            .inc_by(i64::try_from(bytes_left).unwrap_or(i64::MAX));
        OutFrame {
            parts: parts.into(),
            bytes_left,
            gauge: metrics.queued_bytes.clone(),
            _held: None,
            _held_shared: None,
            _permit: None,
        }
    }

    /// Holds `held` (first [fitted](BytesHeld::fit) to the frame's length) until the frame
    /// is written or dropped.
    #[must_use]
    pub fn holding(mut self, mut held: BytesHeld) -> OutFrame {
        held.fit(self.bytes_left);
        self._held = Some(held);
        self
    }

    /// Holds `held`, bytes of a budget shared by every connection (a server-wide bound on
    /// responses), [fitted](BytesHeld::fit) to the frame's length, until the frame is
    /// written or dropped: beside what [`OutFrame::holding`] holds, not instead.
    #[must_use]
    pub fn holding_shared(mut self, mut held: BytesHeld) -> OutFrame {
        held.fit(self.bytes_left);
        self._held_shared = Some(held);
        self
    }

    /// Holds another permit (a request slot, say) until the frame is written or dropped.
    #[must_use]
    pub fn holding_permit(mut self, permit: OwnedSemaphorePermit) -> OutFrame {
        self._permit = Some(permit);
        self
    }

    /// Bytes not yet written.
    #[must_use]
    pub fn bytes_left(&self) -> usize {
        self.bytes_left
    }

    /// Marks `n` bytes (at most what is left) as written; returns the bytes of `n` it did
    /// not take.
    fn advance(&mut self, mut n: usize) -> usize {
        while n > 0 {
            let Some(front) = self.parts.front_mut() else {
                break;
            };
            let took = front.len().min(n);
            front.advance(took);
            n -= took;
            self.bytes_left -= took;
            self.gauge.dec_by(i64::try_from(took).unwrap_or(i64::MAX));
            if front.is_empty() {
                self.parts.pop_front();
            }
        }
        n
    }
}

impl Drop for OutFrame {
    fn drop(&mut self) {
        if self.bytes_left > 0 {
            self.gauge
                .dec_by(i64::try_from(self.bytes_left).unwrap_or(i64::MAX));
        }
    }
}

/// Writes every frame of `queue` (emptying it) with vectored writes of at most
/// [`IOV_MAX`] buffers; each frame is dropped — its held bytes given back — as soon as its
/// last byte is written.
///
/// # Errors
/// The socket's error; `TimedOut` if one write makes no progress for
/// [`WRITE_STALL_TIMEOUT`]; `WriteZero` if the socket accepts nothing. The frames not yet
/// written stay in `queue`.
pub async fn write_frames<W>(w: &mut W, queue: &mut VecDeque<OutFrame>) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    write_frames_within(w, queue, WRITE_STALL_TIMEOUT).await
}

/// [`write_frames`] with a stall bound of `stall` instead of [`WRITE_STALL_TIMEOUT`]
/// (servers take it as a parameter so their tests need not wait 30 s).
///
/// # Errors
/// As [`write_frames`]: `TimedOut` if one write makes no progress for `stall`.
pub async fn write_frames_within<W>(
    w: &mut W,
    queue: &mut VecDeque<OutFrame>,
    stall: Duration,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    while !queue.is_empty() {
        let written = {
            let slices: Vec<IoSlice<'_>> = queue
                .iter()
                .flat_map(|f| f.parts.iter())
                .take(IOV_MAX)
                .map(|b| IoSlice::new(b))
                .collect();
            match tokio::time::timeout(stall, w.write_vectored(&slices)).await {
                Ok(r) => r?,
                Err(_) => return Err(stalled()),
            }
        };
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the socket accepted no bytes",
            ));
        }
        let mut left = written;
        while left > 0 {
            let front = queue
                .front_mut()
                .expect("invariant: written bytes came from queued frames");
            left = front.advance(left);
            if front.bytes_left == 0 {
                queue.pop_front();
            }
        }
    }
    // A TLS writer may hold the last bytes in its own buffer until flushed (a no-op for
    // plaintext TCP).
    match tokio::time::timeout(stall, w.flush()).await {
        Ok(r) => r,
        Err(_) => Err(stalled()),
    }
}

fn stalled() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the peer took no bytes for too long",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn frame(len: usize, metrics: &ResponseMetrics) -> OutFrame {
        let half = len / 2;
        OutFrame::new(
            vec![
                Bytes::from(vec![1u8; half]),
                Bytes::from(vec![2u8; len - half]),
            ],
            metrics,
        )
    }

    #[tokio::test]
    async fn fit_shrinks_and_grows_without_waiting() {
        let conn = ConnBytes::new(1000);
        let mut a = conn.acquire(600).await;
        a.fit(100);
        assert_eq!((a.bytes(), conn.available_bytes()), (100, 900));
        a.fit(700);
        assert_eq!((a.bytes(), conn.available_bytes()), (700, 300));
        let b = conn.acquire(300).await;
        // Nothing free: keeps what it holds rather than wait.
        a.fit(900);
        assert_eq!(a.bytes(), 700);
        a.fit(0);
        assert_eq!(a.bytes(), 1);
        drop((a, b));
        assert_eq!(conn.available_bytes(), 1000);
        // Asking for more than the bound takes the whole bound, not forever.
        assert_eq!(conn.acquire(5000).await.bytes(), 1000);
    }

    /// The story: a store freed a request's bytes once its response was queued, so a peer
    /// that sent reads and never read the answers had the store queue 1.46 GB for it.
    /// Held bytes now go back only as the socket takes the frames.
    #[tokio::test]
    async fn held_bytes_come_back_only_as_frames_are_written() {
        let metrics = ResponseMetrics::default();
        let conn = ConnBytes::new(1 << 20);
        let (mut client, server) = tokio::io::duplex(4096);
        let (_server_read, mut server_write) = tokio::io::split(server);
        let mut queue = VecDeque::new();
        for _ in 0..4 {
            let held = conn.acquire(256 * 1024).await;
            queue.push_back(frame(100_000, &metrics).holding(held));
        }
        // Fitted to the frames' lengths, and all counted as queued.
        assert_eq!(conn.available_bytes(), (1 << 20) - 400_000);
        assert_eq!(metrics.queued_bytes.get(), 400_000);
        // The peer reads nothing: the write stalls and fails, holding everything not sent.
        let stalled =
            write_frames_within(&mut server_write, &mut queue, Duration::from_millis(50)).await;
        assert_eq!(stalled.map_err(|e| e.kind()), Err(io::ErrorKind::TimedOut));
        assert_eq!(queue.len(), 4);
        assert_eq!(metrics.queued_bytes.get(), 400_000 - 4096);
        assert_eq!(conn.available_bytes(), (1 << 20) - 400_000);
        // The peer reads: every frame leaves, and everything comes back.
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = vec![0u8; 65536];
            while got.len() < 400_000 {
                let n = client.read(&mut buf).await.expect("reads");
                assert!(n > 0, "the writer closed early");
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
        write_frames(&mut server_write, &mut queue)
            .await
            .expect("written");
        assert!(queue.is_empty());
        assert_eq!(metrics.queued_bytes.get(), 0);
        assert_eq!(conn.available_bytes(), 1 << 20);
        let got = reader.await.expect("reader");
        assert_eq!(got.len(), 400_000);
        assert!(got[..50_000].iter().all(|&b| b == 1));
        assert!(got[50_000..100_000].iter().all(|&b| b == 2));
    }

    #[tokio::test]
    async fn a_dropped_frame_gives_everything_back() {
        let metrics = ResponseMetrics::default();
        let conn = ConnBytes::new(1000);
        let held = conn.acquire(1000).await;
        let f = frame(10, &metrics).holding(held);
        assert_eq!(
            (metrics.queued_bytes.get(), conn.available_bytes()),
            (10, 990)
        );
        drop(f);
        assert_eq!(
            (metrics.queued_bytes.get(), conn.available_bytes()),
            (0, 1000)
        );
    }
}
