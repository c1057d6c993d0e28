//! The broker's actor: the tokio driver of the broker [`Engine`] (`crate::engine`). One
//! task owns the engine, the waiting producers and consumers and the events kept for
//! fetches. Everything that happens arrives as a message (client requests, slot answers,
//! blocking-helper completions, the heartbeat tick) and becomes an engine input, stamped
//! with the actor's monotonic clock in ms; the engine's commands become I/O handed to slot
//! tasks, spawned tasks and blocking threads, which answer by message. The actor never waits
//! on a socket or a disk.
//!
//! The roles and their changes (follower, takeover, bootstrap, master, step-down,
//! check-quorum) are the engine's: see [`crate::engine::broker`]. Still decided here, not
//! in the engine yet: fetch and its long-poll waiters, the phases of a graceful handoff
//! (`actor/handoff.rs`) and retention with its checkpoints (`actor/retention.rs`); they see
//! the role through the engine's accessors.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use quire_client::{ClientError, FenceOutcome};
use quire_proto::{
    encode_body, AppendRequest, Body, BrokerId, BrokerInfo, CommitCursorResponse, CursorRequest,
    CursorResponse, Epoch, ErrorCode, ErrorResponse, EventKind, Frame, HeartbeatAck, LogPosition,
    MetadataResponse, Offset, ProduceResponse, RequestId, StoreInfo,
};
use tokio::sync::mpsc;

use super::conn::{Permits, Request, Responder};
use super::slots::{AppendMeta, Internal, SlotHandle, SlotSend};
use crate::config::BrokerConfig;
use crate::core::{
    AppendCommand, AppendEvents, AppendId, ClusterConfig, Event, MasterCore, ReplicationLimits,
    SlotId, SlotKind, StoreIdentity,
};
use crate::durable::{self, ClusterFile};
use crate::engine::{
    Command, Engine, EngineConfig, FenceAnswer, FetchReply, InboundAnswer, Mutations, Reply,
    RequestToken, RoleView, SlotAnswer, StoreFetch, TailAnswer, TakeoverRead, WriteCommand,
    WriteKind, WriteLimits, WriteRequest,
};
use crate::metrics::{Metrics, StatusSnapshot, StoreProgress};
use crate::security::SecurityChange;
use quire_net::Readiness;

mod handoff;

pub use crate::engine::{FETCH_BYTES_MAX, FETCH_WAITERS_MAX, FETCH_WAIT_MS_MAX};

/// Produce and commit requests waiting for the master to serve or for in-flight room.
pub const BLOCKED_REQUESTS_MAX: usize = 4096;
/// Requests the actor takes from its queue before flushing proposals to the stores.
pub const DRAIN_BATCH_MAX: usize = 1024;
/// Most events asked of a store in one takeover fetch.
pub const TAKEOVER_FETCH_EVENTS_MAX: u32 = 4096;
/// Most payload bytes asked of a store in one read.
pub const READ_BYTES_MAX: u32 = 8 << 20;
/// Most payload bytes of one append to a lagging store, read from another store (at least
/// one event): the in-memory appends' default bound (`APPEND_BYTES_MAX_DEFAULT`), far
/// below the frame limit an append must fit in.
pub const CATCH_UP_APPEND_BYTES_MAX: u32 = 1 << 20;
pub use crate::engine::broker::SLAVE_READY_LAG_EVENTS_MAX;

/// A fetch the engine holds by its token: what answers it.
#[derive(Debug)]
pub(crate) struct Waiter {
    request_id: RequestId,
    reply: Responder,
    permits: Permits,
}

impl Waiter {
    /// Answers the request; its permits go back once the answer is written (a fetch's
    /// answer bytes among them).
    fn answer(self, body: Body) {
        self.reply.answer(self.request_id, body, self.permits);
    }
}

/// The actor. See the module docs.
/// Events whose sizes a metadata answer (`quire cluster status`, but also every Kafka
/// client's Metadata request) and the metrics at each tick sum exactly for a store's bytes
/// to copy; the rest are estimated at the mean size. Bounds the work on the actor.
const EXACT_EVENTS_MAX: usize = 4_096;

pub(crate) struct Actor {
    /// Fetches planned again after a store answered `Corrupt`: how many times, and the
    /// last damaged offset (a fetch no store can serve is then answered `Corrupt`).
    fetch_replans: HashMap<RequestToken, (usize, Offset)>,
    cfg: Arc<BrokerConfig>,
    me: BrokerId,
    store_count: usize,
    cluster_file: ClusterFile,
    slots: Vec<SlotHandle>,
    engine: Engine,
    internal_tx: mpsc::Sender<Internal>,
    metrics: Arc<Metrics>,
    /// See [`ActorInit::message_event_bytes_max`].
    message_event_bytes_max: Arc<AtomicUsize>,
    start: Instant,
    /// Fetches handed to the engine and not yet answered.
    held_fetches: BTreeMap<RequestToken, Waiter>,
    /// Handoff requests the engine holds, by token.
    handoff_requests: BTreeMap<RequestToken, (RequestId, Responder)>,
    /// Write requests handed to the engine and not yet answered.
    held_writes: BTreeMap<RequestToken, HeldWrite>,
    next_token: u64,
    /// When each batch in flight was proposed, by its last offset (quorum-wait metric).
    proposed_at: BTreeMap<Offset, Instant>,
    /// See [`ActorInit::security`].
    security: crate::security::SecurityView,
    /// The tables last set in `security`.
    published_security: Arc<crate::security::SecurityTables>,
    /// See [`ActorInit::kafka_advertised`].
    kafka_advertised: Option<String>,
    /// While master: how fast each store closes in on the log end (sampled at ticks).
    catch_up: super::catch_up::CatchUp,
}

/// A write request the engine holds by its token: what answers it.
#[derive(Debug)]
struct HeldWrite {
    request_id: RequestId,
    reply: Responder,
    permits: Permits,
    received: Instant,
}

impl std::fmt::Debug for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actor")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

/// Everything the actor starts with.
pub(crate) struct ActorInit {
    pub(crate) cfg: Arc<BrokerConfig>,
    pub(crate) cluster_file: ClusterFile,
    pub(crate) durable_counter: u64,
    pub(crate) slots: Vec<SlotHandle>,
    pub(crate) internal_tx: mpsc::Sender<Internal>,
    pub(crate) metrics: Arc<Metrics>,
    /// Raised to the payload length of every message event applied (shared with the
    /// connection readers, who bound a fetch's answer by it).
    pub(crate) message_event_bytes_max: Arc<AtomicUsize>,
    /// The users and ACL entries the connections check against (set from the state).
    pub(crate) security: crate::security::SecurityView,
    /// This broker's advertised Kafka address, `None` without a Kafka listener
    /// ([`quire_proto::MetadataResponse::kafka`]).
    pub(crate) kafka_advertised: Option<String>,
}

/// `d` in whole milliseconds, saturating.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Actor {
    pub(crate) fn new(init: ActorInit) -> Actor {
        let ActorInit {
            cfg,
            cluster_file,
            durable_counter,
            slots,
            internal_tx,
            metrics,
            message_event_bytes_max,
            security,
            kafka_advertised,
        } = init;
        let store_count = cfg.stores.len();
        let identities = cluster_file.identities_by_slot();
        let mut kinds = SlotKind::stores_from_bound(&identities);
        for (b, _) in &cfg.brokers {
            if *b != cfg.id {
                kinds.push(SlotKind::Slave { broker: *b });
            }
        }
        let mut cluster = ClusterConfig::with_majorities(kinds);
        if cfg.ack_quorum != crate::core::quorum::majority(store_count) {
            // Flexible quorums (docs/operations.md); a voter-set change keeps Qa.
            let n = cluster.voter_count();
            cluster.ack_quorum = cfg.ack_quorum.min(n);
            cluster.fence_quorum = (n + 1).saturating_sub(cluster.ack_quorum).max(1);
        }
        let seed = u64::from(std::process::id())
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        let limits = ReplicationLimits {
            retained_bytes_max: cfg.recent_bytes_max,
            ..ReplicationLimits::default()
        };
        let engine_cfg = EngineConfig {
            me: cfg.id,
            brokers: cfg.brokers.iter().map(|(b, _)| *b).collect(),
            cluster,
            election_timeout_ms: ms(cfg.election_timeout),
            heartbeat_ms: ms(cfg.heartbeat),
            takeover_timeout_ms: ms(takeover_budget(&cfg)),
            check_quorum: true,
            write_limits: WriteLimits {
                message_bytes_max: cfg.message_bytes_max,
                inflight_bytes_max: limits.inflight_bytes_max,
                produce_timeout_ms: ms(cfg.produce_timeout),
                blocked_requests_max: BLOCKED_REQUESTS_MAX,
                topics_max: cfg.topics_max,
                cursors_max: cfg.cursors_max,
            },
            limits,
            takeover_fetch_events_max: TAKEOVER_FETCH_EVENTS_MAX,
            follower_retained_bytes_max: crate::core::follower::FOLLOWER_RETAINED_BYTES_MAX_DEFAULT,
            seed,
            retention: cfg.retention,
            recent_bytes_max: cfg.recent_bytes_max,
            checkpoint_part_bytes: cfg.checkpoint_part_bytes,
            mutations: Mutations::default(),
        };
        Actor {
            fetch_replans: HashMap::new(),
            me: cfg.id,
            store_count,
            cluster_file,
            slots,
            engine: Engine::new(engine_cfg, durable_counter, 0),
            internal_tx,
            metrics,
            message_event_bytes_max,
            start: Instant::now(),
            held_fetches: BTreeMap::new(),
            handoff_requests: BTreeMap::new(),
            held_writes: BTreeMap::new(),
            next_token: 0,
            proposed_at: BTreeMap::new(),
            published_security: crate::security::current(&security),
            security,
            kafka_advertised,
            catch_up: super::catch_up::CatchUp::default(),
            cfg,
        }
    }

    /// Runs until the request channel closes (the broker stops).
    pub(crate) async fn run(
        mut self,
        mut requests: mpsc::Receiver<Request>,
        mut internal: mpsc::Receiver<Internal>,
    ) {
        let mut tick = tokio::time::interval(self.cfg.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                m = internal.recv() => {
                    let Some(m) = m else { return };
                    self.on_internal(m);
                    let mut n = 0;
                    while n < DRAIN_BATCH_MAX {
                        match internal.try_recv() {
                            Ok(m) => self.on_internal(m),
                            Err(_) => break,
                        }
                        n += 1;
                    }
                    self.flush();
                }
                _ = tick.tick() => self.on_tick(),
                r = requests.recv() => {
                    let Some(r) = r else { return };
                    self.on_request(r);
                    let mut n = 0;
                    while n < DRAIN_BATCH_MAX {
                        match requests.try_recv() {
                            Ok(r) => self.on_request(r),
                            Err(_) => break,
                        }
                        n += 1;
                    }
                    self.flush();
                }
            }
        }
    }

    // ------------------------------------------------------------------ helpers

    /// The engine's clock: ms since the actor started.
    fn now_ms(&self) -> u64 {
        ms(self.start.elapsed())
    }

    /// `t` in ms on the engine's clock.
    fn ms_at(&self, t: Instant) -> u64 {
        ms(t.saturating_duration_since(self.start))
    }

    fn slot_of(i: usize) -> SlotId {
        SlotId(u16::try_from(i).expect("invariant: slots <= SLOTS_MAX"))
    }

    fn broker_info(&self, id: BrokerId) -> Option<BrokerInfo> {
        self.cfg.broker_addr(id).map(|addr| BrokerInfo {
            id,
            addr: addr.to_owned(),
        })
    }

    /// The master as far as this broker knows, for `NotMaster` hints and metadata.
    fn master_hint(&self) -> (Epoch, Option<BrokerInfo>) {
        let (epoch, master) = self.engine.master_hint(self.now_ms());
        (epoch, master.and_then(|b| self.broker_info(b)))
    }

    fn not_master(&self, reply: &Responder, request_id: RequestId) {
        let (epoch, master) = self.master_hint();
        reply.error(request_id, ErrorResponse::not_master(epoch, master));
    }

    // ------------------------------------------------------------------ requests

    /// Serves one request of a connection. Requests answered here hold their connection's
    /// request slot until the answer is written (`Responder::answer`), as the ones the
    /// engine answers later do, so a client that pipelines requests faster than it reads
    /// is stopped being read at `CONN_REQUESTS_MAX` instead of filling its writer queue and
    /// being disconnected (a break-it trial: 100,000 pipelined metadata requests, read
    /// concurrently, were cut off after 26,647 answers).
    fn on_request(&mut self, r: Request) {
        match r.body {
            Body::AppendRequest(_) => self.on_inbound_append(r),
            Body::Heartbeat(ref h) => {
                let (epoch, last) = self.engine.heartbeat(h.epoch);
                let ack = HeartbeatAck {
                    epoch,
                    broker: self.me,
                    last,
                };
                r.reply.answer(r.request_id, ack.into(), r.permits);
            }
            Body::MetadataRequest(req) => {
                let mut m = self.metadata();
                if req.topics {
                    m.topics = self
                        .engine
                        .state()
                        .topics()
                        .map(|(t, _)| t.to_owned())
                        .collect();
                }
                r.reply.answer(r.request_id, m.into(), r.permits);
            }
            Body::ProduceRequest(_) => {
                self.metrics.produce_requests.inc();
                self.on_write_request(r);
            }
            Body::CommitCursorRequest(_)
            | Body::UserAdminRequest(_)
            | Body::AclAdminRequest(_)
            | Body::TopicAdminRequest(_)
            | Body::VoterChangeRequest(_) => self.on_write_request(r),
            Body::DescribeSecurityRequest(_) => {
                let tables = self.engine.state().security();
                let body = quire_proto::DescribeSecurityResponse {
                    authorization: self.cfg.auth.authorization,
                    users: tables
                        .users()
                        .map(|(user, c)| quire_proto::UserInfo {
                            user: user.to_owned(),
                            iterations: c.iterations,
                        })
                        .collect(),
                    acls: tables.acls().cloned().collect(),
                };
                r.reply.answer(r.request_id, body.into(), r.permits);
            }
            Body::HandoffRequest(_) => self.on_handoff_request(r),
            Body::TakeOverNowRequest(_) => self.on_take_over_now(r),
            Body::FetchRequest(_) => {
                self.metrics.fetch_requests.inc();
                self.on_fetch(r);
            }
            Body::CursorRequest(CursorRequest {
                ref topic,
                ref cursor,
            }) => {
                let body = match self.engine.read_cursor(topic, cursor) {
                    Some(offset) => CursorResponse { offset }.into(),
                    None => {
                        let (epoch, master) = self.master_hint();
                        ErrorResponse::not_master(epoch, master).into()
                    }
                };
                r.reply.answer(r.request_id, body, r.permits);
            }
            other => r.reply.answer(
                r.request_id,
                ErrorResponse::new(
                    ErrorCode::UnexpectedFrame,
                    format!("a broker does not serve {:?}", other.frame_type()),
                )
                .into(),
                r.permits,
            ),
        }
    }

    fn metadata(&self) -> MetadataResponse {
        let (epoch, master) = self.master_hint();
        let master_core = self.engine.master_core();
        let hwm = match self.engine.role() {
            RoleView::Master(core, _) => core.hwm(),
            RoleView::Follower(f) => f.hwm(),
            RoleView::TakingOver(_) => self.engine.state().applied(),
        };
        let stores = (0..self.store_count)
            .map(|i| {
                let slot = Self::slot_of(i);
                let identity = self.engine.cluster().expected_identity(slot);
                let (voter, persisted, answered, corrupt) = match master_core {
                    Some(core) => {
                        let status = core.slot_status(slot);
                        let answered = self.engine.store_answer(slot);
                        let voter = identity.is_some()
                            && answered.is_none_or(|(id, v)| v && Some(id) == identity);
                        let corrupt = core.slot_corrupt(slot).iter().min().copied();
                        (voter, status.and_then(|s| s.matched), answered, corrupt)
                    }
                    None => (identity.is_some(), None, None, None),
                };
                let shown = identity.or(answered.map(|(id, _)| id)).unwrap_or_default();
                let (lag_bytes, catch_up_rate, catch_up_ms) =
                    self.store_catch_up(i, EXACT_EVENTS_MAX);
                StoreInfo {
                    store_id: shown.store_id,
                    incarnation: shown.incarnation,
                    addr: self.cfg.stores[i].clone(),
                    voter,
                    persisted,
                    connected: self.engine.slot_up(slot),
                    corrupt,
                    lag_bytes,
                    catch_up_rate,
                    catch_up_ms,
                }
            })
            .collect();
        MetadataResponse {
            topics: Vec::new(),
            epoch,
            hwm,
            master,
            brokers: self
                .cfg
                .brokers
                .iter()
                .map(|(id, addr)| BrokerInfo {
                    id: *id,
                    addr: addr.clone(),
                })
                .collect(),
            stores,
            applied: self.engine.state().applied(),
            kafka: self.kafka_advertised.clone(),
            ack_quorum: u16::try_from(self.engine.cluster().ack_quorum).unwrap_or(u16::MAX),
            change_pending: master_core.and_then(MasterCore::pending_config),
        }
    }

    fn on_inbound_append(&mut self, r: Request) {
        let Request {
            request_id,
            body: Body::AppendRequest(req),
            reply,
            permits,
            ..
        } = r
        else {
            return;
        };
        let now = self.now_ms();
        let answer = self.engine.inbound_append(AppendId(request_id.0), req, now);
        self.run_commands();
        match answer {
            InboundAnswer::Has { epoch, last } => reply.answer(
                request_id,
                HeartbeatAck {
                    epoch,
                    broker: self.me,
                    last,
                }
                .into(),
                permits,
            ),
            InboundAnswer::Rejected(rejected) => {
                reply.answer(request_id, rejected.into(), permits);
            }
            InboundAnswer::NotFollowing => {
                let (epoch, master) = self.master_hint();
                reply.answer(
                    request_id,
                    ErrorResponse::not_master(epoch, master).into(),
                    permits,
                );
            }
        }
    }

    // ------------------------------------------------------------------ internal messages

    fn on_internal(&mut self, m: Internal) {
        let now = self.now_ms();
        match m {
            Internal::SlotUp { slot } => self.engine.link(slot, true, now),
            Internal::SlotDown { slot } => self.engine.link(slot, false, now),
            Internal::AppendAnswer {
                slot,
                meta,
                outcome,
            } => {
                if let Ok(Frame {
                    body:
                        Body::PersistedAck(quire_proto::PersistedAck {
                            corrupt: Some(offset),
                            ..
                        }),
                    ..
                }) = &outcome
                {
                    self.engine.ack_names_corrupt(slot, *offset, now);
                }
                let answer = match outcome {
                    Ok(Frame { body, .. }) => match body {
                        Body::PersistedAck(a) => Some(SlotAnswer::Persisted {
                            epoch: a.epoch,
                            through: a.through_offset,
                            identity: StoreIdentity {
                                store_id: a.store_id,
                                incarnation: a.incarnation,
                            },
                            voter: a.voter,
                        }),
                        Body::HeartbeatAck(h) => Some(SlotAnswer::SlaveHas { epoch: h.epoch }),
                        Body::AppendRejected(r) => Some(SlotAnswer::Rejected(r)),
                        Body::ErrorResponse(e) => {
                            tracing::warn!(%slot, code = %e.code, message = %e.message, "append answered with an error");
                            None
                        }
                        other => {
                            tracing::warn!(%slot, frame = ?other.frame_type(), "unexpected answer to an append");
                            None
                        }
                    },
                    Err(e) => {
                        tracing::debug!(%slot, error = %e, "append failed");
                        None
                    }
                };
                if let Some(answer) = answer {
                    self.engine.append_answer(
                        slot,
                        meta.append,
                        meta.epoch,
                        meta.through,
                        answer,
                        now,
                    );
                }
            }
            Internal::FenceAnswer {
                slot,
                epoch,
                outcome,
            } => {
                let answer = match outcome {
                    Ok(FenceOutcome::Granted(g)) => Some(FenceAnswer::Granted(g)),
                    Ok(FenceOutcome::Refused(r)) => Some(FenceAnswer::Refused {
                        promised: r.promised,
                    }),
                    Ok(FenceOutcome::NotVoter {
                        store_id,
                        incarnation,
                    }) => {
                        tracing::warn!(%slot, store_id = store_id.0, incarnation = incarnation.0, "store answered the fence: not a voter");
                        Some(FenceAnswer::NotVoter)
                    }
                    Err(e) if e.code() == Some(quire_proto::ErrorCode::Unauthorized) => {
                        // This broker's certificate does not let it fence: no takeover can
                        // succeed until it does. Loud, once per attempt (at most one fence
                        // per store per election timeout).
                        tracing::error!(%slot, error = %e, "the store refused this broker's fence: its certificate must name the broker role (quire:role:broker in its subject alternative names)");
                        None
                    }
                    Err(e) => {
                        if let Some(offset) = e.corrupt_offset() {
                            // The store knows a damaged record and does not vote: repaired
                            // once this broker is master.
                            self.engine.read_corrupt(slot, offset, now);
                        }
                        tracing::debug!(%slot, error = %e, "fence failed");
                        None
                    }
                };
                if let Some(answer) = answer {
                    self.engine.fence_answer(slot, epoch, answer, now);
                }
            }
            Internal::Fetched {
                slot,
                epoch,
                outcome,
            } => match outcome {
                Ok(read) => {
                    self.engine.takeover_read(slot, epoch, Ok(read.events), now);
                }
                Err(ClientError::Trimmed { first_offset, .. }) => {
                    self.engine
                        .takeover_read_trimmed(slot, epoch, first_offset, now);
                }
                Err(e) => {
                    tracing::warn!(%slot, error = %e, "takeover fetch failed");
                    self.engine.takeover_read(slot, epoch, Err(()), now);
                }
            },
            Internal::ReadTrimmed { cmd, first_offset } => {
                self.engine.read_trimmed(&cmd, first_offset, now);
            }
            Internal::RepairDone {
                slot,
                offset,
                outcome,
            } => {
                self.metrics.repair(match &outcome {
                    Ok(r) if r.outcome.is_good() => "repaired",
                    Ok(_) => "not_applied",
                    Err(_) => "failed",
                });
                self.engine.repair_done(slot, offset, outcome, now);
            }
            Internal::StoreCorrupt { slot, offset } => {
                self.engine.read_corrupt(slot, offset, now);
            }
            Internal::StoreFetchCorrupt {
                token,
                slot,
                offset,
                req,
                waiter,
                replans,
            } => {
                self.engine.read_corrupt(slot, offset, now);
                if replans > self.store_count {
                    // Bounded: every store was tried (a fetch cannot loop on damage).
                    tracing::error!(%offset, topic = %req.topic, "a record is damaged on every store the master could read it from");
                    waiter.answer(
                        ErrorResponse::corrupt(
                            offset,
                            "damaged on every store that could serve it",
                        )
                        .into(),
                    );
                    return;
                }
                self.fetch_replans.insert(token, (replans, offset));
                self.held_fetches.insert(token, waiter);
                self.engine.fetch(token, req, now, now);
            }
            Internal::ReadForAppend {
                mut cmd,
                outcome,
                corrupt,
            } => {
                if let Some((slot, offset)) = corrupt {
                    self.engine.read_corrupt(slot, offset, now);
                }
                self.on_read_for_append(&mut cmd, outcome);
            }
            Internal::TailAnswer {
                slot,
                generation,
                outcome,
            } => {
                let answer = outcome
                    .map(|t| TailAnswer {
                        last: t.last,
                        voter: t.voter,
                    })
                    .map_err(|e| tracing::debug!(%slot, error = %e, "bootstrap probe: no tail"));
                self.engine.tail_answer(slot, generation, answer, now);
            }
            Internal::HandoffAnswer { to, epoch, outcome } => {
                self.on_handoff_answer(to, epoch, outcome);
            }
            Internal::EpochPersisted { counter, outcome } => {
                if let Err(e) = &outcome {
                    tracing::error!(error = %e, counter, "cannot make the epoch counter durable");
                }
                self.engine.epoch_persisted(counter, outcome.is_ok(), now);
            }
            Internal::IdentitiesPersisted {
                bootstrap_epoch,
                outcome,
            } => {
                if let Err(e) = &outcome {
                    tracing::error!(error = %e, "cannot write the cluster file with the store identities");
                }
                self.engine
                    .identities_persisted(bootstrap_epoch, outcome.is_ok(), now);
            }
        }
        self.run_commands();
    }

    // ------------------------------------------------------------------ tick

    fn on_tick(&mut self) {
        let now_ms = self.now_ms();
        self.engine.tick(now_ms);
        self.run_commands();
        self.sample_catch_up(now_ms);
        self.publish_status();
    }

    /// Samples the HWM and every store's acked end while master, for the catch-up rates
    /// ([`super::catch_up`]).
    fn sample_catch_up(&mut self, now_ms: u64) {
        match self.engine.role() {
            RoleView::Master(core, _) => {
                let acked_end = (0..self.store_count)
                    .map(|i| Self::acked_end(core, i))
                    .collect();
                let stable_end = core.hwm().map_or(0, |h| h.0 + 1);
                self.catch_up
                    .sample(core.epoch().0, now_ms, stable_end, acked_end);
            }
            _ => self.catch_up.clear(),
        }
    }

    /// One past the last offset store `i` acked to this master (`None`: nothing yet).
    fn acked_end(core: &crate::core::master::MasterCore, i: usize) -> Option<u64> {
        core.slot_status(Self::slot_of(i))
            .and_then(|s| s.matched)
            .map(|o| o.0 + 1)
    }

    /// Store `i`'s catch-up figures, all `None` unless master or while the store has acked
    /// nothing to it: the bytes it lacks below the HWM (the events this master holds summed
    /// exactly, up to `exact_events_max` of them, the rest at their mean size), its ack
    /// rate in offsets/s, and the estimated ms until it holds the HWM. The lag is read now;
    /// only the rates come from the samples.
    fn store_catch_up(
        &self,
        i: usize,
        exact_events_max: usize,
    ) -> (Option<u64>, Option<u64>, Option<u64>) {
        let Some(core) = self.engine.master_core() else {
            return (None, None, None);
        };
        let Some(acked) = Self::acked_end(core, i) else {
            return (None, None, None);
        };
        let stable_end = core.hwm().map_or(0, |h| h.0 + 1);
        let lag = stable_end.saturating_sub(acked);
        let lag_bytes = core.bytes_between(Offset(acked), Offset(stable_end), exact_events_max);
        let rates = self.catch_up.rates(i);
        (
            lag_bytes,
            rates.map(|(rate, _)| rate),
            super::catch_up::estimate(lag, rates),
        )
    }

    fn publish_status(&self) {
        let state = self.engine.state();
        let (is_master, epoch, hwm, lags) = match self.engine.role() {
            RoleView::Master(core, _) => {
                let end = core.next_offset().0;
                let lags = (0..self.store_count)
                    .map(|i| {
                        let matched = core.slot_status(Self::slot_of(i)).and_then(|s| s.matched);
                        Some(end - matched.map_or(0, |o| o.0 + 1))
                    })
                    .collect();
                (true, core.epoch(), core.hwm(), lags)
            }
            RoleView::Follower(f) => (
                false,
                f.master_epoch().max(self.engine.highest_epoch_seen()),
                f.hwm(),
                vec![None; self.store_count],
            ),
            RoleView::TakingOver(_) => (
                false,
                self.engine.highest_epoch_seen(),
                state.applied(),
                vec![None; self.store_count],
            ),
        };
        self.metrics.set_readiness(self.readiness());
        self.metrics.set_status(StatusSnapshot {
            is_master,
            epoch: epoch.0,
            hwm: hwm.map(|h| h.0),
            applied: state.applied().map(|a| a.0),
            trim_point: state.trim_point().0,
            last_checkpoint: state.last_checkpoint().map(|c| c.0),
            ack_quorum: self.engine.cluster().ack_quorum as u64,
            stores: self
                .cfg
                .stores
                .iter()
                .zip(lags)
                .enumerate()
                .map(|(i, (addr, lag))| {
                    let (lag_bytes, _, catch_up_ms) = self.store_catch_up(i, EXACT_EVENTS_MAX);
                    StoreProgress {
                        addr: addr.clone(),
                        lag,
                        lag_bytes,
                        catch_up_ms,
                        voter: self
                            .engine
                            .cluster()
                            .expected_identity(Self::slot_of(i))
                            .is_some(),
                    }
                })
                .collect(),
        });
    }

    /// Whether this broker should get client traffic ([`Engine::readiness`]).
    fn readiness(&self) -> Readiness {
        self.engine.readiness(self.now_ms())
    }

    // ------------------------------------------------------------------ engine commands

    /// Carries out the commands the engine queued, until it queues no more.
    fn run_commands(&mut self) {
        loop {
            let commands = self.engine.take_commands();
            if commands.is_empty() {
                break;
            }
            let mut encoded: Vec<(AppendKey, Arc<quire_proto::EncodedBody>)> = Vec::new();
            for c in commands {
                self.run_command(c, &mut encoded);
            }
        }
        if self.engine.master_epoch().is_none() {
            self.proposed_at.clear();
        }
        self.publish_security();
    }

    /// Shows the connections the state's users and ACL entries if they changed (an
    /// applied user or ACL event, or a state rebuilt from a checkpoint).
    fn publish_security(&mut self) {
        let tables = self.engine.state().security();
        if Arc::ptr_eq(tables, &self.published_security) {
            return;
        }
        self.published_security = tables.clone();
        match self.security.write() {
            Ok(mut t) => *t = tables.clone(),
            Err(poisoned) => *poisoned.into_inner() = tables.clone(),
        }
    }

    fn run_command(
        &mut self,
        c: Command,
        encoded: &mut Vec<(AppendKey, Arc<quire_proto::EncodedBody>)>,
    ) {
        match c {
            Command::PersistEpochCounter { counter } => {
                let dir = self.cfg.data_dir.clone();
                let tx = self.internal_tx.clone();
                tokio::spawn(async move {
                    let outcome = tokio::task::spawn_blocking(move || {
                        durable::store_epoch_counter(&dir, counter)
                    })
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()));
                    let _ = tx.send(Internal::EpochPersisted { counter, outcome }).await;
                });
            }
            Command::PersistIdentities {
                identities,
                bootstrap_epoch,
            } => {
                self.cluster_file.set_identities(&identities);
                let file = self.cluster_file.clone();
                let dir = self.cfg.data_dir.clone();
                let tx = self.internal_tx.clone();
                tokio::spawn(async move {
                    let outcome =
                        tokio::task::spawn_blocking(move || durable::store_cluster(&dir, &file))
                            .await
                            .map_err(|e| e.to_string())
                            .and_then(|r| r.map_err(|e| e.to_string()));
                    let _ = tx
                        .send(Internal::IdentitiesPersisted {
                            bootstrap_epoch,
                            outcome,
                        })
                        .await;
                });
            }
            Command::ReadTail { slot, generation } => {
                let client = self.slots[slot.index()].client();
                let tx = self.internal_tx.clone();
                tokio::spawn(async move {
                    let outcome = match client {
                        Some(c) => c.tail().await,
                        None => Err(not_connected()),
                    };
                    let _ = tx
                        .send(Internal::TailAnswer {
                            slot,
                            generation,
                            outcome,
                        })
                        .await;
                });
            }
            Command::SendFence {
                slot,
                epoch,
                expected,
            } => {
                let expected = expected.map(|id| (id.store_id, id.incarnation));
                let client = self.slots[slot.index()].client();
                let tx = self.internal_tx.clone();
                tokio::spawn(async move {
                    let outcome = match client {
                        Some(c) => c.fence(epoch, expected).await,
                        None => Err(not_connected()),
                    };
                    let _ = tx
                        .send(Internal::FenceAnswer {
                            slot,
                            epoch,
                            outcome,
                        })
                        .await;
                });
            }
            Command::ReadForTakeover(read) => {
                let TakeoverRead { slot, epoch, .. } = read;
                let client = self.slots[slot.index()].client();
                let tx = self.internal_tx.clone();
                let count = u32::try_from(read.count()).unwrap_or(u32::MAX);
                tokio::spawn(async move {
                    let outcome = match client {
                        Some(c) => c.read(read.from, count, READ_BYTES_MAX).await,
                        None => Err(not_connected()),
                    };
                    let _ = tx
                        .send(Internal::Fetched {
                            slot,
                            epoch,
                            outcome,
                        })
                        .await;
                });
            }
            Command::Append(cmd) => match &cmd.events {
                AppendEvents::InMemory(events) => {
                    self.send_append(&cmd, Cow::Borrowed(events), encoded);
                }
                AppendEvents::FromStore { source } => self.read_for_append(cmd.clone(), *source),
            },
            Command::Applied { events, .. } => {
                for e in &events {
                    if e.kind == EventKind::Message {
                        self.message_event_bytes_max
                            .fetch_max(e.payload.len(), Ordering::Relaxed);
                    }
                }
            }
            Command::FetchAnswer { token, reply } => self.answer_fetch(token, reply),
            Command::FetchFromStore { token, read } => self.fetch_from_store(token, read),
            Command::RepairRecord {
                slot,
                offset,
                source,
            } => self.repair_record(slot, offset, source),
            Command::Write(w) => self.execute_write(w),
            Command::TakingOver { .. } | Command::Abandoned { .. } => {}
            Command::BecameMaster { .. } => {}
            Command::Serving { failover_ms, .. } => {
                self.metrics.failovers.inc();
                self.metrics
                    .failover_duration
                    .observe(Duration::from_millis(failover_ms).as_secs_f64());
            }
            Command::AskTakeOver { to, epoch, hwm } => self.ask_take_over(to, epoch, hwm),
            Command::HandoffDone { token, outcome } => self.handoff_done(token, outcome),
            Command::LeftMaster { .. } => {
                self.metrics.step_downs.inc();
            }
        }
    }

    /// Sends what deferred proposals are due.
    fn flush(&mut self) {
        let now = self.now_ms();
        self.engine.flush(now);
        self.run_commands();
    }

    /// Carries out one write-path command.
    fn execute_write(&mut self, c: WriteCommand) {
        let now = Instant::now();
        match c {
            WriteCommand::Proposed { last } => {
                self.proposed_at.insert(last, now);
            }
            WriteCommand::Stabilized {
                last,
                kind,
                count,
                waiters,
            } => {
                if let Some(t) = self.proposed_at.remove(&last) {
                    self.metrics
                        .quorum_wait
                        .observe(now.duration_since(t).as_secs_f64());
                }
                if kind == WriteKind::Produce {
                    self.metrics
                        .produce_messages_acked
                        .inc_by(count * waiters as u64);
                }
            }
            WriteCommand::Answer {
                token,
                kind,
                reply,
                error_label,
            } => {
                let Some(h) = self.held_writes.remove(&token) else {
                    return;
                };
                if let Some(label) = error_label {
                    self.metrics.produce_error(label);
                }
                let body: Body = match reply {
                    Reply::Produced { base_offset, count } => {
                        if kind == WriteKind::Produce {
                            self.metrics
                                .produce_latency
                                .observe(now.duration_since(h.received).as_secs_f64());
                        }
                        ProduceResponse { base_offset, count }.into()
                    }
                    Reply::CursorCommitted => CommitCursorResponse.into(),
                    Reply::SecurityChanged | Reply::TopicChanged | Reply::VotersChanged => {
                        quire_proto::AdminResponse.into()
                    }
                    Reply::NotMaster => {
                        let (epoch, master) = self.master_hint();
                        ErrorResponse::not_master(epoch, master).into()
                    }
                    Reply::Error(e) => e.into(),
                };
                h.reply.answer(h.request_id, body, h.permits);
            }
        }
    }

    // ------------------------------------------------------------------ produce

    fn on_write_request(&mut self, r: Request) {
        if self.engine.master_epoch().is_none() {
            if matches!(r.body, Body::ProduceRequest(_)) {
                self.metrics.produce_error("not_master");
            }
            self.not_master(&r.reply, r.request_id);
            return;
        }
        let voter_change = match &r.body {
            Body::VoterChangeRequest(c) => Some(*c),
            _ => None,
        };
        let request = match r.body {
            Body::ProduceRequest(p) => WriteRequest::Produce(p),
            Body::CommitCursorRequest(c) => WriteRequest::CommitCursor(c),
            Body::UserAdminRequest(u) => WriteRequest::Security(SecurityChange::User(u.0)),
            Body::AclAdminRequest(a) => WriteRequest::Security(SecurityChange::Acl(a.0)),
            Body::TopicAdminRequest(t) => WriteRequest::TopicAdmin(t),
            Body::VoterChangeRequest(_) => WriteRequest::Voters(Vec::new()),
            _ => return,
        };
        let token = RequestToken(self.next_token);
        self.next_token += 1;
        let received_ms = self.ms_at(r.received);
        self.held_writes.insert(
            token,
            HeldWrite {
                request_id: r.request_id,
                reply: r.reply,
                permits: r.permits,
                received: r.received,
            },
        );
        let now = self.now_ms();
        match voter_change {
            Some(change) => self.engine.change_voters(token, change, received_ms, now),
            None => self.engine.write(token, request, received_ms, now),
        };
        self.run_commands();
    }

    /// Encodes an append (once for every slot it goes to unchanged) and queues it.
    fn send_append(
        &mut self,
        cmd: &AppendCommand,
        events: Cow<'_, [Event]>,
        cache: &mut Vec<(AppendKey, Arc<quire_proto::EncodedBody>)>,
    ) {
        if !self.engine.slot_up(cmd.slot) {
            return;
        }
        let key = AppendKey {
            epoch: cmd.epoch,
            prev: cmd.prev,
            first: cmd.first,
            count: cmd.count,
            hwm: cmd.hwm,
        };
        let body = if let Some((_, b)) = cache.iter().find(|(k, _)| *k == key) {
            b.clone()
        } else {
            let req = AppendRequest {
                epoch: cmd.epoch,
                prev: cmd.prev,
                events: events.into_owned(),
                hwm: cmd.hwm,
            };
            let mut scratch = BytesMut::new();
            match encode_body(&req.into(), &mut scratch) {
                Ok(b) => {
                    let b = Arc::new(b);
                    if cache.len() >= APPEND_ENCODE_CACHE_MAX {
                        cache.remove(0);
                    }
                    cache.push((key, b.clone()));
                    b
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode an append");
                    return;
                }
            }
        };
        let send = SlotSend {
            meta: AppendMeta::of(cmd),
            body,
        };
        if self.slots[cmd.slot.index()].tx.try_send(send).is_err() {
            tracing::debug!(slot = %cmd.slot, "slot queue full: the append is resent after its timeout");
        }
    }

    /// Sends the append `cmd` with the events read for it, if this broker is still master
    /// of its epoch; a failed read lets the append time out and be resent.
    fn on_read_for_append(
        &mut self,
        cmd: &mut AppendCommand,
        outcome: Result<Vec<quire_proto::Event>, String>,
    ) {
        match outcome {
            Ok(events) => {
                if self.engine.master_epoch() == Some(cmd.epoch) {
                    // The read may have stopped at its byte bound (or at a damaged record):
                    // the append, and the `through` its ack will be counted at, cover what
                    // was read.
                    cmd.count = events.len() as u64;
                    self.send_append(cmd, Cow::Owned(events), &mut Vec::new());
                }
            }
            Err(e) => {
                tracing::debug!(slot = %cmd.slot, error = %e, "read for a lagging slot failed; the append times out and is resent");
            }
        }
    }

    fn read_for_append(&mut self, cmd: AppendCommand, source: SlotId) {
        let Some(client) = self.slots[source.index()].client() else {
            return;
        };
        let tx = self.internal_tx.clone();
        tokio::spawn(async move {
            let want = u32::try_from(cmd.count).unwrap_or(u32::MAX);
            let mut events: Vec<quire_proto::Event> = Vec::new();
            let mut bytes = 0u32;
            let mut next = cmd.first;
            let mut corrupt = None;
            let outcome = loop {
                // Stop at the count, or once the bytes bound is reached: the append then
                // carries fewer events than the core planned, the store acks what it got,
                // and the core's next append there is refused as a log mismatch and resent
                // from the store's end (a break-it trial: 1,024 one-megabyte events made
                // an append no frame could hold, dropped and retried forever while each
                // retry's read held up to 1 GB).
                if events.len() as u64 >= cmd.count || bytes >= CATCH_UP_APPEND_BYTES_MAX {
                    break Ok(events);
                }
                let left = want - u32::try_from(events.len()).unwrap_or(u32::MAX);
                let bytes_left = CATCH_UP_APPEND_BYTES_MAX - bytes;
                match client.read(next, left, bytes_left).await {
                    Ok(r) if r.events.first().is_some_and(|e| e.offset == next) => {
                        next = Offset(next.0 + r.events.len() as u64);
                        let read: usize = r.events.iter().map(|e| e.payload.len()).sum();
                        bytes = bytes.saturating_add(u32::try_from(read).unwrap_or(u32::MAX));
                        events.extend(r.events);
                    }
                    Ok(_) => break Err(format!("the store does not hold offset {next}")),
                    Err(ClientError::Trimmed { first_offset, .. }) => {
                        let _ = tx.send(Internal::ReadTrimmed { cmd, first_offset }).await;
                        return;
                    }
                    Err(e) => {
                        // A damaged record: what was read before it goes out, and the
                        // master reads the rest from another store.
                        if let Some(offset) = e.corrupt_offset() {
                            corrupt = Some((source, offset));
                            if !events.is_empty() {
                                break Ok(events);
                            }
                        }
                        break Err(e.to_string());
                    }
                }
            };
            let outcome = outcome.map(|mut evs| {
                evs.truncate(usize::try_from(cmd.count).unwrap_or(usize::MAX));
                evs
            });
            let _ = tx
                .send(Internal::ReadForAppend {
                    cmd,
                    outcome,
                    corrupt,
                })
                .await;
        });
    }

    /// Repairs store `slot`'s damaged record at `offset` with a copy read from `source`
    /// ([`Command::RepairRecord`]); the outcome goes back to the engine.
    fn repair_record(&mut self, slot: SlotId, offset: Offset, source: SlotId) {
        let target = self.slots[slot.index()].client();
        let from = self.slots[source.index()].client();
        let tx = self.internal_tx.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let mut source_corrupt = None;
            let outcome = match (target, from) {
                // One record: the repair reads the damaged record's copy and nothing else.
                (Some(target), Some(from)) => match from.read(offset, 1, READ_BYTES_MAX).await {
                    Ok(r) => match r.events.into_iter().next().filter(|e| e.offset == offset) {
                        Some(good) => {
                            metrics
                                .store_repair_read_bytes
                                .inc_by(good.payload.len() as u64);
                            target.repair(good).await.map_err(|e| e.to_string())
                        }
                        None => Err(format!("the source does not hold offset {offset}")),
                    },
                    Err(e) => {
                        // The source's copy may be damaged too: noted, another is tried.
                        source_corrupt = e.corrupt_offset();
                        Err(format!("reading the good copy from {source}: {e}"))
                    }
                },
                _ => Err("a store is not connected".to_owned()),
            };
            if let Some(o) = source_corrupt {
                let _ = tx
                    .send(Internal::StoreCorrupt {
                        slot: source,
                        offset: o,
                    })
                    .await;
            }
            let _ = tx
                .send(Internal::RepairDone {
                    slot,
                    offset,
                    outcome,
                })
                .await;
        });
    }

    // ------------------------------------------------------------------ fetch

    fn on_fetch(&mut self, r: Request) {
        let Body::FetchRequest(req) = r.body else {
            return;
        };
        let token = RequestToken(self.next_token);
        self.next_token += 1;
        self.held_fetches.insert(
            token,
            Waiter {
                request_id: r.request_id,
                reply: r.reply,
                permits: r.permits,
            },
        );
        let received_ms = self.ms_at(r.received);
        let now = self.now_ms();
        self.engine.fetch(token, req, received_ms, now);
        self.run_commands();
    }

    /// Answers the fetch `token` ([`Command::FetchAnswer`]).
    fn answer_fetch(&mut self, token: RequestToken, reply: FetchReply) {
        let Some(waiter) = self.held_fetches.remove(&token) else {
            return;
        };
        let replanned = self.fetch_replans.remove(&token);
        let body: Body = match reply {
            FetchReply::Messages(m) => m.into(),
            FetchReply::Trimmed { from, first } => ErrorResponse::trimmed(from, first).into(),
            FetchReply::NotMaster => {
                let (epoch, master) = self.master_hint();
                ErrorResponse::not_master(epoch, master).into()
            }
            FetchReply::Unavailable => match replanned {
                // Planned again after `Corrupt` answers, and no store is left to read.
                Some((_, offset)) => {
                    tracing::error!(%offset, "a record is damaged on every store the master could read it from");
                    ErrorResponse::corrupt(offset, "damaged on every store that could serve it")
                        .into()
                }
                None => ErrorResponse::new(ErrorCode::Internal, STORE_UNAVAILABLE).into(),
            },
        };
        waiter.answer(body);
    }

    /// Serves a fetch of offsets older than the in-memory window by reading a voting store
    /// that holds them.
    fn fetch_from_store(&mut self, token: RequestToken, read: StoreFetch) {
        let Some(client) = self.slots[read.source.index()].client() else {
            self.answer_fetch(token, FetchReply::Unavailable);
            return;
        };
        let Some(waiter) = self.held_fetches.remove(&token) else {
            return;
        };
        let replans = self.fetch_replans.remove(&token).map_or(0, |(n, _)| n);
        self.metrics.fetches_from_store.inc();
        let tx = self.internal_tx.clone();
        tokio::spawn(async move {
            let (first, span) = read.read_span();
            let outcome = client.read(first, span, READ_BYTES_MAX).await;
            if let Some(offset) = outcome.as_ref().err().and_then(ClientError::corrupt_offset) {
                // This store's copy is damaged: planned again, the fetch goes to another
                // store (the engine now passes this one over for that range).
                let _ = tx
                    .send(Internal::StoreFetchCorrupt {
                        token,
                        slot: read.source,
                        offset,
                        req: read.req,
                        waiter,
                        replans: replans + 1,
                    })
                    .await;
                return;
            }
            let body: Body = match outcome {
                Ok(r) => match read.answer(r.first_offset, &r.events) {
                    FetchReply::Messages(m) => m.into(),
                    FetchReply::Trimmed { from, first } => {
                        ErrorResponse::trimmed(from, first).into()
                    }
                    // Not returned for a store read; answered as the engine's Unavailable.
                    FetchReply::NotMaster | FetchReply::Unavailable => {
                        ErrorResponse::new(ErrorCode::Internal, STORE_UNAVAILABLE).into()
                    }
                },
                Err(e) => ErrorResponse::new(
                    ErrorCode::Internal,
                    format!("reading a store failed: {e}; retry"),
                )
                .into(),
            };
            waiter.answer(body);
        });
    }
}

/// The message of a fetch no store can serve now.
const STORE_UNAVAILABLE: &str = "no store can serve this range now; retry";

/// The error a command gets when its slot has no connection.
fn not_connected() -> ClientError {
    ClientError::Closed {
        addr: String::new(),
        reason: "not connected".into(),
    }
}

/// How long a takeover may go without progress before it is dropped: twice the election
/// timeout, at least 1 s.
fn takeover_budget(cfg: &BrokerConfig) -> Duration {
    cfg.election_timeout.max(Duration::from_millis(500)) * 2
}

/// Distinct appends whose encoding one dispatch keeps for the other slots.
const APPEND_ENCODE_CACHE_MAX: usize = 32;

/// What identifies an append's bytes apart from the request id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AppendKey {
    epoch: Epoch,
    prev: Option<LogPosition>,
    first: Offset,
    count: u64,
    hwm: Option<Offset>,
}
