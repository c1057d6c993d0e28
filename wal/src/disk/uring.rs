//! [`UringDisk`]: the io_uring disk — one ring, owned by the commit thread of one data
//! directory.
//!
//! Writes are `IORING_OP_WRITE` on the O_DIRECT segment fd from an [`AlignedBuf`]; an
//! fdatasync is `IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC`, linked to its write
//! (`IOSQE_IO_LINK`) when the commit thread asks for it; a directory fsync is
//! `IORING_OP_FSYNC` on the directory's fd. The ring also keeps one read of an
//! eventfd armed, so appenders on other threads can wake the commit thread while it waits
//! for completions (see [`DiskWaker`]).
//!
//! Buffers and files move into the ring with their operation and leave with its completion;
//! dropping the disk first waits for every operation the kernel still holds.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring, Probe};

use super::{AlignedBuf, Disk, DiskCompletion, DiskOp, DiskWaker};

/// user_data of the eventfd read; callers' tokens must differ from it.
const WAKE_TOKEN: u64 = u64::MAX;

/// io_uring disk. See the module docs.
#[derive(Debug)]
pub struct UringDisk {
    ring: IoUringDebug,
    /// Created with R_DISABLED: the first call on the commit thread enables it.
    disabled: bool,
    waker: Arc<EventFdWaker>,
    /// Target of the armed eventfd read; boxed so its address is stable.
    wake_buf: Box<u64>,
    wake_armed: bool,
    /// Operations the kernel holds, by user_data: what must stay alive until completion.
    held: HashMap<u64, Held>,
}

struct IoUringDebug(IoUring);

impl std::fmt::Debug for IoUringDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoUring")
            .field("entries", &self.0.params().sq_entries())
            .finish()
    }
}

#[derive(Debug)]
struct Held {
    buf: Option<AlignedBuf>,
    _file: Arc<File>,
}

#[derive(Debug)]
struct EventFdWaker {
    fd: OwnedFd,
}

impl DiskWaker for EventFdWaker {
    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to an eventfd we own. A failure (counter
        // overflow, impossible in practice) only loses a wake-up that is already pending.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }
}

/// Opens an io_uring of `entries` entries for one issuing thread, like fio's io_uring
/// engine: COOP_TASKRUN (no IPI per completion) and SINGLE_ISSUER | DEFER_TASKRUN
/// (completion work runs when the one issuing thread waits for it). Kernels older than 6.1
/// refuse unknown flags with EINVAL; fewer flags are tried then (COOP_TASKRUN alone, then
/// none). Returns the ring and whether it got SINGLE_ISSUER.
///
/// With `disabled`, a SINGLE_ISSUER ring is created with R_DISABLED: the thread that later
/// enables it (`register_enable_rings`) becomes its issuer, so another thread may set it
/// up. Without it, the calling thread is the issuer.
///
/// # Errors
/// io_uring_setup's error (ENOSYS, EPERM, ENOMEM ...).
pub fn open_single_issuer_ring(entries: u32, disabled: bool) -> io::Result<(IoUring, bool)> {
    let mut last = None;
    for attempt in 0..3 {
        let mut b = IoUring::builder();
        match attempt {
            0 => {
                b.setup_coop_taskrun()
                    .setup_single_issuer()
                    .setup_defer_taskrun();
                if disabled {
                    b.setup_r_disabled();
                }
            }
            1 => {
                b.setup_coop_taskrun();
            }
            _ => {}
        }
        match b.build(entries) {
            Ok(ring) => return Ok((ring, attempt == 0)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL)))
}

impl UringDisk {
    /// Sets up a ring with room for `ops_in_flight_max` operations plus the wake-up read,
    /// and checks that the kernel supports what the WAL needs (WRITE, FSYNC, READ opcodes
    /// and timed waits).
    ///
    /// # Errors
    /// A human-readable reason when io_uring cannot be used (ENOSYS, EPERM, missing
    /// features).
    pub fn new(ops_in_flight_max: usize) -> Result<UringDisk, String> {
        let entries = u32::try_from((ops_in_flight_max + 2).next_power_of_two()).unwrap_or(64);
        let (ring, disabled) =
            open_single_issuer_ring(entries, true).map_err(|e| match e.raw_os_error() {
                Some(libc::ENOSYS) => {
                    format!("io_uring_setup: ENOSYS (kernel without io_uring): {e}")
                }
                Some(libc::EPERM) => {
                    format!("io_uring_setup: EPERM (disabled by sysctl or seccomp): {e}")
                }
                _ => format!("io_uring_setup failed: {e}"),
            })?;
        if !ring.params().is_feature_ext_arg() {
            return Err("kernel lacks IORING_FEAT_EXT_ARG (timed waits); need Linux 5.11+".into());
        }
        let mut probe = Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(|e| format!("io_uring probe failed: {e}"))?;
        for (code, name) in [
            (opcode::Write::CODE, "WRITE"),
            (opcode::Fsync::CODE, "FSYNC"),
            (opcode::Read::CODE, "READ"),
        ] {
            if !probe.is_supported(code) {
                return Err(format!("io_uring lacks the {name} opcode"));
            }
        }
        // Blocking eventfd: io_uring polls it internally; O_NONBLOCK would make the read
        // complete with EAGAIN instead of waiting.
        // SAFETY: eventfd has no memory-safety preconditions.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(format!("eventfd failed: {}", io::Error::last_os_error()));
        }
        // SAFETY: raw is a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(UringDisk {
            ring: IoUringDebug(ring),
            disabled,
            waker: Arc::new(EventFdWaker { fd }),
            wake_buf: Box::new(0),
            wake_armed: false,
            held: HashMap::new(),
        })
    }

    /// Enables a ring created disabled, on the calling (commit) thread, which becomes its
    /// single issuer. A failure is left to the next ring call to report.
    fn enable(&mut self) {
        if self.disabled {
            if let Err(e) = self.ring.0.submitter().register_enable_rings() {
                tracing::error!(error = %e, "enabling the io_uring failed");
            }
            self.disabled = false;
        }
    }

    fn push_entry(&mut self, entry: squeue::Entry) {
        self.enable();
        loop {
            // SAFETY: every pointer in `entry` (buffer, eventfd target) is owned by `self`
            // (in `held` or `wake_buf`) until its completion is reaped, and Drop waits for
            // all completions.
            let pushed = unsafe { self.ring.0.submission().push(&entry) };
            if pushed.is_ok() {
                return;
            }
            // Queue full: hand what is queued to the kernel and try again.
            if let Err(e) = self.ring.0.submit() {
                tracing::error!(error = %e, "io_uring submit failed while the queue was full");
                std::thread::yield_now();
            }
        }
    }

    fn arm_wake(&mut self) {
        if self.wake_armed {
            return;
        }
        let entry = opcode::Read::new(
            types::Fd(self.waker.fd.as_raw_fd()),
            (&raw mut *self.wake_buf).cast(),
            8,
        )
        .build()
        .user_data(WAKE_TOKEN);
        self.push_entry(entry);
        self.wake_armed = true;
    }

    /// Moves available completions to `out`; returns whether the wake read completed.
    fn reap(&mut self, out: &mut Vec<DiskCompletion>) -> bool {
        let mut woken = false;
        let mut reaped = Vec::new();
        for cqe in self.ring.0.completion() {
            reaped.push((cqe.user_data(), cqe.result()));
        }
        for (user_data, res) in reaped {
            if user_data == WAKE_TOKEN {
                self.wake_armed = false;
                woken = true;
                continue;
            }
            let held = self.held.remove(&user_data);
            let result = if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else {
                Ok(res.unsigned_abs())
            };
            out.push(DiskCompletion {
                token: user_data,
                result,
                buf: held.and_then(|h| h.buf),
            });
        }
        woken
    }
}

impl Disk for UringDisk {
    fn name(&self) -> &'static str {
        "io_uring"
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
                assert!(
                    token != WAKE_TOKEN && then_fdatasync != Some(WAKE_TOKEN),
                    "reserved token"
                );
                let len =
                    u32::try_from(buf.len()).expect("invariant: a batch is smaller than 4 GiB");
                let fd = types::Fd(file.as_raw_fd());
                let mut entry = opcode::Write::new(fd, buf.as_ptr(), len)
                    .offset(position.0)
                    .build()
                    .user_data(token);
                if then_fdatasync.is_some() {
                    entry = entry.flags(squeue::Flags::IO_LINK);
                }
                self.held.insert(
                    token,
                    Held {
                        buf: Some(buf),
                        _file: file.clone(),
                    },
                );
                self.push_entry(entry);
                if let Some(sync_token) = then_fdatasync {
                    let entry = opcode::Fsync::new(fd)
                        .flags(types::FsyncFlags::DATASYNC)
                        .build()
                        .user_data(sync_token);
                    self.held.insert(
                        sync_token,
                        Held {
                            buf: None,
                            _file: file,
                        },
                    );
                    self.push_entry(entry);
                }
            }
            DiskOp::Fdatasync { file, token } => {
                assert!(token != WAKE_TOKEN, "reserved token");
                let entry = opcode::Fsync::new(types::Fd(file.as_raw_fd()))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(token);
                self.held.insert(
                    token,
                    Held {
                        buf: None,
                        _file: file,
                    },
                );
                self.push_entry(entry);
            }
            DiskOp::SyncDir { dir, token } => {
                assert!(token != WAKE_TOKEN, "reserved token");
                // A full fsync of the directory's fd: its entries, not data.
                let entry = opcode::Fsync::new(types::Fd(dir.as_raw_fd()))
                    .build()
                    .user_data(token);
                self.held.insert(
                    token,
                    Held {
                        buf: None,
                        _file: dir,
                    },
                );
                self.push_entry(entry);
            }
        }
    }

    fn submit(&mut self) -> io::Result<()> {
        self.enable();
        self.ring.0.submit().map(|_| ())
    }

    fn wait(&mut self, out: &mut Vec<DiskCompletion>, timeout: Option<Duration>) -> io::Result<()> {
        self.enable();
        self.arm_wake();
        let before = out.len();
        let woken = self.reap(out);
        if woken || out.len() > before || timeout == Some(Duration::ZERO) {
            self.ring.0.submit()?;
            return Ok(());
        }
        let res = match timeout {
            None => self.ring.0.submit_and_wait(1),
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.0.submitter().submit_with_args(1, &args)
            }
        };
        match res {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) => {}
            Err(e) => return Err(e),
        }
        self.reap(out);
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.held.len()
    }

    fn waker(&self) -> Arc<dyn DiskWaker> {
        self.waker.clone()
    }
}

impl Drop for UringDisk {
    fn drop(&mut self) {
        // The kernel may still read our buffers or write `wake_buf`: complete the wake read
        // and wait for every held operation before the memory goes away.
        if self.disabled {
            return; // never used: the kernel holds nothing
        }
        if self.wake_armed {
            self.waker.wake();
        }
        let mut sink = Vec::new();
        while !self.held.is_empty() || self.wake_armed {
            if let Err(e) = self.ring.0.submit_and_wait(1) {
                if e.raw_os_error() != Some(libc::EINTR) {
                    tracing::error!(error = %e, "io_uring wait failed at shutdown; leaking in-flight buffers");
                    std::mem::forget(std::mem::take(&mut self.held));
                    let buf = std::mem::replace(&mut self.wake_buf, Box::new(0));
                    std::mem::forget(buf);
                    return;
                }
            }
            self.reap(&mut sink);
        }
    }
}
