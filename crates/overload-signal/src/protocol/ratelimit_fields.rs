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

/// `quota` per `window` (not zero) as a quota per whole seconds: the window rounded up to
/// whole seconds (at least one), the quota scaled to it and rounded down. A window past the
/// Structured Field range keeps its quota.
fn whole_seconds(quota: u64, window: Duration) -> (u64, Duration) {
    let secs = ceil_secs(window).max(1);
    let whole = Duration::from_secs(secs);
    let Some(extra) = whole.checked_sub(window) else {
        return (quota, whole);
    };
    // NOTE: floor(quota * whole / window) = quota + floor(quota * extra / window), with
    // extra < 1 s: the product stays within a u128 whatever the quota.
    let added = u128::from(quota) * extra.as_nanos() / window.as_nanos();
    let quota = u64::try_from(u128::from(quota) + added).unwrap_or(u64::MAX);
    (quota, whole)
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
/// The draft's `w` is whole seconds (no finer unit, never zero), and `q` is the quota over
/// that window. A window that is not a whole number of seconds is advertised as the next
/// whole second, with the quota scaled to it and rounded down, so that the rate the field
/// shows is never above the real one and never far below it:
///
/// ```
/// use std::time::Duration;
/// use overload_signal::protocol::RateLimitPolicy;
///
/// let ms = Duration::from_millis;
/// let p = |quota, window| RateLimitPolicy::new("api", quota, window).unwrap().to_header_value();
/// assert_eq!(p(100, Duration::from_secs(60)), "\"api\";q=100;w=60");
/// assert_eq!(p(10, ms(100)), "\"api\";q=100;w=1"); // not q=10: a tenth of the rate
/// assert_eq!(p(5, ms(1_500)), "\"api\";q=6;w=2"); // 6.67 per 2 s, rounded down
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitPolicy {
    name: Box<str>,
    /// `q`, over `window`.
    quota: u64,
    /// `w`: whole seconds, at least one.
    window: Duration,
    header: HeaderValue,
}

impl RateLimitPolicy {
    /// A policy named `name` allowing `quota` units per `window`, advertised over a whole
    /// number of seconds as the type's docs say.
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
        let (quota, window) = whole_seconds(quota, window);
        let mut s = String::with_capacity(name.len() + 32);
        write_sf_string(&mut s, name);
        let _ = write!(s, ";q={};w={}", quota.min(SF_INTEGER_MAX), window.as_secs());
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

    /// The quota the field advertises (`q`): units per [`window`](Self::window).
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// The window the field advertises (`w`): whole seconds, at least one.
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

    /// Regression (issue 30, finding 7): a window that is not whole seconds was rounded up
    /// with its quota unchanged, so `10 per 100 ms` was advertised as `q=10;w=1`, ten times
    /// under the real rate. The quota is scaled to the whole seconds now, rounded down.
    #[test]
    fn a_window_rounded_up_to_whole_seconds_scales_its_quota() {
        let p = |quota, ms| {
            let p = RateLimitPolicy::new("x", quota, Duration::from_millis(ms)).unwrap();
            (p.to_header_value(), p.quota(), p.window().as_secs())
        };
        assert_eq!(p(10, 100), ("\"x\";q=100;w=1".parse().unwrap(), 100, 1));
        assert_eq!(p(5, 500), ("\"x\";q=10;w=1".parse().unwrap(), 10, 1));
        assert_eq!(p(5, 10_500), ("\"x\";q=5;w=11".parse().unwrap(), 5, 11));
        assert_eq!(p(5, 1_500), ("\"x\";q=6;w=2".parse().unwrap(), 6, 2));
        assert_eq!(p(7, 3_000), ("\"x\";q=7;w=3".parse().unwrap(), 7, 3));
        // One unit per nanosecond, and the largest quota: no overflow.
        let fine = RateLimitPolicy::new("x", u64::MAX, Duration::from_nanos(1)).unwrap();
        assert_eq!(fine.to_header_value(), "\"x\";q=999999999999999;w=1");
        assert_eq!(fine.quota(), u64::MAX);
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
