//! `quire bench node`: appends through a real `quire-node` over TCP, as a master does, and
//! measures events/s, MB/s, fdatasyncs/s and append-to-persisted latency.
//!
//! # The store
//! With `--store ADDR`, a running node. **It is written to**: the bench fences it with a
//! fresh epoch (so a broker using it would be shut out) and appends its events after the
//! store's last entry. Point it only at a store no cluster uses. Without `--store`, a node
//! is started in this process (`quire_node::Node::start`) on a new data directory in a
//! temporary directory (inside `--dir`, default the system temp directory), removed at the
//! end: no setup needed.
//!
//! # The appends
//! First `Tail`, then `Fence` with an epoch above everything the store has seen (broker id
//! [`BENCH_BROKER_ID`], the store's own identity as `expected`), then one warm-up append.
//! A store has **one** log, so the appends must reach it in log order. One sequencer task
//! gives each append the next `--batch` consecutive offsets (`prev` = the previous append's
//! last entry) and sends append `k` on connection `k mod N`, keeping at most `--in-flight`
//! appends unanswered (pipelining: the store group-commits whatever has arrived). One
//! connection keeps the order by itself (TCP, and the node serves one connection in order).
//! With N > 1, appends can overtake each other between connections; the store then answers
//! `LogMismatch` (its log has no entry at `prev` yet). A refused append is resent on the
//! first connection (the resend lane) once every append before it is **settled** — persisted,
//! or its own resend queued on the lane before it — as a master backs up and resends in
//! order. That is correct whatever the arrival order, and needs one resend per refusal: an
//! append resent on the lane finds each predecessor either in the store's log already or
//! ahead of it on the same connection, which the store serves in order. A second refusal
//! would mean another writer changed the log: the bench stops with an error. Resends are
//! counted (`resends`); with several connections most appends may be overtaken, and the
//! figures then measure that reordering, not the store — one connection, as a master uses
//! per store, is the default.
//!
//! # What is measured
//! - **Latency** per append, from the first `start_append` to its `PersistedAck` (the
//!   store's fdatasync covered it), microseconds, resends included.
//! - **Throughput**: events in persisted appends over the time from the first send to the
//!   last ack; `mb_per_s` counts payload bytes (10^6 bytes per MB).
//! - **fdatasyncs**: the node's `quire_wal_fsyncs_total` counter, before and after, read from
//!   the in-process node's metrics, or from `--metrics ADDR` (`GET /metrics`) for a remote
//!   store; without it `fsyncs_per_s` is `null` (`fsyncs_source` says which).
//!
//! # JSON output (`--format json`): one object
//! | field | unit / values |
//! | --- | --- |
//! | `bench` | `"node"` |
//! | `store` | the store's address |
//! | `in_process` | whether the bench started the node itself |
//! | `epoch` | the epoch the bench fenced with |
//! | `connections`, `in_flight`, `batch`, `event_size` | as given (`batch` = events per append; bytes for `event_size`) |
//! | `duration_s` | seconds |
//! | `appends`, `events`, `payload_bytes`, `resends` | totals |
//! | `mb_per_s`, `mib_per_s` | payload, 10^6 and 2^20 bytes per second |
//! | `ops_per_s` | events per second (= `events_per_s`) |
//! | `events_per_s`, `appends_per_s` | per second; `appends_per_s` is the PersistedAck rate |
//! | `fsyncs`, `fsyncs_per_s`, `events_per_fsync` | from the node's metrics, or `null` |
//! | `fsyncs_source` | `"node_metrics"` (in-process), `"http:ADDR"`, or `null` |
//! | `mean_us`, `p50_us`, `p99_us`, `p999_us`, `max_us` | append-to-persisted latency, microseconds |

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use quire_client::{AppendOutcome, FenceOutcome, StoreClient};
use quire_proto::{
    AppendRequest, BrokerId, Epoch, Event, EventKind, LogPosition, Offset, RejectReason,
    EVENTS_PER_FRAME_MAX, FRAME_BYTES_MAX,
};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::wal::{latency_histogram, payload_bytes, WalIo};
use crate::interrupt::Interrupted;
use crate::output::human_bytes;
use crate::output::{Report, Table};

/// The broker id in the bench's epochs (`counter << 16 | id`): one no real broker uses in
/// practice, so a store's log shows which events the bench wrote.
pub const BENCH_BROKER_ID: u16 = u16::MAX;
/// Most `--connections`.
pub const CONNECTIONS_MAX: u32 = 256;
/// Most `--in-flight` appends.
pub const IN_FLIGHT_MAX: u32 = 4096;
/// Longest `--duration`.
pub const DURATION_MAX: Duration = Duration::from_secs(24 * 3600);
/// Bytes an event takes in an append beyond its payload (generous: epoch, offset, kind,
/// length), for the frame-size check.
const EVENT_OVERHEAD_BYTES: u64 = 64;
/// Resends of one append at most before the bench gives up (a store that keeps refusing
/// with `Overloaded`; a `LogMismatch` is resent at most once, see the module docs).
pub const RESENDS_PER_APPEND_MAX: u32 = 10_000;
/// Most bytes of a `/metrics` answer read.
pub const METRICS_BYTES_MAX: u64 = 4 << 20;
/// How long one `/metrics` request may take.
pub const METRICS_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for the in-process node's spare segment before timing.
const SPARE_WAIT_MAX: Duration = Duration::from_secs(120);

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBenchConfig {
    /// A running node's store address; `None`: start one in this process.
    pub store: Option<String>,
    /// The running node's metrics address (`host:port`), for fdatasync counts.
    pub metrics: Option<String>,
    /// Where the in-process node's temporary data directory goes; `None`: the system temp
    /// directory.
    pub dir: Option<PathBuf>,
    /// The in-process node's WAL backend.
    pub io: WalIo,
    /// TCP connections, 1..=[`CONNECTIONS_MAX`].
    pub connections: u32,
    /// Appends unanswered at most, 1..=[`IN_FLIGHT_MAX`].
    pub in_flight: u32,
    /// Events per append.
    pub batch: u32,
    /// Payload bytes per event.
    pub event_size: u64,
    /// How long to send.
    pub duration: Duration,
}

impl Default for NodeBenchConfig {
    fn default() -> Self {
        NodeBenchConfig {
            store: None,
            metrics: None,
            dir: None,
            io: WalIo::Auto,
            connections: 1,
            in_flight: 64,
            batch: 1,
            event_size: 1024,
            duration: Duration::from_secs(10),
        }
    }
}

/// The result; see the module docs.
#[derive(Debug, Clone, Serialize)]
pub struct NodeBenchReport {
    /// Always `"node"`.
    pub bench: &'static str,
    /// The store's address.
    pub store: String,
    /// Whether the bench started the node.
    pub in_process: bool,
    /// The epoch fenced with.
    pub epoch: u64,
    /// TCP connections.
    pub connections: u32,
    /// Appends in flight at most.
    pub in_flight: u32,
    /// Events per append.
    pub batch: u32,
    /// Payload bytes per event.
    pub event_size: u64,
    /// Measured wall time, seconds.
    pub duration_s: f64,
    /// Appends persisted.
    pub appends: u64,
    /// Events in them.
    pub events: u64,
    /// Their payload bytes.
    pub payload_bytes: u64,
    /// Appends resent after a `LogMismatch` or `Overloaded`.
    pub resends: u64,
    /// Payload MB/s (10^6).
    pub mb_per_s: f64,
    /// Payload MiB/s (2^20).
    pub mib_per_s: f64,
    /// Events per second.
    pub ops_per_s: f64,
    /// Events per second.
    pub events_per_s: f64,
    /// Persisted acks per second.
    pub appends_per_s: f64,
    /// fdatasyncs during the run.
    pub fsyncs: Option<u64>,
    /// fdatasyncs per second.
    pub fsyncs_per_s: Option<f64>,
    /// Events per fdatasync.
    pub events_per_fsync: Option<f64>,
    /// Where the fdatasync count came from.
    pub fsyncs_source: Option<String>,
    /// Mean latency, microseconds.
    pub mean_us: f64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile, microseconds.
    pub p99_us: u64,
    /// 99.9th percentile, microseconds.
    pub p999_us: u64,
    /// Largest, microseconds.
    pub max_us: u64,
}

impl Report for NodeBenchReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "quire bench node: appends of {} x {} events to {} {} over {} connection(s), {} in flight",
            self.batch,
            human_bytes(self.event_size),
            if self.in_process {
                "an in-process node at"
            } else {
                "the node at"
            },
            self.store,
            self.connections,
            self.in_flight
        )?;
        let fsyncs = match (
            self.fsyncs_per_s,
            self.events_per_fsync,
            &self.fsyncs_source,
        ) {
            (Some(rate), Some(per), Some(source)) => format!(
                "{rate:.0} /s ({} total), {per:.1} events per fsync (from {source})",
                self.fsyncs.unwrap_or(0)
            ),
            _ => "unknown (pass --metrics ADDR of the node)".to_owned(),
        };
        Table::new()
            .row("epoch", self.epoch.to_string())
            .row("duration", format!("{:.2} s", self.duration_s))
            .row(
                "throughput",
                format!("{:.1} MB/s payload ({:.1} MiB/s)", self.mb_per_s, self.mib_per_s),
            )
            .row(
                "events",
                format!("{:.0} /s ({} total)", self.events_per_s, self.events),
            )
            .row(
                "persisted acks",
                format!(
                    "{:.0} /s ({} appends, {} resent)",
                    self.appends_per_s, self.appends, self.resends
                ),
            )
            .row("fdatasyncs", fsyncs)
            .row(
                "latency",
                format!(
                    "append to persisted: mean {:.0} us, p50 {} us, p99 {} us, p99.9 {} us, max {} us",
                    self.mean_us, self.p50_us, self.p99_us, self.p999_us, self.max_us
                ),
            )
            .write(out)
    }
}

fn validate(config: &NodeBenchConfig) -> anyhow::Result<()> {
    if config.connections == 0 || config.connections > CONNECTIONS_MAX {
        bail!(
            "--connections {} is out of range: 1 to {CONNECTIONS_MAX}",
            config.connections
        );
    }
    if config.in_flight == 0 || config.in_flight > IN_FLIGHT_MAX {
        bail!(
            "--in-flight {} is out of range: 1 to {IN_FLIGHT_MAX}",
            config.in_flight
        );
    }
    if config.batch == 0 || config.batch as usize > EVENTS_PER_FRAME_MAX {
        bail!(
            "--batch {} is out of range: 1 to {EVENTS_PER_FRAME_MAX}",
            config.batch
        );
    }
    if config.event_size == 0 {
        bail!("--event-size must be at least 1 byte");
    }
    let append_bytes = u64::from(config.batch) * (config.event_size + EVENT_OVERHEAD_BYTES);
    let frame_max = FRAME_BYTES_MAX as u64 - 4096;
    if append_bytes > frame_max {
        bail!(
            "an append of {} events of {} bytes does not fit a frame ({frame_max} bytes at \
             most): lower --batch or --event-size",
            config.batch,
            config.event_size
        );
    }
    if config.duration.is_zero() || config.duration > DURATION_MAX {
        bail!("--duration {:?} is out of range", config.duration);
    }
    if config.metrics.is_some() && config.store.is_none() {
        bail!("--metrics is for a running node given with --store");
    }
    Ok(())
}

/// Runs the benchmark (in its own Tokio runtime); Ctrl-C stops it early with
/// [`Interrupted`] after the in-process node and its directory are cleaned up.
///
/// # Errors
/// Invalid configuration; the node unreachable, refusing the fence (a higher epoch, or a
/// learner) or an append (stale epoch, failed log); I/O errors of the temporary node.
pub fn run(config: &NodeBenchConfig) -> anyhow::Result<NodeBenchReport> {
    validate(config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(run_async(config))
}

/// The in-process node and its directory.
struct LocalNode {
    node: quire_node::Node,
    root: tempfile::TempDir,
    wal_dir: PathBuf,
}

async fn start_local(config: &NodeBenchConfig) -> anyhow::Result<LocalNode> {
    let parent = config.dir.clone().unwrap_or_else(std::env::temp_dir);
    let root = tempfile::Builder::new()
        .prefix(".quire-bench-node-")
        .tempdir_in(&parent)
        .with_context(|| format!("cannot create a directory in {}", parent.display()))?;
    let data = root.path().join("data");
    quire_node::init(&quire_node::InitArgs {
        data_dir: data.clone(),
        learner: false,
    })
    .context("cannot initialise the in-process node's data directory")?;
    let mut node_config = quire_node::NodeConfig::new(&data, "127.0.0.1:0");
    node_config.wal.io = match config.io {
        WalIo::Auto => quire_node::config::IoSetting::Auto,
        WalIo::Uring => quire_node::config::IoSetting::Uring,
        WalIo::Sync => quire_node::config::IoSetting::Sync,
    };
    let wal_dir = node_config.wal_config().dir;
    let node = quire_node::Node::start(node_config)
        .await
        .context("cannot start the in-process node")?;
    Ok(LocalNode {
        node,
        root,
        wal_dir,
    })
}

async fn run_async(config: &NodeBenchConfig) -> anyhow::Result<NodeBenchReport> {
    let local = match &config.store {
        Some(_) => None,
        None => Some(start_local(config).await?),
    };
    let store = match (&config.store, &local) {
        (Some(addr), _) => addr.clone(),
        (None, Some(l)) => l.node.local_addr().to_string(),
        (None, None) => unreachable!("a local node is started when no store is given"),
    };
    let result = tokio::select! {
        r = measure(config, &store, local.as_ref()) => r,
        _ = tokio::signal::ctrl_c() => Err(Interrupted.into()),
    };
    if let Some(l) = local {
        let LocalNode { node, root, .. } = l;
        let shutdown = node.shutdown().await;
        let removed = root.close();
        let report = result?;
        shutdown.context("the in-process node failed to shut down")?;
        removed.context("cannot remove the in-process node's directory")?;
        return Ok(report);
    }
    result
}

/// Waits (bounded) until the in-process node's WAL has its spare segment zero-filled, so
/// that neither the warm-up nor the timed part waits for one.
async fn wait_for_spare(wal_dir: &std::path::Path) {
    let spare = wal_dir.join(quire_wal::segment::SPARE_NAME);
    let started = Instant::now();
    while !spare.exists() {
        if started.elapsed() > SPARE_WAIT_MAX {
            tracing::warn!("the node's spare segment is not ready after {SPARE_WAIT_MAX:?}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(super::wal::SPARE_SETTLE).await;
}

/// The fdatasync counter of the node, if there is a way to read it.
async fn fsyncs_now(
    config: &NodeBenchConfig,
    local: Option<&LocalNode>,
) -> anyhow::Result<Option<(u64, String)>> {
    if let Some(l) = local {
        let text = l
            .node
            .metrics()
            .encode()
            .map_err(|e| anyhow!("cannot encode the node's metrics: {e}"))?;
        return Ok(
            metric_value(&text, "quire_wal_fsyncs_total").map(|v| (v, "node_metrics".into()))
        );
    }
    let Some(addr) = &config.metrics else {
        return Ok(None);
    };
    let text = tokio::time::timeout(METRICS_TIMEOUT, http_get_metrics(addr))
        .await
        .map_err(|_| anyhow!("GET http://{addr}/metrics timed out after {METRICS_TIMEOUT:?}"))??;
    let value = metric_value(&text, "quire_wal_fsyncs_total")
        .ok_or_else(|| anyhow!("http://{addr}/metrics has no quire_wal_fsyncs_total"))?;
    Ok(Some((value, format!("http:{addr}"))))
}

/// `GET /metrics` over plain HTTP/1.1; returns the body.
async fn http_get_metrics(addr: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to the metrics address {addr}"))?;
    stream
        .write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .with_context(|| format!("cannot send to {addr}"))?;
    let mut response = Vec::new();
    (&mut stream)
        .take(METRICS_BYTES_MAX)
        .read_to_end(&mut response)
        .await
        .with_context(|| format!("cannot read from {addr}"))?;
    let text = String::from_utf8_lossy(&response);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("http://{addr}/metrics: not an HTTP response");
    };
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!(
            "http://{addr}/metrics answered {}",
            head.lines().next().unwrap_or("")
        );
    }
    Ok(body.to_owned())
}

/// The value of an unlabelled sample `name` in Prometheus text.
fn metric_value(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        let v: f64 = value.trim().parse().ok()?;
        (v >= 0.0).then_some(v as u64)
    })
}

/// Which of the run's appends (numbered from 0 in send order) are settled (persisted, or
/// their resend queued on the resend lane): the length of the settled prefix, watched by
/// refused appends waiting for their predecessors.
#[derive(Debug)]
struct Settled {
    state: std::sync::Mutex<(u64, std::collections::BTreeSet<u64>)>,
    prefix: tokio::sync::watch::Sender<u64>,
}

impl Settled {
    fn new() -> Settled {
        Settled {
            state: std::sync::Mutex::new((0, std::collections::BTreeSet::new())),
            prefix: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Append `k` is settled.
    fn done(&self, k: u64) {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (prefix, above) = &mut *st;
        above.insert(k);
        while above.remove(prefix) {
            *prefix += 1;
        }
        self.prefix.send_replace(*prefix);
    }

    /// Waits until appends `0..k` are all settled.
    async fn wait_for_prefix(&self, k: u64) {
        let mut rx = self.prefix.subscribe();
        // The sender lives in `self`, which outlives this wait: no error possible.
        let _ = rx.wait_for(|&p| p >= k).await;
    }
}

/// One append's fate, as its waiting task reports it.
struct Done {
    latency_us: u64,
    events: u64,
    resends: u32,
}

async fn measure(
    config: &NodeBenchConfig,
    store: &str,
    local: Option<&LocalNode>,
) -> anyhow::Result<NodeBenchReport> {
    let mut clients = Vec::new();
    for _ in 0..config.connections {
        clients.push(Arc::new(StoreClient::connect(store).await.with_context(
            || format!("cannot connect to the store at {store}"),
        )?));
    }
    let tail = clients[0]
        .tail()
        .await
        .with_context(|| format!("Tail to {store} failed"))?;
    let seen = tail
        .promised
        .counter()
        .max(tail.last.map_or(0, |l| l.epoch.counter()));
    let epoch = Epoch::compose(seen + 1, BrokerId(BENCH_BROKER_ID));
    if config.store.is_some() {
        tracing::warn!(
            "fencing the store at {store} with epoch {epoch} and appending bench events to \
             its log: a broker using this store is shut out"
        );
    }
    let granted = match clients[0]
        .fence(epoch, Some((tail.store_id, tail.incarnation)))
        .await
        .with_context(|| format!("Fence to {store} failed"))?
    {
        FenceOutcome::Granted(g) => g,
        FenceOutcome::Refused(r) => {
            bail!(
                "the store refused the fence: it promised epoch {} meanwhile",
                r.promised
            )
        }
        FenceOutcome::NotVoter { .. } => bail!(
            "the store at {store} is a learner (not a voter): it grants no fence; bench a voter"
        ),
    };
    let payload = payload_bytes(usize::try_from(config.event_size).context("event size")?);
    let mut prev = granted.last;
    let make = |prev: Option<LogPosition>, events: u32| -> AppendRequest {
        let first = prev.map_or(0, |p| p.offset.0 + 1);
        AppendRequest {
            epoch,
            prev,
            events: (0..u64::from(events))
                .map(|i| Event {
                    epoch,
                    offset: Offset(first + i),
                    kind: EventKind::Message,
                    payload: payload.clone().into(),
                })
                .collect(),
            hwm: None,
        }
    };
    // Warm-up: one append (creates the first segment of a new store), then the spare.
    if let Some(l) = local {
        wait_for_spare(&l.wal_dir).await;
    }
    let warmup = make(prev, 1);
    prev = Some(LogPosition {
        epoch,
        offset: Offset(prev.map_or(0, |p| p.offset.0 + 1)),
    });
    match clients[0]
        .append(warmup)
        .await
        .context("the warm-up append failed")?
    {
        AppendOutcome::Persisted(_) => {}
        AppendOutcome::Rejected(r) => bail!("the store rejected the warm-up append: {r:?}"),
    }
    if let Some(l) = local {
        wait_for_spare(&l.wal_dir).await;
    }

    let fsyncs_before = fsyncs_now(config, local).await?;
    let window = Arc::new(Semaphore::new(config.in_flight as usize));
    let mut tasks: JoinSet<anyhow::Result<Done>> = JoinSet::new();
    let mut hist = latency_histogram();
    let (mut appends, mut events, mut resends) = (0u64, 0u64, 0u64);
    let mut record = |done: Done| {
        hist.saturating_record(done.latency_us.max(1));
        appends += 1;
        events += done.events;
        resends += u64::from(done.resends);
    };
    let started = Instant::now();
    let deadline = started + config.duration;
    let settled = Arc::new(Settled::new());
    let mut k = 0u64;
    while Instant::now() < deadline {
        let permit = window
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| anyhow!("invariant: the window semaphore is never closed"))?;
        while let Some(joined) = tasks.try_join_next() {
            record(joined.map_err(|e| anyhow!("an append task failed: {e}"))??);
        }
        let request = make(prev, config.batch);
        prev = request.events.last().map(|e| LogPosition {
            epoch,
            offset: e.offset,
        });
        let index = k;
        let client = clients[usize::try_from(k % u64::from(config.connections))
            .expect("invariant: below the connection count")]
        .clone();
        let lane = clients[0].clone();
        let settled = settled.clone();
        k += 1;
        let sent = Instant::now();
        let pending = client
            .start_append(request.clone())
            .await
            .context("cannot send an append")?;
        tasks.spawn(async move {
            let _permit = permit;
            let mut pending = pending;
            let mut resent = 0u32;
            let mut settled_by_resend = false;
            loop {
                match pending.wait().await.context("an append got no answer")? {
                    AppendOutcome::Persisted(_) => break,
                    AppendOutcome::Rejected(r)
                        if r.reason == RejectReason::Overloaded
                            && resent < RESENDS_PER_APPEND_MAX =>
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        resent += 1;
                        let on = if settled_by_resend { &lane } else { &client };
                        pending = on
                            .start_append(request.clone())
                            .await
                            .context("cannot resend an append")?;
                    }
                    AppendOutcome::Rejected(r)
                        if r.reason == RejectReason::LogMismatch && !settled_by_resend =>
                    {
                        // Overtaken on another connection: resend on the lane once every
                        // append before this one is settled.
                        settled.wait_for_prefix(index).await;
                        resent += 1;
                        pending = lane
                            .start_append(request.clone())
                            .await
                            .context("cannot resend an append")?;
                        settled_by_resend = true;
                        settled.done(index);
                    }
                    AppendOutcome::Rejected(r) => bail!(
                        "the store rejected an append ({:?}, promised epoch {}, last {:?}) after \
                         {resent} resend(s){}",
                        r.reason,
                        r.promised,
                        r.last,
                        if r.reason == RejectReason::LogMismatch {
                            ": another writer changed the store's log?"
                        } else {
                            ""
                        }
                    ),
                }
            }
            if !settled_by_resend {
                settled.done(index);
            }
            Ok(Done {
                latency_us: u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX),
                events: request.events.len() as u64,
                resends: resent,
            })
        });
    }
    while let Some(joined) = tasks.join_next().await {
        record(joined.map_err(|e| anyhow!("an append task failed: {e}"))??);
    }
    let elapsed = started.elapsed();
    let fsyncs_after = fsyncs_now(config, local).await?;

    let secs = elapsed.as_secs_f64();
    let per_sec = |v: f64| if secs > 0.0 { v / secs } else { 0.0 };
    let payload_bytes = events * config.event_size;
    let (fsyncs, fsyncs_source) = match (fsyncs_before, fsyncs_after) {
        (Some((a, source)), Some((b, _))) => (Some(b.saturating_sub(a)), Some(source)),
        _ => (None, None),
    };
    Ok(NodeBenchReport {
        bench: "node",
        store: store.to_owned(),
        in_process: local.is_some(),
        epoch: epoch.0,
        connections: config.connections,
        in_flight: config.in_flight,
        batch: config.batch,
        event_size: config.event_size,
        duration_s: secs,
        appends,
        events,
        payload_bytes,
        resends,
        mb_per_s: per_sec(payload_bytes as f64) / 1e6,
        mib_per_s: per_sec(payload_bytes as f64) / f64::from(1u32 << 20),
        ops_per_s: per_sec(events as f64),
        events_per_s: per_sec(events as f64),
        appends_per_s: per_sec(appends as f64),
        fsyncs,
        fsyncs_per_s: fsyncs.map(|f| per_sec(f as f64)),
        events_per_fsync: fsyncs.map(|f| if f > 0 { events as f64 / f as f64 } else { 0.0 }),
        fsyncs_source,
        mean_us: hist.mean(),
        p50_us: hist.value_at_quantile(0.50),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        max_us: hist.max(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_values_are_read_from_prometheus_text() {
        let text = "# HELP quire_wal_fsyncs fdatasyncs completed.\n\
                    # TYPE quire_wal_fsyncs counter\n\
                    quire_wal_fsyncs_total 1234\n\
                    quire_wal_fsyncs_total_other 9\n";
        assert_eq!(metric_value(text, "quire_wal_fsyncs_total"), Some(1234));
        assert_eq!(metric_value(text, "quire_wal_batches_total"), None);
    }

    #[test]
    fn oversized_appends_are_refused() {
        let config = NodeBenchConfig {
            batch: 1024,
            event_size: 1 << 20,
            ..NodeBenchConfig::default()
        };
        assert!(validate(&config).is_err());
        assert!(validate(&NodeBenchConfig::default()).is_ok());
    }
}
