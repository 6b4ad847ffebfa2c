//! The IETF `RateLimit-Policy` and `RateLimit` fields (httpapi ratelimit-headers draft).
//!
//! Both are Structured Field lists whose items are the policy name (an sf-string) with
//! parameters: `q` (quota) and `w` (window, seconds) on the policy; `r` (remaining) and `t`
//! (seconds until the quota resets) on the status. This module writes one item per field.

use std::fmt::Write as _;
use std::time::Duration;

use http::HeaderValue;

use overload_core::ConfigError;

/// The largest integer a Structured Field may carry (15 decimal digits); larger values clamp.
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// Checks a policy name: non-empty printable ASCII, which a Structured Field string can
/// carry.
fn validate_name(name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(ConfigError::invalid(
            "name",
            name,
            "non-empty printable ASCII (0x20 to 0x7e)",
        ));
    }
    Ok(())
}

fn write_sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// Whole seconds, rounded up, clamped to the Structured Field integer range.
fn ceil_secs(d: Duration) -> u64 {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    secs.min(SF_INTEGER_MAX)
}

fn header_value(s: String) -> HeaderValue {
    // NOTE: names are validated as printable ASCII and numbers are digits, so the value is
    // always a valid header value.
    HeaderValue::try_from(s).expect("validated printable ASCII is a valid header value")
}

/// A `RateLimit-Policy` item: a named quota per window, such as `"default";q=100;w=1`.
///
/// Build it once at configuration time; [`to_header_value`](Self::to_header_value) is then
/// a cheap clone, and [`status`](Self::status) writes the matching `RateLimit` field.
///
/// The window is written in whole seconds, rounded up (the field has no finer unit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitPolicy {
    name: Box<str>,
    quota: u64,
    window: Duration,
    header: HeaderValue,
}

impl RateLimitPolicy {
    /// A policy named `name` allowing `quota` units per `window`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when the name (`name`) is empty or not printable ASCII (`0x20` to
    /// `0x7e`, what a Structured Field string can carry), or the window (`window`) is zero:
    /// the field's `w` must be at least one second.
    pub fn new(name: &str, quota: u64, window: Duration) -> Result<Self, ConfigError> {
        validate_name(name)?;
        if window.is_zero() {
            return Err(ConfigError::out_of_range(
                "window",
                window,
                "more than zero",
            ));
        }
        let mut s = String::with_capacity(name.len() + 32);
        write_sf_string(&mut s, name);
        let _ = write!(
            s,
            ";q={};w={}",
            quota.min(SF_INTEGER_MAX),
            ceil_secs(window).max(1)
        );
        Ok(Self {
            name: name.into(),
            quota,
            window,
            header: header_value(s),
        })
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quota per window.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// The window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The `RateLimit-Policy` field value.
    pub fn to_header_value(&self) -> HeaderValue {
        self.header.clone()
    }

    /// The `RateLimit` field value for this policy: `remaining` units left, and the quota
    /// resets in `reset` (written in whole seconds, rounded up).
    pub fn status(&self, remaining: u64, reset: Duration) -> HeaderValue {
        format_status(&self.name, remaining, reset)
    }
}

fn format_status(name: &str, remaining: u64, reset: Duration) -> HeaderValue {
    let mut s = String::with_capacity(name.len() + 32);
    write_sf_string(&mut s, name);
    let _ = write!(
        s,
        ";r={};t={}",
        remaining.min(SF_INTEGER_MAX),
        ceil_secs(reset)
    );
    header_value(s)
}

/// A `RateLimit` item: what is left of a named policy and when it resets, such as
/// `"default";r=0;t=1`. Also parses the field, for clients that want to read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitStatus {
    name: String,
    remaining: u64,
    reset: Option<Duration>,
}

impl RateLimitStatus {
    /// The status of policy `name`: `remaining` units left, resetting in `reset`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when the name (`name`) is empty or not printable ASCII (`0x20` to
    /// `0x7e`).
    pub fn new(name: &str, remaining: u64, reset: Duration) -> Result<Self, ConfigError> {
        validate_name(name)?;
        Ok(Self {
            name: name.to_owned(),
            remaining,
            reset: Some(reset),
        })
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Units left in the current window (`r`).
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Time until the quota resets (`t`), if the field said.
    pub fn reset(&self) -> Option<Duration> {
        self.reset
    }

    /// The `RateLimit` field value. The reset is written in whole seconds, rounded up.
    pub fn to_header_value(&self) -> HeaderValue {
        format_status(
            &self.name,
            self.remaining,
            self.reset.unwrap_or(Duration::ZERO),
        )
    }

    /// Parses the first item of a `RateLimit` field. Returns `None` for anything that is
    /// not a string item with a non-negative integer `r` parameter; unknown parameters are
    /// ignored, as the draft requires.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::HeaderValue;
    /// use overload_signal::protocol::RateLimitStatus;
    ///
    /// let s = RateLimitStatus::parse(&HeaderValue::from_static("\"api\";r=5;t=30")).unwrap();
    /// assert_eq!((s.name(), s.remaining(), s.reset()), ("api", 5, Some(Duration::from_secs(30))));
    /// ```
    pub fn parse(value: &HeaderValue) -> Option<Self> {
        let text = value.to_str().ok()?.trim_start();
        let (name, mut rest) = parse_sf_string(text)?;
        let mut remaining = None;
        let mut reset = None;
        loop {
            rest = rest.trim_start_matches(' ');
            if rest.is_empty() || rest.starts_with(',') {
                break;
            }
            rest = rest.strip_prefix(';')?.trim_start_matches(' ');
            let key_len = rest
                .find(|c: char| {
                    !(c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.*".contains(c))
                })
                .unwrap_or(rest.len());
            let (key, after) = rest.split_at(key_len);
            if key.is_empty() {
                return None;
            }
            let (value, after) = match after.strip_prefix('=') {
                Some(v) => {
                    let end = v.find([';', ',', ' ']).unwrap_or(v.len());
                    (Some(&v[..end]), &v[end..])
                }
                None => (None, after),
            };
            match key {
                "r" => remaining = Some(parse_sf_uint(value?)?),
                "t" => reset = Some(Duration::from_secs(parse_sf_uint(value?)?)),
                _ => {}
            }
            rest = after;
        }
        Some(Self {
            name,
            remaining: remaining?,
            reset,
        })
    }
}

fn parse_sf_string(s: &str) -> Option<(String, &str)> {
    let mut chars = s.strip_prefix('"')?.char_indices();
    let mut out = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                (_, e @ ('"' | '\\')) => out.push(e),
                _ => return None,
            },
            '"' => return Some((out, &s[i + 2..])),
            c if (' '..='~').contains(&c) => out.push(c),
            _ => return None,
        }
    }
    None
}

fn parse_sf_uint(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 15 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use overload_core::ConfigErrorKind;
    use proptest::prelude::*;

    #[test]
    fn design_table_examples() {
        let p = RateLimitPolicy::new("default", 100, Duration::from_secs(1)).unwrap();
        assert_eq!(p.to_header_value(), "\"default\";q=100;w=1");
        assert_eq!(p.status(0, Duration::from_millis(1)), "\"default\";r=0;t=1");
        assert_eq!(p.status(7, Duration::ZERO), "\"default\";r=7;t=0");
    }

    #[test]
    fn window_rounds_up() {
        let p = RateLimitPolicy::new("x", 5, Duration::from_millis(500)).unwrap();
        assert_eq!(p.to_header_value(), "\"x\";q=5;w=1");
        let p = RateLimitPolicy::new("x", 5, Duration::from_millis(10_500)).unwrap();
        assert_eq!(p.to_header_value(), "\"x\";q=5;w=11");
    }

    #[test]
    fn names_are_escaped_and_validated() {
        let p = RateLimitPolicy::new(r#"a"b\c"#, 1, Duration::from_secs(1)).unwrap();
        assert_eq!(p.to_header_value(), r#""a\"b\\c";q=1;w=1"#);
        let e = RateLimitPolicy::new("", 1, Duration::from_secs(1)).unwrap_err();
        assert_eq!((e.field(), e.kind()), ("name", ConfigErrorKind::Invalid));
        assert_eq!(
            e.to_string(),
            "name must be non-empty printable ASCII (0x20 to 0x7e), got \"\""
        );
        let e = RateLimitPolicy::new("é", 1, Duration::from_secs(1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "name must be non-empty printable ASCII (0x20 to 0x7e), got \"é\""
        );
        let e = RateLimitStatus::new("a\tb", 1, Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.field(), "name");
        let e = RateLimitPolicy::new("x", 1, Duration::ZERO).unwrap_err();
        assert_eq!(
            (e.field(), e.kind()),
            ("window", ConfigErrorKind::OutOfRange)
        );
        assert_eq!(e.to_string(), "window must be more than zero, got 0ns");
    }

    #[test]
    fn huge_numbers_clamp_to_sf_integer() {
        let p = RateLimitPolicy::new("x", u64::MAX, Duration::MAX).unwrap();
        assert_eq!(
            p.to_header_value(),
            "\"x\";q=999999999999999;w=999999999999999"
        );
    }

    #[test]
    fn parse_tolerates_unknown_params_and_lists() {
        let s = RateLimitStatus::parse(&HeaderValue::from_static(
            "\"a\";pk=:abc=:;r=3;t=9, \"b\";r=1",
        ))
        .unwrap();
        assert_eq!(s.name(), "a");
        assert_eq!(s.remaining(), 3);
        assert_eq!(s.reset(), Some(Duration::from_secs(9)));
        for junk in [
            "",
            "a;r=1",
            "\"a\"",
            "\"a\";r=-1",
            "\"a\";r=x",
            "\"a",
            "\"a\";=1",
        ] {
            assert_eq!(
                RateLimitStatus::parse(&HeaderValue::from_static(junk)),
                None,
                "{junk:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".*") {
            if let Ok(v) = HeaderValue::from_str(&s) {
                let _ = RateLimitStatus::parse(&v);
            }
        }

        #[test]
        fn status_round_trips(
            name in "[ -~]{1,24}",
            remaining in 0u64..=SF_INTEGER_MAX,
            reset in 0u64..=SF_INTEGER_MAX,
        ) {
            let s = RateLimitStatus::new(&name, remaining, Duration::from_secs(reset)).unwrap();
            let back = RateLimitStatus::parse(&s.to_header_value()).unwrap();
            prop_assert_eq!(back, s);
        }
    }
}
