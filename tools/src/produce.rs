//! `quire produce`: send messages to a topic through the master broker, one per stdin line
//! or `--count N --size B` generated ones, and report each acknowledged offset.
//!
//! # Messages
//! - **stdin** (without `--count`): one message per line; the line's bytes without its
//!   `\n` (and without a `\r` before it), any bytes (not necessarily UTF-8), empty lines
//!   included. Ends at end of input.
//! - **generated** (`--count N`): message `i` (from 0) is `i` in ASCII decimal, padded on
//!   the left with `0` to `--size` bytes (default 100); if `i` has more digits than
//!   `--size`, its last `--size` digits. So `--size 8` gives `00000000`, `00000001`, ...
//!
//! # Output
//! - `--format jsonl`: one line per **acknowledged** message on stdout,
//!   `{"topic":"T","offset":42}`, written only after its ack, in send order (a message that
//!   fails gets no line: its failure is reported on stderr).
//! - `--format json`: the summary below, as one JSON object on stdout at the end.
//! - `--format text` (default): nothing on stdout.
//!
//! A summary always goes to stderr: messages acknowledged, failed (and how many of those
//! are **outcome unknown** — not acknowledged in time, may or may not be in the log),
//! elapsed time, messages/s and MB/s (10^6 bytes of payload per second), and the first
//! failures (message index from 0, line number for stdin). JSON summary fields: `topic`,
//! `producer_id` (16 hex digits), `sent`, `acked`, `failed`, `outcome_unknown`,
//! `bytes_acked`, `first_offset`, `last_offset`, `elapsed_s`, `msgs_per_s`, `mb_per_s`,
//! `failures` (at most [`FAILURES_LISTED_MAX`]: `index`, `outcome_unknown`, `error`).
//!
//! # Finding the master
//! Before sending anything the master is looked for until `--connect-timeout` (default
//! 30 s): refused connections and brokers naming no master (an election) are retried, and
//! the first failure is noted on stderr at once (see [`crate::cluster::master`]).
//!
//! # Exit status
//! 0 when every message was acknowledged; 1 when any failed (the error says how many and
//! how many are outcome unknown); 130 after Ctrl-C/SIGTERM (sending stops, what was sent is
//! still awaited and reported).
//!
//! The producer is `quire_client::Producer` (idempotent, batching; `--linger`,
//! `--batch-bytes`, `--producer-id` set its [`ProducerConfig`]).

use std::io::{self, BufRead, BufWriter, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use quire_client::{Delivery, Discovery, ProduceError, Producer, ProducerConfig};
use quire_proto::MESSAGE_BYTES_MAX;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::cli::FormatArgs;
use crate::cluster::master::{self, ConnectArgs, MasterBound};
use crate::cluster::{runtime, signal, BrokersArgs};
use crate::interrupt::Interrupted;
use crate::output::{write_json_line, OutputFormat, Report, Table};
use crate::units::{parse_duration, parse_size};

/// Failures listed one by one (on stderr and in the JSON summary); the rest are counted.
pub const FAILURES_LISTED_MAX: usize = 20;

/// Deliveries awaited at once (sent, outcome not yet written), at most; sending waits
/// beyond it. The producer's own buffer bounds the bytes.
pub const PENDING_DELIVERIES_MAX: usize = 65_536;

/// Lines read ahead from stdin, at most.
const STDIN_QUEUE_MAX: usize = 1024;

/// Arguments of `quire produce`.
#[derive(Debug, Clone, Args)]
pub struct ProduceArgs {
    #[command(flatten)]
    pub brokers: BrokersArgs,

    #[command(flatten)]
    pub connect: ConnectArgs,

    /// The topic to send to. Default: $QUIRE_TOPIC.
    #[arg(
        short = 't',
        long,
        value_name = "TOPIC",
        env = "QUIRE_TOPIC",
        hide_env = true
    )]
    pub topic: String,

    /// Send N generated messages instead of reading stdin.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,

    /// Bytes per generated message (with --count).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "100", requires = "count")]
    pub size: u64,

    /// How long a batch may wait for more messages after its first one.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5ms")]
    pub linger: Duration,

    /// A batch is sent once its messages take this many bytes (each message + 4).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "256KiB")]
    pub batch_bytes: u64,

    /// Producer id for idempotent produce (non-zero; decimal or 0x hex). Default: random.
    #[arg(long, value_name = "ID", value_parser = parse_producer_id)]
    pub producer_id: Option<u64>,

    /// A message not acknowledged this long after it was queued fails (outcome unknown).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "60s")]
    pub delivery_timeout: Duration,

    #[command(flatten)]
    pub format: FormatArgs,
}

/// Parses a producer id: decimal or `0x` hex, non-zero.
///
/// # Errors
/// Not a number, or 0.
pub fn parse_producer_id(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("invalid producer id {s:?}: {e}"))?;
    if v == 0 {
        return Err("producer id 0 means \"not idempotent\"; give a non-zero id".to_owned());
    }
    Ok(v)
}

/// Where the messages come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// One message per stdin line.
    Stdin,
    /// `count` generated messages of `size` bytes (see the module docs).
    Generated {
        /// Messages.
        count: u64,
        /// Bytes each.
        size: usize,
    },
}

/// What `quire produce` needs.
#[derive(Debug, Clone)]
pub struct ProduceConfig {
    /// Broker addresses.
    pub brokers: Vec<String>,
    /// Topic.
    pub topic: String,
    /// Where messages come from.
    pub source: Source,
    /// Producer settings (its discovery bounded by `connect`).
    pub producer: ProducerConfig,
    /// How long to look for the master before sending anything.
    pub connect: MasterBound,
    /// Output format.
    pub format: OutputFormat,
}

impl ProduceArgs {
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
    /// A size or duration out of range.
    pub fn to_config(&self) -> anyhow::Result<ProduceConfig> {
        let source = match self.count {
            None => Source::Stdin,
            Some(count) => {
                let size = usize::try_from(self.size)
                    .ok()
                    .filter(|s| *s <= MESSAGE_BYTES_MAX)
                    .with_context(|| {
                        format!(
                            "--size {} is above the largest message, {MESSAGE_BYTES_MAX} bytes",
                            self.size
                        )
                    })?;
                Source::Generated { count, size }
            }
        };
        let batch_bytes = usize::try_from(self.batch_bytes)
            .ok()
            .filter(|b| (1..=MESSAGE_BYTES_MAX).contains(b))
            .with_context(|| format!("--batch-bytes must be in 1..={MESSAGE_BYTES_MAX}"))?;
        let producer = ProducerConfig {
            producer_id: self.producer_id,
            batch_bytes_max: batch_bytes,
            linger_ms: millis(self.linger),
            delivery_timeout_ms: millis(self.delivery_timeout),
            buffer_bytes_max: ProducerConfig::default().buffer_bytes_max.max(batch_bytes),
            discovery: self
                .connect_bound()?
                .discovery_config(ProducerConfig::default().discovery),
            ..ProducerConfig::default()
        };
        producer.validate().context("producer settings")?;
        Ok(ProduceConfig {
            brokers: self.brokers.addrs(),
            topic: self.topic.clone(),
            source,
            producer,
            connect: self.connect_bound()?,
            format: self.format.format,
        })
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Generated message `index` of `size` bytes (see the module docs).
#[must_use]
pub fn generated_payload(index: u64, size: usize) -> Vec<u8> {
    let digits = index.to_string();
    let digits = digits.as_bytes();
    let mut out = vec![b'0'; size];
    let n = digits.len().min(size);
    out[size - n..].copy_from_slice(&digits[digits.len() - n..]);
    out
}

/// One failed message.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// Index of the message, from 0 (stdin: line number - 1).
    pub index: u64,
    /// It may be in the log.
    pub outcome_unknown: bool,
    /// What went wrong.
    pub error: String,
}

/// The summary of a `quire produce` run.
#[derive(Debug, Clone, Serialize)]
pub struct ProduceReport {
    /// Topic.
    pub topic: String,
    /// Producer id, 16 hex digits.
    pub producer_id: String,
    /// Messages handed to the producer.
    pub sent: u64,
    /// Messages acknowledged (stabilized).
    pub acked: u64,
    /// Messages that failed.
    pub failed: u64,
    /// Of the failed ones, those that may be in the log.
    pub outcome_unknown: u64,
    /// Payload bytes of the acknowledged messages.
    pub bytes_acked: u64,
    /// Lowest acknowledged offset.
    pub first_offset: Option<u64>,
    /// Highest acknowledged offset.
    pub last_offset: Option<u64>,
    /// Seconds from connecting to the last outcome.
    pub elapsed_s: f64,
    /// Acknowledged messages per second.
    pub msgs_per_s: f64,
    /// Acknowledged payload MB (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// The first failures.
    pub failures: Vec<Failure>,
    /// Stopped by Ctrl-C/SIGTERM.
    #[serde(skip)]
    pub interrupted: bool,
    /// Messages are numbered by stdin line.
    #[serde(skip)]
    pub from_stdin: bool,
}

impl Report for ProduceReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let mut t = Table::new();
        t.row("topic", &self.topic)
            .row("producer id", &self.producer_id)
            .row("acknowledged", format!("{} of {}", self.acked, self.sent))
            .row(
                "failed",
                format!("{} ({} outcome unknown)", self.failed, self.outcome_unknown),
            );
        if let (Some(a), Some(b)) = (self.first_offset, self.last_offset) {
            t.row("offsets", format!("{a} ..= {b}"));
        }
        t.row("elapsed", format!("{:.3} s", self.elapsed_s)).row(
            "rate",
            format!("{:.0} msgs/s, {:.2} MB/s", self.msgs_per_s, self.mb_per_s),
        );
        t.write(out)?;
        for f in &self.failures {
            let what = if self.from_stdin {
                format!("line {}", f.index + 1)
            } else {
                format!("message {}", f.index)
            };
            let unknown = if f.outcome_unknown {
                " (outcome unknown: it may be in the log)"
            } else {
                ""
            };
            writeln!(out, "failed: {what}{unknown}: {}", f.error)?;
        }
        if self.failed > self.failures.len() as u64 {
            writeln!(
                out,
                "... and {} more failures",
                self.failed - self.failures.len() as u64
            )?;
        }
        Ok(())
    }
}

#[derive(Serialize)]
struct AckLine<'a> {
    topic: &'a str,
    offset: u64,
}

/// Runs `quire produce` (messages from stdin or generated), writing jsonl lines to
/// `stdout` as acks arrive, and returns the summary (also for failures).
///
/// # Errors
/// No master within `config.connect` (a note on stderr says so at the first failure, see
/// [`crate::cluster::master`]), stdout failed, or the runtime failed.
pub fn run(config: &ProduceConfig, stdout: &mut dyn Write) -> anyhow::Result<ProduceReport> {
    let rt = runtime("produce")?;
    rt.block_on(produce(config, stdout))
}

/// `quire produce` from the command line: runs, prints the summary (stderr; stdout too with
/// `--format json`), and fails if any message failed.
///
/// # Errors
/// As [`run`]; failed messages; [`Interrupted`] after Ctrl-C.
pub fn main(config: &ProduceConfig) -> anyhow::Result<()> {
    let report = {
        let stdout = io::stdout();
        let mut out = BufWriter::new(stdout.lock());
        let report = run(config, &mut out)?;
        out.flush()?;
        report
    };
    report.write_text(&mut io::stderr().lock())?;
    if config.format == OutputFormat::Json {
        crate::output::emit(&report, OutputFormat::Json, &mut io::stdout().lock())?;
    }
    if report.failed > 0 {
        bail!(
            "{} of {} messages failed ({} outcome unknown: they may be in the log)",
            report.failed,
            report.sent,
            report.outcome_unknown
        );
    }
    if report.interrupted {
        return Err(Interrupted.into());
    }
    Ok(())
}

async fn produce(config: &ProduceConfig, stdout: &mut dyn Write) -> anyhow::Result<ProduceReport> {
    let discovery = Discovery::new(config.brokers.clone(), config.producer.discovery.clone())
        .context("reading --brokers")?;
    let master = master::find_master_noting(&discovery, config.connect.clone()).await?;
    let producer = Producer::start(discovery, Some(master), config.producer.clone());
    let start = Instant::now();
    let (tx, mut rx) =
        mpsc::channel::<(u64, usize, Result<Delivery, ProduceError>)>(PENDING_DELIVERIES_MAX);
    let mut interrupted = false;
    let sender = async {
        let mut sent = 0u64;
        let stop = signal();
        tokio::pin!(stop);
        let mut lines = match config.source {
            Source::Stdin => Some(read_stdin_lines()),
            Source::Generated { .. } => None,
        };
        loop {
            let next: Option<Vec<u8>> = match (&mut lines, config.source) {
                (Some(rx), _) => tokio::select! {
                    line = rx.recv() => line,
                    _ = &mut stop => { interrupted = true; None }
                },
                (None, Source::Generated { count, size }) => {
                    if sent >= count {
                        None
                    } else {
                        Some(generated_payload(sent, size))
                    }
                }
                (None, Source::Stdin) => None,
            };
            let Some(message) = next else { break };
            let len = message.len();
            let result = tokio::select! {
                r = producer.send(&config.topic, Bytes::from(message)) => r,
                _ = &mut stop => { interrupted = true; break }
            };
            if tx.send((sent, len, result)).await.is_err() {
                break;
            }
            sent += 1;
        }
        drop(tx);
        sent
    };
    let printer = async {
        let mut report = ProduceReport {
            topic: config.topic.clone(),
            producer_id: format!("{:016x}", producer.id()),
            sent: 0,
            acked: 0,
            failed: 0,
            outcome_unknown: 0,
            bytes_acked: 0,
            first_offset: None,
            last_offset: None,
            elapsed_s: 0.0,
            msgs_per_s: 0.0,
            mb_per_s: 0.0,
            failures: Vec::new(),
            interrupted: false,
            from_stdin: config.source == Source::Stdin,
        };
        let jsonl = config.format == OutputFormat::Jsonl;
        while let Some((index, len, result)) = rx.recv().await {
            let outcome = match result {
                Ok(mut delivery) => {
                    // Flush what is written before waiting on an ack that is not in yet.
                    match tokio::time::timeout(Duration::ZERO, &mut delivery).await {
                        Ok(r) => r,
                        Err(_) => {
                            stdout.flush()?;
                            delivery.await
                        }
                    }
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(offset) => {
                    report.acked += 1;
                    report.bytes_acked += len as u64;
                    report.first_offset =
                        Some(report.first_offset.map_or(offset.0, |f| f.min(offset.0)));
                    report.last_offset =
                        Some(report.last_offset.map_or(offset.0, |l| l.max(offset.0)));
                    if jsonl {
                        write_json_line(
                            &AckLine {
                                topic: &config.topic,
                                offset: offset.0,
                            },
                            &mut &mut *stdout,
                        )?;
                    }
                }
                Err(e) => {
                    report.failed += 1;
                    let unknown = e.is_outcome_unknown();
                    report.outcome_unknown += u64::from(unknown);
                    if report.failures.len() < FAILURES_LISTED_MAX {
                        report.failures.push(Failure {
                            index,
                            outcome_unknown: unknown,
                            error: e.to_string(),
                        });
                    }
                }
            }
        }
        stdout.flush()?;
        anyhow::Ok(report)
    };
    let (sent, report) = tokio::join!(sender, printer);
    let mut report = report?;
    producer.close().await.context("flushing the producer")?;
    let elapsed = start.elapsed().as_secs_f64();
    report.sent = sent;
    report.interrupted = interrupted;
    report.elapsed_s = elapsed;
    if elapsed > 0.0 {
        report.msgs_per_s = report.acked as f64 / elapsed;
        report.mb_per_s = report.bytes_acked as f64 / elapsed / 1e6;
    }
    Ok(report)
}

/// Reads stdin on its own thread (blocking reads stay off the runtime), one message per
/// line without its line ending; the channel closes at end of input or on a read error
/// (logged).
fn read_stdin_lines() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(STDIN_QUEUE_MAX);
    let spawned = std::thread::Builder::new()
        .name("quire-stdin".into())
        .spawn(move || {
            let stdin = io::stdin();
            let mut input = stdin.lock();
            loop {
                let mut line = Vec::new();
                match input.read_until(b'\n', &mut line) {
                    Ok(0) => break,
                    Ok(_) => {
                        if line.last() == Some(&b'\n') {
                            line.pop();
                            if line.last() == Some(&b'\r') {
                                line.pop();
                            }
                        }
                        if tx.blocking_send(line).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::error!(error = %e, "reading stdin");
                        break;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "starting the stdin reader");
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_payloads_are_padded_sequence_numbers() {
        assert_eq!(generated_payload(42, 6), b"000042");
        assert_eq!(generated_payload(0, 3), b"000");
        assert_eq!(
            generated_payload(12345, 3),
            b"345",
            "last digits when too short"
        );
        assert_eq!(generated_payload(7, 0), b"");
        assert_eq!(generated_payload(9, 100).len(), 100);
    }

    #[test]
    fn producer_ids_parse_in_decimal_and_hex_and_refuse_zero() {
        assert_eq!(parse_producer_id("42"), Ok(42));
        assert_eq!(parse_producer_id("0x2a"), Ok(42));
        assert!(parse_producer_id("0").is_err());
        assert!(parse_producer_id("x").is_err());
    }
}
