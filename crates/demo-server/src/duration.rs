//! Durations written the way people type them on a command line: `500ms`, `2s`, `1m`.
//!
//! Shared by the `demo-server` and `demo-client` command lines.

use std::fmt;
use std::time::Duration;

/// Why a duration could not be parsed by [`parse_duration`].
///
/// The rules, each with its own message:
///
/// - the text is not empty (after trimming spaces);
/// - it is a non-negative decimal number (`2`, `0.5`, `1.25`; no sign, no exponent)
///   followed directly by a unit;
/// - the unit is one of `us` (microseconds), `ms` (milliseconds), `s` (seconds), `m`
///   (minutes) or `h` (hours);
/// - the value fits in a [`Duration`] and is not finer than a nanosecond in a way that
///   would be silently lost (`0.5ns` has no unit anyway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidDuration {
    input: String,
    reason: &'static str,
}

impl InvalidDuration {
    fn new(input: &str, reason: &'static str) -> Self {
        Self {
            input: input.to_owned(),
            reason,
        }
    }
}

impl fmt::Display for InvalidDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid duration {:?}: {} (write it like 500ms, 2s, 1.5s, 1m or 1h)",
            self.input, self.reason
        )
    }
}

impl std::error::Error for InvalidDuration {}

/// Parses a duration such as `500ms`, `2s`, `1.5s`, `1m` or `1h`. See [`InvalidDuration`]
/// for the rules.
///
/// ```
/// use std::time::Duration;
/// use demo_server::duration::parse_duration;
///
/// assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
/// assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
/// assert!(parse_duration("10").is_err());
/// ```
pub fn parse_duration(input: &str) -> Result<Duration, InvalidDuration> {
    let text = input.trim();
    if text.is_empty() {
        return Err(InvalidDuration::new(input, "it is empty"));
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| InvalidDuration::new(input, "it has no unit"))?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(InvalidDuration::new(
            input,
            "it does not start with a non-negative number",
        ));
    }
    let nanos_per_unit: u128 = match unit {
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        _ => return Err(InvalidDuration::new(input, "unknown unit")),
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return Err(InvalidDuration::new(input, "the number is malformed"));
    }
    // Exact decimal arithmetic in nanoseconds: no float rounding, no silent overflow.
    let too_long = || InvalidDuration::new(input, "it is too long");
    let mut nanos: u128 = 0;
    if !whole.is_empty() {
        let w: u128 = whole.parse().map_err(|_| too_long())?;
        nanos = w.checked_mul(nanos_per_unit).ok_or_else(too_long)?;
    }
    let mut scale = nanos_per_unit;
    for digit in fraction.bytes() {
        let d = u128::from(digit - b'0');
        if scale % 10 != 0 {
            if d != 0 {
                return Err(InvalidDuration::new(input, "it is finer than a nanosecond"));
            }
            continue;
        }
        scale /= 10;
        nanos = nanos.checked_add(d * scale).ok_or_else(too_long)?;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| too_long())?;
    let sub = u32::try_from(nanos % 1_000_000_000).map_err(|_| too_long())?;
    Ok(Duration::new(secs, sub))
}

/// Formats a duration the way [`parse_duration`] reads it, choosing the largest unit that
/// keeps it exact (`1m`, `90s`, `1500ms`); sub-millisecond parts are written in seconds
/// with a fraction.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos % 3_600_000_000_000 == 0 {
        format!("{}h", nanos / 3_600_000_000_000)
    } else if nanos % 60_000_000_000 == 0 {
        format!("{}m", nanos / 60_000_000_000)
    } else if nanos % 1_000_000_000 == 0 {
        format!("{}s", nanos / 1_000_000_000)
    } else if nanos % 1_000_000 == 0 {
        format!("{}ms", nanos / 1_000_000)
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_units_people_type() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration(" 10s "), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn parses_fractions_exactly() {
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.25m"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2.s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("0.000001ms"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse_duration("1.0000000000s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn rejects_with_a_reason() {
        let cases = [
            ("", "it is empty"),
            ("   ", "it is empty"),
            ("10", "it has no unit"),
            ("ms", "it does not start with a non-negative number"),
            ("-1s", "it does not start with a non-negative number"),
            ("+1s", "it does not start with a non-negative number"),
            ("1sec", "unknown unit"),
            ("1 s", "unknown unit"),
            ("1d", "unknown unit"),
            ("1S", "unknown unit"),
            ("1.2.3s", "the number is malformed"),
            (".s", "the number is malformed"),
            ("0.0000001ms", "it is finer than a nanosecond"),
            (
                "99999999999999999999999999999999999999999h",
                "it is too long",
            ),
            ("18446744073709551616s", "it is too long"),
        ];
        for (input, reason) in cases {
            let err = parse_duration(input).expect_err(input);
            assert_eq!(err.reason, reason, "input {input:?}");
            let message = err.to_string();
            assert!(message.starts_with("invalid duration"), "{message}");
            assert!(message.contains(reason), "{message}");
        }
    }

    #[test]
    fn format_round_trips() {
        for d in [
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_millis(1500),
            Duration::from_secs(2),
            Duration::from_secs(90),
            Duration::from_secs(60),
            Duration::from_secs(7200),
            Duration::from_micros(1500),
        ] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{d:?}");
        }
        assert_eq!(format_duration(Duration::from_secs(60)), "1m");
        assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
    }
}
