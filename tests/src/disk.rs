//! Disk faults done to a store from outside its process, and what a test reads back:
//!
//! - [`Tmpfs`]: a size-limited tmpfs mounted on a store's data directory (root only; the
//!   guard unmounts on drop, also when the test panics), and a [`ballast`] file that
//!   takes its space and is deleted to free it;
//! - [`segments`], [`written_bytes`], [`truncate`], [`flip_bit`], [`records`]: a stopped
//!   store's segment files;
//! - [`wal_verify`]: `quire wal verify DIR --format json`, its exit status and findings;
//! - [`tail`]: a store's `TailResponse` over the store protocol;
//! - [`terminate`]: SIGTERM and wait for the exit (a clean shutdown, unlike
//!   [`crate::StoreNode::kill9`]);
//! - [`wait_until`]: a bounded poll.
//!
//! It reads the WAL's files through the `quire` CLI (`wal dump`, `wal verify`), never
//! through the WAL's internals.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_proto::{Body, FetchRequest, Offset, TailRequest, TailResponse};

use crate::client::Client;
use crate::cluster::{Cluster, StoreNode};
use crate::load::ProducerOutcome;
use crate::process::quire_command;
use crate::WAIT;

/// A tmpfs of a fixed size mounted on a directory; unmounted (lazily, so an open file does
/// not keep it) on drop.
#[derive(Debug)]
pub struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size_bytes` on `path` (which must exist and should be empty).
    ///
    /// # Errors
    /// mount(2)'s error: EPERM when the test does not run as root (or the container forbids
    /// mounts). Callers fall back to a failpoint.
    pub fn mount(path: &Path, size_bytes: u64) -> io::Result<Tmpfs> {
        let target = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
        let options =
            CString::new(format!("size={size_bytes},mode=0755")).map_err(io::Error::other)?;
        // SAFETY: every pointer is a NUL-terminated string that outlives the call; mount(2)
        // only reads them.
        let rc = unsafe {
            libc::mount(
                c"quire-test".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Tmpfs {
            path: path.to_path_buf(),
        })
    }

    /// Moves the (initialised, stopped) store's data directory onto a new tmpfs of
    /// `size_bytes` mounted at the same path: its files are copied over.
    ///
    /// # Errors
    /// As [`Tmpfs::mount`], or a failed copy (the directory is then put back).
    pub fn move_store(store: &StoreNode, size_bytes: u64) -> io::Result<Tmpfs> {
        assert!(store.proc.is_none(), "move a stopped store");
        let aside = store.dir.with_extension("before-tmpfs");
        fs::rename(&store.dir, &aside)?;
        fs::create_dir(&store.dir)?;
        let mounted = Tmpfs::mount(&store.dir, size_bytes).and_then(|m| {
            copy_tree(&aside, &store.dir)?;
            Ok(m)
        });
        match mounted {
            Ok(m) => {
                fs::remove_dir_all(&aside)?;
                Ok(m)
            }
            Err(e) => {
                let _ = fs::remove_dir(&store.dir);
                fs::rename(&aside, &store.dir)?;
                Err(e)
            }
        }
    }

    /// The mount point.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes free for an unprivileged writer.
    ///
    /// # Errors
    /// statvfs(2)'s.
    pub fn free_bytes(&self) -> io::Result<u64> {
        free_bytes(&self.path)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if let Ok(target) = CString::new(self.path.as_os_str().as_bytes()) {
            // SAFETY: a NUL-terminated path that outlives the call. MNT_DETACH: the mount
            // goes now even if a (killed, not yet reaped) process holds a file on it.
            let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            if rc != 0 {
                eprintln!(
                    "unmounting {}: {}",
                    self.path.display(),
                    io::Error::last_os_error()
                );
            }
        }
    }
}

fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            fs::create_dir(&dest)?;
            copy_tree(&entry.path(), &dest)?;
        } else {
            fs::copy(entry.path(), &dest)?;
        }
    }
    Ok(())
}

/// Bytes free under `path` for an unprivileged writer.
///
/// # Errors
/// statvfs(2)'s.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let target = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a writable statvfs, both outliving the call.
    if unsafe { libc::statvfs(target.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail * st.f_frsize)
}

/// Writes `dir/ballast` so that about `leave_free_bytes` stay free on `dir`'s file system;
/// returns its path (delete it to free the space).
///
/// # Errors
/// A failed write (other than running out of space at the very end).
pub fn ballast(dir: &Path, leave_free_bytes: u64) -> io::Result<PathBuf> {
    let path = dir.join("ballast");
    let mut f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)?;
    let chunk = vec![0xa5u8; 64 * 1024];
    loop {
        let free = free_bytes(dir)?;
        if free <= leave_free_bytes {
            break;
        }
        let n = usize::try_from(free - leave_free_bytes)
            .unwrap_or(usize::MAX)
            .min(chunk.len());
        match f.write_all(&chunk[..n]) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => return Err(e),
        }
    }
    f.sync_all()?;
    Ok(path)
}

/// The store's WAL directory.
#[must_use]
pub fn wal_dir(store_dir: &Path) -> PathBuf {
    store_dir.join("wal")
}

/// The store's segment files, in base-offset order (their names sort that way).
#[must_use]
pub fn segments(store_dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(wal_dir(store_dir))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// One past the last non-zero byte of `path` (0 if it holds only zeros): where written
/// records end in a preallocated, zero-filled segment.
///
/// # Errors
/// Reading the file.
pub fn written_bytes(path: &Path) -> io::Result<u64> {
    let mut f = fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut pos, mut end) = (0u64, 0u64);
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(end);
        }
        if let Some(i) = buf[..n].iter().rposition(|&b| b != 0) {
            end = pos + i as u64 + 1;
        }
        pos += n as u64;
    }
}

/// Truncates `path` to `len` bytes (and fsyncs it).
///
/// # Errors
/// Opening or truncating.
pub fn truncate(path: &Path, len: u64) -> io::Result<()> {
    let f = OpenOptions::new().write(true).open(path)?;
    f.set_len(len)?;
    f.sync_all()
}

/// Flips bit `bit` (0..8) of the byte at `position` of `path` (and fsyncs it); returns the
/// byte before and after.
///
/// # Errors
/// Reading or writing the file.
pub fn flip_bit(path: &Path, position: u64, bit: u8) -> io::Result<(u8, u8)> {
    let mut f = OpenOptions::new().read(true).write(true).open(path)?;
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(position))?;
    f.read_exact(&mut b)?;
    let before = b[0];
    b[0] ^= 1 << (bit % 8);
    f.seek(SeekFrom::Start(position))?;
    f.write_all(&b)?;
    f.sync_all()?;
    Ok((before, b[0]))
}

/// One record as `quire wal dump --format jsonl` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordAt {
    /// Segment file name.
    pub segment: String,
    /// Byte position in the segment.
    pub position: u64,
    /// Header and payload bytes.
    pub bytes: u64,
    /// Log offset (from the header).
    pub offset: u64,
}

/// Every entry record of the stopped store's log, from `quire wal dump --format jsonl`.
///
/// # Panics
/// If the dump fails or prints something else than JSON lines.
#[must_use]
pub fn records(store_dir: &Path) -> Vec<RecordAt> {
    let out = run_quire(&["wal", "dump", "--format", "jsonl"], &wal_dir(store_dir));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut records = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("quire wal dump printed {line:?}: {e}"));
        if v["type"] != "record" || v["status"] != "entry" {
            continue;
        }
        records.push(RecordAt {
            segment: v["segment"].as_str().expect("segment").to_owned(),
            position: v["position"].as_u64().expect("position"),
            bytes: v["record_bytes"].as_u64().expect("record_bytes"),
            offset: v["offset"].as_u64().expect("offset"),
        });
    }
    records
}

/// What `quire wal verify` said.
#[derive(Clone, Debug)]
pub struct Verify {
    /// Its exit status: 0 clean, 1 corruption, 2 torn tail.
    pub exit_code: i32,
    /// Its JSON report.
    pub report: serde_json::Value,
    /// Its stderr.
    pub stderr: String,
}

/// Runs `quire wal verify WAL_DIR --format json` on a store's directory.
///
/// # Panics
/// If it does not finish within [`WAIT`] or prints no JSON.
#[must_use]
pub fn wal_verify(store_dir: &Path) -> Verify {
    let out = run_quire(&["wal", "verify", "--format", "json"], &wal_dir(store_dir));
    let stdout = String::from_utf8_lossy(&out.stdout);
    Verify {
        exit_code: out.status.code().unwrap_or(-1),
        report: serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("quire wal verify printed {stdout:?}: {e}")),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn run_quire(args: &[&str], dir: &Path) -> std::process::Output {
    let child = quire_command()
        .args(args)
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start quire");
    wait_output(child, &format!("quire {args:?}"))
}

/// Waits (at most [`WAIT`]) for `child` to exit and returns its output.
///
/// # Panics
/// If it does not exit in time (it is killed).
#[must_use]
pub fn wait_output(mut child: std::process::Child, what: &str) -> std::process::Output {
    let deadline = Instant::now() + WAIT;
    // Drain the pipes on threads so a chatty child never blocks on a full pipe.
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(p) = out_pipe.as_mut() {
            let _ = p.read_to_end(&mut v);
        }
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(p) = err_pipe.as_mut() {
            let _ = p.read_to_end(&mut v);
        }
        v
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// The store's tail (last durable entry, promised epoch, HWM heard), or `None` if it does
/// not answer.
#[must_use]
pub fn tail(addr: &str) -> Option<TailResponse> {
    let mut c = Client::connect_with(addr, Duration::from_secs(2)).ok()?;
    match c.request(TailRequest).ok()? {
        Body::TailResponse(t) => Some(t),
        _ => None,
    }
}

/// SIGTERMs the running store and waits (at most [`WAIT`]) for it to exit; returns
/// whether it exited with status 0. The store is stopped afterwards either way.
///
/// # Panics
/// If the store does not run or does not exit in time.
pub fn terminate(store: &mut StoreNode) -> bool {
    let mut p = store.proc.take().expect("the store runs");
    let success = p.terminate(WAIT);
    success.unwrap_or_else(|| panic!("{} did not exit within {WAIT:?} of SIGTERM", p.name))
}

/// Polls `check` every 20 ms until it returns `Some`, at most `bound`.
///
/// # Panics
/// With `what` when the bound passes.
pub fn wait_until<T>(what: &str, bound: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {bound:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The master's high-water mark (`quire_hwm` on its metrics), once a master serves.
///
/// # Panics
/// If no master is elected within [`WAIT`].
#[must_use]
pub fn master_hwm(cluster: &Cluster) -> Option<u64> {
    let id = cluster.wait_for_master();
    let master = cluster.brokers.iter().find(|b| b.id == id)?;
    let text = master.scrape();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a whole offset
    crate::http::metric(&text, "quire_hwm")
        .filter(|v| *v >= 0.0)
        .map(|v| v as u64)
}

/// Waits (at most `bound`) until the master's HWM is above `offset`, and returns it: the
/// cluster made progress past `offset`.
///
/// # Panics
/// If it does not within `bound`.
pub fn wait_hwm_above(cluster: &Cluster, offset: Option<u64>, bound: Duration) -> u64 {
    wait_until(
        &format!("the master's HWM passes {offset:?}"),
        bound,
        || master_hwm(cluster).filter(|h| offset.is_none_or(|o| *h > o)),
    )
}

/// Waits (at most `bound`) until the store at `addr` holds a durable entry at or above
/// `offset` (it caught up), and returns its last offset.
///
/// # Panics
/// If it does not within `bound`.
pub fn wait_store_through(addr: &str, offset: u64, bound: Duration) -> u64 {
    wait_until(
        &format!("store {addr} holds offset {offset}"),
        bound,
        || {
            tail(addr)
                .and_then(|t| t.last)
                .map(|l| l.offset.0)
                .filter(|o| *o >= offset)
        },
    )
}

/// The highest offset acknowledged to any of `outcomes`.
#[must_use]
pub fn max_acked(outcomes: &[ProducerOutcome]) -> Option<u64> {
    outcomes
        .iter()
        .filter_map(|o| o.acked.values().next_back())
        .map(|o| o.0)
        .max()
}

/// Messages acknowledged to `outcomes`.
#[must_use]
pub fn acked_count(outcomes: &[ProducerOutcome]) -> usize {
    outcomes.iter().map(|o| o.acked.len()).sum()
}

/// Reads topic `topic` from the master, from offset 0 through `last` (bounded by
/// [`WAIT`]), as `(offset, payload)` pairs.
///
/// # Panics
/// If the master does not answer, or the topic does not reach `last` in time.
#[must_use]
pub fn fetch_through(cluster: &Cluster, topic: &str, last: u64) -> Vec<(Offset, Bytes)> {
    let id = cluster.wait_for_master();
    let addr = &cluster.broker_node(id).addr;
    let mut c = Client::connect(addr).expect("connect to the master");
    let mut out = Vec::new();
    let mut next = Offset(0);
    let deadline = Instant::now() + WAIT;
    while next.0 <= last {
        assert!(
            Instant::now() < deadline,
            "topic {topic} read up to {next:?}, not past {last} within {WAIT:?}"
        );
        match c.request(FetchRequest {
            records: false,
            topic: topic.into(),
            from_offset: next,
            max_messages: 1000,
            max_bytes: 1 << 20,
            wait_ms: 200,
        }) {
            Ok(Body::FetchResponse(r)) => {
                assert!(r.next_offset >= next, "next_offset never goes back");
                next = r.next_offset;
                out.extend(r.messages);
            }
            Ok(other) => panic!("fetch answered {other:?}"),
            Err(e) => panic!("fetch failed: {e}"),
        }
    }
    out
}

/// The check every disk-fault test ends with: reads the whole topic `t` from the master
/// (through the highest offset acknowledged to `rounds`' producers) and judges the run with
/// the one checker, [`Cluster::check`] (the simulation's rules over the cluster's recorded
/// history, every running store's log and these reads). Returns the messages acknowledged
/// to `rounds`' producers.
///
/// # Panics
/// On any violation (a lost, moved or duplicated acknowledged message, a message never
/// sent, two events at one offset, a quorum of stores missing the stabilized log, ...).
pub fn check_no_acked_loss(cluster: &Cluster, rounds: &[(u64, Vec<ProducerOutcome>)]) -> usize {
    let last = rounds.iter().filter_map(|(_, o)| max_acked(o)).max();
    let fetched = match last {
        Some(last) => fetch_through(cluster, "t", last),
        None => Vec::new(),
    };
    let report = cluster.check(&vec![("t".to_owned(), fetched)]);
    eprintln!("{report}");
    report.assert_clean();
    rounds.iter().map(|(_, o)| acked_count(o)).sum()
}

/// Counts the lines of `log` that contain `needle`.
#[must_use]
pub fn log_count(log: &Path, needle: &str) -> usize {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

/// A small deterministic generator (xorshift64*) for fault positions: a test prints its
/// seed so a failing run can be replayed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// From `QUIRE_TEST_SEED` if set, else from the clock; prints the seed.
    #[must_use]
    pub fn from_env_or_clock(test: &str) -> Rng {
        let seed = std::env::var("QUIRE_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("{test}: seed {seed} (replay with QUIRE_TEST_SEED={seed})");
        Rng(seed | 1)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "an empty range");
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}
