//! Parsers for the quantities Quire takes from people — the `quire` CLI's options and the
//! servers' settings (flags, `QUIRE_NODE_*`/`QUIRE_BROKER_*` variables, config files): durations
//! and byte sizes.
//!
//! This module owns the accepted spellings and their error messages; it does not know
//! about any command. Each parser fits clap's `value_parser` (a `fn(&str) -> Result<T, E>`).
//!
//! # Durations ([`parse_duration`])
//! A non-negative decimal number with an optional unit; no unit means seconds.
//!
//! | unit | meaning |
//! | --- | --- |
//! | (none), `s` | seconds |
//! | `ms` | milliseconds |
//! | `us`, `µs` | microseconds |
//! | `ns` | nanoseconds |
//! | `m` | minutes |
//! | `h` | hours |
//!
//! Examples: `5`, `5s`, `0.5`, `1.5s`, `500ms`, `2m`, `1h`. Units are case-sensitive
//! (`m` is minutes, `ms` milliseconds; `M` is rejected). At most nine fractional digits.
//!
//! # Sizes ([`parse_size`])
//! A non-negative integer with an optional unit; no unit means bytes. Binary units are
//! powers of 1024, decimal (SI) units powers of 1000. Unit letters are case-insensitive.
//!
//! | unit | bytes |
//! | --- | --- |
//! | (none), `B` | 1 |
//! | `KiB`, `MiB`, `GiB`, `TiB` | 1024, 1024², 1024³, 1024⁴ |
//! | `KB`, `MB`, `GB`, `TB` | 1000, 1000², 1000³, 1000⁴ |
//!
//! A bare `K`, `M`, `G` or `T` is rejected as ambiguous (tools disagree on whether it means
//! 1000 or 1024): write `KiB` or `KB`. Fractions (`1.5MiB`) are rejected: sizes in Quire are
//! mostly alignment-sensitive, so they are spelled exactly. A space may separate the number
//! from its unit (`64 KiB`).

use std::time::Duration;

/// Longest input either parser looks at, in bytes; longer input is rejected unread.
pub const INPUT_BYTES_MAX: usize = 64;

/// Why a duration or size did not parse. The `Display` text names the input and says what
/// would have been accepted, so it can be shown to a user as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitsError {
    /// The input was empty or only whitespace.
    #[error("empty value: expected a {what}")]
    Empty {
        /// `"duration"` or `"size"`.
        what: &'static str,
    },
    /// The input is longer than [`INPUT_BYTES_MAX`].
    #[error("value is too long ({len} bytes, at most {max})")]
    TooLong {
        /// Length of the input in bytes.
        len: usize,
        /// [`INPUT_BYTES_MAX`].
        max: usize,
    },
    /// The input does not start with a decimal number.
    #[error("invalid {what} {input:?}: expected a number{hint}")]
    NotANumber {
        /// `"duration"` or `"size"`.
        what: &'static str,
        /// The input as given.
        input: String,
        /// Examples of valid input, starting with `", e.g. "`.
        hint: &'static str,
    },
    /// The number is followed by a unit this parser does not know.
    #[error("invalid {what} {input:?}: unknown unit {unit:?} (accepted: {accepted})")]
    UnknownUnit {
        /// `"duration"` or `"size"`.
        what: &'static str,
        /// The input as given.
        input: String,
        /// The unit as given.
        unit: String,
        /// The accepted units.
        accepted: &'static str,
    },
    /// A size used a unit letter that tools read differently (`K`, `M`, ...).
    #[error(
        "invalid size {input:?}: unit {unit:?} is ambiguous, write {binary:?} (powers of 1024) \
         or {decimal:?} (powers of 1000)"
    )]
    AmbiguousUnit {
        /// The input as given.
        input: String,
        /// The unit as given.
        unit: String,
        /// The binary spelling of the same prefix, e.g. `KiB`.
        binary: &'static str,
        /// The decimal spelling of the same prefix, e.g. `KB`.
        decimal: &'static str,
    },
    /// A size had a fractional part.
    #[error("invalid size {input:?}: sizes are whole numbers of bytes or units")]
    Fractional {
        /// The input as given.
        input: String,
    },
    /// A duration had more fractional digits than nanoseconds can hold.
    #[error("invalid duration {input:?}: at most 9 digits after the decimal point")]
    TooPrecise {
        /// The input as given.
        input: String,
    },
    /// The value does not fit (u64 bytes, or `Duration`).
    #[error("{what} {input:?} is too large")]
    Overflow {
        /// `"duration"` or `"size"`.
        what: &'static str,
        /// The input as given.
        input: String,
    },
}

const DURATION_UNITS: &str = "s, ms, us, ns, m, h; none means seconds";
const SIZE_UNITS: &str = "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; none means bytes";

/// Parses a duration such as `5`, `5s`, `1.5s`, `500ms`, `2m` (see the module docs for
/// every unit). A plain number is seconds.
///
/// # Errors
/// [`UnitsError`] for empty or over-long input, a missing number, an unknown unit, more
/// than nine fractional digits, or a value past `Duration::MAX`.
pub fn parse_duration(input: &str) -> Result<Duration, UnitsError> {
    const WHAT: &str = "duration";
    let (int_digits, frac_digits, unit) = split_number(input, WHAT, ", e.g. 5, 5s, 500ms, 2m")?;
    let unit_nanos: u128 = match unit {
        "" | "s" => 1_000_000_000,
        "ms" => 1_000_000,
        "us" | "µs" => 1_000,
        "ns" => 1,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        other => {
            return Err(UnitsError::UnknownUnit {
                what: WHAT,
                input: input.to_owned(),
                unit: other.to_owned(),
                accepted: DURATION_UNITS,
            })
        }
    };
    if frac_digits.len() > 9 {
        return Err(UnitsError::TooPrecise {
            input: input.to_owned(),
        });
    }
    let overflow = || UnitsError::Overflow {
        what: WHAT,
        input: input.to_owned(),
    };
    // Fixed point with nine fractional digits, then scaled by the unit; the result is in
    // units of 1e-9 ns, divided back at the end. u128 holds Duration::MAX in ns (≈1.8e28)
    // times 1e9 (≈1.8e37) well below its 3.4e38.
    let int_part: u128 = int_digits.parse().map_err(|_| overflow())?;
    let mut frac_part: u128 = 0;
    for (i, digit) in frac_digits.bytes().enumerate() {
        let place = 10u128.pow(8 - i as u32);
        frac_part += u128::from(digit - b'0') * place;
    }
    let scaled = int_part
        .checked_mul(1_000_000_000)
        .and_then(|v| v.checked_add(frac_part))
        .and_then(|v| v.checked_mul(unit_nanos))
        .ok_or_else(overflow)?;
    let nanos = scaled / 1_000_000_000;
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| overflow())?;
    let subsec_nanos = u32::try_from(nanos % 1_000_000_000).map_err(|_| overflow())?;
    Ok(Duration::new(secs, subsec_nanos))
}

/// Writes `d` in the spelling [`parse_duration`] reads back, with the largest unit that
/// keeps it whole: `2m`, `30s`, `500ms`, `250us`, `7ns` (`0s` for zero). For messages that
/// name a duration the user gave or can give.
#[must_use]
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    for (unit, size) in [
        ("h", 3_600_000_000_000u128),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if nanos % size == 0 {
            return format!("{}{unit}", nanos / size);
        }
    }
    format!("{nanos}ns")
}

/// Writes `bytes` in the spelling [`parse_size`] reads back, with the largest binary unit
/// that keeps it whole: `64MiB`, `4KiB`, `1000` (a plain number of bytes otherwise, and for
/// zero).
#[must_use]
pub fn format_size(bytes: u64) -> String {
    if bytes != 0 {
        for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
            if bytes % (1u64 << shift) == 0 {
                return format!("{}{unit}", bytes >> shift);
            }
        }
    }
    bytes.to_string()
}

/// Parses a byte size such as `4096`, `64KiB`, `1MiB`, `10MB` (see the module docs for every
/// unit). A plain number is bytes.
///
/// # Errors
/// [`UnitsError`] for empty or over-long input, a missing number, a fraction, an unknown or
/// ambiguous unit, or a value past `u64::MAX`.
pub fn parse_size(input: &str) -> Result<u64, UnitsError> {
    const WHAT: &str = "size";
    let (int_digits, frac_digits, unit) =
        split_number(input, WHAT, ", e.g. 4096, 64KiB, 1MiB, 10MB")?;
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        ambiguous @ ("k" | "m" | "g" | "t") => {
            let (binary, decimal) = match ambiguous {
                "k" => ("KiB", "KB"),
                "m" => ("MiB", "MB"),
                "g" => ("GiB", "GB"),
                _ => ("TiB", "TB"),
            };
            return Err(UnitsError::AmbiguousUnit {
                input: input.to_owned(),
                unit: unit.to_owned(),
                binary,
                decimal,
            });
        }
        _ => {
            return Err(UnitsError::UnknownUnit {
                what: WHAT,
                input: input.to_owned(),
                unit: unit.to_owned(),
                accepted: SIZE_UNITS,
            })
        }
    };
    if !frac_digits.is_empty() {
        return Err(UnitsError::Fractional {
            input: input.to_owned(),
        });
    }
    let overflow = || UnitsError::Overflow {
        what: WHAT,
        input: input.to_owned(),
    };
    let count: u64 = int_digits.parse().map_err(|_| overflow())?;
    count.checked_mul(multiplier).ok_or_else(overflow)
}

/// Splits `input` into integer digits, fractional digits (after a `.`, possibly empty) and
/// the unit (the rest, with surrounding whitespace removed, possibly empty).
fn split_number<'a>(
    input: &'a str,
    what: &'static str,
    hint: &'static str,
) -> Result<(&'a str, &'a str, &'a str), UnitsError> {
    if input.len() > INPUT_BYTES_MAX {
        return Err(UnitsError::TooLong {
            len: input.len(),
            max: INPUT_BYTES_MAX,
        });
    }
    let trimmed = input.trim();
    if trimmed.is_empty() {
        return Err(UnitsError::Empty { what });
    }
    let not_a_number = || UnitsError::NotANumber {
        what,
        input: input.to_owned(),
        hint,
    };
    let int_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let int_digits = &trimmed[..int_end];
    let rest = &trimmed[int_end..];
    let (frac_digits, rest) = match rest.strip_prefix('.') {
        Some(after_dot) => {
            let frac_end = after_dot
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after_dot.len());
            (&after_dot[..frac_end], &after_dot[frac_end..])
        }
        None => ("", rest),
    };
    // "5." and ".5" are accepted as 5.0 and 0.5 only when digits stand on one side.
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(not_a_number());
    }
    let int_digits = if int_digits.is_empty() {
        "0"
    } else {
        int_digits
    };
    Ok((int_digits, frac_digits, rest.trim_start()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_in_the_largest_whole_unit_and_read_back() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_micros(250), "250us"),
            (Duration::from_nanos(7), "7ns"),
        ] {
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(text), Ok(d), "{text} reads back");
        }
    }

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("250µs"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("7ns"), Ok(Duration::from_nanos(7)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn durations_with_fractions_and_spaces() {
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration(".25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5."), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0.1ms"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration(" 10 ms "), Ok(Duration::from_millis(10)));
        assert_eq!(
            parse_duration("1.000000001"),
            Ok(Duration::new(1, 1)),
            "nine fractional digits are exact"
        );
    }

    #[test]
    fn durations_reject_garbage() {
        assert_eq!(
            parse_duration(""),
            Err(UnitsError::Empty { what: "duration" })
        );
        assert!(matches!(
            parse_duration("soon"),
            Err(UnitsError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_duration("-5s"),
            Err(UnitsError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_duration("."),
            Err(UnitsError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_duration("5x"),
            Err(UnitsError::UnknownUnit { ref unit, .. }) if unit == "x"
        ));
        assert!(matches!(
            parse_duration("5M"),
            Err(UnitsError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_duration("5s5"),
            Err(UnitsError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_duration("1.2.3"),
            Err(UnitsError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_duration("0.0000000001"),
            Err(UnitsError::TooPrecise { .. })
        ));
        assert!(matches!(
            parse_duration("99999999999999999999999h"),
            Err(UnitsError::Overflow { .. })
        ));
        assert!(matches!(
            parse_duration(&"1".repeat(INPUT_BYTES_MAX + 1)),
            Err(UnitsError::TooLong { .. })
        ));
    }

    #[test]
    fn sizes_are_written_in_the_largest_whole_binary_unit_and_read_back() {
        for (bytes, text) in [
            (0, "0"),
            (1000, "1000"),
            (4096, "4KiB"),
            (64 << 20, "64MiB"),
            (3 << 30, "3GiB"),
            (1 << 40, "1TiB"),
        ] {
            assert_eq!(format_size(bytes), text);
            assert_eq!(parse_size(text), Ok(bytes), "{text} reads back");
        }
    }

    #[test]
    fn sizes_in_every_unit() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("7B"), Ok(7));
        assert_eq!(parse_size("64KiB"), Ok(64 * 1024));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("4KB"), Ok(4_000));
        assert_eq!(parse_size("10MB"), Ok(10_000_000));
        assert_eq!(parse_size("3GB"), Ok(3_000_000_000));
        assert_eq!(parse_size("1TB"), Ok(1_000_000_000_000));
    }

    #[test]
    fn size_units_ignore_case_and_allow_a_space() {
        assert_eq!(parse_size("64kib"), Ok(64 * 1024));
        assert_eq!(parse_size("64KIB"), Ok(64 * 1024));
        assert_eq!(parse_size("4kB"), Ok(4_000));
        assert_eq!(parse_size("64 KiB"), Ok(64 * 1024));
        assert_eq!(parse_size(" 4096 "), Ok(4096));
    }

    #[test]
    fn sizes_reject_garbage() {
        assert_eq!(parse_size("  "), Err(UnitsError::Empty { what: "size" }));
        assert!(matches!(
            parse_size("12q"),
            Err(UnitsError::UnknownUnit { ref unit, .. }) if unit == "q"
        ));
        assert!(matches!(
            parse_size("KiB"),
            Err(UnitsError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_size("-4096"),
            Err(UnitsError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_size("1.5MiB"),
            Err(UnitsError::Fractional { .. })
        ));
        assert!(matches!(
            parse_size("64K"),
            Err(UnitsError::AmbiguousUnit {
                binary: "KiB",
                decimal: "KB",
                ..
            })
        ));
        assert!(matches!(
            parse_size("1m"),
            Err(UnitsError::AmbiguousUnit { binary: "MiB", .. })
        ));
        assert!(matches!(
            parse_size("0x1000"),
            Err(UnitsError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("16EiB"),
            Err(UnitsError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("18446744073709551616"),
            Err(UnitsError::Overflow { .. })
        ));
        assert!(matches!(
            parse_size("17000000TiB"),
            Err(UnitsError::Overflow { .. })
        ));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn error_messages_name_the_input_and_the_fix() {
        let message = parse_size("12q").map_err(|e| e.to_string());
        assert_eq!(
            message,
            Err(
                "invalid size \"12q\": unknown unit \"q\" (accepted: B, KiB, MiB, GiB, TiB, \
                 KB, MB, GB, TB; none means bytes)"
                    .to_owned()
            )
        );
        let message = parse_size("64K").map_err(|e| e.to_string());
        assert_eq!(
            message,
            Err(
                "invalid size \"64K\": unit \"K\" is ambiguous, write \"KiB\" (powers of 1024) \
                 or \"KB\" (powers of 1000)"
                    .to_owned()
            )
        );
        let message = parse_duration("soon").map_err(|e| e.to_string());
        assert_eq!(
            message,
            Err("invalid duration \"soon\": expected a number, e.g. 5, 5s, 500ms, 2m".to_owned())
        );
    }
}
