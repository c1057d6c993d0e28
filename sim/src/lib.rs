//! quire-sim: a seeded, deterministic simulation of a whole Quire cluster — brokers, stores,
//! producers and consumers — with the network, the clocks and the disks simulated, and a
//! checker of the no-loss rules after every run.
//!
//! What runs for real: the broker's pure replication cores ([`quire_broker::core`]:
//! `FollowerCore`, `TakeoverCore`, `MasterCore`), its broker state
//! ([`quire_broker::state::BrokerState`], which holds the idempotent-producer table), the
//! store engine ([`quire_node::engine::Engine`], which every store decision is) and the wire
//! types and event bodies of quire-proto. What is simulated: everything the real processes do with sockets,
//! files and clocks — see the modules:
//!
//! - `world` (internal): the event loop, the seeded network (drop, delay, duplicate,
//!   reorder, symmetric and one-way partitions), the fault schedule, safety and liveness
//!   modes;
//! - `store` (internal): a driver of the store engine, over `disk` (internal): a disk that
//!   separates written from durable state (crash, torn writes, fsync EIO, ENOSPC, bit
//!   flips, wipes);
//! - `broker` (internal): a broker process driving the cores like the broker's actor;
//! - `client` (internal): idempotent producers and consumers;
//! - [`checker`]: the rules every run must keep ([`Violation`]).
//!
//! A run is a pure function of its seed and [`SimConfig`]: [`run`] returns the same
//! [`RunReport`] (and the same [`RunReport::trace_hash`]) every time. A failing seed replays
//! with `cargo run -p quire-sim --release -- --seed S`.
//!
//! Test-only [`Mutation`]s switch one protocol rule off, to show the checker catches the
//! loss each rule prevents (docs/testing.md lists how fast).

mod broker;
pub mod checker;
mod client;
mod msg;
mod out;
mod rng;
mod store;
mod world;

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use checker::{Checker, ProducedBatch, Violation};

/// How faults are scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Faults all the time; only safety is checked.
    Safety,
    /// Faults for a while, then none: the cluster must then stabilize new messages within
    /// [`SimConfig::liveness_bound_ms`].
    Liveness,
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "safety" => Ok(Mode::Safety),
            "liveness" => Ok(Mode::Liveness),
            other => Err(format!("unknown mode {other:?} (safety, liveness)")),
        }
    }
}

/// A protocol rule switched off on purpose (test-only), to show the checker catches what it
/// prevents. Each is a counterexample of the model checker (`shared/model/quire_mc.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// Stores ack their own accepted log end as `through_offset` instead of
    /// `prev.offset + events.len()` (model: `mut-through-end`; the store engine's
    /// `Mutations::through_end`).
    ThroughEnd,
    /// A takeover adopts the longest granted log, ignoring epochs (`mut-adopt-longest`).
    AdoptLongest,
    /// A wiped store votes: fenced by a broker that expects its old identity, it takes
    /// that identity on once it caught up to the HWM it heard, instead of becoming a
    /// learner (`wipe-hwm`; the store engine's `Mutations::wiped_votes`).
    WipedVotes,
    /// A restarted broker reads its epoch counter as 0 (`restart-amnesia`).
    ForgetEpoch,
    /// A new master forgets the idempotent-producer table (it is not rebuilt on takeover;
    /// the broker engine's `Mutations::forget_dedup`): a retried batch is written twice.
    ForgetDedup,
    /// The master counts its adopted log's entries of older epochs toward the HWM before
    /// its own epoch-start event is on a quorum (Raft §5.4.2, Figure 8; `MasterCore`'s
    /// test-only switch, the broker engine's `Mutations::hwm_before_epoch_start`).
    HwmBeforeEpochStart,
    /// The WAL's commit thread acks a batch's appends once written, before the fdatasync
    /// that covers it (the WAL's `Mutations::ack_before_fdatasync`): a crash then loses
    /// acknowledged entries.
    AckBeforeSync,
    /// A graceful handoff does not drain: the master asks the target to take over at once
    /// and acks its pending produces as it steps down, stabilized or not (the broker
    /// engine's `Mutations::handoff_acks_early`).
    HandoffAcksEarly,
    /// Stores trim at a Trim event as soon as they accept it, before a quorum holds it (the
    /// store engine's `Mutations::trim_unstabilized`). Turns retention on.
    TrimUnstabilized,
    /// The WAL's recovery scan takes a bad record followed by valid ones for a torn tail
    /// and cuts the log there instead of refusing to start (the WAL's
    /// `Mutations::mid_log_bad_record_is_torn_tail`): a bit flip in the middle of a log
    /// silently drops every entry after it.
    BadRecordAsTorn,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 10] = [
        Mutation::ThroughEnd,
        Mutation::AdoptLongest,
        Mutation::WipedVotes,
        Mutation::ForgetEpoch,
        Mutation::ForgetDedup,
        Mutation::HwmBeforeEpochStart,
        Mutation::AckBeforeSync,
        Mutation::HandoffAcksEarly,
        Mutation::TrimUnstabilized,
        Mutation::BadRecordAsTorn,
    ];

    /// The command-line name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Mutation::ThroughEnd => "through-end",
            Mutation::AdoptLongest => "adopt-longest",
            Mutation::WipedVotes => "wiped-votes",
            Mutation::ForgetEpoch => "forget-epoch",
            Mutation::ForgetDedup => "forget-dedup",
            Mutation::HwmBeforeEpochStart => "hwm-before-epoch-start",
            Mutation::AckBeforeSync => "ack-before-sync",
            Mutation::HandoffAcksEarly => "handoff-acks-early",
            Mutation::TrimUnstabilized => "trim-unstabilized",
            Mutation::BadRecordAsTorn => "bad-record-as-torn",
        }
    }
}

impl Mutation {
    /// The optional faults the mutation needs to act; a run with it turns them on (as
    /// `--retention` and `--master-crashes` do): retention for `trim-unstabilized`, master
    /// crashes for `hwm-before-epoch-start` (its schedule needs a run of short-lived
    /// masters, docs/testing.md).
    #[must_use]
    pub fn faults(self) -> FaultSet {
        FaultSet {
            retention: self == Mutation::TrimUnstabilized,
            master_crashes: self == Mutation::HwmBeforeEpochStart,
            ..FaultSet::default()
        }
    }
}

impl fmt::Display for Mutation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mutation {
    type Err = String;
    fn from_str(s: &str) -> Result<Mutation, String> {
        Mutation::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Mutation::ALL.iter().map(|m| m.name()).collect();
                format!("unknown mutation {s:?} ({})", names.join(", "))
            })
    }
}

/// Optional faults beyond the default set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultSet {
    /// Bit flips may hit a store's *last* durable record, which the WAL's recovery scan
    /// cannot tell from a torn write and cuts; the store then carries a tail-cut mark
    /// (off by default: see docs/testing.md, "What the simulation found").
    pub tail_flips: bool,
    /// Retention: half the seeds draw a retention bound (2–30 KB of payload), so masters
    /// propose checkpoint trims, stores delete segments and consumers get `Trimmed`
    /// answers. Off by default while limits it found stand (docs/testing.md, "What the
    /// simulation found"): a broker with an empty log cannot take over once stores trimmed,
    /// and a store that lags below what the others still hold cannot catch up.
    pub retention: bool,
    /// Master crashes: each seed draws a probability (20–90 %) that a broker crashes
    /// 1–60 ms after it becomes master, often before its epoch-start event is on a
    /// quorum: short-lived masters that leave partial writes behind, Raft's Figure 8
    /// schedules. Drawn from a stream of its own, so the seeds of runs without it are
    /// unchanged.
    pub master_crashes: bool,
    /// Bootstrap: every broker starts with an empty cluster file, so the first master is
    /// chosen by the real bootstrap path (tail probes of the empty stores, the identities
    /// the fences bound written to the cluster file before the master serves), and the
    /// others learn the identities from its epoch-start event.
    pub bootstrap: bool,
    /// Cursors: consumers commit their position as a durable cursor now and then, and
    /// restart from their committed cursor (the broker engine's write path for commits,
    /// its cursor read; checked: every acknowledged commit is stabilized, every value read
    /// was).
    pub cursors: bool,
}

/// How one run is set up (everything else is drawn from the seed).
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Safety or liveness.
    pub mode: Mode,
    /// A rule switched off, or `None`.
    pub mutation: Option<Mutation>,
    /// Optional faults.
    pub faults: FaultSet,
    /// Simulated time a safety run lasts, ms.
    pub duration_ms: u64,
    /// Liveness mode: simulated time faults last, ms.
    pub fault_ms: u64,
    /// Liveness mode: after the faults stop, every producer must have a new batch
    /// acknowledged within this many ms.
    pub liveness_bound_ms: u64,
    /// Keep a human-readable trace of the run (faults, roles, outcomes).
    pub trace: bool,
    /// Check only the end-to-end rules (what producers and consumers see, and the stores'
    /// quorums), not the protocol invariants checked online (an epoch used by two
    /// takeovers, an ack naming an entry the store does not hold): to measure how soon a
    /// broken rule shows up as lost or wrong data.
    pub end_to_end_only: bool,
    /// Events a takeover fetches per read, instead of a seeded value in `16..=256` (the
    /// broker's actor asks for 4096).
    pub fetch_events_max: Option<u32>,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            mode: Mode::Safety,
            mutation: None,
            faults: FaultSet::default(),
            duration_ms: 4_000,
            fault_ms: 3_000,
            liveness_bound_ms: 6_000,
            trace: false,
            end_to_end_only: false,
            fetch_events_max: None,
        }
    }
}

impl SimConfig {
    /// Simulated time one run lasts, in ms: [`SimConfig::duration_ms`] in safety mode;
    /// [`SimConfig::fault_ms`] plus [`SimConfig::liveness_bound_ms`] in liveness mode (the
    /// run ends at the liveness deadline). A run that panicked ended earlier.
    #[must_use]
    pub fn simulated_ms(&self) -> u64 {
        match self.mode {
            Mode::Safety => self.duration_ms,
            Mode::Liveness => self.fault_ms + self.liveness_bound_ms,
        }
    }

    /// The command line that replays `seed` under this configuration: every option the
    /// `quire-sim` binary takes that differs from its default (mode, mutation, faults,
    /// duration, end-to-end-only, fetch size). Settings without a flag (`fault_ms`,
    /// `liveness_bound_ms`) are not named; `trace` is left to the caller.
    #[must_use]
    pub fn replay_command(&self, seed: u64) -> String {
        let mut cmd = format!(
            "cargo run -p quire-sim --release -- --seed {seed} --mode {}",
            match self.mode {
                Mode::Safety => "safety",
                Mode::Liveness => "liveness",
            }
        );
        if let Some(m) = self.mutation {
            cmd.push_str(&format!(" --mutate {m}"));
        }
        if self.faults.tail_flips {
            cmd.push_str(" --tail-flips");
        }
        if self.faults.retention {
            cmd.push_str(" --retention");
        }
        if self.faults.master_crashes {
            cmd.push_str(" --master-crashes");
        }
        if self.faults.bootstrap {
            cmd.push_str(" --bootstrap");
        }
        if self.faults.cursors {
            cmd.push_str(" --cursors");
        }
        if self.duration_ms != SimConfig::default().duration_ms {
            cmd.push_str(&format!(" --duration-ms {}", self.duration_ms));
        }
        if self.end_to_end_only {
            cmd.push_str(" --end-to-end-only");
        }
        if let Some(n) = self.fetch_events_max {
            cmd.push_str(&format!(" --fetch-events-max {n}"));
        }
        cmd
    }
}

/// Counters of one run (or a sum of runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Runs summed.
    pub runs: u64,
    /// Simulated events processed.
    pub events: u64,
    /// Messages delivered by the simulated network.
    pub messages_delivered: u64,
    /// Messages the network dropped (losses and partitions).
    pub messages_dropped: u64,
    /// Messages the network duplicated.
    pub messages_duplicated: u64,
    /// Batches produced.
    pub batches: u64,
    /// Batches acknowledged.
    pub batches_ok: u64,
    /// Batches refused for good.
    pub batches_failed: u64,
    /// Batches whose outcome stayed unknown.
    pub batches_unknown: u64,
    /// Acknowledged messages.
    pub messages_acked: u64,
    /// Messages the checker verified (log entries decoded plus acknowledged messages).
    pub messages_checked: u64,
    /// Length of the stabilized log at the end.
    pub stabilized: u64,
    /// Takeovers that became master.
    pub masters: u64,
    /// Broker crashes.
    pub broker_crashes: u64,
    /// Broker pauses.
    pub broker_pauses: u64,
    /// Store crashes (with lost or torn unsynced writes).
    pub store_crashes: u64,
    /// Store pauses.
    pub store_pauses: u64,
    /// Stores wiped and re-initialised.
    pub store_wipes: u64,
    /// Wiped stores made voters again by the operator's voter-set changes.
    pub replacements: u64,
    /// Bit flips injected.
    pub bit_flips: u64,
    /// Store starts whose recovery cut a torn tail (a torn write or a flip in the last
    /// record) and marked the store.
    pub tail_cuts: u64,
    /// fsync EIO failures.
    pub fsync_eio: u64,
    /// ENOSPC failures.
    pub enospc: u64,
    /// Network partitions (symmetric and one-way).
    pub partitions: u64,
    /// Graceful handoffs an operator asked a serving master for.
    pub handoffs: u64,
    /// Handoffs that finished (a new master serves past the old log end).
    pub handoffs_done: u64,
    /// Handoffs that failed (the master served again, or no new master was seen in time).
    pub handoffs_failed: u64,
    /// Trims stores made (segments deleted below a stabilized trim point).
    pub store_trims: u64,
    /// Stabilized Trim events carrying a part of a checkpoint written in parts.
    pub checkpoint_parts: u64,
    /// Messages consumers were served through the broker engine's fetch.
    pub messages_consumed: u64,
    /// Of those, copies the log's final index does not hold: the prefix of a batch a
    /// failover cut, served before the batch was written again (at-least-once delivery).
    pub superseded_reads: u64,
    /// Fetches answered "trimmed" (the consumer went on from the trim point).
    pub fetches_trimmed: u64,
    /// Cursor commits acknowledged (`--cursors`).
    pub cursor_commits_acked: u64,
    /// Consumer restarts that resumed from the committed cursor (`--cursors`).
    pub consumer_restarts: u64,
    /// Times a mutation changed what a process did (acks with another `through`, wiped
    /// stores voting again, takeovers reusing an epoch): 0 without a mutation.
    pub mutated: u64,
}

impl RunStats {
    /// Adds another run's counters.
    pub fn add(&mut self, o: &RunStats) {
        self.runs += o.runs;
        self.events += o.events;
        self.messages_delivered += o.messages_delivered;
        self.messages_dropped += o.messages_dropped;
        self.messages_duplicated += o.messages_duplicated;
        self.batches += o.batches;
        self.batches_ok += o.batches_ok;
        self.batches_failed += o.batches_failed;
        self.batches_unknown += o.batches_unknown;
        self.messages_acked += o.messages_acked;
        self.messages_checked += o.messages_checked;
        self.stabilized += o.stabilized;
        self.masters += o.masters;
        self.broker_crashes += o.broker_crashes;
        self.broker_pauses += o.broker_pauses;
        self.store_crashes += o.store_crashes;
        self.store_pauses += o.store_pauses;
        self.store_wipes += o.store_wipes;
        self.replacements += o.replacements;
        self.bit_flips += o.bit_flips;
        self.tail_cuts += o.tail_cuts;
        self.fsync_eio += o.fsync_eio;
        self.enospc += o.enospc;
        self.partitions += o.partitions;
        self.handoffs += o.handoffs;
        self.handoffs_done += o.handoffs_done;
        self.handoffs_failed += o.handoffs_failed;
        self.store_trims += o.store_trims;
        self.checkpoint_parts += o.checkpoint_parts;
        self.messages_consumed += o.messages_consumed;
        self.superseded_reads += o.superseded_reads;
        self.fetches_trimmed += o.fetches_trimmed;
        self.cursor_commits_acked += o.cursor_commits_acked;
        self.consumer_restarts += o.consumer_restarts;
        self.mutated += o.mutated;
    }
}

/// What one run did and found.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// A hash of every event processed, in order: equal for equal seeds and configs.
    pub trace_hash: u64,
    /// The rules broken (empty: the run passed).
    pub violations: Vec<Violation>,
    /// Counters.
    pub stats: RunStats,
    /// The human-readable trace, if [`SimConfig::trace`] was set.
    pub trace: Vec<String>,
    /// A one-line description of the cluster the seed drew.
    pub setup: String,
}

impl RunReport {
    /// Whether the run kept every rule.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Runs one seed. Never panics: a panic inside a core or the simulation is reported as a
/// [`Violation::Panic`].
#[must_use]
pub fn run(seed: u64, config: &SimConfig) -> RunReport {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        world::World::new(seed, config.clone()).run()
    }));
    match outcome {
        Ok(report) => report,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic without a message".into());
            RunReport {
                seed,
                trace_hash: 0,
                violations: vec![Violation::Panic { message }],
                stats: RunStats::default(),
                trace: Vec::new(),
                setup: String::new(),
            }
        }
    }
}

/// What [`run_seeds`] did over a range of seeds.
#[derive(Clone, Debug, Default)]
pub struct Campaign {
    /// Seeds run to the end (panicked runs included). With `stop_at_first`, other threads
    /// may have run seeds past the first failing one: this count (and `stats`) then
    /// depends on the thread count; `failures` does not.
    pub seeds_run: u64,
    /// Every run's counters, summed.
    pub stats: RunStats,
    /// The failing runs in seed order; with `stop_at_first`, only the lowest failing seed.
    pub failures: Vec<RunReport>,
    /// Wall time of the whole campaign.
    pub wall: Duration,
    /// Simulated time of every run summed, in ms ([`SimConfig::simulated_ms`] per run).
    pub simulated_ms: u64,
}

impl Campaign {
    /// Seeds per wall second.
    #[must_use]
    pub fn seeds_per_s(&self) -> f64 {
        self.seeds_run as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Simulated seconds per wall second, over all threads.
    #[must_use]
    pub fn simulated_per_wall_s(&self) -> f64 {
        self.simulated_ms as f64 / 1000.0 / self.wall.as_secs_f64().max(1e-9)
    }

    /// The lowest failing seed, if any.
    #[must_use]
    pub fn first_failure(&self) -> Option<u64> {
        self.failures.first().map(|r| r.seed)
    }
}

/// The machine's available parallelism (1 if unknown): the default thread count of
/// [`run_seeds`]'s callers.
#[must_use]
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Runs every seed of `seeds` under `config` on `jobs` threads (at least 1), each thread
/// taking the next unclaimed seed, and returns what they found. `on_failure` is called for
/// each failing run as it is found (in no fixed order: from any thread).
///
/// The result does not depend on `jobs`: a run is a pure function of its seed, counters
/// are summed, and `failures` is sorted by seed. With `stop_at_first`, threads stop taking
/// seeds once one fails, and only the lowest failing seed is kept: every seed below it was
/// taken before it (seeds are handed out in order) and every taken seed is run to its end,
/// so it is the first failing seed `--jobs 1` would find.
pub fn run_seeds(
    config: &SimConfig,
    seeds: Range<u64>,
    jobs: usize,
    stop_at_first: bool,
    on_failure: &(dyn Fn(&RunReport) + Sync),
) -> Campaign {
    let started = Instant::now();
    let next = AtomicU64::new(seeds.start);
    let stop = AtomicBool::new(false);
    let found = Mutex::new(Campaign::default());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= seeds.end {
                    return;
                }
                let report = run(seed, config);
                if !report.passed() {
                    on_failure(&report);
                    if stop_at_first {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                let mut c = found.lock().unwrap_or_else(PoisonError::into_inner);
                c.seeds_run += 1;
                c.stats.add(&report.stats);
                if !report.passed() {
                    c.failures.push(report);
                }
            });
        }
    });
    let mut c = found.into_inner().unwrap_or_else(PoisonError::into_inner);
    c.failures.sort_by_key(|r| r.seed);
    if stop_at_first {
        c.failures.truncate(1);
    }
    c.simulated_ms = c.seeds_run * config.simulated_ms();
    c.wall = started.elapsed();
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mutation_parses_from_its_name() {
        for m in Mutation::ALL {
            assert_eq!(m.name().parse::<Mutation>(), Ok(m));
        }
        let err = "no-such".parse::<Mutation>().expect_err("unknown");
        for m in Mutation::ALL {
            assert!(err.contains(m.name()), "{err}");
        }
    }

    #[test]
    fn the_replay_command_names_every_option_that_differs_from_the_default() {
        let c = SimConfig::default();
        assert_eq!(
            c.replay_command(7),
            "cargo run -p quire-sim --release -- --seed 7 --mode safety"
        );
        let c = SimConfig {
            mode: Mode::Liveness,
            mutation: Some(Mutation::ALL[0]),
            faults: FaultSet {
                tail_flips: true,
                ..FaultSet::default()
            },
            duration_ms: 1_234,
            end_to_end_only: true,
            fetch_events_max: Some(3),
            ..SimConfig::default()
        };
        assert_eq!(
            c.replay_command(9),
            format!(
                "cargo run -p quire-sim --release -- --seed 9 --mode liveness --mutate {} \
                 --tail-flips --duration-ms 1234 --end-to-end-only --fetch-events-max 3",
                Mutation::ALL[0]
            )
        );
    }
}
