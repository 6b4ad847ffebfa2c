//! What the strategies share: conversions without overflow and the checks of their
//! settings.

use std::time::Duration;

use overload_core::ConfigError;

/// Seconds to a duration, saturating at `max` (and at zero for negative or NaN input).
pub(super) fn secs_to_duration(secs: f64, max: Duration) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).map_or(max, |d| d.min(max))
}

/// `min(base * factor^n, cap)` in seconds, without overflow for any `n`.
pub(super) fn grown(base: Duration, factor: f64, n: u32, cap: Duration) -> f64 {
    let cap = cap.as_secs_f64();
    // NOTE: `powi` takes an i32; beyond i32::MAX the value is infinite (factor > 1) or 1
    // (factor == 1) anyway, and infinity is absorbed by `min`.
    let exp = i32::try_from(n).unwrap_or(i32::MAX);
    let g = base.as_secs_f64() * factor.powi(exp);
    if g.is_nan() { cap } else { g.min(cap) }
}

/// `field` must be greater than zero: a zero wait is a retry storm.
pub(super) fn positive(field: &'static str, delay: Duration) -> Result<(), ConfigError> {
    if delay.is_zero() {
        Err(ConfigError::out_of_range(field, delay, "greater than zero"))
    } else {
        Ok(())
    }
}

/// `low` (the setting `low_field`) must not exceed `high` (the setting `high_field`).
pub(super) fn ordered(
    low_field: &'static str,
    low: Duration,
    high_field: &'static str,
    high: Duration,
) -> Result<(), ConfigError> {
    if low > high {
        Err(ConfigError::conflict(
            low_field,
            format_args!("{low_field} ({low:?}) must not exceed {high_field} ({high:?})"),
        ))
    } else {
        Ok(())
    }
}

/// The rules of the strategies set by a `base` and a `cap`.
pub(super) fn check_base_cap(base: Duration, cap: Duration) -> Result<(), ConfigError> {
    positive("base", base)?;
    ordered("base", base, "cap", cap)
}
