//! The checks the algorithms' builders share, each naming the setting it refuses.

use std::time::Duration;

use overload_core::ConfigError;

/// `duration` in whole nanoseconds, or an error naming `field` if it is zero or does not
/// fit in a `u64` (584 years).
pub(super) fn positive_nanos(field: &'static str, duration: Duration) -> Result<u64, ConfigError> {
    if duration.is_zero() {
        return Err(ConfigError::out_of_range(
            field,
            duration,
            "greater than zero",
        ));
    }
    u64::try_from(duration.as_nanos())
        .map_err(|_| ConfigError::out_of_range(field, duration, "at most 584 years"))
}

/// `value` if it is not zero, or an error naming `field`.
pub(super) fn non_zero(field: &'static str, value: u32) -> Result<u32, ConfigError> {
    if value == 0 {
        return Err(ConfigError::out_of_range(field, value, "at least 1"));
    }
    Ok(value)
}
