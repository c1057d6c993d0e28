//! [`FaultDisk`]: wraps another [`Disk`] and fails chosen operations, for tests.
//!
//! A [`FaultPlan`] shared with the test says which write or fdatasync fails and with which
//! errno (EIO, ENOSPC, …). A failed operation is not passed to the inner disk: it completes
//! at once with the error (a failed write also cancels its linked fdatasync, as io_uring
//! does). Everything else goes to the inner disk unchanged. A plan can also make every
//! fdatasync slower, to model a device without a fast write cache.

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

    fn lock(&self) -> std::sync::MutexGuard<'_, PlanState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next_write(&self) -> Option<i32> {
        let mut s = self.lock();
        s.writes += 1;
        let fire = Self::step(&mut s.write_fault);
        s.injected += u64::from(fire.is_some());
        fire
    }

    fn next_fsync(&self) -> Option<i32> {
        let mut s = self.lock();
        s.fsyncs += 1;
        let fire = Self::step(&mut s.fsync_fault);
        s.injected += u64::from(fire.is_some());
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

/// A [`Disk`] that fails what its [`FaultPlan`] says. See the module docs.
#[derive(Debug)]
pub struct FaultDisk {
    inner: Box<dyn Disk>,
    plan: Arc<FaultPlan>,
    /// Failed operations, completed without reaching the inner disk.
    ready: Vec<DiskCompletion>,
    /// `(write token, failed fdatasync)`: reported right after that write completes.
    after_write: Vec<(u64, DiskCompletion)>,
}

impl FaultDisk {
    /// Wraps `inner`, failing what `plan` says.
    #[must_use]
    pub fn new(inner: Box<dyn Disk>, plan: Arc<FaultPlan>) -> FaultDisk {
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

impl Disk for FaultDisk {
    fn name(&self) -> &'static str {
        "fault"
    }

    fn push(&mut self, op: DiskOp) {
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
