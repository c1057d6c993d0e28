//! Layered server settings: one name per setting, four places to give it, one rule for
//! which wins. Shared by `quire-node run` and `quire-broker run`, which each describe their
//! settings as a [`Schema`] and read them with [`resolve`].
//!
//! The convention (docs/operations.md has the table of every setting):
//! - A setting has one snake_case **key**, unique within its program. In the TOML file it
//!   is `key = ...` (quire-node keeps some keys in tables: `[limits] connections_max`); on
//!   the command line `--key` with `-` for `_`; in the environment `PREFIX_KEY`, upper-cased,
//!   with the program's prefix (`QUIRE_NODE_`, `QUIRE_BROKER_`).
//! - Precedence: flag > environment > file > default. The file itself is `--config` or
//!   `PREFIX_CONFIG`.
//! - Durations take units (`50ms`, `10s`, `2m`; [`crate::units::parse_duration`]). A bare
//!   number other than `0` is refused for a server duration: the old `*_ms` keys took bare
//!   milliseconds, so `heartbeat = 100` is more likely a half-renamed old key than 100 s.
//!   Sizes take units too (`64KiB`; a bare number is bytes; [`crate::units::parse_size`]).
//! - A setting renamed when units arrived keeps its old spelling (`heartbeat_ms = 100`,
//!   `--heartbeat-ms 100`: a bare number in the old unit) for one release; each use adds a
//!   deprecation warning to [`Resolved::warnings`] naming the new spelling. Old and new
//!   spelling of one setting in one place is an error.
//! - Anything unknown is an error that names it: a TOML key, a `PREFIX_*` variable (with
//!   the closest known name), a value that does not parse (with the setting, where it came
//!   from and the accepted form).
//!
//! This module owns the reading, merging and printing of settings; it does not know what
//! any setting means — each program checks ranges on the [`Resolved`] values and reports
//! a bad one with [`Resolved::invalid`].

use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::units::{format_duration, format_size, parse_duration, parse_size};

/// Where a setting's value came from, lowest precedence first.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// The built-in default (or unset).
    Default,
    /// The TOML file at this path.
    File(PathBuf),
    /// This environment variable.
    Env(String),
    /// This command-line flag (`--heartbeat`).
    Flag(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(path) => write!(f, "file {}", path.display()),
            Source::Env(var) => write!(f, "env {var}"),
            Source::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// The finest step a duration setting holds; a value between two steps is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    /// Whole milliseconds (the old spelling `KEY_ms` took milliseconds).
    Millis,
    /// Whole microseconds (the old spelling `KEY_us` took microseconds).
    Micros,
}

impl Granularity {
    fn nanos(self) -> u128 {
        match self {
            Granularity::Millis => 1_000_000,
            Granularity::Micros => 1_000,
        }
    }

    fn old_suffix(self) -> &'static str {
        match self {
            Granularity::Millis => "milliseconds",
            Granularity::Micros => "microseconds",
        }
    }
}

/// What a setting holds, and so how its text is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A duration with its unit (`50ms`), a whole number of the given step.
    Duration(Granularity),
    /// A byte size (`64KiB`, `4096`).
    Size,
    /// A whole number with no unit (connections, frames, an id).
    Count,
    /// Free text: an address, a path.
    Text,
    /// A list of texts: a TOML array, or comma separated in a flag or variable.
    List,
    /// One of these words.
    Choice(&'static [&'static str]),
}

impl Kind {
    /// The accepted form, for error messages and docs.
    #[must_use]
    pub fn accepted(self) -> String {
        match self {
            Kind::Duration(_) => "a duration like 50ms, 10s, 2m".to_owned(),
            Kind::Size => "a size like 4096, 64KiB, 1MiB (a bare number is bytes)".to_owned(),
            Kind::Count => "a whole number".to_owned(),
            Kind::Text => "a text".to_owned(),
            Kind::List => "a list (a TOML array, or comma separated)".to_owned(),
            Kind::Choice(words) => format!("one of {}", words.join(", ")),
        }
    }

    /// The placeholder in `--help` (`DURATION`, `SIZE`, ...).
    #[must_use]
    pub fn value_name(self) -> &'static str {
        match self {
            Kind::Duration(_) => "DURATION",
            Kind::Size => "SIZE",
            Kind::Count => "N",
            Kind::Text => "TEXT",
            Kind::List => "A,B,...",
            Kind::Choice(_) => "WORD",
        }
    }
}

/// A resolved setting's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// [`Kind::Duration`].
    Duration(Duration),
    /// [`Kind::Size`], in bytes.
    Size(u64),
    /// [`Kind::Count`].
    Count(u64),
    /// [`Kind::Text`] and [`Kind::Choice`].
    Text(String),
    /// [`Kind::List`].
    List(Vec<String>),
}

impl fmt::Display for Value {
    /// The spelling the setting reads back (`100ms`, `64MiB`, `a:1,b:2`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Duration(d) => f.write_str(&format_duration(*d)),
            Value::Size(b) => f.write_str(&format_size(*b)),
            Value::Count(n) => write!(f, "{n}"),
            Value::Text(t) => f.write_str(t),
            Value::List(items) => f.write_str(&items.join(",")),
        }
    }
}

/// One setting of a program.
#[derive(Clone, Debug)]
pub struct Setting {
    /// The key (snake_case), unique within the program.
    pub key: &'static str,
    /// The TOML table the key lives in (`limits`), or `None` for the top level.
    pub table: Option<&'static str>,
    /// How its value is read.
    pub kind: Kind,
    /// The default, or `None` for unset.
    pub default: Option<Value>,
    /// One line for `--help` and the docs.
    pub help: &'static str,
    /// The spelling deprecated for one release (`heartbeat_ms`): a bare number in the
    /// unit of the [`Granularity`] of a [`Kind::Duration`].
    pub old_key: Option<&'static str>,
}

impl Setting {
    /// A setting with no default and no old spelling.
    #[must_use]
    pub fn new(key: &'static str, kind: Kind, help: &'static str) -> Setting {
        Setting {
            key,
            table: None,
            kind,
            default: None,
            help,
            old_key: None,
        }
    }

    /// With a default.
    #[must_use]
    pub fn default_value(mut self, value: Value) -> Setting {
        self.default = Some(value);
        self
    }

    /// Inside a TOML table.
    #[must_use]
    pub fn in_table(mut self, table: &'static str) -> Setting {
        self.table = Some(table);
        self
    }

    /// With an old spelling still accepted.
    #[must_use]
    pub fn old(mut self, old_key: &'static str) -> Setting {
        self.old_key = Some(old_key);
        self
    }

    /// Where the key sits in the TOML file (`limits.connections_max`, `listen`).
    #[must_use]
    pub fn toml_path(&self) -> String {
        match self.table {
            Some(t) => format!("{t}.{}", self.key),
            None => self.key.to_owned(),
        }
    }
}

/// `heartbeat_ms` → `--heartbeat-ms`.
#[must_use]
pub fn flag_name(key: &str) -> String {
    format!("--{}", key.replace('_', "-"))
}

/// A program's settings: its name, its environment prefix, and every setting.
#[derive(Clone, Debug)]
pub struct Schema {
    /// `quire-node`.
    pub program: &'static str,
    /// `QUIRE_NODE_`.
    pub env_prefix: &'static str,
    /// Every setting, in the order `--print-config` shows them.
    pub settings: Vec<Setting>,
}

impl Schema {
    /// The variable for `key` (`QUIRE_NODE_LISTEN`).
    #[must_use]
    pub fn env_name(&self, key: &str) -> String {
        format!("{}{}", self.env_prefix, key.to_ascii_uppercase())
    }

    /// The variable naming the config file (`QUIRE_NODE_CONFIG`).
    #[must_use]
    pub fn config_env(&self) -> String {
        self.env_name("config")
    }

    fn setting(&self, key: &str) -> Option<&Setting> {
        self.settings.iter().find(|s| s.key == key)
    }
}

/// A program's setting schema, as a type: what [`SettingFlags`] needs to declare the flags.
pub trait HasSchema {
    /// The schema.
    fn schema() -> Schema;
}

/// Why the settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The config file could not be read or is not TOML.
    #[error("config file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A key in the config file that is no setting.
    #[error("config file {path}: unknown setting `{key}`{hint}")]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key as written (`limits.conections_max`).
        key: String,
        /// `" (did you mean `…`?)"`, or where it belongs, or empty.
        hint: String,
    },
    /// A `PREFIX_*` variable that names no setting.
    #[error("unknown environment variable {var}{hint}")]
    UnknownEnv {
        /// The variable.
        var: String,
        /// `" (did you mean …?)"` or empty.
        hint: String,
    },
    /// A value that does not read as its setting's kind.
    #[error("{key} = {value:?} ({source_}) is not {accepted}")]
    BadValue {
        /// The setting (new spelling, or the old one if that was used).
        key: String,
        /// Where it came from.
        source_: Source,
        /// The value as given.
        value: String,
        /// The accepted form, and why the value is not (`"a duration like 50ms, 10s, 2m:
        /// …"`).
        accepted: String,
    },
    /// Old and new spelling of one setting in one place.
    #[error("{key} and its old spelling {old} are both given ({source_}); keep only {key}")]
    Both {
        /// The new spelling.
        key: String,
        /// The old spelling.
        old: String,
        /// Where.
        source_: Source,
    },
    /// A value that reads but is out of range or inconsistent (reported by the program).
    #[error("{key} = {value} ({source_}): {message}")]
    Invalid {
        /// The setting.
        key: String,
        /// Its value, as it reads back.
        value: String,
        /// Where it came from.
        source_: Source,
        /// What is wrong and what is accepted.
        message: String,
    },
    /// A required setting with no value anywhere.
    #[error("{key} is required: pass {flag}, set {var}, or set {toml} in the config file")]
    Missing {
        /// The setting.
        key: String,
        /// Its flag.
        flag: String,
        /// Its variable.
        var: String,
        /// Its place in the file.
        toml: String,
    },
}

/// A setting's value as found, before it is read as its kind.
#[derive(Clone, Debug)]
enum Raw {
    Text(String),
    Integer(i64),
    List(Vec<String>),
    Other(String),
}

impl Raw {
    fn display(&self) -> String {
        match self {
            Raw::Text(t) | Raw::Other(t) => t.clone(),
            Raw::Integer(i) => i.to_string(),
            Raw::List(items) => items.join(","),
        }
    }

    fn from_toml(v: &toml::Value) -> Raw {
        match v {
            toml::Value::String(s) => Raw::Text(s.clone()),
            toml::Value::Integer(i) => Raw::Integer(*i),
            toml::Value::Array(items) => {
                let mut texts = Vec::with_capacity(items.len());
                for item in items {
                    match item {
                        toml::Value::String(s) => texts.push(s.clone()),
                        _ => return Raw::Other(v.to_string()),
                    }
                }
                Raw::List(texts)
            }
            other => Raw::Other(other.to_string()),
        }
    }
}

/// One value given in one place.
#[derive(Clone, Debug)]
struct Given {
    key: &'static str,
    old: bool,
    raw: Raw,
    source: Source,
}

/// The settings given as flags, collected by clap: embed with `#[command(flatten)]` in a
/// program's `run` arguments. Every setting of `S`'s schema becomes a `--key` flag taking
/// one value, and every old spelling a hidden flag.
#[derive(Debug)]
pub struct SettingFlags<S> {
    given: Vec<(&'static str, bool, String)>,
    schema: PhantomData<S>,
}

impl<S> Clone for SettingFlags<S> {
    fn clone(&self) -> Self {
        SettingFlags {
            given: self.given.clone(),
            schema: PhantomData,
        }
    }
}

impl<S> Default for SettingFlags<S> {
    fn default() -> Self {
        SettingFlags {
            given: Vec::new(),
            schema: PhantomData,
        }
    }
}

impl<S: HasSchema> SettingFlags<S> {
    /// Flags as if given on the command line: `(key, value)` pairs, a key being a setting's
    /// key or an old spelling (for tests and embedding).
    ///
    /// # Panics
    /// A key the schema does not know (a bug in the caller).
    #[must_use]
    pub fn from_pairs(pairs: &[(&str, &str)]) -> SettingFlags<S> {
        let schema = S::schema();
        let given = pairs
            .iter()
            .map(|(k, v)| {
                let s = schema
                    .settings
                    .iter()
                    .find(|s| s.key == *k || s.old_key == Some(*k))
                    .unwrap_or_else(|| panic!("{k} is no setting of {}", schema.program));
                (s.key, s.key != *k, (*v).to_owned())
            })
            .collect();
        SettingFlags {
            given,
            schema: PhantomData,
        }
    }

    /// True if no setting was given as a flag.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.given.is_empty()
    }
}

fn arg_id(key: &'static str, old: bool) -> String {
    if old {
        format!("setting-old-{key}")
    } else {
        format!("setting-{key}")
    }
}

impl<S: HasSchema> clap::FromArgMatches for SettingFlags<S> {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = SettingFlags::default();
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        for s in S::schema().settings {
            for (old, present) in [(false, true), (true, s.old_key.is_some())] {
                if !present {
                    continue;
                }
                if let Some(v) = matches
                    .try_get_one::<String>(&arg_id(s.key, old))
                    .ok()
                    .flatten()
                {
                    self.given.retain(|(k, o, _)| !(*k == s.key && *o == old));
                    self.given.push((s.key, old, v.clone()));
                }
            }
        }
        Ok(())
    }
}

impl<S: HasSchema> clap::Args for SettingFlags<S> {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        let schema = S::schema();
        for s in &schema.settings {
            let default = match &s.default {
                Some(v) => format!(" [default: {v}]"),
                None => String::new(),
            };
            cmd = cmd.arg(
                clap::Arg::new(arg_id(s.key, false))
                    .long(s.key.replace('_', "-"))
                    .value_name(s.kind.value_name())
                    .value_parser(clap::value_parser!(String))
                    .action(clap::ArgAction::Set)
                    .help(format!(
                        "{}{default} [env: {}]",
                        s.help,
                        schema.env_name(s.key)
                    )),
            );
            if let Some(old) = s.old_key {
                cmd = cmd.arg(
                    clap::Arg::new(arg_id(s.key, true))
                        .long(old.replace('_', "-"))
                        .value_parser(clap::value_parser!(String))
                        .action(clap::ArgAction::Set)
                        .hide(true),
                );
            }
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// One resolved setting.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The setting.
    pub setting: Setting,
    /// Its value (`None`: unset).
    pub value: Option<Value>,
    /// Where the value came from.
    pub source: Source,
}

/// Every setting of a program with its effective value and where it came from.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The program's schema.
    pub schema: Schema,
    /// The config file read, and where its path came from.
    pub config: Option<(PathBuf, Source)>,
    /// One per setting, in schema order.
    pub entries: Vec<Entry>,
    /// Deprecation warnings, one per old spelling used; log them once logging is up.
    pub warnings: Vec<String>,
}

/// Reads `schema`'s settings from the flags, the environment `env` (every variable; only
/// those with the schema's prefix are looked at), the config file (`config_flag`, else the
/// `PREFIX_CONFIG` variable) and the defaults.
///
/// # Errors
/// [`SettingsError`]: an unreadable file, an unknown key or variable, a value that does not
/// read as its kind, or old and new spelling of a setting in one place.
pub fn resolve<S: HasSchema>(
    flags: &SettingFlags<S>,
    config_flag: Option<&Path>,
    env: &[(String, String)],
) -> Result<Resolved, SettingsError> {
    let schema = S::schema();
    let mut given: Vec<Given> = Vec::new();

    // Environment (also decides the config file when no flag does).
    let mut config_env: Option<PathBuf> = None;
    let config_var = schema.config_env();
    for (var, value) in env {
        let Some(rest) = var.strip_prefix(schema.env_prefix) else {
            continue;
        };
        if *var == config_var {
            config_env = Some(PathBuf::from(value));
            continue;
        }
        let key = rest.to_ascii_lowercase();
        match schema.setting(&key) {
            Some(s) if schema.env_name(s.key) == *var => given.push(Given {
                key: s.key,
                old: false,
                raw: Raw::Text(value.clone()),
                source: Source::Env(var.clone()),
            }),
            _ => {
                let mut known: Vec<String> = schema
                    .settings
                    .iter()
                    .map(|s| schema.env_name(s.key))
                    .collect();
                known.push(config_var.clone());
                return Err(SettingsError::UnknownEnv {
                    var: var.clone(),
                    hint: did_you_mean(var, known.iter().map(String::as_str)),
                });
            }
        }
    }

    let config = match (config_flag, config_env) {
        (Some(p), _) => Some((p.to_owned(), Source::Flag("--config".to_owned()))),
        (None, Some(p)) => Some((p, Source::Env(config_var.clone()))),
        (None, None) => None,
    };
    if let Some((path, _)) = &config {
        read_file(&schema, path, &mut given)?;
    }

    for (key, old, value) in &flags.given {
        let s = schema
            .setting(key)
            .expect("invariant: SettingFlags only holds keys of its schema");
        let spelled = if *old {
            s.old_key.expect("invariant: an old flag has an old key")
        } else {
            s.key
        };
        given.push(Given {
            key: s.key,
            old: *old,
            raw: Raw::Text(value.clone()),
            source: Source::Flag(flag_name(spelled)),
        });
    }

    let mut entries = Vec::with_capacity(schema.settings.len());
    let mut warnings = Vec::new();
    for s in &schema.settings {
        let mut entry = Entry {
            setting: s.clone(),
            value: s.default.clone(),
            source: Source::Default,
        };
        let mine: Vec<&Given> = given.iter().filter(|g| g.key == s.key).collect();
        for g in &mine {
            if !g.old {
                continue;
            }
            let same_place = |other: &&&Given| {
                !other.old
                    && std::mem::discriminant(&other.source) == std::mem::discriminant(&g.source)
            };
            if mine.iter().any(|o| same_place(&o)) {
                return Err(SettingsError::Both {
                    key: s.key.to_owned(),
                    old: s.old_key.unwrap_or_default().to_owned(),
                    source_: g.source.clone(),
                });
            }
        }
        // Given in precedence order already (env, file, flags); sort to be sure.
        let mut ordered = mine;
        ordered.sort_by_key(|g| rank(&g.source));
        for g in ordered {
            let value = read_value(s, g)?;
            if g.old {
                warnings.push(deprecation(&schema, s, g, &value));
            }
            entry.value = Some(value);
            entry.source = g.source.clone();
        }
        entries.push(entry);
    }
    Ok(Resolved {
        schema,
        config,
        entries,
        warnings,
    })
}

fn rank(source: &Source) -> u8 {
    match source {
        Source::Default => 0,
        Source::File(_) => 1,
        Source::Env(_) => 2,
        Source::Flag(_) => 3,
    }
}

fn deprecation(schema: &Schema, s: &Setting, g: &Given, value: &Value) -> String {
    let old = s.old_key.unwrap_or_default();
    match &g.source {
        Source::Flag(flag) => format!("{flag} is deprecated; use {} {value}", flag_name(s.key)),
        Source::File(path) => format!(
            "{old} (in {}) is deprecated; use {} = \"{value}\"",
            path.display(),
            s.toml_path()
        ),
        Source::Env(var) => format!(
            "{var} is deprecated; use {}={value}",
            schema.env_name(s.key)
        ),
        Source::Default => String::new(),
    }
}

fn read_file(schema: &Schema, path: &Path, given: &mut Vec<Given>) -> Result<(), SettingsError> {
    let file_error = |message: String| SettingsError::File {
        path: path.to_owned(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| file_error(e.to_string().trim_end().to_owned()))?;
    let tables: Vec<&str> = {
        let mut t: Vec<&str> = schema.settings.iter().filter_map(|s| s.table).collect();
        t.dedup();
        t
    };
    let source = Source::File(path.to_owned());
    let mut visit = |table_name: Option<&str>, key: &str, value: &toml::Value| {
        let found = schema
            .settings
            .iter()
            .find(|s| s.key == key || s.old_key == Some(key));
        let written = match table_name {
            Some(t) => format!("{t}.{key}"),
            None => key.to_owned(),
        };
        match found {
            Some(s) if s.table == table_name => {
                given.push(Given {
                    key: s.key,
                    old: s.key != key,
                    raw: Raw::from_toml(value),
                    source: source.clone(),
                });
                Ok(())
            }
            Some(s) => Err(SettingsError::UnknownKey {
                path: path.to_owned(),
                key: written,
                hint: match s.table {
                    Some(t) => format!(" (it belongs in the [{t}] table)"),
                    None => " (it belongs at the top level, before any table)".to_owned(),
                },
            }),
            None => {
                let candidates = schema
                    .settings
                    .iter()
                    .filter(|s| s.table == table_name)
                    .map(|s| s.key);
                Err(SettingsError::UnknownKey {
                    path: path.to_owned(),
                    key: written,
                    hint: did_you_mean(key, candidates),
                })
            }
        }
    };
    for (key, value) in &table {
        match value {
            toml::Value::Table(inner) if tables.contains(&key.as_str()) => {
                for (k, v) in inner {
                    visit(Some(key), k, v)?;
                }
            }
            _ if tables.contains(&key.as_str()) => {
                return Err(SettingsError::UnknownKey {
                    path: path.to_owned(),
                    key: key.clone(),
                    hint: format!(" ([{key}] is a table of settings, not a value)"),
                })
            }
            _ => visit(None, key, value)?,
        }
    }
    Ok(())
}

fn read_value(s: &Setting, g: &Given) -> Result<Value, SettingsError> {
    let spelled = if g.old {
        s.old_key.unwrap_or(s.key)
    } else {
        s.key
    };
    let bad = |accepted: String, detail: String| SettingsError::BadValue {
        key: spelled.to_owned(),
        source_: g.source.clone(),
        value: g.raw.display(),
        accepted: format!("{accepted}{detail}"),
    };
    if let Raw::Other(_) = g.raw {
        return Err(bad(s.kind.accepted(), String::new()));
    }
    match s.kind {
        Kind::Duration(step) if g.old => {
            let accepted = format!(
                "a whole number of {} (or use {} with a unit)",
                step.old_suffix(),
                s.key
            );
            let n = whole_number(&g.raw).ok_or_else(|| bad(accepted.clone(), String::new()))?;
            let nanos = u128::from(n) * step.nanos();
            let d = duration_from_nanos(nanos).ok_or_else(|| bad(accepted, String::new()))?;
            Ok(Value::Duration(d))
        }
        Kind::Duration(step) => {
            let text = match &g.raw {
                Raw::Text(t) => t.trim().to_owned(),
                Raw::Integer(0) => "0".to_owned(),
                _ => return Err(bad(s.kind.accepted(), " (a unit is required)".to_owned())),
            };
            if text != "0" && text.chars().all(|c| c.is_ascii_digit()) {
                return Err(bad(
                    s.kind.accepted(),
                    ": a unit is required (a bare number is only accepted for 0)".to_owned(),
                ));
            }
            // The parser's own message says a bare number means seconds, which is the
            // client's rule; a server setting wants a unit (above).
            let d = parse_duration(&text).map_err(|e| match e {
                crate::units::UnitsError::UnknownUnit { unit, .. } => bad(
                    s.kind.accepted(),
                    format!(": unknown unit {unit:?} (accepted: ns, us, ms, s, m, h)"),
                ),
                e => bad(s.kind.accepted(), format!(": {e}")),
            })?;
            if d.as_nanos() % step.nanos() != 0 {
                return Err(bad(
                    s.kind.accepted(),
                    format!(": it must be a whole number of {}", step.old_suffix()),
                ));
            }
            Ok(Value::Duration(d))
        }
        Kind::Size => match &g.raw {
            Raw::Integer(i) => u64::try_from(*i)
                .map(Value::Size)
                .map_err(|_| bad(s.kind.accepted(), String::new())),
            Raw::Text(t) => parse_size(t)
                .map(Value::Size)
                .map_err(|e| bad(s.kind.accepted(), format!(": {e}"))),
            _ => Err(bad(s.kind.accepted(), String::new())),
        },
        Kind::Count => whole_number(&g.raw)
            .map(Value::Count)
            .ok_or_else(|| bad(s.kind.accepted(), String::new())),
        Kind::Text => match &g.raw {
            Raw::Text(t) => Ok(Value::Text(t.clone())),
            _ => Err(bad(s.kind.accepted(), String::new())),
        },
        Kind::Choice(words) => match &g.raw {
            Raw::Text(t) if words.contains(&t.trim()) => Ok(Value::Text(t.trim().to_owned())),
            _ => Err(bad(s.kind.accepted(), String::new())),
        },
        Kind::List => match &g.raw {
            Raw::List(items) => Ok(Value::List(items.clone())),
            Raw::Text(t) => Ok(Value::List(
                t.split(',')
                    .map(|i| i.trim().to_owned())
                    .filter(|i| !i.is_empty())
                    .collect(),
            )),
            _ => Err(bad(s.kind.accepted(), String::new())),
        },
    }
}

fn whole_number(raw: &Raw) -> Option<u64> {
    match raw {
        Raw::Integer(i) => u64::try_from(*i).ok(),
        Raw::Text(t) => {
            let t = t.trim();
            if t.is_empty() || !t.chars().all(|c| c.is_ascii_digit()) {
                None
            } else {
                t.parse().ok()
            }
        }
        _ => None,
    }
}

fn duration_from_nanos(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    let sub = u32::try_from(nanos % 1_000_000_000).ok()?;
    Some(Duration::new(secs, sub))
}

/// `" (did you mean X?)"` for the candidate closest to `name`, if close enough.
fn did_you_mean<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> String {
    let name = name.to_ascii_lowercase();
    let best = candidates
        .map(|c| (edit_distance(&name, &c.to_ascii_lowercase()), c))
        .min_by_key(|(d, _)| *d);
    match best {
        Some((d, c)) if d <= 3.max(name.len() / 4) => format!(" (did you mean {c}?)"),
        _ => String::new(),
    }
}

/// Levenshtein distance, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

impl Resolved {
    fn entry(&self, key: &str) -> &Entry {
        self.entries
            .iter()
            .find(|e| e.setting.key == key)
            .unwrap_or_else(|| panic!("{key} is no setting of {}", self.schema.program))
    }

    /// Where `key`'s value came from.
    ///
    /// # Panics
    /// A key the schema does not know (a bug).
    #[must_use]
    pub fn source(&self, key: &str) -> &Source {
        &self.entry(key).source
    }

    /// `key`'s value, if set.
    ///
    /// # Panics
    /// A key the schema does not know (a bug).
    #[must_use]
    pub fn value(&self, key: &str) -> Option<&Value> {
        self.entry(key).value.as_ref()
    }

    /// A [`Kind::Duration`] setting.
    ///
    /// # Panics
    /// An unknown key or one of another kind (a bug).
    #[must_use]
    pub fn duration(&self, key: &str) -> Option<Duration> {
        match self.value(key) {
            None => None,
            Some(Value::Duration(d)) => Some(*d),
            Some(other) => panic!("{key} is no duration: {other:?}"),
        }
    }

    /// A [`Kind::Size`] setting, in bytes.
    ///
    /// # Panics
    /// An unknown key or one of another kind (a bug).
    #[must_use]
    pub fn size(&self, key: &str) -> Option<u64> {
        match self.value(key) {
            None => None,
            Some(Value::Size(b)) => Some(*b),
            Some(other) => panic!("{key} is no size: {other:?}"),
        }
    }

    /// A [`Kind::Count`] setting.
    ///
    /// # Panics
    /// An unknown key or one of another kind (a bug).
    #[must_use]
    pub fn count(&self, key: &str) -> Option<u64> {
        match self.value(key) {
            None => None,
            Some(Value::Count(n)) => Some(*n),
            Some(other) => panic!("{key} is no count: {other:?}"),
        }
    }

    /// A [`Kind::Text`] or [`Kind::Choice`] setting.
    ///
    /// # Panics
    /// An unknown key or one of another kind (a bug).
    #[must_use]
    pub fn text(&self, key: &str) -> Option<&str> {
        match self.value(key) {
            None => None,
            Some(Value::Text(t)) => Some(t),
            Some(other) => panic!("{key} is no text: {other:?}"),
        }
    }

    /// A [`Kind::List`] setting (empty if unset).
    ///
    /// # Panics
    /// An unknown key or one of another kind (a bug).
    #[must_use]
    pub fn list(&self, key: &str) -> Vec<String> {
        match self.value(key) {
            None => Vec::new(),
            Some(Value::List(items)) => items.clone(),
            Some(other) => panic!("{key} is no list: {other:?}"),
        }
    }

    /// A [`Kind::Size`] or [`Kind::Count`] setting as a `usize`, or an error naming it if
    /// it does not fit.
    ///
    /// # Errors
    /// [`SettingsError::Invalid`] for a value past `usize::MAX`.
    ///
    /// # Panics
    /// An unknown key or one of another kind (a bug).
    pub fn usize(&self, key: &str) -> Result<Option<usize>, SettingsError> {
        let n = match self.value(key) {
            None => return Ok(None),
            Some(Value::Size(n) | Value::Count(n)) => *n,
            Some(other) => panic!("{key} is no number: {other:?}"),
        };
        usize::try_from(n)
            .map(Some)
            .map_err(|_| self.invalid(key, "too large for this machine"))
    }

    /// A required setting's value, or [`SettingsError::Missing`] naming its three spellings.
    ///
    /// # Errors
    /// The setting is unset.
    pub fn required(&self, key: &str) -> Result<&Value, SettingsError> {
        self.value(key).ok_or_else(|| {
            let s = &self.entry(key).setting;
            SettingsError::Missing {
                key: key.to_owned(),
                flag: flag_name(key),
                var: self.schema.env_name(key),
                toml: s.toml_path(),
            }
        })
    }

    /// The error for `key`'s value being out of range: names the setting, its value and
    /// where it came from; `message` says what is accepted.
    ///
    /// # Panics
    /// A key the schema does not know (a bug).
    #[must_use]
    pub fn invalid(&self, key: &str, message: impl Into<String>) -> SettingsError {
        let e = self.entry(key);
        SettingsError::Invalid {
            key: key.to_owned(),
            value: e
                .value
                .as_ref()
                .map_or_else(|| "(unset)".to_owned(), ToString::to_string),
            source_: e.source.clone(),
            message: message.into(),
        }
    }

    /// The `--print-config` text: one line per setting (`KEY  VALUE  SOURCE`, the config
    /// file first), aligned in columns.
    #[must_use]
    pub fn to_text(&self) -> String {
        let mut rows: Vec<(String, String, String)> = Vec::with_capacity(self.entries.len() + 1);
        rows.push(match &self.config {
            Some((path, source)) => (
                "config".to_owned(),
                path.display().to_string(),
                source.to_string(),
            ),
            None => (
                "config".to_owned(),
                "(none)".to_owned(),
                "default".to_owned(),
            ),
        });
        for e in &self.entries {
            rows.push((
                e.setting.toml_path(),
                e.value
                    .as_ref()
                    .map_or_else(|| "(unset)".to_owned(), ToString::to_string),
                e.source.to_string(),
            ));
        }
        let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let w1 = rows.iter().map(|r| r.1.chars().count()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v, s) in rows {
            let pad = w1.saturating_sub(v.chars().count());
            out.push_str(&format!("{k:<w0$}  {v}{:pad$}  {s}\n", ""));
        }
        out
    }

    /// The `--print-config --format json` document: `{"program", "config": {"path",
    /// "source"} | null, "settings": [{"key", "table", "value", "source", "flag", "env"}],
    /// "warnings": [...]}`; `value` is the text the setting reads back, or null if unset.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        let settings: Vec<serde_json::Value> = self
            .entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "key": e.setting.key,
                    "table": e.setting.table,
                    "value": e.value.as_ref().map(ToString::to_string),
                    "source": e.source.to_string(),
                    "flag": flag_name(e.setting.key),
                    "env": self.schema.env_name(e.setting.key),
                })
            })
            .collect();
        serde_json::json!({
            "program": self.schema.program,
            "config": self.config.as_ref().map(|(p, s)| serde_json::json!({
                "path": p.display().to_string(),
                "source": s.to_string(),
            })),
            "settings": settings,
            "warnings": self.warnings,
        })
    }
}

/// How `--print-config` writes the settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PrintFormat {
    /// Aligned `KEY  VALUE  SOURCE` lines.
    #[default]
    Text,
    /// One JSON document ([`Resolved::to_json`]).
    Json,
}

impl Resolved {
    /// Writes the settings for `--print-config` to `out`, and the deprecation warnings (if
    /// any) to `err` as `warning: ...` lines.
    ///
    /// # Errors
    /// A failed write.
    pub fn print(
        &self,
        format: PrintFormat,
        out: &mut dyn std::io::Write,
        err: &mut dyn std::io::Write,
    ) -> std::io::Result<()> {
        match format {
            PrintFormat::Text => out.write_all(self.to_text().as_bytes())?,
            PrintFormat::Json => writeln!(out, "{}", self.to_json())?,
        }
        out.flush()?;
        for w in &self.warnings {
            writeln!(err, "warning: {w}")?;
        }
        Ok(())
    }
}

/// The process environment as `(name, value)` pairs, for [`resolve`]. A variable with the
/// program's prefix whose name or value is not UTF-8 is an error; others are skipped.
///
/// # Errors
/// [`SettingsError::UnknownEnv`] for a non-UTF-8 `PREFIX_*` variable.
pub fn process_env(prefix: &str) -> Result<Vec<(String, String)>, SettingsError> {
    let mut out = Vec::new();
    for (k, v) in std::env::vars_os() {
        let name = k.to_string_lossy();
        if !name.starts_with(prefix) {
            continue;
        }
        match (k.to_str(), v.into_string()) {
            (Some(k), Ok(v)) => out.push((k.to_owned(), v)),
            _ => {
                return Err(SettingsError::UnknownEnv {
                    var: name.into_owned(),
                    hint: " (its name or value is not UTF-8)".to_owned(),
                })
            }
        }
    }
    Ok(out)
}

/// Checks that `addr` has the form a listener binds to: `host:port`, with a port in
/// 0..=65535 (0 picks a free one) and a non-empty host (a name, an IPv4 address, or an
/// IPv6 address in brackets). Names are not resolved here; that happens at bind time.
///
/// # Errors
/// A message saying what is wrong, for [`Resolved::invalid`]-style errors that name the
/// setting.
pub fn check_host_port(addr: &str) -> Result<(), String> {
    let accepted = "a host:port address like 127.0.0.1:7101 or [::1]:7101";
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(format!("{addr:?} has no port: {accepted}"));
    };
    if host.is_empty() || host == "[]" {
        return Err(format!("{addr:?} has no host: {accepted}"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(format!(
            "{addr:?}: an IPv6 host goes in brackets: {accepted}"
        ));
    }
    if port.parse::<u16>().is_err() {
        return Err(format!(
            "{addr:?}: the port must be a number in 0..=65535: {accepted}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_takes_what_a_listener_binds_to() {
        for good in [
            "127.0.0.1:7101",
            "localhost:0",
            "[::1]:65535",
            "0.0.0.0:9101",
        ] {
            assert_eq!(check_host_port(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("localhost", "no port"),
            (":7101", "no host"),
            ("127.0.0.1:99999", "0..=65535"),
            ("127.0.0.1:http", "0..=65535"),
            ("::1:7101", "brackets"),
            ("nonsense", "no port"),
        ] {
            let err = check_host_port(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[derive(Debug)]
    struct Test;

    impl HasSchema for Test {
        fn schema() -> Schema {
            Schema {
                program: "quire-test",
                env_prefix: "QUIRE_TEST_",
                settings: vec![
                    Setting::new("listen", Kind::Text, "address"),
                    Setting::new("heartbeat", Kind::Duration(Granularity::Millis), "beat")
                        .default_value(Value::Duration(Duration::from_millis(100)))
                        .old("heartbeat_ms"),
                    Setting::new("window", Kind::Duration(Granularity::Micros), "w")
                        .in_table("wal")
                        .old("window_us"),
                    Setting::new("segment_bytes_max", Kind::Size, "seg")
                        .in_table("wal")
                        .default_value(Value::Size(1 << 20)),
                    Setting::new("stores", Kind::List, "stores"),
                    Setting::new("io", Kind::Choice(&["auto", "sync"]), "io"),
                ],
            }
        }
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.toml");
        std::fs::write(&path, text).expect("writes");
        (dir, path)
    }

    #[test]
    fn flag_beats_env_beats_file_beats_default() {
        let (_d, path) = file("listen = \"file:1\"\nheartbeat = \"1s\"\nstores = [\"a:1\"]\n[wal]\nwindow = \"5us\"\n");
        let flags = SettingFlags::<Test>::from_pairs(&[("listen", "flag:1")]);
        let r = resolve(
            &flags,
            Some(&path),
            &env(&[
                ("QUIRE_TEST_LISTEN", "env:1"),
                ("QUIRE_TEST_HEARTBEAT", "250ms"),
                ("OTHER", "x"),
            ]),
        )
        .expect("resolves");
        assert_eq!(r.text("listen"), Some("flag:1"));
        assert_eq!(r.source("listen"), &Source::Flag("--listen".into()));
        assert_eq!(r.duration("heartbeat"), Some(Duration::from_millis(250)));
        assert_eq!(
            r.source("heartbeat"),
            &Source::Env("QUIRE_TEST_HEARTBEAT".into())
        );
        assert_eq!(r.duration("window"), Some(Duration::from_micros(5)));
        assert_eq!(r.source("window"), &Source::File(path.clone()));
        assert_eq!(r.list("stores"), vec!["a:1".to_owned()]);
        assert_eq!(r.size("segment_bytes_max"), Some(1 << 20));
        assert_eq!(r.source("segment_bytes_max"), &Source::Default);
        assert_eq!(r.text("io"), None);
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        let text = r.to_text();
        assert!(text.contains("wal.window"), "{text}");
        assert!(text.contains("env QUIRE_TEST_HEARTBEAT"), "{text}");
        assert!(text.contains("flag --listen"), "{text}");
        assert_eq!(r.to_json()["settings"][1]["value"], "250ms");
    }

    #[test]
    fn the_config_file_may_come_from_the_environment() {
        let (_d, path) = file("listen = \"file:1\"\n");
        let r = resolve(
            &SettingFlags::<Test>::default(),
            None,
            &env(&[("QUIRE_TEST_CONFIG", path.to_str().expect("utf-8"))]),
        )
        .expect("resolves");
        assert_eq!(r.text("listen"), Some("file:1"));
        assert_eq!(
            r.config.as_ref().map(|c| c.1.clone()),
            Some(Source::Env("QUIRE_TEST_CONFIG".into()))
        );
    }

    #[test]
    fn units_are_read_everywhere() {
        let (_d, path) = file("[wal]\nsegment_bytes_max = \"256MiB\"\n");
        let flags = SettingFlags::<Test>::from_pairs(&[("heartbeat", "2m")]);
        let r = resolve(&flags, Some(&path), &[]).expect("resolves");
        assert_eq!(r.size("segment_bytes_max"), Some(256 << 20));
        assert_eq!(r.duration("heartbeat"), Some(Duration::from_secs(120)));
        let (_d, path) = file("[wal]\nsegment_bytes_max = 4096\n");
        let r = resolve(&SettingFlags::<Test>::default(), Some(&path), &[]).expect("resolves");
        assert_eq!(r.size("segment_bytes_max"), Some(4096));
    }

    #[test]
    fn old_spellings_still_work_and_warn() {
        let (_d, path) = file("heartbeat_ms = 50\n[wal]\nwindow_us = 200\n");
        let r = resolve(&SettingFlags::<Test>::default(), Some(&path), &[]).expect("resolves");
        assert_eq!(r.duration("heartbeat"), Some(Duration::from_millis(50)));
        assert_eq!(r.duration("window"), Some(Duration::from_micros(200)));
        assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
        assert!(
            r.warnings[0].contains("heartbeat_ms")
                && r.warnings[0].contains("deprecated")
                && r.warnings[0].contains("heartbeat = \"50ms\""),
            "{:?}",
            r.warnings
        );
        let flags = SettingFlags::<Test>::from_pairs(&[("heartbeat_ms", "75")]);
        let r = resolve(&flags, None, &[]).expect("resolves");
        assert_eq!(r.duration("heartbeat"), Some(Duration::from_millis(75)));
        assert_eq!(
            r.source("heartbeat"),
            &Source::Flag("--heartbeat-ms".into())
        );
        assert_eq!(
            r.warnings,
            vec!["--heartbeat-ms is deprecated; use --heartbeat 75ms".to_owned()]
        );
        // Old in the file, new as a flag: different places, the flag wins.
        let flags = SettingFlags::<Test>::from_pairs(&[("heartbeat", "1s")]);
        let r = resolve(&flags, Some(&path), &[]).expect("resolves");
        assert_eq!(r.duration("heartbeat"), Some(Duration::from_secs(1)));
    }

    #[test]
    fn old_and_new_in_one_place_is_an_error() {
        let (_d, path) = file("heartbeat_ms = 50\nheartbeat = \"50ms\"\n");
        let err = resolve(&SettingFlags::<Test>::default(), Some(&path), &[])
            .expect_err("both")
            .to_string();
        assert!(
            err.contains("heartbeat and its old spelling heartbeat_ms"),
            "{err}"
        );
        let flags =
            SettingFlags::<Test>::from_pairs(&[("heartbeat_ms", "50"), ("heartbeat", "50ms")]);
        let err = resolve(&flags, None, &[]).expect_err("both").to_string();
        assert!(err.contains("flag"), "{err}");
    }

    #[test]
    fn typos_name_the_setting_and_the_accepted_form() {
        let (_d, path) = file("lisen = \"x\"\n");
        let err = resolve(&SettingFlags::<Test>::default(), Some(&path), &[])
            .expect_err("typo")
            .to_string();
        assert!(err.contains("unknown setting `lisen`"), "{err}");
        assert!(err.contains("did you mean listen?"), "{err}");
        let (_d, path) = file("segment_bytes_max = 1\n");
        let err = resolve(&SettingFlags::<Test>::default(), Some(&path), &[])
            .expect_err("wrong table")
            .to_string();
        assert!(err.contains("[wal]"), "{err}");
        let err = resolve(
            &SettingFlags::<Test>::default(),
            None,
            &env(&[("QUIRE_TEST_HEARTBEET", "1s")]),
        )
        .expect_err("typo")
        .to_string();
        assert!(err.contains("QUIRE_TEST_HEARTBEET"), "{err}");
        assert!(err.contains("did you mean QUIRE_TEST_HEARTBEAT?"), "{err}");
        for (flags, env_pairs, want) in [
            (vec![("heartbeat", "50mss")], vec![], "flag --heartbeat"),
            (
                vec![],
                vec![("QUIRE_TEST_HEARTBEAT", "50mss")],
                "env QUIRE_TEST_HEARTBEAT",
            ),
        ] {
            let err = resolve(
                &SettingFlags::<Test>::from_pairs(&flags),
                None,
                &env(&env_pairs),
            )
            .expect_err("bad value")
            .to_string();
            assert!(err.starts_with("heartbeat = \"50mss\""), "{err}");
            assert!(err.contains(want), "{err}");
            assert!(err.contains("a duration like 50ms, 10s, 2m"), "{err}");
        }
        let (_d, path) = file("heartbeat = 100\n");
        let err = resolve(&SettingFlags::<Test>::default(), Some(&path), &[])
            .expect_err("no unit")
            .to_string();
        assert!(err.contains("unit is required"), "{err}");
        let (_d, path) = file("[wal]\nsegment_bytes_max = \"1M\"\n");
        let err = resolve(&SettingFlags::<Test>::default(), Some(&path), &[])
            .expect_err("ambiguous")
            .to_string();
        assert!(
            err.contains("segment_bytes_max") && err.contains("a size like"),
            "{err}"
        );
        let err = resolve(
            &SettingFlags::<Test>::from_pairs(&[("io", "fast")]),
            None,
            &[],
        )
        .expect_err("choice")
        .to_string();
        assert!(err.contains("one of auto, sync"), "{err}");
        let err = resolve(
            &SettingFlags::<Test>::from_pairs(&[("window", "1ns")]),
            None,
            &[],
        )
        .expect_err("too fine")
        .to_string();
        assert!(err.contains("whole number of microseconds"), "{err}");
    }

    #[test]
    fn the_flags_parse_through_clap() {
        use clap::{FromArgMatches, Parser};
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            settings: SettingFlags<Test>,
        }
        let cli =
            Cli::try_parse_from(["x", "--heartbeat", "5s", "--window-us", "9"]).expect("parses");
        let r = resolve(&cli.settings, None, &[]).expect("resolves");
        assert_eq!(r.duration("heartbeat"), Some(Duration::from_secs(5)));
        assert_eq!(r.duration("window"), Some(Duration::from_micros(9)));
        assert!(Cli::try_parse_from(["x", "--hartbeat", "5s"]).is_err());
        let m = <Cli as clap::CommandFactory>::command().get_matches_from(["x"]);
        assert!(SettingFlags::<Test>::from_arg_matches(&m)
            .expect("empty")
            .is_empty());
    }
}
