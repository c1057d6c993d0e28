//! `quire bench cluster`: produce-to-stabilized-ack throughput and latency of a running
//! cluster, measured from a client (`quire_client::Producer`).
//!
//! This module owns the load generator and its measurement; it starts no servers (start a
//! cluster with `quire node run` / `quire broker run`).
//!
//! # What is measured
//! `--producers N` producers (each its own connection to the master, own producer id) send
//! `--event-size` byte messages to one topic for `--duration`. A message's **latency** runs
//! from its send to its acknowledgement — the master acks only once the message is
//! **stabilized** (persisted by a quorum of stores) — in microseconds, recorded in an HDR
//! histogram (3 significant digits). **Throughput** counts acknowledged messages (`ops`,
//! one message = one event in the log) over the time from the start of the measured
//! period to the last acknowledgement; messages still in flight at the deadline are waited
//! for and counted. `mb_per_s` counts payload bytes, MB = 10^6 bytes.
//!
//! - **Closed loop** (default): each producer keeps at most `batch × (in_flight + 1)`
//!   messages unacknowledged and sends the next as soon as one is acknowledged. This
//!   measures the cluster's capacity; its latency includes waiting in the producer's queue.
//! - **Fixed rate** (`--rate R`, messages/s in total, spread evenly over the producers): the
//!   i-th message of a producer is *intended* at `start + i / (R / N)` (producers offset
//!   from each other), and its latency is measured **from that intended time**, not from
//!   when it was actually sent. A stall therefore counts against every message it delayed
//!   (no coordinated omission). The sender wakes on Tokio's 1 ms timer and sends what is
//!   due in a burst; that wake-up delay is part of the measured latency.
//!
//! A message's latency is taken when the collector (which awaits deliveries in send order)
//! sees it; a message acknowledged before an earlier one is timed at the earlier one's ack.
//! With `--warmup W`, the producers run for `W` before the measured period; nothing of the
//! warm-up is counted.
//!
//! `cpu_s` is this process's user + system CPU time (getrusage) over the measured period and
//! its drain: the client's cost, not the servers'. With `--cluster-dir DIR` (a cluster
//! started here by `quire cluster up --detach --dir DIR`) the report adds the servers'
//! cost over the same window: each process's CPU time and minor page faults from
//! `/proc/PID/stat` ([`super::servers`]), all servers' CPU-µs per message and the master's
//! minor faults per message.
//!
//! # `--hdr-out FILE`
//! Writes the latency histogram as an HdrHistogram **interval log** (the format of the Java
//! `HistogramLogWriter`, readable by `HistogramLogProcessor`, HdrHistogram's plotters and
//! `hdrhistogram::serialization::interval_log` in Rust): comment lines, a `StartTime`, then
//! one interval covering the measured period, tagged `produce-to-ack`, histogram in V2
//! deflate-compressed form, base64. Values are **microseconds** (the max column is in
//! milliseconds: `MaxValueDivisor` 1000).
//!
//! # JSON output (`--format json`): one object, stable field names
//! | field | unit / values |
//! | --- | --- |
//! | `bench` | `"cluster"` |
//! | `mode` | `"closed_loop"` or `"fixed_rate"` |
//! | `brokers`, `topic` | as given |
//! | `producers`, `event_size`, `batch`, `in_flight`, `linger_ms` | settings (bytes, messages, ms) |
//! | `target_rate` | messages/s, or `null` in closed loop |
//! | `warmup_s`, `duration_s` | seconds; `duration_s` is the measured period incl. drain |
//! | `ops`, `bytes`, `errors` | acknowledged messages, their payload bytes, failed messages |
//! | `ops_per_s`, `mb_per_s`, `mib_per_s` | per second (MB = 10^6, MiB = 2^20 bytes) |
//! | `mean_us`, `p50_us`, `p99_us`, `p999_us`, `max_us` | send → ack latency, microseconds |
//! | `cpu_s`, `cpu_user_s`, `cpu_sys_s` | CPU seconds of this process |
//! | `cpu_s_per_gb` | `cpu_s` per 10^9 payload bytes acknowledged |
//! | `hdr_out` | the file written, or `null` |
//! | `servers` | with `--cluster-dir`: `[{name, role, master, cpu_s, minor_faults}]` per process, else `null` |
//! | `servers_cpu_us_per_msg` | with `--cluster-dir`: all servers' CPU microseconds per acknowledged message |
//! | `master_minor_faults_per_msg` | with `--cluster-dir`: the master's minor page faults per acknowledged message |

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::Histogram;
use quire_client::producer::IN_FLIGHT_BATCHES_MAX;
use quire_client::{Delivery, Discovery, ProduceError, Producer, ProducerConfig};
use quire_proto::{MESSAGES_PER_FRAME_MAX, MESSAGE_BYTES_MAX};
use serde::Serialize;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::servers::{self, ServerUsage};
use crate::cli::FormatArgs;
use crate::cluster::master::{self, ConnectArgs, MasterBound};
use crate::cluster::{runtime, BrokersArgs};
use crate::output::{Report, Table};
use crate::units::{parse_duration, parse_size};

/// Highest latency the histogram holds, in microseconds (one hour); higher values are
/// recorded as this.
pub const LATENCY_US_MAX: u64 = 3_600_000_000;

/// Most producers one run starts.
pub const PRODUCERS_MAX: usize = 1024;

/// Sent messages a collector has not yet seen acknowledged, at most (fixed-rate mode; the
/// closed loop has its window). The producer's buffer bounds the bytes.
const PENDING_MAX: usize = 1 << 20;

/// Arguments of `quire bench cluster`.
#[derive(Debug, Clone, Args)]
pub struct ClusterBenchArgs {
    #[command(flatten)]
    pub brokers: BrokersArgs,

    #[command(flatten)]
    pub connect: ConnectArgs,

    /// Topic to produce to.
    #[arg(short = 't', long, value_name = "TOPIC", default_value = "bench")]
    pub topic: String,

    /// Concurrent producers (each its own connection and producer id).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub producers: usize,

    /// Bytes per message (one message = one event).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "1KiB")]
    pub event_size: u64,

    /// Messages per produce request (the producer's batch).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub batch: usize,

    /// Produce requests in flight per producer.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub in_flight: usize,

    /// How long a batch waits for more messages after its first one.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5ms")]
    pub linger: Duration,

    /// How long to measure.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub duration: Duration,

    /// How long to run before measuring (not counted).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "0s")]
    pub warmup: Duration,

    /// Fixed total rate in messages per second, latency from each message's intended send
    /// time; default: closed loop, as fast as acks come back.
    #[arg(long, value_name = "MSGS_PER_S")]
    pub rate: Option<u64>,

    /// Write the latency histogram (microseconds) to FILE as an HdrHistogram interval log.
    #[arg(long, value_name = "FILE")]
    pub hdr_out: Option<PathBuf>,

    /// The directory of a cluster started on this machine with `quire cluster up --detach
    /// --dir DIR`: the report adds each of its processes' CPU time and minor page faults
    /// over the measured period (from /proc/PID/stat), per message.
    #[arg(long, value_name = "DIR")]
    pub cluster_dir: Option<PathBuf>,

    #[command(flatten)]
    pub format: FormatArgs,
}

/// What `quire bench cluster` runs.
#[derive(Debug, Clone)]
pub struct ClusterBenchConfig {
    /// Broker addresses.
    pub brokers: Vec<String>,
    /// How long to look for the master before the run starts.
    pub connect: MasterBound,
    /// Topic.
    pub topic: String,
    /// Producers.
    pub producers: usize,
    /// Bytes per message.
    pub event_size: usize,
    /// Messages per produce request.
    pub batch: usize,
    /// Requests in flight per producer.
    pub in_flight: usize,
    /// Producer linger.
    pub linger: Duration,
    /// Measured period.
    pub duration: Duration,
    /// Unmeasured period before it.
    pub warmup: Duration,
    /// Total messages per second, or closed loop.
    pub rate: Option<u64>,
    /// Interval log to write.
    pub hdr_out: Option<PathBuf>,
    /// A local cluster's directory, whose processes' usage the report adds.
    pub cluster_dir: Option<PathBuf>,
}

impl ClusterBenchArgs {
    fn connect_bound(&self) -> anyhow::Result<MasterBound> {
        Ok(MasterBound {
            tls: self.brokers.tls()?,
            sasl: self.brokers.sasl()?,
            ..self.connect.bound()
        })
    }

    /// The configuration these arguments describe.
    ///
    /// # Errors
    /// A setting out of range (each error names it).
    pub fn to_config(&self) -> anyhow::Result<ClusterBenchConfig> {
        if !(1..=PRODUCERS_MAX).contains(&self.producers) {
            bail!("--producers must be in 1..={PRODUCERS_MAX}");
        }
        let event_size = usize::try_from(self.event_size)
            .ok()
            .filter(|s| *s <= MESSAGE_BYTES_MAX)
            .with_context(|| format!("--event-size must be at most {MESSAGE_BYTES_MAX} bytes"))?;
        if !(1..=MESSAGES_PER_FRAME_MAX).contains(&self.batch) {
            bail!("--batch must be in 1..={MESSAGES_PER_FRAME_MAX}");
        }
        if !(1..=IN_FLIGHT_BATCHES_MAX).contains(&self.in_flight) {
            bail!("--in-flight must be in 1..={IN_FLIGHT_BATCHES_MAX}");
        }
        if self.duration.is_zero() {
            bail!("--duration must be above 0");
        }
        if self.rate == Some(0) {
            bail!("--rate must be above 0 (leave it out for a closed loop)");
        }
        Ok(ClusterBenchConfig {
            brokers: self.brokers.addrs(),
            connect: self.connect_bound()?,
            topic: self.topic.clone(),
            producers: self.producers,
            event_size,
            batch: self.batch,
            in_flight: self.in_flight,
            linger: self.linger,
            duration: self.duration,
            warmup: self.warmup,
            rate: self.rate,
            hdr_out: self.hdr_out.clone(),
            cluster_dir: self.cluster_dir.clone(),
        })
    }
}

impl ClusterBenchConfig {
    fn producer_config(&self) -> ProducerConfig {
        let batch_bytes = self
            .batch
            .saturating_mul(self.event_size + 4)
            .clamp(1, MESSAGE_BYTES_MAX);
        let defaults = ProducerConfig::default();
        ProducerConfig {
            batch_bytes_max: batch_bytes,
            batch_messages_max: self.batch,
            in_flight_batches_max: self.in_flight,
            linger_ms: u64::try_from(self.linger.as_millis()).unwrap_or(u64::MAX),
            discovery: self.connect.discovery_config(defaults.discovery.clone()),
            buffer_bytes_max: defaults
                .buffer_bytes_max
                .max(batch_bytes.saturating_mul(self.in_flight + 1))
                .min(u32::MAX as usize),
            ..defaults
        }
    }
}

/// The result of `quire bench cluster`; see the module docs for the fields.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterBenchReport {
    pub bench: &'static str,
    pub mode: &'static str,
    pub brokers: Vec<String>,
    pub topic: String,
    pub producers: usize,
    pub event_size: usize,
    pub batch: usize,
    pub in_flight: usize,
    pub linger_ms: f64,
    pub target_rate: Option<u64>,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub ops: u64,
    pub bytes: u64,
    pub errors: u64,
    pub ops_per_s: f64,
    pub mb_per_s: f64,
    pub mib_per_s: f64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub cpu_s: f64,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    pub cpu_s_per_gb: f64,
    pub hdr_out: Option<PathBuf>,
    /// Each server's CPU and minor faults over the measured period (`--cluster-dir`).
    pub servers: Option<Vec<ServerUsage>>,
    /// All servers' CPU per acknowledged message, microseconds (`--cluster-dir`).
    pub servers_cpu_us_per_msg: Option<f64>,
    /// The master's minor page faults per acknowledged message (`--cluster-dir`).
    pub master_minor_faults_per_msg: Option<f64>,
    /// The first error met, if any (not in JSON: see `errors`).
    #[serde(skip)]
    pub first_error: Option<String>,
}

impl Report for ClusterBenchReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let mode = match self.target_rate {
            Some(r) => format!("fixed rate {r} msgs/s (latency from intended send time)"),
            None => "closed loop".to_owned(),
        };
        let mut t = Table::new();
        t.row("cluster", self.brokers.join(","))
            .row(
                "load",
                format!(
                    "{} producer(s), {} B messages, batch {}, {} in flight, {mode}",
                    self.producers, self.event_size, self.batch, self.in_flight
                ),
            )
            .row("measured", format!("{:.3} s", self.duration_s))
            .row(
                "acknowledged",
                format!("{} messages ({} failed)", self.ops, self.errors),
            )
            .row(
                "throughput",
                format!(
                    "{:.0} msgs/s, {:.1} MB/s ({:.1} MiB/s)",
                    self.ops_per_s, self.mb_per_s, self.mib_per_s
                ),
            )
            .row(
                "latency",
                format!(
                    "mean {:.0} us, p50 {} us, p99 {} us, p99.9 {} us, max {} us",
                    self.mean_us, self.p50_us, self.p99_us, self.p999_us, self.max_us
                ),
            )
            .row(
                "client cpu",
                format!(
                    "{:.2} s ({:.2} user, {:.2} sys), {:.1} s per GB",
                    self.cpu_s, self.cpu_user_s, self.cpu_sys_s, self.cpu_s_per_gb
                ),
            );
        if let Some(servers) = &self.servers {
            if let Some(us) = self.servers_cpu_us_per_msg {
                t.row(
                    "servers cpu",
                    format!("{us:.1} CPU-us per message, {} processes", servers.len()),
                );
            }
            let per_msg = |n: u64| n as f64 / self.ops.max(1) as f64;
            for s in servers {
                t.row(
                    format!("  {}{}", s.name, if s.master { " (master)" } else { "" }),
                    format!(
                        "{:.2} cpu s, {} minor faults ({:.4} per message)",
                        s.cpu_s,
                        s.minor_faults,
                        per_msg(s.minor_faults)
                    ),
                );
            }
        }
        if let Some(p) = &self.hdr_out {
            t.row("histogram", p.display().to_string());
        }
        t.write(out)
    }
}

/// Fails when any message failed: a run with failures is not a valid measurement (the
/// report is printed first).
///
/// # Errors
/// `report.errors > 0`.
pub fn check(report: &ClusterBenchReport) -> anyhow::Result<()> {
    if report.errors > 0 {
        bail!(
            "{} message(s) failed during the run{}",
            report.errors,
            report
                .first_error
                .as_ref()
                .map_or_else(String::new, |e| format!("; first error: {e}"))
        );
    }
    Ok(())
}

/// CPU time of this process so far: (user, system) seconds.
#[must_use]
pub fn cpu_times() -> (f64, f64) {
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage owned by this frame.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return (0.0, 0.0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(usage.ru_utime), secs(usage.ru_stime))
}

/// What one producer measured.
#[derive(Debug)]
struct ProducerResult {
    histogram: Histogram<u64>,
    ops: u64,
    errors: u64,
    last_ack: Option<Instant>,
    first_error: Option<String>,
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
        .expect("invariant: 1 ..= LATENCY_US_MAX with 3 digits is a valid histogram")
}

/// The timing of a run, shared by every producer.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    /// When sending starts (warm-up begins).
    start: Instant,
    /// When measuring starts.
    measure_from: Instant,
    /// When sending stops.
    end: Instant,
}

type Pending = (
    Instant,
    Result<Delivery, ProduceError>,
    Option<OwnedSemaphorePermit>,
);

/// Runs the benchmark against a running cluster.
///
/// # Errors
/// No master, no message acknowledged, the histogram file failing.
pub fn run(config: &ClusterBenchConfig) -> anyhow::Result<ClusterBenchReport> {
    let rt = runtime("bench")?;
    rt.block_on(bench(config))
}

async fn bench(config: &ClusterBenchConfig) -> anyhow::Result<ClusterBenchReport> {
    let producer_config = config.producer_config();
    producer_config
        .validate()
        .context("the producers' settings")?;
    let discovery = Discovery::new(config.brokers.clone(), producer_config.discovery.clone())
        .context("reading --brokers")?;
    let mut producers = Vec::with_capacity(config.producers);
    let mut master_addr = None;
    for _ in 0..config.producers {
        // Each producer its own connection (every search opens new ones); an unreachable
        // master is noted on stderr at once.
        let found = master::find_master_noting(&discovery, config.connect.clone())
            .await
            .context("connecting a producer to the master")?;
        master_addr.get_or_insert_with(|| found.master.addr.clone());
        producers.push(Producer::start(
            discovery.clone(),
            Some(found),
            producer_config.clone(),
        ));
    }
    let payload = Bytes::from(vec![b'q'; config.event_size]);
    let start = Instant::now();
    let schedule = Schedule {
        start,
        measure_from: start + config.warmup,
        end: start + config.warmup + config.duration,
    };
    let count = config.producers;
    let mut tasks = Vec::with_capacity(count);
    for (i, p) in producers.into_iter().enumerate() {
        let topic = config.topic.clone();
        let payload = payload.clone();
        let window = config.batch.saturating_mul(config.in_flight + 1);
        // This producer's share of the rate, and its phase within one interval.
        let pacing = config.rate.map(|r| {
            let per_producer = r as f64 / count as f64;
            let interval = Duration::from_secs_f64(1.0 / per_producer);
            (interval, interval.mul_f64(i as f64 / count as f64))
        });
        tasks.push(tokio::spawn(async move {
            drive(p, topic, payload, schedule, window, pacing).await
        }));
    }
    tokio::time::sleep_until(schedule.measure_from).await;
    let (user0, sys0) = cpu_times();
    let servers0 = config
        .cluster_dir
        .as_deref()
        .map(servers::sample)
        .transpose()?;
    let mut histogram = new_histogram();
    let (mut ops, mut errors) = (0u64, 0u64);
    let mut last_ack: Option<Instant> = None;
    let mut first_error = None;
    for t in tasks {
        let r = t.await.context("a producer task failed")?;
        histogram.add(&r.histogram).context("merging histograms")?;
        ops += r.ops;
        errors += r.errors;
        last_ack = last_ack.max(r.last_ack);
        if first_error.is_none() {
            first_error = r.first_error;
        }
    }
    let (user1, sys1) = cpu_times();
    let servers = match (&servers0, config.cluster_dir.as_deref()) {
        (Some(before), Some(dir)) => Some(servers::usage(
            before,
            &servers::sample(dir)?,
            master_addr.as_deref(),
        )),
        _ => None,
    };
    let Some(last_ack) = last_ack else {
        bail!(
            "no message was acknowledged ({errors} failed{})",
            first_error.map_or_else(String::new, |e| format!("; first error: {e}"))
        );
    };
    let elapsed = last_ack
        .saturating_duration_since(schedule.measure_from)
        .max(config.duration)
        .as_secs_f64();
    let bytes = ops * config.event_size as u64;
    let (cpu_user_s, cpu_sys_s) = (user1 - user0, sys1 - sys0);
    let cpu_s = cpu_user_s + cpu_sys_s;
    if let Some(path) = &config.hdr_out {
        write_interval_log(path, &histogram, config, elapsed)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ClusterBenchReport {
        bench: "cluster",
        mode: if config.rate.is_some() {
            "fixed_rate"
        } else {
            "closed_loop"
        },
        brokers: config.brokers.clone(),
        topic: config.topic.clone(),
        producers: config.producers,
        event_size: config.event_size,
        batch: config.batch,
        in_flight: config.in_flight,
        linger_ms: config.linger.as_secs_f64() * 1e3,
        target_rate: config.rate,
        warmup_s: config.warmup.as_secs_f64(),
        duration_s: elapsed,
        ops,
        bytes,
        errors,
        ops_per_s: ops as f64 / elapsed,
        mb_per_s: bytes as f64 / elapsed / 1e6,
        mib_per_s: bytes as f64 / elapsed / f64::from(1u32 << 20),
        mean_us: histogram.mean(),
        p50_us: histogram.value_at_quantile(0.50),
        p99_us: histogram.value_at_quantile(0.99),
        p999_us: histogram.value_at_quantile(0.999),
        max_us: histogram.max(),
        cpu_s,
        cpu_user_s,
        cpu_sys_s,
        cpu_s_per_gb: if bytes > 0 {
            cpu_s / (bytes as f64 / 1e9)
        } else {
            0.0
        },
        hdr_out: config.hdr_out.clone(),
        servers_cpu_us_per_msg: servers
            .as_ref()
            .map(|s| s.iter().map(|s| s.cpu_s).sum::<f64>() * 1e6 / ops.max(1) as f64),
        master_minor_faults_per_msg: servers.as_ref().and_then(|s| {
            s.iter()
                .find(|s| s.master)
                .map(|m| m.minor_faults as f64 / ops.max(1) as f64)
        }),
        servers,
        first_error,
    })
}

/// One producer's sender and collector, run together on one task.
async fn drive(
    producer: Producer,
    topic: String,
    payload: Bytes,
    schedule: Schedule,
    window: usize,
    pacing: Option<(Duration, Duration)>,
) -> ProducerResult {
    // In closed loop the window bounds what is pending; at a fixed rate only the producer's
    // buffer does, so a slow ack never holds back the schedule.
    let pending_max = if pacing.is_some() {
        PENDING_MAX
    } else {
        window.clamp(1, PENDING_MAX)
    };
    let (tx, mut rx) = mpsc::channel::<Pending>(pending_max);
    let window = Arc::new(Semaphore::new(window.max(1)));
    let sender = async {
        let mut i: u32 = 0;
        loop {
            let (intended, permit) = match pacing {
                None => {
                    let Ok(permit) = window.clone().acquire_owned().await else {
                        break;
                    };
                    (Instant::now(), Some(permit))
                }
                Some((interval, phase)) => {
                    let at = schedule.start + phase + interval * i;
                    i = i.saturating_add(1);
                    if at > Instant::now() {
                        tokio::time::sleep_until(at).await;
                    }
                    (at, None)
                }
            };
            if intended >= schedule.end {
                break;
            }
            let sent = producer.send(&topic, payload.clone()).await;
            if tx.send((intended, sent, permit)).await.is_err() {
                break;
            }
        }
        drop(tx);
    };
    let collector = async {
        let mut r = ProducerResult {
            histogram: new_histogram(),
            ops: 0,
            errors: 0,
            last_ack: None,
            first_error: None,
        };
        while let Some((intended, sent, permit)) = rx.recv().await {
            let outcome = match sent {
                Ok(delivery) => delivery.await,
                Err(e) => Err(e),
            };
            let now = Instant::now();
            drop(permit);
            if intended < schedule.measure_from {
                continue;
            }
            match outcome {
                Ok(_) => {
                    let us = u64::try_from(now.saturating_duration_since(intended).as_micros())
                        .unwrap_or(u64::MAX)
                        .clamp(1, LATENCY_US_MAX);
                    r.histogram.saturating_record(us);
                    r.ops += 1;
                    r.last_ack = Some(now);
                }
                Err(e) => {
                    r.errors += 1;
                    if r.first_error.is_none() {
                        r.first_error = Some(e.to_string());
                    }
                }
            }
        }
        r
    };
    let ((), result) = tokio::join!(sender, collector);
    if let Err(e) = producer.close().await {
        tracing::warn!(error = %e, "closing a producer");
    }
    result
}

/// Writes `histogram` as an HdrHistogram interval log with one interval (see the module
/// docs).
fn write_interval_log(
    path: &std::path::Path,
    histogram: &Histogram<u64>,
    config: &ClusterBenchConfig,
    elapsed_s: f64,
) -> anyhow::Result<()> {
    let mut out = BufWriter::new(File::create(path)?);
    let mut serializer = V2DeflateSerializer::new();
    let now = SystemTime::now();
    let started = now
        .checked_sub(Duration::from_secs_f64(elapsed_s))
        .unwrap_or(now);
    let since_epoch = started
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    {
        let mut log = IntervalLogWriterBuilder::new()
            .add_comment("quire bench cluster: produce-to-stabilized-ack latency, microseconds")
            .add_comment(&format!(
                "brokers={} producers={} event_size={} batch={} in_flight={} rate={}",
                config.brokers.join(","),
                config.producers,
                config.event_size,
                config.batch,
                config.in_flight,
                config
                    .rate
                    .map_or_else(|| "closed_loop".to_owned(), |r| r.to_string())
            ))
            .with_start_time(started)
            .with_max_value_divisor(1000.0)
            .begin_log_with(&mut out, &mut serializer)?;
        log.write_histogram(
            histogram,
            since_epoch,
            Duration::from_secs_f64(elapsed_s),
            Tag::new("produce-to-ack"),
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    use hdrhistogram::serialization::Deserializer;

    fn config() -> ClusterBenchConfig {
        ClusterBenchConfig {
            brokers: vec!["b:1".into()],
            connect: MasterBound {
                timeout: Duration::from_secs(30),
                flag: Some("--connect-timeout"),
                tls: None,
                sasl: None,
            },
            topic: "bench".into(),
            producers: 2,
            event_size: 1024,
            batch: 256,
            in_flight: 8,
            linger: Duration::from_millis(5),
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            rate: None,
            hdr_out: None,
            cluster_dir: None,
        }
    }

    #[test]
    fn the_producer_batches_by_count_and_holds_the_window() {
        let c = config();
        let p = c.producer_config();
        assert_eq!(p.batch_messages_max, 256);
        assert_eq!(p.batch_bytes_max, 256 * 1028);
        assert!(p.buffer_bytes_max >= 9 * 256 * 1028);
        p.validate().unwrap();
    }

    /// Standard base64 (with padding), enough to read back what the log writer wrote.
    fn decode_base64(s: &str) -> Vec<u8> {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = Vec::new();
        let (mut acc, mut bits) = (0u32, 0u32);
        for c in s.bytes().filter(|c| *c != b'=') {
            let v = ALPHABET.iter().position(|a| *a == c).expect("base64 digit") as u32;
            acc = (acc << 6) | v;
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
                acc &= (1 << bits) - 1;
            }
        }
        out
    }

    #[test]
    fn the_interval_log_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lat.hlog");
        let mut h = new_histogram();
        for v in [100, 200, 300, 5000] {
            h.record(v).unwrap();
        }
        write_interval_log(&path, &h, &config(), 1.5).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains("#[MaxValueDivisor: 1000.000]"), "{text}");
        let intervals: Vec<_> = IntervalLogIterator::new(&bytes)
            .filter_map(|e| match e {
                Ok(LogEntry::Interval(i)) => Some(i),
                _ => None,
            })
            .collect();
        assert_eq!(intervals.len(), 1);
        assert_eq!(
            intervals[0].tag().map(|t| t.as_str()),
            Some("produce-to-ack")
        );
        assert_eq!(intervals[0].duration(), Duration::from_millis(1500));
        let decoded = decode_base64(intervals[0].encoded_histogram());
        let back: Histogram<u64> = Deserializer::new()
            .deserialize(&mut decoded.as_slice())
            .unwrap();
        assert_eq!(back.len(), 4);
        assert_eq!(back.max(), h.max());
    }
}
