//! The store actor: a thin tokio driver of the store engine ([`crate::engine`]), the one
//! task that owns the order of requests and WAL submissions across all connections.
//!
//! Connections send [`Command`]s through a bounded channel ([`STORE_QUEUE_MAX`]). The actor
//! feeds each to the engine with the real [`Wal`] as its log, and executes what the engine
//! asks: a durable promise or learner role (on the blocking pool, before the next request),
//! `Wal::append` (which returns at once with a future), a retention trim, clearing the
//! tail-cut mark, and answers. It keeps the WAL's futures in submission order; the WAL
//! resolves them in that order, each after the fdatasync that covers it, and the actor
//! reports each resolution to the engine, which releases the waiting answers.
//!
//! Answers go out through each connection's [`Reply`], which never blocks the actor.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use quire_proto::{
    AppendRequest, Body, ErrorCode, FenceRequest, Heartbeat, Offset, RejectReason, TailCut,
};
use quire_wal::{PromisedEpoch, Wal, WalError};
use tokio::sync::mpsc;

use crate::conn::Reply;
use crate::engine::{self, Engine, Mutations};
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::replica::Replica;
use crate::submissions::Submissions;

/// Commands queued for the store actor at most; connections wait (and stop reading)
/// beyond it.
pub const STORE_QUEUE_MAX: usize = 8192;

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

/// What a request waiting for its answer was, for the metrics.
#[derive(Debug)]
enum Asked {
    Append { events: u64, payload_bytes: u64 },
    Fence,
    Other,
}

/// The actor's state. See the module docs.
#[derive(Debug)]
pub(crate) struct Store {
    wal: Wal,
    data_dir: PathBuf,
    /// `None` only while a promise is being written on the blocking pool.
    promised_file: Option<PromisedEpoch>,
    engine: Engine<u64>,
    /// Requests the engine has not answered yet, by token.
    asked: HashMap<u64, (Reply, Asked)>,
    next_token: u64,
    submissions: Submissions,
    metrics: Arc<Metrics>,
    /// Retention trims running on the blocking pool: each holds a handle to the WAL (and
    /// with it the data directory's lock), so the actor waits for them before it ends.
    trims: Vec<tokio::task::JoinHandle<()>>,
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
        let (tx, rx) = mpsc::channel(STORE_QUEUE_MAX);
        let store = Store {
            wal,
            data_dir,
            promised_file: Some(promised_file),
            engine: Engine::new(replica, tail_cut, Mutations::default()),
            asked: HashMap::new(),
            next_token: 0,
            submissions: Submissions::new(),
            metrics,
            trims: Vec::new(),
        };
        store.gauges();
        (store, StoreHandle { tx }, rx)
    }

    /// Runs until every handle is dropped, then waits for the submissions in flight and
    /// answers their waiters.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        loop {
            tokio::select! {
                biased;
                () = self.submissions.oldest_resolved(), if !self.submissions.is_empty() => {
                    self.on_completions();
                    self.drain().await;
                }
                command = rx.recv() => match command {
                    Some(c) => {
                        self.handle(c);
                        self.drain().await;
                    }
                    None => break,
                },
            }
        }
        while !self.submissions.is_empty() {
            self.submissions.oldest_resolved().await;
            self.on_completions();
            self.drain().await;
        }
        // A trim still running holds the WAL open: a restart in the same process (or a
        // shutdown that returns) must not find the directory locked.
        for t in std::mem::take(&mut self.trims) {
            let _ = t.await;
        }
    }

    fn handle(&mut self, command: Command) {
        let token = self.next_token;
        self.next_token += 1;
        match command {
            Command::Append(req, reply) => {
                let asked = Asked::Append {
                    events: req.events.len() as u64,
                    payload_bytes: req.events.iter().map(|e| e.payload.len() as u64).sum(),
                };
                self.asked.insert(token, (reply, asked));
                self.engine.append(token, req, &self.wal);
            }
            Command::Fence(req, reply) => {
                self.asked.insert(token, (reply, Asked::Fence));
                self.engine.fence(token, req, &self.wal);
            }
            Command::Heartbeat(hb, reply) => {
                self.asked.insert(token, (reply, Asked::Other));
                self.engine.heartbeat(token, &hb, &self.wal);
            }
            Command::Tail(reply) => {
                self.asked.insert(token, (reply, Asked::Other));
                self.engine.tail(token, &self.wal);
            }
        }
    }

    /// Executes the engine's commands until it has none.
    async fn drain(&mut self) {
        loop {
            let commands = self.engine.take_commands();
            if commands.is_empty() {
                break;
            }
            for c in commands {
                self.execute(c).await;
            }
        }
        self.gauges();
    }

    fn gauges(&self) {
        let replica = self.engine.replica();
        self.metrics.promised_epoch.set(replica.promised().0);
        self.metrics.voter.set(i64::from(replica.role().is_voter()));
        if let Some(h) = replica.hwm() {
            self.metrics.hwm.set(i64::try_from(h.0).unwrap_or(i64::MAX));
        }
        self.metrics
            .tail_cut
            .set(i64::from(self.engine.tail_cut().is_some()));
    }

    async fn execute(&mut self, command: engine::Command<u64>) {
        match command {
            engine::Command::PersistPromise(epoch) => {
                let r = self.promise(epoch).await.map_err(|e| e.to_string());
                self.engine.promise_persisted(r, &self.wal);
            }
            engine::Command::Submit {
                seq,
                epoch,
                events,
                truncates: _,
            } => self
                .submissions
                .submit(&mut self.engine, &self.wal, seq, epoch, events),
            engine::Command::Answer { token, body } => self.answer(token, body),
            engine::Command::Trim { before } => self.trim(before),
            engine::Command::ClearTailCut(cut) => {
                let cleared = self.clear_tail_cut(cut).await;
                self.engine.tail_cut_cleared(cleared);
            }
        }
    }

    /// Sends `body` to the request `token`, counting it.
    fn answer(&mut self, token: u64, body: Body) {
        let Some((reply, asked)) = self.asked.remove(&token) else {
            debug_assert!(false, "invariant: every token is answered once");
            return;
        };
        let m = &self.metrics;
        match (&asked, &body) {
            (
                Asked::Append {
                    events,
                    payload_bytes,
                },
                Body::PersistedAck(_),
            ) => {
                m.appends_persisted.inc();
                m.append_events.inc_by(*events);
                m.append_bytes.inc_by(*payload_bytes);
            }
            (Asked::Append { .. }, Body::AppendRejected(r)) => m.reject_append(match r.reason {
                RejectReason::StaleEpoch => "stale_epoch",
                RejectReason::LogMismatch => "log_mismatch",
                RejectReason::LogFailed => "log_failed",
                RejectReason::Overloaded => "overloaded",
                RejectReason::Malformed => "invalid",
            }),
            (Asked::Append { .. }, Body::ErrorResponse(e)) => {
                m.reject_append(if e.code == ErrorCode::Malformed {
                    "invalid"
                } else {
                    "internal"
                });
            }
            (Asked::Fence, Body::FenceGranted(_)) => m.fence("granted"),
            (Asked::Fence, Body::FenceRefused(_)) => m.fence("refused"),
            (Asked::Fence, Body::ErrorResponse(e)) if e.code == ErrorCode::NotVoter => {
                m.fence("not_voter");
            }
            (Asked::Fence, Body::ErrorResponse(e)) if e.code == ErrorCode::Corrupt => {
                m.fence("corrupt");
            }
            _ => {}
        }
        reply.send(body);
    }

    /// Reports the WAL appends that resolved (the oldest did; appends made durable by the
    /// same fdatasync resolve together).
    fn on_completions(&mut self) {
        let resolved = self.submissions.report_ready(&mut self.engine, &self.wal);
        self.metrics.group_commit_appends.observe(resolved as f64);
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

    /// Removes the tail-cut mark durably on the blocking pool; whether it is gone.
    async fn clear_tail_cut(&mut self, cut: TailCut) -> bool {
        let dir = self.data_dir.clone();
        let cleared = tokio::task::spawn_blocking(move || crate::tail_cut::clear(&dir)).await;
        match cleared {
            Ok(Ok(())) => {
                tracing::info!(cut_offset = %cut.offset, cut_promised = %cut.promised, last = ?self.wal.last_durable(), "caught up with a later master: tail-cut mark cleared");
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot clear the tail-cut mark");
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, "the tail-cut clearing task failed");
                false
            }
        }
    }
    /// Raises the promised epoch durably (on the blocking pool), the engine records it in memory.
    async fn promise(&mut self, epoch: quire_proto::Epoch) -> Result<(), WalError> {
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
        result
    }
}
