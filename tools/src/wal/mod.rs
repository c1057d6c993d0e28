//! `quire wal ...`: offline inspection and repair of a store's write-ahead log.
//!
//! | command | module | what it does |
//! | --- | --- | --- |
//! | `quire wal dump DIR` | [`dump`] | one line per record (offset, epoch, kind, length, segment, position, checksum) |
//! | `quire wal verify DIR` | [`verify`] | checks every record; exit 0 clean, 1 corruption, 2 torn tail only, 3 no log read |
//! | `quire wal stat DIR` | [`stat`] | per segment: base and last offset, records, bytes, epochs; totals |
//! | `quire wal repair DIR --truncate-torn-tail` | [`repair`] | cuts a torn tail (dry run unless `--yes`), never corruption |
//!
//! Every one of them exits [`EXIT_FAILED`] (3) when it could not do its job — DIR missing,
//! not a directory, holding no WAL ([`WalDirError`]), unreadable, or locked by a running
//! node (`repair --yes`) — so that a wrong path is never taken for a verdict.
//!
//! This module owns how the tools find a WAL directory ([`resolve_dir`]), how they tell that
//! a running process has it open ([`live_holder`]) and the shape of a log's end
//! ([`EndSummary`]). The format, the scan rules and the cut itself belong to `quire-wal`
//! (`quire_wal::inspect`, `quire_wal::repair_torn_tail`): these tools never parse a record
//! themselves.
//!
//! `dump`, `verify` and `stat` are read-only: they open segments for reading, take no lock
//! and never wait. A node that is running writes while they read, so their view may end
//! in what looks like a torn tail but is only a write in flight; they say so when they
//! find the WAL's `LOCK` held (from `/proc/locks`, without touching the lock).

pub mod args;
pub mod dump;
pub mod event;
pub mod repair;
pub mod stat;
pub mod verify;

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use quire_node::identity::IDENTITY_FILE_NAME;
use quire_proto::EventKind;
use quire_wal::format::KIND_TRUNCATE;
use quire_wal::promised::PROMISED_EPOCH_NAME;
use quire_wal::segment::{parse_segment_name, LOCK_NAME, SPARE_NAME, SPARE_TMP_NAME};
use quire_wal::ScanEnd;
use serde::Serialize;

use self::args::WalCommand;

/// Most bytes of `/proc/locks` read when looking for the holder of a WAL's lock.
pub const PROC_LOCKS_BYTES_MAX: u64 = 4 << 20;

/// Runs one `quire wal` command, printing to stdout.
///
/// # Errors
/// Bad directories ([`WalDirError`]) and I/O errors (the binary exits [`EXIT_FAILED`]
/// after those); [`FindingsExit`] when the command printed its findings and they call for
/// a non-zero exit status (verify: corruption or a torn tail; repair: corruption).
pub fn run(command: &WalCommand) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match command {
        WalCommand::Dump(args) => dump::run(&args.to_config(), &mut out),
        WalCommand::Verify(args) => verify::run(&args.to_config(), &mut out),
        WalCommand::Stat(args) => stat::run(&args.to_config(), &mut out),
        WalCommand::Repair(args) => repair::run(&args.to_config(), &mut out),
    }
}

/// The error a command returns when it has printed its findings and they ask for a given
/// exit status (e.g. `quire wal verify` found a torn tail: 2). The binary exits with
/// `exit_code` and prints `message` on stderr.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FindingsExit {
    /// The process exit status.
    pub exit_code: u8,
    /// One line for stderr.
    pub message: String,
}

/// Exit status of `quire wal verify` for a clean log.
pub const EXIT_CLEAN: u8 = 0;
/// Exit status of `quire wal verify` (and `repair`) for corruption.
pub const EXIT_CORRUPTION: u8 = 1;
/// Exit status of `quire wal verify` for a log whose only problem is a torn tail.
pub const EXIT_TORN_TAIL: u8 = 2;

/// Exit status of every `quire wal` command that could not do its job, with no findings to
/// report: DIR missing, not a directory, holding no WAL, unreadable, or (`repair --yes`)
/// locked by a running node. Distinct from verify's 0, 1 and 2 (and from the usual 1 of a
/// failed `quire` command), so that a script never takes a wrong path for a verdict.
pub const EXIT_FAILED: u8 = 3;

/// The files a WAL directory holds besides its segments, one of which is there as soon as
/// the WAL was opened once, before it has a record: the directory lock (created by every
/// open), the promised epoch (after the first fence) and the preallocated spare segment
/// (prepared in the background after the open).
pub const WAL_FILE_NAMES: [&str; 4] = [LOCK_NAME, PROMISED_EPOCH_NAME, SPARE_NAME, SPARE_TMP_NAME];

/// Most entry names a [`WalDirError::NotAWal`] quotes.
const NAMES_QUOTED_MAX: usize = 5;

/// Why DIR on a `quire wal` command line is not a WAL the tools can read. The binary exits
/// with [`EXIT_FAILED`] after any of these.
#[derive(Debug, thiserror::Error)]
pub enum WalDirError {
    /// DIR does not exist.
    #[error(
        "{} does not exist: expected a WAL directory (segment files named <20 digits>.log) \
         or a store's data directory (its WAL is DIR/wal)",
        dir.display()
    )]
    Missing {
        /// The directory given.
        dir: PathBuf,
    },
    /// DIR exists but is not a directory.
    #[error(
        "{} is not a directory: expected a WAL directory (segment files named <20 \
         digits>.log) or a store's data directory (its WAL is DIR/wal)",
        dir.display()
    )]
    NotADirectory {
        /// The path given.
        dir: PathBuf,
    },
    /// DIR holds neither a WAL nor a store's `wal/` directory.
    #[error(
        "{} holds no WAL: expected segment files named <20 digits>.log (or a WAL's LOCK, \
         promised_epoch or spare.prealloc file), or a store's data directory with a wal/ \
         subdirectory; {found}",
        dir.display()
    )]
    NotAWal {
        /// The directory given.
        dir: PathBuf,
        /// What it holds instead, for the message (`it is empty`, `it holds: a, b, …`).
        found: String,
    },
    /// DIR is an initialised store without its WAL directory (deleted, or initialised by a
    /// build older than the one that writes it at `init`).
    #[error(
        "{} is a store's data directory that has no wal/ (`quire-node init` creates it): \
         the WAL was deleted, or the directory was initialised by an older Quire and never \
         run. There is no log to read, and quire-node refuses to start this store",
        dir.display()
    )]
    NoWalYet {
        /// The store's data directory.
        dir: PathBuf,
    },
    /// DIR (or its listing) cannot be read.
    #[error("cannot read {}", dir.display())]
    Unreadable {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The directory holding the segments for `dir` as given on the command line: `dir` itself
/// when it holds a WAL (a segment, or one of [`WAL_FILE_NAMES`]: a WAL that was opened but
/// has no record yet is an empty log, not an error), else `dir/wal` when `dir` is a store's
/// data directory (`dir/wal` holds a WAL, or `dir` has a store `identity` file).
///
/// # Errors
/// [`WalDirError`]: `dir` missing, not a directory, unreadable, holding no WAL (a wrong
/// path: an empty directory, `/etc`, the parent of the data directories), or an
/// initialised store that never ran.
pub fn resolve_dir(dir: &Path) -> Result<PathBuf, WalDirError> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(WalDirError::NotADirectory {
                dir: dir.to_path_buf(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(WalDirError::Missing {
                dir: dir.to_path_buf(),
            })
        }
        Err(source) => {
            return Err(WalDirError::Unreadable {
                dir: dir.to_path_buf(),
                source,
            })
        }
    }
    let listing = list(dir)?;
    if listing.holds_wal {
        return Ok(dir.to_path_buf());
    }
    let nested = dir.join("wal");
    let is_store = dir.join(IDENTITY_FILE_NAME).is_file();
    if nested.is_dir() && (is_store || list(&nested)?.holds_wal) {
        tracing::debug!(
            "{} is a data directory: using {}",
            dir.display(),
            nested.display()
        );
        return Ok(nested);
    }
    if is_store {
        return Err(WalDirError::NoWalYet {
            dir: dir.to_path_buf(),
        });
    }
    Err(WalDirError::NotAWal {
        dir: dir.to_path_buf(),
        found: describe_entries(listing.names),
    })
}

/// What [`resolve_dir`] learns from one directory listing.
struct Listing {
    /// It holds a segment or one of [`WAL_FILE_NAMES`].
    holds_wal: bool,
    /// Its entries' names (lossy UTF-8), for the error message.
    names: Vec<String>,
}

fn list(dir: &Path) -> Result<Listing, WalDirError> {
    let unreadable = |source| WalDirError::Unreadable {
        dir: dir.to_path_buf(),
        source,
    };
    let mut listing = Listing {
        holds_wal: false,
        names: Vec::new(),
    };
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let name = entry.map_err(unreadable)?.file_name();
        let name = name.to_string_lossy();
        if parse_segment_name(&name).is_some() || WAL_FILE_NAMES.contains(&name.as_ref()) {
            listing.holds_wal = true;
        }
        listing.names.push(name.into_owned());
    }
    Ok(listing)
}

/// `it is empty`, or `it holds: a, b, c` (sorted, at most [`NAMES_QUOTED_MAX`] names, then
/// `and N more`).
fn describe_entries(mut names: Vec<String>) -> String {
    if names.is_empty() {
        return "it is empty".to_owned();
    }
    names.sort();
    let more = names.len().saturating_sub(NAMES_QUOTED_MAX);
    names.truncate(NAMES_QUOTED_MAX);
    let mut s = format!("it holds: {}", names.join(", "));
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}

/// A process that holds the WAL directory's lock (a running node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveHolder {
    /// Its process id.
    pub pid: u32,
    /// Its command name from `/proc/PID/comm`, if readable.
    pub name: Option<String>,
}

impl fmt::Display for LiveHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "pid {} ({name})", self.pid),
            None => write!(f, "pid {}", self.pid),
        }
    }
}

/// The process holding the `flock` on `wal_dir/LOCK`, if any, found in `/proc/locks`
/// (never by taking the lock: a tool must not make a node that starts at the same moment
/// fail to open its WAL). `None` when the file is missing, nobody holds it, or
/// `/proc/locks` cannot be read.
pub fn live_holder(wal_dir: &Path) -> Option<LiveHolder> {
    let meta = std::fs::metadata(wal_dir.join(LOCK_NAME)).ok()?;
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let ino = meta.ino();
    let text = read_bounded("/proc/locks", PROC_LOCKS_BYTES_MAX)?;
    let pid = flock_holder(&text, major, minor, ino)?;
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty());
    Some(LiveHolder { pid, name })
}

fn read_bounded(path: &str, max: u64) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(max).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The pid holding a granted FLOCK on inode `ino` of device `major:minor`, from the text
/// of `/proc/locks` (lines such as `1: FLOCK  ADVISORY  WRITE 15321 fe:00:5636207 0 EOF`;
/// the device numbers are hex, blocked waiters are marked `->`).
fn flock_holder(proc_locks: &str, major: u32, minor: u32, ino: u64) -> Option<u32> {
    proc_locks.lines().find_map(|line| {
        let mut fields = line.split_whitespace().skip(1);
        let kind = fields.next()?;
        if kind != "FLOCK" {
            return None; // also skips "->" waiters
        }
        let _advisory = fields.next()?;
        let _mode = fields.next()?;
        let pid: u32 = fields.next()?.parse().ok()?;
        let mut id = fields.next()?.split(':');
        let maj = u32::from_str_radix(id.next()?, 16).ok()?;
        let min = u32::from_str_radix(id.next()?, 16).ok()?;
        let inode: u64 = id.next()?.parse().ok()?;
        (maj == major && min == minor && inode == ino).then_some(pid)
    })
}

/// Warns on stderr that `holder` has the WAL open, so what follows may be a moving target.
pub(crate) fn warn_live(wal_dir: &Path, holder: &LiveHolder) {
    tracing::warn!(
        "{} is open by a running process, {holder}: reading it anyway (read-only, no \
         lock); records being written right now may show up as a torn tail",
        wal_dir.display()
    );
}

/// The name of a record kind byte: an event kind (`message`, `cursor_commit`, ...), the
/// WAL's `truncate` marker, or `unknown`.
#[must_use]
pub fn kind_name(kind: u8) -> &'static str {
    if kind == KIND_TRUNCATE {
        return "truncate";
    }
    match EventKind::from_u8(kind) {
        Some(EventKind::Message) => "message",
        Some(EventKind::CursorCommit) => "cursor_commit",
        Some(EventKind::TopicAdmin) => "topic_admin",
        Some(EventKind::EpochStart) => "epoch_start",
        Some(EventKind::Trim) => "trim",
        Some(EventKind::UserAdmin) => "user_admin",
        Some(EventKind::AclAdmin) => "acl_admin",
        Some(EventKind::Config) => "config",
        None => "unknown",
    }
}

/// The segment file's name (without its directory), for output.
pub(crate) fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// How a log ends, as `dump`, `verify`, `stat` and `repair` print it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndSummary {
    /// `"clean"`, `"torn_tail"` or `"corruption"`.
    pub result: &'static str,
    /// The segment holding the bad record (full path), if any.
    pub segment: Option<String>,
    /// Byte position of the bad record in that segment.
    pub position: Option<u64>,
    /// The offset the log expected there.
    pub offset: Option<u64>,
    /// Torn tail only: bytes from `position` to the last non-zero byte after it.
    pub bytes: Option<u64>,
    /// Why the record does not count (torn tail) or what is wrong (corruption).
    pub problem: Option<String>,
    /// Torn tail only: later segments holding no valid record (deleted with the cut).
    pub empty_segments_after: Vec<String>,
}

impl EndSummary {
    /// The summary of `end`.
    #[must_use]
    pub fn of(end: &ScanEnd) -> EndSummary {
        match end {
            ScanEnd::Clean => EndSummary {
                result: "clean",
                segment: None,
                position: None,
                offset: None,
                bytes: None,
                problem: None,
                empty_segments_after: Vec::new(),
            },
            ScanEnd::TornTail(t) => EndSummary {
                result: "torn_tail",
                segment: Some(t.segment.display().to_string()),
                position: Some(t.position.0),
                offset: Some(t.offset.0),
                bytes: Some(t.bytes),
                problem: Some(t.problem.to_string()),
                empty_segments_after: t
                    .empty_segments_after
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
            },
            ScanEnd::Corruption(e) => corruption_summary(e),
        }
    }

    /// The exit status `quire wal verify` gives for this end.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self.result {
            "clean" => EXIT_CLEAN,
            "torn_tail" => EXIT_TORN_TAIL,
            _ => EXIT_CORRUPTION,
        }
    }

    /// One line for people, e.g. `torn tail in /d/000...log at position 4096 (expected
    /// offset 17, 1024 bytes): file ends inside the record`.
    #[must_use]
    pub fn describe(&self) -> String {
        let at = || {
            format!(
                "{} at position {} (expected offset {})",
                self.segment.as_deref().unwrap_or("?"),
                self.position.map_or_else(|| "?".into(), |p| p.to_string()),
                self.offset.map_or_else(|| "?".into(), |o| o.to_string()),
            )
        };
        match self.result {
            "clean" => "clean: nothing of this log after the last valid record".to_owned(),
            "torn_tail" => {
                let mut s = format!(
                    "torn tail in {}, {} bytes: {}",
                    at(),
                    self.bytes.unwrap_or(0),
                    self.problem.as_deref().unwrap_or("?")
                );
                if !self.empty_segments_after.is_empty() {
                    s.push_str(&format!(
                        "; then {} later segment(s) with no valid record: {}",
                        self.empty_segments_after.len(),
                        self.empty_segments_after.join(", ")
                    ));
                }
                s
            }
            _ => format!(
                "CORRUPTION in {}: {}",
                at(),
                self.problem.as_deref().unwrap_or("?")
            ),
        }
    }
}

fn corruption_summary(e: &quire_wal::WalError) -> EndSummary {
    let (segment, position, offset, problem) = match e {
        quire_wal::WalError::Corruption {
            segment,
            position,
            offset,
            problem,
        } => (
            Some(segment.display().to_string()),
            Some(position.0),
            Some(offset.0),
            problem.to_string(),
        ),
        other => (None, None, None, other.to_string()),
    };
    EndSummary {
        result: "corruption",
        segment,
        position,
        offset,
        bytes: None,
        problem: Some(problem),
        empty_segments_after: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flock_holder_finds_the_granted_lock_on_the_inode() {
        let text = "1: FLOCK  ADVISORY  WRITE 15321 fe:00:5636207 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 999 fe:00:77 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 42 fe:00:77 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 4711 fe:00:77 0 EOF\n";
        assert_eq!(flock_holder(text, 0xfe, 0, 5_636_207), Some(15321));
        assert_eq!(flock_holder(text, 0xfe, 0, 77), Some(4711));
        assert_eq!(flock_holder(text, 0xfe, 1, 77), None);
        assert_eq!(flock_holder(text, 0xfe, 0, 78), None);
        assert_eq!(flock_holder("garbage\n\n1: FLOCK", 0, 0, 0), None);
    }

    #[test]
    fn a_lock_held_by_this_process_is_found() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(live_holder(dir.path()), None, "no LOCK file");
        let file = std::fs::File::create(dir.path().join(LOCK_NAME)).unwrap();
        assert_eq!(live_holder(dir.path()), None, "LOCK not held");
        use std::os::fd::AsRawFd;
        // SAFETY: flock on an fd we own; no memory involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(rc, 0);
        if std::path::Path::new("/proc/locks").exists() {
            let holder = live_holder(dir.path()).expect("the lock is held");
            assert_eq!(holder.pid, std::process::id());
        }
    }

    #[test]
    fn kind_names() {
        assert_eq!(kind_name(1), "message");
        assert_eq!(kind_name(4), "epoch_start");
        assert_eq!(kind_name(0xFF), "truncate");
        assert_eq!(kind_name(77), "unknown");
    }

    #[test]
    fn a_data_dir_resolves_to_its_wal() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("wal")).unwrap();
        std::fs::write(dir.path().join("wal").join(LOCK_NAME), b"").unwrap();
        assert_eq!(resolve_dir(dir.path()).unwrap(), dir.path().join("wal"));
        std::fs::write(dir.path().join("00000000000000000000.log"), b"").unwrap();
        assert_eq!(resolve_dir(dir.path()).unwrap(), dir.path());
    }

    /// A newcomer pointed `quire wal verify` at an empty directory, `/etc` and the parent
    /// of a cluster's data directories: each was reported as a clean, empty log (exit 0).
    /// A directory holding no WAL is an error that says what was expected.
    #[test]
    fn a_directory_without_a_wal_is_refused_with_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve_dir(dir.path()).unwrap_err();
        assert!(matches!(err, WalDirError::NotAWal { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("holds no WAL"), "{message}");
        assert!(message.contains("<20 digits>.log"), "{message}");
        assert!(message.contains("it is empty"), "{message}");

        // The parent of data directories: subdirectories and files, no WAL, and a `wal`
        // subdirectory that is not a store's and holds nothing of a WAL.
        for name in ["store0", "store1", "broker1", "logs", "wal"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        for name in ["cluster.json", "ports", "store.toml", "syslog.log"] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let message = resolve_dir(dir.path()).unwrap_err().to_string();
        assert!(
            message.contains("it holds: broker1, cluster.json, logs, ports, store.toml and 4 more"),
            "{message}"
        );

        let missing = dir.path().join("nope");
        let err = resolve_dir(&missing).unwrap_err();
        assert!(matches!(err, WalDirError::Missing { .. }), "{err:?}");
        assert!(err.to_string().contains("does not exist"), "{err}");
        let err = resolve_dir(&dir.path().join("ports")).unwrap_err();
        assert!(matches!(err, WalDirError::NotADirectory { .. }), "{err:?}");
    }

    /// What a WAL directory holds before its first record (wal/src/segment.rs,
    /// promised.rs): each of these alone makes it an empty log, not an error.
    #[test]
    fn a_wal_without_records_is_an_empty_log() {
        for name in WAL_FILE_NAMES {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(name), b"").unwrap();
            assert_eq!(resolve_dir(dir.path()).unwrap(), dir.path(), "{name}");
        }
        // A store's data directory whose wal/ the node created and locked.
        let data = tempfile::tempdir().unwrap();
        std::fs::write(data.path().join(IDENTITY_FILE_NAME), b"id").unwrap();
        let err = resolve_dir(data.path()).unwrap_err();
        assert!(matches!(err, WalDirError::NoWalYet { .. }), "{err:?}");
        std::fs::create_dir(data.path().join("wal")).unwrap();
        assert_eq!(resolve_dir(data.path()).unwrap(), data.path().join("wal"));
    }
}
