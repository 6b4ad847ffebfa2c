//! The one configuration error of the workspace's libraries.

use std::fmt;

/// Why a configuration was refused: which setting, which value, and the rule it broke.
///
/// Every fallible constructor and `build()` in `overload-signal`, `backoff-layer` and
/// `ratelimit-layer` returns this type (the other two crates re-export it as their own
/// `ConfigError`), so an application that builds all three layers handles one error with
/// `?`. It is opaque: read the setting with [`field`](Self::field), the broken rule's
/// category with [`kind`](Self::kind), and a sentence for people with `Display`, which
/// names the setting, the value and the rule.
///
/// ```
/// use overload_core::{ConfigError, ConfigErrorKind};
///
/// let err = ConfigError::out_of_range("jitter", 1.5, "within 0..=1");
/// assert_eq!(err.field(), "jitter");
/// assert_eq!(err.kind(), ConfigErrorKind::OutOfRange);
/// assert_eq!(err.to_string(), "jitter must be within 0..=1, got 1.5");
/// ```
///
/// Types outside this workspace (a custom limiter, backoff or budget) may return it too:
/// its constructors are public.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    kind: ConfigErrorKind,
    message: Box<str>,
}

/// The category of rule a [`ConfigError`] reports.
///
/// Match on it to react to a class of mistakes; the exact rule is in the error's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// A number or duration outside its allowed range: zero where zero means nothing
    /// (a zero rate, a zero window), too large to represent, or past a stated maximum.
    OutOfRange,
    /// A floating-point setting that is NaN or infinite.
    NotFinite,
    /// Two settings that cannot hold together (a minimum above its maximum, a request cost
    /// above the burst).
    Conflict,
    /// A name or text that is not accepted: an unknown choice in a parsed string, a name
    /// that cannot go in a header, an address that does not parse.
    Invalid,
}

impl ConfigError {
    /// An error for setting `field` whose value broke a rule of `kind`, with `message` as
    /// its whole text.
    ///
    /// Prefer the shaped constructors ([`out_of_range`](Self::out_of_range),
    /// [`not_finite`](Self::not_finite), [`conflict`](Self::conflict),
    /// [`invalid`](Self::invalid)), which word every message the same way.
    pub fn new(field: &'static str, kind: ConfigErrorKind, message: impl fmt::Display) -> Self {
        Self {
            field,
            kind,
            message: message.to_string().into_boxed_str(),
        }
    }

    /// `"{field} must be {rule}, got {value}"`, of kind [`ConfigErrorKind::OutOfRange`].
    ///
    /// `rule` reads after "must be": `"at least 1"`, `"within 0..=1"`, `"at most 24h"`.
    pub fn out_of_range(field: &'static str, value: impl fmt::Debug, rule: &str) -> Self {
        Self::new(
            field,
            ConfigErrorKind::OutOfRange,
            format_args!("{field} must be {rule}, got {value:?}"),
        )
    }

    /// `"{field} must be a finite number, got {value}"`, of kind
    /// [`ConfigErrorKind::NotFinite`].
    pub fn not_finite(field: &'static str, value: f64) -> Self {
        Self::new(
            field,
            ConfigErrorKind::NotFinite,
            format_args!("{field} must be a finite number, got {value}"),
        )
    }

    /// A [`ConfigErrorKind::Conflict`] on `field`; `message` says which other setting it
    /// contradicts and both values, for example
    /// `"min_delay (2s) must not exceed max_delay (1s)"`.
    pub fn conflict(field: &'static str, message: impl fmt::Display) -> Self {
        Self::new(field, ConfigErrorKind::Conflict, message)
    }

    /// `"{field} must be {rule}, got {value}"`, of kind [`ConfigErrorKind::Invalid`];
    /// `value` is quoted.
    pub fn invalid(field: &'static str, value: &str, rule: &str) -> Self {
        Self::new(
            field,
            ConfigErrorKind::Invalid,
            format_args!("{field} must be {rule}, got {value:?}"),
        )
    }

    /// The setting that was refused, as its builder method is named (`"jitter"`,
    /// `"max_keys"`).
    pub const fn field(&self) -> &'static str {
        self.field
    }

    /// The category of the rule it broke.
    pub const fn kind(&self) -> ConfigErrorKind {
        self.kind
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigError")
            .field("field", &self.field)
            .field("kind", &self.kind)
            .field("message", &&*self.message)
            .finish()
    }
}

impl std::error::Error for ConfigError {}

// Values print with `Debug`: floats as `1.5` and `NaN`, durations as `1.5s`.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn messages_name_the_field_the_value_and_the_rule() {
        let e = ConfigError::out_of_range("window", Duration::from_millis(1500), "at most 1s");
        assert_eq!(e.to_string(), "window must be at most 1s, got 1.5s");
        assert_eq!(e.kind(), ConfigErrorKind::OutOfRange);

        let e = ConfigError::not_finite("factor", f64::NAN);
        assert_eq!(e.to_string(), "factor must be a finite number, got NaN");
        assert_eq!(e.field(), "factor");

        let e = ConfigError::invalid("algorithm", "leaky", "one of token-bucket, fixed-window");
        assert_eq!(
            e.to_string(),
            "algorithm must be one of token-bucket, fixed-window, got \"leaky\""
        );

        let e = ConfigError::conflict("min_delay", "min_delay (2s) must not exceed max_delay (1s)");
        assert_eq!(e.kind(), ConfigErrorKind::Conflict);
        assert_eq!(
            e.to_string(),
            "min_delay (2s) must not exceed max_delay (1s)"
        );
    }

    #[test]
    fn is_a_boxable_error() {
        let e: Box<dyn std::error::Error + Send + Sync> = Box::new(ConfigError::out_of_range(
            "max_attempts",
            0u32,
            "at least 1",
        ));
        assert!(e.is::<ConfigError>());
        assert_eq!(e.to_string(), "max_attempts must be at least 1, got 0");
    }
}
