//! Build facts for `quire_net::build_info` (the one build script of the workspace: quire-node,
//! quire-broker and `quire` read them from quire-net, so the logic lives here once).
//!
//! Sets, for `env!` in the crate:
//! - `QUIRE_BUILD_COMMIT`: `git rev-parse --short=12 HEAD`, or the `QUIRE_BUILD_COMMIT`
//!   environment variable when set (a packager building from a tarball), or `unknown` (no
//!   git, no repository: a crates.io or tarball build never fails here);
//! - `QUIRE_BUILD_DIRTY`: `true` if `git status --porcelain` lists anything, else `false`
//!   (with `QUIRE_BUILD_COMMIT` from the environment, `QUIRE_BUILD_DIRTY=1` there says so);
//! - `QUIRE_BUILD_RUSTC`: the first line of `$RUSTC --version`, or `unknown`.
//!
//! Re-runs only when HEAD moves (`HEAD`, the ref it names, `packed-refs`: a commit, a
//! checkout) or one of the override variables changes — not on every build, and not when
//! git rewrites its index (which `git status` does after any edit, and which would rebuild
//! every crate above quire-net). So the dirty flag is the tree's state when HEAD last moved
//! (or at a clean build): edits made since do not refresh it. In a git worktree `.git` is a file, so the paths come from
//! `git rev-parse --git-dir` and `--git-common-dir`, never from `.git/` directly.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `git args…` in `dir`; its trimmed stdout if it succeeded and printed something.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// A path git printed, made absolute against `dir`.
fn absolute(dir: &Path, p: &str) -> PathBuf {
    let p = PathBuf::from(p);
    if p.is_absolute() {
        p
    } else {
        dir.join(p)
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=QUIRE_BUILD_COMMIT");
    println!("cargo:rerun-if-env-changed=QUIRE_BUILD_DIRTY");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| ".".into()));

    let from_env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut commit = from_env("QUIRE_BUILD_COMMIT");
    let mut dirty = from_env("QUIRE_BUILD_DIRTY")
        .is_some_and(|v| matches!(v.as_str(), "1" | "true" | "yes" | "dirty"));
    if commit.is_none() {
        if let Some(git_dir) = git(&dir, &["rev-parse", "--git-dir"]) {
            let git_dir = absolute(&dir, &git_dir);
            let common = git(&dir, &["rev-parse", "--git-common-dir"])
                .map_or_else(|| git_dir.clone(), |c| absolute(&dir, &c));
            println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
            println!(
                "cargo:rerun-if-changed={}",
                common.join("packed-refs").display()
            );
            if let Some(r) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
                println!("cargo:rerun-if-changed={}", common.join(r).display());
            }
            commit = git(&dir, &["rev-parse", "--short=12", "HEAD"]);
            if commit.is_some() {
                // --no-optional-locks: do not refresh (rewrite) the index, which would
                // touch a file this script watches.
                let status = Command::new("git")
                    .arg("-C")
                    .arg(&dir)
                    .args(["--no-optional-locks", "status", "--porcelain"])
                    .output();
                if let Ok(out) = status {
                    if out.status.success() && !out.stdout.is_empty() {
                        dirty = true;
                    }
                }
            }
        }
    }
    let rustc = std::env::var_os("RUSTC")
        .and_then(|rustc| Command::new(rustc).arg("--version").output().ok())
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(|l| l.trim().to_owned()))
        .filter(|s| !s.is_empty());
    println!(
        "cargo:rustc-env=QUIRE_BUILD_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    println!("cargo:rustc-env=QUIRE_BUILD_DIRTY={dirty}");
    println!(
        "cargo:rustc-env=QUIRE_BUILD_RUSTC={}",
        rustc.as_deref().unwrap_or("unknown")
    );
}
