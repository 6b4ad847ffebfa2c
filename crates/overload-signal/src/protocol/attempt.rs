//! The `X-Request-Attempt` counter.

use std::fmt;

use http::header::{HeaderMap, HeaderValue};

use super::grpc::is_grpc;
use super::headers::{GRPC_PREVIOUS_RPC_ATTEMPTS, X_REQUEST_ATTEMPT};

/// The attempt counter of a request, as read from its headers.
///
/// `Number(0)` is a first try, `Number(1)` the first retry, and so on. A request without the
/// header is [`Unknown`](Attempt::Unknown); one whose header cannot be trusted is
/// [`Malformed`](Attempt::Malformed). Neither of the last two counts as a retry: a server
/// must never punish a client for a header it could not read.
///
/// # Parsing rules
///
/// - Optional whitespace around a value is ignored (HTTP strips it anyway).
/// - A value is one or more ASCII digits; leading zeros are allowed. Anything else (empty,
///   a sign, whitespace inside, any other character, non-UTF-8 bytes) is `Malformed`.
/// - A value that does not fit in 64 bits is `Malformed`; one that fits but exceeds
///   [`Attempt::CLAMP`] becomes `Number(Attempt::CLAMP)`.
/// - Several header lines, or a comma-separated list, must all agree; if they disagree the
///   counter is `Malformed`.
/// - On gRPC requests (see [`is_grpc`](super::is_grpc)), `grpc-previous-rpc-attempts` is read
///   with the same rules when `X-Request-Attempt` is absent.
///
/// Parsing never panics and never allocates.
///
/// # Examples
///
/// ```
/// use http::HeaderMap;
/// use overload_signal::protocol::{Attempt, X_REQUEST_ATTEMPT};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(X_REQUEST_ATTEMPT, Attempt::header_value(3));
/// assert_eq!(Attempt::from_headers(&headers), Attempt::Number(3));
///
/// headers.append(X_REQUEST_ATTEMPT, Attempt::header_value(4));
/// assert_eq!(Attempt::from_headers(&headers), Attempt::Malformed);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attempt {
    /// A well-formed counter: `0` for a first try, `n` for the `n`th retry.
    Number(u32),
    /// No counter was sent.
    Unknown,
    /// A counter was sent but could not be read; treated as unknown.
    Malformed,
}

impl Attempt {
    /// The largest counter value kept: `1_000_000`. Larger (but 64-bit) values clamp to it.
    ///
    /// No real client retries a million times; the clamp keeps arithmetic on counters (sums,
    /// histograms) far from overflow without turning a merely silly value into an error.
    pub const CLAMP: u32 = 1_000_000;

    /// Reads the counter from `X-Request-Attempt`, and from `grpc-previous-rpc-attempts` when
    /// the headers are a gRPC request's and ours is absent.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        Self::from_headers_of(headers, is_grpc(headers))
    }

    /// [`from_headers`](Self::from_headers) for a message whose protocol is known: `grpc`
    /// when it is gRPC (`grpc-previous-rpc-attempts` is then read when ours is absent). Saves
    /// a look-up of `content-type` on a path that has read it already.
    #[inline]
    pub(crate) fn from_headers_of(headers: &HeaderMap, grpc: bool) -> Self {
        let ours = headers.get_all(X_REQUEST_ATTEMPT);
        if ours.iter().next().is_some() {
            return parse_values(ours.iter());
        }
        if grpc {
            let grpc = headers.get_all(GRPC_PREVIOUS_RPC_ATTEMPTS);
            if grpc.iter().next().is_some() {
                return parse_values(grpc.iter());
            }
        }
        Attempt::Unknown
    }

    /// Reads the counter of a request; see [`Attempt::from_headers`].
    pub fn from_request<B>(request: &http::Request<B>) -> Self {
        Self::from_headers(request.headers())
    }

    /// Parses one header value (which may be a comma-separated list).
    pub fn parse(value: &HeaderValue) -> Self {
        parse_values(std::iter::once(value))
    }

    /// Whether this is a known retry (`Number(n)` with `n >= 1`).
    pub const fn is_retry(self) -> bool {
        matches!(self, Attempt::Number(n) if n >= 1)
    }

    /// The counter, if known.
    pub const fn number(self) -> Option<u32> {
        match self {
            Attempt::Number(n) => Some(n),
            Attempt::Unknown | Attempt::Malformed => None,
        }
    }

    /// The header value for attempt `n` (`0` is the first try).
    ///
    /// Values up to 9 (every attempt of any sane retry policy) are static and cost no
    /// allocation; larger ones are formatted.
    pub fn header_value(n: u32) -> HeaderValue {
        const SMALL: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
        match SMALL.get(n as usize) {
            Some(s) => HeaderValue::from_static(s),
            None => HeaderValue::from(n),
        }
    }

    /// Sets `X-Request-Attempt: n` on `headers`, replacing any value already there.
    pub fn set(headers: &mut HeaderMap, n: u32) {
        headers.insert(X_REQUEST_ATTEMPT, Self::header_value(n));
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attempt::Number(n) => write!(f, "{n}"),
            Attempt::Unknown => f.write_str("unknown"),
            Attempt::Malformed => f.write_str("malformed"),
        }
    }
}

fn parse_values<'a>(values: impl Iterator<Item = &'a HeaderValue>) -> Attempt {
    let mut seen: Option<u32> = None;
    for value in values {
        for item in value.as_bytes().split(|&b| b == b',') {
            let Some(n) = parse_item(item) else {
                return Attempt::Malformed;
            };
            match seen {
                Some(prev) if prev != n => return Attempt::Malformed,
                _ => seen = Some(n),
            }
        }
    }
    seen.map_or(Attempt::Unknown, Attempt::Number)
}

/// One list item: optional whitespace, then digits, then optional whitespace.
fn parse_item(item: &[u8]) -> Option<u32> {
    let item = item.trim_ascii();
    if item.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in item {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(u32::try_from(n).map_or(Attempt::CLAMP, |n| n.min(Attempt::CLAMP)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::CONTENT_TYPE;
    use proptest::prelude::*;

    fn with(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(X_REQUEST_ATTEMPT, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn missing_is_unknown() {
        assert_eq!(Attempt::from_headers(&HeaderMap::new()), Attempt::Unknown);
    }

    #[test]
    fn well_formed_values() {
        assert_eq!(Attempt::from_headers(&with(&[b"0"])), Attempt::Number(0));
        assert_eq!(Attempt::from_headers(&with(&[b"1"])), Attempt::Number(1));
        assert_eq!(Attempt::from_headers(&with(&[b"007"])), Attempt::Number(7));
        assert_eq!(Attempt::from_headers(&with(&[b" 2\t"])), Attempt::Number(2));
    }

    #[test]
    fn malformed_values() {
        for v in [
            &b""[..],
            b" ",
            b"-1",
            b"+1",
            b"1 2",
            b"1.0",
            b"one",
            b"0x1",
            b"1e3",
            b"\xff",
            b"18446744073709551616", // u64::MAX + 1
            b"1,",
            b",",
        ] {
            assert_eq!(
                Attempt::from_headers(&with(&[v])),
                Attempt::Malformed,
                "{:?}",
                String::from_utf8_lossy(v)
            );
        }
    }

    #[test]
    fn large_values_clamp() {
        assert_eq!(
            Attempt::from_headers(&with(&[b"1000000"])),
            Attempt::Number(1_000_000)
        );
        assert_eq!(
            Attempt::from_headers(&with(&[b"1000001"])),
            Attempt::Number(Attempt::CLAMP)
        );
        assert_eq!(
            Attempt::from_headers(&with(&[b"18446744073709551615"])),
            Attempt::Number(Attempt::CLAMP)
        );
    }

    #[test]
    fn repeated_headers_must_agree() {
        assert_eq!(
            Attempt::from_headers(&with(&[b"2", b"2"])),
            Attempt::Number(2)
        );
        assert_eq!(
            Attempt::from_headers(&with(&[b"2", b"3"])),
            Attempt::Malformed
        );
        assert_eq!(Attempt::from_headers(&with(&[b"2, 2"])), Attempt::Number(2));
        assert_eq!(Attempt::from_headers(&with(&[b"2,3"])), Attempt::Malformed);
        assert_eq!(
            Attempt::from_headers(&with(&[b"2", b"x"])),
            Attempt::Malformed
        );
    }

    #[test]
    fn grpc_previous_attempts_only_for_grpc_and_only_as_fallback() {
        let mut h = HeaderMap::new();
        h.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, HeaderValue::from_static("2"));
        // Not a gRPC request: the gRPC header is not ours to read.
        assert_eq!(Attempt::from_headers(&h), Attempt::Unknown);
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        assert_eq!(Attempt::from_headers(&h), Attempt::Number(2));
        h.insert(X_REQUEST_ATTEMPT, HeaderValue::from_static("1"));
        assert_eq!(Attempt::from_headers(&h), Attempt::Number(1));
        h.remove(X_REQUEST_ATTEMPT);
        h.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, HeaderValue::from_static("-2"));
        assert_eq!(Attempt::from_headers(&h), Attempt::Malformed);
    }

    #[test]
    fn is_retry_and_number() {
        assert!(!Attempt::Number(0).is_retry());
        assert!(Attempt::Number(1).is_retry());
        assert!(!Attempt::Unknown.is_retry());
        assert!(!Attempt::Malformed.is_retry());
        assert_eq!(Attempt::Number(5).number(), Some(5));
        assert_eq!(Attempt::Malformed.number(), None);
        assert_eq!(Attempt::Number(5).to_string(), "5");
        assert_eq!(Attempt::Unknown.to_string(), "unknown");
    }

    proptest! {
        #[test]
        fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                let _ = Attempt::parse(&v);
            }
        }

        #[test]
        fn any_string_never_panics(s in ".*") {
            if let Ok(v) = HeaderValue::from_str(&s) {
                let _ = Attempt::parse(&v);
            }
        }

        #[test]
        fn header_value_is_the_decimal_number(n in any::<u32>()) {
            let v = Attempt::header_value(n);
            prop_assert_eq!(v.to_str().unwrap(), n.to_string());
        }

        #[test]
        fn format_then_parse_round_trips(n in 0..=Attempt::CLAMP) {
            let mut h = HeaderMap::new();
            Attempt::set(&mut h, n);
            prop_assert_eq!(Attempt::from_headers(&h), Attempt::Number(n));
        }

        #[test]
        fn above_clamp_clamps(n in (u64::from(Attempt::CLAMP) + 1)..=u64::MAX) {
            let v = HeaderValue::from(n);
            prop_assert_eq!(Attempt::parse(&v), Attempt::Number(Attempt::CLAMP));
        }
    }
}
