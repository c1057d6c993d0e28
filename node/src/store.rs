//! The store actor: the one task that decides appends, fences and heartbeats for the
//! store, in one order across all connections, and owns the order of WAL submissions.
//!
//! Connections send [`Command`]s through a bounded channel ([`STORE_QUEUE_MAX`]). For each
//! command the actor consults the pure rules ([`crate::replica::Replica`]) against the WAL's
//! accepted log, carries the decision out — a durable promise first (on the blocking pool),
//! then `Wal::append`, which returns at once with a future — and keeps the WAL's futures in
//! submission order. The WAL resolves them in that order, each after the fdatasync that
//! covers it (group commit: one fsync covers many appends).
//!
//! Answers that wait for durability are **waiters**, each tagged with the sequence number
//! of the latest WAL submission at the time it was created: an accepted append waits for
//! its own submission; an append whose events were all present already, and a granted
//! fence, wait for the latest submission (so everything accepted before them is durable).
//! When submission `s` resolves `Ok`, every waiter tagged `<= s` is answered. When it
//! resolves with an error, the log has failed (fail-stop): those appends are answered
//! `LogFailed`, and a fence is granted with the last *durable* entry.
//!
//! Answers go out through each connection's [`Reply`], which never blocks the actor.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use quire_proto::{
    AppendRejected, AppendRequest, Body, BrokerId, Epoch, ErrorCode, ErrorResponse, EventBody,
    EventKind, FenceGranted, FenceRefused, FenceRequest, Heartbeat, HeartbeatAck, LogPosition,
    Offset, PersistedAck, RejectReason, TailCut, TailResponse,
};
use quire_wal::format::{record_bytes, HEADER_BYTES};
use quire_wal::{Append, PromisedEpoch, Record, Wal, WalError};
use tokio::sync::mpsc;

use crate::conn::Reply;
use crate::identity::{Identity, Role};
use crate::metrics::Metrics;
use crate::replica::{AcceptPlan, AppendDecision, FenceDecision, Replica};

/// Commands queued for the store actor at most; connections wait (and stop reading)
/// beyond it.
pub const STORE_QUEUE_MAX: usize = 8192;

/// Trim events remembered at most while they wait to be stabilized; beyond it the oldest
/// is forgotten (a later trim point supersedes it: the master's trim points only grow).
pub const PENDING_TRIMS_MAX: usize = 64;

/// A request for the store actor, with where to answer it.
#[derive(Debug)]
pub(crate) enum Command {
    Append(AppendRequest, Reply),
    Fence(FenceRequest, Reply),
    Heartbeat(Heartbeat, Reply),
    Tail(Reply),
}

impl Command {
    pub(crate) fn into_reply(self) -> Reply {
        match self {
            Command::Append(_, r)
            | Command::Fence(_, r)
            | Command::Heartbeat(_, r)
            | Command::Tail(r) => r,
        }
    }
}

/// The sending end of the actor's queue.
#[derive(Clone, Debug)]
pub(crate) struct StoreHandle {
    tx: mpsc::Sender<Command>,
}

impl StoreHandle {
    /// Queues `command` (waits while the queue is full).
    ///
    /// # Errors
    /// The command back if the actor has stopped.
    pub(crate) async fn send(&self, command: Command) -> Result<(), Command> {
        self.tx.send(command).await.map_err(|e| e.0)
    }
}

/// One WAL submission on its way to durability.
#[derive(Debug)]
struct Submission {
    seq: u64,
    state: SubmissionState,
}

#[derive(Debug)]
enum SubmissionState {
    Pending(Append),
    Done(Option<Result<Offset, WalError>>),
}

/// An answer that waits until submission `needed` resolves.
#[derive(Debug)]
enum Waiter {
    Persisted {
        needed: u64,
        reply: Reply,
        epoch: Epoch,
        through: Option<Offset>,
        events: u64,
        payload_bytes: u64,
    },
    Fence {
        needed: u64,
        reply: Reply,
        epoch: Epoch,
        last: Option<LogPosition>,
        tail_cut: Option<TailCut>,
    },
}

impl Waiter {
    fn needed(&self) -> u64 {
        match self {
            Waiter::Persisted { needed, .. } | Waiter::Fence { needed, .. } => *needed,
        }
    }
}

/// The actor's state. See the module docs.
#[derive(Debug)]
pub(crate) struct Store {
    wal: Wal,
    data_dir: PathBuf,
    identity: Identity,
    /// `None` only while a promise is being written on the blocking pool.
    promised_file: Option<PromisedEpoch>,
    replica: Replica,
    submissions: VecDeque<Submission>,
    waiters: VecDeque<Waiter>,
    /// Sequence number of the latest WAL submission (0: none yet).
    last_seq: u64,
    metrics: Arc<Metrics>,
    /// Retention bookkeeping; see [`Retention`].
    retention: Retention,
    /// The tail-cut mark (`crate::tail_cut`), reported in every grant until it is cleared.
    tail_cut: Option<TailCut>,
    /// Retention trims running on the blocking pool: each holds a handle to the WAL (and
    /// with it the data directory's lock), so the actor waits for them before it ends.
    trims: Vec<tokio::task::JoinHandle<()>>,
}

/// Retention on a store: Trim events seen in accepted appends wait here until they are
/// stabilized, then the WAL deletes the whole segments below their trim point.
///
/// An entry of this store's log is known stabilized when it is at or below both the HWM
/// and the end of the last append accepted from a master of the same epoch (an accepted
/// append means this log matches that master's through its end; the HWM says the
/// master's log is stabilized through it). `stable` is the highest such offset seen; it
/// only grows, since a stabilized entry is never replaced.
#[derive(Debug, Default)]
struct Retention {
    /// `(epoch, through)` of the last accepted append.
    matched: Option<(Epoch, Offset)>,
    /// Highest offset known stabilized in this log.
    stable: Option<Offset>,
    /// `(offset of the Trim event, its epoch, before)`, in log order.
    pending: VecDeque<(Offset, Epoch, Offset)>,
    /// The highest trim point handed to the WAL.
    requested: Offset,
}

impl Retention {
    /// Learns the HWM `hwm` of a master of `epoch`; returns whether `stable` rose.
    fn learn(&mut self, epoch: Epoch, hwm: Option<Offset>) -> bool {
        let (Some(h), Some((m_epoch, through))) = (hwm, self.matched) else {
            return false;
        };
        if m_epoch != epoch {
            return false;
        }
        let safe = h.min(through);
        if self.stable.is_some_and(|s| s >= safe) {
            return false;
        }
        self.stable = Some(safe);
        true
    }

    /// Remembers the Trim events among `events` (bodies that do not decode are logged and
    /// ignored: they delete nothing).
    fn note(&mut self, events: &[quire_proto::Event]) {
        for e in events.iter().filter(|e| e.kind == EventKind::Trim) {
            match EventBody::decode(EventKind::Trim, &e.payload) {
                Ok(EventBody::Trim(t)) => {
                    if self.pending.len() == PENDING_TRIMS_MAX {
                        self.pending.pop_front();
                    }
                    self.pending.push_back((e.offset, e.epoch, t.before));
                }
                Ok(_) | Err(_) => {
                    tracing::warn!(offset = %e.offset, "a Trim event whose body does not decode");
                }
            }
        }
    }

    /// The trim point to hand to the WAL now, if any: the highest `before` of a pending
    /// Trim event that is stabilized and still in the log, capped at `stable`.
    fn due(&mut self, wal: &Wal) -> Option<Offset> {
        let stable = self.stable?;
        let mut best = None;
        while let Some(&(at, epoch, before)) = self.pending.front() {
            if at > stable {
                break;
            }
            self.pending.pop_front();
            // The event must still be the one at `at` (not replaced by a truncation).
            if wal.entry_epoch(at) == Some(epoch) || at < wal.first_offset() {
                best = best.max(Some(before.min(stable)));
            }
        }
        let point = best?;
        if point <= self.requested {
            return None;
        }
        self.requested = point;
        Some(point)
    }
}

impl Store {
    /// The actor for a store with this identity and promised epoch, and its handle.
    pub(crate) fn new(
        wal: Wal,
        data_dir: PathBuf,
        identity: Identity,
        promised_file: PromisedEpoch,
        tail_cut: Option<TailCut>,
        metrics: Arc<Metrics>,
    ) -> (Store, StoreHandle, mpsc::Receiver<Command>) {
        let replica = Replica::new(
            identity.store_id,
            identity.incarnation,
            identity.role,
            promised_file.epoch(),
        );
        metrics.promised_epoch.set(replica.promised().0);
        metrics.voter.set(i64::from(replica.role().is_voter()));
        metrics.tail_cut.set(i64::from(tail_cut.is_some()));
        let (tx, rx) = mpsc::channel(STORE_QUEUE_MAX);
        let store = Store {
            wal,
            data_dir,
            identity,
            promised_file: Some(promised_file),
            replica,
            submissions: VecDeque::new(),
            waiters: VecDeque::new(),
            last_seq: 0,
            metrics,
            retention: Retention::default(),
            tail_cut,
            trims: Vec::new(),
        };
        (store, StoreHandle { tx }, rx)
    }

    /// Runs until every handle is dropped, then waits for the submissions in flight and
    /// answers their waiters.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        loop {
            tokio::select! {
                biased;
                (seq, result) = next_completion(&mut self.submissions), if !self.submissions.is_empty() => {
                    self.on_completions(seq, result);
                    self.clear_tail_cut().await;
                }
                command = rx.recv() => match command {
                    Some(c) => self.handle(c).await,
                    None => break,
                },
            }
        }
        while !self.submissions.is_empty() {
            let (seq, result) = next_completion(&mut self.submissions).await;
            self.on_completions(seq, result);
        }
        // A trim still running holds the WAL open: a restart in the same process (or a
        // shutdown that returns) must not find the directory locked.
        for t in std::mem::take(&mut self.trims) {
            let _ = t.await;
        }
    }

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Append(req, reply) => self.on_append(req, reply).await,
            Command::Fence(req, reply) => self.on_fence(req, reply).await,
            Command::Heartbeat(hb, reply) => {
                self.learn_hwm(hb.epoch, hb.hwm);
                self.retain(hb.epoch, hb.hwm);
                reply.send(HeartbeatAck {
                    epoch: self.replica.promised(),
                    broker: BrokerId(0),
                    last: self.wal.last(),
                });
            }
            Command::Tail(reply) => reply.send(TailResponse {
                last: self.wal.last_durable(),
                promised: self.replica.promised(),
                hwm: self.replica.hwm(),
                store_id: self.replica.store_id(),
                incarnation: self.replica.incarnation(),
                voter: self.replica.role().is_voter(),
                first_offset: self.wal.first_offset(),
            }),
        }
    }

    fn rejected(&self, reason: RejectReason) -> AppendRejected {
        self.metrics.reject_append(match reason {
            RejectReason::StaleEpoch => "stale_epoch",
            RejectReason::LogMismatch => "log_mismatch",
            RejectReason::LogFailed => "log_failed",
            RejectReason::Overloaded => "overloaded",
        });
        AppendRejected {
            reason,
            promised: self.replica.promised(),
            last: self.wal.last(),
        }
    }

    async fn on_append(&mut self, req: AppendRequest, reply: Reply) {
        if self.wal.is_failed() {
            reply.send(self.rejected(RejectReason::LogFailed));
            return;
        }
        let plan = match self.replica.decide_append(&req, &self.wal) {
            AppendDecision::Accept(plan) => plan,
            AppendDecision::Reject(reason) => {
                tracing::debug!(peer = %reply.peer(), epoch = %req.epoch, prev = ?req.prev, ?reason, "append rejected");
                reply.send(self.rejected(reason));
                return;
            }
            AppendDecision::Invalid(problem) => {
                tracing::warn!(peer = %reply.peer(), epoch = %req.epoch, %problem, "invalid append");
                self.metrics.reject_append("invalid");
                reply.send(ErrorResponse::new(ErrorCode::Malformed, problem));
                return;
            }
        };
        if let Some(epoch) = plan.promise {
            if let Err(e) = self.promise(epoch).await {
                tracing::error!(error = %e, %epoch, "cannot store the promised epoch");
                self.metrics.reject_append("internal");
                reply.send(ErrorResponse::new(
                    ErrorCode::Internal,
                    format!("cannot store the promised epoch: {e}"),
                ));
                return;
            }
        }
        if let Some(through) = plan.through {
            self.retention.matched = Some((req.epoch, through));
        }
        self.retention.note(&req.events);
        let (epoch, hwm) = (req.epoch, req.hwm);
        self.learn_hwm(epoch, hwm);
        self.submit(req, plan, reply);
        // After the submission, so a Trim event in this very append is in the log.
        self.retain(epoch, hwm);
    }

    /// The answer to an append the WAL refused at once with `e`.
    fn refusal(&self, e: &WalError) -> Body {
        match e {
            WalError::Failed { .. } => self.rejected(RejectReason::LogFailed).into(),
            WalError::TooLarge { what: "queue", .. } => {
                self.rejected(RejectReason::Overloaded).into()
            }
            WalError::Closed => {
                self.metrics.reject_append("internal");
                ErrorResponse::new(ErrorCode::ShuttingDown, "the store is shutting down").into()
            }
            WalError::TooLarge { .. } => {
                self.metrics.reject_append("invalid");
                ErrorResponse::new(ErrorCode::Malformed, e.to_string()).into()
            }
            _ => {
                tracing::error!(error = %e, "the WAL refused an accepted append");
                self.metrics.reject_append("internal");
                ErrorResponse::new(ErrorCode::Internal, e.to_string()).into()
            }
        }
    }

    fn submit(&mut self, req: AppendRequest, plan: AcceptPlan, reply: Reply) {
        let events = req.events.len() as u64;
        let payload_bytes: u64 = req.events.iter().map(|e| e.payload.len() as u64).sum();
        let epoch = req.epoch;
        let Some(from) = plan.write_from else {
            // Everything is present already: answer once the accepted log is durable.
            self.wait(Waiter::Persisted {
                needed: self.last_seq,
                reply,
                epoch,
                through: plan.through,
                events,
                payload_bytes,
            });
            return;
        };
        if plan.truncates {
            tracing::info!(
                epoch = %epoch,
                from = %req.events[from].offset,
                "truncating the log's suffix for a higher epoch"
            );
        }
        let records: Vec<Record> = req
            .events
            .into_iter()
            .skip(from)
            .map(|e| Record {
                epoch: e.epoch,
                offset: e.offset,
                kind: e.kind.as_u8(),
                payload: e.payload,
            })
            .collect();
        // One WAL append must fit in one segment; a catch-up append may be larger than a
        // small segment, so it is written as several consecutive WAL appends, answered
        // together once the last is durable.
        let chunks = split_for_segments(
            records,
            self.wal.segment_bytes(),
            self.wal.alignment_bytes(),
        );
        for chunk in chunks {
            let mut append = self.wal.append(epoch, chunk);
            // Validation errors resolve at once and change nothing (chunks before this one
            // are written; the master resends what it has no ack for).
            let state = match append.try_result() {
                None => SubmissionState::Pending(append),
                Some(Ok(last)) => SubmissionState::Done(Some(Ok(last))),
                Some(Err(e)) => {
                    let body = self.refusal(&e);
                    reply.send(body);
                    return;
                }
            };
            self.last_seq += 1;
            self.submissions.push_back(Submission {
                seq: self.last_seq,
                state,
            });
        }
        self.wait(Waiter::Persisted {
            needed: self.last_seq,
            reply,
            epoch,
            through: plan.through,
            events,
            payload_bytes,
        });
    }

    /// Queues `waiter`, or answers it now if nothing is in flight.
    fn wait(&mut self, waiter: Waiter) {
        debug_assert!(self
            .waiters
            .back()
            .is_none_or(|w| w.needed() <= waiter.needed()));
        if self.submissions.is_empty() {
            self.answer(waiter, true);
        } else {
            self.waiters.push_back(waiter);
        }
    }

    /// Submission `seq` resolved with `result`; so may the next ones already have.
    fn on_completions(&mut self, seq: u64, result: Result<Offset, WalError>) {
        let popped = self.submissions.pop_front();
        assert_eq!(
            popped.map(|s| s.seq),
            Some(seq),
            "invariant: submissions resolve in order"
        );
        let mut resolved = 1u64;
        self.on_completion(seq, &result);
        // Appends made durable by the same fsync resolve together: take them now.
        while let Some(front) = self.submissions.front_mut() {
            let r = match &mut front.state {
                SubmissionState::Pending(a) => a.try_result(),
                SubmissionState::Done(r) => r.take(),
            };
            let Some(r) = r else { break };
            let seq = front.seq;
            self.submissions.pop_front();
            resolved += 1;
            self.on_completion(seq, &r);
        }
        self.metrics.group_commit_appends.observe(resolved as f64);
    }

    fn on_completion(&mut self, seq: u64, result: &Result<Offset, WalError>) {
        if let Err(e) = result {
            tracing::error!(error = %e, "WAL append failed: the log is failed and takes no more appends");
        }
        while self.waiters.front().is_some_and(|w| w.needed() <= seq) {
            let w = self.waiters.pop_front().expect("invariant: front exists");
            self.answer(w, result.is_ok());
        }
    }

    /// Answers a waiter whose submission resolved (`durable`: `Ok`).
    fn answer(&mut self, waiter: Waiter, durable: bool) {
        match waiter {
            Waiter::Persisted {
                reply,
                epoch,
                through,
                events,
                payload_bytes,
                ..
            } => {
                if durable {
                    self.metrics.appends_persisted.inc();
                    self.metrics.append_events.inc_by(events);
                    self.metrics.append_bytes.inc_by(payload_bytes);
                    reply.send(PersistedAck {
                        epoch,
                        through_offset: through,
                        store_id: self.replica.store_id(),
                        incarnation: self.replica.incarnation(),
                        voter: self.replica.role().is_voter(),
                    });
                } else {
                    reply.send(self.rejected(RejectReason::LogFailed));
                }
            }
            Waiter::Fence {
                reply,
                epoch,
                last,
                tail_cut,
                ..
            } => {
                let last = if durable {
                    last
                } else {
                    self.wal.last_durable()
                };
                self.metrics.fence("granted");
                reply.send(FenceGranted {
                    epoch,
                    last,
                    store_id: self.replica.store_id(),
                    incarnation: self.replica.incarnation(),
                    tail_cut,
                });
            }
        }
    }

    async fn on_fence(&mut self, req: FenceRequest, reply: Reply) {
        match self.replica.decide_fence(&req) {
            FenceDecision::NotVoter => {
                self.metrics.fence("not_voter");
                reply.send(ErrorResponse::not_voter(
                    self.replica.store_id(),
                    self.replica.incarnation(),
                ));
            }
            FenceDecision::BecomeLearner => {
                tracing::warn!(
                    peer = %reply.peer(),
                    expected = ?req.expected,
                    store_id = self.replica.store_id().0,
                    incarnation = self.replica.incarnation().0,
                    "a broker expects another store identity at this address: becoming a learner for good"
                );
                if let Err(e) = self.become_learner().await {
                    tracing::error!(error = %e, "cannot record the learner role");
                    reply.send(ErrorResponse::new(
                        ErrorCode::Internal,
                        format!("cannot record the learner role: {e}"),
                    ));
                    return;
                }
                self.metrics.fence("not_voter");
                reply.send(ErrorResponse::not_voter(
                    self.replica.store_id(),
                    self.replica.incarnation(),
                ));
            }
            FenceDecision::Refuse => {
                self.metrics.fence("refused");
                reply.send(FenceRefused {
                    promised: self.replica.promised(),
                });
            }
            FenceDecision::Grant { promise } => {
                if let Some(epoch) = promise {
                    if let Err(e) = self.promise(epoch).await {
                        tracing::error!(error = %e, %epoch, "cannot store the promised epoch");
                        reply.send(ErrorResponse::new(
                            ErrorCode::Internal,
                            format!("cannot store the promised epoch: {e}"),
                        ));
                        return;
                    }
                    tracing::info!(%epoch, "fenced: appends below this epoch are refused from now on");
                }
                self.wait(Waiter::Fence {
                    needed: self.last_seq,
                    reply,
                    epoch: req.epoch,
                    last: self.wal.last(),
                    tail_cut: self.tail_cut,
                });
            }
        }
    }

    fn learn_hwm(&mut self, epoch: Epoch, hwm: Option<Offset>) {
        if self.replica.learn_hwm(epoch, hwm) {
            if let Some(h) = self.replica.hwm() {
                self.metrics.hwm.set(i64::try_from(h.0).unwrap_or(i64::MAX));
            }
        }
    }

    /// Retention: learns what is stabilized from the HWM of a master of `epoch` and trims
    /// the log if a Trim event became stabilized.
    fn retain(&mut self, epoch: Epoch, hwm: Option<Offset>) {
        if self.retention.learn(epoch, hwm) {
            if let Some(before) = self.retention.due(&self.wal) {
                self.trim(before);
            }
        }
    }

    /// Deletes the whole segments below `before` on the blocking pool (unlinks and a
    /// directory fsync), without holding up the actor. A failure is logged: the segments
    /// stay and the next trim point retries.
    fn trim(&mut self, before: Offset) {
        self.trims.retain(|t| !t.is_finished());
        let wal = self.wal.clone();
        let task = tokio::task::spawn_blocking(move || match wal.trim_before(before) {
            Ok(r) if r.segments_deleted > 0 => tracing::info!(
                before = %before,
                first_offset = %r.first_offset,
                segments = r.segments_deleted,
                bytes = r.bytes_deleted,
                "retention trimmed the log"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, before = %before, "retention trim failed"),
        });
        self.trims.push(task);
    }

    /// Clears the tail-cut mark once the durable log holds an entry of an epoch above the
    /// promised epoch at the cut (`crate::tail_cut::clears`): the file is removed durably on
    /// the blocking pool first, then the grants stop carrying it. A failure keeps the mark
    /// (the safe side) and the next completion retries.
    async fn clear_tail_cut(&mut self) {
        let Some(cut) = self.tail_cut else {
            return;
        };
        let last = self.wal.last_durable();
        if !crate::tail_cut::clears(cut, last.map(|l| l.epoch)) {
            return;
        }
        let dir = self.data_dir.clone();
        let cleared = tokio::task::spawn_blocking(move || crate::tail_cut::clear(&dir)).await;
        match cleared {
            Ok(Ok(())) => {
                tracing::info!(cut_offset = %cut.offset, cut_promised = %cut.promised, last = ?last, "caught up with a later master: tail-cut mark cleared");
                self.tail_cut = None;
                self.metrics.tail_cut.set(0);
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot clear the tail-cut mark"),
            Err(e) => tracing::warn!(error = %e, "the tail-cut clearing task failed"),
        }
    }

    /// Raises the promised epoch durably (on the blocking pool), then in memory.
    async fn promise(&mut self, epoch: Epoch) -> Result<(), WalError> {
        let dir = self.wal.dir().to_path_buf();
        let file = self.promised_file.take();
        let (file, result) = tokio::task::spawn_blocking(move || {
            let mut file = match file {
                Some(f) => f,
                None => match PromisedEpoch::load(&dir) {
                    Ok(f) => f,
                    Err(e) => return (None, Err(e)),
                },
            };
            let r = file.store(epoch);
            (Some(file), r)
        })
        .await
        .unwrap_or_else(|e| {
            (
                None,
                Err(WalError::Io {
                    op: "store promised epoch",
                    path: self.wal.dir().to_path_buf(),
                    source: Arc::new(std::io::Error::other(e.to_string())),
                }),
            )
        });
        self.promised_file = file;
        result?;
        self.replica.promise(epoch);
        self.metrics.promised_epoch.set(epoch.0);
        Ok(())
    }

    /// Records the learner role in the identity file (on the blocking pool), then in
    /// memory.
    async fn become_learner(&mut self) -> Result<(), crate::identity::IdentityError> {
        let learner = Identity {
            role: Role::Learner,
            ..self.identity
        };
        let dir = self.data_dir.clone();
        tokio::task::spawn_blocking(move || learner.store(&dir))
            .await
            .unwrap_or_else(|e| {
                Err(crate::identity::IdentityError::Io {
                    op: "store identity",
                    path: self.data_dir.clone(),
                    source: std::io::Error::other(e.to_string()),
                })
            })?;
        self.identity = learner;
        self.replica.become_learner();
        self.metrics.voter.set(0);
        Ok(())
    }
}

/// Waits for the oldest submission to resolve.
async fn next_completion(
    submissions: &mut VecDeque<Submission>,
) -> (u64, Result<Offset, WalError>) {
    poll_fn(|cx| {
        let front = submissions
            .front_mut()
            .expect("invariant: polled only with submissions in flight");
        let seq = front.seq;
        match &mut front.state {
            SubmissionState::Pending(a) => Pin::new(a).poll(cx).map(|r| (seq, r)),
            SubmissionState::Done(r) => Poll::Ready((
                seq,
                r.take()
                    .expect("invariant: a done submission is taken once"),
            )),
        }
    })
    .await
}

/// Splits `records` into runs that each fit one WAL append: a run's records plus a possible
/// truncation marker (one header), padded to `align_bytes`, stay within `segment_bytes`. A
/// record too large for any segment is a run of its own (the WAL refuses it as too large).
fn split_for_segments(
    records: Vec<Record>,
    segment_bytes: u64,
    align_bytes: u64,
) -> Vec<Vec<Record>> {
    // Padding to the alignment adds less than `align_bytes`.
    let budget = segment_bytes
        .saturating_sub(align_bytes)
        .saturating_sub(HEADER_BYTES as u64);
    let mut runs: Vec<Vec<Record>> = Vec::new();
    let mut run: Vec<Record> = Vec::new();
    let mut run_bytes = 0u64;
    for r in records {
        let bytes = record_bytes(r.payload.len()) as u64;
        if !run.is_empty() && run_bytes + bytes > budget {
            runs.push(std::mem::take(&mut run));
            run_bytes = 0;
        }
        run_bytes += bytes;
        run.push(r);
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(sizes: &[usize]) -> Vec<Record> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Record {
                epoch: quire_proto::Epoch(1),
                offset: quire_proto::Offset(i as u64),
                kind: 1,
                payload: bytes::Bytes::from(vec![0u8; n]),
            })
            .collect()
    }

    fn run_lengths(runs: &[Vec<Record>]) -> Vec<usize> {
        runs.iter().map(Vec::len).collect()
    }

    #[test]
    fn runs_fit_a_segment_with_room_for_a_marker_and_padding() {
        // 64 KiB segments, 4 KiB alignment: a budget of 60 KiB - 32 bytes per run.
        let seg = 64 * 1024;
        let runs = split_for_segments(records(&[3_000; 50]), seg, 4096);
        for run in &runs {
            let bytes: usize = run.iter().map(|r| record_bytes(r.payload.len())).sum();
            assert!((bytes + HEADER_BYTES) as u64 <= seg - 4096, "{bytes}");
        }
        assert_eq!(run_lengths(&runs).iter().sum::<usize>(), 50);
        // Offsets stay in order across runs.
        let offsets: Vec<u64> = runs.iter().flatten().map(|r| r.offset.0).collect();
        assert_eq!(offsets, (0..50).collect::<Vec<_>>());
        assert!(runs.len() > 1);
    }

    #[test]
    fn a_small_append_is_one_run_and_an_oversize_record_is_alone() {
        assert_eq!(
            run_lengths(&split_for_segments(records(&[10, 10]), 1 << 20, 4096)),
            vec![2]
        );
        assert_eq!(
            run_lengths(&split_for_segments(
                records(&[10, 200_000, 10]),
                64 * 1024,
                4096
            )),
            vec![1, 1, 1]
        );
        assert!(split_for_segments(Vec::new(), 1 << 20, 4096).is_empty());
    }
}
