//! [`CrashDisk`]: an in-memory file system that knows, per file, what was written and what
//! is durable, and loses on [`CrashDisk::crash`] exactly what a real machine may lose.
//!
//! The model follows the file-system behaviours ALICE (Pillai et al., "All File Systems
//! Are Not Created Equal", OSDI'14) found applications relying on wrongly:
//!
//! - **Data.** Every write is recorded per 512-byte sector ([`SECTOR_BYTES`]) with the
//!   sector's new contents. An fsync/fdatasync of the file makes its current contents and
//!   size durable. At a crash each file keeps its durable contents and, of the sectors
//!   written since its last sync, a random choice: in [`CrashMode::Subset`] any subset
//!   (torn writes, later writes persisted before earlier ones), in [`CrashMode::Prefix`]
//!   what a device that persists writes in the order they came keeps: every sector written
//!   before the last sync of *any* file (a sync is a cache flush, which persists all the
//!   device received), then a prefix, in write order across all files, of the rest. A
//!   sector is never torn inside itself (the atomic unit of a disk).
//! - **Size.** A file whose size changed since its last sync (a write past its end,
//!   `fallocate`, `set_len`, a truncating create) keeps its old or its new size at random:
//!   the new size can persist without the data that filled it (zeros then), as on ext4.
//! - **Names.** Creations, renames and removals of directory entries are kept per
//!   directory in order; an fsync of the directory makes them durable. At a crash each
//!   directory keeps a random prefix of its un-synced changes: a new file, a rename or a
//!   removal not made durable by a directory fsync can be lost (and a lost creation loses
//!   the file whatever was synced into it). Directories themselves are always durable.
//!
//! It also injects read faults: a flipped bit returned by every read of a byte
//! ([`CrashDisk::inject_bit_flip`]), a latent sector error (EIO for reads touching the
//! sector until it is written again, [`CrashDisk::inject_sector_error`]), EIO for every
//! read ([`CrashDisk::fail_reads`]), and EIO/ENOSPC for writes and syncs.
//!
//! To crash in the middle of a workload, [`CrashDisk::crash_after`] lets `k` more
//! mutating operations (writes, syncs, allocations, creations, renames, removals) succeed
//! and fails every operation after them with EIO, as a machine that lost power would never
//! complete them; [`CrashDisk::crash`] then computes the post-crash state.
//!
//! Deterministic: every choice comes from a SplitMix64 generator seeded by the caller
//! (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA'14). No
//! clock, no OS file. What is not modelled: directories that vanish, hard links, sparse
//! holes as distinct from zeros, and data written through one name after a rename of
//! another (the WAL does neither).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::{OpenMode, Storage, StorageFile};
use crate::disk::{DirectIo, DirectIoAlignment, Disk, SyncDisk};
use crate::{IoBackend, WalError};

/// The atomic unit of a crash: a sector is persisted whole or not at all, in bytes.
pub const SECTOR_BYTES: u64 = 512;

/// Which of the un-synced sectors a crash may keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CrashMode {
    /// Any subset: torn writes, and later writes persisted without earlier ones.
    #[default]
    Subset,
    /// A device that persists writes in the order they came, across files: every write
    /// before the last flush (any file's sync), then a prefix in write order of the rest.
    Prefix,
    /// Nothing un-synced: every un-synced sector write, size change and directory change is
    /// lost (a device that loses its whole write cache). Never tears a write.
    Durable,
}

/// What one [`CrashDisk::crash`] kept and lost, for test output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Un-synced sector writes that survived.
    pub sectors_kept: u64,
    /// Un-synced sector writes that were lost.
    pub sectors_lost: u64,
    /// Files whose un-synced new size survived.
    pub sizes_kept: u64,
    /// Files whose un-synced new size was lost.
    pub sizes_lost: u64,
    /// Un-synced directory changes that survived.
    pub dir_changes_kept: u64,
    /// Un-synced directory changes that were lost.
    pub dir_changes_lost: u64,
}

/// The in-memory crash-tracking file system. A cheap handle: clones share one disk. See
/// the module docs.
#[derive(Clone)]
pub struct CrashDisk {
    state: Arc<Mutex<State>>,
    /// Signalled when a write starts waiting at a hold, and when the hold is released.
    held_cv: Arc<Condvar>,
}

impl fmt::Debug for CrashDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.st();
        f.debug_struct("CrashDisk")
            .field("files", &st.entries.len())
            .field("ops", &st.ops)
            .field("generation", &st.generation)
            .finish()
    }
}

#[derive(Clone, Debug)]
enum DirChange {
    Create {
        path: PathBuf,
        ino: u64,
    },
    Remove {
        path: PathBuf,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
        ino: u64,
    },
}

#[derive(Clone, Debug, Default)]
struct Inode {
    /// What reads see.
    data: Vec<u8>,
    /// What survives any crash.
    durable: Vec<u8>,
    /// Sectors written since the last sync, in write order: the disk-wide write sequence
    /// number, the sector, and its contents then.
    pending: Vec<(u64, u64, Vec<u8>)>,
    /// Byte positions whose reads return a bit flipped: `(position, xor mask)`.
    flips: Vec<(u64, u8)>,
    /// Sectors whose reads fail with EIO until written again.
    bad_sectors: BTreeSet<u64>,
}

#[derive(Clone, Debug)]
struct State {
    rng: u64,
    /// The generator [`Storage::random_u64`] draws from: apart from `rng`, so that segment
    /// tags do not move the crashes a seed gives.
    tag_rng: u64,
    mode: CrashMode,
    align_bytes: u64,
    /// Bumped by every crash: handles from before it are dead.
    generation: u64,
    next_ino: u64,
    inodes: BTreeMap<u64, Inode>,
    /// The namespace as running code sees it.
    entries: BTreeMap<PathBuf, u64>,
    /// The namespace a crash falls back to, before the un-synced changes.
    durable_entries: BTreeMap<PathBuf, u64>,
    /// Un-synced changes, per directory, in order.
    dir_log: BTreeMap<PathBuf, Vec<DirChange>>,
    dirs: BTreeSet<PathBuf>,
    locks: BTreeSet<PathBuf>,
    /// Mutating operations done so far.
    ops: u64,
    /// Sector writes so far, disk-wide: the next pending sector's sequence number.
    sector_writes: u64,
    /// `sector_writes` at the last successful sync of any file or directory: a device that
    /// keeps write order persisted every sector numbered below it ([`CrashMode::Prefix`]).
    flushed_below: u64,
    /// Mutating operations after which the machine is gone.
    ops_limit: Option<u64>,
    /// One line per mutating operation, for test output.
    trace: Vec<String>,
    read_errors: bool,
    write_error: Option<i32>,
    sync_error: Option<i32>,
    /// Writes wait before they start (see [`CrashDisk::hold_writes`]).
    hold: bool,
    /// A write is waiting at the hold.
    held: bool,
}

impl State {
    /// SplitMix64.
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    /// A value in `0..=n`.
    fn upto(&mut self, n: u64) -> u64 {
        self.next_u64() % (n + 1)
    }

    fn is_dead(&self) -> bool {
        self.ops_limit.is_some_and(|l| self.ops >= l)
    }

    /// Starts a mutating operation: fails if the machine is gone, else counts it. The
    /// operation that uses up a [`CrashDisk::crash_after`] budget wakes whoever waits in
    /// [`CrashDisk::wait_for_held_write`].
    fn begin(&mut self, cv: &Condvar, what: impl FnOnce() -> String) -> io::Result<()> {
        if self.is_dead() {
            return Err(dead());
        }
        self.ops += 1;
        self.trace.push(what());
        if self.is_dead() {
            cv.notify_all();
        }
        Ok(())
    }

    fn inode(&mut self, ino: u64) -> io::Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or_else(stale)
    }

    fn lookup(&self, path: &Path) -> io::Result<u64> {
        self.entries
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn parent_exists(&self, path: &Path) -> io::Result<PathBuf> {
        let parent = path.parent().unwrap_or(Path::new("")).to_path_buf();
        if self.dirs.contains(&parent) {
            Ok(parent)
        } else {
            Err(io::Error::from(io::ErrorKind::NotFound))
        }
    }

    fn log(&mut self, dir: PathBuf, change: DirChange) {
        self.dir_log.entry(dir).or_default().push(change);
    }
}

fn apply(entries: &mut BTreeMap<PathBuf, u64>, change: &DirChange) {
    match change {
        DirChange::Create { path, ino } => {
            entries.insert(path.clone(), *ino);
        }
        DirChange::Remove { path } => {
            entries.remove(path);
        }
        DirChange::Rename { from, to, ino } => {
            entries.remove(from);
            entries.insert(to.clone(), *ino);
        }
    }
}

/// The error of every operation after a [`CrashDisk::crash_after`] budget ran out.
fn dead() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// The error of an operation on a handle opened before the last crash.
fn stale() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

fn sectors(position: u64, len: u64) -> std::ops::Range<u64> {
    if len == 0 {
        return 0..0;
    }
    position / SECTOR_BYTES..(position + len).div_ceil(SECTOR_BYTES)
}

fn to_usize(v: u64) -> io::Result<usize> {
    usize::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))
}

impl CrashDisk {
    /// An empty disk (only the root directory `/` and the relative root `""` exist) whose
    /// crashes draw from `seed`, in [`CrashMode::Subset`].
    #[must_use]
    pub fn new(seed: u64) -> CrashDisk {
        let mut dirs = BTreeSet::new();
        dirs.insert(PathBuf::from("/"));
        dirs.insert(PathBuf::new());
        CrashDisk {
            state: Arc::new(Mutex::new(State {
                rng: seed,
                tag_rng: seed ^ 0x5147_5441_4753_0000,
                mode: CrashMode::Subset,
                align_bytes: SECTOR_BYTES,
                generation: 0,
                next_ino: 1,
                inodes: BTreeMap::new(),
                entries: BTreeMap::new(),
                durable_entries: BTreeMap::new(),
                dir_log: BTreeMap::new(),
                dirs,
                locks: BTreeSet::new(),
                ops: 0,
                sector_writes: 0,
                flushed_below: 0,
                ops_limit: None,
                trace: Vec::new(),
                read_errors: false,
                write_error: None,
                sync_error: None,
                hold: false,
                held: false,
            })),
            held_cv: Arc::new(Condvar::new()),
        }
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new, independent disk with a copy of this one's whole state (files, what is
    /// durable, pending changes, faults, the generator). Handles and locks stay with the
    /// original. For exploring several futures of one crashed disk.
    #[must_use]
    pub fn fork(&self) -> CrashDisk {
        let mut st = self.st().clone();
        st.locks.clear();
        st.generation += 1;
        st.hold = false;
        st.held = false;
        CrashDisk {
            state: Arc::new(Mutex::new(st)),
            held_cv: Arc::new(Condvar::new()),
        }
    }

    /// From now on, the next file write waits before it starts (before it counts as an
    /// operation) until [`CrashDisk::release_writes`]; a dead machine's writes do not wait.
    /// With [`CrashDisk::wait_for_held_write`] a test makes a background writer (the WAL's
    /// commit thread) stop at a known point, so that what it does next follows from the
    /// test's order and not from timing: appends queued meanwhile form one batch.
    pub fn hold_writes(&self) {
        self.st().hold = true;
    }

    /// Waits until a write waits at the hold, or the machine is dead, for at most `bound`.
    /// Returns whether one of them happened.
    #[must_use]
    pub fn wait_for_held_write(&self, bound: Duration) -> bool {
        let st = self.st();
        let (st, _) = self
            .held_cv
            .wait_timeout_while(st, bound, |st| !st.held && !st.is_dead())
            .unwrap_or_else(PoisonError::into_inner);
        st.held || st.is_dead()
    }

    /// Lets held and later writes go.
    pub fn release_writes(&self) {
        let mut st = self.st();
        st.hold = false;
        st.held = false;
        self.held_cv.notify_all();
    }

    /// Reseeds the generator the next crash draws from.
    pub fn reseed(&self, seed: u64) {
        self.st().rng = seed;
    }

    /// Sets which un-synced sectors a crash may keep (default [`CrashMode::Subset`]).
    pub fn set_mode(&self, mode: CrashMode) {
        self.st().mode = mode;
    }

    /// Lets `k` more mutating operations succeed; every operation after them fails with an
    /// EIO-like error until [`CrashDisk::crash`]. `k = 0` stops the machine now.
    pub fn crash_after(&self, k: u64) {
        let mut st = self.st();
        st.ops_limit = Some(st.ops + k);
        self.held_cv.notify_all();
    }

    /// Whether a [`CrashDisk::crash_after`] budget has run out.
    #[must_use]
    pub fn is_dead(&self) -> bool {
        self.st().is_dead()
    }

    /// Mutating operations done since the disk was made.
    #[must_use]
    pub fn ops(&self) -> u64 {
        self.st().ops
    }

    /// One line per mutating operation done so far (`"write a.log @4096 +8192"`, ...).
    #[must_use]
    pub fn trace(&self) -> Vec<String> {
        self.st().trace.clone()
    }

    /// The machine loses power: computes what survives (module docs) and makes it the
    /// disk's whole state, durable. Handles and locks from before are dead (their
    /// operations fail with EIO). Faults injected on surviving files stay.
    pub fn crash(&self) -> CrashReport {
        let mut st = self.st();
        let mut report = CrashReport::default();
        // Names: a random prefix of each directory's un-synced changes.
        let logs = std::mem::take(&mut st.dir_log);
        let mut entries = std::mem::take(&mut st.durable_entries);
        let mode = st.mode;
        for (_, changes) in logs {
            let n = changes.len() as u64;
            let keep = if mode == CrashMode::Durable {
                0
            } else {
                st.upto(n)
            };
            for c in &changes[..to_usize(keep).unwrap_or(changes.len())] {
                apply(&mut entries, c);
            }
            report.dir_changes_kept += keep;
            report.dir_changes_lost += n - keep;
        }
        let live: BTreeSet<u64> = entries.values().copied().collect();
        let mut inodes = std::mem::take(&mut st.inodes);
        inodes.retain(|ino, _| live.contains(ino));
        // In write order across files: what a flush persisted, then a prefix of the rest.
        let flushed_below = st.flushed_below;
        let mut unflushed: Vec<u64> = inodes
            .values()
            .flat_map(|i| i.pending.iter().map(|p| p.0))
            .filter(|&seq| seq >= flushed_below)
            .collect();
        unflushed.sort_unstable();
        let kept = st.upto(unflushed.len() as u64);
        let keep_below = usize::try_from(kept)
            .ok()
            .and_then(|k| unflushed.get(k).copied())
            .unwrap_or(u64::MAX);
        for inode in inodes.values_mut() {
            let cur_len = inode.data.len();
            let dur_len = inode.durable.len();
            let mut img = std::mem::take(&mut inode.durable);
            let pending = std::mem::take(&mut inode.pending);
            for (seq, sector, bytes) in pending {
                let keep = match mode {
                    CrashMode::Subset => st.coin(),
                    CrashMode::Prefix => seq < flushed_below || seq < keep_below,
                    CrashMode::Durable => false,
                };
                if !keep {
                    report.sectors_lost += 1;
                    continue;
                }
                report.sectors_kept += 1;
                let at = usize::try_from(sector * SECTOR_BYTES).expect("invariant: in memory");
                if img.len() < at + bytes.len() {
                    img.resize(at + bytes.len(), 0);
                }
                img[at..at + bytes.len()].copy_from_slice(&bytes);
            }
            let len = if cur_len == dur_len {
                cur_len
            } else if mode != CrashMode::Durable && st.coin() {
                report.sizes_kept += 1;
                cur_len
            } else {
                report.sizes_lost += 1;
                dur_len
            };
            img.resize(len, 0);
            inode.data = img.clone();
            inode.durable = img;
        }
        st.inodes = inodes;
        st.entries = entries.clone();
        st.durable_entries = entries;
        st.generation += 1;
        st.locks.clear();
        st.ops_limit = None;
        report
    }

    /// Every read of byte `position` of `path` returns it with bit `bit` (0..8) flipped,
    /// until [`CrashDisk::clear_read_faults`]. The stored bytes do not change.
    ///
    /// # Errors
    /// `NotFound` if there is no such file.
    pub fn inject_bit_flip(&self, path: &Path, position: u64, bit: u8) -> io::Result<()> {
        let mut st = self.st();
        let ino = st.lookup(path)?;
        st.inode(ino)?.flips.push((position, 1u8 << (bit % 8)));
        Ok(())
    }

    /// Reads touching sector `position / SECTOR_BYTES` of `path` fail with EIO (a latent
    /// sector error) until the sector is written again.
    ///
    /// # Errors
    /// `NotFound` if there is no such file.
    pub fn inject_sector_error(&self, path: &Path, position: u64) -> io::Result<()> {
        let mut st = self.st();
        let ino = st.lookup(path)?;
        st.inode(ino)?.bad_sectors.insert(position / SECTOR_BYTES);
        Ok(())
    }

    /// Removes every injected bit flip and sector error.
    pub fn clear_read_faults(&self) {
        let mut st = self.st();
        for inode in st.inodes.values_mut() {
            inode.flips.clear();
            inode.bad_sectors.clear();
        }
    }

    /// Whether every read fails with EIO.
    pub fn fail_reads(&self, on: bool) {
        self.st().read_errors = on;
    }

    /// Makes every write (and allocation) fail with `errno` (`libc::EIO`, `libc::ENOSPC`),
    /// or stops doing so (`None`).
    pub fn fail_writes(&self, errno: Option<i32>) {
        self.st().write_error = errno;
    }

    /// Makes every file and directory sync fail with `errno`, or stops doing so (`None`).
    pub fn fail_syncs(&self, errno: Option<i32>) {
        self.st().sync_error = errno;
    }

    /// Sets the direct-I/O alignment [`Storage::alignment`] reports (default
    /// [`SECTOR_BYTES`]; the WAL never goes below a page).
    pub fn set_alignment(&self, bytes: u64) {
        self.st().align_bytes = bytes;
    }

    /// The bytes of `path` as a read sees them now (no faults applied), or `None`.
    #[must_use]
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.st();
        let ino = st.entries.get(path)?;
        st.inodes.get(ino).map(|i| i.data.clone())
    }

    /// Whether `path` names a file now.
    #[must_use]
    pub fn exists(&self, path: &Path) -> bool {
        self.st().entries.contains_key(path)
    }

    /// Overwrites bytes of `path` in place, durably, without counting an operation: a test
    /// planting damage on the medium.
    ///
    /// # Errors
    /// `NotFound` if there is no such file.
    pub fn poke(&self, path: &Path, position: u64, bytes: &[u8]) -> io::Result<()> {
        let mut st = self.st();
        let ino = st.lookup(path)?;
        let inode = st.inode(ino)?;
        let at = to_usize(position)?;
        for v in [&mut inode.data, &mut inode.durable] {
            if v.len() < at + bytes.len() {
                v.resize(at + bytes.len(), 0);
            }
            v[at..at + bytes.len()].copy_from_slice(bytes);
        }
        Ok(())
    }
}

/// A file of a [`CrashDisk`].
#[derive(Debug)]
pub struct CrashFile {
    disk: CrashDisk,
    /// [`DIR_INO`] for a directory handle ([`Storage::open_dir`]).
    ino: u64,
    generation: u64,
    name: PathBuf,
}

/// The inode number of every directory handle: no [`Inode`] has it, so data operations on
/// such a handle fail, and its `fsync` is the directory's.
const DIR_INO: u64 = u64::MAX;

impl CrashFile {
    fn state(&self) -> io::Result<MutexGuard<'_, State>> {
        let st = self.disk.st();
        if st.generation != self.generation {
            return Err(stale());
        }
        Ok(st)
    }

    fn size_change(&self, what: &str, len: u64) -> io::Result<()> {
        let mut st = self.state()?;
        st.begin(&self.disk.held_cv, || {
            format!("{what} {} to {len}", self.name.display())
        })?;
        if let Some(errno) = st.write_error {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let len = to_usize(len)?;
        let inode = st.inode(self.ino)?;
        let grow_only = what == "fallocate";
        if !grow_only || inode.data.len() < len {
            inode.data.resize(len, 0);
        }
        Ok(())
    }

    fn sync(&self, what: &str) -> io::Result<()> {
        if self.ino == DIR_INO {
            if self.state()?.is_dead() {
                return Err(dead());
            }
            return self.disk.sync_dir(&self.name);
        }
        let mut st = self.state()?;
        st.begin(&self.disk.held_cv, || {
            format!("{what} {}", self.name.display())
        })?;
        if let Some(errno) = st.sync_error {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let flushed_below = st.sector_writes;
        let inode = st.inode(self.ino)?;
        inode.durable = inode.data.clone();
        inode.pending.clear();
        st.flushed_below = flushed_below;
        Ok(())
    }
}

impl StorageFile for CrashFile {
    fn read_at(&self, buf: &mut [u8], position: u64) -> io::Result<usize> {
        let mut st = self.state()?;
        if st.is_dead() || st.read_errors {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let inode = st.inode(self.ino)?;
        let len = inode.data.len() as u64;
        if position >= len {
            return Ok(0);
        }
        let n = (len - position).min(buf.len() as u64);
        if sectors(position, n).any(|s| inode.bad_sectors.contains(&s)) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let at = to_usize(position)?;
        let n = to_usize(n)?;
        buf[..n].copy_from_slice(&inode.data[at..at + n]);
        for &(p, mask) in &inode.flips {
            if p >= position && p < position + n as u64 {
                buf[to_usize(p - position)?] ^= mask;
            }
        }
        Ok(n)
    }

    fn write_at(&self, buf: &[u8], position: u64) -> io::Result<usize> {
        let mut st = self.state()?;
        while st.hold && !st.is_dead() {
            st.held = true;
            self.disk.held_cv.notify_all();
            st = self
                .disk
                .held_cv
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
        st.begin(&self.disk.held_cv, || {
            format!("write {} @{position} +{}", self.name.display(), buf.len())
        })?;
        if let Some(errno) = st.write_error {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let first_seq = st.sector_writes;
        st.sector_writes += sectors(position, buf.len() as u64).count() as u64;
        let inode = st.inode(self.ino)?;
        let at = to_usize(position)?;
        if inode.data.len() < at + buf.len() {
            inode.data.resize(at + buf.len(), 0);
        }
        inode.data[at..at + buf.len()].copy_from_slice(buf);
        for (seq, s) in (first_seq..).zip(sectors(position, buf.len() as u64)) {
            inode.bad_sectors.remove(&s);
            let from = to_usize(s * SECTOR_BYTES)?;
            let to = (from + SECTOR_BYTES as usize).min(inode.data.len());
            let snapshot = inode.data[from..to].to_vec();
            inode.pending.push((seq, s, snapshot));
        }
        Ok(buf.len())
    }

    fn allocate(&self, bytes: u64) -> io::Result<()> {
        self.size_change("fallocate", bytes)
    }

    fn set_len(&self, bytes: u64) -> io::Result<()> {
        self.size_change("set_len", bytes)
    }

    fn size(&self) -> io::Result<u64> {
        let mut st = self.state()?;
        Ok(st.inode(self.ino)?.data.len() as u64)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync("fdatasync")
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync("fsync")
    }

    /// Always [`DirectIo::Off`]: a simulated file has no page cache to bypass, and the
    /// preallocator's buffered zero-fill path has no pacing timer.
    fn direct_io(&self) -> DirectIo {
        DirectIo::Off
    }
}

/// A lock held on a [`CrashDisk`] file; released when dropped (or by a crash).
#[derive(Debug)]
pub struct CrashLock {
    disk: CrashDisk,
    path: PathBuf,
    generation: u64,
}

impl Drop for CrashLock {
    fn drop(&mut self) {
        let mut st = self.disk.st();
        if st.generation == self.generation {
            st.locks.remove(&self.path);
        }
    }
}

impl Storage for CrashDisk {
    type File = CrashFile;
    type Lock = CrashLock;

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<CrashFile> {
        let mut st = self.st();
        let ino = match mode {
            OpenMode::Read | OpenMode::ReadRandom | OpenMode::Write | OpenMode::WriteDirect => {
                if st.is_dead() {
                    return Err(dead());
                }
                st.lookup(path)?
            }
            OpenMode::Create | OpenMode::CreateDirect | OpenMode::CreateKeep => {
                let parent = st.parent_exists(path)?;
                let existing = st.entries.get(path).copied();
                let truncate = mode != OpenMode::CreateKeep;
                if let (Some(ino), false) = (existing, truncate) {
                    ino
                } else {
                    st.begin(&self.held_cv, || format!("create {}", path.display()))?;
                    if let Some(ino) = existing {
                        st.inode(ino)?.data.clear();
                        ino
                    } else {
                        let ino = st.next_ino;
                        st.next_ino += 1;
                        st.inodes.insert(ino, Inode::default());
                        st.entries.insert(path.to_path_buf(), ino);
                        st.log(
                            parent,
                            DirChange::Create {
                                path: path.to_path_buf(),
                                ino,
                            },
                        );
                        ino
                    }
                }
            }
        };
        Ok(CrashFile {
            disk: self.clone(),
            ino,
            generation: st.generation,
            name: path.to_path_buf(),
        })
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        let mut st = self.st();
        let ino = st.lookup(path)?;
        Ok(st.inode(ino)?.data.len() as u64)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.st();
        let ino = st.lookup(from)?;
        let parent = st.parent_exists(to)?;
        st.begin(&self.held_cv, || {
            format!("rename {} -> {}", from.display(), to.display())
        })?;
        st.entries.remove(from);
        st.entries.insert(to.to_path_buf(), ino);
        st.log(
            parent,
            DirChange::Rename {
                from: from.to_path_buf(),
                to: to.to_path_buf(),
                ino,
            },
        );
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.st();
        st.lookup(path)?;
        let parent = st.parent_exists(path)?;
        st.begin(&self.held_cv, || format!("remove {}", path.display()))?;
        st.entries.remove(path);
        st.log(
            parent,
            DirChange::Remove {
                path: path.to_path_buf(),
            },
        );
        Ok(())
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        let st = self.st();
        if st.is_dead() || st.read_errors {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if !st.dirs.contains(dir) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        let files = st
            .entries
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().map(ToOwned::to_owned));
        let subdirs = st
            .dirs
            .iter()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().map(ToOwned::to_owned));
        Ok(files.chain(subdirs).collect())
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.st();
        if st.dirs.contains(dir) {
            return Ok(());
        }
        st.begin(&self.held_cv, || format!("mkdir -p {}", dir.display()))?;
        for a in dir.ancestors() {
            st.dirs.insert(a.to_path_buf());
        }
        Ok(())
    }

    fn open_dir(&self, dir: &Path) -> io::Result<CrashFile> {
        let st = self.st();
        if st.is_dead() {
            return Err(dead());
        }
        if !st.dirs.contains(dir) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        Ok(CrashFile {
            disk: self.clone(),
            ino: DIR_INO,
            generation: st.generation,
            name: dir.to_path_buf(),
        })
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.st();
        if !st.dirs.contains(dir) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        st.begin(&self.held_cv, || format!("fsync dir {}", dir.display()))?;
        if let Some(errno) = st.sync_error {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let changes = st.dir_log.remove(dir).unwrap_or_default();
        for c in &changes {
            apply(&mut st.durable_entries, c);
        }
        // A journal commit flushes the device's cache as a file's sync does.
        st.flushed_below = st.sector_writes;
        Ok(())
    }

    fn lock(&self, path: &Path) -> io::Result<CrashLock> {
        // Creates the lock file like flock's open does.
        drop(self.open(path, OpenMode::CreateKeep)?);
        let mut st = self.st();
        if !st.locks.insert(path.to_path_buf()) {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        Ok(CrashLock {
            disk: self.clone(),
            path: path.to_path_buf(),
            generation: st.generation,
        })
    }

    fn alignment(&self, _dir: &Path) -> io::Result<DirectIoAlignment> {
        let bytes = self.st().align_bytes;
        Ok(DirectIoAlignment {
            bytes,
            statx_offset_bytes: Some(bytes),
            statx_memory_bytes: Some(bytes),
            physical_block_bytes: Some(bytes),
            fs_block_bytes: bytes,
        })
    }

    /// `false`: every operation runs on a thread the caller drives, so a seed and a crash
    /// step replay exactly.
    fn background_work(&self) -> bool {
        false
    }

    fn random_u64(&self) -> u64 {
        let mut st = self.st();
        let tag_rng = st.tag_rng;
        let saved = std::mem::replace(&mut st.rng, tag_rng);
        let v = st.next_u64();
        st.tag_rng = std::mem::replace(&mut st.rng, saved);
        v
    }

    fn open_disk(&self, _backend: IoBackend) -> Result<Box<dyn Disk<CrashFile>>, WalError> {
        Ok(Box::new(SyncDisk::<CrashFile>::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEEDS: u64 = 64;

    fn disk(seed: u64) -> CrashDisk {
        let d = CrashDisk::new(seed);
        d.create_dir_all(Path::new("/d")).unwrap();
        d
    }

    fn p(name: &str) -> PathBuf {
        Path::new("/d").join(name)
    }

    /// A durable file `/d/f` holding `bytes` (data, size and name synced).
    fn durable_file(d: &CrashDisk, bytes: &[u8]) -> CrashFile {
        let f = d.open(&p("f"), OpenMode::Create).unwrap();
        f.write_all_at(bytes, 0).unwrap();
        f.sync_all().unwrap();
        d.sync_dir(Path::new("/d")).unwrap();
        f
    }

    /// For each seed, runs `setup` on a fresh disk, crashes it, and returns what `/d/f`
    /// holds afterwards.
    fn outcomes(mode: CrashMode, setup: impl Fn(&CrashDisk)) -> Vec<Option<Vec<u8>>> {
        (0..SEEDS)
            .map(|seed| {
                let d = disk(seed);
                d.set_mode(mode);
                setup(&d);
                d.crash();
                d.contents(&p("f"))
            })
            .collect()
    }

    #[test]
    fn synced_data_survives_every_crash() {
        let got = outcomes(CrashMode::Subset, |d| {
            durable_file(d, &[7u8; 3000]);
        });
        assert!(got.iter().all(|c| c.as_deref() == Some(&[7u8; 3000][..])));
    }

    #[test]
    fn an_unsynced_write_is_torn_at_sector_granularity_and_reordered() {
        let got = outcomes(CrashMode::Subset, |d| {
            let f = durable_file(d, &[0u8; 4 * 512]);
            f.write_all_at(&[1u8; 4 * 512], 0).unwrap();
        });
        let mut torn = false;
        let mut reordered = false;
        for c in got {
            let c = c.expect("a durable file stays");
            assert_eq!(c.len(), 4 * 512);
            let kept: Vec<bool> = c.chunks(512).map(|s| s[0] == 1).collect();
            for s in c.chunks(512) {
                assert!(
                    s.iter().all(|&b| b == s[0]),
                    "a sector is never torn inside"
                );
            }
            torn |= kept.iter().any(|&k| k) && kept.iter().any(|&k| !k);
            reordered |= !kept[0] && kept[3];
        }
        assert!(torn, "some crash keeps part of the write");
        assert!(
            reordered,
            "some crash keeps a later sector without an earlier one"
        );
    }

    #[test]
    fn prefix_mode_keeps_sectors_in_write_order() {
        let got = outcomes(CrashMode::Prefix, |d| {
            let f = durable_file(d, &[0u8; 8 * 512]);
            f.write_all_at(&[1u8; 8 * 512], 0).unwrap();
        });
        let mut partial = false;
        for c in got {
            let kept: Vec<bool> = c.unwrap().chunks(512).map(|s| s[0] == 1).collect();
            let n = kept.iter().take_while(|&&k| k).count();
            assert!(kept[n..].iter().all(|&k| !k), "a prefix: {kept:?}");
            partial |= n > 0 && n < 8;
        }
        assert!(partial);
    }

    #[test]
    fn a_new_size_can_persist_without_its_data() {
        let got = outcomes(CrashMode::Subset, |d| {
            let f = durable_file(d, &[9u8; 512]);
            f.write_all_at(&[5u8; 2048], 512).unwrap();
        });
        let mut size_without_data = false;
        let mut old_size = false;
        for c in got {
            let c = c.unwrap();
            assert_eq!(&c[..512], &[9u8; 512][..], "durable bytes stay");
            assert!(c.len() == 512 || c.len() == 2560);
            old_size |= c.len() == 512;
            size_without_data |= c.len() == 2560 && c[512..].contains(&0);
        }
        assert!(size_without_data && old_size);
    }

    #[test]
    fn an_unsynced_creation_can_be_lost_even_if_the_file_was_synced() {
        let got = outcomes(CrashMode::Subset, |d| {
            let f = d.open(&p("f"), OpenMode::Create).unwrap();
            f.write_all_at(b"data", 0).unwrap();
            f.sync_all().unwrap();
        });
        assert!(got.iter().any(Option::is_none), "the entry can be lost");
        assert!(got.iter().any(|c| c.as_deref() == Some(&b"data"[..])));
        let synced = outcomes(CrashMode::Subset, |d| {
            durable_file(d, b"data");
        });
        assert!(synced.iter().all(|c| c.as_deref() == Some(&b"data"[..])));
    }

    #[test]
    fn an_unsynced_rename_or_removal_can_be_undone() {
        for seed in 0..SEEDS {
            let d = disk(seed);
            durable_file(&d, b"old");
            let t = d.open(&p("f.tmp"), OpenMode::Create).unwrap();
            t.write_all_at(b"new", 0).unwrap();
            t.sync_all().unwrap();
            d.sync_dir(Path::new("/d")).unwrap();
            d.rename(&p("f.tmp"), &p("f")).unwrap();
            d.crash();
            let f = d.contents(&p("f")).unwrap();
            let tmp = d.contents(&p("f.tmp"));
            // Atomic: either the rename happened or it did not.
            assert!(
                (f == b"new" && tmp.is_none()) || (f == b"old" && tmp.as_deref() == Some(b"new")),
                "seed {seed}: {f:?} {tmp:?}"
            );
        }
        let renamed: Vec<bool> = (0..SEEDS)
            .map(|seed| {
                let d = disk(seed);
                durable_file(&d, b"x");
                d.rename(&p("f"), &p("g")).unwrap();
                d.crash();
                d.exists(&p("g"))
            })
            .collect();
        assert!(renamed.contains(&true) && renamed.contains(&false));
        let removed = outcomes(CrashMode::Subset, |d| {
            durable_file(d, b"x");
            d.remove_file(&p("f")).unwrap();
        });
        assert!(removed.iter().any(Option::is_none) && removed.iter().any(Option::is_some));
        let removed_synced = outcomes(CrashMode::Subset, |d| {
            durable_file(d, b"x");
            d.remove_file(&p("f")).unwrap();
            d.sync_dir(Path::new("/d")).unwrap();
        });
        assert!(removed_synced.iter().all(Option::is_none));
    }

    #[test]
    fn read_faults_flip_bits_fail_sectors_and_fail_everything() {
        let d = disk(1);
        let f = durable_file(&d, &[0u8; 1024]);
        d.inject_bit_flip(&p("f"), 700, 3).unwrap();
        let mut b = [0u8; 1024];
        f.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(b[700], 8);
        assert_eq!(b.iter().filter(|&&x| x != 0).count(), 1);
        assert_eq!(
            d.contents(&p("f")).unwrap()[700],
            0,
            "the medium is unchanged"
        );
        d.clear_read_faults();
        d.inject_sector_error(&p("f"), 600).unwrap();
        let err = f.read_exact_at(&mut b[..10], 1000).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        f.read_exact_at(&mut b[..10], 0).unwrap();
        f.write_all_at(&[0u8; 512], 512).unwrap();
        f.read_exact_at(&mut b[..10], 1000).unwrap();
        d.fail_reads(true);
        assert_eq!(
            f.read_at(&mut b, 0).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        d.fail_reads(false);
        d.fail_writes(Some(libc::ENOSPC));
        let e = f.write_at(b"x", 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        d.fail_writes(None);
        d.fail_syncs(Some(libc::EIO));
        assert_eq!(f.sync_data().unwrap_err().raw_os_error(), Some(libc::EIO));
    }

    #[test]
    fn crash_after_stops_the_machine_and_a_crash_kills_old_handles_and_locks() {
        let d = disk(3);
        let f = durable_file(&d, b"abc");
        let lock = d.lock(&p("LOCK")).unwrap();
        assert_eq!(
            d.lock(&p("LOCK")).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        d.crash_after(1);
        f.write_all_at(b"x", 0).unwrap();
        assert!(d.is_dead());
        assert_eq!(f.sync_data().unwrap_err().raw_os_error(), Some(libc::EIO));
        assert!(d.rename(&p("f"), &p("g")).is_err());
        d.crash();
        assert!(!d.is_dead());
        assert!(f.size().is_err(), "a handle from before the crash is dead");
        let again = d.lock(&p("LOCK")).unwrap();
        drop(lock); // from before the crash: must not release the new holder's lock
        assert!(d.lock(&p("LOCK")).is_err());
        drop(again);
        let c = d.contents(&p("f")).unwrap();
        assert!(c == b"abc" || c == b"xbc");
    }

    #[test]
    fn a_held_write_waits_uncounted_until_released() {
        let d = disk(4);
        let f = Arc::new(durable_file(&d, b"abc"));
        let before = d.ops();
        d.hold_writes();
        let writer = {
            let f = f.clone();
            std::thread::spawn(move || f.write_all_at(b"x", 0))
        };
        assert!(d.wait_for_held_write(Duration::from_secs(60)));
        assert_eq!(d.ops(), before, "a held write has not started");
        d.release_writes();
        writer.join().unwrap().unwrap();
        assert_eq!(d.ops(), before + 1);
        assert_eq!(d.contents(&p("f")).unwrap(), b"xbc");
    }

    #[test]
    fn the_same_seed_gives_the_same_crash() {
        let run = |seed| {
            let d = disk(seed);
            let f = d.open(&p("f"), OpenMode::Create).unwrap();
            for i in 0..16u64 {
                f.write_all_at(&[i as u8 + 1; 512], i * 512).unwrap();
            }
            (d.crash(), d.contents(&p("f")))
        };
        for seed in 0..8 {
            assert_eq!(run(seed), run(seed));
        }
        assert!((0..8).any(|s| run(s) != run(s + 1)));
    }
}
