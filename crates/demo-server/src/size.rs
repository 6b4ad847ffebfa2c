//! Sizes in bytes written the way people type them on a command line: `65536`, `64KiB`,
//! `1MiB`.
//!
//! Shared by the `demo-server` and `demo-client` command lines.

use std::fmt;

/// Why a size could not be parsed by [`parse_size`].
///
/// The rules: the text is a whole non-negative decimal number, optionally followed by a unit
/// (`B`, `KiB`, `MiB` or `GiB`, powers of 1024, case as written), and the value fits in a
/// `usize`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSize {
    input: String,
    reason: &'static str,
}

impl fmt::Display for InvalidSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid size {:?}: {} (write it like 65536, 64KiB or 1MiB)",
            self.input, self.reason
        )
    }
}

impl std::error::Error for InvalidSize {}

/// Parses a size such as `65536`, `64KiB`, `1MiB` or `2GiB`. See [`InvalidSize`] for the
/// rules.
///
/// ```
/// use demo_server::size::parse_size;
///
/// assert_eq!(parse_size("1MiB").unwrap(), 1024 * 1024);
/// assert_eq!(parse_size("512").unwrap(), 512);
/// assert!(parse_size("1MB").is_err());
/// ```
pub fn parse_size(input: &str) -> Result<usize, InvalidSize> {
    let invalid = |reason| InvalidSize {
        input: input.to_owned(),
        reason,
    };
    let text = input.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(invalid("it does not start with a whole number"));
    }
    let scale: usize = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(invalid("unknown unit (B, KiB, MiB or GiB)")),
    };
    number
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| invalid("it is too large"))
}

/// Formats `bytes` with the largest unit of [`parse_size`] that divides it exactly, so that
/// the result parses back to the same value.
///
/// ```
/// use demo_server::size::format_size;
///
/// assert_eq!(format_size(1 << 20), "1MiB");
/// assert_eq!(format_size(1536), "1536B");
/// ```
pub fn format_size(bytes: usize) -> String {
    for (unit, scale) in [("GiB", 1usize << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= scale && bytes % scale == 0 {
            return format!("{}{unit}", bytes / scale);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("17B"), Ok(17));
        assert_eq!(parse_size(" 64KiB "), Ok(65_536));
        assert_eq!(parse_size("3MiB"), Ok(3 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    }

    #[test]
    fn errors_say_why() {
        for (input, reason) in [
            ("", "whole number"),
            ("MiB", "whole number"),
            ("-1", "whole number"),
            ("1.5MiB", "unknown unit"),
            ("1MB", "unknown unit"),
            ("1kib", "unknown unit"),
            ("99999999999999999999", "too large"),
            ("18446744073709551615GiB", "too large"),
        ] {
            let err = parse_size(input).unwrap_err().to_string();
            assert!(err.contains(reason), "{input}: {err}");
        }
    }

    #[test]
    fn format_round_trips() {
        for n in [0, 1, 1023, 1024, 1536, 1 << 20, 3 << 30, (1 << 20) + 1] {
            assert_eq!(parse_size(&format_size(n)), Ok(n), "{n}");
        }
    }
}
