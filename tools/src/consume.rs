//! `quire consume`: read a topic's stabilized messages in log order and print them.
//!
//! # Where it starts
//! `--from beginning` (offset 0), `--from end` (after the master's high-water mark: only
//! messages stabilized from now on), or `--from OFFSET`. With `--cursor NAME` and no
//! `--from`, it starts at the cursor's committed offset (the beginning if never committed).
//! Without either, it starts at the end. A start above the offset after the master's
//! high-water mark is legal (the run waits for the log to reach it) and noted on stderr
//! ([`beyond_hwm_note`]).
//!
//! # Finding the master
//! As `quire produce` does (see [`crate::cluster::master`]): retried until
//! `--connect-timeout`, the first failure noted on stderr at once. The same bound limits
//! the consumer's retries when it loses the master while consuming.
//!
//! # When it stops
//! After `-c N` (or `-n N`) messages; or once `--timeout D` passes with no message (an *idle* timeout,
//! counted from the last message or the start); or on Ctrl-C/SIGTERM (exit 130). Without
//! `-c` and `--timeout` it runs until interrupted. When `-c N` was given and the idle timeout
//! ends the run first, the command fails (exit 1) saying how many messages it got.
//!
//! # Cursor
//! With `--cursor NAME` the consumer commits, to that cursor, the offset after the last
//! message it printed: every `--commit-interval` (default 1 s) while messages flow, and once
//! at exit (also after Ctrl-C and the idle timeout). A later `quire consume --cursor NAME`
//! starts there. Each commit is stabilized through the quorum before it counts.
//!
//! # Output
//! - `--format jsonl`: one line per message, as it arrives:
//!   `{"topic":"T","offset":42,"payload":"hello"}`. `payload` is the message as UTF-8 text
//!   when it is valid UTF-8; otherwise `payload` holds it with each invalid sequence replaced
//!   by U+FFFD and `payload_hex` is added with the exact bytes in lowercase hex
//!   (`{"topic":"T","offset":43,"payload":"\ufffd","payload_hex":"ff"}`). A script that needs
//!   the exact bytes uses `payload_hex` when present, else `payload`.
//! - `--format text` (default): each message's bytes as they are, followed by `\n` (the
//!   inverse of `quire produce` reading stdin).
//! - `--format json`: one object at the end, `{"topic":…,"count":…,"next_offset":…,
//!   "messages":[…]}` with the messages as in jsonl (it holds every message until the end:
//!   use jsonl for long runs).
//!
//! A summary goes to stderr at the end (messages, offsets, elapsed time).

use std::fmt::Write as _;
use std::io::{self, BufWriter, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use quire_client::{Consumer, ConsumerConfig, Discovery, Message, StartFrom};
use quire_proto::Offset;
use serde::Serialize;
use tokio::time::Instant;

use crate::cli::FormatArgs;
use crate::cluster::master::{self, ConnectArgs, MasterBound};
use crate::cluster::{runtime, signal, BrokersArgs};
use crate::interrupt::Interrupted;
use crate::output::{write_json_line, OutputFormat};
use crate::units::parse_duration;

/// Longest long-poll of one fetch: bounds how late the idle timeout and Ctrl-C are seen.
pub const FETCH_WAIT_MAX: Duration = Duration::from_millis(500);

/// Arguments of `quire consume`.
#[derive(Debug, Clone, Args)]
pub struct ConsumeArgs {
    #[command(flatten)]
    pub brokers: BrokersArgs,

    #[command(flatten)]
    pub connect: ConnectArgs,

    /// The topic to read. Default: $QUIRE_TOPIC.
    #[arg(
        short = 't',
        long,
        value_name = "TOPIC",
        env = "QUIRE_TOPIC",
        hide_env = true
    )]
    pub topic: String,

    /// Where to start: `beginning`, `end`, or a log offset. Default: the cursor's committed
    /// offset with --cursor, else `end`.
    #[arg(
        short = 'o',
        long,
        visible_alias = "offset",
        value_name = "beginning|end|OFFSET",
        value_parser = parse_from
    )]
    pub from: Option<StartArg>,

    /// A durable cursor: start from it (unless --from is given) and commit to it.
    #[arg(long, value_name = "NAME")]
    pub cursor: Option<String>,

    /// Stop after N messages (`-n N` is accepted too).
    #[arg(short = 'c', short_alias = 'n', long = "count", value_name = "N")]
    pub count: Option<u64>,

    /// Stop once no message arrived for this long.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// How often to commit the cursor while messages flow (with --cursor).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s")]
    pub commit_interval: Duration,

    #[command(flatten)]
    pub format: FormatArgs,
}

/// The `--from` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartArg {
    /// Offset 0.
    Beginning,
    /// After the HWM.
    End,
    /// This offset.
    Offset(u64),
}

/// Parses `beginning`, `end` or a decimal offset.
///
/// # Errors
/// Anything else.
pub fn parse_from(s: &str) -> Result<StartArg, String> {
    match s.trim() {
        "beginning" | "start" => Ok(StartArg::Beginning),
        "end" => Ok(StartArg::End),
        other => other.parse().map(StartArg::Offset).map_err(|_| {
            format!("invalid start {other:?}: expected beginning, end or a log offset")
        }),
    }
}

/// What `quire consume` needs.
#[derive(Debug, Clone)]
pub struct ConsumeConfig {
    /// Broker addresses.
    pub brokers: Vec<String>,
    /// How long to look for the master, at the start and after losing it.
    pub connect: MasterBound,
    /// Topic.
    pub topic: String,
    /// Where to start.
    pub start: StartFrom,
    /// Cursor to commit to.
    pub cursor: Option<String>,
    /// Stop after this many messages.
    pub count: Option<u64>,
    /// Idle timeout.
    pub timeout: Option<Duration>,
    /// Commit period.
    pub commit_interval: Duration,
    /// Output format.
    pub format: OutputFormat,
}

impl ConsumeArgs {
    /// The configuration these arguments describe.
    ///
    /// # Errors
    /// TLS files that cannot be read or used.
    pub fn to_config(&self) -> anyhow::Result<ConsumeConfig> {
        let start = match (self.from, &self.cursor) {
            (Some(StartArg::Beginning), _) => StartFrom::Beginning,
            (Some(StartArg::End), _) => StartFrom::End,
            (Some(StartArg::Offset(o)), _) => StartFrom::Offset(Offset(o)),
            (None, Some(c)) => StartFrom::Cursor(c.clone()),
            (None, None) => StartFrom::End,
        };
        Ok(ConsumeConfig {
            brokers: self.brokers.addrs(),
            connect: MasterBound {
                tls: self.brokers.tls()?,
                sasl: self.brokers.sasl()?,
                ..self.connect.bound()
            },
            topic: self.topic.clone(),
            start,
            cursor: self.cursor.clone(),
            count: self.count,
            timeout: self.timeout,
            commit_interval: self.commit_interval,
            format: self.format.format,
        })
    }
}

/// One message as printed in jsonl / json.
#[derive(Debug, Clone, Serialize)]
pub struct MessageLine {
    /// Topic.
    pub topic: String,
    /// Log offset.
    pub offset: u64,
    /// UTF-8 text (lossy when not valid UTF-8).
    pub payload: String,
    /// Exact bytes in hex, only when the payload is not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_hex: Option<String>,
}

impl MessageLine {
    /// The printed form of `m`.
    #[must_use]
    pub fn new(topic: &str, m: &Message) -> MessageLine {
        let (payload, payload_hex) = match std::str::from_utf8(&m.payload) {
            Ok(s) => (s.to_owned(), None),
            Err(_) => (
                String::from_utf8_lossy(&m.payload).into_owned(),
                Some(hex(&m.payload)),
            ),
        };
        MessageLine {
            topic: topic.to_owned(),
            offset: m.offset.0,
            payload,
            payload_hex,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The result of a run.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumeReport {
    /// Topic.
    pub topic: String,
    /// Messages printed.
    pub count: u64,
    /// Offset of the first message printed.
    pub first_offset: Option<u64>,
    /// Offset of the last message printed.
    pub last_offset: Option<u64>,
    /// Where a consumer continuing this one starts (what the cursor was committed to).
    pub next_offset: u64,
    /// Seconds from subscribing to the end.
    pub elapsed_s: f64,
    /// The messages (only with `--format json`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<MessageLine>,
    /// Why the run ended.
    #[serde(skip)]
    pub end: End,
}

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum End {
    /// `-c` messages printed.
    #[default]
    Count,
    /// The idle timeout passed.
    Idle,
    /// Ctrl-C / SIGTERM.
    Interrupted,
}

/// Runs `quire consume`, writing messages to `stdout` as they arrive.
///
/// # Errors
/// No master, a fatal broker error, the cursor commit failing, stdout failing.
pub fn run(config: &ConsumeConfig, stdout: &mut dyn Write) -> anyhow::Result<ConsumeReport> {
    let rt = runtime("consume")?;
    rt.block_on(consume(config, stdout))
}

/// `quire consume` from the command line: runs, prints, reports on stderr.
///
/// # Errors
/// As [`run`]; fewer than `-c` messages before the idle timeout; [`Interrupted`].
pub fn main(config: &ConsumeConfig) -> anyhow::Result<()> {
    let report = {
        let stdout = io::stdout();
        let mut out = BufWriter::new(stdout.lock());
        let report = run(config, &mut out)?;
        if config.format == OutputFormat::Json {
            write_json_line(&report, &mut out)?;
        }
        out.flush()?;
        report
    };
    let offsets = match (report.first_offset, report.last_offset) {
        (Some(a), Some(b)) => format!(" (offsets {a} ..= {b})"),
        _ => String::new(),
    };
    eprintln!(
        "quire: consumed {} messages from {}{offsets} in {:.3} s; next offset {}",
        report.count, report.topic, report.elapsed_s, report.next_offset
    );
    match report.end {
        End::Interrupted => Err(Interrupted.into()),
        End::Idle => match config.count {
            Some(n) if report.count < n => bail!(
                "only {} of {n} messages arrived before the idle timeout",
                report.count
            ),
            _ => Ok(()),
        },
        End::Count => Ok(()),
    }
}

async fn consume(config: &ConsumeConfig, stdout: &mut dyn Write) -> anyhow::Result<ConsumeReport> {
    let fetch_wait = config
        .timeout
        .map_or(FETCH_WAIT_MAX, |t| t.min(FETCH_WAIT_MAX));
    let consumer_config = ConsumerConfig {
        fetch_wait_ms: u32::try_from(fetch_wait.as_millis()).unwrap_or(u32::MAX),
        retry_timeout_ms: u64::try_from(config.connect.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1),
        discovery: config
            .connect
            .discovery_config(ConsumerConfig::default().discovery),
        ..ConsumerConfig::default()
    };
    // Find the master first, so an unreachable one is reported at once (the consumer's own
    // retries are silent), and learn the HWM to tell a start beyond it from a stuck run.
    let discovery = Discovery::new(config.brokers.clone(), consumer_config.discovery.clone())
        .context("reading --brokers")?;
    let hwm = {
        let found = master::find_master_noting(&discovery, config.connect.clone()).await?;
        match found.client.metadata().await {
            Ok(m) => Some(m.hwm),
            Err(e) => {
                tracing::debug!(error = %e, "no HWM from the master; subscribing anyway");
                None
            }
        }
    };
    let mut consumer = Consumer::subscribe(
        config.brokers.clone(),
        &config.topic,
        config.start.clone(),
        consumer_config,
    )
    .await
    .context("subscribing")?;
    if let Some(note) = hwm.and_then(|hwm| beyond_hwm_note(consumer.position(), hwm)) {
        eprintln!("{note}");
    }
    let start = Instant::now();
    let mut report = ConsumeReport {
        topic: config.topic.clone(),
        count: 0,
        first_offset: None,
        last_offset: None,
        next_offset: consumer.position().0,
        elapsed_s: 0.0,
        messages: Vec::new(),
        end: End::Count,
    };
    let mut committed = report.next_offset;
    let mut last_commit = Instant::now();
    let mut last_message = Instant::now();
    let stop = signal();
    tokio::pin!(stop);
    loop {
        if config.count.is_some_and(|n| report.count >= n) {
            report.end = End::Count;
            break;
        }
        if config.timeout.is_some_and(|t| last_message.elapsed() >= t) {
            report.end = End::Idle;
            break;
        }
        let batch = tokio::select! {
            r = consumer.poll() => r.context("fetching")?,
            _ = &mut stop => { report.end = End::Interrupted; break }
        };
        if batch.is_empty() {
            continue;
        }
        last_message = Instant::now();
        let wanted = config
            .count
            .map_or(batch.len() as u64, |n| n - report.count)
            .min(batch.len() as u64);
        let whole = wanted == batch.len() as u64;
        for m in batch
            .iter()
            .take(usize::try_from(wanted).unwrap_or(usize::MAX))
        {
            print_message(config, &mut report, m, stdout)?;
        }
        stdout.flush()?;
        report.next_offset = if whole {
            consumer.position().0
        } else {
            report.last_offset.map_or(report.next_offset, |o| o + 1)
        };
        if let Some(cursor) = &config.cursor {
            if last_commit.elapsed() >= config.commit_interval && report.next_offset != committed {
                consumer
                    .commit_cursor(cursor, Offset(report.next_offset))
                    .await
                    .with_context(|| format!("committing cursor {cursor}"))?;
                committed = report.next_offset;
                last_commit = Instant::now();
            }
        }
    }
    if let Some(cursor) = &config.cursor {
        if report.next_offset != committed || config.start != StartFrom::Cursor(cursor.clone()) {
            consumer
                .commit_cursor(cursor, Offset(report.next_offset))
                .await
                .with_context(|| format!("committing cursor {cursor}"))?;
        }
    }
    report.elapsed_s = start.elapsed().as_secs_f64();
    Ok(report)
}

/// The note for a start above the HWM (`start` later than the offset after it): such a
/// run waits, printing nothing, until the log reaches `start`.
#[must_use]
pub fn beyond_hwm_note(start: Offset, hwm: Option<Offset>) -> Option<String> {
    let next = hwm.map_or(Offset::ZERO, Offset::next);
    if start <= next {
        return None;
    }
    let hwm = match hwm {
        Some(h) => format!("the high-water mark is {}", h.0),
        None => "the log is empty (no high-water mark yet)".to_owned(),
    };
    Some(format!(
        "quire: waiting for offset {}; {hwm}, so nothing is printed until the log reaches it",
        start.0
    ))
}

fn print_message(
    config: &ConsumeConfig,
    report: &mut ConsumeReport,
    m: &Message,
    stdout: &mut dyn Write,
) -> io::Result<()> {
    report.count += 1;
    report.first_offset.get_or_insert(m.offset.0);
    report.last_offset = Some(m.offset.0);
    match config.format {
        OutputFormat::Text => {
            stdout.write_all(&m.payload)?;
            stdout.write_all(b"\n")
        }
        OutputFormat::Jsonl => {
            write_json_line(&MessageLine::new(&config.topic, m), &mut &mut *stdout)
        }
        OutputFormat::Json => {
            report.messages.push(MessageLine::new(&config.topic, m));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn from_parses_names_and_offsets() {
        assert_eq!(parse_from("beginning"), Ok(StartArg::Beginning));
        assert_eq!(parse_from("end"), Ok(StartArg::End));
        assert_eq!(parse_from("42"), Ok(StartArg::Offset(42)));
        assert!(parse_from("-1").is_err());
        assert!(parse_from("later").is_err());
    }

    #[test]
    fn payloads_are_text_when_utf8_and_hex_otherwise() {
        let text = Message {
            offset: Offset(3),
            payload: Bytes::from_static("héllo".as_bytes()),
        };
        let line = serde_json::to_string(&MessageLine::new("t", &text)).unwrap();
        assert_eq!(line, r#"{"topic":"t","offset":3,"payload":"héllo"}"#);
        let binary = Message {
            offset: Offset(4),
            payload: Bytes::from_static(&[b'a', 0xff, 0x00]),
        };
        let line = serde_json::to_string(&MessageLine::new("t", &binary)).unwrap();
        assert_eq!(
            line,
            "{\"topic\":\"t\",\"offset\":4,\"payload\":\"a\u{fffd}\\u0000\",\"payload_hex\":\"61ff00\"}"
        );
    }

    #[test]
    fn a_start_beyond_the_hwm_is_noted() {
        assert_eq!(beyond_hwm_note(Offset(5), Some(Offset(10))), None);
        assert_eq!(
            beyond_hwm_note(Offset(11), Some(Offset(10))),
            None,
            "the offset after the HWM is the end: the next message"
        );
        assert_eq!(
            beyond_hwm_note(Offset(1_000_000), Some(Offset(41))).as_deref(),
            Some(
                "quire: waiting for offset 1000000; the high-water mark is 41, so nothing is \
                 printed until the log reaches it"
            )
        );
        assert_eq!(beyond_hwm_note(Offset::ZERO, None), None);
        let empty = beyond_hwm_note(Offset(3), None).expect("beyond an empty log");
        assert!(
            empty.contains("waiting for offset 3; the log is empty"),
            "{empty}"
        );
    }

    #[test]
    fn the_start_follows_from_then_cursor_then_end() {
        let args = |from: Option<StartArg>, cursor: Option<&str>| ConsumeArgs {
            brokers: BrokersArgs {
                brokers: vec!["b:1".into()],
                profile: None,
                tls_ca: None,
                tls_cert: None,
                tls_key: None,
                user: None,
                password_file: None,
            },
            connect: ConnectArgs {
                connect_timeout: Some(Duration::from_secs(30)),
            },
            topic: "t".into(),
            from,
            cursor: cursor.map(str::to_owned),
            count: None,
            timeout: None,
            commit_interval: Duration::from_secs(1),
            format: FormatArgs {
                format: OutputFormat::Jsonl,
            },
        };
        assert_eq!(
            args(None, None).to_config().expect("valid").start,
            StartFrom::End
        );
        assert_eq!(
            args(None, Some("c")).to_config().expect("valid").start,
            StartFrom::Cursor("c".into())
        );
        assert_eq!(
            args(Some(StartArg::Offset(9)), Some("c"))
                .to_config()
                .expect("valid")
                .start,
            StartFrom::Offset(Offset(9))
        );
    }
}
