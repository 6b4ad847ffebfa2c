//! What counts as evidence about a destination: which outcomes of an attempt are failures.

use std::error::Error;

use http::{HeaderMap, StatusCode};
use overload_signal::protocol::{GRPC_RESOURCE_EXHAUSTED, GRPC_UNAVAILABLE, grpc_status};

use crate::throttle::refused::is_throttled;
use crate::throttle::table::ThrottleOutcome;

/// gRPC's `DEADLINE_EXCEEDED`.
const GRPC_DEADLINE_EXCEEDED: u16 = 4;

/// How a response counts: a failure for `429`, any `5xx` (the stop signal rides on these),
/// and a gRPC status in the headers of `UNAVAILABLE`, `RESOURCE_EXHAUSTED` or
/// `DEADLINE_EXCEEDED`; an accept for anything else (a success, another `4xx`, another gRPC
/// status: the destination answered).
#[inline]
pub(crate) fn of_response(status: StatusCode, headers: &HeaderMap) -> ThrottleOutcome {
    let failed = status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
        || (!headers.is_empty()
            && grpc_status(headers).is_some_and(|code| {
                matches!(
                    code,
                    GRPC_UNAVAILABLE | GRPC_RESOURCE_EXHAUSTED | GRPC_DEADLINE_EXCEEDED
                )
            }));
    if failed {
        ThrottleOutcome::Failed
    } else {
        ThrottleOutcome::Accepted
    }
}

/// How an error from the inner service counts: a failure (a timeout, a refused or reset
/// connection, anything that is not an answer), except a [`Throttled`](super::Throttled)
/// from a throttle below, which was never sent and counts neither way.
pub(crate) fn of_error(error: &(dyn Error + 'static)) -> Option<ThrottleOutcome> {
    (!is_throttled(error)).then_some(ThrottleOutcome::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn grpc(code: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/grpc"));
        h.insert("grpc-status", HeaderValue::from_static(code));
        h
    }

    #[test]
    fn failures_are_429_5xx_and_three_grpc_codes() {
        let none = HeaderMap::new();
        for s in [429, 500, 502, 503, 504, 599] {
            let status = StatusCode::from_u16(s).unwrap();
            assert_eq!(of_response(status, &none), ThrottleOutcome::Failed, "{s}");
        }
        for s in [200, 204, 301, 400, 401, 403, 404, 409, 422] {
            let status = StatusCode::from_u16(s).unwrap();
            assert_eq!(of_response(status, &none), ThrottleOutcome::Accepted, "{s}");
        }
        for code in ["4", "8", "14"] {
            assert_eq!(
                of_response(StatusCode::OK, &grpc(code)),
                ThrottleOutcome::Failed,
                "{code}"
            );
        }
        for code in ["0", "2", "3", "5", "7", "13", "16"] {
            assert_eq!(
                of_response(StatusCode::OK, &grpc(code)),
                ThrottleOutcome::Accepted,
                "{code}"
            );
        }
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
