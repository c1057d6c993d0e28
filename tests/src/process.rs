//! Child processes of a test: where the binaries are, starting one and reading the address
//! it prints, SIGKILL on drop (also when the test panics), signals, free ports.
//!
//! Where the binaries come from: `target/<profile>/` next to the test executable's
//! `deps/` directory. `cargo test --workspace` and `cargo nextest run --workspace` build
//! them there (every package with integration tests gets its binaries built). A test run
//! of one package alone (`cargo test -p quire-tests`) may not have built them: then
//! [`binary`] runs `cargo build -p PACKAGE --bin NAME` (same profile and target directory)
//! once, if the file is missing. It does not rebuild a stale binary (a rebuild from inside
//! a running suite could race the tests that run it); it warns on stderr when the binary
//! is much older than the test executable. After changing a server, build the workspace
//! (or that package) before running one package's tests.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::WAIT;

/// `target/<profile>`: the directory of the running test executable's `deps/`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    // target/<profile>/deps/<test> -> target/<profile>
    exe.parent()
        .and_then(Path::parent)
        .expect("the test executable lives in target/<profile>/deps")
        .to_path_buf()
}

/// The binary `name` of workspace package `package` in `target/<profile>/`, built once if
/// missing (see the module docs).
///
/// # Panics
/// If the binary is missing and building it failed.
pub fn binary(package: &str, name: &str) -> PathBuf {
    binary_with_features(package, name, &[])
}

/// [`binary`], built (if missing) with the package's cargo `features`.
///
/// # Panics
/// If the binary is missing and building it failed.
pub fn binary_with_features(package: &str, name: &str, features: &[&str]) -> PathBuf {
    // One build at a time: two tests asking for the same binary must not race cargo.
    static BUILD: Mutex<()> = Mutex::new(());
    let dir = target_dir();
    let bin = dir.join(name);
    if bin.exists() {
        warn_if_stale(&bin);
        return bin;
    }
    let _guard = BUILD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if bin.exists() {
        return bin;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let release = dir.file_name().is_some_and(|n| n == "release");
    let target = dir.parent().expect("target/<profile> has a parent");
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "-p", package, "--bin", name])
        .env("CARGO_TARGET_DIR", target);
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status();
    assert!(
        bin.exists(),
        "the {name} binary is missing at {} and building it failed ({status:?}): run \
         `cargo build -p {package}` (same profile and target directory) first",
        bin.display()
    );
    bin
}

/// A binary older than the test executable by more than this was probably built from
/// other code.
const STALE_BINARY_AGE: Duration = Duration::from_secs(600);

/// Warns on stderr (shown with a failing test's output) when `bin` is more than
/// [`STALE_BINARY_AGE`] older than the running test executable.
fn warn_if_stale(bin: &Path) {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(test) = std::env::current_exe().ok().and_then(|e| modified(&e)) else {
        return;
    };
    let Some(age) = modified(bin).and_then(|b| test.duration_since(b).ok()) else {
        return;
    };
    if age > STALE_BINARY_AGE {
        eprintln!(
            "warning: {} is {} s older than this test executable: it may be built from \
             older code; `cargo build --workspace` rebuilds it",
            bin.display(),
            age.as_secs()
        );
    }
}

/// The `quire-node` binary (the event store), with its `failpoints` feature when this
/// harness builds it (a workspace test build has it too: see tests/Cargo.toml).
pub fn node_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| binary_with_features("quire-node", "quire-node", &["failpoints"]))
        .clone()
}

/// The `quire-broker` binary.
pub fn broker_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| binary("quire-broker", "quire-broker"))
        .clone()
}

/// The `quire` CLI binary (package quire-tools).
pub fn quire_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| binary("quire-tools", "quire")).clone()
}

/// A command running the `quire` CLI, cut off from the user's client configuration
/// ([`no_client_config`]).
#[must_use]
pub fn quire_command() -> Command {
    let mut cmd = Command::new(quire_bin());
    no_client_config(&mut cmd);
    cmd
}

/// Cuts `cmd` (a `quire` CLI run) off from the user's client configuration: its
/// configuration directory (`QUIRE_CONFIG_DIR`) is one of this test process that nothing
/// writes, and the variables that name a cluster, a profile or credentials are removed.
/// So a profile a developer made with `quire cluster up`, or a cluster of theirs on the
/// default ports, is never what a test talks to: a test names its cluster's addresses.
pub fn no_client_config(cmd: &mut Command) -> &mut Command {
    cmd.env(
        "QUIRE_CONFIG_DIR",
        std::env::temp_dir().join(format!("quire-tests-no-config-{}", std::process::id())),
    );
    for var in [
        "QUIRE_BROKERS",
        "QUIRE_PROFILE",
        "QUIRE_TLS_CA",
        "QUIRE_TLS_CERT",
        "QUIRE_TLS_KEY",
        "QUIRE_USER",
        "QUIRE_PASSWORD",
        "QUIRE_PASSWORD_FILE",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// Runs `cmd` to completion with stdin closed and stdout and stderr captured, killing it
/// (and panicking with its stderr) if it runs longer than `bound`.
///
/// # Panics
/// If it cannot start, or does not finish within `bound`.
pub fn run_bounded(cmd: &mut Command, bound: Duration) -> std::process::Output {
    let child = hermetic(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    wait_bounded(child, bound)
}

/// The prefixes of the servers' setting variables (`QUIRE_NODE_LISTEN`, ...).
pub const SETTING_ENV_PREFIXES: [&str; 2] = ["QUIRE_NODE_", "QUIRE_BROKER_"];

/// Keeps the test runner's own `QUIRE_NODE_*` / `QUIRE_BROKER_*` variables away from `cmd`,
/// so a server started by a test reads only the settings the test gives it; variables the
/// test set on `cmd` itself (`cmd.env(...)`) stay. [`Proc::start`] and [`run_bounded`] call
/// it; call it on any other command that starts a server.
pub fn hermetic(cmd: &mut Command) -> &mut Command {
    let explicit: Vec<std::ffi::OsString> = cmd.get_envs().map(|(k, _)| k.to_owned()).collect();
    for (name, _) in std::env::vars_os() {
        let is_setting = name
            .to_str()
            .is_some_and(|n| SETTING_ENV_PREFIXES.iter().any(|p| n.starts_with(p)));
        if is_setting && !explicit.contains(&name) {
            cmd.env_remove(&name);
        }
    }
    cmd
}

/// Waits for a started `child`, reading its piped stdout and stderr while it runs (so a
/// chatty child never blocks on a full pipe), and kills it (panicking with its stderr) if
/// it runs longer than `bound`. Streams that were not piped come back empty.
///
/// # Panics
/// If it does not finish within `bound`.
pub fn wait_bounded(mut child: Child, bound: Duration) -> std::process::Output {
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    crate::serial::register_child(child.id());
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            crate::serial::forget_child(child.id());
            break status;
        }
        if Instant::now() >= deadline {
            crate::serial::forget_child(child.id());
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err.join().unwrap_or_default();
            panic!(
                "pid {} did not finish within {bound:?}; stderr:\n{}",
                child.id(),
                String::from_utf8_lossy(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// A free loopback port for a server that must keep its address across restarts. Picked
/// at random below the kernel's ephemeral range (32768 and up on Linux), so the test's own
/// outgoing connections never take it between this check and the server's bind.
///
/// A port is handed out at most once per test process: a cluster picks all its ports
/// before it starts any server, so the bind check alone would pass the same port twice
/// (CI saw a store and a broker both given 28342).
///
/// # Panics
/// If 1,000 random ports in 20000..32000 are all taken.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let seed = u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut x = seed.wrapping_add(n.wrapping_mul(0xbf58_476d_1ce4_e5b9));
        x ^= x >> 31;
        let port = 20_000 + (x % 12_000) as u16;
        let mut given = GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free port in 20000..32000");
}

/// Sends `sig` to a process this test started and still owns.
///
/// # Panics
/// If kill(2) fails.
pub fn signal(pid: u32, sig: i32) {
    let pid = libc::pid_t::try_from(pid).expect("a pid fits in pid_t");
    // SAFETY: kill(2) has no memory effects; the pid is a child this test started and has
    // not reaped, so it names that process and no other.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// SIGSTOPs a process this test started and waits (bounded by [`WAIT`]) until every one of
/// its threads is stopped. kill(2) only queues the signal: the target's threads stop when
/// they next enter the kernel, so a thread already running may still read a socket and
/// act on what arrives right after `kill` returns. A test that sends something "while the
/// process is frozen" must wait for this first.
///
/// # Panics
/// If kill(2) fails or the threads do not all stop within [`WAIT`].
pub fn stop(pid: u32) {
    signal(pid, libc::SIGSTOP);
    let deadline = Instant::now() + WAIT;
    loop {
        if all_threads_stopped(pid) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} did not stop within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether every thread of `pid` is in state `T` (stopped) in /proc/PID/task/*/stat.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut seen = 0;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return false;
        };
        // The state follows the command name, which is in parentheses and may hold spaces.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state != Some("T") {
            return false;
        }
        seen += 1;
    }
    seen > 0
}

/// A child process with its log file (stderr, appended across restarts), killed with
/// SIGKILL and reaped on drop.
#[derive(Debug)]
pub struct Proc {
    /// A name for messages (`store0`, `broker2`).
    pub name: String,
    child: Option<Child>,
    /// Where its stderr goes.
    pub log: PathBuf,
    /// The metrics address, if the process printed one (`metrics on ADDR`).
    pub metrics: Option<String>,
}

impl Proc {
    /// Starts `cmd`, with stderr appended to `log`, and waits (at most [`WAIT`]) for
    /// `listening on ADDR` on its stdout; returns the process and `ADDR`. A
    /// `metrics on ADDR` line right after it is kept in [`Proc::metrics`].
    ///
    /// # Panics
    /// If the process cannot start or prints no address in time (its log tail is shown).
    pub fn start(name: &str, mut cmd: Command, log: PathBuf) -> (Proc, String) {
        assert!(
            crate::serial::held(),
            "{name}: a test that starts servers begins with `let _t = quire_tests::proc_test();` \
             (one multi-process test at a time, with a time bound: see quire_tests::serial)"
        );
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        hermetic(&mut cmd)
            .stdout(Stdio::piped())
            .stderr(err)
            .stdin(Stdio::null());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        crate::serial::register_child(child.id());
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let mut p = Proc {
            name: name.to_owned(),
            child: Some(child),
            log,
            metrics: None,
        };
        let deadline = Instant::now() + WAIT;
        let mut addr = None;
        while addr.is_none() && Instant::now() < deadline {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    if let Some(a) = line.strip_prefix("listening on ") {
                        addr = Some(a.trim().to_owned());
                    }
                }
                Err(_) => break,
            }
        }
        // `metrics on ADDR` follows at once when metrics are served.
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            if let Some(m) = line.strip_prefix("metrics on ") {
                p.metrics = Some(m.trim().to_owned());
            }
        }
        match addr {
            Some(addr) => (p, addr),
            None => {
                let tail = p.log_tail(40);
                p.kill9();
                panic!("{name} did not print its address within {WAIT:?}; log:\n{tail}");
            }
        }
    }

    /// SIGKILL and reap (nothing if it is not running).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            crate::serial::forget_child(c.id());
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits at most `bound` for the process to exit and reaps it: `Some`
    /// of whether it exited with status 0, or `None` (and SIGKILL) if it did not exit.
    pub fn terminate(&mut self, bound: Duration) -> Option<bool> {
        let mut c = self.child.take()?;
        // Bounded here; the watchdog need not kill it (and must not, once reaped).
        crate::serial::forget_child(c.id());
        signal(c.id(), libc::SIGTERM);
        let deadline = Instant::now() + bound;
        loop {
            match c.try_wait() {
                Ok(Some(status)) => return Some(status.success()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    return None;
                }
            }
        }
    }

    /// Whether the process was started and not killed by the test.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last `n` lines of the process's log.
    pub fn log_tail(&self, n: usize) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() && self.child.is_some() {
            eprintln!(
                "---- {} (last lines of {}) ----\n{}",
                self.name,
                self.log.display(),
                self.log_tail(30)
            );
        }
        self.kill9();
    }
}

/// `quire cluster status --brokers BROKERS --format json` (with `client_args`: TLS flags, a
/// login) until it names a master other than `not`; that status. Each try is bounded by
/// `run_bounded`'s 60 s.
///
/// # Panics
/// If no such master is named within 60 s (with the last stderr).
pub fn wait_cli_master(
    client_args: &[String],
    brokers: &str,
    not: Option<u64>,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = run_bounded(
            quire_command()
                .args([
                    "cluster",
                    "status",
                    "--brokers",
                    brokers,
                    "--format",
                    "json",
                ])
                .args(client_args),
            Duration::from_secs(60),
        );
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
            let id = v["master"]["id"].as_u64();
            if id.is_some() && id != not {
                return v;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no master (other than {not:?}) within 60 s: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
