//! How fast each store closes in on the master's log end: the figures `quire cluster status`
//! and the `quire_store_catch_up_*` metrics show for a store that is catching up (issue 15
//! item 5). The master samples its log end and every store's acked offset at its ticks, at
//! most every [`SAMPLE_EVERY_MS`], and keeps [`WINDOW_MS`] of samples; rates are the
//! difference between the newest and the oldest sample. A store closes in when it acks
//! faster than the log end grows: its estimate is the lag over that difference. Nothing
//! here changes what the master does.

use std::collections::VecDeque;

/// Least time between two samples, in ms.
pub const SAMPLE_EVERY_MS: u64 = 500;
/// Samples older than this behind the newest are dropped, in ms.
pub const WINDOW_MS: u64 = 10_000;
/// Rates need samples at least this far apart, in ms.
pub const RATE_SPAN_MIN_MS: u64 = 1_000;

/// One store's figures, all in the master's view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCatchUp {
    /// Offsets it lacks below the log end.
    pub lag: Option<u64>,
    /// Offsets per second by which its acked offset advanced over the window.
    pub rate: Option<u64>,
    /// Estimated ms until it holds the log end: `Some(0)` when it lacks nothing, `None` when
    /// it does not close in or the window is too short to tell.
    pub eta_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Sample {
    at_ms: u64,
    /// The master's log end (the offset its next event takes).
    end: u64,
    /// Per store slot, the offset after the last one it acked (`None`: it acked nothing).
    acked_end: Vec<Option<u64>>,
}

/// The samples of one master's term; [`CatchUp::sample`] starts over when the term changes.
#[derive(Debug, Default)]
pub struct CatchUp {
    /// The master epoch the samples belong to.
    epoch: u64,
    samples: VecDeque<Sample>,
}

impl CatchUp {
    /// Records the master of `epoch`'s log `end` and each store's acked end at `now_ms`
    /// (ms on any monotonic clock). Samples closer than [`SAMPLE_EVERY_MS`] to the newest
    /// are skipped; a new epoch drops the old term's samples.
    pub fn sample(&mut self, epoch: u64, now_ms: u64, end: u64, acked_end: Vec<Option<u64>>) {
        if epoch != self.epoch {
            self.epoch = epoch;
            self.samples.clear();
        }
        if self
            .samples
            .back()
            .is_some_and(|s| now_ms < s.at_ms + SAMPLE_EVERY_MS)
        {
            return;
        }
        self.samples.push_back(Sample {
            at_ms: now_ms,
            end,
            acked_end,
        });
        while self
            .samples
            .front()
            .is_some_and(|s| s.at_ms + WINDOW_MS < now_ms)
        {
            self.samples.pop_front();
        }
    }

    /// Forgets every sample (this broker is no longer master).
    pub fn clear(&mut self) {
        self.samples.clear();
    }

    /// The figures of store `slot` as of the newest sample; all `None` without samples.
    #[must_use]
    pub fn store(&self, slot: usize) -> StoreCatchUp {
        let (Some(first), Some(last)) = (self.samples.front(), self.samples.back()) else {
            return StoreCatchUp::default();
        };
        let acked_now = last.acked_end.get(slot).copied().flatten();
        let lag = last.end.saturating_sub(acked_now.unwrap_or(0));
        let span_ms = last.at_ms - first.at_ms;
        let rate = (span_ms >= RATE_SPAN_MIN_MS).then(|| {
            let before = first.acked_end.get(slot).copied().flatten().unwrap_or(0);
            per_second(acked_now.unwrap_or(0).saturating_sub(before), span_ms)
        });
        let eta_ms = if lag == 0 {
            Some(0)
        } else {
            rate.and_then(|r| {
                let growth = per_second(last.end.saturating_sub(first.end), span_ms);
                (r > growth).then(|| lag.saturating_mul(1000) / (r - growth))
            })
        };
        StoreCatchUp {
            lag: Some(lag),
            rate,
            eta_ms,
        }
    }
}

fn per_second(count: u64, span_ms: u64) -> u64 {
    count.saturating_mul(1000) / span_ms.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_that_acks_faster_than_the_log_grows_gets_an_estimate() {
        let mut c = CatchUp::default();
        // The log end grows by 100 offsets/s; store 0 keeps up, store 1 closes in at
        // 400 - 100 = 300 offsets/s, store 2 stands still, store 3 never acked.
        for i in 0..=4u64 {
            let t = i * 500;
            let end = 1_000 + i * 50;
            c.sample(7, t, end, vec![Some(end), Some(i * 200), Some(10), None]);
        }
        let s = c.store(0);
        assert_eq!((s.lag, s.rate, s.eta_ms), (Some(0), Some(100), Some(0)));
        let s = c.store(1);
        // At 2 s: end 1,200, acked 800, lag 400 at 300 offsets/s: 1,333 ms.
        assert_eq!(
            (s.lag, s.rate, s.eta_ms),
            (Some(400), Some(400), Some(1_333))
        );
        let s = c.store(2);
        assert_eq!((s.lag, s.rate, s.eta_ms), (Some(1_190), Some(0), None));
        let s = c.store(3);
        assert_eq!((s.lag, s.rate, s.eta_ms), (Some(1_200), Some(0), None));
        assert_eq!(
            c.store(9).lag,
            Some(1_200),
            "an unknown slot lacks everything"
        );
    }

    #[test]
    fn rates_need_a_second_of_samples_and_a_new_term_starts_over() {
        let mut c = CatchUp::default();
        assert_eq!(c.store(0), StoreCatchUp::default());
        c.sample(3, 0, 100, vec![Some(0)]);
        c.sample(3, 400, 100, vec![Some(50)]); // too soon: skipped
        c.sample(3, 600, 100, vec![Some(60)]);
        let s = c.store(0);
        assert_eq!((s.lag, s.rate, s.eta_ms), (Some(40), None, None));
        c.sample(3, 1_100, 100, vec![Some(100)]);
        assert_eq!(c.store(0).eta_ms, Some(0));
        c.sample(4, 1_200, 200, vec![Some(0)]);
        assert_eq!(c.store(0).rate, None, "the old term's samples are gone");
    }

    #[test]
    fn samples_older_than_the_window_are_dropped() {
        let mut c = CatchUp::default();
        c.sample(1, 0, 0, vec![Some(0)]);
        c.sample(1, 5_000, 5_000, vec![Some(0)]);
        c.sample(1, 20_000, 20_000, vec![Some(20_000)]);
        // Only the 20 s sample is in the window: no rate yet.
        assert_eq!(c.store(0).rate, None);
        c.sample(1, 21_000, 21_000, vec![Some(21_000)]);
        assert_eq!(c.store(0).rate, Some(1_000));
    }
}
