//! Build facts — version, commit, rustc — for `--version` and the `quire_build_info`
//! metric, the same in quire-node, quire-broker and `quire` (all three read them here).
//!
//! The commit comes from `net/build.rs` at build time (`git rev-parse --short=12 HEAD`,
//! `unknown` without git); see that file for when it is refreshed.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// The workspace version (`Cargo.toml`), e.g. `0.1.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit built, 12 hex digits, or `unknown`.
pub const COMMIT: &str = env!("QUIRE_BUILD_COMMIT");
/// Whether the working tree had changes when the commit was read.
pub const DIRTY: bool = matches!(env!("QUIRE_BUILD_DIRTY").as_bytes(), b"true");
/// `rustc --version` of the compiler that built this, or `unknown`.
pub const RUSTC: &str = env!("QUIRE_BUILD_RUSTC");

/// What `--version` prints after the program name: `0.1.0 (commit abc123def456)`, with
/// `, dirty` inside the parentheses for a build from a modified tree.
pub const VERSION_LINE: &str = if DIRTY {
    concat!(
        env!("CARGO_PKG_VERSION"),
        " (commit ",
        env!("QUIRE_BUILD_COMMIT"),
        ", dirty)"
    )
} else {
    concat!(
        env!("CARGO_PKG_VERSION"),
        " (commit ",
        env!("QUIRE_BUILD_COMMIT"),
        ")"
    )
};

/// The build-info metric's name (unprefixed: it is registered as it is).
pub const BUILD_INFO_METRIC: &str = "quire_build_info";

/// The commit label of `quire_build_info`: [`COMMIT`], with `-dirty` for a modified tree.
#[must_use]
pub fn commit_label() -> String {
    if DIRTY {
        format!("{COMMIT}-dirty")
    } else {
        COMMIT.to_owned()
    }
}

/// Encodes the constant build-info gauge at each scrape.
#[derive(Debug)]
pub(crate) struct BuildInfoCollector;

impl Collector for BuildInfoCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        let family = Family::<[(&'static str, String); 3], Gauge>::default();
        family
            .get_or_create(&[
                ("version", VERSION.to_owned()),
                ("commit", commit_label()),
                ("rustc", RUSTC.to_owned()),
            ])
            .set(1);
        let m = enc.encode_descriptor(
            BUILD_INFO_METRIC,
            "Always 1; the labels say which build this is",
            None,
            family.metric_type(),
        )?;
        family.encode(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn the_version_line_names_the_version_and_a_commit() {
        assert!(VERSION_LINE.starts_with(VERSION), "{VERSION_LINE}");
        assert!(VERSION_LINE.contains("(commit "), "{VERSION_LINE}");
        assert!(!COMMIT.is_empty());
        assert_eq!(VERSION_LINE.ends_with(", dirty)"), DIRTY);
    }

    #[test]
    fn build_info_is_one_gauge_with_three_labels() {
        let mut r = Registry::default();
        r.register_collector(Box::new(BuildInfoCollector));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &r).expect("encodes");
        let want = format!(
            "quire_build_info{{version=\"{VERSION}\",commit=\"{}\",rustc=\"{RUSTC}\"}} 1",
            commit_label()
        );
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
}
