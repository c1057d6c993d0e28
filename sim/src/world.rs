//! The simulated world: one event queue ordered by simulated time, the seeded network, the
//! fault schedule, and the run's end checks.
//!
//! # Network
//! Every message is an event delivered after a random latency; with the run's
//! probabilities it is dropped, duplicated (the copy takes its own latency) or held for a
//! long delay (so later messages overtake it: reordering). A partition is a set of directed
//! cuts — symmetric (both directions) or one-way — that drop every message crossing them,
//! at send and at delivery. A message reaches only the process incarnation it was sent to
//! (a restarted process has new connections); one sent by an incarnation that died since is
//! still delivered. Brokers learn that a connection to a slot went up or down a little
//! after it happens (the TCP connection breaking or coming back).
//!
//! # Clocks
//! World time is in ms. Each broker reads it through its own offset and rate (±5%), and
//! its heartbeat timer fires every `heartbeat_ms` of world time (with jitter); a paused
//! (SIGSTOPped) process handles nothing until it resumes.
//!
//! # Faults
//! Every 100 ms while faults are on, each kind of fault strikes with a per-run probability:
//! broker crash (restart later, its epoch counter file kept) and pause (a zombie master);
//! store crash (unsynced writes lost or torn) and pause; store wipe (the operator
//! re-initialises it: a new identity that never votes); a bit flip in a stopped store's
//! durable data (found at start: the store refuses to start and is re-initialised); fsync
//! EIO and ENOSPC (the store's log fails; the operator restarts it later); partitions.
//! Faults that remove a voter for good are limited to `N - max(Qa, F)` so a quorum of voters
//! always remains (more would lose data by design, not by a bug).
//!
//! # Modes
//! Safety: faults until the end. Liveness: faults stop after `fault_ms` — partitions heal,
//! stopped processes start, failed stores restart, the network stops losing — and every
//! producer must then get a new batch acknowledged within `liveness_bound_ms`.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use quire_broker::core::{quorum, ReplicationLimits, SlotId, StoreIdentity};
use quire_node::Role;
use quire_proto::{Epoch, Incarnation, StoreId, VoterChange, VoterChangeRequest};

use crate::broker::{BrokerParams, SimBroker};
use crate::checker::{Checker, ProducedBatch, TopicRead, Violation};
use crate::client::{Attempt, Batch, Consumer, Producer};
use crate::msg::{Envelope, Msg, NodeId, ProduceError};
use crate::out::{Later, Out, Seen};
use crate::rng::SimRng;
use crate::store::{DiskFault, Identity, SimStore, StartOutcome};
use crate::{Mode, Mutation, RunReport, RunStats, SimConfig};
use quire_broker::engine::FetchReply;

/// How often the fault schedule rolls its dice, ms.
const FAULT_TICK_MS: u64 = 100;
/// How long after a connection change a broker hears of it, ms.
const LINK_NOTICE_MS: u64 = 10;
/// Cuts active at once, at most.
const CUTS_MAX: usize = 3;
/// A producer's own timeout for one attempt, ms.
const CLIENT_TIMEOUT_MS: u64 = 700;
/// A consumer's timeout for one fetch, ms.
const FETCH_TIMEOUT_MS: u64 = 300;
/// Trace lines kept at most.
const TRACE_LINES_MAX: usize = 20_000;

/// One scheduled event.
#[derive(Debug)]
enum Ev {
    Deliver(Box<Envelope>),
    Tick {
        broker: u8,
        boot: u32,
    },
    Fsync {
        store: u8,
        boot: u32,
        generation: u64,
    },
    Counter {
        broker: u8,
        boot: u32,
        counter: u64,
    },
    Link {
        broker: u8,
        boot: u32,
        slot: u16,
        up: bool,
    },
    StartBroker(u8),
    StartStore(u8),
    /// The operator re-initialises a store's directory, then starts it.
    Reinit(u8),
    /// The operator restarts a store whose log failed.
    OperatorRestart(u8),
    /// The operator makes a re-initialised store a voter in place of its old identity
    /// (`quire cluster replace-store`): one change per visit, until the master's voter set
    /// names the store's identity.
    Replace(u8),
    Resume(NodeId),
    Heal(u64),
    FaultTick,
    ProducerWake(u8),
    ProducerTimeout(u8, u64),
    ConsumerWake(u8),
    ConsumerTimeout(u8, u64),
    /// Liveness mode: the faults stop.
    Quiet,
    /// A broker's cluster-file write completes.
    Identities {
        broker: u8,
        boot: u32,
        identities: Vec<Option<StoreIdentity>>,
        bootstrap_epoch: Option<Epoch>,
    },
    /// `--master-crashes`: the broker crashes if it still runs this boot.
    CrashMaster {
        broker: u8,
        boot: u32,
    },
    /// Liveness mode: the bound after the faults stopped.
    Deadline,
    End,
}

impl Ev {
    fn digest(&self) -> [u64; 5] {
        match self {
            Ev::Deliver(e) => {
                let d = e.msg.digest();
                [
                    1 ^ (e.from.code() << 8) ^ (e.to.code() << 24),
                    d[0],
                    d[1],
                    d[2],
                    d[3],
                ]
            }
            Ev::Tick { broker, boot } => [2, u64::from(*broker), u64::from(*boot), 0, 0],
            Ev::Fsync {
                store, generation, ..
            } => [3, u64::from(*store), *generation, 0, 0],
            Ev::Counter {
                broker, counter, ..
            } => [4, u64::from(*broker), *counter, 0, 0],
            Ev::Link {
                broker, slot, up, ..
            } => [5, u64::from(*broker), u64::from(*slot), u64::from(*up), 0],
            Ev::StartBroker(b) => [6, u64::from(*b), 0, 0, 0],
            Ev::StartStore(s) => [7, u64::from(*s), 0, 0, 0],
            Ev::Reinit(s) => [8, u64::from(*s), 0, 0, 0],
            Ev::OperatorRestart(s) => [19, u64::from(*s), 0, 0, 0],
            Ev::Replace(s) => [22, u64::from(*s), 0, 0, 0],
            Ev::Resume(n) => [9, n.code(), 0, 0, 0],
            Ev::Heal(c) => [10, *c, 0, 0, 0],
            Ev::FaultTick => [11, 0, 0, 0, 0],
            Ev::ProducerWake(p) => [12, u64::from(*p), 0, 0, 0],
            Ev::ProducerTimeout(p, r) => [13, u64::from(*p), *r, 0, 0],
            Ev::ConsumerWake(c) => [14, u64::from(*c), 0, 0, 0],
            Ev::ConsumerTimeout(c, r) => [15, u64::from(*c), *r, 0, 0],
            Ev::Quiet => [16, 0, 0, 0, 0],
            Ev::Deadline => [17, 0, 0, 0, 0],
            Ev::End => [18, 0, 0, 0, 0],
            Ev::CrashMaster { broker, boot } => [20, u64::from(*broker), u64::from(*boot), 0, 0],
            Ev::Identities {
                broker, identities, ..
            } => [
                21,
                u64::from(*broker),
                identities.iter().filter(|i| i.is_some()).count() as u64,
                0,
                0,
            ],
        }
    }
}

#[derive(Debug)]
struct Scheduled {
    at_ms: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at_ms, self.seq) == (o.at_ms, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> Ordering {
        // A min-heap on (time, insertion order).
        (o.at_ms, o.seq).cmp(&(self.at_ms, self.seq))
    }
}

/// A directed cut: messages from any of `from` to any of `to` are dropped.
#[derive(Clone, Debug)]
struct Cut {
    id: u64,
    from: Vec<NodeId>,
    to: Vec<NodeId>,
}

/// The run's network settings.
#[derive(Clone, Copy, Debug)]
struct NetParams {
    drop_p: f64,
    dup_p: f64,
    slow_p: f64,
    latency_ms_max: u64,
    slow_ms_max: u64,
}

/// Per-tick probabilities of each fault.
#[derive(Clone, Copy, Debug)]
struct FaultRates {
    broker_crash: f64,
    broker_pause: f64,
    store_crash: f64,
    store_pause: f64,
    store_wipe: f64,
    bit_flip: f64,
    fsync_eio: f64,
    enospc: f64,
    partition: f64,
    /// An operator asks the serving master for a graceful handoff.
    handoff: f64,
}

/// The simulated world. See the module docs.
pub(crate) struct World {
    seed: u64,
    config: SimConfig,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    rng: SimRng,
    brokers: Vec<SimBroker>,
    stores: Vec<SimStore>,
    producers: Vec<Producer>,
    consumers: Vec<Consumer>,
    batches: Vec<Batch>,
    net: NetParams,
    rates: FaultRates,
    /// `--master-crashes`: the chance a new master crashes soon, and the stream its
    /// draws come from (apart from `rng`, so runs without it keep their seeds).
    master_crash: Option<(f64, SimRng)>,
    cuts: Vec<Cut>,
    next_cut: u64,
    /// What each broker was last told about each slot's connection.
    links: BTreeMap<(u8, u16), bool>,
    /// Paused processes and the events held for them.
    paused: BTreeMap<NodeId, VecDeque<Ev>>,
    /// Stores whose restart is scheduled (so faults do not stack restarts).
    store_restart_pending: Vec<bool>,
    reinit_pending: Vec<bool>,
    /// Per store: the operator is replacing its old identity in the voter set.
    replacing: Vec<bool>,
    /// Per store: its wipe counted as a lost voter (undone when it is a voter again).
    wipe_lost: Vec<bool>,
    broker_restart_pending: Vec<bool>,
    identities: Vec<StoreIdentity>,
    fence_quorum: usize,
    losses: usize,
    losses_max: usize,
    faults_on: bool,
    producing: bool,
    quiet_ms: Option<u64>,
    heartbeat_ms: u64,
    checker: Checker,
    hash: u64,
    trace: Vec<String>,
    stats: RunStats,
    setup: String,
}

impl World {
    /// A world for `seed`: draws the cluster, the workload and the fault rates.
    pub(crate) fn new(seed: u64, config: SimConfig) -> World {
        let mut rng = SimRng::new(seed);
        let n_stores = if rng.chance(0.25) { 5 } else { 3 };
        let n_brokers = rng.range(2, 3) as usize;
        let n_producers = rng.range(2, 3) as usize;
        let n_consumers = 2usize;
        let identities: Vec<StoreIdentity> = (0..n_stores)
            .map(|i| StoreIdentity {
                store_id: StoreId(0x5000 + i as u64),
                incarnation: Incarnation(rng.next_u64() | 1),
            })
            .collect();
        let heartbeat_ms = 50;
        let election_timeout_ms_min = rng.range(250, 400);
        let limits = ReplicationLimits {
            inflight_bytes_max: rng.range(5_000, 24_000),
            append_events_max: rng.range(1, 8) as u32,
            append_bytes_max: rng.range(200, 4_000),
            appends_inflight_max: rng.range(1, 4) as u32,
            append_timeout_ticks: rng.range(2, 6) as u32,
            retained_bytes_max: rng.range(500, 8_000),
        };
        let mutation = config.mutation;
        let params = BrokerParams {
            stores: n_stores,
            brokers: n_brokers,
            limits,
            election_timeout_ms_min,
            heartbeat_ms,
            fetch_events_max: {
                let drawn = rng.range(16, 256) as u32;
                config.fetch_events_max.unwrap_or(drawn)
            },
            // As the broker's actor: twice the election timeout, at least 1 s.
            takeover_timeout_ms: 2 * election_timeout_ms_min.max(500),
            produce_timeout_ms: 500,
            follower_retained_bytes_max: rng.range(500, 8_000),
            retention: {
                let bytes_max = rng.chance(0.5).then(|| rng.range(2_000, 30_000));
                let on = config.faults.retention || mutation.is_some_and(|m| m.faults().retention);
                quire_broker::retention::RetentionPolicy {
                    bytes_max: bytes_max.filter(|_| on),
                    age_ms_max: None,
                }
            },
            // From the seed, not the world's generator: the draws above stay as they were
            // for every seed.
            checkpoint_part_bytes: if seed % 2 == 0 {
                64 + (seed / 2 % 512) as usize
            } else {
                quire_broker::engine::CHECKPOINT_PART_BYTES_DEFAULT
            },
            identities: identities
                .iter()
                .map(|&id| (!config.faults.bootstrap).then_some(id))
                .collect(),
            mutations: quire_broker::engine::Mutations {
                adopt_longest: mutation == Some(Mutation::AdoptLongest),
                forget_dedup: mutation == Some(Mutation::ForgetDedup),
                hwm_before_epoch_start: mutation == Some(Mutation::HwmBeforeEpochStart),
                handoff_acks_early: mutation == Some(Mutation::HandoffAcksEarly),
            },
            forget_epoch: mutation == Some(Mutation::ForgetEpoch),
            verbose: config.trace,
        };
        let brokers: Vec<SimBroker> = (0..n_brokers)
            .map(|b| SimBroker::new(b as u8, params.clone(), &mut rng))
            .collect();
        let store_mutations = quire_node::engine::Mutations {
            through_end: mutation == Some(Mutation::ThroughEnd),
            wiped_votes: mutation == Some(Mutation::WipedVotes),
            trim_unstabilized: mutation == Some(Mutation::TrimUnstabilized),
        };
        let wal_mutations = quire_wal::Mutations {
            ack_before_fdatasync: mutation == Some(Mutation::AckBeforeSync),
            mid_log_bad_record_is_torn_tail: mutation == Some(Mutation::BadRecordAsTorn),
            // Found by the WAL's crash tests (`crash_steps`), not simulation mutations.
            reuse_keeps_tag: false,
            ack_before_dir_sync: false,
        };
        let stores: Vec<SimStore> = identities
            .iter()
            .enumerate()
            .map(|(i, id)| {
                SimStore::new(
                    i as u8,
                    Identity {
                        store_id: id.store_id,
                        incarnation: id.incarnation,
                        role: Role::Voter,
                    },
                    store_mutations,
                    wal_mutations,
                )
            })
            .collect();
        let producers: Vec<Producer> = (0..n_producers)
            .map(|p| Producer::new(p as u8, p as u64 + 1, n_brokers, &mut rng))
            .collect();
        let consumers: Vec<Consumer> = (0..n_consumers)
            .map(|c| Consumer::new((n_producers + c) as u8, format!("topic-{}", c % 2)))
            .collect();
        let net = NetParams {
            drop_p: rng.float(0.0, 0.05),
            dup_p: rng.float(0.0, 0.03),
            slow_p: rng.float(0.0, 0.03),
            latency_ms_max: rng.range(2, 15),
            slow_ms_max: rng.range(200, 2_000),
        };
        let mut scale = |base: f64| base * rng.float(0.3, 2.0);
        let rates = FaultRates {
            broker_crash: scale(0.04),
            broker_pause: scale(0.03),
            store_crash: scale(0.06),
            store_pause: scale(0.03),
            store_wipe: scale(0.01),
            bit_flip: scale(0.01),
            fsync_eio: scale(0.015),
            enospc: scale(0.015),
            partition: scale(0.05),
            handoff: scale(0.02),
        };
        let qa = quorum::majority(n_stores);
        let fence_quorum = quorum::majority(n_stores);
        let setup = format!(
            "{n_stores} stores, {n_brokers} brokers, {n_producers} producers, {n_consumers} consumers; \
             network drop {:.3} dup {:.3} slow {:.3} latency <= {} ms slow <= {} ms; limits {:?}; \
             election timeout {} ms",
            net.drop_p,
            net.dup_p,
            net.slow_p,
            net.latency_ms_max,
            net.slow_ms_max,
            limits,
            election_timeout_ms_min
        );
        World {
            seed,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            rng,
            brokers,
            stores,
            producers,
            consumers,
            batches: Vec::new(),
            net,
            rates,
            master_crash: (config.faults.master_crashes
                || mutation.is_some_and(|m| m.faults().master_crashes))
            .then(|| {
                let mut r = SimRng::new(seed ^ 0x6d61_7374_6572_5f63);
                (r.float(0.2, 0.9), r)
            }),
            cuts: Vec::new(),
            next_cut: 0,
            links: BTreeMap::new(),
            paused: BTreeMap::new(),
            store_restart_pending: vec![false; n_stores],
            reinit_pending: vec![false; n_stores],
            replacing: vec![false; n_stores],
            wipe_lost: vec![false; n_stores],
            broker_restart_pending: vec![false; n_brokers],
            identities,
            fence_quorum,
            losses: 0,
            losses_max: n_stores - qa.max(fence_quorum),
            faults_on: true,
            producing: true,
            quiet_ms: None,
            heartbeat_ms,
            checker: Checker::default(),
            hash: 0xcbf2_9ce4_8422_2325 ^ seed,
            trace: Vec::new(),
            stats: RunStats {
                runs: 1,
                ..RunStats::default()
            },
            setup,
            config,
        }
    }

    fn at(&mut self, at_ms: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Scheduled {
            at_ms,
            seq: self.seq,
            ev,
        });
    }

    fn after(&mut self, delay_ms: u64, ev: Ev) {
        self.at(self.now + delay_ms, ev);
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if self.config.trace && self.trace.len() < TRACE_LINES_MAX {
            let l = line();
            self.trace.push(format!("{:>6} ms  {l}", self.now));
        }
    }

    fn mix(&mut self, values: &[u64]) {
        for &v in values {
            for b in v.to_le_bytes() {
                self.hash ^= u64::from(b);
                self.hash = self.hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
    }

    /// Runs to the end and checks.
    pub(crate) fn run(mut self) -> RunReport {
        for b in 0..self.brokers.len() {
            self.start_broker(b as u8);
        }
        for p in 0..self.producers.len() {
            let d = self.rng.range(0, 50);
            self.after(d, Ev::ProducerWake(p as u8));
        }
        for c in 0..self.consumers.len() {
            let d = self.rng.range(0, 50);
            self.after(d, Ev::ConsumerWake(c as u8));
        }
        self.after(FAULT_TICK_MS, Ev::FaultTick);
        match self.config.mode {
            Mode::Safety => {
                let d = self.config.duration_ms;
                self.after(d, Ev::End);
            }
            Mode::Liveness => {
                let f = self.config.fault_ms;
                self.after(f, Ev::Quiet);
            }
        }
        while let Some(s) = self.queue.pop() {
            self.now = s.at_ms;
            self.stats.events += 1;
            let d = s.ev.digest();
            self.mix(&[self.now]);
            self.mix(&d);
            if matches!(s.ev, Ev::End) {
                break;
            }
            self.handle(s.ev);
        }
        self.finish()
    }

    fn finish(mut self) -> RunReport {
        self.producing = false;
        for b in &self.batches {
            self.stats.batches += 1;
            if !b.oks.is_empty() {
                self.stats.batches_ok += 1;
                self.stats.messages_acked += b.messages.len() as u64;
            } else if b.failed {
                self.stats.batches_failed += 1;
            } else {
                self.stats.batches_unknown += 1;
            }
        }
        let produced: Vec<ProducedBatch<'_>> =
            self.batches.iter().map(Batch::as_produced).collect();
        self.stats.store_trims = self.stores.iter().map(|s| s.trims).sum();
        self.stats.checkpoint_parts = self.checker.checkpoint_parts();
        for (c, con) in self.consumers.iter_mut().enumerate() {
            let reads = std::mem::take(&mut con.reads);
            for r in &reads {
                match r {
                    TopicRead::Message { .. } => self.stats.messages_consumed += 1,
                    TopicRead::Trimmed { .. } => self.stats.fetches_trimmed += 1,
                    TopicRead::Resume { .. } => self.stats.consumer_restarts += 1,
                }
            }
            self.checker.consumed_topic(c as u8, &con.topic, reads);
            let cursor = std::mem::take(&mut con.cursor);
            self.stats.cursor_commits_acked += cursor.acked.len() as u64;
            self.checker.consumed_cursor(c as u8, &con.topic, cursor);
        }
        self.checker.check_history(&produced);
        let logs: Vec<(u8, Vec<quire_proto::Event>, bool)> = self
            .stores
            .iter()
            .filter(|s| {
                let id = s.identity();
                let bound = self.identities[usize::from(s.index)];
                id.role == Role::Voter
                    && id.store_id == bound.store_id
                    && id.incarnation == bound.incarnation
            })
            .filter_map(|s| s.voting_log().map(|(log, marked)| (s.index, log, marked)))
            .collect();
        let voters: Vec<(u8, &[quire_proto::Event], bool)> = logs
            .iter()
            .map(|(s, log, marked)| (*s, log.as_slice(), *marked))
            .collect();
        self.checker
            .check_quorums(&voters, self.fence_quorum, self.stores.len());
        self.stats.messages_checked = self.checker.messages_checked;
        self.stats.superseded_reads = self.checker.superseded_reads;
        self.stats.mutated += self.stores.iter().map(|s| s.mutated_acks).sum::<u64>();
        self.stats.mutated += self
            .brokers
            .iter()
            .map(SimBroker::mutated_total)
            .sum::<u64>();
        self.stats.stabilized = self.checker.stabilized_len();
        let violations = std::mem::take(&mut self.checker.violations);
        if !violations.is_empty() {
            let ids: Vec<String> = violations.iter().map(ToString::to_string).collect();
            self.note(|| format!("VIOLATIONS: {}", ids.join("; ")));
        }
        RunReport {
            seed: self.seed,
            trace_hash: self.hash,
            violations,
            stats: self.stats,
            trace: self.trace,
            setup: self.setup,
        }
    }

    // ---------------------------------------------------------------- dispatch

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver(env) => self.deliver(*env),
            Ev::Tick { broker, boot } => {
                let b = &self.brokers[usize::from(broker)];
                if !b.up || b.boot != boot {
                    return;
                }
                if self.paused.contains_key(&NodeId::Broker(broker)) {
                    // A stopped process runs no timer; the tick restarts on resume.
                    return;
                }
                let mut out = Out::default();
                let now = self.now;
                self.brokers[usize::from(broker)].on_tick(now, &mut out);
                self.process(NodeId::Broker(broker), out);
                let jitter = self.rng.range(0, 5);
                let next = self.heartbeat_ms + jitter;
                self.after(next, Ev::Tick { broker, boot });
            }
            Ev::Fsync {
                store,
                boot,
                generation,
            } => {
                let s = &self.stores[usize::from(store)];
                if !s.up || s.boot != boot {
                    return;
                }
                if let Some(held) = self.paused.get_mut(&NodeId::Store(store)) {
                    held.push_back(Ev::Fsync {
                        store,
                        boot,
                        generation,
                    });
                    return;
                }
                let mut out = Out::default();
                self.stores[usize::from(store)].on_fsync_done(generation, &mut out);
                self.process(NodeId::Store(store), out);
            }
            Ev::Counter {
                broker,
                boot,
                counter,
            } => {
                let b = &self.brokers[usize::from(broker)];
                if !b.up || b.boot != boot {
                    return;
                }
                if let Some(held) = self.paused.get_mut(&NodeId::Broker(broker)) {
                    held.push_back(Ev::Counter {
                        broker,
                        boot,
                        counter,
                    });
                    return;
                }
                let mut out = Out::default();
                let now = self.now;
                self.brokers[usize::from(broker)].on_counter_persisted(counter, now, &mut out);
                self.process(NodeId::Broker(broker), out);
            }
            Ev::Identities {
                broker,
                boot,
                identities,
                bootstrap_epoch,
            } => {
                let b = &self.brokers[usize::from(broker)];
                if !b.up || b.boot != boot {
                    return;
                }
                if let Some(held) = self.paused.get_mut(&NodeId::Broker(broker)) {
                    held.push_back(Ev::Identities {
                        broker,
                        boot,
                        identities,
                        bootstrap_epoch,
                    });
                    return;
                }
                let mut out = Out::default();
                let now = self.now;
                self.brokers[usize::from(broker)].on_identities_persisted(
                    identities,
                    bootstrap_epoch,
                    now,
                    &mut out,
                );
                self.process(NodeId::Broker(broker), out);
            }
            Ev::Link {
                broker,
                boot,
                slot,
                up,
            } => {
                let b = &self.brokers[usize::from(broker)];
                if !b.up || b.boot != boot {
                    return;
                }
                if let Some(held) = self.paused.get_mut(&NodeId::Broker(broker)) {
                    held.push_back(Ev::Link {
                        broker,
                        boot,
                        slot,
                        up,
                    });
                    return;
                }
                let mut out = Out::default();
                let now = self.now;
                self.brokers[usize::from(broker)].on_link(SlotId(slot), up, now, &mut out);
                self.process(NodeId::Broker(broker), out);
            }
            Ev::StartBroker(b) => {
                self.broker_restart_pending[usize::from(b)] = false;
                if !self.brokers[usize::from(b)].up {
                    self.start_broker(b);
                }
            }
            Ev::StartStore(s) => {
                self.store_restart_pending[usize::from(s)] = false;
                if !self.reinit_pending[usize::from(s)] {
                    self.start_store(s);
                }
            }
            Ev::OperatorRestart(s) => {
                let store = &self.stores[usize::from(s)];
                if store.up && store.is_failed() {
                    self.crash_store(s);
                    let d = self.rng.range(20, 200);
                    self.schedule_store_start(s, d);
                } else if store.up && store.is_armed() {
                    // Not struck yet: look again later.
                    let d = self.rng.range(300, 2_000);
                    self.after(d, Ev::OperatorRestart(s));
                }
            }
            Ev::Reinit(s) => {
                let i = usize::from(s);
                self.reinit_pending[i] = false;
                if self.stores[i].up {
                    return;
                }
                let id = Identity {
                    store_id: StoreId(self.rng.next_u64() | 1),
                    incarnation: Incarnation(self.rng.next_u64() | 1),
                    role: Role::Voter,
                };
                self.stores[i].reinitialise(id);
                self.stats.store_wipes += 1;
                self.note(|| format!("S{s} re-initialised (new identity)"));
                self.start_store(s);
                if !self.replacing[i] {
                    self.replacing[i] = true;
                    let d = self.rng.range(50, 500);
                    self.after(d, Ev::Replace(s));
                }
            }
            Ev::Replace(s) => self.replace(s),
            Ev::Resume(node) => self.resume(node),
            Ev::Heal(id) => {
                self.cuts.retain(|c| c.id != id);
                self.note(|| format!("cut {id} healed"));
                self.refresh_links();
            }
            Ev::FaultTick => {
                if self.faults_on {
                    self.inject_faults();
                    self.after(FAULT_TICK_MS, Ev::FaultTick);
                }
            }
            Ev::ProducerWake(p) => self.producer_wake(p),
            Ev::ProducerTimeout(p, request) => {
                let n = self.brokers.len();
                if self.producers[usize::from(p)].on_timeout(request, n, &mut self.rng) {
                    let d = self.rng.range(10, 100);
                    self.after(d, Ev::ProducerWake(p));
                }
            }
            Ev::ConsumerWake(c) => self.consumer_wake(c),
            Ev::ConsumerTimeout(c, request) => {
                let n = self.brokers.len();
                if self.consumers[usize::from(c)].on_timeout(request, n, &mut self.rng) {
                    self.after(10, Ev::ConsumerWake(c));
                }
            }
            Ev::Quiet => self.quiet(),
            Ev::CrashMaster { broker, boot } => {
                let b = &self.brokers[usize::from(broker)];
                if self.faults_on && b.up && b.boot == boot {
                    let down = self
                        .master_crash
                        .as_mut()
                        .map_or(100, |(_, r)| r.range(50, 500));
                    self.note(|| format!("B{}: a new master crashes", broker + 1));
                    self.crash_broker(broker, down);
                }
            }
            Ev::Deadline => {
                self.check_liveness();
                self.at(self.now, Ev::End);
            }
            Ev::End => {}
        }
    }

    /// Carries out what a process asked for.
    fn process(&mut self, from: NodeId, out: Out) {
        let from_boot = self.boot_of(from).unwrap_or(0);
        for s in out.sends {
            let to_boot = match s.to_boot {
                Some(b) => b,
                None => match self.boot_of(s.to) {
                    Some(b) => b,
                    None => {
                        self.stats.messages_dropped += 1;
                        continue;
                    }
                },
            };
            self.send(Envelope {
                from,
                to: s.to,
                from_boot,
                to_boot,
                msg: s.msg,
            });
        }
        for l in out.later {
            match l {
                Later::Fsync {
                    store,
                    boot,
                    generation,
                } => {
                    let d = self.rng.range(1, 10);
                    self.after(
                        d,
                        Ev::Fsync {
                            store,
                            boot,
                            generation,
                        },
                    );
                }
                Later::IdentitiesPersisted {
                    broker,
                    boot,
                    identities,
                    bootstrap_epoch,
                } => {
                    let d = self.rng.range(1, 10);
                    self.after(
                        d,
                        Ev::Identities {
                            broker,
                            boot,
                            identities,
                            bootstrap_epoch,
                        },
                    );
                }
                Later::CounterPersisted {
                    broker,
                    boot,
                    counter,
                } => {
                    let d = self.rng.range(1, 10);
                    self.after(
                        d,
                        Ev::Counter {
                            broker,
                            boot,
                            counter,
                        },
                    );
                }
            }
        }
        for seen in out.seen {
            match seen {
                Seen::Stabilized {
                    broker,
                    boot,
                    epoch,
                    events,
                } => {
                    self.checker.stabilized(broker, boot, epoch, &events);
                    self.note(|| {
                        format!(
                            "B{} (epoch {:#x}) stabilized {}..={}",
                            broker + 1,
                            epoch.0,
                            events.first().map_or(0, |e| e.offset.0),
                            events.last().map_or(0, |e| e.offset.0)
                        )
                    });
                }
                Seen::Applied { broker, events } => self.checker.applied(broker, &events),
                Seen::BecameMaster { broker, epoch } => {
                    self.stats.masters += 1;
                    if let Some((p, r)) = self.master_crash.as_mut() {
                        if self.faults_on && r.chance(*p) {
                            let d = r.range(1, 60);
                            let boot = self.brokers[usize::from(broker)].boot;
                            self.after(d, Ev::CrashMaster { broker, boot });
                        }
                    }
                    self.note(|| format!("B{} became master of epoch {:#x}", broker + 1, epoch.0));
                }
                Seen::HandoffDone { broker, outcome } => {
                    match &outcome {
                        Ok(_) => self.stats.handoffs_done += 1,
                        Err(_) => self.stats.handoffs_failed += 1,
                    }
                    self.note(|| match outcome {
                        Ok(epoch) => format!(
                            "B{}'s handoff done: epoch {:#x} serves",
                            broker + 1,
                            epoch.0
                        ),
                        Err(why) => format!("B{}'s handoff failed: {why}", broker + 1),
                    });
                }
                Seen::Note(line) => self.note(|| line),
                Seen::Fencing {
                    broker,
                    boot,
                    epoch,
                } => {
                    if !self.config.end_to_end_only {
                        self.checker.fencing(broker, boot, epoch);
                    }
                }
                Seen::AckClaim {
                    store,
                    broker,
                    boot,
                    epoch,
                    through,
                    held,
                } => {
                    let b = &self.brokers[usize::from(broker)];
                    if b.up && b.boot == boot && !self.config.end_to_end_only {
                        if let Some(master_has) = b.master_epoch_at(epoch, through) {
                            self.checker
                                .ack_claim(store, epoch, through, held, master_has);
                        }
                    }
                }
            }
        }
    }

    fn boot_of(&self, node: NodeId) -> Option<u32> {
        match node {
            NodeId::Broker(b) => {
                let b = &self.brokers[usize::from(b)];
                b.up.then_some(b.boot)
            }
            NodeId::Store(s) => {
                let s = &self.stores[usize::from(s)];
                s.up.then_some(s.boot)
            }
            NodeId::Client(_) => Some(1),
        }
    }

    // ---------------------------------------------------------------- network

    fn blocked(&self, from: NodeId, to: NodeId) -> bool {
        self.cuts
            .iter()
            .any(|c| c.from.contains(&from) && c.to.contains(&to))
    }

    fn send(&mut self, env: Envelope) {
        if self.blocked(env.from, env.to) || self.rng.chance(self.net.drop_p) {
            self.stats.messages_dropped += 1;
            return;
        }
        if self.rng.chance(self.net.dup_p) {
            self.stats.messages_duplicated += 1;
            let d = self.latency();
            self.after(d, Ev::Deliver(Box::new(env.clone())));
        }
        let d = self.latency();
        self.after(d, Ev::Deliver(Box::new(env)));
    }

    fn latency(&mut self) -> u64 {
        if self.rng.chance(self.net.slow_p) {
            self.rng
                .range(self.net.latency_ms_max, self.net.slow_ms_max)
        } else {
            self.rng.range(1, self.net.latency_ms_max)
        }
    }

    fn deliver(&mut self, env: Envelope) {
        if self.blocked(env.from, env.to) || self.boot_of(env.to) != Some(env.to_boot) {
            self.stats.messages_dropped += 1;
            return;
        }
        if let Some(held) = self.paused.get_mut(&env.to) {
            held.push_back(Ev::Deliver(Box::new(env)));
            return;
        }
        self.stats.messages_delivered += 1;
        let now = self.now;
        let Envelope {
            from,
            to,
            from_boot,
            msg,
            ..
        } = env;
        match to {
            NodeId::Broker(b) => {
                let mut out = Out::default();
                self.brokers[usize::from(b)].on_msg(from, from_boot, msg, now, &mut out);
                self.process(to, out);
            }
            NodeId::Store(s) => {
                let mut out = Out::default();
                let store = &mut self.stores[usize::from(s)];
                match msg {
                    Msg::Append { meta, req } => {
                        store.on_append(from, from_boot, meta, req, &mut out)
                    }
                    Msg::Fence { req } => store.on_fence(from, from_boot, req, &mut out),
                    Msg::Tail { generation } => {
                        store.on_tail(from, from_boot, generation, &mut out)
                    }
                    Msg::Read {
                        purpose,
                        from: first,
                        max_events,
                    } => store.on_read(from, from_boot, purpose, first, max_events, &mut out),
                    _ => {}
                }
                self.process(to, out);
            }
            NodeId::Client(c) => self.client_msg(c, msg),
        }
    }

    /// Tells brokers about connections that changed.
    fn refresh_links(&mut self) {
        for b in 0..self.brokers.len() {
            if !self.brokers[b].up {
                continue;
            }
            let me = NodeId::Broker(b as u8);
            let boot = self.brokers[b].boot;
            for slot in 0..self.brokers[b].slot_count() {
                let slot = slot as u16;
                let peer = self.brokers[b].slot_node(SlotId(slot));
                let up = self.boot_of(peer).is_some()
                    && !self.blocked(me, peer)
                    && !self.blocked(peer, me);
                let key = (b as u8, slot);
                if self.links.get(&key) != Some(&up) {
                    self.links.insert(key, up);
                    self.after(
                        LINK_NOTICE_MS,
                        Ev::Link {
                            broker: b as u8,
                            boot,
                            slot,
                            up,
                        },
                    );
                }
            }
        }
    }

    // ---------------------------------------------------------------- processes

    fn start_broker(&mut self, b: u8) {
        let i = usize::from(b);
        let me = NodeId::Broker(b);
        let slot_up: Vec<bool> = (0..self.brokers[i].slot_count())
            .map(|slot| {
                let peer = self.brokers[i].slot_node(SlotId(slot as u16));
                let up = self.boot_of(peer).is_some()
                    && !self.blocked(me, peer)
                    && !self.blocked(peer, me);
                self.links.insert((b, slot as u16), up);
                up
            })
            .collect();
        let mut out = Out::default();
        let now = self.now;
        self.brokers[i].start(now, slot_up, &mut out);
        let boot = self.brokers[i].boot;
        self.process(me, out);
        let d = self.rng.range(1, self.heartbeat_ms);
        self.after(d, Ev::Tick { broker: b, boot });
        self.refresh_links();
    }

    fn crash_broker(&mut self, b: u8, down_ms: u64) {
        let i = usize::from(b);
        if !self.brokers[i].up {
            return;
        }
        self.paused.remove(&NodeId::Broker(b));
        self.brokers[i].crash(&mut self.rng);
        self.stats.broker_crashes += 1;
        self.note(|| format!("B{} crashed", b + 1));
        self.refresh_links();
        if !self.broker_restart_pending[i] {
            self.broker_restart_pending[i] = true;
            self.after(down_ms, Ev::StartBroker(b));
        }
    }

    fn start_store(&mut self, s: u8) {
        let i = usize::from(s);
        if self.stores[i].up || self.reinit_pending[i] {
            return;
        }
        match self.stores[i].start() {
            StartOutcome::Started { cut, cut_sealed } => {
                if let (Some(c), Some(o)) = (cut, cut_sealed) {
                    self.checker.sealed_entry_cut(s, o, c.offset);
                }
                if let Some(cut) = cut {
                    self.stats.tail_cuts += 1;
                    self.note(|| {
                        format!(
                            "S{s} cut a torn tail from offset {} and is marked (promised {:#x})",
                            cut.offset.0, cut.promised.0
                        )
                    });
                }
                self.note(|| format!("S{s} started"));
                self.refresh_links();
            }
            StartOutcome::Corrupt { offset } => {
                self.note(|| {
                    format!("S{s} found corruption at offset {offset} and refuses to start")
                });
                let d = self.rng.range(100, 600);
                self.schedule_reinit(s, d);
            }
        }
    }

    fn crash_store(&mut self, s: u8) {
        let i = usize::from(s);
        if !self.stores[i].up {
            return;
        }
        self.paused.remove(&NodeId::Store(s));
        let tear = self.mark_allowed(i);
        self.stores[i].crash(&mut self.rng, tear);
        self.stats.store_crashes += 1;
        self.note(|| format!("S{s} crashed"));
        self.refresh_links();
    }

    fn schedule_store_start(&mut self, s: u8, delay_ms: u64) {
        let i = usize::from(s);
        if !self.store_restart_pending[i] {
            self.store_restart_pending[i] = true;
            self.after(delay_ms, Ev::StartStore(s));
        }
    }

    fn schedule_reinit(&mut self, s: u8, delay_ms: u64) {
        let i = usize::from(s);
        if !self.reinit_pending[i] {
            self.reinit_pending[i] = true;
            self.after(delay_ms, Ev::Reinit(s));
        }
    }

    /// One visit of the operator replacing store `s`'s old identity (see [`Ev::Replace`]).
    fn replace(&mut self, s: u8) {
        let i = usize::from(s);
        let id = self.stores[i].identity();
        let current = StoreIdentity {
            store_id: id.store_id,
            incarnation: id.incarnation,
        };
        let master = (0..self.brokers.len()).find(|&b| {
            self.brokers[b].is_serving_master()
                && !self.paused.contains_key(&NodeId::Broker(b as u8))
        });
        let view = master.and_then(|b| Some((b, self.brokers[b].voter_at(s)?)));
        let change = match view {
            Some((_, (Some(voting), false))) if voting == current => {
                self.replacing[i] = false;
                self.identities[i] = current;
                if std::mem::take(&mut self.wipe_lost[i]) {
                    self.losses -= 1;
                }
                self.stats.replacements += 1;
                self.note(|| format!("operator: S{s} is a voter again under its new identity"));
                return;
            }
            Some((b, (Some(old), false))) => Some((b, VoterChange::Remove, old)),
            Some((b, (None, false))) if self.stores[i].up => Some((b, VoterChange::Add, current)),
            _ => None,
        };
        if let Some((b, action, identity)) = change {
            self.note(|| format!("operator: {action:?} S{s} on B{}", b + 1));
            let mut out = Out::default();
            let now = self.now;
            self.brokers[b].request_voter_change(
                VoterChangeRequest {
                    action,
                    store_index: u16::from(s),
                    store_id: identity.store_id,
                    incarnation: identity.incarnation,
                },
                now,
                &mut out,
            );
            self.process(NodeId::Broker(b as u8), out);
        }
        let d = self.rng.range(100, 600);
        self.after(d, Ev::Replace(s));
    }

    fn pause(&mut self, node: NodeId, ms: u64) {
        if self.paused.contains_key(&node) || self.boot_of(node).is_none() {
            return;
        }
        match node {
            NodeId::Broker(_) => self.stats.broker_pauses += 1,
            NodeId::Store(_) => self.stats.store_pauses += 1,
            NodeId::Client(_) => {}
        }
        self.paused.insert(node, VecDeque::new());
        self.note(|| format!("{node} paused for {ms} ms"));
        self.after(ms, Ev::Resume(node));
    }

    fn resume(&mut self, node: NodeId) {
        let Some(held) = self.paused.remove(&node) else {
            return;
        };
        self.note(|| format!("{node} resumed"));
        for ev in held {
            self.at(self.now, ev);
        }
        if let NodeId::Broker(b) = node {
            if let Some(boot) = self.boot_of(node) {
                self.at(self.now, Ev::Tick { broker: b, boot });
            }
        }
    }

    // ---------------------------------------------------------------- faults

    fn is_voter(&self, s: usize) -> bool {
        let id = self.stores[s].identity();
        let bound = self.identities[s];
        id.role == Role::Voter
            && id.store_id == bound.store_id
            && id.incarnation == bound.incarnation
    }

    /// Voters that carry a tail-cut mark or will at their next start, other than `except`.
    fn marked_voters(&self, except: usize) -> usize {
        (0..self.stores.len())
            .filter(|&s| s != except && self.is_voter(s))
            .filter(|&s| self.stores[s].marked() == Some(true))
            .count()
    }

    /// Liveness mode keeps enough voters for a takeover to complete once the faults stop
    /// (docs/testing.md): F unmarked voters, or no voter lost for good (then every store
    /// grants). A crash may tear a write of store `s` (which marks it) only if that stays
    /// true. Safety mode tears any crash.
    fn mark_allowed(&self, s: usize) -> bool {
        if self.config.mode != Mode::Liveness || !self.is_voter(s) {
            return true;
        }
        if self.stores[s].marked() == Some(true) {
            return true;
        }
        let n = self.stores.len();
        self.losses == 0 || n >= self.losses + self.marked_voters(s) + 1 + self.fence_quorum
    }

    /// Liveness mode: whether voter `s` may be lost for good (a wipe, a flipped bit) with
    /// F unmarked voters left (see [`World::mark_allowed`]).
    fn loss_allowed(&self, s: usize) -> bool {
        if self.config.mode != Mode::Liveness {
            return true;
        }
        let n = self.stores.len();
        n >= self.losses + 1 + self.marked_voters(s) + self.fence_quorum
    }

    fn inject_faults(&mut self) {
        let r = self.rates;
        let nb = self.brokers.len();
        let ns = self.stores.len();
        if self.rng.chance(r.broker_crash) {
            let b = self.rng.index(nb) as u8;
            let down = self.rng.range(20, 2_000);
            self.crash_broker(b, down);
        }
        if self.rng.chance(r.broker_pause) {
            let b = self.rng.index(nb) as u8;
            let ms = self.rng.range(100, 2_000);
            self.pause(NodeId::Broker(b), ms);
        }
        if self.rng.chance(r.store_crash) {
            let s = self.rng.index(ns) as u8;
            let down = self.rng.range(20, 1_500);
            self.crash_store(s);
            self.schedule_store_start(s, down);
        }
        if self.rng.chance(r.store_pause) {
            let s = self.rng.index(ns) as u8;
            let ms = self.rng.range(50, 1_000);
            self.pause(NodeId::Store(s), ms);
        }
        if self.rng.chance(r.store_wipe) {
            let s = self.rng.index(ns);
            let voter = self.is_voter(s);
            if !voter || (self.losses < self.losses_max && self.loss_allowed(s)) {
                if voter {
                    self.losses += 1;
                    self.wipe_lost[s] = true;
                }
                self.crash_store(s as u8);
                self.note(|| format!("S{s}'s disk is lost"));
                let d = self.rng.range(100, 800);
                self.schedule_reinit(s as u8, d);
            }
        }
        if self.rng.chance(r.bit_flip) {
            let s = self.rng.index(ns);
            let voter = self.is_voter(s);
            if !voter || (self.losses < self.losses_max && self.loss_allowed(s)) {
                self.crash_store(s as u8);
                if !self.stores[s].up {
                    let tail = self.config.faults.tail_flips;
                    if let Some(at) = self.stores[s].flip_bit(tail, &mut self.rng) {
                        if voter {
                            self.losses += 1;
                        }
                        self.stats.bit_flips += 1;
                        self.note(|| format!("S{s}: a bit flipped in the entry at offset {at}"));
                    }
                    let d = self.rng.range(20, 500);
                    self.schedule_store_start(s as u8, d);
                }
            }
        }
        for (p, fault) in [
            (r.fsync_eio, DiskFault::FsyncEio),
            (r.enospc, DiskFault::Enospc),
        ] {
            if self.rng.chance(p) {
                let s = self.rng.index(ns);
                if self.stores[s].up {
                    self.stores[s].arm(Some(fault));
                    match fault {
                        DiskFault::FsyncEio => self.stats.fsync_eio += 1,
                        DiskFault::Enospc => self.stats.enospc += 1,
                    }
                    self.note(|| format!("S{s}: the next {fault:?} strikes"));
                    // The operator notices the failed log and restarts the store later.
                    let d = self.rng.range(300, 2_000);
                    self.after(d, Ev::OperatorRestart(s as u8));
                }
            }
        }
        if self.rng.chance(r.partition) && self.cuts.len() < CUTS_MAX {
            self.partition();
        }
        if self.rng.chance(r.handoff) {
            self.handoff();
        }
    }

    /// An operator asks a serving master to hand over to another broker (any of them: a
    /// down or partitioned target is a handoff that must fail cleanly).
    fn handoff(&mut self) {
        let Some(b) = (0..self.brokers.len()).find(|&b| {
            self.brokers[b].is_serving_master()
                && !self.paused.contains_key(&NodeId::Broker(b as u8))
        }) else {
            return;
        };
        let others: Vec<u8> = (0..self.brokers.len() as u8)
            .filter(|&o| usize::from(o) != b)
            .collect();
        let to = others[self.rng.index(others.len())];
        self.stats.handoffs += 1;
        self.note(|| format!("operator: B{} hands over to B{}", b + 1, to + 1));
        let mut out = Out::default();
        let now = self.now;
        self.brokers[b].request_handoff(to, now, &mut out);
        self.process(NodeId::Broker(b as u8), out);
    }

    fn partition(&mut self) {
        let servers: Vec<NodeId> = (0..self.brokers.len())
            .map(|b| NodeId::Broker(b as u8))
            .chain((0..self.stores.len()).map(|s| NodeId::Store(s as u8)))
            .collect();
        let clients: Vec<NodeId> = (0..self.producers.len() + self.consumers.len())
            .map(|c| NodeId::Client(c as u8))
            .collect();
        let id = self.next_cut;
        self.next_cut += 1;
        let kind = self.rng.range(0, 3);
        let (a, b): (Vec<NodeId>, Vec<NodeId>) = match kind {
            0 | 1 => {
                // Split the servers in two (kind 0: one node alone).
                let mut a = Vec::new();
                let mut b = Vec::new();
                if kind == 0 {
                    let i = self.rng.index(servers.len());
                    for (j, &n) in servers.iter().enumerate() {
                        if j == i {
                            a.push(n)
                        } else {
                            b.push(n)
                        }
                    }
                } else {
                    for &n in &servers {
                        if self.rng.chance(0.5) {
                            a.push(n)
                        } else {
                            b.push(n)
                        }
                    }
                }
                (a, b)
            }
            2 => {
                // Clients cut from some brokers.
                let a: Vec<NodeId> = clients
                    .iter()
                    .copied()
                    .filter(|_| self.rng.chance(0.5))
                    .collect();
                let b: Vec<NodeId> = (0..self.brokers.len())
                    .map(|b| NodeId::Broker(b as u8))
                    .filter(|_| self.rng.chance(0.5))
                    .collect();
                (a, b)
            }
            _ => {
                let mut a = Vec::new();
                let mut b = Vec::new();
                for &n in &servers {
                    match self.rng.range(0, 2) {
                        0 => a.push(n),
                        1 => b.push(n),
                        _ => {}
                    }
                }
                (a, b)
            }
        };
        if a.is_empty() || b.is_empty() {
            return;
        }
        let one_way = self.rng.chance(0.35);
        let ms = self.rng.range(100, 3_000);
        self.stats.partitions += 1;
        self.note(|| {
            format!(
                "cut {id}: {} {} {} for {ms} ms",
                list(&a),
                if one_way { "->" } else { "<->" },
                list(&b)
            )
        });
        self.cuts.push(Cut {
            id,
            from: a.clone(),
            to: b.clone(),
        });
        if !one_way {
            self.cuts.push(Cut { id, from: b, to: a });
        }
        self.after(ms, Ev::Heal(id));
        self.refresh_links();
    }

    fn quiet(&mut self) {
        self.faults_on = false;
        self.quiet_ms = Some(self.now);
        self.note(|| "faults stop".into());
        self.net.drop_p = 0.0;
        self.net.dup_p = 0.0;
        self.net.slow_p = 0.0;
        self.cuts.clear();
        let paused: Vec<NodeId> = self.paused.keys().copied().collect();
        for n in paused {
            self.resume(n);
        }
        for b in 0..self.brokers.len() {
            if !self.brokers[b].up {
                self.start_broker(b as u8);
            }
        }
        for s in 0..self.stores.len() {
            self.stores[s].arm(None);
            if self.stores[s].up && self.stores[s].is_failed() {
                self.crash_store(s as u8);
            }
            if !self.stores[s].up {
                self.start_store(s as u8);
            }
        }
        self.refresh_links();
        let bound = self.config.liveness_bound_ms;
        self.after(bound, Ev::Deadline);
    }

    fn check_liveness(&mut self) {
        let Some(quiet) = self.quiet_ms else {
            return;
        };
        let deadline = self.now;
        for p in &self.producers {
            let progressed = self.batches.iter().any(|b| {
                b.producer_id == p.producer_id
                    && b.first_attempt_ms >= quiet
                    && b.ok_ms.is_some_and(|t| t <= deadline)
            });
            if !progressed {
                let masters: Vec<String> = self
                    .brokers
                    .iter()
                    .filter_map(|b| {
                        b.master_epoch().map(|e| {
                            format!(
                                "B{} {:#x} serving={}",
                                b.index + 1,
                                e.0,
                                b.is_serving_master()
                            )
                        })
                    })
                    .collect();
                self.checker.violations.push(Violation::NoProgress {
                    why: format!(
                        "producer {} had no new batch acknowledged within {} ms after the faults stopped (masters: {masters:?})",
                        p.producer_id, self.config.liveness_bound_ms
                    ),
                });
            }
        }
    }

    // ---------------------------------------------------------------- clients

    fn producer_wake(&mut self, p: u8) {
        if !self.producing {
            return;
        }
        let i = usize::from(p);
        if self.producers[i].awaiting.is_some() {
            return;
        }
        let bi = match self.producers[i].current {
            Some(bi) => bi,
            None => {
                let now = self.now;
                let batch = self.producers[i].new_batch(now, &mut self.rng);
                self.batches.push(batch);
                let bi = self.batches.len() - 1;
                self.producers[i].current = Some(bi);
                bi
            }
        };
        let Attempt { to, msg, request } = self.producers[i].attempt(&mut self.batches[bi]);
        let from = self.producers[i].node_id();
        match self.boot_of(NodeId::Broker(to)) {
            Some(to_boot) => self.send(Envelope {
                from,
                to: NodeId::Broker(to),
                from_boot: 1,
                to_boot,
                msg,
            }),
            None => self.stats.messages_dropped += 1,
        }
        self.after(CLIENT_TIMEOUT_MS, Ev::ProducerTimeout(p, request));
    }

    fn consumer_wake(&mut self, c: u8) {
        let i = usize::from(c);
        if self.consumers[i].awaiting.is_some() || self.consumers[i].resuming.is_some() {
            return;
        }
        if self.config.faults.cursors {
            if self.rng.chance(0.03) {
                // A restart: read the committed cursor first.
                let (request, msg) = self.consumers[i].read_cursor();
                self.consumer_send(c, request, msg);
                return;
            }
            let con = &self.consumers[i];
            if con.committing.is_none()
                && con.next > quire_proto::Offset::ZERO
                && self.rng.chance(0.2)
            {
                let (request, msg) = self.consumers[i].commit();
                self.consumer_send(c, request, msg);
            }
        }
        let wait_ms = if self.rng.chance(0.5) {
            0
        } else {
            self.rng.range(10, FETCH_TIMEOUT_MS / 2) as u32
        };
        let (request, msg) = self.consumers[i].fetch(wait_ms);
        self.consumer_send(c, request, msg);
    }

    /// Sends consumer `c`'s request `request` to the broker it targets, with a timeout.
    fn consumer_send(&mut self, c: u8, request: u64, msg: Msg) {
        let i = usize::from(c);
        let to = self.consumers[i].target;
        let from = NodeId::Client(self.consumers[i].node);
        match self.boot_of(NodeId::Broker(to)) {
            Some(to_boot) => self.send(Envelope {
                from,
                to: NodeId::Broker(to),
                from_boot: 1,
                to_boot,
                msg,
            }),
            None => self.stats.messages_dropped += 1,
        }
        self.after(FETCH_TIMEOUT_MS, Ev::ConsumerTimeout(c, request));
    }

    fn client_msg(&mut self, node: u8, msg: Msg) {
        let np = self.producers.len();
        let nb = self.brokers.len();
        if usize::from(node) < np {
            let p = node;
            let i = usize::from(p);
            let (request, answer) = match msg {
                Msg::ProduceOk {
                    request,
                    base_offset,
                } => (request, Ok(base_offset)),
                Msg::ProduceFailed { request, error } => (request, Err(error)),
                _ => return,
            };
            // The answer may be for the batch in progress or a late one for an older batch.
            let Some(bi) = self.batches.iter().rposition(|b| {
                b.producer_id == self.producers[i].producer_id && b.attempts.contains(&request)
            }) else {
                return;
            };
            let now = self.now;
            if self.producers[i].current != Some(bi) {
                // A late answer for a finished batch: an ok still counts as an ack.
                if let Ok(base) = answer {
                    self.batches[bi].oks.push(base);
                }
                return;
            }
            let done = self.producers[i].on_answer(
                &mut self.batches[bi],
                request,
                answer,
                now,
                nb,
                &mut self.rng,
            );
            if let Ok(base) = answer {
                self.note(|| format!("producer {} batch {} acked at {base}", p, bi));
            }
            if done {
                self.producers[i].current = None;
                let d = self.rng.range(0, 30);
                self.after(d, Ev::ProducerWake(p));
            } else if self.producers[i].awaiting.is_none() {
                if let Err(
                    ProduceError::NotMaster { .. }
                    | ProduceError::Timeout
                    | ProduceError::Overloaded,
                ) = answer
                {
                    let d = self.rng.range(10, 100);
                    self.after(d, Ev::ProducerWake(p));
                }
            }
        } else {
            let c = node - np as u8;
            let i = usize::from(c);
            let (request, reply) = match msg {
                Msg::Fetched { request, reply } => (request, reply),
                Msg::CursorCommitted { request, ok } => {
                    self.note(|| format!("consumer C{c}: cursor commit {request} ok {ok}"));
                    self.consumers[i].on_committed(request, ok);
                    return;
                }
                Msg::CursorValue { request, offset } => {
                    self.note(|| format!("consumer C{c}: cursor read {request}: {offset:?}"));
                    let nb = self.brokers.len();
                    if self.consumers[i].on_cursor(request, offset, nb, &mut self.rng) {
                        let d = self.rng.range(5, 60);
                        self.after(d, Ev::ConsumerWake(c));
                    }
                    return;
                }
                _ => return,
            };
            let nb = self.brokers.len();
            let at = self.consumers[i].next;
            self.note(|| match &reply {
                FetchReply::Messages(m) => format!(
                    "consumer C{c} from offset {at}: {} messages {:?}, next {}",
                    m.messages.len(),
                    m.messages.iter().map(|(o, _)| o.0).collect::<Vec<_>>(),
                    m.next_offset
                ),
                other => format!("consumer C{c} from offset {at}: {other:?}"),
            });
            if !self.consumers[i].on_answer(request, reply, nb, &mut self.rng) {
                return;
            }
            let d = self.rng.range(5, 60);
            self.after(d, Ev::ConsumerWake(c));
        }
    }
}

fn list(nodes: &[NodeId]) -> String {
    let v: Vec<String> = nodes.iter().map(ToString::to_string).collect();
    format!("{{{}}}", v.join(","))
}
