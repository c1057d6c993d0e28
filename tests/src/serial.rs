//! One multi-process test at a time, each with a hard time bound: what makes
//! `cargo test --workspace` safe on a 2-core machine.
//!
//! `cargo test` runs test binaries one after another, but the tests inside one binary in
//! parallel threads, and it has no per-test timeout. So every test that starts servers
//! (every test in a `proc_*.rs` file, and any test calling [`Proc::start`]) begins with
//!
//! ```no_run
//! let _t = quire_tests::proc_test();
//! ```
//!
//! which returns a [`ProcTest`] guard once
//!
//! - no other multi-process test runs in this process (a process-wide mutex), and
//! - none runs in another process of the same build (an `flock(2)` on
//!   `target/<profile>/quire-proc-tests.lock`), so it also holds when test binaries run
//!   concurrently (`cargo nextest`, two `cargo test` in one tree);
//!
//! and starts a watchdog. If the test is still running after its bound
//! ([`PROC_TEST_BOUND`], or the one given to [`proc_test_bounded`]), the watchdog says so
//! on stderr and SIGKILLs every child process the harness started in this process (see
//! [`register_child`]): the test's next request or wait fails, it panics, and its guards
//! (processes, temporary directories, mounts) clean up as on any failure. A test that
//! still ends normally after that fails anyway (the guard panics when dropped). One that
//! does not end within [`KILL_GRACE`] after the kill is stuck outside the harness's
//! waits: the watchdog removes the registered temporary directories and exits the test
//! binary with status 101, which fails the run.
//!
//! What it does not bound: tests that start no server (unit and property tests) take no
//! guard; the commands they run are bounded one by one ([`run_bounded`]).
//!
//! [`Proc::start`]: crate::Proc::start
//! [`run_bounded`]: crate::run_bounded

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long one multi-process test may run, from the moment it holds the lock.
/// The slowest tests take about 100 s alone on an idle 2-core machine, under 5 min loaded.
pub const PROC_TEST_BOUND: Duration = Duration::from_secs(600);
/// How long the watchdog waits, after killing a test's processes, for the test to end.
pub const KILL_GRACE: Duration = Duration::from_secs(30);
/// How long a test waits for another process's multi-process test to finish.
pub const LOCK_WAIT_MAX: Duration = Duration::from_secs(45 * 60);

/// Pids of running children started through the harness, killed when a test runs past
/// its bound.
static CHILDREN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
/// Temporary directories the harness created, removed if the watchdog exits the binary.
static DIRS: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
/// How many [`ProcTest`] guards are alive in this process (0 or 1).
static HELD: AtomicUsize = AtomicUsize::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records a child process the harness started, so a watchdog can kill it.
pub fn register_child(pid: u32) {
    lock(&CHILDREN).insert(pid);
}

/// Forgets a child: call it before reaping (or right after a `try_wait` reaped it).
pub fn forget_child(pid: u32) {
    lock(&CHILDREN).remove(&pid);
}

/// Records a temporary directory a test owns, removed if the watchdog exits the binary.
pub fn register_dir(dir: PathBuf) {
    lock(&DIRS).insert(dir);
}

/// Forgets a temporary directory (its owner removes it).
pub fn forget_dir(dir: &std::path::Path) {
    lock(&DIRS).remove(dir);
}

/// Whether a [`ProcTest`] guard is alive in this process.
pub fn held() -> bool {
    HELD.load(Ordering::SeqCst) > 0
}

/// What the guard and its watchdog share.
#[derive(Debug, Default)]
struct Shared {
    /// The test dropped its guard.
    done: bool,
    /// The watchdog killed the test's processes.
    fired: bool,
}

/// Held for the whole of one multi-process test: see the module docs.
#[derive(Debug)]
#[must_use = "the guard serialises and bounds the test only while it is alive"]
pub struct ProcTest {
    shared: Arc<(Mutex<Shared>, Condvar)>,
    bound: Duration,
    name: String,
    // Dropped after the watchdog is told: the file lock, then the process-wide one.
    _file: File,
    _local: MutexGuard<'static, ()>,
}

/// [`proc_test_bounded`] with [`PROC_TEST_BOUND`].
pub fn proc_test() -> ProcTest {
    proc_test_bounded(PROC_TEST_BOUND)
}

/// Waits until no other multi-process test runs (in this process or another of the same
/// build), then returns the guard whose watchdog fails the test after `bound`.
///
/// # Panics
/// If the lock file cannot be opened, or another process holds it for [`LOCK_WAIT_MAX`].
pub fn proc_test_bounded(bound: Duration) -> ProcTest {
    static LOCAL: Mutex<()> = Mutex::new(());
    let name = std::thread::current()
        .name()
        .unwrap_or("a multi-process test")
        .to_owned();
    let local = lock(&LOCAL);
    let path = crate::process::target_dir().join("quire-proc-tests.lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let deadline = Instant::now() + LOCK_WAIT_MAX;
    loop {
        // SAFETY: flock(2) on a descriptor this function owns; no memory is shared.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: another process held {} for {LOCK_WAIT_MAX:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    HELD.fetch_add(1, Ordering::SeqCst);
    let shared = Arc::new((Mutex::new(Shared::default()), Condvar::new()));
    let watched = Arc::clone(&shared);
    let who = name.clone();
    std::thread::Builder::new()
        .name(format!("watchdog {name}"))
        .spawn(move || watchdog(&watched, bound, &who))
        .expect("starting the watchdog thread");
    ProcTest {
        shared,
        bound,
        name,
        _file: file,
        _local: local,
    }
}

/// Waits until the test is done or `bound` passed; then kills, waits [`KILL_GRACE`], exits.
fn watchdog(shared: &(Mutex<Shared>, Condvar), bound: Duration, name: &str) {
    let (state, cv) = shared;
    let st = lock(state);
    let (mut st, _) = cv
        .wait_timeout_while(st, bound, |s| !s.done)
        .unwrap_or_else(PoisonError::into_inner);
    if st.done {
        return;
    }
    st.fired = true;
    drop(st);
    let pids: Vec<u32> = lock(&CHILDREN).iter().copied().collect();
    eprintln!(
        "{name}: still running after its bound of {bound:?}: killing its {} processes {pids:?}",
        pids.len()
    );
    for pid in pids {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // SAFETY: kill(2) has no memory effects. The pid is a child of this process
            // not yet reaped (owners forget a child before reaping it), so it names it.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let st = lock(state);
    let (st, _) = cv
        .wait_timeout_while(st, KILL_GRACE, |s| !s.done)
        .unwrap_or_else(PoisonError::into_inner);
    if st.done {
        return;
    }
    eprintln!(
        "{name}: did not end within {KILL_GRACE:?} after its processes were killed: \
         removing its temporary directories and exiting (status 101)"
    );
    for dir in lock(&DIRS).iter() {
        let _ = std::fs::remove_dir_all(dir);
    }
    std::process::exit(101);
}

impl Drop for ProcTest {
    fn drop(&mut self) {
        let (state, cv) = &*self.shared;
        let fired = {
            let mut st = lock(state);
            st.done = true;
            st.fired
        };
        cv.notify_all();
        HELD.fetch_sub(1, Ordering::SeqCst);
        if fired && !std::thread::panicking() {
            panic!(
                "{} ran past its bound of {:?} (its processes were killed)",
                self.name, self.bound
            );
        }
    }
}

/// Waits until `cond` holds, checking every 10 ms, for at most `bound`.
///
/// # Panics
/// If `cond` still does not hold after `bound`; the message says what was waited for.
pub fn wait_until(bound: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    loop {
        if cond() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "waited {bound:?} for {what}, in vain"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`wait_until`] for a value: polls `f` every 10 ms until it returns `Some`, for at most
/// `bound`.
///
/// # Panics
/// If `f` still returns `None` after `bound`; the message says what was waited for.
pub fn wait_for<T>(bound: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "waited {bound:?} for {what}, in vain"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_until_returns_once_the_condition_holds() {
        let start = Instant::now();
        let mut n = 0;
        wait_until(Duration::from_secs(5), "three polls", || {
            n += 1;
            n == 3
        });
        assert_eq!(n, 3);
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn wait_until_fails_naming_what_it_waited_for() {
        let r = std::panic::catch_unwind(|| {
            wait_until(
                Duration::from_millis(50),
                "a condition that never holds",
                || false,
            );
        });
        let msg = r.expect_err("must panic");
        let msg = msg
            .downcast_ref::<String>()
            .expect("a formatted panic message");
        assert!(msg.contains("a condition that never holds"), "{msg}");
    }

    #[test]
    fn a_test_past_its_bound_has_its_children_killed_and_fails() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("starting sleep");
        let r = std::panic::catch_unwind(|| {
            let _t = proc_test_bounded(Duration::from_millis(300));
            register_child(child.id());
            // The test "hangs" on its child: the watchdog kills it after 300 ms.
            let started = Instant::now();
            wait_until(Duration::from_secs(20), "the child to be killed", || {
                matches!(std::fs::read_to_string(format!("/proc/{}/stat", child.id())),
                         Ok(s) if s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')))
            });
            assert!(started.elapsed() >= Duration::from_millis(300));
            forget_child(child.id());
        });
        let status = child.wait().expect("reaping sleep");
        assert!(!status.success(), "sleep was killed: {status:?}");
        let msg = r.expect_err("a test past its bound fails");
        let msg = msg.downcast_ref::<String>().expect("a formatted message");
        assert!(msg.contains("ran past its bound"), "{msg}");
    }
}
