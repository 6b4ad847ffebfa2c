//! gRPC wire details the retry layer needs beyond the shared protocol: `grpc-timeout`, and
//! reading `grpc-message`.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

/// `grpc-timeout`: how long the server may work on the call (gRPC over HTTP/2).
pub(crate) const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The largest `TimeoutValue` gRPC allows: eight ASCII digits.
const MAX_VALUE: u128 = 99_999_999;

/// Sets `grpc-timeout` to `window`, unless the request already carries a shorter one (the
/// caller's own per-call timeout, which stays the tighter promise).
pub(crate) fn set_timeout(headers: &mut HeaderMap, window: Duration) {
    let callers = headers.get(GRPC_TIMEOUT).and_then(parse_timeout);
    if callers.is_some_and(|callers| callers <= window) {
        return;
    }
    headers.insert(GRPC_TIMEOUT, format_timeout(window));
}

/// Formats a `grpc-timeout` value: the finest unit whose value fits in eight digits,
/// truncated (the server's deadline must not be later than the client's), at least 1.
fn format_timeout(window: Duration) -> HeaderValue {
    const UNITS: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    let nanos = window.as_nanos();
    let (value, unit) = UNITS
        .iter()
        .find(|(per, _)| nanos / per <= MAX_VALUE)
        .map_or((MAX_VALUE, 'H'), |&(per, unit)| (nanos / per, unit));
    let text = format!("{}{unit}", value.max(1));
    HeaderValue::from_str(&text).expect("digits and a letter form a header value")
}

/// Parses a `grpc-timeout` value (one to eight digits and a unit: `H`, `M`, `S`, `m`, `u`,
/// `n`); `None` for anything else.
fn parse_timeout(value: &HeaderValue) -> Option<Duration> {
    let bytes = value.as_bytes();
    let (&unit, digits) = bytes.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Decodes a `grpc-message` (percent-encoded UTF-8); invalid sequences are kept as they are
/// and invalid UTF-8 is replaced, so a hostile server cannot make it fail.
#[cfg(feature = "tonic")]
pub(crate) fn decode_message(value: &HeaderValue) -> String {
    fn hex(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = (bytes[i] == b'%')
            .then(|| Some((hex(*bytes.get(i + 1)?)? << 4) | hex(*bytes.get(i + 2)?)?))
            .flatten();
        match decoded {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(existing: Option<&'static str>, window: Duration) -> String {
        let mut h = HeaderMap::new();
        if let Some(v) = existing {
            h.insert(GRPC_TIMEOUT, HeaderValue::from_static(v));
        }
        set_timeout(&mut h, window);
        h[GRPC_TIMEOUT].to_str().unwrap().to_owned()
    }

    #[test]
    fn the_finest_unit_that_fits_in_eight_digits_truncated() {
        let s = Duration::from_secs;
        assert_eq!(set(None, Duration::from_nanos(1)), "1n");
        assert_eq!(set(None, Duration::from_nanos(99_999_999)), "99999999n");
        assert_eq!(set(None, Duration::from_millis(100)), "100000u");
        assert_eq!(set(None, s(10)), "10000000u");
        assert_eq!(set(None, Duration::from_millis(9_900)), "9900000u");
        assert_eq!(set(None, s(100) + Duration::from_nanos(999)), "100000m");
        assert_eq!(set(None, s(30 * 86_400)), "2592000S");
        assert_eq!(set(None, Duration::MAX), "99999999H");
        assert_eq!(set(None, Duration::ZERO), "1n");
    }

    #[test]
    fn a_shorter_timeout_of_the_caller_is_kept() {
        let s = Duration::from_secs;
        assert_eq!(set(Some("1S"), s(10)), "1S");
        assert_eq!(set(Some("10S"), s(10)), "10S");
        assert_eq!(set(Some("11S"), s(10)), "10000000u");
        assert_eq!(set(Some("1H"), s(10)), "10000000u");
        assert_eq!(set(Some("500m"), s(1)), "500m");
        // Junk from the caller is replaced.
        for junk in ["", "S", "10", "10x", "-1S", "123456789S", "1.5S"] {
            let mut h = HeaderMap::new();
            h.insert(GRPC_TIMEOUT, HeaderValue::from_str(junk).unwrap());
            set_timeout(&mut h, s(1));
            assert_eq!(h[GRPC_TIMEOUT], "1000000u", "{junk:?}");
        }
    }

    #[test]
    fn parse_every_unit() {
        let p = |v: &'static str| parse_timeout(&HeaderValue::from_static(v));
        assert_eq!(p("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(p("3M"), Some(Duration::from_secs(180)));
        assert_eq!(p("4S"), Some(Duration::from_secs(4)));
        assert_eq!(p("5m"), Some(Duration::from_millis(5)));
        assert_eq!(p("6u"), Some(Duration::from_micros(6)));
        assert_eq!(p("99999999n"), Some(Duration::from_nanos(99_999_999)));
        assert_eq!(p("99999999H"), Some(Duration::from_secs(99_999_999 * 3600)));
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn grpc_messages_are_percent_decoded_leniently() {
        let d = |v: &'static str| decode_message(&HeaderValue::from_static(v));
        assert_eq!(
            d("system overloaded, stop retrying"),
            "system overloaded, stop retrying"
        );
        assert_eq!(d("50%25 off%0A"), "50% off\n");
        assert_eq!(d("%E2%9C%93"), "\u{2713}");
        assert_eq!(d("100%"), "100%");
        assert_eq!(d("%zz%4"), "%zz%4");
        assert_eq!(d("%FF"), "\u{FFFD}");
    }
}
