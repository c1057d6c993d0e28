//! The command line of `quire-broker run` ([`RunArgs`], clap derive, kept in the library
//! so the `quire` CLI can carry `quire broker run` over the same code) and the resolved
//! settings ([`BrokerConfig`]): a `--config` TOML file first, then the flags (flags win).
//!
//! ```toml
//! id = 1
//! data_dir = "/var/lib/quire/broker-1"
//! listen = "0.0.0.0:7201"
//! stores = ["10.0.0.1:7101", "10.0.0.2:7101", "10.0.0.3:7101"]
//! brokers = ["1=10.0.0.1:7201", "2=10.0.0.2:7201"]
//! ack_quorum = 2                  # default: majority of the stores
//! metrics_listen = "127.0.0.1:9201"
//! log_format = "json"             # or "pretty"
//! heartbeat_ms = 100
//! election_timeout_ms = 1000
//! produce_timeout_ms = 10000
//! retention_bytes = 10737418240   # keep at least the newest 10 GiB of payload; default: no limit
//! retention_ms = 604800000        # keep events stabilized less than 7 days ago; default: no limit
//! read_buffer_bytes_max = 67108864  # incoming frames buffered, all connections together
//! partial_frame_timeout_ms = 10000  # a frame must be whole this long after its first byte
//! idle_timeout_ms = 600000          # a connection silent this long is closed; 0: never
//! message_bytes_max = 1048576       # largest producer message; keep below the stores' segment size
//! connections_max = 10000           # more get Overloaded and are closed (64 more kept for brokers)
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use quire_net::{ReadSettings, CONNECTIONS_MAX_DEFAULT, CONNECTIONS_MAX_LIMIT};
use quire_proto::{BrokerId, ADDR_BYTES_MAX, MESSAGE_BYTES_MAX};
use serde::Deserialize;

use crate::core::{quorum, SLOTS_MAX};
use crate::retention::RetentionPolicy;

/// Default `heartbeat_ms`.
pub const HEARTBEAT_MS_DEFAULT: u64 = 100;
/// Default `election_timeout_ms` (the shortest silence before a takeover).
pub const ELECTION_TIMEOUT_MS_DEFAULT: u64 = 1000;
/// Default `produce_timeout_ms`: a produce not stabilized by then fails (`NoQuorum`).
pub const PRODUCE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Longest `produce_timeout_ms` accepted.
pub const PRODUCE_TIMEOUT_MS_MAX: u64 = 600_000;
/// Default `message_bytes_max`: 1 MiB, about Kafka's `message.max.bytes` default. A store
/// cannot hold an event larger than its segment (`segment_bytes_max`), so this must stay
/// below the stores' segment size; a larger message is refused at once (`MessageTooLarge`,
/// never retried) instead of being refused by every store.
pub const MESSAGE_BYTES_MAX_DEFAULT: usize = 1 << 20;
/// Shortest `heartbeat_ms` accepted.
pub const HEARTBEAT_MS_MIN: u64 = 5;

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}

/// `quire-broker run`. Every setting may also come from the `--config` TOML file; a flag
/// overrides the file.
#[derive(Clone, Debug, Default, Args)]
pub struct RunArgs {
    /// This broker's id (1..=65535), the low 16 bits of its epochs; it must be in --brokers.
    #[arg(long)]
    pub id: Option<u16>,
    /// The data directory (created if needed): epoch counter and cluster file.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address to serve clients and brokers on (`host:port`; port 0 picks one, printed as
    /// `listening on ADDR`). Default: this broker's address in --brokers.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// The event stores, `host:port` each, comma separated. Fixed for the cluster's life.
    #[arg(long, value_name = "A,B,C", value_delimiter = ',')]
    pub stores: Vec<String>,
    /// Every broker of the cluster as `ID=host:port`, comma separated (this one included).
    #[arg(long, value_name = "ID=ADDR,...", value_delimiter = ',')]
    pub brokers: Vec<String>,
    /// Stores that must persist an event before it is stabilized (default: majority).
    #[arg(long, value_name = "Q")]
    pub ack_quorum: Option<usize>,
    /// A TOML file with settings; flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to serve Prometheus metrics on (`GET /metrics`); none by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Log line format (on stderr). Default: pretty.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// How often the master heartbeats slaves and stores, in milliseconds.
    #[arg(long, value_name = "MS")]
    pub heartbeat_ms: Option<u64>,
    /// Shortest silence from the master before a slave takes over, in milliseconds (a
    /// random extra of up to half of it, and a quarter of it per rank, are added).
    #[arg(long, value_name = "MS")]
    pub election_timeout_ms: Option<u64>,
    /// How long a produce may wait to be stabilized before it fails, in milliseconds.
    #[arg(long, value_name = "MS")]
    pub produce_timeout_ms: Option<u64>,
    /// Retention by size: the master trims whole segments once at least this many payload
    /// bytes of newer stabilized events remain, in bytes. Default: no size limit.
    #[arg(long, value_name = "BYTES")]
    pub retention_bytes: Option<u64>,
    /// Retention by age: the master trims whole segments of events stabilized at least this
    /// long ago, in milliseconds. Default: no age limit.
    #[arg(long, value_name = "MS")]
    pub retention_ms: Option<u64>,
    /// Bytes of incoming frames buffered across all connections at most; readers pause
    /// beyond it (default 64 MiB; at least 16 MiB, one maximal frame).
    #[arg(long, value_name = "BYTES")]
    pub read_buffer_bytes_max: Option<usize>,
    /// How long a frame may take from its first byte to its last before the connection is
    /// closed, in milliseconds (default 10000).
    #[arg(long, value_name = "MS")]
    pub partial_frame_timeout_ms: Option<u64>,
    /// How long a connection may send nothing before it is closed, in milliseconds
    /// (default 600000; 0: never).
    #[arg(long, value_name = "MS")]
    pub idle_timeout_ms: Option<u64>,
    /// Largest producer message accepted, in bytes (default 1 MiB; at most the protocol's
    /// MESSAGE_BYTES_MAX). Keep it below the stores' segment_bytes_max: a store cannot hold
    /// an event larger than a segment.
    #[arg(long, value_name = "BYTES")]
    pub message_bytes_max: Option<usize>,
    /// Most connections open at once (default 10000). Beyond it, 64 more are kept for other
    /// brokers (their first frame must be a heartbeat or an append); the rest are answered
    /// `Overloaded` and closed at once.
    #[arg(long, value_name = "CONNECTIONS")]
    pub connections_max: Option<usize>,
}

/// The config file: every key optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// See [`RunArgs::id`].
    pub id: Option<u16>,
    /// See [`RunArgs::data_dir`].
    pub data_dir: Option<PathBuf>,
    /// See [`RunArgs::listen`].
    pub listen: Option<String>,
    /// See [`RunArgs::stores`].
    pub stores: Option<Vec<String>>,
    /// See [`RunArgs::brokers`].
    pub brokers: Option<Vec<String>>,
    /// See [`RunArgs::ack_quorum`].
    pub ack_quorum: Option<usize>,
    /// See [`RunArgs::metrics_listen`].
    pub metrics_listen: Option<String>,
    /// See [`RunArgs::log_format`].
    pub log_format: Option<LogFormat>,
    /// See [`RunArgs::heartbeat_ms`].
    pub heartbeat_ms: Option<u64>,
    /// See [`RunArgs::election_timeout_ms`].
    pub election_timeout_ms: Option<u64>,
    /// See [`RunArgs::produce_timeout_ms`].
    pub produce_timeout_ms: Option<u64>,
    /// See [`RunArgs::retention_bytes`].
    pub retention_bytes: Option<u64>,
    /// See [`RunArgs::retention_ms`].
    pub retention_ms: Option<u64>,
    /// See [`RunArgs::read_buffer_bytes_max`].
    pub read_buffer_bytes_max: Option<usize>,
    /// See [`RunArgs::partial_frame_timeout_ms`].
    pub partial_frame_timeout_ms: Option<u64>,
    /// See [`RunArgs::idle_timeout_ms`].
    pub idle_timeout_ms: Option<u64>,
    /// See [`RunArgs::message_bytes_max`].
    pub message_bytes_max: Option<usize>,
    /// See [`RunArgs::connections_max`].
    pub connections_max: Option<usize>,
}

/// Everything a broker runs with.
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    /// This broker.
    pub id: BrokerId,
    /// The data directory.
    pub data_dir: PathBuf,
    /// Address to listen on.
    pub listen: String,
    /// Store addresses, in slot order.
    pub stores: Vec<String>,
    /// Every broker `(id, addr)`, in the order given.
    pub brokers: Vec<(BrokerId, String)>,
    /// Qa.
    pub ack_quorum: usize,
    /// Metrics address.
    pub metrics_listen: Option<String>,
    /// Log format.
    pub log_format: LogFormat,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// Shortest election timeout.
    pub election_timeout: Duration,
    /// Produce timeout.
    pub produce_timeout: Duration,
    /// Retention limits (both off: keep everything).
    pub retention: RetentionPolicy,
    /// How connections are read: the read budget and the partial-frame and idle timeouts.
    pub read: ReadSettings,
    /// Largest producer message accepted, in bytes.
    pub message_bytes_max: usize,
    /// Most connections open at once, besides quire-net's `PEER_CONNECTIONS_RESERVE` kept
    /// for other brokers.
    pub connections_max: usize,
}

impl BrokerConfig {
    /// The settings for `quire-broker run`: the `--config` file if any, then the flags.
    ///
    /// # Errors
    /// An unreadable or invalid file, a missing or invalid setting (each error names it).
    pub fn from_args(args: &RunArgs) -> anyhow::Result<BrokerConfig> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let id = args
            .id
            .or(file.id)
            .context("--id is required (this broker's id, 1..=65535)")?;
        if id == 0 {
            bail!("--id 0 is reserved (epoch 0 means \"no master\"); use 1..=65535");
        }
        let data_dir = args
            .data_dir
            .clone()
            .or(file.data_dir)
            .context("--data-dir is required")?;
        let stores = if args.stores.is_empty() {
            file.stores.unwrap_or_default()
        } else {
            args.stores.clone()
        };
        let stores: Vec<String> = stores.iter().map(|s| s.trim().to_owned()).collect();
        if stores.is_empty() {
            bail!("--stores is required (the event stores, host:port each, comma separated)");
        }
        for s in &stores {
            check_addr("--stores", s)?;
        }
        let mut sorted = stores.clone();
        sorted.sort();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            bail!("--stores names a store twice: {}", stores.join(","));
        }
        let brokers_raw = if args.brokers.is_empty() {
            file.brokers.unwrap_or_default()
        } else {
            args.brokers.clone()
        };
        let brokers = parse_brokers(&brokers_raw)?;
        let me = BrokerId(id);
        let Some((_, my_addr)) = brokers.iter().find(|(b, _)| *b == me) else {
            bail!("--brokers does not name this broker (--id {id})");
        };
        if stores.len() + brokers.len() - 1 > SLOTS_MAX {
            bail!(
                "{} stores and {} other brokers exceed the {SLOTS_MAX} replication slots",
                stores.len(),
                brokers.len() - 1
            );
        }
        let ack_quorum = args
            .ack_quorum
            .or(file.ack_quorum)
            .unwrap_or_else(|| quorum::majority(stores.len()));
        if ack_quorum == 0 || ack_quorum > stores.len() {
            bail!("--ack-quorum {ack_quorum} is outside 1..={}", stores.len());
        }
        let listen = args
            .listen
            .clone()
            .or(file.listen)
            .unwrap_or_else(|| my_addr.clone());
        let heartbeat_ms = args
            .heartbeat_ms
            .or(file.heartbeat_ms)
            .unwrap_or(HEARTBEAT_MS_DEFAULT);
        if heartbeat_ms < HEARTBEAT_MS_MIN {
            bail!("--heartbeat-ms {heartbeat_ms} is below {HEARTBEAT_MS_MIN}");
        }
        let election_ms = args
            .election_timeout_ms
            .or(file.election_timeout_ms)
            .unwrap_or(ELECTION_TIMEOUT_MS_DEFAULT);
        if election_ms < 2 * heartbeat_ms {
            bail!(
                "--election-timeout-ms {election_ms} must be at least twice --heartbeat-ms {heartbeat_ms}"
            );
        }
        let produce_ms = args
            .produce_timeout_ms
            .or(file.produce_timeout_ms)
            .unwrap_or(PRODUCE_TIMEOUT_MS_DEFAULT);
        if produce_ms == 0 || produce_ms > PRODUCE_TIMEOUT_MS_MAX {
            bail!("--produce-timeout-ms {produce_ms} is outside 1..={PRODUCE_TIMEOUT_MS_MAX}");
        }
        let retention = RetentionPolicy {
            bytes_max: args.retention_bytes.or(file.retention_bytes),
            age_ms_max: args.retention_ms.or(file.retention_ms),
        };
        if retention.bytes_max == Some(0) {
            bail!("--retention-bytes 0 would trim every event; leave it unset to keep everything");
        }
        if retention.age_ms_max == Some(0) {
            bail!("--retention-ms 0 would trim every event; leave it unset to keep everything");
        }
        let defaults = ReadSettings::default();
        let read = ReadSettings {
            read_buffer_bytes_max: args
                .read_buffer_bytes_max
                .or(file.read_buffer_bytes_max)
                .unwrap_or(defaults.read_buffer_bytes_max),
            partial_frame_timeout_ms: args
                .partial_frame_timeout_ms
                .or(file.partial_frame_timeout_ms)
                .unwrap_or(defaults.partial_frame_timeout_ms),
            idle_timeout_ms: args
                .idle_timeout_ms
                .or(file.idle_timeout_ms)
                .unwrap_or(defaults.idle_timeout_ms),
        };
        if let Err(e) = read.validate() {
            bail!("--{}: {e}", e.setting.replace('_', "-"));
        }
        let message_bytes_max = args
            .message_bytes_max
            .or(file.message_bytes_max)
            .unwrap_or(MESSAGE_BYTES_MAX_DEFAULT);
        if message_bytes_max == 0 || message_bytes_max > MESSAGE_BYTES_MAX {
            bail!("--message-bytes-max {message_bytes_max} is outside 1..={MESSAGE_BYTES_MAX}");
        }
        let connections_max = args
            .connections_max
            .or(file.connections_max)
            .unwrap_or(CONNECTIONS_MAX_DEFAULT);
        if connections_max == 0 || connections_max > CONNECTIONS_MAX_LIMIT {
            bail!("--connections-max {connections_max} is outside 1..={CONNECTIONS_MAX_LIMIT}");
        }
        Ok(BrokerConfig {
            id: me,
            data_dir,
            listen,
            stores,
            brokers,
            ack_quorum,
            metrics_listen: args.metrics_listen.clone().or(file.metrics_listen),
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            heartbeat: Duration::from_millis(heartbeat_ms),
            election_timeout: Duration::from_millis(election_ms),
            produce_timeout: Duration::from_millis(produce_ms),
            retention,
            read,
            message_bytes_max,
            connections_max,
        })
    }

    /// This broker's advertised address (its entry in the broker list).
    #[must_use]
    pub fn advertised_addr(&self) -> &str {
        self.brokers
            .iter()
            .find(|(b, _)| *b == self.id)
            .map_or(self.listen.as_str(), |(_, a)| a.as_str())
    }

    /// The address of broker `id`, if it is in the list.
    #[must_use]
    pub fn broker_addr(&self, id: BrokerId) -> Option<&str> {
        self.brokers
            .iter()
            .find(|(b, _)| *b == id)
            .map(|(_, a)| a.as_str())
    }
}

fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

fn check_addr(flag: &str, addr: &str) -> anyhow::Result<()> {
    if addr.is_empty() || addr.len() > ADDR_BYTES_MAX || !addr.contains(':') {
        bail!("{flag}: {addr:?} is not a host:port address of at most {ADDR_BYTES_MAX} bytes");
    }
    Ok(())
}

/// Parses `ID=host:port` entries; ids must be distinct and non-zero.
///
/// # Errors
/// A malformed entry, id 0, or a repeated id.
pub fn parse_brokers(entries: &[String]) -> anyhow::Result<Vec<(BrokerId, String)>> {
    if entries.is_empty() {
        bail!("--brokers is required (every broker as ID=host:port, comma separated)");
    }
    let mut out: Vec<(BrokerId, String)> = Vec::new();
    for e in entries {
        let e = e.trim();
        let Some((id, addr)) = e.split_once('=') else {
            bail!("--brokers: {e:?} is not ID=host:port");
        };
        let id: u16 = id
            .trim()
            .parse()
            .with_context(|| format!("--brokers: {e:?}: the id is not a number in 1..=65535"))?;
        if id == 0 {
            bail!("--brokers: {e:?}: id 0 is reserved");
        }
        let addr = addr.trim().to_owned();
        check_addr("--brokers", &addr)?;
        if out.iter().any(|(b, _)| b.0 == id) {
            bail!("--brokers names broker {id} twice");
        }
        out.push((BrokerId(id), addr));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> RunArgs {
        RunArgs {
            id: Some(2),
            data_dir: Some("/tmp/x".into()),
            stores: vec!["h:1".into(), "h:2".into(), "h:3".into()],
            brokers: vec!["1=h:11".into(), "2=h:12".into()],
            ..RunArgs::default()
        }
    }

    #[test]
    fn flags_resolve_with_defaults() {
        let c = BrokerConfig::from_args(&args()).expect("valid");
        assert_eq!(c.id, BrokerId(2));
        assert_eq!(c.ack_quorum, 2);
        assert_eq!(
            c.listen, "h:12",
            "listens on its own broker address by default"
        );
        assert_eq!(c.advertised_addr(), "h:12");
        assert_eq!(c.broker_addr(BrokerId(1)), Some("h:11"));
        assert_eq!(c.heartbeat, Duration::from_millis(HEARTBEAT_MS_DEFAULT));
        assert_eq!(c.read, ReadSettings::default());
        assert_eq!(c.connections_max, CONNECTIONS_MAX_DEFAULT);
        assert!(
            c.retention.is_off(),
            "retention keeps everything by default"
        );
    }

    #[test]
    fn retention_comes_from_the_file_or_flags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("broker.toml");
        std::fs::write(
            &path,
            "id = 2\ndata_dir = \"/d\"\nstores = [\"h:1\"]\nbrokers = [\"2=h:9\"]\nretention_bytes = 1000\nretention_ms = 60000\n",
        )
        .expect("writes");
        let from_file = BrokerConfig::from_args(&RunArgs {
            config: Some(path.clone()),
            ..RunArgs::default()
        })
        .expect("valid");
        assert_eq!(from_file.retention.bytes_max, Some(1000));
        assert_eq!(from_file.retention.age_ms_max, Some(60_000));
        let flags = BrokerConfig::from_args(&RunArgs {
            config: Some(path),
            retention_bytes: Some(5),
            ..RunArgs::default()
        })
        .expect("valid");
        assert_eq!(flags.retention.bytes_max, Some(5));
        assert_eq!(flags.retention.age_ms_max, Some(60_000));
    }

    #[test]
    fn the_file_is_read_and_flags_win() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("broker.toml");
        std::fs::write(
            &path,
            "id = 1\ndata_dir = \"/d\"\nstores = [\"a:1\", \"b:1\", \"c:1\"]\nbrokers = [\"1=a:9\"]\nack_quorum = 3\nheartbeat_ms = 50\npartial_frame_timeout_ms = 2500\n",
        )
        .expect("writes");
        let from_file = BrokerConfig::from_args(&RunArgs {
            config: Some(path.clone()),
            ..RunArgs::default()
        })
        .expect("valid");
        assert_eq!((from_file.id, from_file.ack_quorum), (BrokerId(1), 3));
        assert_eq!(from_file.heartbeat, Duration::from_millis(50));
        assert_eq!(from_file.read.partial_frame_timeout_ms, 2500);
        let flags = BrokerConfig::from_args(&RunArgs {
            config: Some(path),
            ack_quorum: Some(2),
            ..RunArgs::default()
        })
        .expect("valid");
        assert_eq!(flags.ack_quorum, 2);
        std::fs::write(dir.path().join("bad.toml"), "idd = 1\n").expect("writes");
        assert!(BrokerConfig::from_args(&RunArgs {
            config: Some(dir.path().join("bad.toml")),
            ..RunArgs::default()
        })
        .is_err());
    }

    #[test]
    fn bad_settings_name_themselves() {
        let cases: Vec<(RunArgs, &str)> = vec![
            (RunArgs { id: None, ..args() }, "--id"),
            (
                RunArgs {
                    id: Some(0),
                    ..args()
                },
                "--id 0",
            ),
            (
                RunArgs {
                    id: Some(3),
                    ..args()
                },
                "does not name this broker",
            ),
            (
                RunArgs {
                    stores: vec![],
                    ..args()
                },
                "--stores",
            ),
            (
                RunArgs {
                    stores: vec!["h:1".into(), "h:1".into()],
                    ..args()
                },
                "twice",
            ),
            (
                RunArgs {
                    brokers: vec!["1h:11".into()],
                    ..args()
                },
                "ID=host:port",
            ),
            (
                RunArgs {
                    brokers: vec!["2=h:1".into(), "2=h:2".into()],
                    ..args()
                },
                "twice",
            ),
            (
                RunArgs {
                    ack_quorum: Some(4),
                    ..args()
                },
                "--ack-quorum",
            ),
            (
                RunArgs {
                    retention_bytes: Some(0),
                    ..args()
                },
                "--retention-bytes",
            ),
            (
                RunArgs {
                    retention_ms: Some(0),
                    ..args()
                },
                "--retention-ms",
            ),
            (
                RunArgs {
                    heartbeat_ms: Some(1),
                    ..args()
                },
                "--heartbeat-ms",
            ),
            (
                RunArgs {
                    election_timeout_ms: Some(150),
                    ..args()
                },
                "--election-timeout-ms",
            ),
            (
                RunArgs {
                    read_buffer_bytes_max: Some(1024),
                    ..args()
                },
                "--read-buffer-bytes-max",
            ),
            (
                RunArgs {
                    partial_frame_timeout_ms: Some(0),
                    ..args()
                },
                "--partial-frame-timeout-ms",
            ),
            (
                RunArgs {
                    idle_timeout_ms: Some(10),
                    ..args()
                },
                "--idle-timeout-ms",
            ),
            (
                RunArgs {
                    connections_max: Some(0),
                    ..args()
                },
                "--connections-max",
            ),
            (
                RunArgs {
                    connections_max: Some(CONNECTIONS_MAX_LIMIT + 1),
                    ..args()
                },
                "--connections-max",
            ),
        ];
        for (a, want) in cases {
            let err = BrokerConfig::from_args(&a).expect_err(want).to_string();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }
}
