//! `quire demo`: Quire doing its whole job on this machine, in one command.
//!
//! 1. Starts a local cluster ([`crate::cluster::up::LocalCluster`]: 3 stores, 3 brokers,
//!    copies of this `quire` binary) in a fresh temporary directory and waits for a master.
//! 2. Runs `--producers` idempotent producers (`quire_client::Producer`, each its own
//!    producer id and connection) sending `--size` byte messages to topic `demo` for
//!    `--duration`, each keeping a bounded window of messages unacknowledged, and one
//!    consumer reading the topic from the beginning.
//! 3. At [`KILL_AT_FRACTION`] of the duration, asks the brokers who the master is and kills
//!    that process with SIGKILL. The producers find the new master and resend what was not
//!    acknowledged (same producer id and sequences, so nothing is written twice).
//! 4. Stops producing at the end, waits until every producer's messages are resolved, then
//!    lets the consumer drain (bounded by [`DRAIN_WAIT_MAX`]) until it has read past every
//!    acknowledged message.
//! 5. Verifies: every acknowledged message consumed exactly once, at the offset its
//!    producer was told, and each producer's messages in the order they were sent.
//!
//! # Payloads
//! ```text
//! off  size  field
//! 0    4     producer index   u32 LE (0..producers)
//! 4    8     sequence         u64 LE (0, 1, 2, ... per producer, in send order)
//! 12   ...   filler bytes up to --size
//! ```
//!
//! # Figures
//! - **latency**: per message, from `Producer::send` to its acknowledgement (the master
//!   acks only stabilized messages), in an HDR histogram (µs). The window keeps at most
//!   [`WINDOW_MESSAGES`] messages per producer unacknowledged, so latency includes waiting in
//!   the producer's own batches but not an unbounded queue.
//! - **failover time**: from the SIGKILL to the first acknowledgement of a message sent
//!   after it (only the new master can ack those).
//! - **throughput**: acknowledged messages (and payload bytes, MB = 10^6 B) over the
//!   producing period, the failover included.
//! - **lost**: acknowledged, never consumed. **duplicates**: consumed more than once.
//!   **out of order**: consumed after a later message of the same producer.
//!   **misplaced**: consumed at another offset than the one acknowledged.
//!
//! JSON (`--format json`, one object, last on stdout): `acked`, `acked_bytes`, `failed`,
//! `outcome_unknown`, `consumed`, `lost`, `duplicates`, `out_of_order`, `misplaced`,
//! `failover_ms` (or `null` if no failover was seen), `killed_broker`, `new_master`,
//! `produce_s`, `events_per_s`, `mb_per_s`, `p50_us`, `p99_us`, `p999_us`, `max_us`,
//! `producers`, `size`, `stores`, `brokers`, `data_dir` (or `null` when removed), `ok`.

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use quire_client::consumer::{ConsumerConfig, StartFrom};
use quire_client::discovery::{Discovery, DiscoveryConfig};
use quire_client::{Consumer, Delivery, ProduceError, Producer, ProducerConfig};
use serde::Serialize;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use crate::cli::FormatArgs;
use crate::cluster::runtime;
use crate::cluster::up::{ClusterSpec, LocalCluster, STOP_WAIT_DEFAULT};
use crate::output::{OutputFormat, Report, Table};
use crate::units::{parse_duration, parse_size};

/// The topic the demo writes.
pub const TOPIC: &str = "demo";
/// Bytes of the header every payload starts with (producer index, sequence).
pub const HEADER_BYTES: usize = 12;
/// Largest `--size` (bytes).
pub const SIZE_MAX: usize = 1024 * 1024;
/// Most producers.
pub const PRODUCERS_MAX: usize = 64;
/// Messages a producer keeps unacknowledged, at most.
pub const WINDOW_MESSAGES: usize = 1024;
/// When the master is killed, as a fraction of the duration.
pub const KILL_AT_FRACTION: f64 = 0.4;
/// Longest wait for the consumer to read everything acknowledged after producing stops.
pub const DRAIN_WAIT_MAX: Duration = Duration::from_secs(60);
/// Longest wait for the cluster to name its first master.
pub const READY_WAIT_MAX: Duration = Duration::from_secs(60);
/// Longest wait for a new master after the kill (only for the report's `new_master`).
const NEW_MASTER_WAIT_MAX: Duration = Duration::from_secs(30);
/// Highest latency the histogram holds (µs); higher values are recorded as this.
const LATENCY_US_MAX: u64 = 3_600_000_000;

/// Arguments of `quire demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// How long to produce (the master is killed at 40% of it).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub duration: Duration,

    /// Bytes per message (at least 12: producer index and sequence).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "1KiB")]
    pub size: u64,

    /// Concurrent producers.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub producers: usize,

    /// Brokers (one master, the others slaves ready to take over).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub brokers: usize,

    /// Event stores.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub stores: usize,

    /// Keep the data directory (printed at the end) for `quire wal` inspection.
    #[arg(long)]
    pub keep: bool,

    /// TLS 1.3 on every link, with a throw-away CA and certificates (as `quire cluster up
    /// --tls`): stores require brokers' client certificates, producers and the consumer
    /// show the cluster's client certificate.
    #[arg(long)]
    pub tls: bool,

    #[command(flatten)]
    pub format: FormatArgs,
}

/// What `quire demo` runs.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Producing period.
    pub duration: Duration,
    /// Bytes per message.
    pub size: usize,
    /// Producers.
    pub producers: usize,
    /// Brokers.
    pub brokers: usize,
    /// Stores.
    pub stores: usize,
    /// Keep the data directory.
    pub keep: bool,
    /// TLS on every link.
    pub tls: bool,
    /// Progress as bars (a terminal) or periodic lines, and to stdout or stderr.
    pub progress: ProgressMode,
}

/// Where progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// indicatif bars on stdout.
    Bars,
    /// A plain line every few seconds on stdout.
    LinesStdout,
    /// A plain line every few seconds on stderr (stdout is for the JSON summary).
    LinesStderr,
}

impl DemoArgs {
    /// The configuration these arguments describe.
    ///
    /// # Errors
    /// A setting out of range (each error names it).
    pub fn to_config(&self) -> anyhow::Result<DemoConfig> {
        let size = usize::try_from(self.size)
            .ok()
            .filter(|s| (HEADER_BYTES..=SIZE_MAX).contains(s))
            .with_context(|| format!("--size must be in {HEADER_BYTES}..={SIZE_MAX} bytes"))?;
        if !(1..=PRODUCERS_MAX).contains(&self.producers) {
            bail!("--producers must be in 1..={PRODUCERS_MAX}");
        }
        if self.brokers < 2 {
            bail!("--brokers must be at least 2: the demo kills the master");
        }
        if self.duration < Duration::from_secs(2) {
            bail!("--duration must be at least 2s");
        }
        let progress = match self.format.format {
            OutputFormat::Text if io::stdout().is_terminal() => ProgressMode::Bars,
            OutputFormat::Text => ProgressMode::LinesStdout,
            _ => ProgressMode::LinesStderr,
        };
        Ok(DemoConfig {
            duration: self.duration,
            size,
            producers: self.producers,
            brokers: self.brokers,
            stores: self.stores,
            keep: self.keep,
            tls: self.tls,
            progress,
        })
    }
}

/// The result of `quire demo`; see the module docs.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub ok: bool,
    pub stores: usize,
    pub brokers: usize,
    pub producers: usize,
    pub size: usize,
    pub acked: u64,
    pub acked_bytes: u64,
    pub failed: u64,
    pub outcome_unknown: u64,
    pub consumed: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    pub misplaced: u64,
    pub failover_ms: Option<f64>,
    pub killed_broker: Option<u16>,
    pub new_master: Option<u16>,
    pub produce_s: f64,
    pub events_per_s: f64,
    pub mb_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub data_dir: Option<PathBuf>,
    /// The first produce error, if any (text only).
    #[serde(skip)]
    pub first_error: Option<String>,
}

impl Report for DemoReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let mb = self.acked_bytes as f64 / 1e6;
        let failover = match (self.failover_ms, self.killed_broker, self.new_master) {
            (Some(ms), Some(k), Some(n)) => {
                format!("{ms:.0} ms (broker {k} killed, broker {n} took over)")
            }
            (Some(ms), _, _) => format!("{ms:.0} ms"),
            (None, Some(k), _) => format!("none seen after broker {k} was killed"),
            (None, None, _) => "no master was killed".to_owned(),
        };
        let mut t = Table::new();
        t.row(
            "cluster",
            format!("{} stores, {} brokers", self.stores, self.brokers),
        )
        .row(
            "load",
            format!("{} producers, {} B messages", self.producers, self.size),
        )
        .row(
            "acknowledged",
            format!(
                "{} messages, {mb:.1} MB in {:.1} s ({} failed, {} outcome unknown)",
                self.acked, self.produce_s, self.failed, self.outcome_unknown
            ),
        )
        .row(
            "throughput",
            format!("{:.0} msgs/s, {:.1} MB/s", self.events_per_s, self.mb_per_s),
        )
        .row(
            "produce latency",
            format!(
                "p50 {} us, p99 {} us, p99.9 {} us, max {} us",
                self.p50_us, self.p99_us, self.p999_us, self.max_us
            ),
        )
        .row("failover", failover)
        .row("consumed", format!("{} messages", self.consumed))
        .row("lost", format!("{} (must be 0)", self.lost))
        .row("duplicates", format!("{} (must be 0)", self.duplicates))
        .row("out of order", format!("{} (must be 0)", self.out_of_order))
        .row("misplaced", format!("{} (must be 0)", self.misplaced));
        if let Some(e) = &self.first_error {
            t.row("first error", e.clone());
        }
        t.write(out)?;
        writeln!(
            out,
            "{}",
            if self.ok {
                "OK: every acknowledged message was consumed exactly once, in order."
            } else {
                "FAILED: see the figures above."
            }
        )?;
        if let Some(d) = &self.data_dir {
            writeln!(out, "data kept in {}", d.display())?;
            writeln!(
                out,
                "inspect a store's log with: quire wal verify {}",
                d.join("store0").display()
            )?;
        }
        Ok(())
    }
}

/// Fails when the report shows a lost, duplicated, reordered or misplaced message, a
/// failed produce, or no failover (the report is printed first).
///
/// # Errors
/// Describing what went wrong.
pub fn check(report: &DemoReport) -> anyhow::Result<()> {
    if report.ok {
        return Ok(());
    }
    bail!(
        "demo failed: {} lost, {} duplicates, {} out of order, {} misplaced, {} failed produces, failover {}",
        report.lost,
        report.duplicates,
        report.out_of_order,
        report.misplaced,
        report.failed,
        report
            .failover_ms
            .map_or_else(|| "not seen".to_owned(), |ms| format!("{ms:.0} ms"))
    )
}

/// The payload of message `seq` of producer `index`, `size` bytes (see the module docs).
#[must_use]
pub fn payload(index: u32, seq: u64, size: usize) -> Bytes {
    assert!(size >= HEADER_BYTES, "payload smaller than its header");
    let mut v = Vec::with_capacity(size);
    v.extend_from_slice(&index.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.resize(size, b'q');
    Bytes::from(v)
}

/// The producer index and sequence a payload carries, if it is long enough.
#[must_use]
pub fn parse_payload(p: &[u8]) -> Option<(u32, u64)> {
    let index = u32::from_le_bytes(p.get(0..4)?.try_into().ok()?);
    let seq = u64::from_le_bytes(p.get(4..12)?.try_into().ok()?);
    Some((index, seq))
}

/// What one producer ended with.
#[derive(Debug)]
struct ProducerOutcome {
    /// Acknowledged offset per sequence (`None`: failed).
    acked: Vec<Option<u64>>,
    latency: Histogram<u64>,
    failed: u64,
    outcome_unknown: u64,
    first_error: Option<String>,
}

/// Counters the progress display and the drain read.
#[derive(Debug)]
struct Live {
    acked: AtomicU64,
    consumed: AtomicU64,
    /// Per producer: 1 + the highest sequence consumed (0: none).
    consumed_next: Vec<AtomicU64>,
    kill_at: OnceLock<Instant>,
    /// Microseconds from the kill to the first ack of a message sent after it.
    failover_us: OnceLock<u64>,
}

/// What the consumer read, per producer: `(sequence, offset)` in consumption order.
#[derive(Debug, Default)]
struct Consumed {
    per_producer: Vec<Vec<(u64, u64)>>,
    foreign: u64,
    error: Option<String>,
}

/// The verdict over what was acknowledged and what was consumed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub consumed: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    pub misplaced: u64,
}

/// Compares one producer's acknowledgements (`acked[seq]` = offset) with what the consumer
/// read of it (`(seq, offset)` in consumption order).
#[must_use]
pub fn verify(acked: &[Option<u64>], consumed: &[(u64, u64)]) -> Verdict {
    let mut v = Verdict::default();
    let mut seen = vec![0u32; acked.len()];
    let mut last: Option<u64> = None;
    for &(seq, offset) in consumed {
        v.consumed += 1;
        let slot = usize::try_from(seq).ok().filter(|s| *s < seen.len());
        if let Some(s) = slot {
            seen[s] += 1;
            if seen[s] > 1 {
                v.duplicates += 1;
                continue;
            }
            if let Some(expected) = acked[s] {
                if expected != offset {
                    v.misplaced += 1;
                }
            }
        }
        if last.is_some_and(|l| seq <= l) {
            v.out_of_order += 1;
        }
        last = Some(last.map_or(seq, |l| l.max(seq)));
    }
    v.lost = acked
        .iter()
        .zip(&seen)
        .filter(|(a, n)| a.is_some() && **n == 0)
        .count() as u64;
    v
}

/// Runs the demo; see the module docs. Progress goes where `config.progress` says; the
/// report is returned for printing.
///
/// # Errors
/// The cluster could not start or name a master, or the runtime could not start. Lost or
/// duplicated messages are not an error here: see [`check`].
pub fn run(config: &DemoConfig) -> anyhow::Result<DemoReport> {
    crate::interrupt::install().context("installing the signal handlers")?;
    let temp = tempfile::Builder::new()
        .prefix("quire-demo-")
        .tempdir()
        .context("creating a temporary directory")?;
    let dir = temp.path().to_owned();
    let say = |line: String| say(config.progress, &line);
    say(format!(
        "starting {} stores and {} brokers (copies of this quire binary) in {}{}",
        config.stores,
        config.brokers,
        dir.display(),
        if config.tls {
            ", TLS 1.3 on every link (certificates in DIR/tls)"
        } else {
            ""
        }
    ));
    let spec = ClusterSpec {
        dir: dir.clone(),
        stores: config.stores,
        brokers: config.brokers,
        base_port: None,
        die_with_parent: true,
        tls: config.tls,
    };
    let mut cluster = LocalCluster::start(&spec)?;
    let status = cluster.wait_ready(READY_WAIT_MAX)?;
    if let Some(m) = &status.master {
        say(format!(
            "cluster ready: master is broker {} at {}; brokers {}",
            m.id,
            m.addr,
            cluster.broker_addrs().join(",")
        ));
    }
    let rt = runtime("demo")?;
    let result = rt.block_on(drive(config, &mut cluster));
    drop(rt);
    let report = cluster.stop(STOP_WAIT_DEFAULT);
    say(format!("cluster stopped: {}", report.summary()));
    // --keep holds on every exit, a failed or interrupted run's included: that is when
    // the data is worth a look with `quire wal`.
    let data_dir = config.keep.then(|| temp.keep());
    if let (Err(_), Some(dir)) = (&result, &data_dir) {
        say(format!("data kept in {}", dir.display()));
    }
    let mut report = result?;
    report.data_dir = data_dir;
    Ok(report)
}

fn say(mode: ProgressMode, line: &str) {
    match mode {
        ProgressMode::LinesStderr => eprintln!("{line}"),
        ProgressMode::Bars | ProgressMode::LinesStdout => {
            let mut out = io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

async fn drive(config: &DemoConfig, cluster: &mut LocalCluster) -> anyhow::Result<DemoReport> {
    let brokers = cluster.broker_addrs();
    let discovery = discovery_config(cluster.client_tls()?);
    let live = Arc::new(Live {
        acked: AtomicU64::new(0),
        consumed: AtomicU64::new(0),
        consumed_next: (0..config.producers).map(|_| AtomicU64::new(0)).collect(),
        kill_at: OnceLock::new(),
        failover_us: OnceLock::new(),
    });
    let stop_consumer = Arc::new(AtomicBool::new(false));
    let consumer = {
        let consumer = Consumer::subscribe(
            brokers.clone(),
            TOPIC,
            StartFrom::Beginning,
            ConsumerConfig {
                fetch_wait_ms: 200,
                discovery: discovery.clone(),
                ..ConsumerConfig::default()
            },
        )
        .await
        .context("subscribing the consumer")?;
        tokio::spawn(consume(
            consumer,
            config.producers,
            live.clone(),
            stop_consumer.clone(),
        ))
    };
    let start = Instant::now();
    let end = start + config.duration;
    let mut producers = Vec::new();
    for index in 0..config.producers {
        let producer = Producer::connect(
            brokers.clone(),
            ProducerConfig {
                batch_bytes_max: 256 * 1024,
                in_flight_batches_max: 8,
                buffer_bytes_max: 32 * 1024 * 1024,
                discovery: discovery.clone(),
                ..ProducerConfig::default()
            },
        )
        .await
        .context("connecting a producer")?;
        let index = u32::try_from(index).expect("invariant: at most PRODUCERS_MAX producers");
        producers.push(tokio::spawn(produce(
            producer,
            index,
            config.size,
            end,
            live.clone(),
        )));
    }

    let progress = Progress::new(config.progress, config.duration);
    let kill_time = start + config.duration.mul_f64(KILL_AT_FRACTION);
    let mut killed_broker = None;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let now = Instant::now();
        if crate::interrupt::is_interrupted() {
            progress.finish();
            bail!(crate::interrupt::Interrupted);
        }
        if killed_broker.is_none() && now >= kill_time {
            let master = master_id(&brokers, &discovery).await?;
            let pid = cluster.kill_broker(master)?;
            let _ = live.kill_at.set(Instant::now());
            killed_broker = Some(master);
            progress.println(&format!(
                "killed the master, broker {master} (pid {pid}), with SIGKILL; producers carry on"
            ));
        }
        progress.update(&live, now.saturating_duration_since(start));
        if now >= end {
            break;
        }
    }
    progress.println("producing stopped; waiting for the last acknowledgements");
    let mut outcomes = Vec::new();
    for p in producers {
        outcomes.push(p.await.context("a producer task panicked")?);
    }
    let produce_s = start.elapsed().as_secs_f64();
    let new_master =
        match tokio::time::timeout(NEW_MASTER_WAIT_MAX, master_id(&brokers, &discovery)).await {
            Ok(Ok(id)) => Some(id),
            _ => None,
        };

    // Drain: until the consumer has read past each producer's last acknowledged message.
    let targets: Vec<u64> = outcomes
        .iter()
        .map(|o| {
            o.acked
                .iter()
                .rposition(Option::is_some)
                .map_or(0, |s| s as u64 + 1)
        })
        .collect();
    let drain_end = Instant::now() + DRAIN_WAIT_MAX;
    progress.println("draining the consumer");
    loop {
        let done = targets
            .iter()
            .zip(&live.consumed_next)
            .all(|(t, c)| c.load(Ordering::Relaxed) >= *t);
        if done || Instant::now() >= drain_end || crate::interrupt::is_interrupted() {
            break;
        }
        progress.update(&live, start.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_consumer.store(true, Ordering::Relaxed);
    let consumed = consumer.await.context("the consumer task panicked")?;
    progress.update(&live, start.elapsed());
    progress.finish();
    if crate::interrupt::is_interrupted() {
        bail!(crate::interrupt::Interrupted);
    }
    Ok(assemble(
        config,
        &outcomes,
        &consumed,
        live.failover_us.get().copied(),
        killed_broker,
        new_master,
        produce_s,
    ))
}

fn assemble(
    config: &DemoConfig,
    outcomes: &[ProducerOutcome],
    consumed: &Consumed,
    failover_us: Option<u64>,
    killed_broker: Option<u16>,
    new_master: Option<u16>,
    produce_s: f64,
) -> DemoReport {
    let mut latency = Histogram::<u64>::new_with_bounds(1, LATENCY_US_MAX, 3)
        .expect("invariant: valid histogram bounds");
    let mut total = Verdict::default();
    let (mut acked, mut failed, mut unknown) = (0u64, 0u64, 0u64);
    let mut first_error = consumed.error.clone();
    for (i, o) in outcomes.iter().enumerate() {
        let _ = latency.add(&o.latency);
        acked += o.acked.iter().filter(|a| a.is_some()).count() as u64;
        failed += o.failed;
        unknown += o.outcome_unknown;
        if first_error.is_none() {
            first_error.clone_from(&o.first_error);
        }
        let empty = Vec::new();
        let read = consumed.per_producer.get(i).unwrap_or(&empty);
        let v = verify(&o.acked, read);
        total.consumed += v.consumed;
        total.lost += v.lost;
        total.duplicates += v.duplicates;
        total.out_of_order += v.out_of_order;
        total.misplaced += v.misplaced;
    }
    total.consumed += consumed.foreign;
    let acked_bytes = acked * config.size as u64;
    let failover_ms = failover_us.map(|us| us as f64 / 1000.0);
    let ok = total.lost == 0
        && total.duplicates == 0
        && total.out_of_order == 0
        && total.misplaced == 0
        && consumed.foreign == 0
        && failed == 0
        && acked > 0
        && failover_ms.is_some();
    DemoReport {
        ok,
        stores: config.stores,
        brokers: config.brokers,
        producers: config.producers,
        size: config.size,
        acked,
        acked_bytes,
        failed,
        outcome_unknown: unknown,
        consumed: total.consumed,
        lost: total.lost,
        duplicates: total.duplicates,
        out_of_order: total.out_of_order,
        misplaced: total.misplaced,
        failover_ms,
        killed_broker,
        new_master,
        produce_s,
        events_per_s: acked as f64 / produce_s.max(1e-9),
        mb_per_s: acked_bytes as f64 / 1e6 / produce_s.max(1e-9),
        p50_us: latency.value_at_quantile(0.50),
        p99_us: latency.value_at_quantile(0.99),
        p999_us: latency.value_at_quantile(0.999),
        max_us: latency.max(),
        data_dir: None,
        first_error,
    }
}

/// The default discovery, over `tls` when the cluster has it.
fn discovery_config(tls: Option<quire_tls::TlsConnector>) -> DiscoveryConfig {
    let d = DiscoveryConfig::default();
    DiscoveryConfig {
        conn: quire_client::ConnConfig {
            tls: tls.map(|t| t.expecting(quire_tls::Role::Broker)),
            ..d.conn
        },
        ..d
    }
}

/// The id of the broker that names itself master (discovery confirms it with the broker
/// itself), bounded by the discovery timeout.
async fn master_id(brokers: &[String], config: &DiscoveryConfig) -> anyhow::Result<u16> {
    let discovery = Discovery::new(brokers.to_vec(), config.clone())?;
    let master = discovery
        .find_master(None)
        .await
        .context("finding the master")?;
    Ok(master.master.id.0)
}

/// One producer: sends until `end`, at most [`WINDOW_MESSAGES`] unacknowledged; a
/// collector awaits the deliveries in send order.
async fn produce(
    producer: Producer,
    index: u32,
    size: usize,
    end: Instant,
    live: Arc<Live>,
) -> ProducerOutcome {
    let window = Arc::new(Semaphore::new(WINDOW_MESSAGES));
    let (tx, mut rx) = mpsc::channel::<(u64, Instant, Delivery, tokio::sync::OwnedSemaphorePermit)>(
        WINDOW_MESSAGES,
    );
    let collector_live = live.clone();
    let collector = tokio::spawn(async move {
        let live = collector_live;
        let mut o = ProducerOutcome {
            acked: Vec::new(),
            latency: Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
                .expect("invariant: valid histogram bounds"),
            failed: 0,
            outcome_unknown: 0,
            first_error: None,
        };
        while let Some((seq, sent, delivery, permit)) = rx.recv().await {
            let result = delivery.await;
            let now = Instant::now();
            drop(permit);
            debug_assert_eq!(o.acked.len() as u64, seq);
            match result {
                Ok(offset) => {
                    let us = u64::try_from(now.duration_since(sent).as_micros())
                        .unwrap_or(u64::MAX)
                        .clamp(1, LATENCY_US_MAX);
                    let _ = o.latency.record(us);
                    o.acked.push(Some(offset.0));
                    live.acked.fetch_add(1, Ordering::Relaxed);
                    if let Some(kill) = live.kill_at.get() {
                        if sent >= *kill {
                            let us = u64::try_from(now.duration_since(*kill).as_micros())
                                .unwrap_or(u64::MAX);
                            let _ = live.failover_us.set(us);
                        }
                    }
                }
                Err(e) => {
                    o.acked.push(None);
                    o.failed += 1;
                    if e.is_outcome_unknown() {
                        o.outcome_unknown += 1;
                    }
                    if o.first_error.is_none() {
                        o.first_error = Some(e.to_string());
                    }
                }
            }
        }
        o
    });
    let mut seq = 0u64;
    let mut send_error: Option<ProduceError> = None;
    while Instant::now() < end && !crate::interrupt::is_interrupted() {
        let Ok(permit) = window.clone().acquire_owned().await else {
            break;
        };
        let sent = Instant::now();
        match producer.send(TOPIC, payload(index, seq, size)).await {
            Ok(delivery) => {
                if tx.send((seq, sent, delivery, permit)).await.is_err() {
                    break;
                }
                seq += 1;
            }
            Err(e) => {
                send_error = Some(e);
                break;
            }
        }
    }
    drop(tx);
    let _ = producer.flush().await;
    let mut outcome = match collector.await {
        Ok(o) => o,
        Err(e) => ProducerOutcome {
            acked: Vec::new(),
            latency: Histogram::new(3).expect("invariant: valid histogram precision"),
            failed: 1,
            outcome_unknown: 0,
            first_error: Some(format!("collector task failed: {e}")),
        },
    };
    if let Some(e) = send_error {
        outcome.failed += 1;
        outcome.first_error.get_or_insert_with(|| e.to_string());
    }
    outcome
}

/// The consumer: reads until told to stop, then until one long poll (200 ms) finds nothing,
/// so trailing duplicates would be seen too. Never cancels a poll mid-flight.
async fn consume(
    mut consumer: Consumer,
    producers: usize,
    live: Arc<Live>,
    stop: Arc<AtomicBool>,
) -> Consumed {
    let mut c = Consumed {
        per_producer: vec![Vec::new(); producers],
        ..Consumed::default()
    };
    loop {
        // Read before polling: a poll that finds nothing after the stop was seen ends it.
        let stopping = stop.load(Ordering::Relaxed);
        let batch = match consumer.poll().await {
            Ok(b) => b,
            Err(e) => {
                c.error = Some(format!("consumer: {e}"));
                break;
            }
        };
        if batch.is_empty() && stopping {
            break;
        }
        for m in batch {
            live.consumed.fetch_add(1, Ordering::Relaxed);
            match parse_payload(&m.payload) {
                Some((index, seq)) if (index as usize) < producers => {
                    c.per_producer[index as usize].push((seq, m.offset.0));
                    live.consumed_next[index as usize].fetch_max(seq + 1, Ordering::Relaxed);
                }
                _ => c.foreign += 1,
            }
        }
    }
    c
}

/// Bars on a terminal, plain lines otherwise.
#[derive(Debug)]
struct Progress {
    mode: ProgressMode,
    bar: Option<ProgressBar>,
    last_line: std::sync::Mutex<Option<Instant>>,
}

impl Progress {
    fn new(mode: ProgressMode, duration: Duration) -> Progress {
        let bar = (mode == ProgressMode::Bars).then(|| {
            let bar = ProgressBar::with_draw_target(
                Some(duration.as_millis() as u64),
                ProgressDrawTarget::stdout(),
            );
            bar.set_style(
                ProgressStyle::with_template("{bar:30.cyan/blue} {elapsed:>4} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        });
        Progress {
            mode,
            bar,
            last_line: std::sync::Mutex::new(None),
        }
    }

    fn update(&self, live: &Live, elapsed: Duration) {
        let acked = live.acked.load(Ordering::Relaxed);
        let consumed = live.consumed.load(Ordering::Relaxed);
        let rate = acked as f64 / elapsed.as_secs_f64().max(1e-3);
        let msg = format!("acked {acked} ({rate:.0}/s), consumed {consumed}");
        if let Some(bar) = &self.bar {
            bar.set_position((elapsed.as_millis() as u64).min(bar.length().unwrap_or(0)));
            bar.set_message(msg);
            return;
        }
        let mut last = self.last_line.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if last.is_none_or(|l| now.duration_since(l) >= Duration::from_secs(2)) {
            *last = Some(now);
            say(
                self.mode,
                &format!("{:>5.1} s  {msg}", elapsed.as_secs_f64()),
            );
        }
    }

    fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => say(self.mode, line),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        let p = payload(3, 0x0102_0304_0506, 64);
        assert_eq!(p.len(), 64);
        assert_eq!(parse_payload(&p), Some((3, 0x0102_0304_0506)));
        assert_eq!(parse_payload(&p[..11]), None);
    }

    #[test]
    fn verify_counts_each_kind_of_fault() {
        let acked = vec![Some(10), Some(11), Some(12), None, Some(14)];
        let clean = verify(&acked, &[(0, 10), (1, 11), (2, 12), (4, 14)]);
        assert_eq!(
            clean,
            Verdict {
                consumed: 4,
                ..Verdict::default()
            }
        );

        let lost = verify(&acked, &[(0, 10), (2, 12), (4, 14)]);
        assert_eq!(lost.lost, 1);

        let dup = verify(&acked, &[(0, 10), (1, 11), (1, 11), (2, 12), (4, 14)]);
        assert_eq!((dup.duplicates, dup.lost, dup.out_of_order), (1, 0, 0));

        let reordered = verify(&acked, &[(0, 10), (2, 12), (1, 11), (4, 14)]);
        assert_eq!((reordered.out_of_order, reordered.lost), (1, 0));

        let moved = verify(&acked, &[(0, 10), (1, 99), (2, 12), (4, 14)]);
        assert_eq!(moved.misplaced, 1);

        // A message whose outcome was unknown may be consumed: not a fault.
        let extra = verify(&acked, &[(0, 10), (1, 11), (2, 12), (3, 13), (4, 14)]);
        assert_eq!(
            extra,
            Verdict {
                consumed: 5,
                ..Verdict::default()
            }
        );
    }
}
