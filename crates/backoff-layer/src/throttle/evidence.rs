//! What counts as evidence about a destination: which outcomes of an attempt are failures.

use std::error::Error;

use overload_signal::protocol::Outcome;

use crate::throttle::refused::is_throttled;
use crate::throttle::table::ThrottleOutcome;

/// How a response counts: a failure when it is a capacity signal (the protocol's
/// [`Outcome::is_capacity_signal`]: `429`, `503`, `504`, gRPC `DEADLINE_EXCEEDED`,
/// `RESOURCE_EXHAUSTED` and `UNAVAILABLE`, the stop signal), an accept for anything else: a
/// success, a client error, a server failure that is not about capacity (a bug's `500`, a
/// `501`): the destination answered.
#[inline]
pub(crate) fn of_outcome(outcome: Outcome) -> ThrottleOutcome {
    if outcome.is_capacity_signal() {
        ThrottleOutcome::Failed
    } else {
        ThrottleOutcome::Accepted
    }
}

/// [`of_outcome`] of a response to a request of `protocol`.
#[cfg(test)]
pub(crate) fn of_response(
    protocol: overload_signal::protocol::Protocol,
    status: http::StatusCode,
    headers: &http::HeaderMap,
) -> ThrottleOutcome {
    of_outcome(Outcome::of_response(protocol, status, headers))
}

/// How an error from the inner service counts: a failure (every error without an answer is
/// a capacity signal), except a [`Throttled`](super::Throttled) from a throttle below,
/// which was never sent and counts neither way.
pub(crate) fn of_error(error: &(dyn Error + 'static)) -> Option<ThrottleOutcome> {
    (!is_throttled(error)).then(|| of_outcome(Outcome::of_error(error)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue, StatusCode};
    use overload_signal::protocol::Protocol;

    fn grpc(code: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/grpc"));
        h.insert("grpc-status", HeaderValue::from_static(code));
        h
    }

    /// Regression (issue 30, finding 3): every `5xx` counted as a failure, so a host with
    /// a route answering `500` (a bug) was throttled, and its healthy routes with it.
    #[test]
    fn failures_are_capacity_signals_only() {
        let none = HeaderMap::new();
        let http = |s: u16| of_response(Protocol::Http, StatusCode::from_u16(s).unwrap(), &none);
        for s in [429, 503, 504] {
            assert_eq!(http(s), ThrottleOutcome::Failed, "{s}");
        }
        for s in [
            200, 204, 301, 400, 401, 403, 404, 409, 422, 500, 501, 502, 505, 599,
        ] {
            assert_eq!(http(s), ThrottleOutcome::Accepted, "{s}");
        }
        for code in ["4", "8", "14"] {
            assert_eq!(
                of_response(Protocol::Grpc, StatusCode::OK, &grpc(code)),
                ThrottleOutcome::Failed,
                "{code}"
            );
        }
        for code in ["0", "2", "3", "5", "7", "12", "13", "15", "16"] {
            assert_eq!(
                of_response(Protocol::Grpc, StatusCode::OK, &grpc(code)),
                ThrottleOutcome::Accepted,
                "{code}"
            );
        }
        let mut stop = HeaderMap::new();
        stop.insert("x-overloaded", HeaderValue::from_static("stop-retrying"));
        assert_eq!(
            of_response(Protocol::Http, StatusCode::INTERNAL_SERVER_ERROR, &stop),
            ThrottleOutcome::Failed,
            "the stop signal is a capacity signal, whatever status it rides on"
        );
    }

    #[test]
    fn errors_are_failures_but_a_refusal_below_is_nothing() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(of_error(&io), Some(ThrottleOutcome::Failed));
        let timed_out = crate::AttemptTimedOut::new();
        assert_eq!(of_error(&timed_out), Some(ThrottleOutcome::Failed));
        let refused = crate::throttle::Throttled::new(0.5);
        assert_eq!(of_error(&refused), None);
    }
}
