//! `Retry-After` and `grpc-retry-pushback-ms`: how long a server asks a client to wait.

use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderValue, RETRY_AFTER};

use super::headers::GRPC_RETRY_PUSHBACK_MS;

/// Parses a `Retry-After` value: delta-seconds (`120`) or an HTTP-date
/// (`Wed, 21 Oct 2015 07:28:00 GMT`, and the two obsolete forms RFC 9110 still accepts).
///
/// A date is turned into a duration from `now`; a date in the past gives `Duration::ZERO`.
/// Junk (empty, signed, fractional, non-UTF-8, more seconds than fit in 64 bits, an invalid
/// date) gives `None`: a garbled header is treated as absent, never as an error.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderValue;
/// use overload_signal::protocol::parse_retry_after;
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_400); // 07:26:40 GMT
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("3"), now), Some(Duration::from_secs(3)));
/// assert_eq!(
///     parse_retry_after(&HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"), now),
///     Some(Duration::from_secs(80)),
/// );
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("soon"), now), None);
/// ```
pub fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if text.is_empty() {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return parse_digits(text.as_bytes()).map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The `Retry-After` of a response, if present and well-formed (the first header line counts).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    parse_retry_after(headers.get(RETRY_AFTER)?, now)
}

/// Formats a `Retry-After` value: whole seconds, rounded up, at least `1`.
///
/// Rounding up keeps the promise "you will not be rejected for this reason before then";
/// the floor of one second avoids `Retry-After: 0`, which invites an immediate retry storm.
pub fn format_retry_after(wait: Duration) -> HeaderValue {
    let mut secs = wait.as_secs();
    if wait.subsec_nanos() > 0 {
        secs = secs.saturating_add(1);
    }
    HeaderValue::from(secs.max(1))
}

/// A parsed `grpc-retry-pushback-ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrpcPushback {
    /// Retry no sooner than this (and start the backoff over: gRPC's retry design, A6).
    Delay(Duration),
    /// Do not retry: a negative value, or one that is not a 32-bit integer (the gRPC form
    /// of the stop signal, by gRPC's retry design, A6).
    Stop,
}

/// The largest pushback gRPC's retry design (A6) allows: the value is a signed 32-bit
/// integer of milliseconds, about 24.8 days.
const MAX_PUSHBACK_MS: u64 = i32::MAX as u64;

/// Parses a `grpc-retry-pushback-ms` value: a decimal integer of milliseconds, within the
/// 32-bit signed range. By gRPC's retry design (A6), a negative value **and anything that
/// does not parse** (empty, fractional, whitespace inside, a sign other than a leading
/// `-`, non-UTF-8, outside the 32-bit range) mean "do not retry": [`GrpcPushback::Stop`].
/// Whitespace around the value is allowed; `-0` is zero.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use overload_signal::protocol::{GrpcPushback, parse_grpc_pushback};
///
/// assert_eq!(
///     parse_grpc_pushback(&HeaderValue::from_static("250")),
///     GrpcPushback::Delay(Duration::from_millis(250)),
/// );
/// assert_eq!(parse_grpc_pushback(&HeaderValue::from_static("-1")), GrpcPushback::Stop);
/// assert_eq!(parse_grpc_pushback(&HeaderValue::from_static("1.5")), GrpcPushback::Stop);
/// ```
pub fn parse_grpc_pushback(value: &HeaderValue) -> GrpcPushback {
    let text = value.as_bytes().trim_ascii();
    let (negative, digits) = match text.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, text),
    };
    match parse_digits(digits) {
        Some(0) => GrpcPushback::Delay(Duration::ZERO),
        Some(ms) if !negative && ms <= MAX_PUSHBACK_MS => {
            GrpcPushback::Delay(Duration::from_millis(ms))
        }
        _ => GrpcPushback::Stop,
    }
}

/// The `grpc-retry-pushback-ms` of a response, if present (see [`parse_grpc_pushback`]
/// for what a value means).
pub fn grpc_pushback(headers: &HeaderMap) -> Option<GrpcPushback> {
    headers.get(GRPC_RETRY_PUSHBACK_MS).map(parse_grpc_pushback)
}

/// Formats a `grpc-retry-pushback-ms` value: whole milliseconds, rounded up, at most the
/// 32-bit limit gRPC allows (`2147483647`, about 24.8 days; a longer wait is sent as that).
pub fn format_grpc_pushback(wait: Duration) -> HeaderValue {
    let mut ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    if wait.subsec_nanos() % 1_000_000 > 0 {
        ms = ms.saturating_add(1);
    }
    HeaderValue::from(ms.min(MAX_PUSHBACK_MS))
}

/// One or more ASCII digits into a `u64`; `None` for anything else or on overflow.
fn parse_digits(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn hv(s: &'static str) -> HeaderValue {
        HeaderValue::from_static(s)
    }

    #[test]
    fn delta_seconds() {
        assert_eq!(parse_retry_after(&hv("0"), at(0)), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(&hv("3"), at(0)),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            parse_retry_after(&hv(" 120 "), at(0)),
            Some(Duration::from_secs(120))
        );
    }

    #[test]
    fn http_dates_in_all_three_forms() {
        // 1994-11-06 08:49:37 GMT is 784111777.
        let now = at(784_111_777 - 10);
        for v in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(
                parse_retry_after(&HeaderValue::from_str(v).unwrap(), now),
                Some(Duration::from_secs(10)),
                "{v}"
            );
        }
    }

    #[test]
    fn date_in_the_past_is_zero() {
        assert_eq!(
            parse_retry_after(&hv("Sun, 06 Nov 1994 08:49:37 GMT"), at(2_000_000_000)),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn junk_is_none() {
        for v in [
            "",
            " ",
            "-1",
            "+1",
            "1.5",
            "1 2",
            "soon",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "18446744073709551616",
        ] {
            assert_eq!(
                parse_retry_after(&HeaderValue::from_str(v).unwrap(), at(0)),
                None,
                "{v:?}"
            );
        }
        assert_eq!(
            parse_retry_after(&HeaderValue::from_bytes(b"\xff1").unwrap(), at(0)),
            None
        );
        assert_eq!(retry_after(&HeaderMap::new(), at(0)), None);
    }

    #[test]
    fn formatting_rounds_up_to_whole_seconds_at_least_one() {
        assert_eq!(format_retry_after(Duration::ZERO), "1");
        assert_eq!(format_retry_after(Duration::from_nanos(1)), "1");
        assert_eq!(format_retry_after(Duration::from_secs(1)), "1");
        assert_eq!(format_retry_after(Duration::from_millis(1001)), "2");
        assert_eq!(format_retry_after(Duration::from_secs(60)), "60");
        assert_eq!(
            format_retry_after(Duration::MAX),
            u64::MAX.to_string().as_str()
        );
    }

    /// Regression (issue 30, finding 7): a pushback that did not parse was ignored, and a
    /// retry followed; gRPC's retry design (A6) reads it as "do not retry".
    #[test]
    fn pushback() {
        assert_eq!(
            parse_grpc_pushback(&hv("0")),
            GrpcPushback::Delay(Duration::ZERO)
        );
        assert_eq!(
            parse_grpc_pushback(&hv("-0")),
            GrpcPushback::Delay(Duration::ZERO)
        );
        assert_eq!(
            parse_grpc_pushback(&hv(" 2147483647 ")),
            GrpcPushback::Delay(Duration::from_millis(2_147_483_647))
        );
        assert_eq!(parse_grpc_pushback(&hv("-1")), GrpcPushback::Stop);
        assert_eq!(
            parse_grpc_pushback(&hv("-99999999999999999999999")),
            GrpcPushback::Stop
        );
        for junk in [
            "",
            "-",
            "+5",
            "1.0",
            "1 0",
            "abc",
            "2147483648",
            "99999999999999999999999",
            "--1",
        ] {
            assert_eq!(
                parse_grpc_pushback(&hv(junk)),
                GrpcPushback::Stop,
                "{junk:?}"
            );
        }
        assert_eq!(
            parse_grpc_pushback(&HeaderValue::from_bytes(b"\xff1").unwrap()),
            GrpcPushback::Stop
        );
        assert_eq!(grpc_pushback(&HeaderMap::new()), None);
        assert_eq!(format_grpc_pushback(Duration::from_micros(1500)), "2");
        assert_eq!(format_grpc_pushback(Duration::from_millis(7)), "7");
        assert_eq!(format_grpc_pushback(Duration::MAX), "2147483647");
    }

    proptest! {
        #[test]
        fn retry_after_never_panics(s in ".*", now in any::<u32>()) {
            if let Ok(v) = HeaderValue::from_str(&s) {
                let _ = parse_retry_after(&v, at(u64::from(now)));
            }
        }

        #[test]
        fn pushback_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                let _ = parse_grpc_pushback(&v);
            }
        }

        #[test]
        fn retry_after_round_trips_whole_seconds(secs in 1u64..=u64::MAX) {
            let v = format_retry_after(Duration::from_secs(secs));
            prop_assert_eq!(parse_retry_after(&v, at(0)), Some(Duration::from_secs(secs)));
        }

        #[test]
        fn retry_after_rounds_up(nanos in 0u64..10_000_000_000_000) {
            let d = Duration::from_nanos(nanos);
            let back = parse_retry_after(&format_retry_after(d), at(0)).unwrap();
            prop_assert!(back >= d);
            prop_assert!(back >= Duration::from_secs(1));
            prop_assert!(back < d + Duration::from_secs(1) || back == Duration::from_secs(1));
        }

        #[test]
        fn http_date_round_trips(secs in 0u64..253_402_300_799, ahead in 0u64..1_000_000) {
            let now = at(secs);
            let then = now + Duration::from_secs(ahead);
            if then <= at(253_402_300_799) {
                let v = HeaderValue::from_str(&httpdate::fmt_http_date(then)).unwrap();
                prop_assert_eq!(parse_retry_after(&v, now), Some(Duration::from_secs(ahead)));
            }
        }

        #[test]
        fn pushback_round_trips(ms in 0u64..=2_147_483_647) {
            let v = format_grpc_pushback(Duration::from_millis(ms));
            prop_assert_eq!(parse_grpc_pushback(&v), GrpcPushback::Delay(Duration::from_millis(ms)));
        }
    }
}
