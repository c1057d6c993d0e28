//! [`SyncDisk`]: the fallback disk — `pwrite` and `fdatasync` run on the commit thread
//! inside [`Disk::wait`], one after the other.
//!
//! Group commit still works (appends that arrive during an fdatasync share the next one);
//! what is lost compared to io_uring is the overlap of the next write with the running
//! fdatasync.
//!
//! It works on any [`StorageFile`]: the real `std::fs::File` (`pwrite`, `fdatasync`) or a
//! simulated one ([`crate::storage::CrashFile`]), so the simulated disk runs the same
//! commit thread.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Disk, DiskCompletion, DiskOp, DiskWaker};
use crate::storage::StorageFile;

/// `pwrite` + `fdatasync` on the calling thread, on files of type `F`. See the module docs.
#[derive(Debug)]
pub struct SyncDisk<F = File> {
    queue: VecDeque<DiskOp<F>>,
    waker: Arc<CondWaker>,
}

#[derive(Debug, Default)]
struct CondWaker {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl DiskWaker for CondWaker {
    fn wake(&self) {
        let mut woken = self
            .woken
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *woken = true;
        self.cv.notify_one();
    }
}

impl<F> SyncDisk<F> {
    /// A new synchronous disk.
    #[must_use]
    pub fn new() -> SyncDisk<F> {
        SyncDisk {
            queue: VecDeque::new(),
            waker: Arc::new(CondWaker::default()),
        }
    }
}

impl<F> Default for SyncDisk<F> {
    fn default() -> Self {
        SyncDisk::new()
    }
}

fn write_once<F: StorageFile>(file: &F, bytes: &[u8], position: u64) -> io::Result<u32> {
    loop {
        match file.write_at(bytes, position) {
            Ok(n) => return Ok(u32::try_from(n).unwrap_or(u32::MAX)),
            // EINTR means the call did nothing; calling again is not a retry of a failure.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

impl<F: StorageFile> Disk<F> for SyncDisk<F> {
    fn name(&self) -> &'static str {
        "sync"
    }

    fn push(&mut self, op: DiskOp<F>) {
        self.queue.push_back(op);
    }

    fn wait(&mut self, out: &mut Vec<DiskCompletion>, timeout: Option<Duration>) -> io::Result<()> {
        let produced = !self.queue.is_empty();
        while let Some(op) = self.queue.pop_front() {
            match op {
                DiskOp::Write {
                    file,
                    position,
                    buf,
                    token,
                    then_fdatasync,
                } => {
                    let result = write_once(&*file, buf.as_slice(), position.0);
                    let ok = matches!(result, Ok(n) if n as usize == buf.len());
                    out.push(DiskCompletion {
                        token,
                        result,
                        buf: Some(buf),
                    });
                    if let Some(sync_token) = then_fdatasync {
                        let result = if ok {
                            file.sync_data().map(|()| 0)
                        } else {
                            Err(io::Error::from_raw_os_error(libc::ECANCELED))
                        };
                        out.push(DiskCompletion {
                            token: sync_token,
                            result,
                            buf: None,
                        });
                    }
                }
                DiskOp::Fdatasync { file, token } => {
                    let result = file.sync_data().map(|()| 0);
                    out.push(DiskCompletion {
                        token,
                        result,
                        buf: None,
                    });
                }
                DiskOp::SyncDir { dir, token } => {
                    let result = dir.sync_all().map(|()| 0);
                    out.push(DiskCompletion {
                        token,
                        result,
                        buf: None,
                    });
                }
            }
        }
        if produced {
            return Ok(());
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut woken = self
            .waker
            .woken
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while !*woken {
            match deadline {
                None => {
                    woken = self
                        .waker
                        .cv
                        .wait(woken)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(());
                    }
                    woken = self
                        .waker
                        .cv
                        .wait_timeout(woken, d - now)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                }
            }
        }
        *woken = false;
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.queue.len()
    }

    fn waker(&self) -> Arc<dyn DiskWaker> {
        self.waker.clone()
    }
}
