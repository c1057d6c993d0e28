//! Connection profiles: named sets of client settings (`quire profile ...`), as rpk
//! profiles and nats contexts are, so that `quire produce -t T` needs no `--brokers`.
//!
//! # Where they live
//! One TOML file, `profiles.toml`, in the client's configuration directory
//! ([`config_dir`]): `$QUIRE_CONFIG_DIR` if set, else `$XDG_CONFIG_HOME/quire`, else
//! `$HOME/.config/quire`. It is rewritten whole on every change, atomically (a temporary
//! file in the same directory, fsynced, then renamed over the old one), so a reader never
//! sees half a file and a crash leaves the old one or the new one.
//!
//! ```toml
//! current = "local"
//!
//! [profiles.local]
//! brokers = ["127.0.0.1:7201", "127.0.0.1:7202"]
//! connect_timeout = "10s"
//! ```
//!
//! Every key is optional; an unknown key, a bad duration or a bad profile name is an
//! error naming the file. A missing file is the same as an empty one.
//!
//! This module owns the file and the `quire profile` commands; which setting wins when a
//! flag, a variable and a profile disagree is [`crate::settings`]'.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};

use crate::cli::FormatArgs;
use crate::output::{self, Report, Table};
use crate::settings::{Env, CONFIG_DIR_ENV};
use crate::units::{format_duration, parse_duration};

/// The file's name inside the configuration directory.
pub const PROFILES_FILE: &str = "profiles.toml";

/// Longest profile name, in bytes.
pub const PROFILE_NAME_BYTES_MAX: usize = 64;

/// Largest profiles file read, in bytes (a hand-edited file is a few hundred).
pub const PROFILES_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// The client's configuration directory and how it was found: `$QUIRE_CONFIG_DIR`, else
/// `$XDG_CONFIG_HOME/quire`, else `$HOME/.config/quire` (empty values count as unset, and
/// a relative `XDG_CONFIG_HOME` is ignored, as the XDG spec says). `None` when none of the
/// three is set.
///
/// Plain variable lookups rather than the `dirs` crate: the rule is these three lines on
/// every platform (`dirs` would pick `~/Library/Application Support` on macOS and read
/// the password database when `HOME` is unset), and tests steer it through [`Env`].
#[must_use]
pub fn config_dir(env: &Env) -> Option<PathBuf> {
    if let Some(dir) = env.path(CONFIG_DIR_ENV) {
        return Some(dir);
    }
    if let Some(xdg) = env.path("XDG_CONFIG_HOME").filter(|p| p.is_absolute()) {
        return Some(xdg.join("quire"));
    }
    env.path("HOME")
        .map(|home| home.join(".config").join("quire"))
}

/// One profile's settings. Each is optional: what a profile leaves out comes from the
/// built-in default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Broker addresses (`host:port`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub brokers: Vec<String>,
    /// How long produce, consume and bench cluster look for the master
    /// (`--connect-timeout`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration_text"
    )]
    pub connect_timeout: Option<Duration>,
}

/// The whole file: the profiles by name and which one is current.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfilesFile {
    /// The profile used when neither `--profile` nor `QUIRE_PROFILE` names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// Every profile, by name.
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
}

/// Durations in the file are written as the command line writes them (`"30s"`).
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::units::{format_duration, parse_duration};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(Some)
            .map_err(|e| serde::de::Error::custom(format!("{text:?}: {e}")))
    }
}

/// Checks a profile name: 1 to [`PROFILE_NAME_BYTES_MAX`] bytes of ASCII letters, digits,
/// `-`, `_` and `.`.
///
/// # Errors
/// Any other name, saying why.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name.len() > PROFILE_NAME_BYTES_MAX {
        bail!("profile name {name:?} must be 1 to {PROFILE_NAME_BYTES_MAX} bytes long");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        bail!("profile name {name:?} has {c:?}: use letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

/// The profiles file at one path: reading it and replacing it atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileStore {
    path: PathBuf,
}

impl ProfileStore {
    /// The store at `dir/profiles.toml`.
    #[must_use]
    pub fn in_dir(dir: &Path) -> ProfileStore {
        ProfileStore {
            path: dir.join(PROFILES_FILE),
        }
    }

    /// The store in the configuration directory `env` describes ([`config_dir`]).
    ///
    /// # Errors
    /// None of `QUIRE_CONFIG_DIR`, `XDG_CONFIG_HOME` and `HOME` is set.
    pub fn from_env(env: &Env) -> anyhow::Result<ProfileStore> {
        match config_dir(env) {
            Some(dir) => Ok(ProfileStore::in_dir(&dir)),
            None => bail!(
                "no configuration directory for profiles: set {CONFIG_DIR_ENV} (or \
                 XDG_CONFIG_HOME or HOME)"
            ),
        }
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file; a missing file reads as empty.
    ///
    /// # Errors
    /// The file cannot be read, is larger than [`PROFILES_FILE_BYTES_MAX`], is not valid
    /// TOML of the shape in the module docs, names a profile with a bad name, or its
    /// `current` names no profile it holds. Every error names the file.
    pub fn load(&self) -> anyhow::Result<ProfilesFile> {
        let path = &self.path;
        let bytes = match fs::metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ProfilesFile::default()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            Ok(meta) if meta.len() > PROFILES_FILE_BYTES_MAX => bail!(
                "{} is {} bytes, larger than a profiles file can be ({PROFILES_FILE_BYTES_MAX})",
                path.display(),
                meta.len()
            ),
            Ok(_) => fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        };
        let text = String::from_utf8(bytes)
            .map_err(|_| anyhow::anyhow!("{} is not UTF-8 text", path.display()))?;
        let file: ProfilesFile = toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "{} is not a valid profiles file (fix or delete it): {}",
                path.display(),
                e.message()
            )
        })?;
        for name in file.profiles.keys() {
            check_name(name).with_context(|| format!("in {}", path.display()))?;
        }
        if let Some(current) = &file.current {
            if !file.profiles.contains_key(current) {
                bail!(
                    "{}: current = {current:?} names no profile in the file",
                    path.display()
                );
            }
        }
        Ok(file)
    }

    /// Replaces the file with `file`, atomically: writes `profiles.toml.tmp.PID` in the
    /// same directory (created if missing), fsyncs it, renames it over the old file and
    /// fsyncs the directory. The old file is intact until the rename.
    ///
    /// # Errors
    /// The directory cannot be created or written; the temporary file is removed.
    pub fn save(&self, file: &ProfilesFile) -> anyhow::Result<()> {
        let path = &self.path;
        let dir = path
            .parent()
            .expect("invariant: the path is DIR/profiles.toml");
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let text = toml::to_string(file).context("writing the profiles as TOML")?;
        let temp = dir.join(format!("{PROFILES_FILE}.tmp.{}", std::process::id()));
        let written = (|| -> io::Result<()> {
            let mut f = File::create(&temp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            fs::rename(&temp, path)?;
            File::open(dir)?.sync_all()
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&temp);
            return Err(e).with_context(|| format!("writing {}", path.display()));
        }
        Ok(())
    }

    /// Loads the file, lets `change` edit it, and saves it.
    ///
    /// # Errors
    /// As [`ProfileStore::load`], `change` and [`ProfileStore::save`].
    pub fn update<T>(
        &self,
        change: impl FnOnce(&mut ProfilesFile) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let mut file = self.load()?;
        let out = change(&mut file)?;
        self.save(&file)?;
        Ok(out)
    }
}

/// `quire profile ...`
#[derive(Debug, Subcommand)]
pub enum ProfileCommand {
    /// Save a profile: broker addresses and other connection settings under a name. The
    /// first profile becomes the current one; --use makes any one current.
    Create(CreateArgs),

    /// Make NAME the current profile: the one client commands use when neither --profile
    /// nor QUIRE_PROFILE names one.
    Use(NameArgs),

    /// List the profiles; the current one is marked with `*`.
    List(ListArgs),

    /// Print one profile's settings: NAME, else the one --profile, QUIRE_PROFILE or the
    /// file's `current` chooses.
    Show(ShowArgs),

    /// Delete a profile (if it was the current one, none is current afterwards).
    Delete(NameArgs),
}

/// Arguments of `quire profile create`.
#[derive(Debug, Clone, Args)]
pub struct CreateArgs {
    /// The profile's name: letters, digits, '-', '_', '.'.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// Broker addresses (`host:port`), comma separated.
    #[arg(
        short = 'b',
        long,
        value_name = "ADDR,...",
        value_delimiter = ',',
        required = true
    )]
    pub brokers: Vec<String>,

    /// How long produce, consume and bench cluster keep trying to reach the master.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub connect_timeout: Option<Duration>,

    /// Replace a profile of that name instead of refusing.
    #[arg(long)]
    pub force: bool,

    /// Make it the current profile.
    #[arg(long = "use")]
    pub make_current: bool,
}

/// A profile name argument.
#[derive(Debug, Clone, Args)]
pub struct NameArgs {
    /// The profile's name.
    #[arg(value_name = "NAME")]
    pub name: String,
}

/// Arguments of `quire profile list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub format: FormatArgs,
}

/// Arguments of `quire profile show`.
#[derive(Debug, Clone, Args)]
pub struct ShowArgs {
    /// The profile's name; default: the one client commands would use.
    #[arg(value_name = "NAME")]
    pub name: Option<String>,

    /// The profile to show when NAME is not given (as client commands take it).
    #[arg(long, value_name = "NAME", conflicts_with = "name")]
    pub profile: Option<String>,

    #[command(flatten)]
    pub format: FormatArgs,
}

/// One profile as `list` and `show` print it.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileView {
    /// Its name.
    pub name: String,
    /// Whether it is the file's current profile.
    pub current: bool,
    /// Broker addresses.
    pub brokers: Vec<String>,
    /// `--connect-timeout` it sets, in seconds; `null` when it sets none.
    pub connect_timeout_s: Option<f64>,
}

impl ProfileView {
    fn new(name: &str, profile: &Profile, current: bool) -> ProfileView {
        ProfileView {
            name: name.to_owned(),
            current,
            brokers: profile.brokers.clone(),
            connect_timeout_s: profile.connect_timeout.map(|d| d.as_secs_f64()),
        }
    }

    fn connect_timeout_text(&self) -> String {
        self.connect_timeout_s
            .map(|s| format_duration(Duration::from_secs_f64(s)))
            .unwrap_or_else(|| "-".to_owned())
    }
}

/// What `quire profile list` prints. JSON: `{"file":…,"current":"local"|null,
/// "profiles":[{"name":…,"current":true,"brokers":[…],"connect_timeout_s":10.0|null}]}`.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileList {
    /// The profiles file.
    pub file: PathBuf,
    /// The current profile's name.
    pub current: Option<String>,
    /// Every profile, by name.
    pub profiles: Vec<ProfileView>,
}

impl Report for ProfileList {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        if self.profiles.is_empty() {
            return writeln!(
                out,
                "no profiles in {} (create one: quire profile create NAME --brokers ADDR,...)",
                self.file.display()
            );
        }
        let width = self
            .profiles
            .iter()
            .map(|p| p.name.len())
            .max()
            .unwrap_or(0);
        for p in &self.profiles {
            let mark = if p.current { '*' } else { ' ' };
            let brokers = if p.brokers.is_empty() {
                "-".to_owned()
            } else {
                p.brokers.join(",")
            };
            writeln!(
                out,
                "{mark} {:<width$}  brokers {brokers}  connect-timeout {}",
                p.name,
                p.connect_timeout_text()
            )?;
        }
        Ok(())
    }
}

/// What `quire profile show` prints: the profile and its file. JSON: the fields of a
/// `list` entry plus `file`.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileShow {
    /// The profiles file.
    pub file: PathBuf,
    /// The profile.
    #[serde(flatten)]
    pub profile: ProfileView,
}

impl Report for ProfileShow {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let p = &self.profile;
        Table::new()
            .row(
                "profile",
                format!("{}{}", p.name, if p.current { " (current)" } else { "" }),
            )
            .row("file", self.file.display().to_string())
            .row("brokers", p.brokers.join(","))
            .row("connect-timeout", p.connect_timeout_text())
            .write(out)
    }
}

/// Runs `quire profile ...`, printing to `out` (confirmations and results).
///
/// # Errors
/// No configuration directory; the file is unreadable or corrupt; the profile named does
/// not exist (or, for `create` without `--force`, already exists); writing failed.
pub fn run(command: &ProfileCommand, env: &Env, out: &mut dyn Write) -> anyhow::Result<()> {
    let store = ProfileStore::from_env(env)?;
    let file_name = store.path().display().to_string();
    match command {
        ProfileCommand::Create(args) => {
            check_name(&args.name)?;
            let brokers: Vec<String> = crate::settings::clean_addrs(&args.brokers);
            if brokers.is_empty() {
                bail!("--brokers names no address");
            }
            let current = store.update(|file| {
                if file.profiles.contains_key(&args.name) && !args.force {
                    bail!(
                        "profile {:?} already exists in {file_name} (--force replaces it)",
                        args.name
                    );
                }
                file.profiles.insert(
                    args.name.clone(),
                    Profile {
                        brokers,
                        connect_timeout: args.connect_timeout,
                    },
                );
                if args.make_current || file.current.is_none() {
                    file.current = Some(args.name.clone());
                }
                Ok(file.current.as_deref() == Some(args.name.as_str()))
            })?;
            writeln!(
                out,
                "profile {} saved in {file_name}{}",
                args.name,
                if current { " (current)" } else { "" }
            )?;
        }
        ProfileCommand::Use(args) => {
            store.update(|file| {
                if !file.profiles.contains_key(&args.name) {
                    bail!("{}", not_found(&args.name, &file_name, file));
                }
                file.current = Some(args.name.clone());
                Ok(())
            })?;
            writeln!(out, "profile {} is now current", args.name)?;
        }
        ProfileCommand::Delete(args) => {
            let was_current = store.update(|file| {
                if file.profiles.remove(&args.name).is_none() {
                    bail!("{}", not_found(&args.name, &file_name, file));
                }
                let was_current = file.current.as_deref() == Some(args.name.as_str());
                if was_current {
                    file.current = None;
                }
                Ok(was_current)
            })?;
            writeln!(
                out,
                "profile {} deleted from {file_name}{}",
                args.name,
                if was_current {
                    "; no profile is current now"
                } else {
                    ""
                }
            )?;
        }
        ProfileCommand::List(args) => {
            let file = store.load()?;
            let list = ProfileList {
                file: store.path().to_owned(),
                current: file.current.clone(),
                profiles: file
                    .profiles
                    .iter()
                    .map(|(name, p)| {
                        ProfileView::new(name, p, file.current.as_deref() == Some(name))
                    })
                    .collect(),
            };
            output::emit(&list, args.format.format, &mut &mut *out)?;
        }
        ProfileCommand::Show(args) => {
            let file = store.load()?;
            let (name, how) = match (&args.name, &args.profile) {
                (Some(name), _) => (name.clone(), "NAME"),
                (None, Some(name)) => (name.clone(), "--profile"),
                (None, None) => match crate::settings::chosen_profile(None, env)? {
                    Some((name, how)) => (name, how),
                    None => match &file.current {
                        Some(name) => (name.clone(), "the current profile"),
                        None => bail!(
                            "no profile chosen: none is current in {file_name} and \
                             QUIRE_PROFILE is not set"
                        ),
                    },
                },
            };
            let Some(profile) = file.profiles.get(&name) else {
                bail!("{} (chosen by {how})", not_found(&name, &file_name, &file));
            };
            let show = ProfileShow {
                file: store.path().to_owned(),
                profile: ProfileView::new(&name, profile, file.current.as_ref() == Some(&name)),
            };
            output::emit(&show, args.format.format, &mut &mut *out)?;
        }
    }
    Ok(())
}

/// "profile X is not in FILE (it holds: a, b)".
#[must_use]
pub fn not_found(name: &str, file_name: &str, file: &ProfilesFile) -> String {
    if file.profiles.is_empty() {
        format!("profile {name:?} is not in {file_name} (it holds no profiles)")
    } else {
        let names: Vec<&str> = file.profiles.keys().map(String::as_str).collect();
        format!(
            "profile {name:?} is not in {file_name} (it holds: {})",
            names.join(", ")
        )
    }
}

/// What [`save_cluster_profile`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedProfile {
    /// The profiles file written.
    pub file: PathBuf,
    /// Whether a profile of that name existed before (its brokers were replaced, its other
    /// settings kept).
    pub replaced: bool,
}

/// Writes profile `name` with `brokers` (keeping its other settings if it exists) and
/// makes it current: what `quire cluster up --profile NAME` does.
///
/// # Errors
/// A bad name; as [`ProfileStore::update`].
pub fn save_cluster_profile(
    name: &str,
    brokers: &[String],
    env: &Env,
) -> anyhow::Result<SavedProfile> {
    check_name(name)?;
    let store = ProfileStore::from_env(env)?;
    let replaced = store.update(|file| {
        let profile = file.profiles.entry(name.to_owned()).or_default();
        let replaced = !profile.brokers.is_empty() || profile.connect_timeout.is_some();
        profile.brokers = brokers.to_vec();
        file.current = Some(name.to_owned());
        Ok(replaced)
    })?;
    Ok(SavedProfile {
        file: store.path().to_owned(),
        replaced,
    })
}

/// The profile name `quire cluster up` proposes when asked to save none.
pub const CLUSTER_PROFILE_DEFAULT: &str = "local";

/// How long the `quire cluster up` question waits between checks for Ctrl-C, in
/// milliseconds.
const PROMPT_POLL_MS: i32 = 200;

/// After `quire cluster up` started a cluster: with `--profile NAME` (`name`), writes that
/// profile (see [`save_cluster_profile`]); without it, asks on the terminal whether to
/// write profile [`CLUSTER_PROFILE_DEFAULT`] (default no) when stdin is one, and otherwise
/// (CI, a pipe) only prints the command that would. Never reads stdin that is not a
/// terminal; Ctrl-C during the question counts as no.
///
/// # Errors
/// Writing the profile or `out` failed. A failure to save a profile the user was only
/// offered is reported on `out`, not returned: the cluster is up either way.
pub fn offer_cluster_profile(
    name: Option<&str>,
    brokers: &[String],
    env: &Env,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if let Some(name) = name {
        let saved = save_cluster_profile(name, brokers, env)
            .with_context(|| format!("writing profile {name} for this cluster"))?;
        writeln!(
            out,
            "profile {name} {} in {} and made current: quire commands now reach this cluster \
             without --brokers",
            if saved.replaced { "updated" } else { "written" },
            saved.file.display()
        )?;
        return Ok(());
    }
    let name = CLUSTER_PROFILE_DEFAULT;
    let command = format!(
        "quire profile create {name} --brokers {} --use --force",
        brokers.join(",")
    );
    if !io::stdin().is_terminal() {
        writeln!(out, "to save these brokers as a profile: {command}")?;
        return Ok(());
    }
    write!(
        out,
        "save these brokers as profile {name:?} and make it current? [y/N] "
    )?;
    out.flush()?;
    match read_answer()? {
        Some(answer) if matches!(answer.trim(), "y" | "Y" | "yes" | "Yes" | "YES") => {
            match save_cluster_profile(name, brokers, env) {
                Ok(saved) => writeln!(
                    out,
                    "profile {name} {} in {}",
                    if saved.replaced { "updated" } else { "written" },
                    saved.file.display()
                )?,
                Err(e) => writeln!(out, "warning: profile not saved: {e:#}")?,
            }
        }
        _ => writeln!(out, "no profile written (later: {command})")?,
    }
    Ok(())
}

/// One line from the terminal on stdin, or `None` at end of input or after Ctrl-C (the
/// wait polls [`crate::interrupt::is_interrupted`] every [`PROMPT_POLL_MS`]).
fn read_answer() -> anyhow::Result<Option<String>> {
    loop {
        if crate::interrupt::is_interrupted() {
            return Ok(None);
        }
        let mut fd = libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `fd` is one valid pollfd owned by this frame; the count is 1.
        let rc = unsafe { libc::poll(&mut fd, 1, PROMPT_POLL_MS) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("waiting for an answer on stdin");
        }
        if rc > 0 {
            let mut line = String::new();
            let n = io::stdin()
                .read_line(&mut line)
                .context("reading an answer from stdin")?;
            return Ok((n > 0).then_some(line));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_in(dir: &Path) -> Env {
        Env::from_pairs([(CONFIG_DIR_ENV, dir.to_str().unwrap())])
    }

    fn run_line(env: &Env, line: &str) -> anyhow::Result<String> {
        use clap::Parser;
        let words = std::iter::once("quire").chain(line.split_whitespace());
        let cli = crate::cli::Cli::try_parse_from(words)?;
        let crate::cli::Command::Profile(command) = cli.command else {
            panic!("not a profile command: {line}");
        };
        let mut out = Vec::new();
        run(&command, env, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn the_config_dir_follows_quire_then_xdg_then_home() {
        let env = |pairs: &[(&str, &str)]| config_dir(&Env::from_pairs(pairs.iter().copied()));
        let all = [
            ("QUIRE_CONFIG_DIR", "/q"),
            ("XDG_CONFIG_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(env(&all), Some(PathBuf::from("/q")));
        assert_eq!(env(&all[1..]), Some(PathBuf::from("/x/quire")));
        assert_eq!(env(&all[2..]), Some(PathBuf::from("/h/.config/quire")));
        assert_eq!(
            env(&[
                ("QUIRE_CONFIG_DIR", ""),
                ("XDG_CONFIG_HOME", "rel"),
                ("HOME", "/h")
            ]),
            Some(PathBuf::from("/h/.config/quire")),
            "empty and relative values are ignored"
        );
        assert_eq!(env(&[]), None);
    }

    #[test]
    fn create_use_list_show_and_delete() {
        let dir = tempfile::tempdir().unwrap();
        let env = env_in(dir.path());
        let out = run_line(&env, "profile create a -b 127.0.0.1:1,127.0.0.1:2").unwrap();
        assert!(
            out.contains("profile a saved") && out.contains("(current)"),
            "{out}"
        );
        let out = run_line(&env, "profile create b --brokers h:3 --connect-timeout 5s").unwrap();
        assert!(
            !out.contains("(current)"),
            "the first profile stays current: {out}"
        );

        let list = run_line(&env, "profile list").unwrap();
        assert!(
            list.contains("* a  brokers 127.0.0.1:1,127.0.0.1:2"),
            "{list}"
        );
        assert!(
            list.contains("  b  brokers h:3  connect-timeout 5s"),
            "{list}"
        );

        run_line(&env, "profile use b").unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&run_line(&env, "profile list --format json").unwrap()).unwrap();
        assert_eq!(json["current"], "b");
        assert_eq!(json["profiles"][0]["name"], "a");
        assert_eq!(json["profiles"][0]["current"], false);
        assert_eq!(json["profiles"][1]["current"], true);
        assert_eq!(json["profiles"][1]["connect_timeout_s"], 5.0);
        assert_eq!(json["profiles"][1]["brokers"][0], "h:3");

        let show = run_line(&env, "profile show").unwrap();
        assert!(
            show.contains("b (current)") && show.contains("h:3"),
            "{show}"
        );
        let show = run_line(&env, "profile show a -f json").unwrap();
        assert!(
            show.contains("\"brokers\":[\"127.0.0.1:1\",\"127.0.0.1:2\"]"),
            "{show}"
        );

        let err = run_line(&env, "profile create a -b x:1")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("already exists") && err.contains("--force"),
            "{err}"
        );
        run_line(&env, "profile create a -b x:1 --force").unwrap();

        let out = run_line(&env, "profile delete b").unwrap();
        assert!(out.contains("no profile is current now"), "{out}");
        let err = run_line(&env, "profile use b").unwrap_err().to_string();
        assert!(
            err.contains("\"b\" is not in") && err.contains("it holds: a"),
            "{err}"
        );
        let file = ProfileStore::in_dir(dir.path()).load().unwrap();
        assert_eq!(file.current, None);
        assert_eq!(file.profiles["a"].brokers, vec!["x:1".to_owned()]);
    }

    #[test]
    fn a_bad_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let env = env_in(dir.path());
        let err = run_line(&env, "profile create a/b -b h:1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("'/'"), "{err}");
        assert!(check_name(&"x".repeat(PROFILE_NAME_BYTES_MAX)).is_ok());
        assert!(check_name(&"x".repeat(PROFILE_NAME_BYTES_MAX + 1)).is_err());
        assert!(check_name("").is_err());
    }

    #[test]
    fn a_save_replaces_the_file_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = ProfileStore::in_dir(&dir.path().join("made/on/demand"));
        // A temporary file left by a write that crashed before its rename is not read
        // and is overwritten by the next save.
        fs::create_dir_all(store.path().parent().unwrap()).unwrap();
        let stale = store
            .path()
            .with_file_name(format!("{PROFILES_FILE}.tmp.{}", std::process::id()));
        fs::write(&stale, "garbage = [").unwrap();
        assert_eq!(store.load().unwrap(), ProfilesFile::default());

        let mut file = ProfilesFile::default();
        file.profiles.insert(
            "p".into(),
            Profile {
                brokers: vec!["h:1".into()],
                connect_timeout: Some(Duration::from_millis(1500)),
            },
        );
        file.current = Some("p".into());
        store.save(&file).unwrap();
        assert_eq!(store.load().unwrap(), file);
        let text = fs::read_to_string(store.path()).unwrap();
        assert!(text.contains("connect_timeout = \"1500ms\""), "{text}");
        let names: Vec<_> = fs::read_dir(store.path().parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            names,
            vec![PROFILES_FILE.to_owned()],
            "no temporary file left"
        );
    }

    #[test]
    fn a_corrupt_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = ProfileStore::in_dir(dir.path());
        let path = store.path().display().to_string();
        for (text, says) in [
            ("[profiles.a\nbrokers = 1", "not a valid profiles file"),
            ("[profiles.a]\nbrokrs = [\"h:1\"]\n", "brokrs"),
            (
                "[profiles.a]\nconnect_timeout = \"5 parsecs\"\n",
                "5 parsecs",
            ),
            ("current = \"x\"\n", "names no profile"),
            ("[profiles.\"a b\"]\n", "' '"),
        ] {
            fs::write(store.path(), text).unwrap();
            let err = format!("{:#}", store.load().unwrap_err());
            assert!(err.contains(&path), "{text:?}: {err}");
            assert!(err.contains(says), "{text:?}: {err}");
            // A command on a corrupt file fails the same way and leaves it as it was.
            let err = run_line(&env_in(dir.path()), "profile use a").unwrap_err();
            assert!(format!("{err:#}").contains(&path), "{err:#}");
            assert_eq!(fs::read_to_string(store.path()).unwrap(), text);
        }
        fs::write(store.path(), [0xff, 0xfe]).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains(&path) && err.contains("UTF-8"), "{err}");
    }

    #[test]
    fn a_cluster_profile_replaces_the_brokers_only_and_becomes_current() {
        let dir = tempfile::tempdir().unwrap();
        let env = env_in(dir.path());
        run_line(&env, "profile create other -b o:1").unwrap();
        run_line(&env, "profile create local -b old:1 --connect-timeout 3s").unwrap();
        let saved = save_cluster_profile("local", &["new:1".into(), "new:2".into()], &env).unwrap();
        assert!(saved.replaced);
        let file = ProfileStore::in_dir(dir.path()).load().unwrap();
        assert_eq!(file.current.as_deref(), Some("local"));
        assert_eq!(file.profiles["local"].brokers, vec!["new:1", "new:2"]);
        assert_eq!(
            file.profiles["local"].connect_timeout,
            Some(Duration::from_secs(3))
        );
        assert_eq!(file.profiles["other"].brokers, vec!["o:1"]);

        let mut out = Vec::new();
        offer_cluster_profile(Some("fresh"), &["f:1".into()], &env, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains("profile fresh written"), "{out}");
    }
}
