//! Durations on the command line: `500ms`, `2s`, `1.5s`, `1m`, `250us`.

use std::time::Duration;

/// Parses a decimal number followed by a unit: `us`, `ms`, `s`, `m` or `h`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("'{text}' has no unit: write it like 100ms, 2s or 1m"))?;
    let (number, unit) = text.split_at(split);
    let seconds_per_unit = match unit {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "'{text}' has an unknown unit '{unit}': use us, ms, s, m or h"
            ));
        }
    };
    if number.is_empty() {
        return Err(format!("'{text}' has no number: write it like 100ms"));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{number}' is not a number"))?;
    Duration::try_from_secs_f64(value * seconds_per_unit)
        .map_err(|_| format!("'{text}' is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert!(parse_duration("100").unwrap_err().contains("no unit"));
        assert!(
            parse_duration("10 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_duration("ms").unwrap_err().contains("no number"));
        assert!(
            parse_duration("1.2.3s")
                .unwrap_err()
                .contains("not a number")
        );
        assert!(parse_duration("soon").unwrap_err().contains("unit"));
        assert!(parse_duration("1e300h").is_err());
    }
}
