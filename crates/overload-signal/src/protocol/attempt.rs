//! The attempt counter: `X-Request-Attempt`, and the counters of Envoy and gRPC.

use std::fmt;

use http::header::{HeaderMap, HeaderValue};

use super::fields::RequestFields;
use super::grpc::is_grpc;
use super::headers::{GRPC_PREVIOUS_RPC_ATTEMPTS, X_ENVOY_ATTEMPT_COUNT, X_REQUEST_ATTEMPT};

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
///
/// # Counters from proxies and other clients
///
/// Three headers count attempts, each read by the rules above:
///
/// | header | sent by | read | its value `n` is |
/// |---|---|---|---|
/// | [`X-Request-Attempt`](super::X_REQUEST_ATTEMPT) | this workspace's clients | always | `Number(n)` |
/// | [`x-envoy-attempt-count`](super::X_ENVOY_ATTEMPT_COUNT) | Envoy (Istio, Envoy Gateway, Contour, ...), when the route or virtual host sets `include_request_attempt_count: true` | always | `Number(n - 1)`: Envoy counts from `1`; `0` is `Malformed` |
/// | [`grpc-previous-rpc-attempts`](super::GRPC_PREVIOUS_RPC_ATTEMPTS) | gRPC clients in every language, on retries | on gRPC requests (see [`is_grpc`](super::is_grpc)) | `Number(n)` |
///
/// When a request carries several, its counter is the **largest well-formed one**; when
/// none is well-formed and one is malformed, `Malformed`; when it carries none, `Unknown`.
/// A request retried by any tier is a retry at this server: our client's first try
/// (`X-Request-Attempt: 0`) retried by an Envoy sidecar carries `x-envoy-attempt-count: 2`,
/// and counts as the first retry. A malformed counter beside a well-formed one is ignored,
/// as a malformed counter alone counts as no counter.
///
/// Whichever header claims a retry, the overload layer counts it only from a caller its
/// [`Trust`](crate::Trust) setting trusts. The default,
/// [`Trust::private_networks`](crate::Trust::private_networks), trusts an Envoy sidecar or
/// gateway on a loopback or private address without configuration. Envoy sets
/// `x-envoy-attempt-count` only where the route or virtual host has
/// `include_request_attempt_count: true`, and then replaces whatever the client sent;
/// without it, a client's own `x-envoy-attempt-count` passes through Envoy, and that client
/// is judged by the trust setting as any other claimant. An **edge** Envoy, which forwards
/// clients from the Internet, should therefore set `include_request_attempt_count: true`,
/// and, since Envoy passes a client's `X-Request-Attempt` on untouched, either show the
/// client's address (`use_remote_address: true` appends it to `X-Forwarded-For`, and the
/// default trust then counts no claim made for a client on the Internet) or remove the
/// client's counters (`request_headers_to_remove`).
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
///
/// Our client's first try, retried once by an Envoy sidecar:
///
/// ```
/// use http::Request;
/// use overload_signal::protocol::{Attempt, X_ENVOY_ATTEMPT_COUNT, X_REQUEST_ATTEMPT};
///
/// let request = Request::builder()
///     .header(X_REQUEST_ATTEMPT, "0")
///     .header(X_ENVOY_ATTEMPT_COUNT, "2") // Envoy counts from 1
///     .body(())
///     .unwrap();
/// assert_eq!(Attempt::from_request(&request), Attempt::Number(1));
/// assert!(Attempt::from_request(&request).is_retry());
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

    /// Reads the counter from `X-Request-Attempt`, `x-envoy-attempt-count`, and (when the
    /// headers are a gRPC request's) `grpc-previous-rpc-attempts`: the largest well-formed
    /// one (see [the type's docs](Self#counters-from-proxies-and-other-clients)).
    pub fn from_headers(headers: &HeaderMap) -> Self {
        Self::from_headers_of(headers, is_grpc(headers))
    }

    /// [`from_headers`](Self::from_headers) for a message whose protocol is known: `grpc`
    /// when it is gRPC (`grpc-previous-rpc-attempts` is then read too). Saves
    /// a look-up of `content-type` on a path that has read it already.
    #[inline]
    pub(crate) fn from_headers_of(headers: &HeaderMap, grpc: bool) -> Self {
        Self::from_fields(headers, grpc, RequestFields::ALL)
    }

    /// [`from_headers_of`](Self::from_headers_of) for headers whose `fields` are known: a
    /// counter they do not carry is not looked up.
    #[inline]
    pub(crate) fn from_fields(headers: &HeaderMap, grpc: bool, fields: RequestFields) -> Self {
        // NOTE: one look-up per counter name (`get_all` finds the entry once; its iterator
        // walks the entry's lines without another look-up), and no allocation: this runs
        // on every request the overload layer sees. The counters combine in any order
        // (the largest, or malformed), so a skipped one changes nothing.
        let mut counters = Counters::default();
        if fields.may_have(RequestFields::X_REQUEST_ATTEMPT) {
            counters.add(parse_values(headers.get_all(X_REQUEST_ATTEMPT).iter()));
        }
        if fields.may_have(RequestFields::X_ENVOY_ATTEMPT_COUNT) {
            counters.add(envoy_count(parse_values(
                headers.get_all(X_ENVOY_ATTEMPT_COUNT).iter(),
            )));
        }
        if grpc && fields.may_have(RequestFields::GRPC_PREVIOUS_RPC_ATTEMPTS) {
            counters.add(parse_values(
                headers.get_all(GRPC_PREVIOUS_RPC_ATTEMPTS).iter(),
            ));
        }
        counters.attempt()
    }

    /// Reads the counter of a request; see [`Attempt::from_headers`].
    pub fn from_request<B>(request: &http::Request<B>) -> Self {
        Self::from_headers(request.headers())
    }

    /// Parses one value of `X-Request-Attempt` or `grpc-previous-rpc-attempts` (which may be
    /// a comma-separated list); not Envoy's 1-based count.
    pub fn parse(value: &HeaderValue) -> Self {
        let mut counters = Counters::default();
        counters.add(parse_values(std::iter::once(value)));
        counters.attempt()
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

/// One counter header's lines, read: `None` when the header is absent, `Some(Err(()))`
/// when it is malformed, `Some(Ok(n))` with the raw (unclamped) value otherwise.
type Parsed = Option<Result<u64, ()>>;

/// The request's counter from the counters it carries: the largest well-formed one; else
/// malformed, if one was; else unknown.
#[derive(Default)]
struct Counters {
    largest: Option<u64>,
    malformed: bool,
}

impl Counters {
    #[inline]
    fn add(&mut self, parsed: Parsed) {
        match parsed {
            None => {}
            Some(Err(())) => self.malformed = true,
            Some(Ok(n)) => self.largest = Some(self.largest.map_or(n, |m| m.max(n))),
        }
    }

    #[inline]
    fn attempt(self) -> Attempt {
        match (self.largest, self.malformed) {
            (Some(n), _) => Attempt::Number(clamp(n)),
            (None, true) => Attempt::Malformed,
            (None, false) => Attempt::Unknown,
        }
    }
}

/// Envoy's 1-based count as our 0-based counter: `n` is `n - 1`; `0` is malformed.
#[inline]
fn envoy_count(parsed: Parsed) -> Parsed {
    parsed.map(|n| n.and_then(|n| n.checked_sub(1).ok_or(())))
}

/// A counter value kept: at most [`Attempt::CLAMP`].
#[inline]
fn clamp(n: u64) -> u32 {
    u32::try_from(n).map_or(Attempt::CLAMP, |n| n.min(Attempt::CLAMP))
}

fn parse_values<'a>(values: impl Iterator<Item = &'a HeaderValue>) -> Parsed {
    let mut seen: Option<u64> = None;
    for value in values {
        for item in value.as_bytes().split(|&b| b == b',') {
            let Some(n) = parse_item(item) else {
                return Some(Err(()));
            };
            match seen {
                Some(prev) if prev != n => return Some(Err(())),
                _ => seen = Some(n),
            }
        }
    }
    seen.map(Ok)
}

/// One list item: optional whitespace, then digits, then optional whitespace. `None` when
/// it is anything else, or does not fit in 64 bits.
fn parse_item(item: &[u8]) -> Option<u64> {
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
    Some(n)
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
    fn grpc_previous_attempts_only_for_grpc() {
        let mut h = HeaderMap::new();
        h.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, HeaderValue::from_static("2"));
        // Not a gRPC request: the gRPC header is not ours to read.
        assert_eq!(Attempt::from_headers(&h), Attempt::Unknown);
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        assert_eq!(Attempt::from_headers(&h), Attempt::Number(2));
        // Issue 32: beside ours, the larger of the two (it was ours, whatever gRPC's said).
        h.insert(X_REQUEST_ATTEMPT, HeaderValue::from_static("1"));
        assert_eq!(Attempt::from_headers(&h), Attempt::Number(2));
        h.insert(X_REQUEST_ATTEMPT, HeaderValue::from_static("3"));
        assert_eq!(Attempt::from_headers(&h), Attempt::Number(3));
        h.remove(X_REQUEST_ATTEMPT);
        h.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, HeaderValue::from_static("-2"));
        assert_eq!(Attempt::from_headers(&h), Attempt::Malformed);
    }

    fn envoy(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(X_ENVOY_ATTEMPT_COUNT, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    /// Issue 32: Envoy's `x-envoy-attempt-count` is 1-based (1 on the first attempt), read
    /// by the same strict rules as ours, on HTTP and gRPC requests alike.
    #[test]
    fn envoy_attempt_count_is_one_based_and_strict() {
        assert_eq!(Attempt::from_headers(&envoy(&[b"1"])), Attempt::Number(0));
        assert_eq!(Attempt::from_headers(&envoy(&[b"2"])), Attempt::Number(1));
        assert_eq!(
            Attempt::from_headers(&envoy(&[b" 04 "])),
            Attempt::Number(3)
        );
        assert_eq!(
            Attempt::from_headers(&envoy(&[b"3", b"3"])),
            Attempt::Number(2)
        );
        for junk in [
            &[&b"0"[..]][..],
            &[b""],
            &[b"-1"],
            &[b"true"],
            &[b"1.0"],
            &[b"18446744073709551616"],
            &[b"2", b"3"],
            &[b"2,3"],
        ] {
            assert_eq!(
                Attempt::from_headers(&envoy(junk)),
                Attempt::Malformed,
                "{junk:?}"
            );
        }
        // The clamp applies to the converted counter.
        assert_eq!(
            Attempt::from_headers(&envoy(&[b"1000001"])),
            Attempt::Number(Attempt::CLAMP)
        );
        assert_eq!(
            Attempt::from_headers(&envoy(&[b"18446744073709551615"])),
            Attempt::Number(Attempt::CLAMP)
        );
        let mut grpc = envoy(&[b"3"]);
        grpc.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        assert_eq!(Attempt::from_headers(&grpc), Attempt::Number(2));
    }

    /// Issue 32: with several counters, the largest well-formed one is the request's: our
    /// client's first try retried by an Envoy sidecar is a retry at this server.
    #[test]
    fn the_largest_well_formed_counter_wins() {
        let both = |ours: &[u8], envoys: &[u8]| {
            let mut h = with(&[ours]);
            h.append(
                X_ENVOY_ATTEMPT_COUNT,
                HeaderValue::from_bytes(envoys).unwrap(),
            );
            Attempt::from_headers(&h)
        };
        assert_eq!(both(b"0", b"2"), Attempt::Number(1));
        assert_eq!(both(b"0", b"1"), Attempt::Number(0));
        assert_eq!(both(b"3", b"1"), Attempt::Number(3));
        assert_eq!(both(b"2", b"3"), Attempt::Number(2));
        // A malformed counter beside a well-formed one: the well-formed one.
        assert_eq!(both(b"-1", b"2"), Attempt::Number(1));
        assert_eq!(both(b"1", b"0"), Attempt::Number(1));
        assert_eq!(both(b"0", b"junk"), Attempt::Number(0));
        // None well-formed: malformed.
        assert_eq!(both(b"x", b"0"), Attempt::Malformed);

        let mut grpc = HeaderMap::new();
        grpc.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        grpc.insert(X_REQUEST_ATTEMPT, HeaderValue::from_static("0"));
        grpc.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, HeaderValue::from_static("2"));
        assert_eq!(Attempt::from_headers(&grpc), Attempt::Number(2));
        grpc.insert(X_ENVOY_ATTEMPT_COUNT, HeaderValue::from_static("4"));
        assert_eq!(Attempt::from_headers(&grpc), Attempt::Number(3));
        grpc.insert(X_REQUEST_ATTEMPT, HeaderValue::from_static("9"));
        assert_eq!(Attempt::from_headers(&grpc), Attempt::Number(9));
        grpc.insert(X_REQUEST_ATTEMPT, HeaderValue::from_static("nine"));
        grpc.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, HeaderValue::from_static("-1"));
        assert_eq!(Attempt::from_headers(&grpc), Attempt::Number(3));
        grpc.insert(X_ENVOY_ATTEMPT_COUNT, HeaderValue::from_static("0"));
        assert_eq!(Attempt::from_headers(&grpc), Attempt::Malformed);
        grpc.remove(X_ENVOY_ATTEMPT_COUNT);
        grpc.remove(X_REQUEST_ATTEMPT);
        grpc.remove(GRPC_PREVIOUS_RPC_ATTEMPTS);
        assert_eq!(Attempt::from_headers(&grpc), Attempt::Unknown);
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
