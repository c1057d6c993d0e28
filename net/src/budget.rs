//! [`ReadBudget`]: the server-wide bound on bytes buffered for incoming frames.
//!
//! Every byte a [`crate::FrameReader`] holds in its buffer (a frame received in part, or
//! whole and not yet decoded) holds one permit of the budget; a frame's permits go back
//! as soon as it is decoded and handed to the server (from then on the server's own
//! request bounds cover it). Before each socket read a reader takes permits for the room
//! it reads into and returns those the read did not fill. With no permits left, readers
//! wait: they stop reading, their peers' TCP windows fill, and the peers stop sending.
//! Like Kafka's `queued.max.request.bytes` memory pool, but charged as bytes arrive
//! rather than for a frame's whole announced length, so a header that announces 16 MiB
//! costs nothing until the 16 MiB are actually sent.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::reader::READ_ROOM_BYTES_MIN;

/// Where a budget reports itself (a server registers both in its own registry).
#[derive(Clone, Debug, Default)]
pub struct BudgetMetrics {
    /// Bytes of the budget held (buffered bytes, and room taken for reads in progress).
    pub in_use_bytes: Gauge,
    /// Reads that had to wait for the budget (the budget was used up).
    pub waits: Counter,
}

impl BudgetMetrics {
    /// Registers both in `r` (under the registry's prefix) as `read_buffer_bytes` and
    /// `read_budget_waits`, the names node and broker both expose.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "read_buffer_bytes",
            "Bytes of the read budget held by incoming frames (the read_buffer_bytes_max setting bounds it)",
            self.in_use_bytes.clone(),
        );
        r.register(
            "read_budget_waits",
            "Socket reads that waited because the read budget was used up",
            self.waits.clone(),
        );
    }
}

/// The server-wide read budget; cheap to clone (all clones share it).
#[derive(Clone, Debug)]
pub struct ReadBudget {
    sem: Arc<Semaphore>,
    bytes_max: usize,
    metrics: BudgetMetrics,
    /// A reader holding at most this many bytes does not pay for budget waits with its
    /// partial-frame clock (see [`ReadBudget::with_fair_share`]); 0: every reader pays.
    small_holder_bytes: usize,
}

impl ReadBudget {
    /// A budget of `bytes_max` bytes.
    ///
    /// # Panics
    /// If `bytes_max` is below [`READ_ROOM_BYTES_MIN`] or above what a semaphore holds
    /// (settings are checked by [`crate::ReadSettings::validate`] first).
    #[must_use]
    pub fn new(bytes_max: usize, metrics: BudgetMetrics) -> ReadBudget {
        assert!(
            (READ_ROOM_BYTES_MIN..=Semaphore::MAX_PERMITS).contains(&bytes_max),
            "read budget of {bytes_max} bytes is outside {READ_ROOM_BYTES_MIN}..={}",
            Semaphore::MAX_PERMITS
        );
        ReadBudget {
            sem: Arc::new(Semaphore::new(bytes_max)),
            bytes_max,
            metrics,
            small_holder_bytes: 0,
        }
    }

    /// Shields small frames from large ones: a reader that holds at most half its fair
    /// share of the budget (`bytes_max / connections`, with `connections` the most that
    /// can be open at once) waits for the budget without its partial-frame clock running.
    /// Without this, peers that fill the budget with large partial frames (each of them
    /// closed after the partial-frame timeout, as they should be) also time out an honest
    /// peer's 100-byte frame that waited behind them (a break-it trial and a CI run: the
    /// store closed a master's append connection during such an attack). Readers above the
    /// threshold still pay, so the budget cannot be held for good: those that hold no more
    /// than the threshold hold at most half the budget together, which leaves the other
    /// half to readers whose clocks run.
    #[must_use]
    pub fn with_fair_share(mut self, connections: usize) -> ReadBudget {
        self.small_holder_bytes = self.bytes_max / 2 / connections.max(1);
        self
    }

    /// See [`ReadBudget::with_fair_share`]: bytes a reader may hold and still wait for the
    /// budget without its partial-frame clock running.
    #[must_use]
    pub fn small_holder_bytes(&self) -> usize {
        self.small_holder_bytes
    }

    /// The budget's size, in bytes.
    #[must_use]
    pub fn bytes_max(&self) -> usize {
        self.bytes_max
    }

    /// Bytes of the budget free now.
    #[must_use]
    pub fn available_bytes(&self) -> usize {
        self.sem.available_permits()
    }

    /// Takes `bytes` of the budget, waiting while they are not free (cancel-safe).
    pub(crate) async fn acquire(&self, bytes: usize) -> Charge {
        let n = u32::try_from(bytes.min(self.bytes_max))
            .expect("invariant: a read's room is at most READ_ROOM_BYTES_MAX");
        let permit = match self.sem.clone().try_acquire_many_owned(n) {
            Ok(p) => p,
            Err(_) => {
                self.metrics.waits.inc();
                self.sem
                    .clone()
                    .acquire_many_owned(n)
                    .await
                    .expect("invariant: the read budget's semaphore is never closed")
            }
        };
        self.metrics.in_use_bytes.inc_by(i64::from(n));
        Charge {
            permit: Some(permit),
            gauge: self.metrics.in_use_bytes.clone(),
        }
    }

    /// An empty charge to merge others into.
    pub(crate) fn empty_charge(&self) -> Charge {
        Charge {
            permit: None,
            gauge: self.metrics.in_use_bytes.clone(),
        }
    }
}

/// Bytes of a [`ReadBudget`] held; given back when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    permit: Option<OwnedSemaphorePermit>,
    gauge: Gauge,
}

impl Charge {
    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.permit
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Moves `bytes` of `other` into this charge and gives the rest of `other` back.
    pub(crate) fn take_from(&mut self, other: &mut Charge, bytes: usize) {
        assert!(
            bytes <= other.bytes(),
            "invariant: a read fills at most its room"
        );
        if bytes == 0 {
            return;
        }
        let Some(src) = other.permit.as_mut() else {
            return;
        };
        let moved = if bytes == src.num_permits() {
            other.permit.take()
        } else {
            src.split(bytes)
        };
        let Some(moved) = moved else {
            return;
        };
        match self.permit.as_mut() {
            Some(p) => p.merge(moved),
            None => self.permit = Some(moved),
        }
    }

    /// Gives `bytes` back to the budget.
    pub(crate) fn release(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes());
        if bytes == 0 {
            return;
        }
        let Some(p) = self.permit.as_mut() else {
            return;
        };
        if bytes == p.num_permits() {
            self.permit = None;
        } else {
            drop(p.split(bytes));
        }
        self.gauge.dec_by(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let bytes = self.bytes();
        if bytes > 0 {
            self.gauge.dec_by(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn charges_move_and_come_back() {
        let metrics = BudgetMetrics::default();
        let budget = ReadBudget::new(64 * 1024, metrics.clone());
        let mut held = budget.empty_charge();
        let mut room = budget.acquire(10_000).await;
        assert_eq!(budget.available_bytes(), 64 * 1024 - 10_000);
        held.take_from(&mut room, 3_000);
        drop(room);
        assert_eq!(held.bytes(), 3_000);
        assert_eq!(budget.available_bytes(), 64 * 1024 - 3_000);
        assert_eq!(metrics.in_use_bytes.get(), 3_000);
        let mut all = budget.acquire(1_000).await;
        held.take_from(&mut all, 1_000);
        assert_eq!(all.bytes(), 0);
        held.release(2_500);
        assert_eq!(held.bytes(), 1_500);
        assert_eq!(metrics.in_use_bytes.get(), 1_500);
        drop(held);
        assert_eq!(budget.available_bytes(), 64 * 1024);
        assert_eq!(metrics.in_use_bytes.get(), 0);
        assert_eq!(metrics.waits.get(), 0);
    }
}
