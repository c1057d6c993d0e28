//! What a benchmark cost the servers: CPU time and minor page faults of each process of a
//! local cluster (`quire cluster up --detach --dir DIR`, whose `cluster.json` names their
//! pids) over the measured period, from `/proc/PID/stat` (clock-tick resolution for CPU,
//! usually 10 ms).
//!
//! A minor fault is a page the process touched for the first time (or a copy on write):
//! in steady state a server that reuses its buffers takes almost none, one that allocates
//! fresh memory per request takes several per request. The figure issue 17 of the project
//! tracks is the master's faults per message.
//!
//! This module only measures; it does not know what a benchmark does.

use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::cluster::up::{ClusterFile, ProcessInfo, Role};

/// One process's counters at one moment.
#[derive(Debug, Clone)]
pub struct ServerSample {
    info: ProcessInfo,
    stat: quire_net::ProcStat,
}

/// Reads the counters of every process `DIR/cluster.json` names.
///
/// # Errors
/// The file is missing or malformed, or a process is gone (`/proc/PID/stat` unreadable or
/// unparsable): a measurement with a server missing is not one.
pub fn sample(dir: &Path) -> anyhow::Result<Vec<ServerSample>> {
    let cluster = ClusterFile::read(dir)?;
    cluster
        .processes
        .into_iter()
        .map(|info| {
            let path = format!("/proc/{}/stat", info.pid);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {path} ({} is not running?)", info.name))?;
            let stat = quire_net::parse_stat(&text).with_context(|| info.name.clone())?;
            Ok(ServerSample { info, stat })
        })
        .collect()
}

/// What one server spent over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerUsage {
    /// `store0`, `broker1`, ... as in `cluster.json`.
    pub name: String,
    /// `"store"` or `"broker"`.
    pub role: &'static str,
    /// Whether it was the master the producers wrote to.
    pub master: bool,
    /// User + system CPU seconds.
    pub cpu_s: f64,
    /// Minor page faults.
    pub minor_faults: u64,
}

/// Each server's usage between `before` and `after` (same processes, same order; a process
/// missing from either is left out). `master_addr` marks the master.
#[must_use]
pub fn usage(
    before: &[ServerSample],
    after: &[ServerSample],
    master_addr: Option<&str>,
) -> Vec<ServerUsage> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let tick_s = if ticks > 0 { 1.0 / ticks as f64 } else { 0.01 };
    after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.info.pid == a.info.pid)?;
            let cpu_ticks = (a.stat.utime_ticks + a.stat.stime_ticks)
                .saturating_sub(b.stat.utime_ticks + b.stat.stime_ticks);
            Some(ServerUsage {
                name: a.info.name.clone(),
                role: match a.info.role {
                    Role::Store => "store",
                    Role::Broker => "broker",
                },
                master: master_addr == Some(a.info.addr.as_str()),
                cpu_s: cpu_ticks as f64 * tick_s,
                minor_faults: a.stat.minor_faults.saturating_sub(b.stat.minor_faults),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_of(name: &str, role: Role, pid: u32, stat: quire_net::ProcStat) -> ServerSample {
        ServerSample {
            info: ProcessInfo {
                name: name.into(),
                role,
                broker_id: None,
                pid,
                addr: format!("127.0.0.1:{pid}"),
                data_dir: "d".into(),
                log: "l".into(),
            },
            stat,
        }
    }

    fn stat(minor_faults: u64, utime_ticks: u64, stime_ticks: u64) -> quire_net::ProcStat {
        quire_net::ProcStat {
            minor_faults,
            utime_ticks,
            stime_ticks,
            starttime_ticks: 0,
            vsize_bytes: 0,
            rss_pages: 0,
        }
    }

    #[test]
    fn usage_is_the_difference_and_names_the_master() {
        let before = [
            sample_of("store0", Role::Store, 10, stat(100, 5, 5)),
            sample_of("broker1", Role::Broker, 20, stat(1000, 50, 10)),
        ];
        let after = [
            sample_of("store0", Role::Store, 10, stat(130, 7, 8)),
            sample_of("broker1", Role::Broker, 20, stat(1500, 90, 20)),
            sample_of("broker2", Role::Broker, 30, stat(1, 1, 1)),
        ];
        let u = usage(&before, &after, Some("127.0.0.1:20"));
        assert_eq!(u.len(), 2, "a process not sampled before is left out");
        assert_eq!(
            (u[0].name.as_str(), u[0].role, u[0].master),
            ("store0", "store", false)
        );
        assert_eq!(u[0].minor_faults, 30);
        assert_eq!(
            (u[1].name.as_str(), u[1].master, u[1].minor_faults),
            ("broker1", true, 500)
        );
        assert!(u[1].cpu_s > u[0].cpu_s);
    }

    #[test]
    fn this_process_can_be_sampled() {
        let text = std::fs::read_to_string("/proc/self/stat").expect("proc");
        let s = quire_net::parse_stat(&text).expect("parses");
        std::hint::black_box(vec![1u8; 4 << 20]);
        let t = quire_net::parse_stat(&std::fs::read_to_string("/proc/self/stat").expect("proc"))
            .expect("parses");
        assert!(
            t.minor_faults > s.minor_faults,
            "4 MiB touched is faulted in"
        );
    }
}
