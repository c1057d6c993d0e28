//! `quire completion SHELL` and `quire man` through the real binary: each completion script
//! is non-empty and names the subcommands; `quire man --dir` writes one page per command,
//! each a roff page that `man -l` renders when `man` is installed (and passes a roff sanity
//! check either way); `quire man` alone prints the top page.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is a clear failure

use std::process::{Command, Output};
use std::time::Duration;

use quire_tests::process::run_bounded;

const STEP_WAIT: Duration = Duration::from_secs(30);

fn quire(args: &[&str]) -> Output {
    run_bounded(
        Command::new(env!("CARGO_BIN_EXE_quire")).args(args),
        STEP_WAIT,
    )
}

#[test]
fn completion_scripts_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = quire(&["completion", shell]);
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout).unwrap();
        for word in [
            "produce",
            "consume",
            "cluster",
            "handoff",
            "profile",
            "completion",
        ] {
            assert!(script.contains(word), "{shell} script has no {word}");
        }
    }
    let out = quire(&["completion", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

#[test]
fn man_writes_one_readable_page_per_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = quire(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "pages go to files, not stdout");
    let has_man = Command::new("man").arg("--version").output().is_ok();
    for page in [
        "quire.1",
        "quire-produce.1",
        "quire-consume.1",
        "quire-cluster-status.1",
        "quire-cluster-handoff.1",
        "quire-profile-create.1",
        "quire-completion.1",
    ] {
        let path = dir.path().join(page);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
        let command = page.trim_end_matches(".1");
        assert!(text.contains(&format!(".TH {command} 1")), "{page}: {text}");
        assert!(text.contains("\"quire "), "{page}: the footer names quire");
        assert!(
            text.contains(".SH NAME") && text.contains(".SH SYNOPSIS"),
            "{page}"
        );
        if has_man {
            let out = run_bounded(
                Command::new("man")
                    .arg("-l")
                    .arg(&path)
                    .env("MANPAGER", "cat")
                    .env("MANWIDTH", "100"),
                STEP_WAIT,
            );
            assert!(out.status.success(), "man -l {page}: {out:?}");
            let shown = String::from_utf8_lossy(&out.stdout);
            assert!(shown.contains("NAME"), "man -l {page}: {shown}");
        }
    }
    let out = quire(&["man"]);
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains(".TH quire 1"));
}
