//! CPU time spent by this process during a benchmark: the whole process from
//! `getrusage(RUSAGE_SELF)` (microsecond resolution), and a breakdown by thread name from
//! `/proc/self/task/*/stat` (clock-tick resolution, usually 10 ms; threads that end during
//! the window are missing from the breakdown but not from the total).
//!
//! This module only measures; it does not know what a benchmark does.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// Threads looked at, at most, in one breakdown snapshot.
pub const THREADS_MAX: usize = 4096;

/// User and system CPU time of the whole process since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessCpu {
    /// Time in user mode.
    pub user: Duration,
    /// Time in the kernel on the process's behalf.
    pub sys: Duration,
}

impl ProcessCpu {
    /// Now (`getrusage(RUSAGE_SELF)`); zero if the call fails (it cannot, with these
    /// arguments).
    #[must_use]
    pub fn now() -> ProcessCpu {
        // SAFETY: rusage is plain old data; all-zero is a valid value.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `usage` is a valid, writable rusage that outlives the call.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
        if rc != 0 {
            return ProcessCpu::default();
        }
        let tv = |t: libc::timeval| {
            Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
                + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
        };
        ProcessCpu {
            user: tv(usage.ru_utime),
            sys: tv(usage.ru_stime),
        }
    }

    /// The time spent since `earlier`.
    #[must_use]
    pub fn since(self, earlier: ProcessCpu) -> ProcessCpu {
        ProcessCpu {
            user: self.user.saturating_sub(earlier.user),
            sys: self.sys.saturating_sub(earlier.sys),
        }
    }
}

/// CPU seconds of the threads sharing one name during a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadCpu {
    /// The thread name (`/proc/self/task/TID/comm`, at most 15 bytes).
    pub name: String,
    /// Threads with this name.
    pub threads: u32,
    /// User CPU, seconds.
    pub user_s: f64,
    /// System CPU, seconds.
    pub sys_s: f64,
}

/// Per-thread CPU ticks at one moment: tid → (name, user ticks, system ticks).
#[derive(Debug, Clone, Default)]
pub struct ThreadSnapshot {
    threads: BTreeMap<u32, (String, u64, u64)>,
}

impl ThreadSnapshot {
    /// Reads `/proc/self/task/*/stat`; empty where `/proc` is unavailable.
    #[must_use]
    pub fn now() -> ThreadSnapshot {
        let mut threads = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir("/proc/self/task") else {
            return ThreadSnapshot { threads };
        };
        for entry in entries.flatten().take(THREADS_MAX) {
            let Some(tid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some(t) = parse_stat(&stat) {
                threads.insert(tid, t);
            }
        }
        ThreadSnapshot { threads }
    }

    /// CPU per thread name between `earlier` and `self`, busiest first. Threads absent
    /// from `earlier` count from zero.
    #[must_use]
    pub fn since(&self, earlier: &ThreadSnapshot) -> Vec<ThreadCpu> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let tick_s = if ticks > 0 { 1.0 / ticks as f64 } else { 0.01 };
        let mut by_name: BTreeMap<&str, (u32, u64, u64)> = BTreeMap::new();
        for (tid, (name, user, sys)) in &self.threads {
            let (u0, s0) = earlier
                .threads
                .get(tid)
                .map_or((0, 0), |(_, u, s)| (*u, *s));
            let e = by_name.entry(name.as_str()).or_default();
            e.0 += 1;
            e.1 += user.saturating_sub(u0);
            e.2 += sys.saturating_sub(s0);
        }
        let mut out: Vec<ThreadCpu> = by_name
            .into_iter()
            .map(|(name, (threads, user, sys))| ThreadCpu {
                name: name.to_owned(),
                threads,
                user_s: user as f64 * tick_s,
                sys_s: sys as f64 * tick_s,
            })
            .collect();
        out.sort_by(|a, b| (b.user_s + b.sys_s).total_cmp(&(a.user_s + a.sys_s)));
        out
    }
}

/// `(comm, utime, stime)` from one `/proc/PID/task/TID/stat` line:
/// `tid (comm) state ppid ... utime stime ...` (fields 14 and 15; `comm` may hold spaces
/// and parentheses, so the fields are counted from the last `)`).
fn parse_stat(line: &str) -> Option<(String, u64, u64)> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let name = line.get(open + 1..close)?.to_owned();
    let mut rest = line.get(close + 1..)?.split_whitespace();
    // After ")": field 3 (state) is index 0, so utime (14) is index 11, stime index 12.
    let user = rest.nth(11)?.parse().ok()?;
    let sys = rest.next()?.parse().ok()?;
    Some((name, user, sys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stat_line_with_an_awkward_name() {
        let line = "4242 (quire (x) y) S 1 2 3 4 5 6 7 8 9 10 77 33 0 0 20 0 1 0";
        assert_eq!(parse_stat(line), Some(("quire (x) y".to_owned(), 77, 33)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn cpu_moves_forward_while_spinning() {
        let before = ProcessCpu::now();
        let threads_before = ThreadSnapshot::now();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let spent = ProcessCpu::now().since(before);
        assert!(spent.user + spent.sys > Duration::ZERO);
        let by_thread = ThreadSnapshot::now().since(&threads_before);
        assert!(!by_thread.is_empty() || !std::path::Path::new("/proc/self/task").exists());
    }
}
