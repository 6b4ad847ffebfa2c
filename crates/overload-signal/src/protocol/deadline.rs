//! How long the caller waits: `X-Request-Deadline` (the relative timeouts, `grpc-timeout`
//! and Envoy's, are in `timeout`), and the answer to a request whose deadline has passed.

use std::fmt;
use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use super::grpc::GRPC_DEADLINE_EXCEEDED;
use super::headers::X_REQUEST_DEADLINE;
use super::stop::{Protocol, final_answer};

/// A deadline as it travels in `X-Request-Deadline`: when the sender sent the request, on
/// the sender's clock, and how long from then it waits for the response's head.
///
/// ```text
/// X-Request-Deadline: t=1767225600123, timeout=2000
/// ```
///
/// `t` is the time the request was sent, in whole milliseconds since the Unix epoch; `timeout`
/// how many milliseconds after `t` the sender stops waiting. A start and a length, rather
/// than either alone:
///
/// - a **relative** timeout alone (gRPC's `grpc-timeout`, Envoy's
///   `x-envoy-expected-rq-timeout-ms`) starts when the receiver reads it, so a request that
///   sat in the listen queue, or in a proxy's, looks as fresh as a new one; with `t`, the
///   receiver sees how long it waited;
/// - an **absolute** deadline alone is only as good as the two clocks agree; with `t`, a
///   receiver can tell that the sender's clock is ahead of its own (the request was "sent in
///   the future") and fall back on `timeout`, which no skew can stretch. See
///   [`WireDeadline::queued`].
///
/// It is Heroku's and nginx's `X-Request-Start` (the start, which lets a server measure the
/// time a request queued, as Rails' rack-timeout does with its `wait_timeout`) and gRPC's
/// timeout (the length) in one field, as Finagle's deadline carries a timestamp with its
/// deadline.
///
/// # Parsing rules
///
/// - The value is exactly two members, `t=<digits>` and `timeout=<digits>`, in either order,
///   separated by a comma; spaces and tabs around members are ignored.
/// - Each value is 1 to 15 ASCII digits (a Structured Field integer's range): no sign, no
///   fraction, nothing else. Leading zeros are allowed.
/// - `t` is at most 18 446 744 073 709 (milliseconds: 2554-07-21, the last instant
///   `u64` nanoseconds since the epoch hold, which is all some platforms' `SystemTime` can
///   represent), and a time this platform's `SystemTime` can represent: a send time past
///   it is no clock's reading, and is malformed on every receiver alike, never a panic.
/// - Any other member, an empty member, a missing one, or a value that breaks these rules
///   makes the whole field malformed. So do several header lines, or a repeated member,
///   that disagree; lines that repeat the same values (a proxy that merged two) are read
///   as one.
///
/// A malformed field is never an error response: the receiver ignores it (and counts it).
/// Parsing never panics and never allocates.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderMap;
/// use overload_signal::protocol::{WireDeadline, X_REQUEST_DEADLINE};
///
/// let sent = SystemTime::UNIX_EPOCH + Duration::from_millis(1_767_225_600_123);
/// let deadline = WireDeadline::new(sent, Duration::from_secs(2));
/// assert_eq!(deadline.to_header_value(), "t=1767225600123, timeout=2000");
///
/// let mut headers = HeaderMap::new();
/// deadline.set(&mut headers);
/// assert_eq!(WireDeadline::from_headers(&headers), Ok(Some(deadline)));
///
/// headers.insert(X_REQUEST_DEADLINE, "timeout=2s".parse().unwrap());
/// assert!(WireDeadline::from_headers(&headers).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WireDeadline {
    /// Milliseconds since the Unix epoch.
    sent: u64,
    /// Milliseconds.
    timeout: u64,
}

/// The largest value of either member: 15 digits, a Structured Field integer's range.
const MAX_VALUE: u64 = 999_999_999_999_999;

/// The largest `t`, in milliseconds: the last whole millisecond that `u64` nanoseconds since
/// the Unix epoch hold (2554-07-21), the narrowest `SystemTime` among Rust's platforms (WASI
/// and UEFI count so). A bound that does not depend on the receiver's platform, so that a
/// field is well-formed or malformed on every host of a fleet alike.
const MAX_SENT: u64 = u64::MAX / 1_000_000;

/// `ms` milliseconds after the Unix epoch, if `SystemTime` can represent it here.
fn since_epoch(ms: u64) -> Option<SystemTime> {
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

impl WireDeadline {
    /// A deadline `timeout` after `sent`. Both are truncated to whole milliseconds, so that a
    /// receiver never places the deadline later than the sender's; a time before the Unix
    /// epoch reads as the epoch, one after 2554-07-21 (the largest `t`, see the parsing
    /// rules) as that, and a timeout above 15 digits of milliseconds (31 000 years) as that.
    pub fn new(sent: SystemTime, timeout: Duration) -> Self {
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let sent = sent
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| millis(d).min(MAX_SENT));
        Self {
            sent,
            timeout: millis(timeout).min(MAX_VALUE),
        }
    }

    /// When the request was sent, on the sender's clock (to the millisecond).
    pub fn sent(&self) -> SystemTime {
        // NOTE: `new` takes `sent` from a `SystemTime` (truncated, so never later) and
        // `parse` refuses a `t` that `since_epoch` cannot place, so this is always `Some`;
        // the epoch is a fallback that cannot be reached, not a panic.
        since_epoch(self.sent).unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// How long after [`sent`](Self::sent) the sender waits for the response's head.
    pub const fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout)
    }

    /// How long before `now` (the receiver's clock) the request was sent: the time it spent
    /// in transit and in queues, as far as the two clocks agree.
    ///
    /// - `Some(queued)` when `sent` is not after `now`;
    /// - `Some(Duration::ZERO)` when `sent` is after `now` by at most `skew_allowance`: the
    ///   sender's clock may be that far ahead of the receiver's;
    /// - `None` when `sent` is further in the future than that: the clocks disagree by more
    ///   than the allowance, and only [`timeout`](Self::timeout), counted from when the
    ///   receiver read it, can be trusted.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use overload_signal::protocol::WireDeadline;
    ///
    /// let now = SystemTime::now();
    /// let ms = Duration::from_millis;
    /// let allowance = ms(250);
    /// let sent_ago = |d| WireDeadline::new(now - d, ms(2000)).queued(now, allowance);
    /// assert!(sent_ago(ms(3000)).unwrap() >= ms(2999)); // it queued longer than its timeout
    /// let sent_in = |d| WireDeadline::new(now + d, ms(2000)).queued(now, allowance);
    /// assert_eq!(sent_in(ms(200)), Some(Duration::ZERO)); // skew within the allowance
    /// assert_eq!(sent_in(ms(5000)), None); // the sender's clock is 5 s ahead
    /// ```
    pub fn queued(&self, now: SystemTime, skew_allowance: Duration) -> Option<Duration> {
        match now.duration_since(self.sent()) {
            Ok(queued) => Some(queued),
            Err(ahead) if ahead.duration() <= skew_allowance => Some(Duration::ZERO),
            Err(_) => None,
        }
    }

    /// The field's value: `t=<sent>, timeout=<timeout>`, in milliseconds.
    pub fn to_header_value(&self) -> HeaderValue {
        // NOTE: formatted on the stack, so the header value is the only allocation.
        let (sent, timeout) = (digits(self.sent), digits(self.timeout));
        let mut buf = [0u8; 48];
        let mut len = 0;
        for part in [
            &b"t="[..],
            trim_leading_nul(&sent),
            b", timeout=",
            trim_leading_nul(&timeout),
        ] {
            buf[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        }
        HeaderValue::from_bytes(&buf[..len]).expect("digits and ASCII punctuation")
    }

    /// Sets `X-Request-Deadline` on `headers`, replacing any value already there.
    pub fn set(&self, headers: &mut HeaderMap) {
        headers.insert(X_REQUEST_DEADLINE, self.to_header_value());
    }

    /// Parses one header value; see the parsing rules on [`WireDeadline`].
    ///
    /// # Errors
    ///
    /// [`MalformedDeadline`], which says which rule the value breaks.
    pub fn parse(value: &HeaderValue) -> Result<Self, MalformedDeadline> {
        let mut fields = Fields::default();
        fields.read(value.as_bytes())?;
        fields.finish()
    }

    /// Reads `X-Request-Deadline` from `headers`: `Ok(None)` when it is absent.
    ///
    /// # Errors
    ///
    /// [`MalformedDeadline`] when a value breaks the parsing rules, or several disagree.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, MalformedDeadline> {
        let mut values = headers.get_all(X_REQUEST_DEADLINE).iter().peekable();
        if values.peek().is_none() {
            return Ok(None);
        }
        let mut fields = Fields::default();
        for value in values {
            fields.read(value.as_bytes())?;
        }
        fields.finish().map(Some)
    }
}

/// `n` as ASCII digits, right-aligned in 16 bytes, with NUL bytes before.
pub(super) fn digits(mut n: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut i = out.len();
    loop {
        i -= 1;
        out[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    out
}

pub(super) fn trim_leading_nul(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    &bytes[start..]
}

/// The members read so far, across header lines.
#[derive(Default)]
struct Fields {
    sent: Option<u64>,
    timeout: Option<u64>,
}

impl Fields {
    fn read(&mut self, value: &[u8]) -> Result<(), MalformedDeadline> {
        for member in value.split(|&b| b == b',') {
            let member = trim_ows(member);
            let (key, number) = member
                .iter()
                .position(|&b| b == b'=')
                .map(|at| (&member[..at], &member[at + 1..]))
                .ok_or(MalformedDeadline("a member is not `key=value`"))?;
            let slot = match key {
                b"t" => &mut self.sent,
                b"timeout" => &mut self.timeout,
                _ => return Err(MalformedDeadline("a member other than `t` and `timeout`")),
            };
            let number = parse_number(number)?;
            match *slot {
                Some(seen) if seen != number => {
                    return Err(MalformedDeadline("a member repeated with another value"));
                }
                _ => *slot = Some(number),
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<WireDeadline, MalformedDeadline> {
        match (self.sent, self.timeout) {
            (Some(sent), Some(_)) if sent > MAX_SENT || since_epoch(sent).is_none() => Err(
                MalformedDeadline("`t` is past the last time a clock can read (2554-07-21)"),
            ),
            (Some(sent), Some(timeout)) => Ok(WireDeadline { sent, timeout }),
            (None, _) => Err(MalformedDeadline("`t` is missing")),
            (_, None) => Err(MalformedDeadline("`timeout` is missing")),
        }
    }
}

fn trim_ows(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

pub(super) fn parse_number(bytes: &[u8]) -> Result<u64, MalformedDeadline> {
    if bytes.is_empty() || bytes.len() > 15 || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(MalformedDeadline("a value is not 1 to 15 ASCII digits"));
    }
    Ok(bytes
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')))
}

/// An `X-Request-Deadline`, `grpc-timeout` or `x-envoy-expected-rq-timeout-ms` that breaks
/// the protocol's rules; its message says which. Receivers ignore such a field (and count it); it is never an error response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MalformedDeadline(pub(super) &'static str);

impl fmt::Display for MalformedDeadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed deadline: {}", self.0)
    }
}

impl std::error::Error for MalformedDeadline {}

const DEADLINE_EXCEEDED_MESSAGE: &str = "deadline exceeded before the request was served";

/// A new answer to a request whose deadline has passed, with an empty (default) body.
///
/// - HTTP: `504 Gateway Timeout`: the server, standing between the caller and the work,
///   gave up on the request in time for nobody (as a proxy answers when its upstream is too
///   slow).
/// - gRPC: `200 OK`, `content-type: application/grpc`, `grpc-status: 4` (DEADLINE_EXCEEDED),
///   `grpc-message`: what a gRPC server answers when a call's deadline passes. gRPC-Web the
///   same, with its own `content-type` ([`Protocol::content_type`]).
///
/// ```
/// use overload_signal::protocol::{Protocol, deadline_exceeded_response};
///
/// assert_eq!(deadline_exceeded_response::<()>(Protocol::Http).status(), 504);
/// let grpc = deadline_exceeded_response::<()>(Protocol::Grpc);
/// assert_eq!(grpc.headers()["grpc-status"], "4");
/// ```
pub fn deadline_exceeded_response<B: Default>(protocol: Protocol) -> Response<B> {
    final_answer(
        protocol,
        StatusCode::GATEWAY_TIMEOUT,
        GRPC_DEADLINE_EXCEEDED,
        DEADLINE_EXCEEDED_MESSAGE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{GRPC_STATUS, headers::GRPC_MESSAGE};
    use http::header::CONTENT_TYPE;
    use proptest::prelude::*;

    fn parse(value: &'static str) -> Result<WireDeadline, MalformedDeadline> {
        WireDeadline::parse(&HeaderValue::from_static(value))
    }

    /// The largest `t` (2554-07-21), spelled out.
    const LAST_T: u64 = 18_446_744_073_709;

    fn at(sent: u64, timeout: u64) -> WireDeadline {
        WireDeadline { sent, timeout }
    }

    #[test]
    fn well_formed_values() {
        assert_eq!(
            parse("t=1767225600123, timeout=2000"),
            Ok(at(1_767_225_600_123, 2000))
        );
        assert_eq!(parse("timeout=2000,t=5"), Ok(at(5, 2000)));
        assert_eq!(parse(" t=0 ,\ttimeout=0 "), Ok(at(0, 0)));
        assert_eq!(parse("t=007, timeout=010"), Ok(at(7, 10)));
        assert_eq!(
            parse("t=18446744073709, timeout=999999999999999"),
            Ok(at(LAST_T, MAX_VALUE))
        );
        // A proxy that merged two identical lines.
        assert_eq!(parse("t=5, timeout=9, t=5, timeout=9"), Ok(at(5, 9)));
    }

    #[test]
    fn malformed_values_say_why() {
        for junk in [
            "",
            " ",
            "t=5",
            "timeout=5",
            "t=5, timeout=",
            "t=, timeout=5",
            "t=5,, timeout=5",
            "t=5; timeout=5",
            "t = 5, timeout=5",
            "t=-5, timeout=5",
            "t=+5, timeout=5",
            "t=5, timeout=1.5",
            "t=5, timeout=2s",
            "t=5, timeout=0x10",
            "t=5, timeout=5, x=1",
            "T=5, timeout=5",
            "t=1000000000000000, timeout=5",
            "t=5, timeout=5, t=6",
            "t=5 timeout=5",
        ] {
            let err = parse(junk).unwrap_err();
            assert!(
                err.to_string().starts_with("malformed deadline: "),
                "{junk:?}"
            );
        }
        let non_ascii = HeaderValue::from_bytes(b"t=5, timeout=\xff").unwrap();
        assert!(WireDeadline::parse(&non_ascii).is_err());
    }

    #[test]
    fn header_lines_must_agree() {
        let mut h = HeaderMap::new();
        assert_eq!(WireDeadline::from_headers(&h), Ok(None));
        h.append(
            X_REQUEST_DEADLINE,
            HeaderValue::from_static("t=5, timeout=9"),
        );
        h.append(
            X_REQUEST_DEADLINE,
            HeaderValue::from_static("timeout=9, t=5"),
        );
        assert_eq!(WireDeadline::from_headers(&h), Ok(Some(at(5, 9))));
        h.append(
            X_REQUEST_DEADLINE,
            HeaderValue::from_static("t=5, timeout=10"),
        );
        assert!(WireDeadline::from_headers(&h).is_err());
    }

    #[test]
    fn new_truncates_to_milliseconds_and_clamps() {
        let epoch = SystemTime::UNIX_EPOCH;
        let d = WireDeadline::new(
            epoch + Duration::from_nanos(1_999_999),
            Duration::from_nanos(2_999_999),
        );
        assert_eq!(d, at(1, 2));
        assert_eq!(d.sent(), epoch + Duration::from_millis(1));
        assert_eq!(d.timeout(), Duration::from_millis(2));
        let before_epoch = epoch - Duration::from_secs(1);
        assert_eq!(
            WireDeadline::new(before_epoch, Duration::MAX),
            at(0, MAX_VALUE)
        );
        assert_eq!(
            WireDeadline::new(epoch, Duration::ZERO).to_header_value(),
            "t=0, timeout=0"
        );
    }

    /// Regression (issue 30, finding 7): `t` was added to the Unix epoch unchecked
    /// (`UNIX_EPOCH + t`), which overflows, and panics, where `SystemTime` holds less than 15
    /// digits of milliseconds (WASI and UEFI count `u64` nanoseconds: 584 years). A `t` that
    /// no clock can read is now malformed, on every platform alike; the largest one that is
    /// read is placed without a panic.
    #[test]
    fn a_send_time_no_clock_can_read_is_malformed_never_a_panic() {
        for junk in [
            "t=999999999999999, timeout=999999999999999",
            "t=999999999999999, timeout=0",
            "t=18446744073710, timeout=1",
        ] {
            assert_eq!(
                parse(junk).map_err(|e| e.to_string()),
                Err(
                    "malformed deadline: `t` is past the last time a clock can read (2554-07-21)"
                        .to_owned()
                ),
                "{junk:?}"
            );
        }
        let last = parse("t=18446744073709, timeout=999999999999999").unwrap();
        assert_eq!(
            last.sent(),
            SystemTime::UNIX_EPOCH + Duration::from_millis(18_446_744_073_709)
        );
        let now = SystemTime::now();
        assert_eq!(
            last.queued(now, Duration::from_secs(60)),
            None,
            "the future"
        );
        assert_eq!(last.timeout(), Duration::from_millis(MAX_VALUE));
        // A sender's clock past it sends the largest `t`, which every receiver reads.
        let far = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000_000);
        assert_eq!(WireDeadline::new(far, Duration::MAX), at(LAST_T, MAX_VALUE));
        assert!(
            WireDeadline::parse(&WireDeadline::new(far, Duration::ZERO).to_header_value()).is_ok()
        );
    }

    #[test]
    fn queued_reads_the_senders_clock_within_the_allowance() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let ms = Duration::from_millis;
        let sent = |offset_ms: i64| {
            let sent = if offset_ms >= 0 {
                now + ms(offset_ms.unsigned_abs())
            } else {
                now - ms(offset_ms.unsigned_abs())
            };
            WireDeadline::new(sent, ms(2000)).queued(now, ms(250))
        };
        assert_eq!(sent(-3000), Some(ms(3000)));
        assert_eq!(sent(0), Some(Duration::ZERO));
        assert_eq!(sent(250), Some(Duration::ZERO));
        assert_eq!(sent(251), None);
    }

    proptest! {
        #[test]
        fn every_value_round_trips(sent in 0..=LAST_T, timeout in 0..=MAX_VALUE) {
            let d = at(sent, timeout);
            prop_assert_eq!(WireDeadline::parse(&d.to_header_value()), Ok(d));
            prop_assert_eq!(
                WireDeadline::new(d.sent(), d.timeout()),
                d
            );
        }

        #[test]
        fn parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                let _ = WireDeadline::parse(&value);
                let _ = crate::protocol::parse_grpc_timeout(&value);
                let _ = crate::protocol::parse_envoy_expected_rq_timeout(&value);
            }
        }
    }

    #[test]
    fn an_expired_request_is_answered_504_or_deadline_exceeded() {
        let http = deadline_exceeded_response::<()>(Protocol::Http);
        assert_eq!(http.status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(http.headers().is_empty());
        let grpc = deadline_exceeded_response::<()>(Protocol::Grpc);
        assert_eq!(grpc.status(), StatusCode::OK);
        assert_eq!(grpc.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(grpc.headers()[GRPC_STATUS], "4");
        assert_eq!(grpc.headers()[GRPC_MESSAGE], DEADLINE_EXCEEDED_MESSAGE);
        let web = deadline_exceeded_response::<()>(Protocol::GrpcWeb);
        assert_eq!(web.status(), StatusCode::OK);
        assert_eq!(web.headers()[CONTENT_TYPE], "application/grpc-web+proto");
        assert_eq!(web.headers()[GRPC_STATUS], "4");
        let text = deadline_exceeded_response::<()>(Protocol::GrpcWebText);
        assert_eq!(
            text.headers()[CONTENT_TYPE],
            "application/grpc-web-text+proto"
        );
        assert_eq!(text.headers()[GRPC_STATUS], "4");
    }
}
