//! One vocabulary for "what did this answer say": [`Outcome`] and its [`OutcomeClass`].
//!
//! Every layer of the workspace that judges an answer asks it here, so that the retry
//! layer, the client-side throttle, the adaptive limit and the overload layer cannot
//! disagree on what a `500` or a reset connection means. The table of what each layer does
//! with each outcome is in the [protocol docs](super#outcomes).

use std::error::Error;

use http::{HeaderMap, StatusCode};

use super::grpc::{GRPC_RESOURCE_EXHAUSTED, GRPC_UNAVAILABLE, grpc_status};
use super::stop::{Protocol, is_stop_signal};
use crate::error::is_overloaded;

/// What an answer says about the server that made it, in five disjoint classes.
///
/// Non-exhaustive: match with a wildcard arm, or ask the questions of [`Outcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutcomeClass {
    /// The server answered and did what was asked: `1xx` to `3xx`, gRPC `OK`, or a gRPC
    /// call whose status comes later, in trailers (the call was taken).
    Success,
    /// The server answered, and the fault is the caller's, or the answer is deliberate:
    /// `4xx` other than `429`; gRPC `CANCELLED`, `INVALID_ARGUMENT`, `NOT_FOUND`,
    /// `ALREADY_EXISTS`, `PERMISSION_DENIED`, `FAILED_PRECONDITION`, `ABORTED`,
    /// `OUT_OF_RANGE`, `UNAUTHENTICATED`, and codes gRPC does not define.
    ClientError,
    /// The server failed, and not for want of capacity (a bug answers `500`): `5xx` other
    /// than `503` and `504` (`500`, `501`, `502`, `505`, ...); gRPC `UNKNOWN`,
    /// `UNIMPLEMENTED`, `INTERNAL`, `DATA_LOSS`.
    ServerFailure,
    /// The caller should send less: `429`, `503`, `504`; gRPC `DEADLINE_EXCEEDED`,
    /// `RESOURCE_EXHAUSTED`, `UNAVAILABLE`; and every error without an answer (a timeout, a
    /// refused or reset connection, any transport error).
    CapacitySignal,
    /// A failure carrying the stop signal (`X-Overloaded`, or a `grpc-retry-pushback-ms`
    /// that is negative or not a number), or an [`Overloaded`](crate::Overloaded) error: the
    /// system is overloaded, do not retry.
    StopSignal,
}

/// What an attempt's result says, classified once for every layer: see the [protocol
/// docs](super#outcomes) for the table of what each layer does with it.
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use overload_signal::protocol::{Outcome, OutcomeClass, Protocol};
///
/// let bug = Outcome::of_response(Protocol::Http, StatusCode::INTERNAL_SERVER_ERROR, &HeaderMap::new());
/// assert_eq!(bug.class(), OutcomeClass::ServerFailure);
/// assert!(bug.is_failure() && !bug.is_capacity_signal());
///
/// let full = Outcome::of_response(Protocol::Http, StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new());
/// assert!(full.is_capacity_signal() && !full.is_stop_signal());
///
/// let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
/// assert!(Outcome::of_error(&reset).is_capacity_signal());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Outcome {
    class: OutcomeClass,
    /// The HTTP status, for an answer.
    status: Option<StatusCode>,
    /// The gRPC status in the answer's head, for a gRPC answer that has one.
    grpc: Option<u16>,
}

impl Outcome {
    /// The outcome of an answer with this status and these headers, to a request of
    /// `protocol`.
    ///
    /// A gRPC status is read from the headers (where a trailers-only answer, the form every
    /// rejection takes, carries it) only for a gRPC or gRPC-Web request answered with a
    /// `2xx`; any other status is read as HTTP (a proxy's `503` to a gRPC call is a
    /// capacity signal). The stop signal counts on failures only: a success or a client
    /// error that carries `X-Overloaded` is what its status says (any proxy may add a
    /// header).
    #[inline]
    pub fn of_response(protocol: Protocol, status: StatusCode, headers: &HeaderMap) -> Self {
        let grpc = if protocol.is_grpc() && status.is_success() {
            grpc_status(headers)
        } else {
            None
        };
        let class = match grpc {
            Some(code) => class_of_grpc(code),
            None => class_of_status(status),
        };
        let class = if matches!(
            class,
            OutcomeClass::ServerFailure | OutcomeClass::CapacitySignal
        ) && is_stop_signal(headers)
        {
            OutcomeClass::StopSignal
        } else {
            class
        };
        Self {
            class,
            status: Some(status),
            grpc,
        }
    }

    /// The outcome of an error in place of an answer: the stop signal when
    /// [`Overloaded`](crate::Overloaded) is in its `source()` chain, a capacity signal
    /// otherwise (the caller got no answer: a timeout, a refused or reset connection, any
    /// transport error).
    ///
    /// What a client layer refused to send (a client-side throttle's refusal) is no outcome
    /// of a server at all: `backoff-layer`'s layers leave it out before asking.
    pub fn of_error(error: &(dyn Error + 'static)) -> Self {
        let class = if is_overloaded(error) {
            OutcomeClass::StopSignal
        } else {
            OutcomeClass::CapacitySignal
        };
        Self {
            class,
            status: None,
            grpc: None,
        }
    }

    /// The class.
    #[inline]
    pub const fn class(self) -> OutcomeClass {
        self.class
    }

    /// Whether the server answered and did what was asked.
    #[inline]
    pub const fn is_success(self) -> bool {
        matches!(self.class, OutcomeClass::Success)
    }

    /// Whether the outcome is a failure on the server's side: a server failure, a capacity
    /// signal or the stop signal (HTTP `429` and `5xx`, their gRPC codes, errors). The
    /// outcomes a client would retry, and the only ones the stop signal counts on.
    #[inline]
    pub const fn is_failure(self) -> bool {
        matches!(
            self.class,
            OutcomeClass::ServerFailure | OutcomeClass::CapacitySignal | OutcomeClass::StopSignal
        )
    }

    /// Whether the caller should send less: a capacity signal, or the stop signal (which is
    /// one, and more). What the client-side throttle counts as a failure.
    #[inline]
    pub const fn is_capacity_signal(self) -> bool {
        matches!(
            self.class,
            OutcomeClass::CapacitySignal | OutcomeClass::StopSignal
        )
    }

    /// Whether the answer is a refusal to take the request now, whoever made it: HTTP `429`
    /// or `503`, gRPC `RESOURCE_EXHAUSTED` or `UNAVAILABLE` (a capacity signal but a
    /// timeout's `504` and `DEADLINE_EXCEEDED`, which say the work took too long, not that
    /// it was refused; and not the stop signal). What the overload layer judges without a
    /// limiter's marker when it is told to judge every rejection.
    #[inline]
    pub fn is_rejection(self) -> bool {
        matches!(self.class, OutcomeClass::CapacitySignal)
            && match (self.grpc, self.status) {
                (Some(code), _) => code == GRPC_RESOURCE_EXHAUSTED || code == GRPC_UNAVAILABLE,
                (None, Some(status)) => {
                    status == StatusCode::TOO_MANY_REQUESTS
                        || status == StatusCode::SERVICE_UNAVAILABLE
                }
                (None, None) => false,
            }
    }

    /// Whether the server failed for a reason that is not capacity (a bug answers `500`).
    #[inline]
    pub const fn is_server_failure(self) -> bool {
        matches!(self.class, OutcomeClass::ServerFailure)
    }

    /// Whether the outcome carries the stop signal.
    #[inline]
    pub const fn is_stop_signal(self) -> bool {
        matches!(self.class, OutcomeClass::StopSignal)
    }

    /// The HTTP status of an answer (`None` for an error).
    pub const fn status(self) -> Option<StatusCode> {
        self.status
    }

    /// The gRPC status read from the answer's head, if it was one (see
    /// [`of_response`](Self::of_response)).
    pub const fn grpc_status(self) -> Option<u16> {
        self.grpc
    }
}

/// The class of an HTTP status.
#[inline]
const fn class_of_status(status: StatusCode) -> OutcomeClass {
    match status.as_u16() {
        429 | 503 | 504 => OutcomeClass::CapacitySignal,
        500..=599 => OutcomeClass::ServerFailure,
        400..=499 => OutcomeClass::ClientError,
        _ => OutcomeClass::Success,
    }
}

/// The class of a gRPC status code (the HTTP mapping gRPC's gateways use: `UNKNOWN`,
/// `INTERNAL`, `DATA_LOSS` are `500`, `UNIMPLEMENTED` `501`; `DEADLINE_EXCEEDED` `504`,
/// `RESOURCE_EXHAUSTED` `429`, `UNAVAILABLE` `503`).
const fn class_of_grpc(code: u16) -> OutcomeClass {
    match code {
        0 => OutcomeClass::Success,
        4 | 8 | 14 => OutcomeClass::CapacitySignal,
        2 | 12 | 13 | 15 => OutcomeClass::ServerFailure,
        _ => OutcomeClass::ClientError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Overloaded;
    use crate::protocol::{GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS, X_OVERLOADED};
    use http::HeaderValue;

    fn http(code: u16) -> Outcome {
        Outcome::of_response(
            Protocol::Http,
            StatusCode::from_u16(code).unwrap(),
            &HeaderMap::new(),
        )
    }

    fn grpc(code: &'static str) -> Outcome {
        let mut h = HeaderMap::new();
        h.insert(GRPC_STATUS, HeaderValue::from_static(code));
        Outcome::of_response(Protocol::Grpc, StatusCode::OK, &h)
    }

    #[test]
    fn http_statuses() {
        use OutcomeClass::*;
        for (code, class) in [
            (100, Success),
            (200, Success),
            (204, Success),
            (304, Success),
            (400, ClientError),
            (404, ClientError),
            (408, ClientError),
            (428, ClientError),
            (429, CapacitySignal),
            (500, ServerFailure),
            (501, ServerFailure),
            (502, ServerFailure),
            (503, CapacitySignal),
            (504, CapacitySignal),
            (505, ServerFailure),
            (599, ServerFailure),
        ] {
            assert_eq!(http(code).class(), class, "{code}");
        }
        assert!(http(500).is_failure() && http(500).is_server_failure());
        assert!(http(429).is_rejection() && http(503).is_rejection());
        assert!(!http(504).is_rejection() && !http(500).is_rejection());
        assert!(!http(500).is_capacity_signal());
        assert!(http(429).is_failure() && !http(429).is_server_failure());
        assert!(!http(404).is_failure() && !http(200).is_failure());
        assert_eq!(http(503).status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    }

    #[test]
    fn grpc_codes() {
        use OutcomeClass::*;
        assert_eq!(grpc("0").class(), Success);
        for code in ["4", "8", "14"] {
            assert_eq!(grpc(code).class(), CapacitySignal, "{code}");
        }
        for code in ["2", "12", "13", "15"] {
            assert_eq!(grpc(code).class(), ServerFailure, "{code}");
        }
        for code in ["1", "3", "5", "6", "7", "9", "10", "11", "16", "17"] {
            assert_eq!(grpc(code).class(), ClientError, "{code}");
        }
        assert_eq!(grpc("14").grpc_status(), Some(14));
        assert!(grpc("8").is_rejection() && grpc("14").is_rejection());
        assert!(!grpc("4").is_rejection());
        // A status in trailers, or junk: the call was taken.
        assert_eq!(
            Outcome::of_response(Protocol::Grpc, StatusCode::OK, &HeaderMap::new()).class(),
            Success
        );
        assert_eq!(grpc("x").class(), Success);
        // A proxy's HTTP status to a gRPC call is read as HTTP.
        let proxy = Outcome::of_response(
            Protocol::Grpc,
            StatusCode::SERVICE_UNAVAILABLE,
            &HeaderMap::new(),
        );
        assert_eq!(proxy.class(), CapacitySignal);
        // gRPC statuses are not read from an HTTP answer.
        let mut h = HeaderMap::new();
        h.insert(GRPC_STATUS, HeaderValue::from_static("14"));
        assert_eq!(
            Outcome::of_response(Protocol::Http, StatusCode::OK, &h).class(),
            Success
        );
    }

    #[test]
    fn the_stop_signal_rides_on_failures_only() {
        let mut h = HeaderMap::new();
        h.insert(X_OVERLOADED, HeaderValue::from_static("stop-retrying"));
        let on = |code: u16| {
            Outcome::of_response(Protocol::Http, StatusCode::from_u16(code).unwrap(), &h)
        };
        assert!(on(503).is_stop_signal());
        assert!(on(429).is_stop_signal());
        assert!(on(500).is_stop_signal());
        assert!(
            on(200).is_success(),
            "a success is a success whatever its headers"
        );
        assert_eq!(on(404).class(), OutcomeClass::ClientError);
        assert!(on(503).is_capacity_signal() && on(503).is_failure());

        let mut g = HeaderMap::new();
        g.insert(GRPC_STATUS, HeaderValue::from_static("14"));
        g.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
        assert!(Outcome::of_response(Protocol::Grpc, StatusCode::OK, &g).is_stop_signal());
        g.insert(GRPC_STATUS, HeaderValue::from_static("5"));
        assert_eq!(
            Outcome::of_response(Protocol::Grpc, StatusCode::OK, &g).class(),
            OutcomeClass::ClientError
        );
    }

    #[test]
    fn errors_are_capacity_signals_or_the_stop_signal() {
        use std::io::{Error, ErrorKind};
        for kind in [
            ErrorKind::TimedOut,
            ErrorKind::ConnectionRefused,
            ErrorKind::ConnectionReset,
            ErrorKind::Other,
        ] {
            let outcome = Outcome::of_error(&Error::from(kind));
            assert_eq!(outcome.class(), OutcomeClass::CapacitySignal, "{kind:?}");
            assert_eq!(outcome.status(), None);
        }
        assert!(Outcome::of_error(&Overloaded::new()).is_stop_signal());

        #[derive(Debug)]
        struct Wrapped(Overloaded);
        impl std::fmt::Display for Wrapped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("wrapped")
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        assert!(Outcome::of_error(&Wrapped(Overloaded::new())).is_stop_signal());
    }
}
