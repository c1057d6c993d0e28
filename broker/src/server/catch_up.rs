//! How fast each store closes in on the master's high-water mark: the rates behind the
//! estimate `quire cluster status` and the `quire_store_catch_up_ms` metric show for a store
//! that is catching up (issue 15 item 5). The master samples its HWM and every store's acked
//! offset at its ticks, at most every [`SAMPLE_EVERY_MS`], and keeps [`WINDOW_MS`] of
//! samples; a rate is the difference between the newest and the oldest sample in which the
//! store had acked something. The lag itself is read live when asked ([`estimate`]), so an
//! in-sync store always shows 0. Nothing here changes what the master does.

use std::collections::VecDeque;

/// Least time between two samples, in ms.
pub const SAMPLE_EVERY_MS: u64 = 500;
/// Samples older than this behind the newest are dropped, in ms: short, so that the time a
/// store was down does not weigh on its rate once it runs again.
pub const WINDOW_MS: u64 = 3_000;
/// Rates need samples at least this far apart, in ms.
pub const RATE_SPAN_MIN_MS: u64 = 1_000;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Sample {
    at_ms: u64,
    /// One past the master's HWM (0: nothing stabilized).
    stable_end: u64,
    /// Per store slot, one past the last offset it acked (`None`: it acked nothing).
    acked_end: Vec<Option<u64>>,
}

/// The samples of one master's term; [`CatchUp::sample`] starts over when the term changes.
#[derive(Debug, Default)]
pub struct CatchUp {
    /// The master epoch the samples belong to.
    epoch: u64,
    samples: VecDeque<Sample>,
}

/// Offsets per second: `count` over `span_ms`.
fn per_second(count: u64, span_ms: u64) -> u64 {
    count.saturating_mul(1000) / span_ms.max(1)
}

impl CatchUp {
    /// Records the master of `epoch`'s `stable_end` (one past its HWM) and each store's
    /// acked end at `now_ms` (ms on any monotonic clock). Samples closer than
    /// [`SAMPLE_EVERY_MS`] to the newest are skipped; a new epoch drops the old term's.
    pub fn sample(
        &mut self,
        epoch: u64,
        now_ms: u64,
        stable_end: u64,
        acked_end: Vec<Option<u64>>,
    ) {
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
            stable_end,
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

    /// Store `slot`'s ack rate and the HWM's growth, in offsets/s, over the samples in
    /// which the store had acked something; `None` without [`RATE_SPAN_MIN_MS`] of them.
    #[must_use]
    pub fn rates(&self, slot: usize) -> Option<(u64, u64)> {
        let acked = |s: &Sample| s.acked_end.get(slot).copied().flatten();
        let first = self.samples.iter().find(|s| acked(s).is_some())?;
        let last = self.samples.back()?;
        let span_ms = last.at_ms - first.at_ms;
        if span_ms < RATE_SPAN_MIN_MS {
            return None;
        }
        let advanced = acked(last)?.saturating_sub(acked(first)?);
        let grown = last.stable_end.saturating_sub(first.stable_end);
        Some((per_second(advanced, span_ms), per_second(grown, span_ms)))
    }
}

/// The estimated ms until a store that lacks `lag` offsets below the HWM holds them, at
/// `rates` (its ack rate, the HWM's growth): `Some(0)` when it lacks nothing; the lag over
/// the difference of the rates when it acks faster than the HWM grows; a store that keeps
/// pace (at least 90% of the growth) less than a second of its own rate behind (events in
/// flight under load) is rated at its own rate; `None` when it does not close in (or the
/// rates are not known yet).
#[must_use]
pub fn estimate(lag: u64, rates: Option<(u64, u64)>) -> Option<u64> {
    if lag == 0 {
        return Some(0);
    }
    let (rate, growth) = rates?;
    if rate > growth {
        Some(lag.saturating_mul(1000) / (rate - growth))
    } else if rate > 0 && lag <= rate && rate.saturating_mul(10) >= growth.saturating_mul(9) {
        Some(lag.saturating_mul(1000) / rate)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_that_acks_faster_than_the_hwm_grows_gets_an_estimate() {
        let mut c = CatchUp::default();
        // The HWM grows by 100 offsets/s; store 0 keeps up, store 1 closes in at
        // 400 - 100 = 300 offsets/s, store 2 stands still, store 3 never acked.
        for i in 0..=4u64 {
            let t = i * 500;
            let stable = 1_000 + i * 50;
            c.sample(
                7,
                t,
                stable,
                vec![Some(stable), Some(i * 200), Some(10), None],
            );
        }
        assert_eq!(c.rates(0), Some((100, 100)));
        assert_eq!(c.rates(1), Some((400, 100)));
        // At 2 s: HWM end 1,200, acked 800, lag 400 at 300 offsets/s: 1,333 ms.
        assert_eq!(estimate(400, c.rates(1)), Some(1_333));
        assert_eq!(estimate(1_190, c.rates(2)), None, "standing still");
        assert_eq!(c.rates(3), None, "no ack: no rate");
        assert_eq!(estimate(0, c.rates(3)), Some(0), "lacking nothing");
        assert_eq!(
            estimate(3, c.rates(0)),
            Some(30),
            "keeping pace, 3 in flight"
        );
        assert_eq!(estimate(300, c.rates(0)), None, "keeping pace 3 s behind");
        assert_eq!(estimate(3, Some((80, 100))), None, "falling behind");
        assert_eq!(c.rates(9), None, "an unknown slot");
    }

    #[test]
    fn rates_need_a_second_of_samples_and_a_new_term_starts_over() {
        let mut c = CatchUp::default();
        assert_eq!(c.rates(0), None);
        c.sample(3, 0, 100, vec![Some(0)]);
        c.sample(3, 400, 100, vec![Some(50)]); // too soon: skipped
        c.sample(3, 600, 100, vec![Some(60)]);
        assert_eq!(c.rates(0), None);
        c.sample(3, 1_100, 100, vec![Some(100)]);
        assert_eq!(c.rates(0), Some((90, 0)));
        c.sample(4, 1_200, 200, vec![Some(0)]);
        assert_eq!(c.rates(0), None, "the old term's samples are gone");
    }

    #[test]
    fn the_window_forgets_old_samples_and_the_time_a_store_had_not_acked() {
        let mut c = CatchUp::default();
        c.sample(1, 0, 0, vec![Some(0)]);
        c.sample(1, 5_000, 5_000, vec![Some(0)]);
        // Only the newest sample is in the window: no rate yet.
        c.sample(1, 20_000, 20_000, vec![Some(20_000)]);
        assert_eq!(c.rates(0), None);
        c.sample(1, 21_000, 21_000, vec![Some(21_000)]);
        assert_eq!(c.rates(0), Some((1_000, 1_000)));
        // A store that acked nothing for a while is rated from its first ack on.
        let mut c = CatchUp::default();
        c.sample(1, 0, 100, vec![None]);
        c.sample(1, 1_000, 200, vec![None]);
        c.sample(1, 2_000, 300, vec![Some(50)]);
        assert_eq!(c.rates(0), None);
        c.sample(1, 3_000, 400, vec![Some(250)]);
        assert_eq!(c.rates(0), Some((200, 100)));
    }
}
