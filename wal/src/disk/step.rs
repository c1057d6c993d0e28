//! [`StepDisk`]: a disk for a deterministic simulator. Writes run at once, inside the
//! commit thread's [`Disk::wait`]; every fdatasync (and directory fsync) is held until the
//! driver completes it with [`StepControl::complete_sync`], oldest first; and the driver can wait until the commit thread has
//! nothing left to do ([`StepControl::settle`]).
//!
//! With it, what the commit thread does follows from the order of the driver's calls and
//! not from timing: the driver appends, settles (the batch is written, its fdatasync is
//! held), decides in simulated time when the fdatasync completes, completes it and settles
//! again. Appends queued while an fdatasync is held form the next batch, as they would on a
//! real disk. The commit thread's batch window must be 0 (`WalConfig::batch_window_us`):
//! this disk ignores wait timeouts and blocks until woken.
//!
//! It works on any [`StorageFile`]; the simulator uses it on [`crate::CrashDisk`] files, so
//! a write it runs is un-synced on the crash-tracking disk until the fdatasync runs.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::{Disk, DiskCompletion, DiskOp, DiskWaker};
use crate::storage::StorageFile;

/// What the disk and its driver share.
#[derive(Debug, Default)]
struct StepState {
    /// The waker was signalled (level-triggered).
    woken: bool,
    /// The commit thread blocks in `wait` with nothing to run.
    idle: bool,
    /// fdatasyncs held, not yet completed.
    held: usize,
    /// fdatasyncs the driver completed that the commit thread has not run yet.
    released: usize,
}

#[derive(Debug, Default)]
struct Shared {
    st: Mutex<StepState>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, StepState> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl DiskWaker for Shared {
    fn wake(&self) {
        self.lock().woken = true;
        self.cv.notify_all();
    }
}

/// The driver's handle to a [`StepDisk`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct StepControl {
    shared: Arc<Shared>,
}

impl StepControl {
    /// Blocks until the commit thread waits with nothing to run: no wake pending, no
    /// completed fdatasync left to run. Returns at once if it already does.
    ///
    /// # Panics
    /// If the commit thread does not settle within 60 s of wall time (a deadlock).
    pub fn settle(&self) {
        let st = self.shared.lock();
        let (st, timed_out) = self
            .shared
            .cv
            .wait_timeout_while(st, Duration::from_secs(60), |s| {
                !(s.idle && !s.woken && s.released == 0)
            })
            .unwrap_or_else(PoisonError::into_inner);
        assert!(
            !timed_out.timed_out() || (st.idle && !st.woken && st.released == 0),
            "invariant: the WAL commit thread settles"
        );
    }

    /// fdatasyncs held by the disk, not yet completed by the driver.
    #[must_use]
    pub fn held_syncs(&self) -> usize {
        let st = self.shared.lock();
        st.held - st.released
    }

    /// Lets the oldest held fdatasync run (on the commit thread, at its next wait); does
    /// nothing if none is held. Call [`StepControl::settle`] after it.
    pub fn complete_sync(&self) {
        let mut st = self.shared.lock();
        if st.held > st.released {
            st.released += 1;
            st.idle = false;
            self.shared.cv.notify_all();
        }
    }

    /// Lets every held fdatasync run.
    pub fn complete_all_syncs(&self) {
        let mut st = self.shared.lock();
        if st.held > st.released {
            st.released = st.held;
            st.idle = false;
        }
        self.shared.cv.notify_all();
    }
}

/// A disk whose fdatasyncs the driver completes. See the module docs.
pub struct StepDisk<F> {
    queue: VecDeque<DiskOp<F>>,
    /// Held syncs, oldest first: the file (or directory), the token, and whether it is a
    /// directory's fsync.
    syncs: VecDeque<(Arc<F>, u64, SyncKind)>,
    shared: Arc<Shared>,
}

impl<F> fmt::Debug for StepDisk<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepDisk")
            .field("queued", &self.queue.len())
            .field("held_syncs", &self.syncs.len())
            .finish()
    }
}

impl<F> StepDisk<F> {
    /// A new disk and the handle that drives it.
    #[must_use]
    pub fn new() -> (StepDisk<F>, StepControl) {
        let shared = Arc::new(Shared::default());
        let control = StepControl {
            shared: shared.clone(),
        };
        (
            StepDisk {
                queue: VecDeque::new(),
                syncs: VecDeque::new(),
                shared,
            },
            control,
        )
    }
}

impl<F: StorageFile> Disk<F> for StepDisk<F> {
    fn name(&self) -> &'static str {
        "step"
    }

    fn push(&mut self, op: DiskOp<F>) {
        self.queue.push_back(op);
    }

    fn wait(
        &mut self,
        out: &mut Vec<DiskCompletion>,
        _timeout: Option<Duration>,
    ) -> io::Result<()> {
        let start = out.len();
        while let Some(op) = self.queue.pop_front() {
            match op {
                DiskOp::Write {
                    file,
                    position,
                    buf,
                    token,
                    then_fdatasync,
                } => {
                    let result = file
                        .write_all_at(buf.as_slice(), position.0)
                        .map(|()| u32::try_from(buf.len()).unwrap_or(u32::MAX));
                    let ok = result.is_ok();
                    out.push(DiskCompletion {
                        token,
                        result,
                        buf: Some(buf),
                    });
                    match then_fdatasync {
                        Some(t) if ok => self.hold(file, t, SyncKind::Data),
                        Some(t) => out.push(DiskCompletion {
                            token: t,
                            result: Err(io::Error::from_raw_os_error(libc::ECANCELED)),
                            buf: None,
                        }),
                        None => {}
                    }
                }
                DiskOp::Fdatasync { file, token } => self.hold(file, token, SyncKind::Data),
                DiskOp::SyncDir { dir, token } => self.hold(dir, token, SyncKind::Dir),
            }
        }
        let mut st = self.shared.lock();
        loop {
            if st.released > 0 {
                if let Some((file, token, kind)) = self.syncs.pop_front() {
                    st.released -= 1;
                    st.held -= 1;
                    // Busy until it waits again: `settle` must not return while this
                    // fdatasync runs and its completion is not yet handled.
                    st.idle = false;
                    drop(st);
                    let result = match kind {
                        SyncKind::Data => file.sync_data(),
                        SyncKind::Dir => file.sync_all(),
                    };
                    out.push(DiskCompletion {
                        token,
                        result: result.map(|()| 0),
                        buf: None,
                    });
                    st = self.shared.lock();
                    continue;
                }
                st.released = 0;
            }
            if out.len() > start {
                st.idle = false;
                return Ok(());
            }
            if st.woken {
                st.woken = false;
                st.idle = false;
                return Ok(());
            }
            st.idle = true;
            self.shared.cv.notify_all();
            st = self
                .shared
                .cv
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn in_flight(&self) -> usize {
        self.queue.len() + self.syncs.len()
    }

    fn waker(&self) -> Arc<dyn DiskWaker> {
        self.shared.clone()
    }
}

/// What a held sync is.
#[derive(Clone, Copy, Debug)]
enum SyncKind {
    /// An fdatasync of a segment.
    Data,
    /// An fsync of the directory.
    Dir,
}

impl<F> StepDisk<F> {
    fn hold(&mut self, file: Arc<F>, token: u64, kind: SyncKind) {
        self.syncs.push_back((file, token, kind));
        self.shared.lock().held += 1;
    }
}
