//! `quire cluster up` / `quire cluster down`: a whole local cluster (stores and brokers on
//! 127.0.0.1) started as child processes of the `quire` binary itself
//! (`std::env::current_exe()` running `node init`, `node run` and `broker run`).
//!
//! [`LocalCluster`] owns the children: it initialises the stores, starts them and the
//! brokers with their stdout and stderr in `DIR/logs/NAME.log`, waits (bounded) until each
//! prints `listening on ADDR` and until the brokers name a master, and stops them in order
//! (brokers, then stores: SIGTERM, a bounded wait, then SIGKILL). If starting fails
//! half-way, what was started is killed; dropping a [`LocalCluster`] that was neither
//! stopped nor detached kills its children too. Children started in the foreground also
//! get `PR_SET_PDEATHSIG`, so a `quire` killed with SIGKILL takes them with it.
//!
//! A detached cluster (`--detach`) is described by `DIR/cluster.json` ([`ClusterFile`]):
//! every process's name, role, pid, address, data directory and log. `quire cluster down`
//! reads it and stops those processes, after checking from `/proc/PID/cmdline` that each
//! pid still runs `quire` on that data directory (a reused pid is never signalled).
//!
//! # Layout of DIR
//! ```text
//! DIR/store.toml                 the stores' settings (64 MiB segments)
//! DIR/store0 .. storeN-1         store data directories (`quire node init`)
//! DIR/broker1 .. brokerM         broker data directories (broker ids from 1)
//! DIR/logs/store0.log ...        each process's stdout and stderr
//! DIR/cluster.json               pids and addresses (written by --detach)
//! DIR/ports                      the ports used, one per line (reused by the next start)
//! DIR/kafka-ports                the brokers' Kafka listener ports, likewise
//! ```
//!
//! Every broker also serves Kafka clients (docs/kafka.md) on a port of its own (with
//! `--tls`, TLS as every other link). `cluster.json` lists them as `kafka`: the bootstrap
//! addresses.
//!
//! # Ports
//! With `--base-port P`, stores listen on `P, P+1, …` and brokers on the ports after them.
//! Without it, each port is picked at random in 20000..32000 (below Linux's ephemeral range,
//! so an outgoing connection cannot take it between the check and the bind) and checked
//! free by binding it once — unless DIR holds a previous run's `ports` (same process count),
//! which are reused: a broker's data directory pins the addresses it was made for, so a
//! cluster restarted on the same DIR must keep them. Brokers need fixed ports: a broker's address is its name in
//! every broker's `--brokers` list.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde::{Deserialize, Serialize};

use super::status::{self, ClusterStatus, StatusConfig};
use crate::units::parse_duration;

/// Most stores a local cluster starts.
pub const STORES_MAX: usize = 9;
/// Most brokers a local cluster starts.
pub const BROKERS_MAX: usize = 9;
/// Longest wait for one `quire node init` to finish.
pub const INIT_WAIT_MAX: Duration = Duration::from_secs(30);
/// Longest wait for a started process to print `listening on ADDR`.
pub const LISTEN_WAIT_MAX: Duration = Duration::from_secs(30);
/// Default longest wait for processes to exit after SIGTERM before SIGKILL.
pub const STOP_WAIT_DEFAULT: Duration = Duration::from_secs(10);
/// Segment size given to the stores (bytes): small enough that preparing (zero-filling) a
/// segment is quick on a laptop.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Lowest and highest (exclusive) port picked when no base port is given.
const PORT_RANGE: (u16, u16) = (20_000, 32_000);
/// How often waits poll.
const POLL: Duration = Duration::from_millis(50);

/// Arguments of `quire cluster up`.
#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// Directory for data and logs (created if missing); default a fresh temporary directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Event stores to start.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub stores: usize,

    /// Brokers to start (ids 1..=N); one becomes master, the others slaves.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub brokers: usize,

    /// First port: stores on P, P+1, ..., brokers after them; default: free ports.
    #[arg(long, value_name = "P")]
    pub base_port: Option<u16>,

    /// Write DIR/cluster.json, print the addresses and exit, leaving the cluster running
    /// (stop it with `quire cluster down --dir DIR`).
    #[arg(long)]
    pub detach: bool,

    /// Longest wait for the cluster to elect a master.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub ready_timeout: Duration,

    /// Write profile NAME with this cluster's brokers and make it current (`quire profile`).
    /// Without it, a terminal is asked (default no); otherwise the command is printed.
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,

    /// TLS 1.3 on every link: make a throw-away CA and a certificate for each store, each
    /// broker and a client in DIR/tls (rcgen), start stores that require client
    /// certificates of that CA (mutual TLS) and brokers that speak TLS to clients, stores and
    /// each other, and print the QUIRE_TLS_* variables clients need.
    #[arg(long)]
    pub tls: bool,
}

/// Arguments of `quire cluster down`.
#[derive(Debug, Clone, Args)]
pub struct DownArgs {
    /// The directory given to `quire cluster up --detach` (holding cluster.json).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,

    /// Longest wait after SIGTERM before the remaining processes get SIGKILL.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub timeout: Duration,
}

/// What a local cluster looks like.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Directory for data and logs.
    pub dir: PathBuf,
    /// Stores (1..=[`STORES_MAX`]).
    pub stores: usize,
    /// Brokers (1..=[`BROKERS_MAX`]).
    pub brokers: usize,
    /// First port, or free ports.
    pub base_port: Option<u16>,
    /// Children die with this process (`PR_SET_PDEATHSIG`); off for a detached cluster.
    pub die_with_parent: bool,
    /// TLS on every link, with certificates made in `DIR/tls` ([`tls_dir`]).
    pub tls: bool,
}

/// Where `quire cluster up --tls` keeps the CA and certificates of a cluster in `dir`.
#[must_use]
pub fn tls_dir(dir: &Path) -> PathBuf {
    dir.join("tls")
}

/// The identity clients of a `--tls` cluster use (`DIR/tls/client.pem`).
pub const TLS_CLIENT_NAME: &str = "client";

/// Makes the CA and certificates of a `--tls` cluster with `stores` stores and `brokers`
/// brokers, unless every file is there from an earlier start in the same directory.
fn ensure_certificates(dir: &Path, stores: usize, brokers: usize) -> anyhow::Result<()> {
    let tls = tls_dir(dir);
    use quire_tls::Role;
    let mut holders: Vec<(String, Role)> = (0..stores)
        .map(|i| (format!("store{i}"), Role::Store))
        .collect();
    holders.extend((1..=brokers).map(|id| (format!("broker{id}"), Role::Broker)));
    holders.push((TLS_CLIENT_NAME.to_owned(), Role::Client));
    let complete = quire_tls::certs::ca_path(&tls).exists()
        && holders.iter().all(|(n, _)| {
            let f = quire_tls::certs::files_for(&tls, n);
            f.cert.is_some_and(|c| c.exists()) && f.key.is_some_and(|k| k.exists())
        });
    if !complete {
        let refs: Vec<(&str, Role)> = holders.iter().map(|(n, r)| (n.as_str(), *r)).collect();
        quire_tls::certs::write_local(&tls, &refs)
            .with_context(|| format!("making certificates in {}", tls.display()))?;
    }
    Ok(())
}

/// The `--cert-file`, `--key-file` and `--ca-file` flags of the server `name`.
fn tls_flags(dir: &Path, name: &str) -> Vec<std::ffi::OsString> {
    let f = quire_tls::certs::files_for(&tls_dir(dir), name);
    let mut flags = Vec::new();
    for (flag, path) in [
        ("--cert-file", f.cert),
        ("--key-file", f.key),
        ("--ca-file", f.ca),
    ] {
        if let Some(p) = path {
            flags.push(flag.into());
            flags.push(p.into_os_string());
        }
    }
    flags
}

impl ClusterSpec {
    fn validate(&self) -> anyhow::Result<()> {
        if !(1..=STORES_MAX).contains(&self.stores) {
            bail!("--stores must be in 1..={STORES_MAX}");
        }
        if !(1..=BROKERS_MAX).contains(&self.brokers) {
            bail!("--brokers must be in 1..={BROKERS_MAX}");
        }
        if let Some(p) = self.base_port {
            let last = u32::from(p) + (self.stores + self.brokers) as u32 - 1;
            if p == 0 || last > u32::from(u16::MAX) {
                bail!("--base-port {p}: the ports {p}..={last} must be in 1..=65535");
            }
        }
        Ok(())
    }
}

/// Store or broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A `quire node run` process.
    Store,
    /// A `quire broker run` process.
    Broker,
}

/// One process of a cluster, as written to `cluster.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// `store0`, `broker1`, ...
    pub name: String,
    /// Store or broker.
    pub role: Role,
    /// Broker id (brokers only).
    pub broker_id: Option<u16>,
    /// Its process id.
    pub pid: u32,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its stdout + stderr.
    pub log: PathBuf,
}

/// `DIR/cluster.json`: a detached cluster.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterFile {
    /// The cluster directory.
    pub dir: PathBuf,
    /// Broker addresses, in id order.
    pub brokers: Vec<String>,
    /// Store addresses, in slot order.
    pub stores: Vec<String>,
    /// Every process.
    pub processes: Vec<ProcessInfo>,
    /// The brokers' Kafka listeners, in id order (empty: none, as with `--tls`).
    #[serde(default)]
    pub kafka: Vec<String>,
}

impl ClusterFile {
    /// Path of the file in `dir`.
    #[must_use]
    pub fn path(dir: &Path) -> PathBuf {
        dir.join("cluster.json")
    }

    /// Reads `DIR/cluster.json`.
    ///
    /// # Errors
    /// The file is missing or not a cluster file.
    pub fn read(dir: &Path) -> anyhow::Result<ClusterFile> {
        let path = ClusterFile::path(dir);
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (was the cluster started with `quire cluster up --detach --dir {}`?)",
                path.display(),
                dir.display()
            )
        })?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }
}

struct Proc {
    info: ProcessInfo,
    child: Option<Child>,
}

/// A running local cluster whose processes are this process's children. See the module
/// docs.
#[derive(Debug)]
pub struct LocalCluster {
    dir: PathBuf,
    procs: Vec<Proc>,
    /// The brokers' Kafka addresses, in id order.
    kafka: Vec<String>,
    /// Started with `--tls`.
    tls: bool,
}

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proc").field("info", &self.info).finish()
    }
}

/// How [`LocalCluster::stop`] went.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StopReport {
    /// Processes that exited after SIGTERM.
    pub stopped: Vec<String>,
    /// Processes that needed SIGKILL.
    pub killed: Vec<String>,
    /// Processes that had exited before (their exit status).
    pub already_gone: Vec<String>,
    /// Processes killed on purpose before the stop ([`LocalCluster::kill_broker`]).
    pub killed_before: Vec<String>,
}

impl StopReport {
    /// One line for people.
    #[must_use]
    pub fn summary(&self) -> String {
        let mut s = format!("{} stopped cleanly", self.stopped.len());
        if !self.killed.is_empty() {
            s.push_str(&format!(
                ", killed after the timeout: {}",
                self.killed.join(" ")
            ));
        }
        if !self.already_gone.is_empty() {
            s.push_str(&format!(", already gone: {}", self.already_gone.join(" ")));
        }
        if !self.killed_before.is_empty() {
            s.push_str(&format!(
                ", killed earlier on purpose: {}",
                self.killed_before.join(" ")
            ));
        }
        s
    }
}

impl LocalCluster {
    /// Initialises and starts the cluster `spec` describes and waits until every process
    /// listens (each bounded by [`LISTEN_WAIT_MAX`]). Does not wait for a master: see
    /// [`LocalCluster::wait_ready`].
    ///
    /// # Errors
    /// A bad spec, no free port, a `node init` that failed, a process that exited or did
    /// not listen in time (its log's last lines are in the error). Everything started is
    /// killed first.
    pub fn start(spec: &ClusterSpec) -> anyhow::Result<LocalCluster> {
        spec.validate()?;
        refuse_if_running(&spec.dir)?;
        let exe = std::env::current_exe().context("finding the quire executable")?;
        let logs = spec.dir.join("logs");
        fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let store_config = spec.dir.join("store.toml");
        fs::write(
            &store_config,
            format!("[wal]\nsegment_bytes_max = {SEGMENT_BYTES}\n"),
        )
        .with_context(|| format!("writing {}", store_config.display()))?;
        if spec.tls {
            ensure_certificates(&spec.dir, spec.stores, spec.brokers)?;
        }
        let ports = ports_for(&spec.dir, spec.base_port, spec.stores + spec.brokers)?;
        let store_addrs: Vec<String> = ports[..spec.stores]
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let broker_addrs: Vec<String> = ports[spec.stores..]
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let kafka_addrs: Vec<String> = kafka_ports_for(
            &spec.dir,
            spec.base_port.map(|b| {
                b.saturating_add(u16::try_from(spec.stores + spec.brokers).unwrap_or(u16::MAX))
            }),
            spec.brokers,
        )?
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
        let kafka_list: Vec<String> = kafka_addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        let mut cluster = LocalCluster {
            dir: spec.dir.clone(),
            procs: Vec::new(),
            kafka: kafka_addrs.clone(),
            tls: spec.tls,
        };
        for (i, addr) in store_addrs.iter().enumerate() {
            let name = format!("store{i}");
            let data_dir = spec.dir.join(&name);
            if !is_initialised(&data_dir) {
                init_store(&exe, &data_dir, &logs.join(format!("{name}.init.log")))?;
            }
            let mut cmd = Command::new(&exe);
            cmd.args(["node", "run", "--data-dir"])
                .arg(&data_dir)
                .args(["--listen", addr, "--config"])
                .arg(&store_config);
            if spec.tls {
                cmd.args(tls_flags(&spec.dir, &name));
            }
            cluster.spawn(cmd, &name, Role::Store, None, addr, &data_dir, &logs, spec)?;
        }
        let list: Vec<String> = broker_addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        for (i, addr) in broker_addrs.iter().enumerate() {
            let id = u16::try_from(i + 1).expect("invariant: at most BROKERS_MAX brokers");
            let name = format!("broker{id}");
            let data_dir = spec.dir.join(&name);
            let mut cmd = Command::new(&exe);
            cmd.args(["broker", "run", "--id", &id.to_string(), "--data-dir"])
                .arg(&data_dir)
                .args(["--listen", addr])
                .args(["--stores", &store_addrs.join(",")])
                .args(["--brokers", &list.join(",")]);
            if spec.tls {
                cmd.args(tls_flags(&spec.dir, &name));
            }
            if let Some(kafka) = kafka_addrs.get(i) {
                cmd.args(["--kafka-listen", kafka])
                    .args(["--kafka-brokers", &kafka_list.join(",")]);
            }
            cluster.spawn(
                cmd,
                &name,
                Role::Broker,
                Some(id),
                addr,
                &data_dir,
                &logs,
                spec,
            )?;
        }
        for i in 0..cluster.procs.len() {
            cluster.wait_listening(i)?;
        }
        Ok(cluster)
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn(
        &mut self,
        mut cmd: Command,
        name: &str,
        role: Role,
        broker_id: Option<u16>,
        addr: &str,
        data_dir: &Path,
        logs: &Path,
        spec: &ClusterSpec,
    ) -> anyhow::Result<()> {
        let log = logs.join(format!("{name}.log"));
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone().context("duplicating a log file handle")?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        cmd.env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        );
        // Its own process group: a Ctrl-C at the terminal reaches only `quire`, which then
        // stops the children in order (brokers first).
        cmd.process_group(0);
        if spec.die_with_parent {
            // SAFETY: runs in the child between fork and exec; prctl and getppid are
            // async-signal-safe and touch no memory of the parent.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // The parent may have died before the prctl: then do not start.
                    if libc::getppid() == 1 {
                        return Err(io::Error::other("parent exited"));
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        self.procs.push(Proc {
            info: ProcessInfo {
                name: name.to_owned(),
                role,
                broker_id,
                pid: child.id(),
                addr: addr.to_owned(),
                data_dir: data_dir.to_owned(),
                log,
            },
            child: Some(child),
        });
        Ok(())
    }

    /// Waits until process `i` printed `listening on`, or fails with its log's tail.
    fn wait_listening(&mut self, i: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + LISTEN_WAIT_MAX;
        loop {
            let p = &mut self.procs[i];
            let text = read_lossy(&p.info.log);
            if text.lines().any(|l| l.starts_with("listening on ")) {
                return Ok(());
            }
            if let Some(child) = p.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    bail!(
                        "{} exited ({status}) before listening; last lines of {}:\n{}",
                        p.info.name,
                        p.info.log.display(),
                        tail(&text, 20)
                    );
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not listen within {} s; last lines of {}:\n{}",
                    p.info.name,
                    LISTEN_WAIT_MAX.as_secs(),
                    p.info.log.display(),
                    tail(&text, 20)
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until a broker names itself master and every store is a voter in its view,
    /// at most `timeout`. Must not be called inside a Tokio runtime (it builds its own).
    ///
    /// # Errors
    /// No master within `timeout` (with the last status seen), or a process exited.
    pub fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<ClusterStatus> {
        let deadline = Instant::now() + timeout;
        let config = StatusConfig {
            brokers: self.broker_addrs(),
            timeout: Duration::from_secs(1),
            tls: self.client_tls()?,
        };
        let mut last;
        loop {
            if let Some(gone) = self.exited() {
                let log = self
                    .procs
                    .iter()
                    .find(|p| gone.starts_with(&p.info.name))
                    .map(|p| p.info.log.clone());
                match log {
                    Some(log) => bail!(
                        "{gone} exited while the cluster was starting; last lines of {}:\n{}",
                        log.display(),
                        tail(&fs::read_to_string(&log).unwrap_or_default(), 20)
                    ),
                    None => bail!("{gone} exited while the cluster was starting"),
                }
            }
            match status::run(&config) {
                Ok(s) => {
                    let voters = s.stores.iter().filter(|st| st.role == "voter").count();
                    if s.master.is_some() && voters == self.store_addrs().len() {
                        return Ok(s);
                    }
                    last = format!(
                        "master {:?}, {voters} voting stores",
                        s.master.as_ref().map(|m| m.id)
                    );
                }
                Err(e) => last = format!("{e:#}"),
            }
            if Instant::now() >= deadline {
                bail!(
                    "the cluster named no master within {} s (last: {last}); logs in {}",
                    timeout.as_secs(),
                    self.dir.join("logs").display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The name and exit status of a child that has exited, if any.
    pub fn exited(&mut self) -> Option<String> {
        for p in &mut self.procs {
            if let Some(child) = p.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Some(format!("{} ({status})", p.info.name));
                }
            }
        }
        None
    }

    /// The cluster directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The files a client of this cluster shows and trusts: the CA and the client
    /// certificate of `DIR/tls`; `None` for a plaintext cluster.
    #[must_use]
    pub fn client_tls_files(&self) -> Option<quire_tls::TlsFiles> {
        self.tls
            .then(|| quire_tls::certs::files_for(&tls_dir(&self.dir), TLS_CLIENT_NAME))
    }

    /// The TLS side of a client's connections to this cluster; `None` for plaintext.
    ///
    /// # Errors
    /// The certificate files cannot be read.
    pub fn client_tls(&self) -> anyhow::Result<Option<quire_tls::TlsConnector>> {
        match self.client_tls_files() {
            Some(f) => Ok(f.connector().context("the cluster's client certificate")?),
            None => Ok(None),
        }
    }

    /// Broker addresses, in id order.
    #[must_use]
    pub fn broker_addrs(&self) -> Vec<String> {
        self.addrs(Role::Broker)
    }

    /// Store addresses, in slot order.
    #[must_use]
    pub fn store_addrs(&self) -> Vec<String> {
        self.addrs(Role::Store)
    }

    fn addrs(&self, role: Role) -> Vec<String> {
        self.procs
            .iter()
            .filter(|p| p.info.role == role)
            .map(|p| p.info.addr.clone())
            .collect()
    }

    /// Every process.
    #[must_use]
    pub fn processes(&self) -> Vec<ProcessInfo> {
        self.procs.iter().map(|p| p.info.clone()).collect()
    }

    /// The pid of broker `id`, if it is running.
    #[must_use]
    pub fn broker_pid(&self, id: u16) -> Option<u32> {
        self.procs
            .iter()
            .find(|p| p.info.broker_id == Some(id) && p.child.is_some())
            .map(|p| p.info.pid)
    }

    /// Kills broker `id` with SIGKILL and reaps it. Returns its pid.
    ///
    /// # Errors
    /// No such running broker, or the kill failed.
    pub fn kill_broker(&mut self, id: u16) -> anyhow::Result<u32> {
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.info.broker_id == Some(id) && p.child.is_some())
            .with_context(|| format!("no running broker {id}"))?;
        let mut child = p.child.take().expect("invariant: checked is_some above");
        let killed = child.kill();
        let _ = child.wait();
        killed.with_context(|| format!("killing {}", p.info.name))?;
        Ok(p.info.pid)
    }

    /// The description `cluster.json` holds.
    #[must_use]
    pub fn file(&self) -> ClusterFile {
        ClusterFile {
            dir: self.dir.clone(),
            brokers: self.broker_addrs(),
            stores: self.store_addrs(),
            processes: self.processes(),
            kafka: self.kafka.clone(),
        }
    }

    /// Writes `DIR/cluster.json` and lets the processes run on after this value is
    /// dropped.
    ///
    /// # Errors
    /// The file could not be written (the cluster is then stopped by drop).
    pub fn detach(mut self) -> anyhow::Result<ClusterFile> {
        let file = self.file();
        let path = ClusterFile::path(&self.dir);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(&file)?;
        fs::write(&tmp, text + "\n").with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
        for p in &mut self.procs {
            // Not killed on drop; init reaps them once this process exits.
            p.child = None;
        }
        Ok(file)
    }

    /// Stops every process: SIGTERM to the brokers, then to the stores, each group waited
    /// for at most `wait`, then SIGKILL to what is left.
    pub fn stop(&mut self, wait: Duration) -> StopReport {
        let mut report = StopReport {
            killed_before: self
                .procs
                .iter()
                .filter(|p| p.child.is_none())
                .map(|p| p.info.name.clone())
                .collect(),
            ..StopReport::default()
        };
        for role in [Role::Broker, Role::Store] {
            let mut group: Vec<&mut Proc> = self
                .procs
                .iter_mut()
                .filter(|p| p.info.role == role && p.child.is_some())
                .collect();
            for p in &mut group {
                let child = p.child.as_mut().expect("invariant: filtered on is_some");
                if let Ok(Some(status)) = child.try_wait() {
                    report
                        .already_gone
                        .push(format!("{} ({status})", p.info.name));
                    p.child = None;
                    continue;
                }
                signal(p.info.pid, libc::SIGTERM);
            }
            let deadline = Instant::now() + wait;
            for p in &mut group {
                let Some(mut child) = p.child.take() else {
                    continue;
                };
                loop {
                    match child.try_wait() {
                        Ok(Some(_)) => {
                            report.stopped.push(p.info.name.clone());
                            break;
                        }
                        Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                        _ => {
                            let _ = child.kill();
                            let _ = child.wait();
                            report.killed.push(p.info.name.clone());
                            break;
                        }
                    }
                }
            }
        }
        report
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if let Some(mut child) = p.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Stops the processes of a detached cluster described by `DIR/cluster.json`: SIGTERM to
/// the brokers then the stores, each group waited for at most `wait` (by polling
/// `/proc`), then SIGKILL. A pid whose command line no longer names its data directory is
/// left alone and reported as gone.
///
/// # Errors
/// `cluster.json` missing or unreadable.
pub fn down(dir: &Path, wait: Duration) -> anyhow::Result<StopReport> {
    let file = ClusterFile::read(dir)?;
    let mut report = StopReport::default();
    for role in [Role::Broker, Role::Store] {
        let group: Vec<&ProcessInfo> = file.processes.iter().filter(|p| p.role == role).collect();
        let mut running = Vec::new();
        for p in group {
            if is_ours(p) {
                signal(p.pid, libc::SIGTERM);
                running.push(p);
            } else {
                report.already_gone.push(p.name.clone());
            }
        }
        let deadline = Instant::now() + wait;
        for p in running {
            while is_ours(p) && Instant::now() < deadline {
                std::thread::sleep(POLL);
            }
            if is_ours(p) {
                signal(p.pid, libc::SIGKILL);
                let kill_deadline = Instant::now() + Duration::from_secs(5);
                while is_ours(p) && Instant::now() < kill_deadline {
                    std::thread::sleep(POLL);
                }
                report.killed.push(p.name.clone());
            } else {
                report.stopped.push(p.name.clone());
            }
        }
    }
    let _ = fs::remove_file(ClusterFile::path(dir));
    Ok(report)
}

/// True while `p.pid` is a live (not zombie) process whose command line names its data
/// directory.
#[must_use]
pub fn is_ours(p: &ProcessInfo) -> bool {
    let proc_dir = PathBuf::from(format!("/proc/{}", p.pid));
    let Ok(stat) = fs::read_to_string(proc_dir.join("stat")) else {
        return false;
    };
    // State is the first field after the parenthesised command name.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    if matches!(state, Some("Z" | "X")) {
        return false;
    }
    let Ok(cmdline) = fs::read(proc_dir.join("cmdline")) else {
        return false;
    };
    let want = p.data_dir.as_os_str().as_encoded_bytes();
    cmdline.split(|b| *b == 0).any(|arg| arg == want)
}

fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) has no memory effects; a stale pid is an error we ignore.
    unsafe {
        libc::kill(pid, sig);
    }
}

fn is_initialised(data_dir: &Path) -> bool {
    fs::read_dir(data_dir).is_ok_and(|mut d| d.next().is_some())
}

fn init_store(exe: &Path, data_dir: &Path, log: &Path) -> anyhow::Result<()> {
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut child = Command::new(exe)
        .args(["node", "init", "--data-dir"])
        .arg(data_dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .context("starting quire node init")?;
    let deadline = Instant::now() + INIT_WAIT_MAX;
    loop {
        if let Some(status) = child.try_wait()? {
            if status.success() {
                return Ok(());
            }
            bail!(
                "quire node init --data-dir {} failed ({status}):\n{}",
                data_dir.display(),
                tail(&read_lossy(log), 20)
            );
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "quire node init --data-dir {} took over {} s",
                data_dir.display(),
                INIT_WAIT_MAX.as_secs()
            );
        }
        std::thread::sleep(POLL);
    }
}

/// The ports of a cluster in `dir`: `base..base+n` if given; else the ports a previous run
/// in `dir` used (`DIR/ports`, one per line), because brokers' data directories pin the
/// store and broker addresses they were made for; else fresh free ports. Written back to
/// `DIR/ports`.
fn ports_for(dir: &Path, base: Option<u16>, n: usize) -> anyhow::Result<Vec<u16>> {
    let path = dir.join("ports");
    let previous = read_ports(&path);
    let ports = match (base, previous) {
        (None, Some(p)) if p.len() == n => p,
        // The brokers' data directories pin the addresses of this many processes: new
        // ports (or another count) would only make every broker refuse to start.
        (None, Some(p)) if dir.join("broker1").exists() => bail!(
            "{} holds a cluster of {} processes (ports in {}); start it with the same \
             --stores and --brokers (or --base-port), or use a new directory",
            dir.display(),
            p.len(),
            path.display()
        ),
        (base, _) => pick_ports(base, n)?,
    };
    let text: String = ports.iter().map(|p| format!("{p}\n")).collect();
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(ports)
}

/// The ports a ports file lists, one per line; `None` if it is missing or unreadable.
fn read_ports(path: &Path) -> Option<Vec<u16>> {
    fs::read_to_string(path)
        .ok()
        .and_then(|t| t.lines().map(|l| l.trim().parse().ok()).collect())
}

/// The brokers' Kafka ports: after the other processes' ports if `base` is given; else
/// the previous run's (`DIR/kafka-ports`) if there are `n`; else fresh free ones. Written
/// back to `DIR/kafka-ports`.
fn kafka_ports_for(dir: &Path, base: Option<u16>, n: usize) -> anyhow::Result<Vec<u16>> {
    let path = dir.join("kafka-ports");
    let previous = read_ports(&path);
    let ports = match (base, previous) {
        (None, Some(p)) if p.len() == n => p,
        (base, _) => {
            let others = read_ports(&dir.join("ports")).unwrap_or_default();
            let mut picked = pick_ports(base, n + others.len())?;
            picked.retain(|p| !others.contains(p));
            picked.truncate(n);
            if picked.len() < n {
                bail!("could not pick {n} free ports for the Kafka listeners");
            }
            picked
        }
    };
    let text: String = ports.iter().map(|p| format!("{p}\n")).collect();
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(ports)
}

/// Refuses to start a cluster in `dir` while the one recorded in `DIR/cluster.json` still
/// has a live process: starting over it would fail on the stores' locks after rewriting
/// its files.
fn refuse_if_running(dir: &Path) -> anyhow::Result<()> {
    let Ok(file) = ClusterFile::read(dir) else {
        return Ok(());
    };
    let live: Vec<String> = file
        .processes
        .iter()
        .filter(|p| is_ours(p))
        .map(|p| format!("{} (pid {})", p.name, p.pid))
        .collect();
    if !live.is_empty() {
        bail!(
            "a cluster is already running in {}: {}; stop it first with `quire cluster down --dir {}`",
            dir.display(),
            live.join(", "),
            dir.display()
        );
    }
    Ok(())
}

/// `n` ports: `base..base+n`, or distinct free ones.
fn pick_ports(base: Option<u16>, n: usize) -> anyhow::Result<Vec<u16>> {
    if let Some(base) = base {
        return (0..n)
            .map(|i| {
                u16::try_from(usize::from(base) + i).context("--base-port leaves too few ports")
            })
            .collect();
    }
    let mut seed = u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let mut ports: Vec<u16> = Vec::with_capacity(n);
    for _ in 0..10_000 {
        if ports.len() == n {
            break;
        }
        // splitmix64
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut x = seed;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        let span = u64::from(PORT_RANGE.1 - PORT_RANGE.0);
        let port = PORT_RANGE.0 + u16::try_from(x % span).expect("invariant: below the span");
        if !ports.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    if ports.len() < n {
        bail!(
            "found only {} free ports in {}..{}",
            ports.len(),
            PORT_RANGE.0,
            PORT_RANGE.1
        );
    }
    Ok(ports)
}

fn read_lossy(path: &Path) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut f) = File::open(path) {
        // Logs can grow large: the last 64 KiB hold every line we look for.
        let len = f.metadata().map_or(0, |m| m.len());
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
        let _ = f.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn tail(text: &str, lines: usize) -> String {
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// `quire cluster up`: starts the cluster, waits until it is ready, prints how to use and
/// stop it; then either detaches or serves until SIGINT/SIGTERM and stops everything.
///
/// # Errors
/// Starting failed (everything started is killed), or the cluster did not become ready.
pub fn run_up(args: &UpArgs, out: &mut impl Write) -> anyhow::Result<()> {
    crate::interrupt::install().context("installing the signal handlers")?;
    let (dir, temp) = match &args.dir {
        Some(d) => (d.clone(), None),
        None => {
            let t = tempfile::Builder::new()
                .prefix("quire-cluster-")
                .tempdir()
                .context("creating a temporary directory")?;
            (t.path().to_owned(), Some(t))
        }
    };
    let spec = ClusterSpec {
        dir: dir.clone(),
        stores: args.stores,
        brokers: args.brokers,
        base_port: args.base_port,
        die_with_parent: !args.detach,
        tls: args.tls,
    };
    if !args.tls && tls_dir(&dir).exists() {
        writeln!(
            out,
            "warning: {} holds the certificates of an earlier `--tls` start; this cluster runs plaintext (add --tls to keep TLS)",
            tls_dir(&dir).display()
        )?;
    }
    let mut cluster = LocalCluster::start(&spec)?;
    let status = cluster.wait_ready(args.ready_timeout)?;
    let brokers = cluster.broker_addrs().join(",");
    let master = status.master.as_ref().map_or_else(
        || "?".to_owned(),
        |m| format!("broker {} at {}", m.id, m.addr),
    );
    writeln!(
        out,
        "quire cluster up: {} stores, {} brokers in {}",
        args.stores,
        args.brokers,
        dir.display()
    )?;
    writeln!(out, "  stores:  {}", cluster.store_addrs().join(","))?;
    writeln!(out, "  brokers: {brokers}")?;
    writeln!(out, "  master:  {master}")?;
    if !cluster.kafka.is_empty() {
        writeln!(
            out,
            "  kafka:   {} (bootstrap servers for Kafka clients)",
            cluster.kafka.join(",")
        )?;
    }
    writeln!(out, "  logs:    {}", dir.join("logs").display())?;
    if let Some(files) = cluster.client_tls_files() {
        writeln!(
            out,
            "  tls:     TLS 1.3 on every link; stores require client certificates of {}",
            files.ca.as_deref().unwrap_or(Path::new("?")).display()
        )?;
        writeln!(out, "clients need (or --tls-ca, --tls-cert, --tls-key):")?;
        for (var, path) in [
            ("QUIRE_TLS_CA", &files.ca),
            ("QUIRE_TLS_CERT", &files.cert),
            ("QUIRE_TLS_KEY", &files.key),
        ] {
            if let Some(p) = path {
                writeln!(out, "  export {var}={}", p.display())?;
            }
        }
    }
    // With --profile the profile (made current below) names the brokers.
    let reach = if args.profile.is_some() {
        String::new()
    } else {
        format!(" --brokers {brokers}")
    };
    writeln!(out, "try:")?;
    writeln!(out, "  quire produce{reach} --topic t --count 1000")?;
    writeln!(
        out,
        "  quire consume{reach} --topic t --from beginning --timeout 2s"
    )?;
    writeln!(out, "  quire cluster status{reach}")?;
    if let Some(k) = cluster.kafka.first() {
        match cluster.client_tls_files() {
            None => writeln!(out, "  kcat -b {k} -L")?,
            Some(files) => {
                let mut line = format!("  kcat -b {k} -X security.protocol=ssl");
                for (option, path) in [
                    ("ssl.ca.location", &files.ca),
                    ("ssl.certificate.location", &files.cert),
                    ("ssl.key.location", &files.key),
                ] {
                    if let Some(p) = path {
                        line.push_str(&format!(" -X {option}={}", p.display()));
                    }
                }
                writeln!(out, "{line} -L")?;
            }
        }
    }
    crate::profile::offer_cluster_profile(
        args.profile.as_deref(),
        &cluster.broker_addrs(),
        &crate::settings::Env::from_process(),
        out,
    )?;
    if args.detach {
        // A temporary directory given to a detached cluster must outlive this process.
        let dir = match temp {
            Some(t) => t.keep(),
            None => dir,
        };
        cluster.detach()?;
        writeln!(
            out,
            "detached; stop it with: quire cluster down --dir {}",
            dir.display()
        )?;
        out.flush()?;
        return Ok(());
    }
    writeln!(out, "press Ctrl-C to stop the cluster")?;
    out.flush()?;
    loop {
        if crate::interrupt::is_interrupted() {
            break;
        }
        if let Some(gone) = cluster.exited() {
            writeln!(out, "warning: {gone} exited; stopping the cluster")?;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let report = cluster.stop(STOP_WAIT_DEFAULT);
    writeln!(out, "cluster stopped: {}", report.summary())?;
    if temp.is_some() {
        writeln!(out, "removed {}", dir.display())?;
    }
    drop(temp);
    Ok(())
}

/// `quire cluster down`. Also names the profiles (of `env`'s profile file) that still list
/// exactly this cluster's brokers, which no longer answer.
///
/// # Errors
/// As [`down`].
pub fn run_down(
    args: &DownArgs,
    env: &crate::settings::Env,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let brokers = ClusterFile::read(&args.dir)?.brokers;
    let report = down(&args.dir, args.timeout)?;
    writeln!(
        out,
        "cluster in {} down: {}",
        args.dir.display(),
        report.summary()
    )?;
    let stale = crate::profile::ProfileStore::from_env(env)
        .and_then(|store| store.load())
        .map(|file| {
            file.profiles
                .into_iter()
                .filter(|(_, p)| p.brokers == brokers)
                .map(|(name, _)| name)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    for name in stale {
        writeln!(
            out,
            "profile {name} still names this cluster's brokers: `quire profile delete {name}`, \
             or `quire cluster up --profile {name}` to point it at a new cluster"
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_process_count_on_a_used_directory_is_refused_and_keeps_its_ports() {
        let dir = tempfile::tempdir().unwrap();
        let first = ports_for(dir.path(), None, 6).unwrap();
        fs::create_dir(dir.path().join("broker1")).unwrap();
        let err = ports_for(dir.path(), None, 5).unwrap_err().to_string();
        assert!(err.contains("holds a cluster of 6 processes"), "{err}");
        // The file is untouched: the right counts still find the original ports.
        assert_eq!(ports_for(dir.path(), None, 6).unwrap(), first);
    }

    #[test]
    fn a_directory_without_a_live_cluster_may_be_started() {
        let dir = tempfile::tempdir().unwrap();
        refuse_if_running(dir.path()).unwrap();
    }

    #[test]
    fn a_restart_in_the_same_directory_reuses_its_ports() {
        let dir = tempfile::tempdir().unwrap();
        let first = ports_for(dir.path(), None, 5).unwrap();
        assert_eq!(ports_for(dir.path(), None, 5).unwrap(), first);
        assert_eq!(
            ports_for(dir.path(), Some(7100), 2).unwrap(),
            vec![7100, 7101]
        );
        assert_eq!(ports_for(dir.path(), None, 2).unwrap(), vec![7100, 7101]);
    }

    #[test]
    fn base_port_assigns_ports_in_order() {
        assert_eq!(pick_ports(Some(7100), 3).unwrap(), vec![7100, 7101, 7102]);
        assert!(pick_ports(Some(65535), 2).is_err());
    }

    #[test]
    fn free_ports_are_distinct_and_below_the_ephemeral_range() {
        let ports = pick_ports(None, 6).unwrap();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 6);
        assert!(ports.iter().all(|p| (20_000..32_000).contains(p)));
    }

    #[test]
    fn a_spec_out_of_range_is_refused() {
        let spec = |stores, brokers, base_port| ClusterSpec {
            dir: PathBuf::from("/nonexistent"),
            stores,
            brokers,
            base_port,
            die_with_parent: true,
            tls: false,
        };
        assert!(spec(0, 2, None).validate().is_err());
        assert!(spec(3, 0, None).validate().is_err());
        assert!(spec(3, 2, Some(65533)).validate().is_err());
        assert!(spec(3, 2, Some(7000)).validate().is_ok());
    }

    #[test]
    fn a_dead_or_foreign_pid_is_not_ours() {
        let me = ProcessInfo {
            name: "x".into(),
            role: Role::Store,
            broker_id: None,
            pid: std::process::id(),
            addr: String::new(),
            data_dir: PathBuf::from("/definitely/not/in/my/cmdline"),
            log: PathBuf::new(),
        };
        assert!(
            !is_ours(&me),
            "a live pid without the data dir on its command line"
        );
        let gone = ProcessInfo {
            pid: u32::MAX - 1,
            ..me
        };
        assert!(!is_ours(&gone));
    }
}
