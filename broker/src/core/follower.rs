//! A slave broker following the master's stream, and the election timer that makes it take
//! over (DESIGN.md "Failover" step 1).
//!
//! The master sends slaves the same appends as stores ([`super::master::AppendCommand`],
//! from a [`super::SlotKind::Slave`] slot). A follower checks them like a store does — it
//! refuses an epoch below the highest master epoch it has followed, and a `prev` it does not
//! hold (log matching, Raft §5.3) — keeps the entries it already has that are equal,
//! truncates from the first entry whose epoch differs, appends the rest, and answers
//! `through = prev.offset + count`. It is not durable and never counts toward a quorum.
//!
//! It learns the HWM from the stream, but only up to `through` of the append that carried
//! it (Raft: `min(leaderCommit, index of last new entry)`): entries past `through` came from
//! an older master and may not be in this master's log. Every event up to the learned HWM
//! is applied in order ([`FollowerCommand::Apply`]) and is never truncated afterwards.
//!
//! Retention: a follower whose log ends before an append's `prev` accepts it anyway — its
//! log then starts after `prev` ([`Log::starting_after`]) and everything up to `prev`
//! counts as applied — when `prev` is at or below the master's HWM (stabilized, hence the
//! same on every log), above what it applied, and the append starts with a Trim event
//! (a checkpoint of the broker state, docs/protocol.md "Retention"). The master sends such
//! an append to a slave that needs events the stores deleted; the driver rebuilds its broker
//! state from that checkpoint, the first event it is given to apply.
//!
//! Election timer: the driver feeds [`FollowerInput::Tick`] with the time it read; the core
//! never reads a clock. Each time a valid append arrives the deadline is re-armed to
//! `now + election_timeout_ms_min + rank * rank_step_ms + jitter`, the rank counted among
//! the brokers other than the followed master ([`ElectionConfig::rank_without`]), `jitter` drawn from a
//! generator seeded by the driver (so a simulation run replays exactly). When a tick finds
//! the deadline passed, the core emits [`FollowerCommand::StartTakeover`] and re-arms.

use quire_proto::{trim_part_index, BrokerId, Epoch, EventKind, LogPosition, Offset};

use super::event::{accounted_bytes, Event};
use super::log::Log;
use super::takeover::LocalLog;
use super::{AppendId, ConfigError, RejectReason};

/// Default [`ElectionConfig::election_timeout_ms_min`] (five default heartbeats).
pub const ELECTION_TIMEOUT_MS_MIN_DEFAULT: u64 = 500;
/// Default [`ElectionConfig::election_timeout_ms_jitter`].
pub const ELECTION_TIMEOUT_MS_JITTER_DEFAULT: u64 = 250;
/// Default [`ElectionConfig::rank_step_ms`].
pub const RANK_STEP_MS_DEFAULT: u64 = 125;
/// Default [`FollowerConfig::retained_bytes_max`]: 64 MiB.
pub const FOLLOWER_RETAINED_BYTES_MAX_DEFAULT: u64 = 64 << 20;

/// When a silent master is presumed dead. All durations in milliseconds of the driver's
/// clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElectionConfig {
    /// Shortest silence before a takeover; should be several heartbeat periods.
    pub election_timeout_ms_min: u64,
    /// Upper bound of the uniformly random extra delay added each time the timer is armed.
    pub election_timeout_ms_jitter: u64,
    /// This broker's rank among the cluster's brokers ordered by id (0 = lowest id; see
    /// [`ElectionConfig::rank_of`]): lower ranks time out first, so takeovers rarely collide.
    /// The timer counts it without the followed master: when the master's id is below
    /// [`ElectionConfig::me`], one rank less, so the lowest surviving broker always waits
    /// no rank step.
    pub rank: u32,
    /// This broker's id.
    pub me: BrokerId,
    /// Extra delay per rank.
    pub rank_step_ms: u64,
}

impl ElectionConfig {
    /// Default timings for broker `me` among `brokers`.
    #[must_use]
    pub fn with_rank(brokers: &[BrokerId], me: BrokerId) -> ElectionConfig {
        ElectionConfig {
            election_timeout_ms_min: ELECTION_TIMEOUT_MS_MIN_DEFAULT,
            election_timeout_ms_jitter: ELECTION_TIMEOUT_MS_JITTER_DEFAULT,
            rank: ElectionConfig::rank_of(brokers, me),
            me,
            rank_step_ms: RANK_STEP_MS_DEFAULT,
        }
    }

    /// The rank the timer uses while following the master of `master`: [`Self::rank`],
    /// less one when that master's broker has a lower id than this one (it is not a
    /// candidate). No master followed yet ([`Epoch::ZERO`]): the rank itself.
    #[must_use]
    pub fn rank_without(&self, master: Epoch) -> u32 {
        let below = master != Epoch::ZERO && master.broker() < self.me;
        self.rank.saturating_sub(u32::from(below))
    }

    /// The rank of `me` among `brokers`: how many of them have a lower id.
    #[must_use]
    pub fn rank_of(brokers: &[BrokerId], me: BrokerId) -> u32 {
        let lower = brokers.iter().filter(|&&b| b < me).count();
        u32::try_from(lower).unwrap_or(u32::MAX)
    }
}

/// Everything a [`FollowerCore`] is configured with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowerConfig {
    /// The election timer.
    pub election: ElectionConfig,
    /// Most accounted bytes of *applied* events kept in memory (for a takeover's benefit and
    /// for reads); unapplied events are always kept (the master's backpressure bounds them).
    pub retained_bytes_max: u64,
}

/// An input to [`FollowerCore::handle`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FollowerInput {
    /// An append from a master (the fields of [`super::master::AppendCommand`], with the
    /// events read if they came from a store).
    Append {
        /// The append's id, echoed in the answer.
        append: AppendId,
        /// The master's epoch.
        epoch: Epoch,
        /// The entry before the first event, `None` if the events start at offset 0.
        prev: Option<LogPosition>,
        /// The events, contiguous from `prev.offset + 1` (or 0).
        events: Vec<Event>,
        /// The master's HWM.
        hwm: Option<Offset>,
    },
    /// The driver's clock read `now_ms` (monotonic milliseconds).
    Tick {
        /// The time.
        now_ms: u64,
    },
}

/// What the follower core asks its driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FollowerCommand {
    /// Answer the master: "I hold your log through `through`" (fed to the master as
    /// [`super::master::MasterInput::SlaveHas`]).
    Has {
        /// The append answered.
        append: AppendId,
        /// Its epoch.
        epoch: Epoch,
        /// `prev.offset + count` of the append.
        through: Option<Offset>,
    },
    /// Refuse the append (fed to the master as [`super::master::MasterInput::Rejected`]).
    Refuse {
        /// The append refused.
        append: AppendId,
        /// The highest master epoch this follower follows.
        known_epoch: Epoch,
        /// This follower's last `(epoch, offset)`.
        last: Option<LogPosition>,
        /// Why.
        reason: RejectReason,
    },
    /// Apply these stabilized events to broker state, in order. They follow the previous
    /// `Apply` without a gap.
    Apply {
        /// The events.
        events: Vec<Event>,
    },
    /// The master has been silent past the election timeout: start a takeover (a
    /// [`super::takeover::TakeoverCore`] from [`FollowerCore::local_log`]). Emitted again
    /// each timeout while the silence lasts.
    StartTakeover {
        /// The highest master epoch seen: the takeover must pick one above it.
        highest_epoch_seen: Epoch,
    },
}

/// Counters, for observability and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowerStats {
    /// Appends accepted.
    pub appends_accepted: u64,
    /// Appends refused because their epoch is below the followed master's.
    pub refused_epoch: u64,
    /// Appends refused on log matching.
    pub refused_mismatch: u64,
    /// Appends refused as malformed (events not contiguous, epochs out of order).
    pub refused_malformed: u64,
    /// Appends refused because they would truncate an applied (stabilized) event: a master
    /// breaking the protocol. Nothing was changed.
    pub refused_truncate_applied: u64,
    /// Takeovers started by the timer.
    pub takeovers_started: u64,
    /// Appends that started the log after their `prev`, at a retention checkpoint.
    pub started_at_checkpoint: u64,
}

/// SplitMix64: a tiny, well-mixed deterministic generator for the election jitter.
#[derive(Clone, Copy, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The slave's follower state machine. See the module docs.
#[derive(Clone, Debug)]
pub struct FollowerCore {
    config: FollowerConfig,
    log: Log,
    /// Highest master epoch followed; appends below it are refused. Never goes down.
    master_epoch: Epoch,
    /// Highest offset known stabilized that this follower holds.
    hwm: Option<Offset>,
    applied: Option<Offset>,
    /// Accounted bytes of events above `applied`.
    unapplied_bytes: u64,
    now_ms: u64,
    deadline_ms: u64,
    rng: SplitMix64,
    stats: FollowerStats,
}

impl FollowerCore {
    /// A follower over `local` (an empty [`LocalLog`] for a fresh broker, or what a
    /// stepped-down master or abandoned takeover gave back), refusing appends below
    /// `known_epoch`. `seed` drives the election jitter; `now_ms` arms the first deadline.
    ///
    /// # Errors
    /// [`ConfigError::BadHandover`] if `local` breaks its invariant.
    pub fn new(
        config: FollowerConfig,
        local: LocalLog,
        known_epoch: Epoch,
        seed: u64,
        now_ms: u64,
    ) -> Result<FollowerCore, ConfigError> {
        local.validate()?;
        let LocalLog { log, applied } = local;
        let first_unapplied = applied.map_or(Offset::ZERO, Offset::next);
        let unapplied_bytes = log.iter_from(first_unapplied).map(accounted_bytes).sum();
        let mut core = FollowerCore {
            config,
            log,
            master_epoch: known_epoch,
            hwm: applied,
            applied,
            unapplied_bytes,
            now_ms,
            deadline_ms: 0,
            rng: SplitMix64(seed),
            stats: FollowerStats::default(),
        };
        core.rearm();
        Ok(core)
    }

    /// Feeds one input; appends the resulting commands to `out`.
    pub fn handle(&mut self, input: FollowerInput, out: &mut Vec<FollowerCommand>) {
        match input {
            FollowerInput::Append {
                append,
                epoch,
                prev,
                events,
                hwm,
            } => {
                self.on_append(append, epoch, prev, events, hwm, out);
            }
            FollowerInput::Tick { now_ms } => {
                self.now_ms = self.now_ms.max(now_ms);
                if self.now_ms >= self.deadline_ms {
                    self.stats.takeovers_started += 1;
                    out.push(FollowerCommand::StartTakeover {
                        highest_epoch_seen: self.master_epoch,
                    });
                    self.rearm();
                }
            }
        }
    }

    /// The follower's log.
    #[must_use]
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// Highest master epoch followed.
    #[must_use]
    pub fn master_epoch(&self) -> Epoch {
        self.master_epoch
    }

    /// Highest offset known stabilized (and held).
    #[must_use]
    pub fn hwm(&self) -> Option<Offset> {
        self.hwm
    }

    /// Highest offset applied.
    #[must_use]
    pub fn applied(&self) -> Option<Offset> {
        self.applied
    }

    /// When the election timer fires next (driver's clock, ms).
    #[must_use]
    pub fn deadline_ms(&self) -> u64 {
        self.deadline_ms
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> &FollowerStats {
        &self.stats
    }

    /// A copy of the log and applied offset, to start a takeover from (payloads shared).
    #[must_use]
    pub fn local_log(&self) -> LocalLog {
        LocalLog {
            log: self.log.clone(),
            applied: self.applied,
        }
    }

    /// The log and applied offset, consuming the follower.
    #[must_use]
    pub fn into_local_log(self) -> LocalLog {
        LocalLog {
            log: self.log,
            applied: self.applied,
        }
    }

    // ----------------------------------------------------------------

    fn rearm(&mut self) {
        let e = self.config.election;
        let jitter = match e.election_timeout_ms_jitter {
            0 => 0,
            j => self.rng.next() % (j + 1),
        };
        let rank = e.rank_without(self.master_epoch);
        let timeout = e
            .election_timeout_ms_min
            .saturating_add(u64::from(rank).saturating_mul(e.rank_step_ms))
            .saturating_add(jitter);
        self.deadline_ms = self.now_ms.saturating_add(timeout);
    }

    fn refuse(&self, append: AppendId, reason: RejectReason, out: &mut Vec<FollowerCommand>) {
        out.push(FollowerCommand::Refuse {
            append,
            known_epoch: self.master_epoch,
            last: self.log.last(),
            reason,
        });
    }

    fn on_append(
        &mut self,
        append: AppendId,
        epoch: Epoch,
        prev: Option<LogPosition>,
        events: Vec<Event>,
        hwm: Option<Offset>,
        out: &mut Vec<FollowerCommand>,
    ) {
        if epoch < self.master_epoch {
            self.stats.refused_epoch += 1;
            self.refuse(append, RejectReason::StaleEpoch, out);
            return;
        }
        assert!(
            epoch >= self.master_epoch,
            "the followed epoch never goes down"
        );
        self.master_epoch = epoch;
        self.rearm();
        if let Some(p) = prev.filter(|&p| !self.log.contains(p)) {
            // The checkpoint event itself must be stabilized: the master sends a slave the
            // log from a checkpoint only at or below its HWM, while a fresh Trim event at the
            // head of an ordinary append is not (a jump there lost the topics' offsets
            // between the trim point and it: quire-sim --retention, seed 13065).
            let at_checkpoint = self.log.end() <= p.offset
                && hwm > Some(p.offset)
                && self.applied < Some(p.offset)
                && events.first().is_some_and(|e| {
                    // A whole checkpoint or a checkpoint's first part: a later part is
                    // no place to rebuild the state from (a break-it trial: a restarted
                    // slave accepted an append starting at part 250 of 645, never rebuilt
                    // its state, and would not take over).
                    e.kind == EventKind::Trim
                        && trim_part_index(&e.payload).is_none_or(|index| index == 0)
                });
            if !at_checkpoint {
                self.stats.refused_mismatch += 1;
                self.refuse(append, RejectReason::LogMismatch, out);
                return;
            }
            // Everything up to `p` is stabilized: start the log after it (module docs).
            self.stats.started_at_checkpoint += 1;
            self.log = Log::starting_after(p);
            self.unapplied_bytes = 0;
            self.applied = Some(p.offset);
            self.hwm = self.hwm.max(Some(p.offset));
        }
        let first = prev.map_or(Offset::ZERO, |p| p.offset.next());
        let mut floor = prev.map_or(Epoch::ZERO, |p| p.epoch);
        for (i, ev) in events.iter().enumerate() {
            let well_formed =
                ev.offset.0 == first.0 + i as u64 && ev.epoch >= floor && ev.epoch <= epoch;
            if !well_formed {
                self.stats.refused_malformed += 1;
                self.refuse(append, RejectReason::Malformed, out);
                return;
            }
            floor = ev.epoch;
        }
        let count = events.len() as u64;
        let through = (first.0 + count).checked_sub(1).map(Offset);
        // Keep equal entries; the first whose epoch differs starts the replaced suffix.
        let conflict = events
            .iter()
            .position(|ev| !self.log.contains(ev.position()));
        if let Some(c) = conflict {
            let at = events[c].offset;
            if self.applied.is_some_and(|a| at <= a) {
                self.stats.refused_truncate_applied += 1;
                self.refuse(append, RejectReason::Malformed, out);
                return;
            }
            let removed: u64 = self.log.iter_from(at).map(accounted_bytes).sum();
            self.unapplied_bytes -= removed;
            self.log.truncate_from(at);
            for ev in events.into_iter().skip(c) {
                self.unapplied_bytes += accounted_bytes(&ev);
                self.log.append(ev);
            }
        }
        self.stats.appends_accepted += 1;
        out.push(FollowerCommand::Has {
            append,
            epoch,
            through,
        });
        // Raft: learn min(master's HWM, last entry this append vouched for).
        if let Some(h) = hwm.min(through) {
            self.hwm = self.hwm.max(Some(h));
        }
        self.apply(out);
        self.trim();
    }

    /// Applies every held event up to the HWM, in order.
    fn apply(&mut self, out: &mut Vec<FollowerCommand>) {
        let Some(h) = self.hwm else { return };
        if self.applied >= Some(h) {
            return;
        }
        let from = self.applied.map_or(Offset::ZERO, Offset::next);
        let events: Vec<Event> = self
            .log
            .iter_from(from)
            .take_while(|e| e.offset <= h)
            .cloned()
            .collect();
        assert_eq!(
            events.len() as u64,
            h.0 + 1 - from.0,
            "invariant: unapplied events stay in memory"
        );
        for e in &events {
            self.unapplied_bytes -= accounted_bytes(e);
        }
        self.applied = Some(h);
        out.push(FollowerCommand::Apply { events });
    }

    /// Drops the oldest applied events beyond `retained_bytes_max`.
    fn trim(&mut self) {
        let Some(a) = self.applied else { return };
        assert!(
            self.log.mem_bytes() >= self.unapplied_bytes,
            "unapplied events must be in memory"
        );
        while self.log.mem_bytes() - self.unapplied_bytes > self.config.retained_bytes_max {
            if self.log.trim_one_at_most(a).is_none() {
                break;
            }
        }
    }
}

#[cfg(test)]
#[path = "follower_tests.rs"]
mod tests;
