//! The one source of randomness of a run: a ChaCha8 generator seeded from the run's seed.
//!
//! ChaCha8 (`rand_chacha`) is documented to give the same stream for the same seed on every
//! platform and build, so a seed printed by a failing run replays the run exactly. Every
//! random choice of the simulation — network delays and losses, faults, workload, the
//! seeds handed to the cores' election jitter — is drawn from it, in event order.

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The run's random source. See the module docs.
#[derive(Debug)]
pub(crate) struct SimRng(ChaCha8Rng);

impl SimRng {
    /// A generator for `seed`.
    pub(crate) fn new(seed: u64) -> SimRng {
        SimRng(ChaCha8Rng::seed_from_u64(seed))
    }

    /// `true` with probability `p` (clamped to `0.0..=1.0`).
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        self.0.random_bool(p.min(1.0))
    }

    /// A uniform value in `lo..=hi` (`lo` when `hi < lo`).
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        self.0.random_range(lo..=hi)
    }

    /// A uniform index in `0..n`.
    ///
    /// # Panics
    /// If `n` is 0.
    pub(crate) fn index(&mut self, n: usize) -> usize {
        assert!(n > 0, "an index into nothing");
        self.0.random_range(0..n)
    }

    /// A uniform value in `lo..hi` as a float.
    pub(crate) fn float(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.0.random::<f64>()
    }

    /// 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
}
