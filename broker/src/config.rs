//! The command line of `quire-broker run` ([`RunArgs`], clap, kept in the library so the
//! `quire` CLI can carry `quire broker run` over the same code), how each setting is named
//! and read ([`schema`]), and the resolved settings ([`BrokerConfig`]). A setting comes
//! from a flag, a `QUIRE_BROKER_*` variable, the `--config` TOML file (or
//! `QUIRE_BROKER_CONFIG`), or its default, in that order of precedence (`quire_net::layers`
//! has the rules; docs/operations.md the table of every setting).
//!
//! ```toml
//! id = 1
//! data_dir = "/var/lib/quire/broker-1"
//! listen = "0.0.0.0:7201"
//! stores = ["10.0.0.1:7101", "10.0.0.2:7101", "10.0.0.3:7101"]
//! brokers = ["1=10.0.0.1:7201", "2=10.0.0.2:7201"]
//! ack_quorum = 2                  # default: majority of the stores
//! metrics_listen = "127.0.0.1:9201"
//! kafka_listen = "0.0.0.0:9092"  # Kafka clients' listener (docs/kafka.md); unset: none
//! kafka_brokers = ["1=10.0.0.1:9092", "2=10.0.0.2:9092"] # every broker's Kafka address
//! log_format = "json"             # or "pretty"
//! heartbeat = "100ms"
//! election_timeout = "500ms"
//! produce_timeout = "10s"
//! retention_bytes = "10GiB"       # keep at least the newest 10 GiB of payload; default: no limit
//! retention_age = "168h"          # keep events stabilized less than 7 days ago; default: no limit
//! checkpoint_part_bytes = "8MiB"  # a larger checkpoint is written as several events
//! recent_bytes_max = "64MiB"      # newest stabilized events kept in memory (fetches, catch-up)
//! topics_max = 65536              # a produce to one more new topic gets LimitReached
//! cursors_max = 1048576           # a commit of one more new cursor gets LimitReached
//! read_buffer_bytes_max = "64MiB" # incoming frames buffered, all connections together
//! partial_frame_timeout = "10s"   # a frame must be whole this long after its first byte
//! idle_timeout = "10m"            # a connection silent this long is closed; "0s": never
//! message_bytes_max = "1MiB"      # largest producer message; keep below the stores' segment size
//! connections_max = 10000         # more get Overloaded and are closed (64 more kept for brokers)
//! connections_per_address_max = 0 # of connections_max, per IP address; 0: no bound
//! connections_per_principal_max = 0 # per TLS client certificate name; 0: no bound
//! fetch_responses_bytes_max = "256MiB" # fetch answers not yet written, all connections together
//! authorization = "acl"           # check requests against the ACL entries; default "none"
//! super_users = ["admin"]         # principals allowed everything
//! ```
//!
//! The same as flags (`--heartbeat 100ms --retention-age 168h`) or variables
//! (`QUIRE_BROKER_HEARTBEAT=100ms`). The spellings before units (`heartbeat_ms`,
//! `election_timeout_ms`, `produce_timeout_ms`, `retention_ms`, `partial_frame_timeout_ms`,
//! `idle_timeout_ms`: bare milliseconds, as keys and flags) still work for one release,
//! with a deprecation warning.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use quire_net::layers::{
    self, Granularity, HasSchema, Kind, PrintFormat, Resolved, Schema, Setting, SettingFlags,
    SettingsError, Value,
};
use quire_net::{ReadSettings, TlsSettings, CONNECTIONS_MAX_DEFAULT, CONNECTIONS_MAX_LIMIT};
use quire_proto::{BrokerId, ADDR_BYTES_MAX, MESSAGE_BYTES_MAX};
use quire_tls::ClientAuth;
use serde::Deserialize;

use crate::core::{quorum, SLOTS_MAX};
use crate::engine::recent::RECENT_BYTES_MAX_DEFAULT;
use crate::engine::{CHECKPOINT_PART_BYTES_DEFAULT, CHECKPOINT_PART_BYTES_MAX};

/// Largest `recent_bytes_max`, in bytes (1 TiB).
pub const RECENT_BYTES_LIMIT: u64 = 1 << 40;
use crate::retention::RetentionPolicy;
use crate::state::{CURSORS_MAX, TOPICS_MAX};

/// Default `heartbeat`, in milliseconds.
pub const HEARTBEAT_MS_DEFAULT: u64 = 100;
/// Default `election_timeout`, in milliseconds (the shortest silence before a takeover).
pub const ELECTION_TIMEOUT_MS_DEFAULT: u64 = 500;
/// Default `produce_timeout`, in milliseconds: a produce not stabilized by then fails (`NoQuorum`).
pub const PRODUCE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Longest `produce_timeout` accepted, in milliseconds.
pub const PRODUCE_TIMEOUT_MS_MAX: u64 = 600_000;
/// Default `message_bytes_max`: 1 MiB, about Kafka's `message.max.bytes` default. A store
/// cannot hold an event larger than its segment (`segment_bytes_max`), so this must stay
/// below the stores' segment size; a larger message is refused at once (`MessageTooLarge`,
/// never retried) instead of being refused by every store.
pub const MESSAGE_BYTES_MAX_DEFAULT: usize = 1 << 20;
/// Shortest `heartbeat` accepted, in milliseconds.
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

/// `quire-broker run`. Every setting is a flag here (`--heartbeat 100ms`), a
/// `QUIRE_BROKER_*` variable (`QUIRE_BROKER_HEARTBEAT=100ms`) and a key of the `--config`
/// TOML file (`heartbeat = "100ms"`); flag beats variable beats file beats default.
#[derive(Clone, Debug, Default, Args)]
pub struct RunArgs {
    /// Every setting, as given on the command line ([`schema`] lists them).
    #[command(flatten)]
    pub settings: SettingFlags<BrokerSettings>,
    /// A TOML file with settings (docs/operations.md lists the keys) [env: QUIRE_BROKER_CONFIG].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print every effective setting and where it came from (default, file, env, flag), then
    /// exit without serving (non-zero if the settings are not valid).
    #[arg(long)]
    pub print_config: bool,
    /// How --print-config writes: text or json.
    #[arg(
        long,
        value_enum,
        value_name = "FORMAT",
        default_value_t,
        requires = "print_config"
    )]
    pub format: PrintFormat,
}

/// The prefix of quire-broker's environment variables (`QUIRE_BROKER_HEARTBEAT`, ...).
pub const ENV_PREFIX: &str = "QUIRE_BROKER_";

/// quire-broker's settings as a type, for [`SettingFlags`].
#[derive(Clone, Copy, Debug, Default)]
pub struct BrokerSettings;

impl HasSchema for BrokerSettings {
    fn schema() -> Schema {
        schema()
    }
}

/// Every setting of `quire-broker run`, in `--print-config` order, with its default.
#[must_use]
pub fn schema() -> Schema {
    let ms = |v: u64| Value::Duration(Duration::from_millis(v));
    let read = ReadSettings::default();
    let millis = Kind::Duration(Granularity::Millis);
    let settings = vec![
        Setting::new(
            "id",
            Kind::Count,
            "This broker's id (1..=65535), the low 16 bits of its epochs; it must be in brokers (required)",
        ),
        Setting::new(
            "data_dir",
            Kind::Text,
            "The data directory (created if needed): epoch counter and cluster file (required)",
        ),
        Setting::new(
            "listen",
            Kind::Text,
            "Address to serve clients and brokers on, host:port (port 0 picks one, printed as `listening on ADDR`); unset: this broker's address in brokers",
        ),
        Setting::new(
            "stores",
            Kind::List,
            "The event stores, host:port each, comma separated; fixed for the cluster's life (required)",
        ),
        Setting::new(
            "brokers",
            Kind::List,
            "Every broker of the cluster as ID=host:port, comma separated, this one included (required)",
        ),
        Setting::new(
            "ack_quorum",
            Kind::Count,
            "Stores that must persist an event before it is stabilized; unset: a majority",
        ),
        Setting::new(
            "metrics_listen",
            Kind::Text,
            "Address to serve GET /metrics (Prometheus), /healthz and /ready on; unset: none",
        ),
        Setting::new(
            "kafka_listen",
            Kind::Text,
            "Address to serve Kafka clients on, host:port (docs/kafka.md; TLS with the [tls] certificate as the client listener, optional SASL SCRAM-SHA-256 logins); unset: no Kafka listener",
        ),
        Setting::new(
            "kafka_brokers",
            Kind::List,
            "Every broker's Kafka address as ID=host:port, comma separated, for Kafka clients' metadata; unset: this broker's kafka_listen only",
        ),
        Setting::new("log_format", Kind::Choice(&["pretty", "json"]), "Log line format on stderr")
            .default_value(Value::Text("pretty".to_owned())),
        Setting::new("heartbeat", millis, "How often the master heartbeats slaves and stores")
            .old("heartbeat_ms")
            .default_value(ms(HEARTBEAT_MS_DEFAULT)),
        Setting::new(
            "election_timeout",
            millis,
            "Shortest silence from the master before a slave takes over (plus a random half of it, and a quarter per rank); at least twice heartbeat",
        )
        .old("election_timeout_ms")
        .default_value(ms(ELECTION_TIMEOUT_MS_DEFAULT)),
        Setting::new(
            "produce_timeout",
            millis,
            "How long a produce may wait to be stabilized before it fails",
        )
        .old("produce_timeout_ms")
        .default_value(ms(PRODUCE_TIMEOUT_MS_DEFAULT)),
        Setting::new(
            "retention_bytes",
            Kind::Size,
            "Retention by size: trim whole segments once at least this many payload bytes of newer stabilized events remain; unset: no size limit",
        ),
        Setting::new(
            "retention_age",
            millis,
            "Retention by age: trim whole segments of events stabilized at least this long ago; unset: no age limit",
        )
        .old("retention_ms"),
        Setting::new(
            "checkpoint_part_bytes",
            Kind::Size,
            "A retention checkpoint whose broker state encodes longer than this is written as several Trim events of at most this many bytes each (4KiB..=16MiB less 2KiB)",
        )
        .default_value(Value::Size(CHECKPOINT_PART_BYTES_DEFAULT as u64)),
        Setting::new(
            "recent_bytes_max",
            Kind::Size,
            "Bytes of the newest stabilized events the master keeps in memory (event headers counted), to serve fetches and to catch up stores that lag; older ones are read from a store (0..=1TiB)",
        )
        .default_value(Value::Size(RECENT_BYTES_MAX_DEFAULT)),
        Setting::new(
            "topics_max",
            Kind::Count,
            "Most topics the cluster holds; a produce that would create one more is refused with LimitReached (1..=65536)",
        )
        .default_value(Value::Count(TOPICS_MAX as u64)),
        Setting::new(
            "cursors_max",
            Kind::Count,
            "Most durable consumer cursors the cluster holds; a commit of one more new cursor is refused with LimitReached (1..=1048576)",
        )
        .default_value(Value::Count(CURSORS_MAX as u64)),
        Setting::new(
            "read_buffer_bytes_max",
            Kind::Size,
            "Bytes of incoming frames buffered across all connections at most (at least 16MiB, one maximal frame)",
        )
        .default_value(Value::Size(read.read_buffer_bytes_max as u64)),
        Setting::new(
            "partial_frame_timeout",
            millis,
            "How long a frame may take from its first byte to its last before the connection is closed",
        )
        .old("partial_frame_timeout_ms")
        .default_value(ms(read.partial_frame_timeout_ms)),
        Setting::new(
            "idle_timeout",
            millis,
            "How long a connection may send nothing before it is closed; 0: never",
        )
        .old("idle_timeout_ms")
        .default_value(ms(read.idle_timeout_ms)),
        Setting::new(
            "message_bytes_max",
            Kind::Size,
            "Largest producer message accepted; keep it below the stores' segment_bytes_max",
        )
        .default_value(Value::Size(MESSAGE_BYTES_MAX_DEFAULT as u64)),
        Setting::new(
            "connections_max",
            Kind::Count,
            "Most connections open at once; 64 more are kept for other brokers, the rest get Overloaded",
        )
        .default_value(Value::Count(CONNECTIONS_MAX_DEFAULT as u64)),
        Setting::new(
            "connections_per_address_max",
            Kind::Count,
            "Most of connections_max one IP address may hold (0: no bound); beyond it, the peer reserve or Overloaded",
        )
        .default_value(Value::Count(0)),
        Setting::new(
            "connections_per_principal_max",
            Kind::Count,
            "Most of connections_max one principal (a TLS client certificate's common name) may hold (0: no bound); beyond it, Overloaded",
        )
        .default_value(Value::Count(0)),
        Setting::new(
            "fetch_responses_bytes_max",
            Kind::Size,
            "Most bytes of fetch answers held across all connections until written; fetches wait beyond it",
        )
        .default_value(Value::Size(FETCH_RESPONSES_BYTES_MAX_DEFAULT as u64)),
        Setting::new(
            "authorization",
            Kind::Choice(&["none", "acl"]),
            "acl: check produce, consume, commit and admin requests against the cluster's ACL entries (quire acl); none: allow everyone",
        )
        .default_value(Value::Text("none".to_owned())),
        Setting::new(
            "super_users",
            Kind::List,
            "Principals allowed everything whatever the ACL entries (user names, certificate common names, ANONYMOUS), comma separated",
        ),
    ];
    // Clients and the other brokers talk to a broker: with TLS on, a client may show a
    // certificate of the cluster's CA, and need not.
    let mut settings = settings;
    settings.extend(TlsSettings::schema(ClientAuth::Optional));
    Schema {
        program: "quire-broker",
        env_prefix: ENV_PREFIX,
        settings,
    }
}

/// Reads `args` and `env` (the process's variables; only `QUIRE_BROKER_*` are looked at)
/// into every setting's value and source.
///
/// # Errors
/// As [`layers::resolve`]: an unreadable file, an unknown key or variable, a bad value.
pub fn resolve(args: &RunArgs, env: &[(String, String)]) -> Result<Resolved, SettingsError> {
    layers::resolve(&args.settings, args.config.as_deref(), env)
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
    /// The Kafka listener's address (`None`: no Kafka listener).
    pub kafka_listen: Option<String>,
    /// Every broker's advertised Kafka address `(id, host:port)` as given (this broker's,
    /// if not given, is the address its Kafka listener is bound to).
    pub kafka_brokers: Vec<(BrokerId, String)>,
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
    /// Longest slice of a checkpoint's encoded broker state one Trim event carries, in
    /// bytes ([`CHECKPOINT_PART_BYTES_DEFAULT`]); a larger state is written in parts.
    pub checkpoint_part_bytes: usize,
    /// Most topics the state holds; a produce that would create one more is refused
    /// (`LimitReached`). At most (and by default) `state::TOPICS_MAX`.
    pub topics_max: usize,
    /// Bytes of the newest stabilized events the master keeps in memory to serve fetches
    /// and to catch up lagging stores (`recent_bytes_max`; the fetch window and
    /// [`crate::core::ReplicationLimits::retained_bytes_max`]); older ones are read from a
    /// store.
    pub recent_bytes_max: u64,
    /// Most durable cursors the state holds, likewise. At most (and by default)
    /// `state::CURSORS_MAX`.
    pub cursors_max: usize,
    /// How connections are read: the read budget and the partial-frame and idle timeouts.
    pub read: ReadSettings,
    /// Largest producer message accepted, in bytes.
    pub message_bytes_max: usize,
    /// Most connections open at once, besides quire-net's `PEER_CONNECTIONS_RESERVE` kept
    /// for other brokers.
    pub connections_max: usize,
    /// Most of the `connections_max` places one IP address may hold; 0 (the default, as
    /// Kafka's `max.connections.per.ip`): no bound. An address at its bound still reaches
    /// the peer reserve.
    pub connections_per_address_max: usize,
    /// Most of the `connections_max` places one principal (the common name of a verified
    /// TLS client certificate) may hold; 0 (the default): no bound.
    pub connections_per_principal_max: usize,
    /// Most bytes of fetch answers held across all connections, from serving a fetch until
    /// its answer's last byte is written ([`FETCH_RESPONSES_BYTES_MAX_DEFAULT`]).
    pub fetch_responses_bytes_max: usize,
    /// The `[tls]` table: the listener's TLS (unset files: plaintext), and the outgoing
    /// links' (to stores and brokers: TLS when `ca_file` is set).
    pub tls: TlsSettings,
    /// `authorization` and `super_users`: whether and how requests are checked against
    /// the ACL entries.
    pub auth: crate::security::AuthSettings,
}

/// Smallest `checkpoint_part_bytes`, in bytes: below it a checkpoint would take more
/// events than `CHECKPOINT_PARTS_MAX` sooner than it must.
pub const CHECKPOINT_PART_BYTES_MIN: usize = 4 * 1024;

/// Default most bytes of fetch answers a broker holds across all connections until they
/// are written; fetches wait beyond it. The per-connection bound alone
/// (`CONN_RESPONSE_BYTES_MAX`, 64 MiB) let N consumers that never read hold N × 64 MiB.
pub const FETCH_RESPONSES_BYTES_MAX_DEFAULT: usize = 256 * 1024 * 1024;

impl BrokerConfig {
    /// The settings for `quire-broker run`: flags, then this process's `QUIRE_BROKER_*`
    /// variables, then the config file, then the defaults.
    ///
    /// # Errors
    /// As [`resolve`] and [`BrokerConfig::from_resolved`]; each error names the setting.
    pub fn from_args(args: &RunArgs) -> Result<BrokerConfig, SettingsError> {
        let env = layers::process_env(ENV_PREFIX)?;
        BrokerConfig::from_resolved(&resolve(args, &env)?)
    }

    /// The broker's settings out of resolved layers.
    ///
    /// # Errors
    /// A missing or invalid setting; each error names it, its value and where it came from.
    pub fn from_resolved(r: &Resolved) -> Result<BrokerConfig, SettingsError> {
        let id = match r.required("id")? {
            Value::Count(n) => {
                u16::try_from(*n).map_err(|_| r.invalid("id", "must be in 1..=65535"))?
            }
            _ => return Err(r.invalid("id", "must be in 1..=65535")),
        };
        if id == 0 {
            return Err(r.invalid(
                "id",
                "0 is reserved (epoch 0 means \"no master\"); use 1..=65535",
            ));
        }
        r.required("data_dir")?;
        let data_dir = PathBuf::from(r.text("data_dir").unwrap_or_default());
        r.required("stores")?;
        let stores = r.list("stores");
        if stores.is_empty() {
            return Err(r.invalid("stores", "name at least one store (host:port)"));
        }
        for s in &stores {
            check_addr(s).map_err(|m| r.invalid("stores", m))?;
        }
        let mut sorted = stores.clone();
        sorted.sort();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(r.invalid("stores", "names a store twice"));
        }
        r.required("brokers")?;
        let brokers =
            parse_brokers(&r.list("brokers")).map_err(|e| r.invalid("brokers", e.to_string()))?;
        let me = BrokerId(id);
        let Some((_, my_addr)) = brokers.iter().find(|(b, _)| *b == me) else {
            return Err(r.invalid("brokers", format!("does not name this broker (id {id})")));
        };
        if stores.len() + brokers.len() - 1 > SLOTS_MAX {
            return Err(r.invalid(
                "stores",
                format!(
                    "{} stores and {} other brokers exceed the {SLOTS_MAX} replication slots",
                    stores.len(),
                    brokers.len() - 1
                ),
            ));
        }
        let ack_quorum = r
            .usize("ack_quorum")?
            .unwrap_or_else(|| quorum::majority(stores.len()));
        if ack_quorum == 0 || ack_quorum > stores.len() {
            return Err(r.invalid(
                "ack_quorum",
                format!("must be in 1..={} (the number of stores)", stores.len()),
            ));
        }
        let listen = r
            .text("listen")
            .map_or_else(|| my_addr.clone(), str::to_owned);
        quire_net::layers::check_host_port(&listen).map_err(|m| r.invalid("listen", m))?;
        if let Some(addr) = r.text("metrics_listen") {
            quire_net::layers::check_host_port(addr).map_err(|m| r.invalid("metrics_listen", m))?;
        }
        let kafka_listen = r.text("kafka_listen").map(str::to_owned);
        if let Some(addr) = &kafka_listen {
            quire_net::layers::check_host_port(addr).map_err(|m| r.invalid("kafka_listen", m))?;
        }
        let kafka_entries = r.list("kafka_brokers");
        let kafka_brokers = if kafka_entries.is_empty() {
            Vec::new()
        } else {
            parse_brokers(&kafka_entries).map_err(|e| r.invalid("kafka_brokers", e.to_string()))?
        };
        let heartbeat = r.duration("heartbeat").unwrap_or_default();
        if heartbeat < Duration::from_millis(HEARTBEAT_MS_MIN) {
            return Err(r.invalid(
                "heartbeat",
                format!("must be at least {HEARTBEAT_MS_MIN}ms"),
            ));
        }
        let election_timeout = r.duration("election_timeout").unwrap_or_default();
        if election_timeout < 2 * heartbeat {
            return Err(r.invalid(
                "election_timeout",
                format!(
                    "must be at least twice heartbeat ({})",
                    Value::Duration(heartbeat)
                ),
            ));
        }
        let produce_timeout = r.duration("produce_timeout").unwrap_or_default();
        if produce_timeout.is_zero()
            || produce_timeout > Duration::from_millis(PRODUCE_TIMEOUT_MS_MAX)
        {
            return Err(r.invalid(
                "produce_timeout",
                format!(
                    "must be in 1ms..={}",
                    Value::Duration(Duration::from_millis(PRODUCE_TIMEOUT_MS_MAX))
                ),
            ));
        }
        let millis = |key: &str, d: Duration| {
            u64::try_from(d.as_millis()).map_err(|_| r.invalid(key, "too long"))
        };
        let retention = RetentionPolicy {
            bytes_max: r.size("retention_bytes"),
            age_ms_max: match r.duration("retention_age") {
                Some(d) => Some(millis("retention_age", d)?),
                None => None,
            },
        };
        if retention.bytes_max == Some(0) {
            return Err(r.invalid(
                "retention_bytes",
                "0 would trim every event; leave it unset to keep everything",
            ));
        }
        if retention.age_ms_max == Some(0) {
            return Err(r.invalid(
                "retention_age",
                "0 would trim every event; leave it unset to keep everything",
            ));
        }
        let read = ReadSettings {
            read_buffer_bytes_max: r.usize("read_buffer_bytes_max")?.unwrap_or_default(),
            partial_frame_timeout_ms: millis(
                "partial_frame_timeout",
                r.duration("partial_frame_timeout").unwrap_or_default(),
            )?,
            idle_timeout_ms: millis(
                "idle_timeout",
                r.duration("idle_timeout").unwrap_or_default(),
            )?,
        };
        if let Err(e) = read.validate() {
            return Err(r.invalid(
                e.setting,
                format!("must be in {}..={}{}", e.min, e.max, e.note),
            ));
        }
        let message_bytes_max = r.usize("message_bytes_max")?.unwrap_or_default();
        if message_bytes_max == 0 || message_bytes_max > MESSAGE_BYTES_MAX {
            return Err(r.invalid(
                "message_bytes_max",
                format!("must be in 1..={MESSAGE_BYTES_MAX} bytes"),
            ));
        }
        let connections_max = r.usize("connections_max")?.unwrap_or_default();
        if connections_max == 0 || connections_max > CONNECTIONS_MAX_LIMIT {
            return Err(r.invalid(
                "connections_max",
                format!("must be in 1..={CONNECTIONS_MAX_LIMIT}"),
            ));
        }
        let connections_per_address_max =
            r.usize("connections_per_address_max")?.unwrap_or_default();
        let connections_per_principal_max = r
            .usize("connections_per_principal_max")?
            .unwrap_or_default();
        if connections_per_address_max > connections_max {
            return Err(r.invalid(
                "connections_per_address_max",
                format!(
                    "must be at most connections_max ({connections_max}): it is a share of that pool (0: no bound)"
                ),
            ));
        }
        let fetch_responses_bytes_max = r.usize("fetch_responses_bytes_max")?.unwrap_or_default();
        if !(crate::server::CONN_RESPONSE_BYTES_MAX..=u32::MAX as usize)
            .contains(&fetch_responses_bytes_max)
        {
            return Err(r.invalid(
                "fetch_responses_bytes_max",
                format!(
                    "must be in {}..={} bytes (at least one connection's answer bound)",
                    crate::server::CONN_RESPONSE_BYTES_MAX,
                    u32::MAX
                ),
            ));
        }
        let checkpoint_part_bytes = r.usize("checkpoint_part_bytes")?.unwrap_or_default();
        if !(CHECKPOINT_PART_BYTES_MIN..=CHECKPOINT_PART_BYTES_MAX).contains(&checkpoint_part_bytes)
        {
            return Err(r.invalid(
                "checkpoint_part_bytes",
                format!(
                    "must be in {CHECKPOINT_PART_BYTES_MIN}..={CHECKPOINT_PART_BYTES_MAX} bytes"
                ),
            ));
        }
        let recent_bytes_max = r.usize("recent_bytes_max")?.unwrap_or_default() as u64;
        if recent_bytes_max > RECENT_BYTES_LIMIT {
            return Err(r.invalid(
                "recent_bytes_max",
                format!("must be at most {RECENT_BYTES_LIMIT} bytes (1TiB)"),
            ));
        }
        let topics_max = r.usize("topics_max")?.unwrap_or_default();
        if !(1..=TOPICS_MAX).contains(&topics_max) {
            return Err(r.invalid("topics_max", format!("must be in 1..={TOPICS_MAX}")));
        }
        let cursors_max = r.usize("cursors_max")?.unwrap_or_default();
        if !(1..=CURSORS_MAX).contains(&cursors_max) {
            return Err(r.invalid("cursors_max", format!("must be in 1..={CURSORS_MAX}")));
        }
        let tls = TlsSettings::from_resolved(r)?;
        let auth = crate::security::AuthSettings {
            authorization: r.text("authorization") == Some("acl"),
            super_users: r.list("super_users"),
        };
        // Without client certificates checked, nothing tells a broker from anyone else: any
        // client could send the brokers' own appends and take-over requests, forge a user
        // on a slave and make it master (a break-it trial did). ACL entries would protect
        // nothing, so they are refused rather than given a false sense of safety.
        let peers_checked = tls.files.cert.is_some()
            && tls.files.ca.is_some()
            && tls.client_auth != ClientAuth::None;
        if auth.authorization && !peers_checked {
            return Err(r.invalid(
                "authorization",
                "\"acl\" needs TLS with client certificates checked ([tls] cert_file, key_file and ca_file, client_auth optional or required): on plaintext any client can send the brokers' own replication and take-over requests, so ACL entries would protect nothing",
            ));
        }
        Ok(BrokerConfig {
            id: me,
            data_dir,
            listen,
            stores,
            brokers,
            ack_quorum,
            metrics_listen: r.text("metrics_listen").map(str::to_owned),
            kafka_listen,
            kafka_brokers,
            log_format: match r.text("log_format") {
                Some("json") => LogFormat::Json,
                _ => LogFormat::Pretty,
            },
            heartbeat,
            election_timeout,
            produce_timeout,
            retention,
            checkpoint_part_bytes,
            topics_max,
            recent_bytes_max,
            cursors_max,
            read,
            message_bytes_max,
            connections_max,
            connections_per_address_max,
            connections_per_principal_max,
            fetch_responses_bytes_max,
            tls,
            auth,
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

fn check_addr(addr: &str) -> Result<(), String> {
    if addr.is_empty() || addr.len() > ADDR_BYTES_MAX || !addr.contains(':') {
        return Err(format!(
            "{addr:?} is not a host:port address of at most {ADDR_BYTES_MAX} bytes"
        ));
    }
    Ok(())
}

/// Parses `ID=host:port` entries; ids must be distinct and non-zero.
///
/// # Errors
/// A malformed entry, id 0, or a repeated id.
pub fn parse_brokers(entries: &[String]) -> anyhow::Result<Vec<(BrokerId, String)>> {
    if entries.is_empty() {
        bail!("name every broker as ID=host:port, comma separated");
    }
    let mut out: Vec<(BrokerId, String)> = Vec::new();
    for e in entries {
        let e = e.trim();
        let Some((id, addr)) = e.split_once('=') else {
            bail!("{e:?} is not ID=host:port");
        };
        let id: u16 = id
            .trim()
            .parse()
            .with_context(|| format!("{e:?}: the id is not a number in 1..=65535"))?;
        if id == 0 {
            bail!("{e:?}: id 0 is reserved");
        }
        let addr = addr.trim().to_owned();
        if let Err(m) = check_addr(&addr) {
            bail!("{m}");
        }
        if out.iter().any(|(b, _)| b.0 == id) {
            bail!("broker {id} is named twice");
        }
        out.push((BrokerId(id), addr));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_net::layers::Source;
    use std::path::Path;

    const BASE: [(&str, &str); 4] = [
        ("id", "2"),
        ("data_dir", "/tmp/x"),
        ("stores", "h:1,h:2,h:3"),
        ("brokers", "1=h:11,2=h:12"),
    ];

    fn args_with(config: Option<&Path>, flags: &[(&str, &str)]) -> RunArgs {
        RunArgs {
            settings: SettingFlags::from_pairs(flags),
            config: config.map(Path::to_owned),
            ..RunArgs::default()
        }
    }

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<(&str, &str)> = BASE
            .iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .copied()
            .collect();
        v.extend_from_slice(extra);
        v
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn config(args: &RunArgs, env_pairs: &[(&str, &str)]) -> Result<BrokerConfig, SettingsError> {
        BrokerConfig::from_resolved(&resolve(args, &env(env_pairs))?)
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("broker.toml");
        std::fs::write(&path, text).expect("writes");
        (dir, path)
    }

    #[test]
    fn flags_resolve_with_defaults() {
        let c = config(&args_with(None, &BASE), &[]).expect("valid");
        assert_eq!(c.id, BrokerId(2));
        assert_eq!(c.ack_quorum, 2);
        assert_eq!(
            c.listen, "h:12",
            "listens on its own broker address by default"
        );
        assert_eq!(c.advertised_addr(), "h:12");
        assert_eq!(c.broker_addr(BrokerId(1)), Some("h:11"));
        assert_eq!(c.heartbeat, Duration::from_millis(HEARTBEAT_MS_DEFAULT));
        assert_eq!(
            c.election_timeout,
            Duration::from_millis(ELECTION_TIMEOUT_MS_DEFAULT)
        );
        assert_eq!(
            c.produce_timeout,
            Duration::from_millis(PRODUCE_TIMEOUT_MS_DEFAULT)
        );
        assert_eq!(c.read, ReadSettings::default());
        assert_eq!(c.message_bytes_max, MESSAGE_BYTES_MAX_DEFAULT);
        assert_eq!(c.connections_max, CONNECTIONS_MAX_DEFAULT);
        assert!(
            c.retention.is_off(),
            "retention keeps everything by default"
        );
    }

    #[test]
    fn retention_comes_from_the_file_variables_or_flags() {
        let (_dir, path) = file(
            "id = 2\ndata_dir = \"/d\"\nstores = [\"h:1\"]\nbrokers = [\"2=h:9\"]\nretention_bytes = \"1000\"\nretention_age = \"1m\"\n",
        );
        let from_file = config(&args_with(Some(&path), &[]), &[]).expect("valid");
        assert_eq!(from_file.retention.bytes_max, Some(1000));
        assert_eq!(from_file.retention.age_ms_max, Some(60_000));
        let layered = config(
            &args_with(Some(&path), &[("retention_bytes", "5")]),
            &[("QUIRE_BROKER_RETENTION_AGE", "2h")],
        )
        .expect("valid");
        assert_eq!(layered.retention.bytes_max, Some(5));
        assert_eq!(layered.retention.age_ms_max, Some(7_200_000));
    }

    #[test]
    fn flags_beat_variables_beat_the_file_beats_defaults() {
        let (_dir, path) = file(
            "id = 1\ndata_dir = \"/d\"\nstores = [\"a:1\", \"b:1\", \"c:1\"]\nbrokers = [\"1=a:9\"]\nack_quorum = 3\nheartbeat = \"50ms\"\npartial_frame_timeout = \"2500ms\"\nproduce_timeout = \"3s\"\n",
        );
        let args = args_with(Some(&path), &[("ack_quorum", "2"), ("heartbeat", "20ms")]);
        let vars = [
            ("QUIRE_BROKER_HEARTBEAT", "30ms"),
            ("QUIRE_BROKER_ACK_QUORUM", "1"),
            ("QUIRE_BROKER_PRODUCE_TIMEOUT", "4s"),
            ("QUIRE_BROKERS", "not ours: the quire CLI's"),
        ];
        let r = resolve(&args, &env(&vars)).expect("resolves");
        let c = BrokerConfig::from_resolved(&r).expect("valid");
        assert_eq!((c.id, c.ack_quorum), (BrokerId(1), 2));
        assert_eq!(r.source("ack_quorum"), &Source::Flag("--ack-quorum".into()));
        assert_eq!(c.heartbeat, Duration::from_millis(20));
        assert_eq!(c.produce_timeout, Duration::from_secs(4));
        assert_eq!(
            r.source("produce_timeout"),
            &Source::Env("QUIRE_BROKER_PRODUCE_TIMEOUT".into())
        );
        assert_eq!(c.read.partial_frame_timeout_ms, 2500);
        assert_eq!(
            r.source("partial_frame_timeout"),
            &Source::File(path.clone())
        );
        assert_eq!(c.election_timeout, Duration::from_millis(500));
        assert_eq!(r.source("election_timeout"), &Source::Default);
        let (_dir, bad) = file("idd = 1\n");
        let err = config(&args_with(Some(&bad), &[]), &[])
            .expect_err("typo")
            .to_string();
        assert!(
            err.contains("unknown setting `idd`") && err.contains("did you mean id?"),
            "{err}"
        );
    }

    #[test]
    fn old_spellings_still_work_and_warn() {
        let (_dir, path) = file(
            "id = 1\ndata_dir = \"/d\"\nstores = [\"a:1\"]\nbrokers = [\"1=a:9\"]\nheartbeat_ms = 50\nretention_ms = 60000\n",
        );
        let args = args_with(
            Some(&path),
            &[
                ("election_timeout_ms", "600"),
                ("produce_timeout_ms", "2000"),
            ],
        );
        let r = resolve(&args, &[]).expect("resolves");
        let c = BrokerConfig::from_resolved(&r).expect("valid");
        assert_eq!(c.heartbeat, Duration::from_millis(50));
        assert_eq!(c.election_timeout, Duration::from_millis(600));
        assert_eq!(c.produce_timeout, Duration::from_secs(2));
        assert_eq!(c.retention.age_ms_max, Some(60_000));
        let all = r.warnings.join("\n");
        assert_eq!(r.warnings.len(), 4, "{all}");
        assert!(all.contains("heartbeat_ms (in "), "{all}");
        assert!(
            all.contains("is deprecated; use heartbeat = \"50ms\""),
            "{all}"
        );
        assert!(all.contains("use retention_age = \"1m\""), "{all}");
        assert!(
            all.contains("--election-timeout-ms is deprecated; use --election-timeout 600ms"),
            "{all}"
        );
        let err = config(
            &args_with(
                None,
                &with(&[("heartbeat_ms", "50"), ("heartbeat", "50ms")]),
            ),
            &[],
        )
        .expect_err("both")
        .to_string();
        assert!(
            err.contains("heartbeat and its old spelling heartbeat_ms"),
            "{err}"
        );
    }

    #[test]
    fn bad_settings_name_themselves() {
        let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
            (
                BASE[1..].to_vec(),
                "id is required: pass --id, set QUIRE_BROKER_ID",
            ),
            (with(&[("id", "0")]), "id = 0 (flag --id): 0 is reserved"),
            (with(&[("id", "70000")]), "id = 70000"),
            (with(&[("id", "3")]), "does not name this broker"),
            (with(&[("stores", "")]), "stores"),
            (with(&[("stores", "h:1,h:1")]), "twice"),
            (with(&[("brokers", "1h:11")]), "ID=host:port"),
            (with(&[("brokers", "2=h:1,2=h:2")]), "twice"),
            (
                with(&[("ack_quorum", "4")]),
                "ack_quorum = 4 (flag --ack-quorum)",
            ),
            (with(&[("retention_bytes", "0")]), "retention_bytes = 0"),
            (with(&[("retention_age", "0s")]), "retention_age = 0s"),
            (with(&[("topics_max", "0")]), "topics_max = 0"),
            (
                with(&[("connections_per_address_max", "20000")]),
                "must be at most connections_max (10000)",
            ),
            (with(&[("cursors_max", "2000000")]), "cursors_max = 2000000"),
            (
                with(&[("checkpoint_part_bytes", "1KiB")]),
                "checkpoint_part_bytes = 1KiB",
            ),
            (
                with(&[("checkpoint_part_bytes", "16MiB")]),
                "checkpoint_part_bytes = 16MiB",
            ),
            (
                with(&[("heartbeat", "1ms")]),
                "heartbeat = 1ms (flag --heartbeat)",
            ),
            (
                with(&[("heartbeat", "50mss")]),
                "heartbeat = \"50mss\" (flag --heartbeat) is not a duration like 50ms, 10s, 2m",
            ),
            (with(&[("heartbeat", "100")]), "a unit is required"),
            (
                with(&[("election_timeout", "150ms")]),
                "election_timeout = 150ms",
            ),
            (
                with(&[("read_buffer_bytes_max", "1KiB")]),
                "read_buffer_bytes_max = 1KiB",
            ),
            (
                with(&[("partial_frame_timeout", "0s")]),
                "partial_frame_timeout = 0s",
            ),
            (with(&[("idle_timeout", "10ms")]), "idle_timeout = 10ms"),
            (with(&[("connections_max", "0")]), "connections_max = 0"),
            (
                with(&[("connections_max", "ten")]),
                "connections_max = \"ten\" (flag --connections-max) is not a whole number",
            ),
            (with(&[("message_bytes_max", "1G")]), "ambiguous"),
        ];
        for (flags, want) in cases {
            let err = config(&args_with(None, &flags), &[])
                .expect_err(want)
                .to_string();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
        let err = config(
            &args_with(None, &BASE),
            &[("QUIRE_BROKER_HEARTBEAT_MS", "50")],
        )
        .expect_err("no such variable")
        .to_string();
        assert!(
            err.contains("unknown environment variable QUIRE_BROKER_HEARTBEAT_MS")
                && err.contains("did you mean QUIRE_BROKER_HEARTBEAT?"),
            "{err}"
        );
        let err = config(
            &args_with(None, &BASE),
            &[("QUIRE_BROKER_HEARTBEAT", "50mss")],
        )
        .expect_err("bad value")
        .to_string();
        assert!(err.contains("(env QUIRE_BROKER_HEARTBEAT)"), "{err}");
    }

    #[test]
    fn every_setting_is_in_the_operations_table() {
        let doc = include_str!("../../docs/operations.md");
        for s in schema().settings {
            let row = format!(
                "| `--{}` | `QUIRE_BROKER_{}` |",
                s.key.replace('_', "-"),
                s.key.to_ascii_uppercase()
            );
            assert!(doc.contains(&row), "docs/operations.md lacks {row}");
        }
    }
}
