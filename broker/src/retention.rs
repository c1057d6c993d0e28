//! Retention: where the master may trim the log, as a pure planner (no clock, no I/O).
//!
//! The broker feeds the planner every stabilized event it applies, in order, with its
//! payload size ([`TrimPlanner::stabilized`]), and calls [`TrimPlanner::tick`] on each
//! heartbeat tick with its own monotonic time in milliseconds. A tick takes a **mark**
//! `(next, bytes_below, at_ms)`: every event below `next` was stabilized by `at_ms`, and
//! the stabilized payload bytes below `next` total `bytes_below`. A mark's `next` is at
//! most HWM + 1, so a trim point taken from a mark never lies above the HWM.
//!
//! The trim point is the highest mark `next` allowed by either limit (as Kafka: a segment
//! goes when either limit says so):
//! - `bytes_max`: the bytes from the mark on are at least `bytes_max` — the newest
//!   `bytes_max` payload bytes (or more) are always kept;
//! - `age_ms_max`: the mark is at least `age_ms_max` old — everything below it was
//!   stabilized at least that long ago.
//!
//! The master proposes the point as a Trim event through the quorum path; stores then delete
//! whole segments wholly below it (docs/protocol.md, "Retention"). Marks are bounded
//! ([`RETENTION_MARKS_MAX`], oldest dropped: that only delays a trim, never hastens it),
//! and kept only in memory: a broker that starts (or takes over) counts the events it
//! applies from then on, so it trims nothing it has not accounted for.

use std::collections::VecDeque;

use quire_proto::Offset;

/// Marks kept at most (one per heartbeat tick that saw new stabilized events).
pub const RETENTION_MARKS_MAX: usize = 4096;

/// The retention settings. `None` is no limit; both `None` keeps everything (the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Keep at least this many payload bytes of the newest stabilized events, in bytes.
    pub bytes_max: Option<u64>,
    /// Keep events stabilized less than this long ago, in milliseconds.
    pub age_ms_max: Option<u64>,
}

impl RetentionPolicy {
    /// Whether the policy keeps everything.
    #[must_use]
    pub fn is_off(&self) -> bool {
        self.bytes_max.is_none() && self.age_ms_max.is_none()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mark {
    next: Offset,
    bytes_below: u64,
    at_ms: u64,
}

/// Decides trim points from stabilized events and time. See the module docs.
#[derive(Clone, Debug)]
pub struct TrimPlanner {
    policy: RetentionPolicy,
    marks: VecDeque<Mark>,
    /// Payload bytes of every event fed so far.
    bytes_total: u64,
    /// One past the last event fed.
    next: Offset,
    /// The highest trim point proposed or applied.
    trimmed: Offset,
}

impl TrimPlanner {
    /// A planner for a log whose next stabilized event is `next`.
    #[must_use]
    pub fn new(policy: RetentionPolicy, next: Offset) -> TrimPlanner {
        TrimPlanner {
            policy,
            marks: VecDeque::new(),
            bytes_total: 0,
            next,
            trimmed: Offset::ZERO,
        }
    }

    /// Feeds the stabilized event at `offset` with `payload_bytes` of payload.
    ///
    /// # Panics
    /// If events are not fed in order without gaps (a driver bug).
    pub fn stabilized(&mut self, offset: Offset, payload_bytes: u64) {
        assert_eq!(offset, self.next, "stabilized events are fed in order");
        self.next = offset.next();
        self.bytes_total += payload_bytes;
    }

    /// Records that the log is trimmed below `before` (a Trim event was applied): no point
    /// at or below it is proposed again.
    pub fn trimmed(&mut self, before: Offset) {
        self.trimmed = self.trimmed.max(before);
        while self.marks.front().is_some_and(|m| m.next <= self.trimmed) {
            self.marks.pop_front();
        }
    }

    /// Takes a mark at `now_ms` (monotonic milliseconds) if events were fed since the last
    /// one. A slave calls this on each heartbeat tick, so that on becoming master it already
    /// knows how old the events it applied are.
    pub fn mark(&mut self, now_ms: u64) {
        if self.policy.is_off() {
            return;
        }
        if self.marks.back().is_none_or(|m| m.next < self.next) {
            if self.marks.len() == RETENTION_MARKS_MAX {
                self.marks.pop_front();
            }
            self.marks.push_back(Mark {
                next: self.next,
                bytes_below: self.bytes_total,
                at_ms: now_ms,
            });
        }
    }

    /// Takes a mark at `now_ms` and returns the trim point the policy allows, if it is above
    /// the last one proposed or applied. Records nothing: call [`TrimPlanner::trimmed`] once
    /// the point is proposed.
    pub fn plan(&mut self, now_ms: u64) -> Option<Offset> {
        if self.policy.is_off() {
            return None;
        }
        self.mark(now_ms);
        let by_bytes = self.policy.bytes_max.and_then(|max| {
            self.marks
                .iter()
                .rev()
                .find(|m| self.bytes_total - m.bytes_below >= max)
                .map(|m| m.next)
        });
        let by_age = self.policy.age_ms_max.and_then(|max| {
            self.marks
                .iter()
                .rev()
                .find(|m| m.at_ms.saturating_add(max) <= now_ms)
                .map(|m| m.next)
        });
        let point = by_bytes.max(by_age)?;
        (point > self.trimmed).then_some(point)
    }

    /// A heartbeat tick at `now_ms` (monotonic milliseconds): takes a mark and returns a
    /// new trim point to propose, if the policy allows one above the last, recording it as
    /// proposed ([`TrimPlanner::plan`] then [`TrimPlanner::trimmed`]).
    pub fn tick(&mut self, now_ms: u64) -> Option<Offset> {
        let point = self.plan(now_ms)?;
        self.trimmed(point);
        Some(point)
    }

    /// The highest trim point proposed or applied.
    #[must_use]
    pub fn trim_point(&self) -> Offset {
        self.trimmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(p: &mut TrimPlanner, from: u64, to: u64, bytes: u64) {
        for o in from..to {
            p.stabilized(Offset(o), bytes);
        }
    }

    #[test]
    fn off_keeps_everything() {
        let mut p = TrimPlanner::new(RetentionPolicy::default(), Offset::ZERO);
        feed(&mut p, 0, 1000, 1 << 20);
        assert_eq!(p.tick(0), None);
        assert_eq!(p.tick(u64::MAX), None);
    }

    #[test]
    fn bytes_limit_keeps_at_least_the_newest_bytes_max() {
        let policy = RetentionPolicy {
            bytes_max: Some(1000),
            age_ms_max: None,
        };
        let mut p = TrimPlanner::new(policy, Offset::ZERO);
        feed(&mut p, 0, 10, 100); // 1000 bytes below 10
        assert_eq!(p.tick(1), None, "exactly the limit: nothing may go yet");
        feed(&mut p, 10, 15, 100);
        // Marks at 10 (1000 below) and 15 (1500 below): from 10 on there are 500 bytes,
        // from the start 1500: still nothing to trim at a mark.
        assert_eq!(p.tick(2), None);
        feed(&mut p, 15, 25, 100);
        // Mark 25 (2500). From mark 15 on: 1000 bytes >= 1000: trim below 15.
        assert_eq!(p.tick(3), Some(Offset(15)));
        assert_eq!(p.tick(4), None, "nothing new");
        feed(&mut p, 25, 40, 100);
        // Mark 40 (4000): from 25 on 1500 >= 1000 -> 25; from 40 on 0.
        assert_eq!(p.tick(5), Some(Offset(25)));
    }

    #[test]
    fn age_limit_trims_below_marks_old_enough_and_never_past_the_fed_events() {
        let policy = RetentionPolicy {
            bytes_max: None,
            age_ms_max: Some(1000),
        };
        let mut p = TrimPlanner::new(policy, Offset(100));
        feed(&mut p, 100, 110, 1);
        assert_eq!(p.tick(0), None);
        feed(&mut p, 110, 120, 1);
        assert_eq!(p.tick(500), None);
        // The mark taken at 0 (next 110) is 1000 ms old.
        assert_eq!(p.tick(1000), Some(Offset(110)));
        // Much later, with no new events: the last mark (next 120) ages out; the point is
        // never above what was fed (HWM + 1).
        assert_eq!(p.tick(10_000), Some(Offset(120)));
        assert_eq!(p.tick(20_000), None);
    }

    #[test]
    fn an_applied_trim_is_never_proposed_again() {
        let policy = RetentionPolicy {
            bytes_max: Some(10),
            age_ms_max: None,
        };
        let mut p = TrimPlanner::new(policy, Offset::ZERO);
        feed(&mut p, 0, 5, 10);
        p.tick(0);
        feed(&mut p, 5, 10, 10);
        p.trimmed(Offset(50)); // e.g. replayed from the log after a takeover
        assert_eq!(p.tick(1), None);
    }

    #[test]
    fn plan_records_nothing_and_a_slaves_marks_count_after_a_takeover() {
        let policy = RetentionPolicy {
            bytes_max: None,
            age_ms_max: Some(100),
        };
        let mut p = TrimPlanner::new(policy, Offset::ZERO);
        feed(&mut p, 0, 10, 1);
        p.mark(0); // as a slave
        feed(&mut p, 10, 20, 1);
        p.mark(50);
        // Became master at 120: the mark taken at 0 as a slave is old enough.
        assert_eq!(p.plan(120), Some(Offset(10)));
        assert_eq!(p.plan(120), Some(Offset(10)), "plan alone records nothing");
        p.trimmed(Offset(10));
        assert_eq!(p.plan(121), None);
        assert_eq!(p.trim_point(), Offset(10));
        assert_eq!(p.plan(150), Some(Offset(20)));
    }
}
