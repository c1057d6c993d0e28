//! `nats-load`: publish-to-PubAck throughput and latency of a NATS JetStream stream, with the
//! conventions of `quire bench cluster` (tools/src/bench/cluster.rs), so the two can be
//! compared (benches/peers/nats-vs-quire.sh).
//!
//! - `--producers N` producers, each its own connection (by default to the stream leader's
//!   server, as quire's producers each connect to the master) and its own JetStream context,
//!   publish `--event-size` byte messages to one subject of one stream.
//! - **Closed loop** (default): each producer keeps at most `--in-flight W` publishes
//!   unacknowledged and publishes the next as soon as one is acknowledged.
//! - **Fixed rate** (`--rate R`, messages/s over all producers, spread evenly, producers
//!   offset from each other): the i-th message of a producer is intended at
//!   `start + i / (R / N)` and its latency counts from that intended time (no coordinated
//!   omission). The sender wakes on Tokio's 1 ms timer and sends what is due in a burst.
//! - A message's latency runs from its publish to its JetStream PubAck (the stream leader
//!   acks once a quorum of the stream's replicas has stored it), in microseconds, HDR
//!   histogram with 3 significant digits. Acks are awaited in publish order per producer.
//! - `--warmup W`: the first W are not counted. Messages still in flight at the deadline are
//!   awaited and counted; throughput = counted acks / (last ack − start of measurement),
//!   at least `--duration`. MB = 10^6 bytes.
//! - `cpu_s`: this process's user + system CPU over the measured window (getrusage).
//!   `--server-pids NAME=PID,...`: the servers' CPU and minor faults over the same window,
//!   from /proc/PID/stat, and all servers' CPU-µs per acknowledged message.
//!
//! Prints one JSON line on stdout (field names as quire bench cluster's); exit status 1 if
//! any message failed (after printing), 2 on a setup error.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use async_nats::jetstream::{self, context::PublishAckFuture, stream};
use async_nats::{Client, ConnectOptions, ServerAddr, Subject};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Highest latency the histogram holds, microseconds (one hour), as quire's.
const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Sent messages a collector has not seen acknowledged yet, at most (fixed rate).
const PENDING_MAX: usize = 1 << 20;
/// Unacknowledged publishes the client library allows per context at a fixed rate (its
/// own bound; past it `publish` waits, and that wait counts against the intended times).
const FIXED_RATE_ACKS_MAX: usize = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ConnectTo {
    /// Every producer connects to the server that leads the stream.
    Leader,
    /// Producer i connects to server i mod n (publishes to a follower are forwarded).
    Spread,
}

/// JetStream publish load with quire bench cluster's conventions; one JSON line on stdout.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// NATS server URLs (client ports), comma separated.
    #[arg(long, value_delimiter = ',', required = true, value_name = "URL,...")]
    servers: Vec<String>,

    /// Stream to publish to.
    #[arg(long, default_value = "BENCH")]
    stream: String,

    /// Subject to publish on (one of the stream's subjects).
    #[arg(long, default_value = "bench")]
    subject: String,

    /// Create the stream first (file storage, N replicas, limits retention, subject
    /// --subject); an existing stream of the same config is reused as it is.
    #[arg(long, value_name = "REPLICAS")]
    create_stream: Option<usize>,

    /// Which server the producers connect to.
    #[arg(long, value_enum, default_value = "leader")]
    connect: ConnectTo,

    /// Concurrent producers (each its own connection and JetStream context).
    #[arg(long, default_value_t = 1, value_name = "N")]
    producers: usize,

    /// Bytes per message.
    #[arg(long, default_value_t = 1024, value_name = "BYTES")]
    event_size: usize,

    /// Publishes each producer keeps unacknowledged at most (closed loop).
    #[arg(long, default_value_t = 256, value_name = "W")]
    in_flight: usize,

    /// How long to measure (e.g. 15s, 500ms, 1m).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,

    /// How long to run before measuring (not counted).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    warmup: Duration,

    /// Fixed total rate, messages/s, latency from each message's intended send time;
    /// default: closed loop.
    #[arg(long, value_name = "MSGS_PER_S")]
    rate: Option<u64>,

    /// The servers' processes, NAME=PID, comma separated: their CPU and minor faults over
    /// the measured window are reported (from /proc/PID/stat).
    #[arg(long, value_delimiter = ',', value_parser = parse_pid, value_name = "NAME=PID,...")]
    server_pids: Vec<(String, u32)>,

    /// Bound on the setup: connecting, creating the stream, waiting for its replicas.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    setup_timeout: Duration,

    /// Bound on each publish's acknowledgement (a late one counts as an error).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    ack_timeout: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a duration such as 15s, 500ms, 2m"))?;
    let secs = match unit {
        "us" => v / 1e6,
        "ms" => v / 1e3,
        "s" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        _ => return Err(format!("{s:?}: unit must be us, ms, s, m or h")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?}: must be a finite duration >= 0"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_pid(s: &str) -> Result<(String, u32), String> {
    let (name, pid) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=PID"))?;
    let pid = pid
        .parse()
        .map_err(|_| format!("{s:?}: PID is not a number"))?;
    Ok((name.to_owned(), pid))
}

/// One server's usage over the measured window (as quire's `servers` entries).
#[derive(Debug, Clone, Serialize)]
struct ServerUsage {
    name: String,
    pid: u32,
    /// Whether it led the stream (the server that orders and acks, like quire's master).
    leader: bool,
    cpu_s: f64,
    minor_faults: u64,
}

/// The JSON line; field names follow `quire bench cluster --format json`.
#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    mode: &'static str,
    urls: Vec<String>,
    connect: &'static str,
    stream: String,
    subject: String,
    replicas: Option<usize>,
    leader: Option<String>,
    producers: usize,
    event_size: usize,
    /// Publishes unacknowledged per producer, at most (closed loop).
    in_flight: usize,
    /// Messages unacknowledged per producer, at most: the same as `in_flight` here (one
    /// message per publish); quire's is `batch × (in_flight + 1)`.
    window: usize,
    target_rate: Option<u64>,
    warmup_s: f64,
    duration_s: f64,
    ops: u64,
    bytes: u64,
    errors: u64,
    ops_per_s: f64,
    mb_per_s: f64,
    mib_per_s: f64,
    mean_us: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
    cpu_s: f64,
    cpu_user_s: f64,
    cpu_sys_s: f64,
    cpu_s_per_gb: f64,
    servers: Option<Vec<ServerUsage>>,
    servers_cpu_us_per_msg: Option<f64>,
    leader_minor_faults_per_msg: Option<f64>,
    first_error: Option<String>,
}

#[derive(Debug, Clone, Copy)]
struct Schedule {
    start: Instant,
    measure_from: Instant,
    end: Instant,
}

#[derive(Debug)]
struct ProducerResult {
    histogram: Histogram<u64>,
    ops: u64,
    errors: u64,
    last_ack: Option<Instant>,
    first_error: Option<String>,
}

type Pending = (
    Instant,
    Result<PublishAckFuture, String>,
    Option<OwnedSemaphorePermit>,
);

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid histogram bounds")
}

fn main() {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("nats-load")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nats-load: error: starting the Tokio runtime: {e}");
            std::process::exit(2);
        }
    };
    match rt.block_on(run(&args)) {
        Ok(report) => {
            println!(
                "{}",
                serde_json::to_string(&report).expect("the report serializes")
            );
            if report.errors > 0 {
                eprintln!(
                    "nats-load: error: {} message(s) failed; first error: {}",
                    report.errors,
                    report.first_error.as_deref().unwrap_or("?")
                );
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("nats-load: error: {e:#}");
            std::process::exit(2);
        }
    }
}

/// Connects to `urls` (any one of them), retrying refused connections until `deadline`.
async fn connect(
    urls: &[String],
    name: &str,
    deadline: Instant,
    capacity: usize,
) -> anyhow::Result<Client> {
    let addrs = urls
        .iter()
        .map(|u| {
            u.parse::<ServerAddr>()
                .with_context(|| format!("server URL {u:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let url = urls.join(",");
    let mut noted = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = ConnectOptions::new()
            .name(name)
            .connection_timeout(left.clamp(Duration::from_millis(100), Duration::from_secs(5)))
            .request_timeout(Some(Duration::from_secs(10)))
            .client_capacity(capacity)
            .connect(addrs.clone())
            .await;
        match attempt {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() + Duration::from_millis(200) < deadline => {
                if !noted {
                    eprintln!("nats-load: connecting to {url}: {e} (retrying)");
                    noted = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to {url}")),
        }
    }
}

/// Creates the stream (retrying while the cluster elects its meta leader), waits until it
/// has a leader and every replica is current, and returns the leader's server name.
async fn setup_stream(
    args: &Args,
    js: &jetstream::Context,
    deadline: Instant,
) -> anyhow::Result<Option<String>> {
    let mut noted = false;
    if let Some(replicas) = args.create_stream {
        loop {
            let config = stream::Config {
                name: args.stream.clone(),
                subjects: vec![args.subject.clone()],
                storage: stream::StorageType::File,
                num_replicas: replicas,
                retention: stream::RetentionPolicy::Limits,
                discard: stream::DiscardPolicy::Old,
                ..Default::default()
            };
            match js.create_stream(config).await {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    if !noted {
                        eprintln!("nats-load: creating stream {}: {e} (retrying)", args.stream);
                        noted = true;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e).context("creating the stream"),
            }
        }
    }
    loop {
        let info = match js.get_stream(&args.stream).await {
            Ok(s) => s.get_info().await.map_err(anyhow::Error::from),
            Err(e) => Err(anyhow::Error::from(e)),
        };
        match info {
            Ok(info) => match info.cluster {
                None => return Ok(None), // a single server
                Some(c) => {
                    let want = info.config.num_replicas.saturating_sub(1);
                    let current = c
                        .replicas
                        .iter()
                        .filter(|r| r.current && !r.offline)
                        .count();
                    if c.leader.is_some() && current >= want {
                        return Ok(c.leader);
                    }
                }
            },
            Err(e) if Instant::now() >= deadline => {
                return Err(e).context("reading the stream's info")
            }
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            bail!("the stream has no leader with all replicas current after --setup-timeout");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run(args: &Args) -> anyhow::Result<Report> {
    if args.producers == 0 || args.producers > 1024 {
        bail!("--producers must be in 1..=1024");
    }
    if args.in_flight == 0 {
        bail!("--in-flight must be at least 1");
    }
    if args.duration.is_zero() {
        bail!("--duration must be above 0");
    }
    if args.rate == Some(0) {
        bail!("--rate must be above 0 (leave it out for a closed loop)");
    }
    let deadline = Instant::now() + args.setup_timeout;

    // Setup on a connection of its own, which knows every server.
    let setup = connect(&args.servers, "nats-load-setup", deadline, 2048).await?;
    let setup_js = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(10))
        .build(setup.clone());
    let leader = setup_stream(args, &setup_js, deadline).await?;

    // Which URL is the leader's: ask each server its name.
    let mut leader_url = None;
    if let Some(leader) = &leader {
        for url in &args.servers {
            let c = connect(std::slice::from_ref(url), "nats-load-probe", deadline, 64).await?;
            let is_leader = c.server_info().server_name == *leader;
            drop(c);
            if is_leader {
                leader_url = Some(url.clone());
                break;
            }
        }
    }
    if args.connect == ConnectTo::Leader && leader.is_some() && leader_url.is_none() {
        bail!("the stream leader {leader:?} is none of --servers");
    }
    drop(setup_js);
    drop(setup);

    // The library's own cap on unacknowledged publishes: above our window in closed loop.
    let (acks_max, window) = match args.rate {
        None => (args.in_flight + 1, args.in_flight),
        Some(_) => (FIXED_RATE_ACKS_MAX, args.in_flight),
    };
    let capacity = acks_max.clamp(2048, 1 << 16);
    let mut contexts = Vec::with_capacity(args.producers);
    for i in 0..args.producers {
        let url = match (args.connect, &leader_url) {
            (ConnectTo::Leader, Some(u)) => u.clone(),
            _ => args.servers[i % args.servers.len()].clone(),
        };
        let client = connect(
            std::slice::from_ref(&url),
            &format!("nats-load-{i}"),
            deadline,
            capacity,
        )
        .await?;
        let js = jetstream::ContextBuilder::new()
            .timeout(args.ack_timeout)
            .max_ack_inflight(acks_max)
            .backpressure_on_inflight(true)
            .build(client.clone());
        contexts.push((client, js));
    }
    eprintln!(
        "nats-load: stream {} leader {} ({}), {} producer(s) connected ({:?})",
        args.stream,
        leader.as_deref().unwrap_or("-"),
        leader_url.as_deref().unwrap_or("-"),
        args.producers,
        args.connect
    );

    let payload = Bytes::from(vec![b'n'; args.event_size]);
    let subject = Subject::from(args.subject.as_str());
    let start = Instant::now();
    let schedule = Schedule {
        start,
        measure_from: start + args.warmup,
        end: start + args.warmup + args.duration,
    };
    let count = args.producers;
    let mut tasks = Vec::with_capacity(count);
    let mut clients = Vec::with_capacity(count);
    for (i, (client, js)) in contexts.into_iter().enumerate() {
        let pacing = args.rate.map(|r| {
            let per_producer = r as f64 / count as f64;
            let interval = Duration::from_secs_f64(1.0 / per_producer);
            (interval, interval.mul_f64(i as f64 / count as f64))
        });
        let (subject, payload) = (subject.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            drive(js, subject, payload, schedule, window, pacing).await
        }));
        clients.push(client);
    }
    tokio::time::sleep_until(schedule.measure_from).await;
    let (user0, sys0) = cpu_times();
    let servers0 = sample_servers(&args.server_pids)?;
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
    let servers1 = sample_servers(&args.server_pids)?;
    drop(clients);
    let servers = if args.server_pids.is_empty() {
        None
    } else {
        Some(usage(&servers0, &servers1, leader.as_deref()))
    };
    let Some(last_ack) = last_ack else {
        bail!(
            "no message was acknowledged ({errors} failed{})",
            first_error.map_or_else(String::new, |e| format!("; first error: {e}"))
        );
    };
    let elapsed = last_ack
        .saturating_duration_since(schedule.measure_from)
        .max(args.duration)
        .as_secs_f64();
    let bytes = ops * args.event_size as u64;
    let (cpu_user_s, cpu_sys_s) = (user1 - user0, sys1 - sys0);
    let cpu_s = cpu_user_s + cpu_sys_s;
    Ok(Report {
        bench: "nats",
        mode: if args.rate.is_some() {
            "fixed_rate"
        } else {
            "closed_loop"
        },
        urls: args.servers.clone(),
        connect: match args.connect {
            ConnectTo::Leader => "leader",
            ConnectTo::Spread => "spread",
        },
        stream: args.stream.clone(),
        subject: args.subject.clone(),
        replicas: args.create_stream,
        leader,
        producers: args.producers,
        event_size: args.event_size,
        in_flight: args.in_flight,
        window,
        target_rate: args.rate,
        warmup_s: args.warmup.as_secs_f64(),
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
        servers_cpu_us_per_msg: servers
            .as_ref()
            .map(|s| s.iter().map(|s| s.cpu_s).sum::<f64>() * 1e6 / ops.max(1) as f64),
        leader_minor_faults_per_msg: servers.as_ref().and_then(|s| {
            s.iter()
                .find(|s| s.leader)
                .map(|l| l.minor_faults as f64 / ops.max(1) as f64)
        }),
        servers,
        first_error,
    })
}

/// One producer's sender and collector, on one task (as quire bench cluster's).
async fn drive(
    js: jetstream::Context,
    subject: Subject,
    payload: Bytes,
    schedule: Schedule,
    window: usize,
    pacing: Option<(Duration, Duration)>,
) -> ProducerResult {
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
            let sent = js
                .publish(subject.clone(), payload.clone())
                .await
                .map_err(|e| e.to_string());
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
                Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            let now = Instant::now();
            drop(permit);
            if intended < schedule.measure_from {
                continue;
            }
            match outcome {
                Ok(()) => {
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
                        r.first_error = Some(e);
                    }
                }
            }
        }
        r
    };
    let ((), result) = tokio::join!(sender, collector);
    result
}

/// This process's CPU so far: (user, system) seconds.
fn cpu_times() -> (f64, f64) {
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage owned by this frame.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return (0.0, 0.0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(usage.ru_utime), secs(usage.ru_stime))
}

/// (name, pid, minor faults, utime + stime ticks) of each server.
fn sample_servers(pids: &[(String, u32)]) -> anyhow::Result<Vec<(String, u32, u64, u64)>> {
    pids.iter()
        .map(|(name, pid)| {
            let path = format!("/proc/{pid}/stat");
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {path} ({name} is not running?)"))?;
            // Fields after the command name, which ends at the last ')': field 3 (state) is
            // index 0, so minflt (10) is 7, utime (14) 11, stime (15) 12.
            let rest = text
                .rsplit_once(')')
                .map(|(_, r)| r)
                .with_context(|| format!("{path}: no command name"))?;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| -> anyhow::Result<u64> {
                f.get(i)
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("{path}: field {} unreadable", i + 3))
            };
            Ok((name.clone(), *pid, num(7)?, num(11)? + num(12)?))
        })
        .collect()
}

fn usage(
    before: &[(String, u32, u64, u64)],
    after: &[(String, u32, u64, u64)],
    leader: Option<&str>,
) -> Vec<ServerUsage> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let tick_s = if ticks > 0 { 1.0 / ticks as f64 } else { 0.01 };
    after
        .iter()
        .filter_map(|(name, pid, faults, cpu)| {
            let (_, _, faults0, cpu0) = before.iter().find(|b| b.1 == *pid)?;
            Some(ServerUsage {
                name: name.clone(),
                pid: *pid,
                leader: leader == Some(name.as_str()),
                cpu_s: cpu.saturating_sub(*cpu0) as f64 * tick_s,
                minor_faults: faults.saturating_sub(*faults0),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("5d").is_err());
    }

    #[test]
    fn pids_parse_and_this_process_samples() {
        let (name, pid) = parse_pid(&format!("me={}", std::process::id())).unwrap();
        assert!(parse_pid("nope").is_err());
        let s = sample_servers(&[(name, pid)]).unwrap();
        assert_eq!(s.len(), 1);
        let u = usage(&s, &s, Some("me"));
        assert!(u[0].leader && u[0].cpu_s == 0.0 && u[0].minor_faults == 0);
    }
}
