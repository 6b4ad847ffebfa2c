//! The relative timeouts: how long the caller still waits, counted from when the receiver
//! reads the field (no send time): gRPC's `grpc-timeout`, and Envoy's
//! `x-envoy-expected-rq-timeout-ms`.

use std::time::Duration;

use http::header::{HeaderMap, HeaderValue};

use super::deadline::{MalformedDeadline, digits, parse_number, trim_leading_nul};
use super::headers::{GRPC_TIMEOUT, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS};

/// The largest `TimeoutValue` gRPC allows: eight ASCII digits.
const GRPC_MAX_VALUE: u128 = 99_999_999;

/// Formats a `grpc-timeout` value: the finest unit whose value fits in gRPC's eight digits,
/// truncated (the server's deadline must not be later than the client's), at least `1n`.
///
/// ```
/// use std::time::Duration;
/// use overload_signal::protocol::format_grpc_timeout;
///
/// assert_eq!(format_grpc_timeout(Duration::from_millis(1_500)), "1500000u");
/// assert_eq!(format_grpc_timeout(Duration::from_secs(3_600)), "3600000m");
/// ```
pub fn format_grpc_timeout(timeout: Duration) -> HeaderValue {
    const UNITS: [(u128, u8); 6] = [
        (1, b'n'),
        (1_000, b'u'),
        (1_000_000, b'm'),
        (1_000_000_000, b'S'),
        (60_000_000_000, b'M'),
        (3_600_000_000_000, b'H'),
    ];
    let nanos = timeout.as_nanos();
    let (value, unit) = UNITS
        .iter()
        .find(|(per, _)| nanos / per <= GRPC_MAX_VALUE)
        .map_or((GRPC_MAX_VALUE, b'H'), |&(per, unit)| (nanos / per, unit));
    // NOTE: at most eight digits, so the cast is lossless.
    let number = digits(value.max(1) as u64);
    let number = trim_leading_nul(&number);
    let mut buf = [0u8; 9];
    buf[..number.len()].copy_from_slice(number);
    buf[number.len()] = unit;
    HeaderValue::from_bytes(&buf[..=number.len()]).expect("digits and a letter")
}

/// Parses a `grpc-timeout` value: one to eight ASCII digits and a unit (`H`, `M`, `S`, `m`,
/// `u`, `n`), nothing else (gRPC over HTTP/2's `Timeout` production).
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use overload_signal::protocol::parse_grpc_timeout;
///
/// assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("1000000u")), Ok(Duration::from_secs(1)));
/// assert!(parse_grpc_timeout(&HeaderValue::from_static("1.5S")).is_err());
/// ```
///
/// # Errors
///
/// [`MalformedDeadline`] for anything else.
pub fn parse_grpc_timeout(value: &HeaderValue) -> Result<Duration, MalformedDeadline> {
    let malformed = MalformedDeadline("grpc-timeout is not 1 to 8 digits and a unit");
    let (&unit, number) = value.as_bytes().split_last().ok_or(malformed)?;
    if number.is_empty() || number.len() > 8 || !number.iter().all(u8::is_ascii_digit) {
        return Err(malformed);
    }
    let n = number
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
    Ok(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return Err(malformed),
    })
}

/// Reads `grpc-timeout` from `headers`: `Ok(None)` when it is absent.
///
/// # Errors
///
/// [`MalformedDeadline`] when a value breaks [`parse_grpc_timeout`]'s rules, or several
/// disagree.
pub fn grpc_timeout(headers: &HeaderMap) -> Result<Option<Duration>, MalformedDeadline> {
    agreeing(
        headers,
        GRPC_TIMEOUT,
        parse_grpc_timeout,
        "grpc-timeout repeated with another value",
    )
}

/// Parses an `x-envoy-expected-rq-timeout-ms` value: how long Envoy still waits for this
/// attempt, in milliseconds, counted from when the receiver reads it (the field has no send
/// time). `Ok(None)` for `0`, which is no deadline.
///
/// # Parsing rules
///
/// - 1 to 15 ASCII digits (a Structured Field integer's range, as `X-Request-Deadline`'s
///   values; Envoy's own timeouts, at most 10 000 years, fit in it), nothing else: no sign,
///   no unit, no fraction, no spaces. Leading zeros are allowed.
/// - `0` is no deadline, not an expired one: Envoy reads `0` as "no timeout" in its own
///   timeout headers, and never sends it in this one (it sends `1` when its route timeout
///   has run out), so whoever sent a `0` did not mean "already too late".
///
/// Parsing never panics and never allocates.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use overload_signal::protocol::parse_envoy_expected_rq_timeout;
///
/// let parse = |v| parse_envoy_expected_rq_timeout(&HeaderValue::from_static(v));
/// assert_eq!(parse("1500"), Ok(Some(Duration::from_millis(1_500))));
/// assert_eq!(parse("0"), Ok(None));
/// assert!(parse("1.5").is_err());
/// assert!(parse("15s").is_err());
/// ```
///
/// # Errors
///
/// [`MalformedDeadline`] for anything else.
pub fn parse_envoy_expected_rq_timeout(
    value: &HeaderValue,
) -> Result<Option<Duration>, MalformedDeadline> {
    let ms = parse_number(value.as_bytes()).map_err(|_| {
        MalformedDeadline("x-envoy-expected-rq-timeout-ms is not 1 to 15 ASCII digits")
    })?;
    Ok((ms > 0).then(|| Duration::from_millis(ms)))
}

/// Reads `x-envoy-expected-rq-timeout-ms` from `headers`: `Ok(None)` when it is absent, or
/// `0` ([`parse_envoy_expected_rq_timeout`]'s rules). Several lines are read as one value
/// when they agree (a proxy that merged two), and are malformed when they do not.
///
/// Envoy sets the field on every request it forwards to an upstream while a timeout runs
/// for it: its route timeout (15 s by default) less the time already spent on the request,
/// or the route's per-try timeout if that is shorter, so each attempt of Envoy's retries
/// carries its own.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use overload_signal::protocol::{X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, envoy_expected_rq_timeout};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(envoy_expected_rq_timeout(&headers), Ok(None));
/// headers.insert(X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, "14873".parse().unwrap());
/// assert_eq!(envoy_expected_rq_timeout(&headers), Ok(Some(Duration::from_millis(14_873))));
/// ```
///
/// # Errors
///
/// [`MalformedDeadline`] when a value breaks the parsing rules, or several disagree.
pub fn envoy_expected_rq_timeout(
    headers: &HeaderMap,
) -> Result<Option<Duration>, MalformedDeadline> {
    agreeing(
        headers,
        X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
        parse_envoy_expected_rq_timeout,
        "x-envoy-expected-rq-timeout-ms repeated with another value",
    )
    .map(Option::flatten)
}

/// The value of every line of header `name`, parsed by `parse`, when they all agree;
/// `None` without the header; `repeated` when two lines disagree.
fn agreeing<T: Copy + PartialEq>(
    headers: &HeaderMap,
    name: http::HeaderName,
    parse: fn(&HeaderValue) -> Result<T, MalformedDeadline>,
    repeated: &'static str,
) -> Result<Option<T>, MalformedDeadline> {
    let mut found = None;
    for value in headers.get_all(name) {
        let parsed = parse(value)?;
        if found.is_some_and(|seen| seen != parsed) {
            return Err(MalformedDeadline(repeated));
        }
        found = Some(parsed);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest value a 15-digit field holds.
    const MAX_VALUE: u64 = 999_999_999_999_999;

    fn grpc(timeout: Duration) -> String {
        format_grpc_timeout(timeout).to_str().unwrap().to_owned()
    }

    #[test]
    fn grpc_timeouts_use_the_finest_unit_that_fits_in_eight_digits_truncated() {
        let s = Duration::from_secs;
        assert_eq!(grpc(Duration::from_nanos(1)), "1n");
        assert_eq!(grpc(Duration::from_nanos(99_999_999)), "99999999n");
        assert_eq!(grpc(Duration::from_millis(100)), "100000u");
        assert_eq!(grpc(s(10)), "10000000u");
        assert_eq!(grpc(Duration::from_millis(9_900)), "9900000u");
        assert_eq!(grpc(s(100) + Duration::from_nanos(999)), "100000m");
        assert_eq!(grpc(s(30 * 86_400)), "2592000S");
        assert_eq!(grpc(Duration::MAX), "99999999H");
        assert_eq!(grpc(Duration::ZERO), "1n");
    }

    #[test]
    fn grpc_timeouts_parse_every_unit_and_nothing_else() {
        let p = |v: &'static str| parse_grpc_timeout(&HeaderValue::from_static(v));
        assert_eq!(p("2H"), Ok(Duration::from_secs(7200)));
        assert_eq!(p("3M"), Ok(Duration::from_secs(180)));
        assert_eq!(p("4S"), Ok(Duration::from_secs(4)));
        assert_eq!(p("5m"), Ok(Duration::from_millis(5)));
        assert_eq!(p("6u"), Ok(Duration::from_micros(6)));
        assert_eq!(p("99999999n"), Ok(Duration::from_nanos(99_999_999)));
        assert_eq!(p("99999999H"), Ok(Duration::from_secs(99_999_999 * 3600)));
        for junk in ["", "S", "10", "10x", "-1S", "123456789S", "1.5S", " 1S"] {
            assert!(p(junk).is_err(), "{junk:?}");
        }
        let mut h = HeaderMap::new();
        assert_eq!(grpc_timeout(&h), Ok(None));
        h.append(GRPC_TIMEOUT, HeaderValue::from_static("1S"));
        h.append(GRPC_TIMEOUT, HeaderValue::from_static("1000m"));
        assert_eq!(grpc_timeout(&h), Ok(Some(Duration::from_secs(1))));
        h.append(GRPC_TIMEOUT, HeaderValue::from_static("2S"));
        assert!(grpc_timeout(&h).is_err());
    }

    #[test]
    fn envoys_expected_timeout_is_1_to_15_digits_of_milliseconds_and_nothing_else() {
        let p = |v: &'static str| parse_envoy_expected_rq_timeout(&HeaderValue::from_static(v));
        assert_eq!(p("1"), Ok(Some(Duration::from_millis(1))));
        assert_eq!(p("15000"), Ok(Some(Duration::from_secs(15))));
        assert_eq!(p("015000"), Ok(Some(Duration::from_secs(15))));
        assert_eq!(
            p("999999999999999"),
            Ok(Some(Duration::from_millis(MAX_VALUE)))
        );
        assert_eq!(p("0"), Ok(None), "Envoy's \"no timeout\"");
        assert_eq!(p("000"), Ok(None));
        for junk in [
            "",
            " ",
            " 5",
            "5 ",
            "-1",
            "+5",
            "1.5",
            "1e3",
            "0x10",
            "5ms",
            "15s",
            "5, 6",
            "1000000000000000",
            "99999999999999999999",
        ] {
            let err = p(junk).unwrap_err();
            assert_eq!(
                err.to_string(),
                "malformed deadline: x-envoy-expected-rq-timeout-ms is not 1 to 15 ASCII digits",
                "{junk:?}"
            );
        }
        let non_ascii = HeaderValue::from_bytes(b"1\xff").unwrap();
        assert!(parse_envoy_expected_rq_timeout(&non_ascii).is_err());
    }

    #[test]
    fn envoys_expected_timeout_lines_must_agree() {
        let mut h = HeaderMap::new();
        assert_eq!(envoy_expected_rq_timeout(&h), Ok(None));
        h.append(
            X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            HeaderValue::from_static("1000"),
        );
        h.append(
            X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            HeaderValue::from_static("01000"),
        );
        assert_eq!(
            envoy_expected_rq_timeout(&h),
            Ok(Some(Duration::from_secs(1)))
        );
        h.append(
            X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            HeaderValue::from_static("999"),
        );
        assert!(envoy_expected_rq_timeout(&h).is_err());
        let mut zeros = HeaderMap::new();
        zeros.append(
            X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            HeaderValue::from_static("0"),
        );
        zeros.append(
            X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            HeaderValue::from_static("0"),
        );
        assert_eq!(envoy_expected_rq_timeout(&zeros), Ok(None));
        zeros.append(
            X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            HeaderValue::from_static("5"),
        );
        assert!(envoy_expected_rq_timeout(&zeros).is_err());
    }
}
