//! Quorum math, kept apart so it can be checked on its own.
//!
//! A value `h` is held by a quorum of `q` among a set of per-store offsets when at least `q`
//! distinct stores reported `>= h`. The highest such `h` is the `q`-th largest value
//! (DESIGN.md "Replication protocol": the HWM is the highest offset Qa distinct voting stores
//! acked).

use quire_proto::Offset;

/// The majority of `n`: `n / 2 + 1` (the default for both Qa and F).
#[must_use]
pub fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// The highest offset that at least `quorum` of the given per-store offsets reach: the
/// `quorum`-th largest value, or `None` when fewer than `quorum` values are given.
///
/// `offsets` holds one value per distinct store (the caller guarantees distinctness); it is
/// reordered in place (no allocation).
///
/// # Panics
/// If `quorum` is 0 (a quorum of nobody is a configuration bug, refused by
/// [`super::ClusterConfig::validate`]).
#[must_use]
pub fn quorum_offset(offsets: &mut [Offset], quorum: usize) -> Option<Offset> {
    assert!(quorum > 0, "a quorum of 0 stores is meaningless");
    if offsets.len() < quorum {
        return None;
    }
    offsets.sort_unstable_by(|a, b| b.cmp(a));
    Some(offsets[quorum - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(v: &[u64]) -> Vec<Offset> {
        v.iter().copied().map(Offset).collect()
    }

    #[test]
    fn majority_of_small_clusters() {
        assert_eq!([1, 2, 3, 4, 5, 6, 7].map(majority), [1, 2, 2, 3, 3, 4, 4]);
    }

    #[test]
    fn quorum_offset_is_the_qth_largest() {
        // N=3, Qa=2: the second largest.
        assert_eq!(quorum_offset(&mut o(&[5, 9, 7]), 2), Some(Offset(7)));
        assert_eq!(quorum_offset(&mut o(&[5]), 2), None);
        // N=5, Qa=3: the third largest; ties count once per store.
        assert_eq!(quorum_offset(&mut o(&[1, 8, 8, 3, 2]), 3), Some(Offset(3)));
        assert_eq!(quorum_offset(&mut o(&[8, 8, 8]), 3), Some(Offset(8)));
        assert_eq!(quorum_offset(&mut o(&[8, 8]), 3), None);
    }
}
