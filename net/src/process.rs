//! The standard Prometheus process metrics, read from `/proc/self` at scrape time (Linux
//! only, like the rest of Quire), and [`StandardMetrics`]: them and `quire_build_info`, the
//! metrics every Quire server exports besides its own.
//!
//! | metric | source |
//! | --- | --- |
//! | `process_cpu_seconds_total` | `/proc/self/stat` utime + stime, clock ticks |
//! | `process_resident_memory_bytes` | `/proc/self/stat` rss, pages |
//! | `process_virtual_memory_bytes` | `/proc/self/stat` vsize, bytes |
//! | `process_start_time_seconds` | `/proc/self/stat` starttime (ticks after boot) + `/proc/stat` btime |
//! | `process_open_fds` | entries of `/proc/self/fd` |
//! | `process_max_fds` | `/proc/self/limits` "Max open files", soft limit |
//!
//! prometheus-client 0.26 has no process collector (its companions are for other crates),
//! so this small reader does it. A file that cannot be read or parsed leaves its metrics
//! out of that scrape (logged at debug) rather than failing the scrape.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::build_info::BuildInfoCollector;

/// Why a `/proc` file gave no value.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// The file could not be read.
    #[error("reading {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file's text is not what the kernel documents (proc(5)).
    #[error("parsing {}: {what}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was missing or malformed.
        what: &'static str,
    },
}

/// The fields of `/proc/self/stat` the metrics use, in the kernel's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Minor page faults (served without I/O: a page first touched, a copy on write), a
    /// count (field 10).
    pub minor_faults: u64,
    /// User-mode CPU time, clock ticks (field 14).
    pub utime_ticks: u64,
    /// Kernel-mode CPU time, clock ticks (field 15).
    pub stime_ticks: u64,
    /// Start time after boot, clock ticks (field 22).
    pub starttime_ticks: u64,
    /// Virtual memory size, bytes (field 23).
    pub vsize_bytes: u64,
    /// Resident set size, pages (field 24).
    pub rss_pages: u64,
}

const STAT: &str = "/proc/self/stat";
const LIMITS: &str = "/proc/self/limits";
const FD_DIR: &str = "/proc/self/fd";
const SYSTEM_STAT: &str = "/proc/stat";

fn parse_error(path: &str, what: &'static str) -> ProcError {
    ProcError::Parse {
        path: PathBuf::from(path),
        what,
    }
}

/// Parses the text of `/proc/[pid]/stat`.
///
/// # Errors
/// [`ProcError::Parse`] if the `(comm)` field or a needed number is missing or malformed.
pub fn parse_stat(text: &str) -> Result<ProcStat, ProcError> {
    // `comm` (field 2) is in parentheses and may hold spaces and parentheses itself: the
    // fields after it start after the last ')'.
    let close = text
        .rfind(')')
        .ok_or_else(|| parse_error(STAT, "no (comm) field"))?;
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // rest[0] is field 3 (state): field n is rest[n - 3].
    let field = |n: usize, what: &'static str| -> Result<u64, ProcError> {
        rest.get(n - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| parse_error(STAT, what))
    };
    Ok(ProcStat {
        minor_faults: field(10, "minflt (field 10)")?,
        utime_ticks: field(14, "utime (field 14)")?,
        stime_ticks: field(15, "stime (field 15)")?,
        starttime_ticks: field(22, "starttime (field 22)")?,
        vsize_bytes: field(23, "vsize (field 23)")?,
        rss_pages: field(24, "rss (field 24)")?,
    })
}

/// The soft "Max open files" limit from the text of `/proc/[pid]/limits` (`u64::MAX` for
/// `unlimited`).
///
/// # Errors
/// [`ProcError::Parse`] if the line is missing or its soft limit is not a number.
pub fn parse_max_open_files(text: &str) -> Result<u64, ProcError> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .ok_or_else(|| parse_error(LIMITS, "no \"Max open files\" line"))?;
    match line.split_whitespace().next() {
        Some("unlimited") => Ok(u64::MAX),
        Some(n) => n
            .parse()
            .map_err(|_| parse_error(LIMITS, "a soft limit that is not a number")),
        None => Err(parse_error(LIMITS, "no soft limit")),
    }
}

/// The boot time (`btime`, seconds since the Unix epoch) from the text of `/proc/stat`.
///
/// # Errors
/// [`ProcError::Parse`] if the `btime` line is missing or malformed.
pub fn parse_boot_time_seconds(text: &str) -> Result<u64, ProcError> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| parse_error(SYSTEM_STAT, "no btime line"))
}

fn read(path: &str) -> Result<String, ProcError> {
    std::fs::read_to_string(path).map_err(|source| ProcError::Io {
        path: PathBuf::from(path),
        source,
    })
}

/// Open file descriptors: the entries of `/proc/self/fd` (the one reading it included).
///
/// # Errors
/// [`ProcError::Io`] if the directory cannot be listed.
pub fn open_fds() -> Result<u64, ProcError> {
    let io = |source| ProcError::Io {
        path: Path::new(FD_DIR).to_path_buf(),
        source,
    };
    let mut n = 0u64;
    for entry in std::fs::read_dir(FD_DIR).map_err(io)? {
        entry.map_err(io)?;
        n += 1;
    }
    Ok(n)
}

/// `sysconf(name)` if it gives a positive value.
fn sysconf(name: libc::c_int) -> Option<u64> {
    // SAFETY: sysconf takes an integer and reads no memory of ours.
    let v = unsafe { libc::sysconf(name) };
    u64::try_from(v).ok().filter(|&v| v > 0)
}

/// A [`Collector`] of the standard process metrics (see the module docs). Register it in
/// a registry **without** a prefix: the names are the standard ones.
#[derive(Debug, Default)]
pub struct ProcessCollector {
    /// `process_start_time_seconds`, computed once (it never changes).
    start_time_seconds: OnceLock<f64>,
}

impl ProcessCollector {
    /// A collector; it reads nothing until a scrape.
    #[must_use]
    pub fn new() -> ProcessCollector {
        ProcessCollector::default()
    }

    fn start_time_seconds(&self, stat: &ProcStat, ticks_per_second: u64) -> Option<f64> {
        if let Some(&t) = self.start_time_seconds.get() {
            return Some(t);
        }
        let boot = read(SYSTEM_STAT)
            .and_then(|t| parse_boot_time_seconds(&t))
            .map_err(|e| tracing::debug!(error = %e, "no process start time"))
            .ok()?;
        let t = boot as f64 + stat.starttime_ticks as f64 / ticks_per_second as f64;
        Some(*self.start_time_seconds.get_or_init(|| t))
    }
}

fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> fmt::Result {
    let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
    let m = enc.encode_descriptor(name, help, None, g.metric_type())?;
    g.encode(m)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        let ticks = sysconf(libc::_SC_CLK_TCK);
        match (read(STAT).and_then(|t| parse_stat(&t)), ticks) {
            (Ok(stat), Some(ticks)) => {
                let cpu =
                    ConstCounter::new((stat.utime_ticks + stat.stime_ticks) as f64 / ticks as f64);
                let m = enc.encode_descriptor(
                    "process_cpu_seconds",
                    "Total user and system CPU time spent in seconds.",
                    None,
                    cpu.metric_type(),
                )?;
                cpu.encode(m)?;
                if let Some(page) = sysconf(libc::_SC_PAGESIZE) {
                    gauge(
                        &mut enc,
                        "process_resident_memory_bytes",
                        "Resident memory size in bytes.",
                        stat.rss_pages.saturating_mul(page),
                    )?;
                }
                gauge(
                    &mut enc,
                    "process_virtual_memory_bytes",
                    "Virtual memory size in bytes.",
                    stat.vsize_bytes,
                )?;
                if let Some(t) = self.start_time_seconds(&stat, ticks) {
                    let g = ConstGauge::new(t);
                    let m = enc.encode_descriptor(
                        "process_start_time_seconds",
                        "Start time of the process since unix epoch in seconds.",
                        None,
                        g.metric_type(),
                    )?;
                    g.encode(m)?;
                }
            }
            (Err(e), _) => tracing::debug!(error = %e, "no process CPU and memory metrics"),
            (_, None) => tracing::debug!("sysconf(_SC_CLK_TCK) failed: no process CPU metrics"),
        }
        match open_fds() {
            Ok(n) => gauge(
                &mut enc,
                "process_open_fds",
                "Number of open file descriptors.",
                n,
            )?,
            Err(e) => tracing::debug!(error = %e, "no process_open_fds"),
        }
        match read(LIMITS).and_then(|t| parse_max_open_files(&t)) {
            Ok(n) => gauge(
                &mut enc,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                n,
            )?,
            Err(e) => tracing::debug!(error = %e, "no process_max_fds"),
        }
        Ok(())
    }
}

/// The metrics every Quire server exports besides its own: `quire_build_info` and the
/// process metrics, in their own registry without a prefix (the names are standard).
/// Append [`StandardMetrics::encode_into`] to the server's own text.
#[derive(Debug)]
pub struct StandardMetrics {
    registry: Registry,
}

impl StandardMetrics {
    /// Both collectors, registered.
    #[must_use]
    pub fn new() -> StandardMetrics {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(BuildInfoCollector));
        registry.register_collector(Box::new(ProcessCollector::new()));
        StandardMetrics { registry }
    }

    /// Appends them to `out`, in Prometheus text format (version 0.0.4).
    ///
    /// # Errors
    /// Only if formatting fails.
    pub fn encode_into(&self, out: &mut String) -> fmt::Result {
        prometheus_client::encoding::prometheus_text::encode(out, &self.registry)
    }
}

impl Default for StandardMetrics {
    fn default() -> Self {
        StandardMetrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_spaces_and_parentheses_in_comm_parses() {
        let text = "8967 (a (b) c) R 8921 8921 4616 0 -1 4194304 97 0 0 0 12 34 0 0 20 0 1 0 \
                    30816 3133440 379 18446744073709551615 94447527354368 0\n";
        assert_eq!(
            parse_stat(text).expect("parses"),
            ProcStat {
                minor_faults: 97,
                utime_ticks: 12,
                stime_ticks: 34,
                starttime_ticks: 30816,
                vsize_bytes: 3_133_440,
                rss_pages: 379,
            }
        );
    }

    #[test]
    fn a_short_or_garbled_stat_is_a_located_parse_error() {
        for bad in [
            "",
            "1 cat R 1 2",
            "1 (cat) R 1 2 3",
            "1 (cat) R 1 1 1 0 -1 0 0 0 0 0 x 0",
        ] {
            match parse_stat(bad) {
                Err(ProcError::Parse { path, .. }) => assert_eq!(path, Path::new(STAT)),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn limits_and_btime_parse() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            20000                524288               files     \n";
        assert_eq!(parse_max_open_files(limits).expect("parses"), 20_000);
        assert_eq!(
            parse_max_open_files("Max open files unlimited unlimited files\n").expect("parses"),
            u64::MAX
        );
        assert!(parse_max_open_files("Max cpu time 1 1 seconds\n").is_err());
        assert_eq!(
            parse_boot_time_seconds("cpu  1 2 3\nbtime 1796165256\nprocesses 9\n").expect("parses"),
            1_796_165_256
        );
        assert!(parse_boot_time_seconds("cpu 1 2 3\n").is_err());
    }

    #[test]
    fn this_process_is_scraped_with_the_standard_names() {
        let mut text = String::new();
        StandardMetrics::new()
            .encode_into(&mut text)
            .expect("encodes");
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
            "quire_build_info{",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "missing {name:?} in\n{text}"
            );
        }
        let start: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_start_time_seconds "))
            .and_then(|v| v.trim().parse().ok())
            .expect("a start time");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs_f64();
        assert!(
            start <= now + 1.0 && start > now - 24.0 * 3600.0,
            "{start} vs {now}"
        );
    }
}
