//! [`NodeConfig`]: every setting of a running node, from the TOML file given with
//! `--config` and the command line (flags win), with the bounds as named defaults.
//!
//! ```toml
//! data_dir = "/var/lib/quire/store-1"
//! listen = "0.0.0.0:7101"
//! metrics_listen = "127.0.0.1:9101"
//! log_format = "json"                       # or "pretty"
//!
//! [limits]
//! connections_max = 10000                  # more get Overloaded and are closed (64 more kept for brokers)
//! in_flight_bytes_per_connection_max = 67108864
//! in_flight_requests_per_connection_max = 4096
//! write_queue_frames_max = 4160
//! read_events_max = 65536
//! read_bytes_max = 8388608
//! read_buffer_bytes_max = 67108864          # incoming frames buffered, all connections
//! partial_frame_timeout_ms = 10000          # a frame must be whole this long after its first byte
//! idle_timeout_ms = 600000                  # a connection silent this long is closed; 0: never
//!
//! [wal]
//! segment_bytes_max = 268435456
//! batch_bytes_max = 1048576
//! batch_window_us = 0
//! queue_bytes_max = 268435456
//! io = "auto"                               # "uring", "sync"
//!
//! [socket]
//! send_buffer_bytes = 4194304               # unset: the kernel's autotuning
//! recv_buffer_bytes = 4194304
//! ```

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use quire_net::{
    ReadSettings, IDLE_TIMEOUT_MS_DEFAULT, PARTIAL_FRAME_TIMEOUT_MS_DEFAULT,
    READ_BUFFER_BYTES_MAX_DEFAULT,
};
use quire_proto::{EVENTS_PER_FRAME_MAX, FRAME_BYTES_MAX};
use quire_wal::{IoBackend, WalConfig};
use serde::Deserialize;

use crate::cli::{LogFormat, RunArgs};

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

/// The `[limits]` table.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// See [`CONNECTIONS_MAX`].
    pub connections_max: usize,
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
            in_flight_bytes_per_connection_max: IN_FLIGHT_BYTES_PER_CONNECTION_MAX,
            in_flight_requests_per_connection_max: IN_FLIGHT_REQUESTS_PER_CONNECTION_MAX,
            write_queue_frames_max: WRITE_QUEUE_FRAMES_MAX,
            read_events_max: READ_EVENTS_MAX,
            read_bytes_max: READ_BYTES_MAX,
            read_buffer_bytes_max: READ_BUFFER_BYTES_MAX_DEFAULT,
            partial_frame_timeout_ms: PARTIAL_FRAME_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: IDLE_TIMEOUT_MS_DEFAULT,
        }
    }
}

/// The `[wal]` table: [`quire_wal::WalConfig`]'s settings (see there for meanings).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
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
        }
    }
}

/// The WAL's disk backend, as written in the config file.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
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
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct SocketSettings {
    /// `SO_SNDBUF`, in bytes.
    pub send_buffer_bytes: Option<usize>,
    /// `SO_RCVBUF`, in bytes.
    pub recv_buffer_bytes: Option<usize>,
}

/// The config file's contents: every key optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Data directory.
    pub data_dir: Option<PathBuf>,
    /// Store protocol address.
    pub listen: Option<String>,
    /// Metrics address.
    pub metrics_listen: Option<String>,
    /// Log format.
    pub log_format: Option<LogFormat>,
    /// `[limits]`.
    #[serde(default)]
    pub limits: Limits,
    /// `[wal]`.
    #[serde(default)]
    pub wal: WalSettings,
    /// `[socket]`.
    #[serde(default)]
    pub socket: SocketSettings,
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
        }
    }

    /// The settings for `quire-node run`: the `--config` file if any, then the flags.
    ///
    /// # Errors
    /// An unreadable or invalid file, a missing data directory or listen address, or
    /// limits that make no sense.
    pub fn from_args(args: &RunArgs) -> anyhow::Result<NodeConfig> {
        let file = match &args.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        NodeConfig::merge(file, args)
    }

    /// `file` overridden by the flags in `args`.
    ///
    /// # Errors
    /// As [`NodeConfig::from_args`].
    pub fn merge(file: FileConfig, args: &RunArgs) -> anyhow::Result<NodeConfig> {
        let Some(data_dir) = args.data_dir.clone().or(file.data_dir) else {
            bail!("no data directory: pass --data-dir DIR (or set data_dir in the config file)");
        };
        let Some(listen) = args.listen.clone().or(file.listen) else {
            bail!("no listen address: pass --listen ADDR (or set listen in the config file)");
        };
        let config = NodeConfig {
            data_dir,
            listen,
            metrics_listen: args.metrics_listen.clone().or(file.metrics_listen),
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            limits: file.limits,
            wal: file.wal,
            socket: file.socket,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the limits.
    ///
    /// # Errors
    /// A limit of zero, or an in-flight byte bound below one maximal frame.
    pub fn validate(&self) -> anyhow::Result<()> {
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
                bail!("limits.{name} must be positive");
            }
        }
        if l.in_flight_bytes_per_connection_max < FRAME_BYTES_MAX
            || l.in_flight_bytes_per_connection_max > u32::MAX as usize
        {
            bail!(
                "limits.in_flight_bytes_per_connection_max must be between FRAME_BYTES_MAX ({FRAME_BYTES_MAX}) and {}",
                u32::MAX
            );
        }
        if l.connections_max > quire_net::CONNECTIONS_MAX_LIMIT {
            bail!(
                "limits.connections_max must be at most {}",
                quire_net::CONNECTIONS_MAX_LIMIT
            );
        }
        if l.read_events_max > EVENTS_PER_FRAME_MAX {
            bail!("limits.read_events_max must be at most {EVENTS_PER_FRAME_MAX}");
        }
        if let Err(e) = l.read_settings().validate() {
            bail!("limits.{e}");
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
        }
    }
}

/// Where a data directory keeps its WAL (segments, promised epoch, lock).
#[must_use]
pub fn wal_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("wal")
}

impl FileConfig {
    /// Reads and parses a TOML config file.
    ///
    /// # Errors
    /// An unreadable file, bad TOML, or unknown keys.
    pub fn load(path: &Path) -> anyhow::Result<FileConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file() {
        let file: FileConfig = toml::from_str(
            r#"
            data_dir = "/from/file"
            listen = "127.0.0.1:1"
            metrics_listen = "127.0.0.1:2"
            log_format = "json"
            [limits]
            connections_max = 10
            [wal]
            batch_window_us = 50
            io = "sync"
            "#,
        )
        .unwrap();
        let args = RunArgs {
            listen: Some("127.0.0.1:3".into()),
            log_format: Some(LogFormat::Pretty),
            ..RunArgs::default()
        };
        let c = NodeConfig::merge(file, &args).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/from/file"));
        assert_eq!(c.listen, "127.0.0.1:3");
        assert_eq!(c.metrics_listen.as_deref(), Some("127.0.0.1:2"));
        assert_eq!(c.log_format, LogFormat::Pretty);
        assert_eq!(c.limits.connections_max, 10);
        assert_eq!(c.limits.read_bytes_max, READ_BYTES_MAX);
        assert_eq!(c.wal.batch_window_us, 50);
        assert_eq!(c.wal_config().io, IoBackend::Sync);
        assert_eq!(c.wal_config().dir, PathBuf::from("/from/file/wal"));
    }

    #[test]
    fn missing_and_bad_settings_are_reported() {
        let err = NodeConfig::merge(FileConfig::default(), &RunArgs::default()).unwrap_err();
        assert!(err.to_string().contains("--data-dir"), "{err}");
        assert!(toml::from_str::<FileConfig>("listen = 1").is_err());
        assert!(toml::from_str::<FileConfig>("lisen = \"x\"").is_err());
        let file: FileConfig =
            toml::from_str("[limits]\nin_flight_bytes_per_connection_max = 10").unwrap();
        let args = RunArgs {
            data_dir: Some("/d".into()),
            listen: Some("127.0.0.1:0".into()),
            ..RunArgs::default()
        };
        assert!(NodeConfig::merge(file, &args.clone()).is_err());
        let file: FileConfig = toml::from_str("[limits]\npartial_frame_timeout_ms = 0").unwrap();
        let err = NodeConfig::merge(file, &args).unwrap_err().to_string();
        assert!(err.contains("limits.partial_frame_timeout_ms"), "{err}");
        let file: FileConfig =
            toml::from_str("[limits]\nidle_timeout_ms = 0\nread_buffer_bytes_max = 33554432")
                .unwrap();
        let c = NodeConfig::merge(file, &args).unwrap();
        assert_eq!(c.limits.read_settings().idle_timeout(), None);
        assert_eq!(c.limits.read_buffer_bytes_max, 32 << 20);
    }
}
