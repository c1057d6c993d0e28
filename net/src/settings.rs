//! [`ReadSettings`]: the bounds a server reads its connections under, with defaults and
//! the range each may take. quire-node takes them in its `[limits]` table, quire-broker as
//! top-level keys of its config file; both name them the same (`read_buffer_bytes_max`,
//! `partial_frame_timeout`, `idle_timeout`), as flags and variables too ([`crate::layers`]).

use std::time::Duration;

use quire_proto::FRAME_BYTES_MAX;

use crate::units::{format_duration, format_size};

/// Default `partial_frame_timeout`: a frame whose first byte has arrived must be whole
/// within 10 s. A maximal frame (`FRAME_BYTES_MAX`, 16 MiB) thus needs at least 1.6 MB/s
/// from its sender; raise it for slower links.
pub const PARTIAL_FRAME_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Shortest `partial_frame_timeout` accepted.
pub const PARTIAL_FRAME_TIMEOUT_MS_MIN: u64 = 100;
/// Longest `partial_frame_timeout` accepted (10 minutes).
pub const PARTIAL_FRAME_TIMEOUT_MS_MAX: u64 = 600_000;
/// Default `idle_timeout`: a connection that sends nothing for 10 minutes is closed
/// (Kafka's `connections.max.idle.ms` default). Peers that keep a connection open send at
/// least a heartbeat or a request in that time; clients reconnect when they need to.
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 600_000;
/// Shortest non-zero `idle_timeout` accepted: well above the longest fetch wait
/// (30 s), so a consumer's long poll is never cut as idle.
pub const IDLE_TIMEOUT_MS_MIN: u64 = 60_000;
/// Longest `idle_timeout` accepted (one day); 0 means never.
pub const IDLE_TIMEOUT_MS_MAX: u64 = 86_400_000;
/// Default `read_buffer_bytes_max`: 64 MiB of incoming frames buffered across all
/// connections (four maximal frames).
pub const READ_BUFFER_BYTES_MAX_DEFAULT: usize = 64 * 1024 * 1024;
/// Largest `read_buffer_bytes_max` accepted (1 TiB).
const READ_BUFFER_BYTES_MAX_LIMIT: usize = 1 << 40;

/// How a server reads its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadSettings {
    /// Bytes of incoming frames buffered across all connections at most (received and not
    /// yet whole, or whole and not yet decoded). At least `FRAME_BYTES_MAX`, so one
    /// maximal frame always fits.
    pub read_buffer_bytes_max: usize,
    /// How long a frame may take from its first byte to its last, in milliseconds.
    pub partial_frame_timeout_ms: u64,
    /// How long a connection may send nothing before it is closed, in milliseconds; 0:
    /// never.
    pub idle_timeout_ms: u64,
}

impl Default for ReadSettings {
    fn default() -> Self {
        ReadSettings {
            read_buffer_bytes_max: READ_BUFFER_BYTES_MAX_DEFAULT,
            partial_frame_timeout_ms: PARTIAL_FRAME_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: IDLE_TIMEOUT_MS_DEFAULT,
        }
    }
}

/// A setting outside its range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{setting} = {value} is outside {min}..={max}{note}")]
pub struct SettingError {
    /// The setting's name (as in the config file).
    pub setting: &'static str,
    /// The value given, in the spelling it reads back (`50ms`, `16MiB`).
    pub value: String,
    /// Smallest value accepted, spelled the same way.
    pub min: String,
    /// Largest value accepted, spelled the same way.
    pub max: String,
    /// What else is accepted, if anything (`" (or 0: never)"`).
    pub note: &'static str,
}

impl ReadSettings {
    /// Checks every setting against its range.
    ///
    /// # Errors
    /// The first setting outside its range.
    pub fn validate(&self) -> Result<(), SettingError> {
        let check = |setting, value: u64, min: u64, max: u64, note, show: fn(u64) -> String| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(SettingError {
                    setting,
                    value: show(value),
                    min: show(min),
                    max: show(max),
                    note,
                })
            }
        };
        let ms = |v: u64| format_duration(Duration::from_millis(v));
        check(
            "read_buffer_bytes_max",
            self.read_buffer_bytes_max as u64,
            FRAME_BYTES_MAX as u64,
            READ_BUFFER_BYTES_MAX_LIMIT as u64,
            "",
            format_size,
        )?;
        check(
            "partial_frame_timeout",
            self.partial_frame_timeout_ms,
            PARTIAL_FRAME_TIMEOUT_MS_MIN,
            PARTIAL_FRAME_TIMEOUT_MS_MAX,
            "",
            ms,
        )?;
        if self.idle_timeout_ms != 0 {
            check(
                "idle_timeout",
                self.idle_timeout_ms,
                IDLE_TIMEOUT_MS_MIN,
                IDLE_TIMEOUT_MS_MAX,
                " (or 0: never)",
                ms,
            )?;
        }
        Ok(())
    }

    /// The partial-frame timeout.
    #[must_use]
    pub fn partial_frame_timeout(&self) -> Duration {
        Duration::from_millis(self.partial_frame_timeout_ms)
    }

    /// The idle timeout, `None` for never.
    #[must_use]
    pub fn idle_timeout(&self) -> Option<Duration> {
        (self.idle_timeout_ms != 0).then(|| Duration::from_millis(self.idle_timeout_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bounds_name_themselves() {
        assert_eq!(ReadSettings::default().validate(), Ok(()));
        let bad = [
            (
                ReadSettings {
                    read_buffer_bytes_max: FRAME_BYTES_MAX - 1,
                    ..ReadSettings::default()
                },
                "read_buffer_bytes_max",
            ),
            (
                ReadSettings {
                    partial_frame_timeout_ms: 0,
                    ..ReadSettings::default()
                },
                "partial_frame_timeout",
            ),
            (
                ReadSettings {
                    idle_timeout_ms: 1_000,
                    ..ReadSettings::default()
                },
                "idle_timeout",
            ),
        ];
        for (s, name) in bad {
            let e = s.validate().expect_err(name);
            assert_eq!(e.setting, name);
            assert!(e.to_string().contains(name), "{e}");
        }
        let never = ReadSettings {
            idle_timeout_ms: 0,
            ..ReadSettings::default()
        };
        assert_eq!(never.validate(), Ok(()));
        assert_eq!(never.idle_timeout(), None);
    }
}
