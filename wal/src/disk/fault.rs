//! [`FaultDisk`]: wraps another [`Disk`] and fails chosen operations, for tests.
//!
//! A [`FaultPlan`] shared with the test says which write or fdatasync fails and with which
//! errno (EIO, ENOSPC, …). A failed operation is not passed to the inner disk: it completes
//! at once with the error (a failed write also cancels its linked fdatasync, as io_uring
//! does). Everything else goes to the inner disk unchanged. A plan can also make every
//! fdatasync slower, to model a device without a fast write cache.
//!
//! A plan is built in code ([`FaultPlan::fail_write`], …) or from a text spec
//! ([`FaultPlan::from_spec`]), the form `quire-node` reads from `QUIRE_FAILPOINTS` when it
//! is built with its `failpoints` feature:
//!
//! ```text
//! spec  = entry *( ";" entry )
//! entry = "wal_write=" errno [ ",after=" N ]       fail the write after N more succeed (default 0)
//!       | "wal_fdatasync=" errno [ ",after=" N ]   fail the fdatasync after N more succeed
//!       | "wal_fdatasync_delay_ms=" N              every fdatasync takes N ms longer
//! errno = "eio" | "enospc" | "edquot" | "erofs" | a decimal errno
//! ```
//!
//! For example `wal_fdatasync=eio,after=20` lets 20 fdatasyncs succeed and fails the 21st
//! with EIO. Each fault fires once; every injection is logged at `warn`.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::{Disk, DiskCompletion, DiskOp, DiskWaker};

/// Which operations a [`FaultDisk`] fails. Shared between the test and the disk.
#[derive(Debug, Default)]
pub struct FaultPlan {
    state: Mutex<PlanState>,
}

#[derive(Debug, Default)]
struct PlanState {
    /// `(writes still to let through, errno)`.
    write_fault: Option<(u64, i32)>,
    /// `(fdatasyncs still to let through, errno)`.
    fsync_fault: Option<(u64, i32)>,
    writes: u64,
    fsyncs: u64,
    injected: u64,
    /// Extra latency of every fdatasync (a slower device).
    fsync_delay: Duration,
}

impl FaultPlan {
    /// A plan that fails nothing yet.
    #[must_use]
    pub fn new() -> Arc<FaultPlan> {
        Arc::new(FaultPlan::default())
    }

    /// Lets `after` more writes through, then fails the next one with `errno`.
    pub fn fail_write(&self, after: u64, errno: i32) {
        self.lock().write_fault = Some((after, errno));
    }

    /// Lets `after` more fdatasyncs through, then fails the next one with `errno`.
    pub fn fail_fdatasync(&self, after: u64, errno: i32) {
        self.lock().fsync_fault = Some((after, errno));
    }

    /// Makes every fdatasync take `delay` longer (the disk's thread sleeps before
    /// reporting it), as on a device without a fast write cache.
    pub fn slow_fdatasync(&self, delay: Duration) {
        self.lock().fsync_delay = delay;
    }

    /// Writes seen so far (failed ones included).
    #[must_use]
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// fdatasyncs seen so far (failed ones included).
    #[must_use]
    pub fn fsyncs(&self) -> u64 {
        self.lock().fsyncs
    }

    /// Faults injected so far.
    #[must_use]
    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    /// Builds a plan from a text spec (grammar in the module docs). Empty entries (a
    /// trailing `;`) are ignored.
    ///
    /// # Errors
    /// [`FaultSpecError`] naming the entry that does not parse: an unknown point or errno,
    /// a bad number, an unknown option, or a point given twice.
    pub fn from_spec(spec: &str) -> Result<Arc<FaultPlan>, FaultSpecError> {
        let mut state = PlanState::default();
        let mut seen: Vec<&str> = Vec::new();
        for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |problem: String| FaultSpecError {
                entry: entry.to_owned(),
                problem,
            };
            let (point, value) = entry
                .split_once('=')
                .ok_or_else(|| bad("expected POINT=VALUE".into()))?;
            let point = point.trim();
            if seen.contains(&point) {
                return Err(bad(format!("{point} is given twice")));
            }
            seen.push(point);
            match point {
                "wal_write" => state.write_fault = Some(parse_fault(value).map_err(bad)?),
                "wal_fdatasync" => state.fsync_fault = Some(parse_fault(value).map_err(bad)?),
                "wal_fdatasync_delay_ms" => {
                    state.fsync_delay = Duration::from_millis(parse_number(value).map_err(bad)?);
                }
                other => {
                    return Err(bad(format!(
                        "unknown failpoint {other:?} (known: wal_write, wal_fdatasync, \
                         wal_fdatasync_delay_ms)"
                    )))
                }
            }
        }
        Ok(Arc::new(FaultPlan {
            state: Mutex::new(state),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PlanState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next_write(&self) -> Option<i32> {
        let mut s = self.lock();
        s.writes += 1;
        let fire = Self::step(&mut s.write_fault);
        s.injected += u64::from(fire.is_some());
        if let Some(errno) = fire {
            tracing::warn!(
                errno,
                error = %io::Error::from_raw_os_error(errno),
                write = s.writes,
                "failpoint wal_write: failing this write"
            );
        }
        fire
    }

    fn next_fsync(&self) -> Option<i32> {
        let mut s = self.lock();
        s.fsyncs += 1;
        let fire = Self::step(&mut s.fsync_fault);
        s.injected += u64::from(fire.is_some());
        if let Some(errno) = fire {
            tracing::warn!(
                errno,
                error = %io::Error::from_raw_os_error(errno),
                fdatasync = s.fsyncs,
                "failpoint wal_fdatasync: failing this fdatasync"
            );
        }
        fire
    }

    fn step(fault: &mut Option<(u64, i32)>) -> Option<i32> {
        match fault {
            Some((0, errno)) => {
                let errno = *errno;
                *fault = None;
                Some(errno)
            }
            Some((n, _)) => {
                *n -= 1;
                None
            }
            None => None,
        }
    }
}

/// A failpoint spec that does not parse (see [`FaultPlan::from_spec`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad failpoint entry {entry:?}: {problem}")]
pub struct FaultSpecError {
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub problem: String,
}

/// Most fault-free operations a spec may ask for before a fault (`after=N`).
pub const FAULT_AFTER_MAX: u64 = 1 << 40;

/// Parses `errno[,after=N]`.
fn parse_fault(value: &str) -> Result<(u64, i32), String> {
    let mut parts = value.split(',').map(str::trim);
    let errno = parse_errno(parts.next().unwrap_or_default())?;
    let mut after = 0;
    for option in parts {
        match option.split_once('=') {
            Some(("after", n)) => after = parse_number(n)?,
            _ => return Err(format!("unknown option {option:?} (known: after=N)")),
        }
    }
    if after > FAULT_AFTER_MAX {
        return Err(format!("after={after} is above {FAULT_AFTER_MAX}"));
    }
    Ok((after, errno))
}

fn parse_errno(text: &str) -> Result<i32, String> {
    match text.to_ascii_lowercase().as_str() {
        "eio" => Ok(libc::EIO),
        "enospc" => Ok(libc::ENOSPC),
        "edquot" => Ok(libc::EDQUOT),
        "erofs" => Ok(libc::EROFS),
        other => match other.parse::<i32>() {
            Ok(n) if n > 0 && n < 4096 => Ok(n),
            _ => Err(format!(
                "unknown errno {text:?} (eio, enospc, edquot, erofs or a number 1..4095)"
            )),
        },
    }
}

fn parse_number(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<u64>()
        .map_err(|_| format!("{text:?} is not a non-negative integer"))
}

/// A [`Disk`] that fails what its [`FaultPlan`] says. See the module docs.
#[derive(Debug)]
pub struct FaultDisk<F = std::fs::File> {
    inner: Box<dyn Disk<F>>,
    plan: Arc<FaultPlan>,
    /// Failed operations, completed without reaching the inner disk.
    ready: Vec<DiskCompletion>,
    /// `(write token, failed fdatasync)`: reported right after that write completes.
    after_write: Vec<(u64, DiskCompletion)>,
}

impl<F> FaultDisk<F> {
    /// Wraps `inner`, failing what `plan` says.
    #[must_use]
    pub fn new(inner: Box<dyn Disk<F>>, plan: Arc<FaultPlan>) -> FaultDisk<F> {
        FaultDisk {
            inner,
            plan,
            ready: Vec::new(),
            after_write: Vec::new(),
        }
    }
}

fn failed(token: u64, errno: i32) -> DiskCompletion {
    DiskCompletion {
        token,
        result: Err(io::Error::from_raw_os_error(errno)),
        buf: None,
    }
}

impl<F: std::fmt::Debug + Send + Sync + 'static> Disk<F> for FaultDisk<F> {
    fn name(&self) -> &'static str {
        "fault"
    }

    fn push(&mut self, op: DiskOp<F>) {
        match op {
            DiskOp::Write {
                file,
                position,
                buf,
                token,
                then_fdatasync,
            } => {
                if let Some(errno) = self.plan.next_write() {
                    self.ready.push(DiskCompletion {
                        token,
                        result: Err(io::Error::from_raw_os_error(errno)),
                        buf: Some(buf),
                    });
                    if let Some(sync_token) = then_fdatasync {
                        self.ready.push(failed(sync_token, libc::ECANCELED));
                    }
                    return;
                }
                let mut link = then_fdatasync;
                if let Some(sync_token) = then_fdatasync {
                    if let Some(errno) = self.plan.next_fsync() {
                        self.after_write.push((token, failed(sync_token, errno)));
                        link = None;
                    }
                }
                self.inner.push(DiskOp::Write {
                    file,
                    position,
                    buf,
                    token,
                    then_fdatasync: link,
                });
            }
            DiskOp::Fdatasync { file, token } => {
                if let Some(errno) = self.plan.next_fsync() {
                    self.ready.push(failed(token, errno));
                    return;
                }
                self.inner.push(DiskOp::Fdatasync { file, token });
            }
            // Directory fsyncs are not failpoints: they pass through.
            op @ DiskOp::SyncDir { .. } => self.inner.push(op),
        }
    }

    fn wait(&mut self, out: &mut Vec<DiskCompletion>, timeout: Option<Duration>) -> io::Result<()> {
        let start = out.len();
        if self.ready.is_empty() {
            self.inner.wait(out, timeout)?;
        } else {
            out.append(&mut self.ready);
            self.inner.wait(out, Some(Duration::ZERO))?;
        }
        let delay = self.plan.lock().fsync_delay;
        if !delay.is_zero() && out[start..].iter().any(|c| c.buf.is_none()) {
            std::thread::sleep(delay);
        }
        let mut i = start;
        while i < out.len() {
            let token = out[i].token;
            if let Some(k) = self.after_write.iter().position(|(t, _)| *t == token) {
                let (_, completion) = self.after_write.swap_remove(k);
                out.insert(i + 1, completion);
            }
            i += 1;
        }
        Ok(())
    }

    fn submit(&mut self) -> io::Result<()> {
        self.inner.submit()
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.ready.len() + self.after_write.len()
    }

    fn waker(&self) -> Arc<dyn DiskWaker> {
        self.inner.waker()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_sets_each_point() {
        let plan = FaultPlan::from_spec(
            " wal_write=enospc,after=7 ; wal_fdatasync=EIO;wal_fdatasync_delay_ms=15;",
        )
        .expect("valid spec");
        let s = plan.lock();
        assert_eq!(s.write_fault, Some((7, libc::ENOSPC)));
        assert_eq!(s.fsync_fault, Some((0, libc::EIO)));
        assert_eq!(s.fsync_delay, Duration::from_millis(15));
    }

    #[test]
    fn a_spec_fault_fires_once_after_n_operations() {
        let plan = FaultPlan::from_spec("wal_fdatasync=5,after=2").expect("valid spec");
        assert_eq!(plan.next_fsync(), None);
        assert_eq!(plan.next_fsync(), None);
        assert_eq!(plan.next_fsync(), Some(5));
        assert_eq!(plan.next_fsync(), None);
        assert_eq!(plan.injected(), 1);
        assert_eq!(plan.fsyncs(), 4);
    }

    #[test]
    fn bad_specs_name_the_entry() {
        for (spec, needle) in [
            ("wal_read=eio", "unknown failpoint"),
            ("wal_write", "POINT=VALUE"),
            ("wal_write=ebadness", "unknown errno"),
            ("wal_write=eio,after=-1", "non-negative"),
            ("wal_write=eio,every=2", "unknown option"),
            ("wal_write=eio;wal_write=enospc", "twice"),
            ("wal_fdatasync_delay_ms=soon", "non-negative"),
            ("wal_write=0", "unknown errno"),
        ] {
            let e = FaultPlan::from_spec(spec).expect_err(spec);
            assert!(e.to_string().contains(needle), "{spec}: {e}");
        }
        assert!(
            FaultPlan::from_spec("").is_ok(),
            "an empty spec injects nothing"
        );
    }
}
