//! [`NodeConfig`]: every setting of a running node, and [`schema`]: how each is named and
//! read. A setting comes from a flag, a `QUIRE_NODE_*` variable, the TOML file given with
//! `--config` (or `QUIRE_NODE_CONFIG`), or its default, in that order of precedence
//! (`quire_net::layers` has the rules; docs/operations.md the table of every setting).
//! Durations take units (`10s`), sizes may (`64MiB`; a bare number is bytes).
//!
//! ```toml
//! data_dir = "/var/lib/quire/store-1"
//! listen = "0.0.0.0:7101"
//! metrics_listen = "127.0.0.1:9101"
//! log_format = "json"                       # or "pretty"
//!
//! [limits]
//! connections_max = 10000                  # more get Overloaded and are closed (64 more kept for brokers)
//! connections_per_address_max = 0          # of connections_max, per IP address; 0: no bound
//! connections_per_principal_max = 0        # per TLS client certificate name; 0: no bound
//! in_flight_bytes_per_connection_max = "64MiB"
//! in_flight_requests_per_connection_max = 4096
//! write_queue_frames_max = 4160
//! read_events_max = 65536
//! read_bytes_max = "8MiB"
//! read_responses_bytes_max = "256MiB"       # read responses not yet written, all connections
//! read_buffer_bytes_max = "64MiB"           # incoming frames buffered, all connections
//! partial_frame_timeout = "10s"             # a frame must be whole this long after its first byte
//! idle_timeout = "10m"                      # a connection silent this long is closed; "0s": never
//!
//! [wal]
//! segment_bytes_max = "256MiB"
//! batch_bytes_max = "1MiB"
//! batch_window = "200us"
//! queue_bytes_max = "256MiB"
//! io = "auto"                               # "uring", "sync"
//!
//! [socket]
//! send_buffer_bytes = "4MiB"                # unset: the kernel's autotuning
//! recv_buffer_bytes = "4MiB"
//!
//! [tls]                                     # unset files: plaintext
//! cert_file = "/etc/quire/store-1.pem"
//! key_file = "/etc/quire/store-1.key"
//! ca_file = "/etc/quire/ca.pem"             # brokers' client certificates chain to it
//! client_auth = "required"                  # "optional", "none"
//! ```
//!
//! The same as flags: `--connections-max 10000 --batch-window 200us`; as variables:
//! `QUIRE_NODE_CONNECTIONS_MAX=10000 QUIRE_NODE_BATCH_WINDOW=200us`. The spellings before
//! units (`partial_frame_timeout_ms`, `idle_timeout_ms`, `batch_window_us`, as keys and
//! flags) still work for one release, with a deprecation warning.

use std::path::{Path, PathBuf};

use std::time::Duration;

use quire_net::layers::{
    self, Granularity, HasSchema, Kind, Resolved, Schema, Setting, SettingsError, Value,
};
use quire_net::{
    ReadSettings, TlsSettings, IDLE_TIMEOUT_MS_DEFAULT, PARTIAL_FRAME_TIMEOUT_MS_DEFAULT,
    READ_BUFFER_BYTES_MAX_DEFAULT,
};
use quire_proto::{EVENTS_PER_FRAME_MAX, FRAME_BYTES_MAX};
use quire_tls::ClientAuth;
use quire_wal::{IoBackend, WalConfig};

use crate::cli::{LogFormat, RunArgs};

/// The prefix of quire-node's environment variables (`QUIRE_NODE_LISTEN`, ...).
pub const ENV_PREFIX: &str = "QUIRE_NODE_";

/// Default most connections open at once ([`quire_net::CONNECTIONS_MAX_DEFAULT`]); beyond
/// it, [`quire_net::PEER_CONNECTIONS_RESERVE`] more are kept for brokers, and the rest are
/// answered `Overloaded` and closed at once.
pub const CONNECTIONS_MAX: usize = quire_net::CONNECTIONS_MAX_DEFAULT;
/// Default most request bytes one connection may have unanswered (appends waiting for
/// their fsync, reads being served); the node stops reading that connection beyond it.
/// At least one maximal frame always fits.
pub const IN_FLIGHT_BYTES_PER_CONNECTION_MAX: usize = 64 * 1024 * 1024;
/// Default most requests one connection may have unanswered.
pub const IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX: usize = 4096;
/// Default most response frames queued for one connection's writer. A peer that lets its
/// queue fill (it does not read) is disconnected rather than allowed to stall the store.
pub const WRITE_QUEUE_FRAMES_MAX: usize = IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX + 64;
/// Default most events in one read response.
pub const READ_EVENTS_MAX: usize = EVENTS_PER_FRAME_MAX;
/// Default most payload bytes in one read response (at least one event is always sent).
pub const READ_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Default most bytes of read responses the node holds across all connections, from
/// serving a read until its response's last byte is written: reads wait beyond it. With
/// the per-connection bound alone, 16 peers that never read their answers held 869 MiB of
/// a store (a break-it trial, issue 16). At least one maximal frame.
pub const READ_RESPONSES_BYTES_MAX: usize = 256 * 1024 * 1024;

/// The `[limits]` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// See [`CONNECTIONS_MAX`].
    pub connections_max: usize,
    /// Most of the `connections_max` places one IP address may hold; 0 (the default, as
    /// Kafka's `max.connections.per.ip`): no bound. An address at its bound still reaches
    /// the peer reserve (quire-net's `ConnectionLimit::with_per_address_max`).
    pub connections_per_address_max: usize,
    /// Most of the `connections_max` places one principal (the common name of a verified
    /// TLS client certificate) may hold; 0 (the default): no bound.
    pub connections_per_principal_max: usize,
    /// See [`IN_FLIGHT_BYTES_PER_CONNECTION_MAX`].
    pub in_flight_bytes_per_connection_max: usize,
    /// See [`IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX`].
    pub in_flight_requests_per_connection_max: usize,
    /// See [`WRITE_QUEUE_FRAMES_MAX`].
    pub write_queue_frames_max: usize,
    /// See [`READ_EVENTS_MAX`].
    pub read_events_max: usize,
    /// See [`READ_BYTES_MAX`].
    pub read_bytes_max: usize,
    /// See [`READ_RESPONSES_BYTES_MAX`].
    pub read_responses_bytes_max: usize,
    /// Bytes of incoming frames buffered across all connections at most
    /// ([`quire_net::ReadSettings::read_buffer_bytes_max`]).
    pub read_buffer_bytes_max: usize,
    /// How long a frame may take from its first byte to its last, in milliseconds
    /// ([`quire_net::ReadSettings::partial_frame_timeout_ms`]).
    pub partial_frame_timeout_ms: u64,
    /// How long a connection may send nothing before it is closed, in milliseconds; 0:
    /// never ([`quire_net::ReadSettings::idle_timeout_ms`]).
    pub idle_timeout_ms: u64,
}

impl Limits {
    /// The settings the connection readers run with.
    #[must_use]
    pub fn read_settings(&self) -> ReadSettings {
        ReadSettings {
            read_buffer_bytes_max: self.read_buffer_bytes_max,
            partial_frame_timeout_ms: self.partial_frame_timeout_ms,
            idle_timeout_ms: self.idle_timeout_ms,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections_max: CONNECTIONS_MAX,
            connections_per_address_max: 0,
            connections_per_principal_max: 0,
            in_flight_bytes_per_connection_max: IN_FLIGHT_BYTES_PER_CONNECTION_MAX,
            in_flight_requests_per_connection_max: IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX,
            write_queue_frames_max: WRITE_QUEUE_FRAMES_MAX,
            read_events_max: READ_EVENTS_MAX,
            read_bytes_max: READ_BYTES_MAX,
            read_responses_bytes_max: READ_RESPONSES_BYTES_MAX,
            read_buffer_bytes_max: READ_BUFFER_BYTES_MAX_DEFAULT,
            partial_frame_timeout_ms: PARTIAL_FRAME_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: IDLE_TIMEOUT_MS_DEFAULT,
        }
    }
}

/// The `[wal]` table: [`quire_wal::WalConfig`]'s settings (see there for meanings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalSettings {
    /// Segment file size, in bytes.
    pub segment_bytes_max: u64,
    /// Most bytes in one group-commit batch.
    pub batch_bytes_max: u64,
    /// How long the first append of a batch may wait for more on an idle disk, in µs.
    pub batch_window_us: u64,
    /// Most bytes queued for the commit thread.
    pub queue_bytes_max: u64,
    /// `auto`, `uring` or `sync`.
    pub io: IoSetting,
    /// Whether a fresh log ends its first segment at a random point
    /// ([`WalConfig::stagger_rolls`]), so that a cluster's stores do not roll together.
    pub stagger_rolls: bool,
    /// How a fresh spare segment is prepared ([`quire_wal::SpareFill`]).
    pub spare_fill: quire_wal::SpareFill,
}

impl Default for WalSettings {
    fn default() -> Self {
        let d = WalConfig::default();
        WalSettings {
            segment_bytes_max: d.segment_bytes_max,
            batch_bytes_max: d.batch_bytes_max,
            batch_window_us: d.batch_window_us,
            queue_bytes_max: d.queue_bytes_max,
            io: IoSetting::Auto,
            // Unlike the WAL's own default: a store is one of a cluster's.
            stagger_rolls: true,
            spare_fill: d.spare_fill,
        }
    }
}

/// The WAL's disk backend, as written in the config file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoSetting {
    /// io_uring when available, else synchronous writes.
    #[default]
    Auto,
    /// io_uring or fail.
    Uring,
    /// pwrite + fdatasync.
    Sync,
}

/// The `[socket]` table: per-connection socket buffer sizes (unset: kernel autotuning).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SocketSettings {
    /// `SO_SNDBUF`, in bytes.
    pub send_buffer_bytes: Option<usize>,
    /// `SO_RCVBUF`, in bytes.
    pub recv_buffer_bytes: Option<usize>,
}

/// Everything a node runs with.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The data directory (identity file, `wal/`).
    pub data_dir: PathBuf,
    /// Store protocol address.
    pub listen: String,
    /// Metrics address, if any.
    pub metrics_listen: Option<String>,
    /// Log format.
    pub log_format: LogFormat,
    /// Bounds.
    pub limits: Limits,
    /// WAL settings.
    pub wal: WalSettings,
    /// Socket settings.
    pub socket: SocketSettings,
    /// The `[tls]` table: unset files, plaintext.
    pub tls: TlsSettings,
}

impl NodeConfig {
    /// Defaults for a node on `data_dir` listening on `listen` (tests, embedding).
    #[must_use]
    pub fn new(data_dir: impl Into<PathBuf>, listen: impl Into<String>) -> NodeConfig {
        NodeConfig {
            data_dir: data_dir.into(),
            listen: listen.into(),
            metrics_listen: None,
            log_format: LogFormat::Pretty,
            limits: Limits::default(),
            wal: WalSettings::default(),
            socket: SocketSettings::default(),
            tls: TlsSettings {
                client_auth: ClientAuth::Required,
                ..TlsSettings::default()
            },
        }
    }

    /// The settings for `quire-node run`: flags, then this process's `QUIRE_NODE_*`
    /// variables, then the config file, then the defaults.
    ///
    /// # Errors
    /// As [`resolve`] and [`NodeConfig::from_resolved`]; each error names the setting.
    pub fn from_args(args: &RunArgs) -> Result<NodeConfig, SettingsError> {
        let env = layers::process_env(ENV_PREFIX)?;
        NodeConfig::from_resolved(&resolve(args, &env)?)
    }

    /// The node's settings out of resolved layers.
    ///
    /// # Errors
    /// A missing data directory or listen address, or a setting out of its range (named,
    /// with its value and where it came from).
    pub fn from_resolved(r: &Resolved) -> Result<NodeConfig, SettingsError> {
        let text = |key: &str| -> Result<String, SettingsError> {
            match r.required(key)? {
                Value::Text(t) => Ok(t.clone()),
                other => Ok(other.to_string()),
            }
        };
        let num = |key: &str| -> Result<usize, SettingsError> {
            r.required(key)?;
            Ok(r.usize(key)?.unwrap_or_default())
        };
        let bytes = |key: &str| -> Result<u64, SettingsError> {
            r.required(key)?;
            Ok(r.size(key).unwrap_or_default())
        };
        let millis = |key: &str| -> Result<u64, SettingsError> {
            let d = r.duration(key).unwrap_or_default();
            u64::try_from(d.as_millis()).map_err(|_| r.invalid(key, "too long"))
        };
        let limits = Limits {
            connections_max: num("connections_max")?,
            connections_per_address_max: r
                .usize("connections_per_address_max")?
                .unwrap_or_default(),
            connections_per_principal_max: r
                .usize("connections_per_principal_max")?
                .unwrap_or_default(),
            in_flight_bytes_per_connection_max: num("in_flight_bytes_per_connection_max")?,
            in_flight_requests_per_connection_max: num("in_flight_requests_per_connection_max")?,
            write_queue_frames_max: num("write_queue_frames_max")?,
            read_events_max: num("read_events_max")?,
            read_bytes_max: num("read_bytes_max")?,
            read_responses_bytes_max: num("read_responses_bytes_max")?,
            read_buffer_bytes_max: num("read_buffer_bytes_max")?,
            partial_frame_timeout_ms: millis("partial_frame_timeout")?,
            idle_timeout_ms: millis("idle_timeout")?,
        };
        let batch_window = r.duration("batch_window").unwrap_or_default();
        let wal = WalSettings {
            segment_bytes_max: bytes("segment_bytes_max")?,
            batch_bytes_max: bytes("batch_bytes_max")?,
            batch_window_us: u64::try_from(batch_window.as_micros())
                .map_err(|_| r.invalid("batch_window", "too long"))?,
            queue_bytes_max: bytes("queue_bytes_max")?,
            io: match r.text("io") {
                Some("uring") => IoSetting::Uring,
                Some("sync") => IoSetting::Sync,
                _ => IoSetting::Auto,
            },
            stagger_rolls: r.text("stagger_rolls") != Some("off"),
            spare_fill: match r.text("spare_fill") {
                Some("allocate") => quire_wal::SpareFill::Allocate,
                _ => quire_wal::SpareFill::Zeros,
            },
        };
        let socket = SocketSettings {
            send_buffer_bytes: r.usize("send_buffer_bytes")?,
            recv_buffer_bytes: r.usize("recv_buffer_bytes")?,
        };
        let config = NodeConfig {
            data_dir: PathBuf::from(text("data_dir")?),
            listen: text("listen")?,
            metrics_listen: r.text("metrics_listen").map(str::to_owned),
            log_format: match r.text("log_format") {
                Some("json") => LogFormat::Json,
                _ => LogFormat::Pretty,
            },
            limits,
            wal,
            socket,
            tls: TlsSettings::from_resolved(r)?,
        };
        config
            .check()
            .map_err(|(key, message)| r.invalid(key, message))?;
        quire_net::layers::check_host_port(&config.listen).map_err(|m| r.invalid("listen", m))?;
        if let Some(addr) = &config.metrics_listen {
            quire_net::layers::check_host_port(addr).map_err(|m| r.invalid("metrics_listen", m))?;
        }
        Ok(config)
    }

    /// Checks the limits.
    ///
    /// # Errors
    /// A limit of zero, or an in-flight byte bound below one maximal frame; the message
    /// names the setting as `limits.KEY`.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.check()
            .map_err(|(key, message)| anyhow::anyhow!("limits.{key} {message}"))
    }

    /// The limit checks: the offending setting's key and what is wrong with it.
    fn check(&self) -> Result<(), (&'static str, String)> {
        let l = &self.limits;
        for (name, v) in [
            ("connections_max", l.connections_max),
            (
                "in_flight_requests_per_connection_max",
                l.in_flight_requests_per_connection_max,
            ),
            ("write_queue_frames_max", l.write_queue_frames_max),
            ("read_events_max", l.read_events_max),
            ("read_bytes_max", l.read_bytes_max),
        ] {
            if v == 0 {
                return Err((name, "must be positive".to_owned()));
            }
        }
        if l.in_flight_bytes_per_connection_max < FRAME_BYTES_MAX
            || l.in_flight_bytes_per_connection_max > u32::MAX as usize
        {
            return Err((
                "in_flight_bytes_per_connection_max",
                format!(
                    "must be between FRAME_BYTES_MAX ({FRAME_BYTES_MAX}) and {}",
                    u32::MAX
                ),
            ));
        }
        if l.read_responses_bytes_max < FRAME_BYTES_MAX
            || l.read_responses_bytes_max > u32::MAX as usize
        {
            return Err((
                "read_responses_bytes_max",
                format!(
                    "must be between FRAME_BYTES_MAX ({FRAME_BYTES_MAX}) and {}",
                    u32::MAX
                ),
            ));
        }
        if l.connections_max > quire_net::CONNECTIONS_MAX_LIMIT {
            return Err((
                "connections_max",
                format!("must be at most {}", quire_net::CONNECTIONS_MAX_LIMIT),
            ));
        }
        if l.connections_per_address_max > l.connections_max {
            return Err((
                "connections_per_address_max",
                format!(
                    "must be at most connections_max ({}): it is a share of that pool (0: no bound)",
                    l.connections_max
                ),
            ));
        }
        if l.read_events_max > EVENTS_PER_FRAME_MAX {
            return Err((
                "read_events_max",
                format!("must be at most {EVENTS_PER_FRAME_MAX}"),
            ));
        }
        if let Err(e) = l.read_settings().validate() {
            return Err((
                e.setting,
                format!("must be in {}..={}{}", e.min, e.max, e.note),
            ));
        }
        Ok(())
    }

    /// The WAL's configuration (the WAL lives in `data_dir/wal`).
    #[must_use]
    pub fn wal_config(&self) -> WalConfig {
        WalConfig {
            dir: wal_dir(&self.data_dir),
            segment_bytes_max: self.wal.segment_bytes_max,
            batch_bytes_max: self.wal.batch_bytes_max,
            batch_window_us: self.wal.batch_window_us,
            queue_bytes_max: self.wal.queue_bytes_max,
            io: match self.wal.io {
                IoSetting::Auto => IoBackend::Auto,
                IoSetting::Uring => IoBackend::Uring,
                IoSetting::Sync => IoBackend::Sync,
            },
            stagger_rolls: self.wal.stagger_rolls,
            spare_fill: self.wal.spare_fill,
            // A damaged record that valid ones follow opens as damaged: the store answers
            // reads of it `Corrupt`, grants no fence, and brokers repair it from the
            // other stores (docs/protocol.md, "Damaged records").
            damaged_records: quire_wal::DamagedRecords::Place,
        }
    }
}

/// Where a data directory keeps its WAL (segments, promised epoch, lock).
#[must_use]
pub fn wal_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("wal")
}

/// quire-node's settings as a type, for [`layers::SettingFlags`].
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeSettings;

impl HasSchema for NodeSettings {
    fn schema() -> Schema {
        schema()
    }
}

/// Reads `args` and `env` (the process's variables; only `QUIRE_NODE_*` are looked at) into
/// every setting's value and source.
///
/// # Errors
/// As [`layers::resolve`]: an unreadable file, an unknown key or variable, a bad value.
pub fn resolve(args: &RunArgs, env: &[(String, String)]) -> Result<Resolved, SettingsError> {
    layers::resolve(&args.settings, args.config.as_deref(), env)
}

/// Every setting of `quire-node run`, in `--print-config` order, with its default.
#[must_use]
pub fn schema() -> Schema {
    let limits = Limits::default();
    let wal = WalSettings::default();
    let size = |v: usize| Value::Size(v as u64);
    let count = |v: usize| Value::Count(v as u64);
    let ms = |v: u64| Value::Duration(Duration::from_millis(v));
    let settings = vec![
        Setting::new(
            "data_dir",
            Kind::Text,
            "The data directory, initialised by `quire-node init` (required)",
        ),
        Setting::new(
            "listen",
            Kind::Text,
            "Address to serve the store protocol on, host:port; port 0 picks a free one, printed as `listening on ADDR` (required)",
        ),
        Setting::new(
            "metrics_listen",
            Kind::Text,
            "Address to serve GET /metrics (Prometheus), /healthz and /ready on; unset: none",
        ),
        Setting::new("log_format", Kind::Choice(&["pretty", "json"]), "Log line format on stderr")
            .default_value(Value::Text("pretty".to_owned())),
        Setting::new(
            "connections_max",
            Kind::Count,
            "Most connections open at once; 64 more are kept for brokers, the rest get Overloaded",
        )
        .in_table("limits")
        .default_value(count(limits.connections_max)),
        Setting::new(
            "connections_per_address_max",
            Kind::Count,
            "Most of connections_max one IP address may hold (0: no bound); beyond it, the peer reserve or Overloaded",
        )
        .in_table("limits")
        .default_value(count(limits.connections_per_address_max)),
        Setting::new(
            "connections_per_principal_max",
            Kind::Count,
            "Most of connections_max one principal (a TLS client certificate's common name) may hold (0: no bound); beyond it, Overloaded",
        )
        .in_table("limits")
        .default_value(count(limits.connections_per_principal_max)),
        Setting::new(
            "in_flight_bytes_per_connection_max",
            Kind::Size,
            "Most request bytes one connection may have unanswered (at least one maximal frame)",
        )
        .in_table("limits")
        .default_value(size(limits.in_flight_bytes_per_connection_max)),
        Setting::new(
            "in_flight_requests_per_connection_max",
            Kind::Count,
            "Most requests one connection may have unanswered",
        )
        .in_table("limits")
        .default_value(count(limits.in_flight_requests_per_connection_max)),
        Setting::new(
            "write_queue_frames_max",
            Kind::Count,
            "Most response frames queued for one connection's writer",
        )
        .in_table("limits")
        .default_value(count(limits.write_queue_frames_max)),
        Setting::new("read_events_max", Kind::Count, "Most events in one read response")
            .in_table("limits")
            .default_value(count(limits.read_events_max)),
        Setting::new(
            "read_bytes_max",
            Kind::Size,
            "Most payload bytes in one read response (at least one event is always sent)",
        )
        .in_table("limits")
        .default_value(size(limits.read_bytes_max)),
        Setting::new(
            "read_responses_bytes_max",
            Kind::Size,
            "Most bytes of read responses held across all connections until written; reads wait beyond it",
        )
        .in_table("limits")
        .default_value(size(limits.read_responses_bytes_max)),
        Setting::new(
            "read_buffer_bytes_max",
            Kind::Size,
            "Bytes of incoming frames buffered across all connections at most",
        )
        .in_table("limits")
        .default_value(size(limits.read_buffer_bytes_max)),
        Setting::new(
            "partial_frame_timeout",
            Kind::Duration(Granularity::Millis),
            "How long a frame may take from its first byte to its last",
        )
        .in_table("limits")
        .old("partial_frame_timeout_ms")
        .default_value(ms(limits.partial_frame_timeout_ms)),
        Setting::new(
            "idle_timeout",
            Kind::Duration(Granularity::Millis),
            "How long a connection may send nothing before it is closed; 0: never",
        )
        .in_table("limits")
        .old("idle_timeout_ms")
        .default_value(ms(limits.idle_timeout_ms)),
        Setting::new("segment_bytes_max", Kind::Size, "WAL segment file size")
            .in_table("wal")
            .default_value(Value::Size(wal.segment_bytes_max)),
        Setting::new("batch_bytes_max", Kind::Size, "Most bytes in one group-commit batch")
            .in_table("wal")
            .default_value(Value::Size(wal.batch_bytes_max)),
        Setting::new(
            "batch_window",
            Kind::Duration(Granularity::Micros),
            "How long the first append of a batch may wait for more on an idle disk",
        )
        .in_table("wal")
        .old("batch_window_us")
        .default_value(Value::Duration(Duration::from_micros(wal.batch_window_us))),
        Setting::new("queue_bytes_max", Kind::Size, "Most bytes queued for the WAL's commit thread")
            .in_table("wal")
            .default_value(Value::Size(wal.queue_bytes_max)),
        Setting::new(
            "io",
            Kind::Choice(&["auto", "uring", "sync"]),
            "The WAL's disk backend: io_uring when available (auto), io_uring or fail, pwrite + fdatasync",
        )
        .in_table("wal")
        .default_value(Value::Text("auto".to_owned())),
        Setting::new(
            "stagger_rolls",
            Kind::Choice(&["on", "off"]),
            "A new store ends its first WAL segment at a random point, so that stores fed the same appends do not roll together",
        )
        .in_table("wal")
        .default_value(Value::Text(
            if wal.stagger_rolls { "on" } else { "off" }.to_owned(),
        )),
        Setting::new(
            "spare_fill",
            Kind::Choice(&["zeros", "allocate"]),
            "How a new WAL segment is prepared before it takes appends: fallocate and zeros, or fallocate only",
        )
        .in_table("wal")
        .default_value(Value::Text(
            match wal.spare_fill {
                quire_wal::SpareFill::Zeros => "zeros",
                quire_wal::SpareFill::Allocate => "allocate",
            }
            .to_owned(),
        )),
        Setting::new(
            "send_buffer_bytes",
            Kind::Size,
            "SO_SNDBUF of each connection; unset: the kernel's autotuning",
        )
        .in_table("socket"),
        Setting::new(
            "recv_buffer_bytes",
            Kind::Size,
            "SO_RCVBUF of each connection; unset: the kernel's autotuning",
        )
        .in_table("socket"),
    ];
    // Only brokers of the cluster (and operators' tools) talk to a store: with TLS on, it
    // asks every client for a certificate of the cluster's CA.
    let mut settings = settings;
    settings.extend(TlsSettings::schema(ClientAuth::Required));
    Schema {
        program: "quire-node",
        env_prefix: ENV_PREFIX,
        settings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_net::layers::{SettingFlags, Source};

    fn run_args(config: Option<&Path>, flags: &[(&str, &str)]) -> RunArgs {
        RunArgs {
            settings: SettingFlags::from_pairs(flags),
            config: config.map(Path::to_owned),
            ..RunArgs::default()
        }
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn config_file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("node.toml");
        std::fs::write(&path, text).expect("writes");
        (dir, path)
    }

    fn config(args: &RunArgs, env_pairs: &[(&str, &str)]) -> Result<NodeConfig, SettingsError> {
        NodeConfig::from_resolved(&resolve(args, &env(env_pairs))?)
    }

    #[test]
    fn defaults_match_the_embedded_defaults() {
        let c = config(
            &run_args(None, &[("data_dir", "/d"), ("listen", "127.0.0.1:0")]),
            &[],
        )
        .expect("valid");
        let d = NodeConfig::new("/d", "127.0.0.1:0");
        assert_eq!(c.limits, d.limits);
        assert_eq!(c.wal, d.wal);
        assert_eq!(c.socket, d.socket);
        assert_eq!(c.log_format, LogFormat::Pretty);
        assert_eq!(c.metrics_listen, None);
    }

    #[test]
    fn flags_beat_variables_beat_the_file_beats_defaults() {
        let (_dir, path) = config_file(
            r#"
            data_dir = "/from/file"
            listen = "127.0.0.1:1"
            metrics_listen = "127.0.0.1:2"
            log_format = "json"
            [limits]
            connections_max = 10
            idle_timeout = "2m"
            [wal]
            batch_window = "50us"
            segment_bytes_max = "16MiB"
            io = "sync"
            "#,
        );
        let args = run_args(
            Some(&path),
            &[("listen", "127.0.0.1:3"), ("log_format", "pretty")],
        );
        let vars = [
            ("QUIRE_NODE_LISTEN", "127.0.0.1:4"),
            ("QUIRE_NODE_CONNECTIONS_MAX", "20"),
            ("QUIRE_NODE_READ_BYTES_MAX", "1MiB"),
        ];
        let r = resolve(&args, &env(&vars)).expect("resolves");
        let c = NodeConfig::from_resolved(&r).expect("valid");
        assert_eq!(c.data_dir, PathBuf::from("/from/file"));
        assert_eq!(c.listen, "127.0.0.1:3");
        assert_eq!(r.source("listen"), &Source::Flag("--listen".into()));
        assert_eq!(c.metrics_listen.as_deref(), Some("127.0.0.1:2"));
        assert_eq!(c.log_format, LogFormat::Pretty);
        assert_eq!(c.limits.connections_max, 20);
        assert_eq!(
            r.source("connections_max"),
            &Source::Env("QUIRE_NODE_CONNECTIONS_MAX".into())
        );
        assert_eq!(c.limits.read_bytes_max, 1 << 20);
        assert_eq!(c.limits.idle_timeout_ms, 120_000);
        assert_eq!(
            c.limits.in_flight_requests_per_connection_max,
            IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX
        );
        assert_eq!(r.source("write_queue_frames_max"), &Source::Default);
        assert_eq!(c.wal.batch_window_us, 50);
        assert_eq!(c.wal.segment_bytes_max, 16 << 20);
        assert_eq!(r.source("segment_bytes_max"), &Source::File(path.clone()));
        assert_eq!(c.wal_config().io, IoBackend::Sync);
        assert_eq!(c.wal_config().dir, PathBuf::from("/from/file/wal"));
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    }

    #[test]
    fn old_spellings_still_work_and_warn() {
        let (_dir, path) = config_file(
            "data_dir = \"/d\"\nlisten = \"h:1\"\n[limits]\npartial_frame_timeout_ms = 2500\n[wal]\nbatch_window_us = 70\n",
        );
        let args = run_args(Some(&path), &[("idle_timeout_ms", "0")]);
        let r = resolve(&args, &[]).expect("resolves");
        let c = NodeConfig::from_resolved(&r).expect("valid");
        assert_eq!(c.limits.partial_frame_timeout_ms, 2500);
        assert_eq!(c.limits.idle_timeout_ms, 0);
        assert_eq!(c.wal.batch_window_us, 70);
        assert_eq!(r.warnings.len(), 3, "{:?}", r.warnings);
        let all = r.warnings.join("\n");
        assert!(
            all.contains("partial_frame_timeout_ms")
                && all.contains("use limits.partial_frame_timeout = \"2500ms\""),
            "{all}"
        );
        assert!(all.contains("use wal.batch_window = \"70us\""), "{all}");
        assert!(
            all.contains("--idle-timeout-ms is deprecated; use --idle-timeout 0s"),
            "{all}"
        );
        let (_dir, both) = config_file("[limits]\nidle_timeout_ms = 0\nidle_timeout = \"0s\"\n");
        let err = resolve(&run_args(Some(&both), &[]), &[])
            .expect_err("both spellings")
            .to_string();
        assert!(
            err.contains("idle_timeout and its old spelling idle_timeout_ms"),
            "{err}"
        );
    }

    #[test]
    fn missing_and_bad_settings_are_reported() {
        let err = config(&RunArgs::default(), &[])
            .expect_err("no data dir")
            .to_string();
        assert!(
            err.contains("--data-dir") && err.contains("QUIRE_NODE_DATA_DIR"),
            "{err}"
        );
        let base = [("data_dir", "/d"), ("listen", "127.0.0.1:0")];
        let (_dir, path) = config_file("listen = 1\n");
        let err = config(&run_args(Some(&path), &base), &[])
            .expect_err("listen is text")
            .to_string();
        assert!(err.contains("listen = \"1\""), "{err}");
        let (_dir, path) = config_file("lisen = \"x\"\n");
        let err = config(&run_args(Some(&path), &base), &[])
            .expect_err("typo")
            .to_string();
        assert!(
            err.contains("unknown setting `lisen`") && err.contains("listen"),
            "{err}"
        );
        let (_dir, path) = config_file("[limits]\nconections_max = 3\n");
        let err = config(&run_args(Some(&path), &base), &[])
            .expect_err("typo")
            .to_string();
        assert!(
            err.contains("`limits.conections_max`")
                && err.contains("did you mean connections_max?"),
            "{err}"
        );
        let err = config(&run_args(None, &base), &[("QUIRE_NODE_LISTN", "x")])
            .expect_err("typo")
            .to_string();
        assert!(
            err.contains("QUIRE_NODE_LISTN") && err.contains("QUIRE_NODE_LISTEN"),
            "{err}"
        );
        let err = config(
            &run_args(None, &base),
            &[("QUIRE_NODE_IDLE_TIMEOUT", "5mins")],
        )
        .expect_err("bad value")
        .to_string();
        assert!(
            err.contains("idle_timeout = \"5mins\" (env QUIRE_NODE_IDLE_TIMEOUT)")
                && err.contains("a duration like 50ms, 10s, 2m"),
            "{err}"
        );
        let (_dir, path) = config_file("[limits]\nin_flight_bytes_per_connection_max = 10\n");
        let err = config(&run_args(Some(&path), &base), &[])
            .expect_err("below a frame")
            .to_string();
        assert!(
            err.contains("in_flight_bytes_per_connection_max = 10 (file"),
            "{err}"
        );
        let err = config(
            &run_args(None, &[("partial_frame_timeout", "0s"), base[0], base[1]]),
            &[],
        )
        .expect_err("zero")
        .to_string();
        assert!(
            err.contains("partial_frame_timeout = 0s (flag --partial-frame-timeout)"),
            "{err}"
        );
        let (_dir, path) =
            config_file("[limits]\nidle_timeout = 0\nread_buffer_bytes_max = \"32MiB\"\n");
        let c = config(&run_args(Some(&path), &base), &[]).expect("valid");
        assert_eq!(c.limits.read_settings().idle_timeout(), None);
        assert_eq!(c.limits.read_buffer_bytes_max, 32 << 20);
    }

    #[test]
    fn every_setting_is_in_the_operations_table() {
        let doc = include_str!("../../docs/operations.md");
        for s in schema().settings {
            let row = format!(
                "| `--{}` | `QUIRE_NODE_{}` |",
                s.key.replace('_', "-"),
                s.key.to_ascii_uppercase()
            );
            assert!(doc.contains(&row), "docs/operations.md lacks {row}");
        }
    }
}
