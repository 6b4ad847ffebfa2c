//! Which requests may be retried, and which outcomes are worth retrying.
//!
//! The retry layer asks a [`Classify`] implementation three questions: whether a request may
//! be retried at all (asked once, before the first attempt, so a request that may not be
//! retried is streamed without buffering its body), and for each attempt whether its response
//! or its error is worth another attempt.
//!
//! The stop signal is not the classifier's business: a response carrying it is never retried,
//! whatever the classifier says.
//!
//! [`DefaultClassifier`] implements the workspace's defaults (RFC 9110, Envoy, .NET):
//!
//! - requests: idempotent methods (`GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`, `TRACE`), or
//!   any request carrying an `Idempotency-Key` header;
//! - responses: `429`, `502`, `503` and `504`; and trailers-only gRPC responses (status in
//!   the headers) with `grpc-status: 14` (UNAVAILABLE), or `grpc-status: 8`
//!   (RESOURCE_EXHAUSTED) with a `grpc-retry-pushback-ms` (the protocol's node-local
//!   rejection). A gRPC status sent in trailers is not seen: the layer does not read
//!   response bodies;
//! - errors: connect errors and timeouts, recognised anywhere in the error's `source()` chain
//!   (see [`is_connect_error`] and [`is_timeout`]).
//!
//! # A classifier of your own
//!
//! Also retry `500` for an internal service known to fail transiently, and keep the rest of
//! the defaults:
//!
//! ```
//! use std::error::Error;
//! use backoff_layer::classify::{Classification, Classify, DefaultClassifier};
//! use backoff_layer::RetryLayer;
//! use http::{HeaderMap, Method, StatusCode};
//!
//! #[derive(Debug)]
//! struct AlsoRetry500;
//!
//! impl Classify for AlsoRetry500 {
//!     fn may_retry(&self, method: &Method, headers: &HeaderMap) -> bool {
//!         DefaultClassifier.may_retry(method, headers)
//!     }
//!     fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Classification {
//!         if status == StatusCode::INTERNAL_SERVER_ERROR {
//!             return Classification::Retryable;
//!         }
//!         DefaultClassifier.classify_response(status, headers)
//!     }
//!     fn classify_error(&self, error: &(dyn Error + 'static)) -> Classification {
//!         DefaultClassifier.classify_error(error)
//!     }
//! }
//!
//! let layer = RetryLayer::builder().classifier(AlsoRetry500).build()?;
//! # let _ = layer;
//! # Ok::<(), backoff_layer::ConfigError>(())
//! ```

use std::error::Error;
use std::fmt;

use http::{HeaderMap, Method, StatusCode};
use overload_signal::protocol::{
    GRPC_RESOURCE_EXHAUSTED, GRPC_RETRY_PUSHBACK_MS, GRPC_UNAVAILABLE, IDEMPOTENCY_KEY, grpc_status,
};

use crate::outcome::AttemptTimedOut;

/// What an attempt's outcome calls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Classification {
    /// A transient failure: another attempt may succeed.
    Retryable,
    /// Final: a success, or a failure that another attempt would repeat. Returned as is.
    Final,
}

/// Decides what is retried. Shared by every request of a client (held in an `Arc`).
///
/// The methods take parts of messages rather than whole messages so that one classifier
/// works for any body type.
pub trait Classify: fmt::Debug + Send + Sync + 'static {
    /// Whether a request may be sent more than once. Asked once, before the first attempt.
    fn may_retry(&self, method: &Method, headers: &HeaderMap) -> bool;

    /// Whether a response (which does not carry the stop signal) is worth another attempt.
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Classification;

    /// Whether an error from the inner service is worth another attempt.
    fn classify_error(&self, error: &(dyn Error + 'static)) -> Classification;
}

/// The workspace's default classification; see the [module docs](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {
    fn may_retry(&self, method: &Method, headers: &HeaderMap) -> bool {
        is_idempotent(method) || headers.contains_key(IDEMPOTENCY_KEY)
    }

    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Classification {
        match status {
            StatusCode::TOO_MANY_REQUESTS
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT => Classification::Retryable,
            StatusCode::OK if is_retryable_grpc(headers) => Classification::Retryable,
            _ => Classification::Final,
        }
    }

    fn classify_error(&self, error: &(dyn Error + 'static)) -> Classification {
        if is_connect_error(error) || is_timeout(error) {
            Classification::Retryable
        } else {
            Classification::Final
        }
    }
}

/// A trailers-only gRPC response (status in the headers) saying `UNAVAILABLE`, or
/// `RESOURCE_EXHAUSTED` with a `grpc-retry-pushback-ms` (the protocol's node-local rejection).
fn is_retryable_grpc(headers: &HeaderMap) -> bool {
    match grpc_status(headers) {
        Some(GRPC_UNAVAILABLE) => true,
        Some(GRPC_RESOURCE_EXHAUSTED) => headers.contains_key(GRPC_RETRY_PUSHBACK_MS),
        _ => false,
    }
}

/// Whether `method` is idempotent per RFC 9110 section 9.2.2: `GET`, `HEAD`, `OPTIONS`,
/// `PUT`, `DELETE` and `TRACE`.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

fn chain<'a>(error: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&e| e.source())
}

/// Whether `error`, or an error in its `source()` chain, is a failure to establish a
/// connection: an [`std::io::Error`] of kind `ConnectionRefused`, `AddrNotAvailable`,
/// `HostUnreachable` or `NetworkUnreachable`.
///
/// hyper-util's legacy client reports connect errors with the operating system's
/// `std::io::Error` as the source, so this recognises them without depending on hyper-util.
/// A connect error is always safe to retry: the server never saw the request.
pub fn is_connect_error(error: &(dyn Error + 'static)) -> bool {
    use std::io::ErrorKind;
    chain(error).any(|e| {
        e.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::AddrNotAvailable
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
            )
        })
    })
}

/// Whether `error`, or an error in its `source()` chain, is a timeout: this crate's
/// [`AttemptTimedOut`], an [`std::io::Error`] of kind `TimedOut`, or (with the `tower`
/// feature, on by default) `tower::timeout::error::Elapsed`.
pub fn is_timeout(error: &(dyn Error + 'static)) -> bool {
    chain(error).any(|e| {
        e.is::<AttemptTimedOut>()
            || e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
            || is_tower_elapsed(e)
    })
}

#[cfg(feature = "tower")]
fn is_tower_elapsed(e: &(dyn Error + 'static)) -> bool {
    e.is::<tower::timeout::error::Elapsed>()
}

#[cfg(not(feature = "tower"))]
fn is_tower_elapsed(_: &(dyn Error + 'static)) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use std::io;

    #[derive(Debug)]
    struct Wrap(Box<dyn Error + Send + Sync>);
    impl fmt::Display for Wrap {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapped")
        }
    }
    impl Error for Wrap {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&*self.0)
        }
    }

    #[test]
    fn idempotent_methods_or_idempotency_key() {
        let c = DefaultClassifier;
        let none = HeaderMap::new();
        for m in ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"] {
            assert!(
                c.may_retry(&Method::from_bytes(m.as_bytes()).unwrap(), &none),
                "{m}"
            );
        }
        for m in ["POST", "PATCH", "CONNECT", "FROB"] {
            assert!(
                !c.may_retry(&Method::from_bytes(m.as_bytes()).unwrap(), &none),
                "{m}"
            );
        }
        let mut keyed = HeaderMap::new();
        keyed.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("abc"));
        assert!(c.may_retry(&Method::POST, &keyed));
    }

    #[test]
    fn retryable_statuses() {
        let c = DefaultClassifier;
        let h = HeaderMap::new();
        for s in [429, 502, 503, 504] {
            assert_eq!(
                c.classify_response(StatusCode::from_u16(s).unwrap(), &h),
                Classification::Retryable,
                "{s}"
            );
        }
        for s in [200, 201, 204, 301, 400, 401, 404, 409, 500, 501, 505] {
            assert_eq!(
                c.classify_response(StatusCode::from_u16(s).unwrap(), &h),
                Classification::Final,
                "{s}"
            );
        }
    }

    #[test]
    fn retryable_grpc_statuses() {
        let c = DefaultClassifier;
        let grpc = |status: &'static str, pushback: Option<&'static str>| {
            let mut h = HeaderMap::new();
            h.insert("content-type", HeaderValue::from_static("application/grpc"));
            h.insert("grpc-status", HeaderValue::from_static(status));
            if let Some(p) = pushback {
                h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static(p));
            }
            c.classify_response(StatusCode::OK, &h)
        };
        assert_eq!(grpc("14", None), Classification::Retryable);
        assert_eq!(grpc("8", Some("100")), Classification::Retryable);
        assert_eq!(grpc("8", None), Classification::Final);
        assert_eq!(grpc("0", None), Classification::Final);
        assert_eq!(grpc("13", None), Classification::Final);
    }

    #[test]
    fn connect_errors_and_timeouts_found_in_the_chain() {
        let c = DefaultClassifier;
        let refused = Wrap(Box::new(Wrap(Box::new(io::Error::from(
            io::ErrorKind::ConnectionRefused,
        )))));
        assert!(is_connect_error(&refused));
        assert_eq!(c.classify_error(&refused), Classification::Retryable);

        let timed_out = Wrap(Box::new(io::Error::from(io::ErrorKind::TimedOut)));
        assert!(is_timeout(&timed_out));
        assert_eq!(c.classify_error(&timed_out), Classification::Retryable);

        let ours = Wrap(Box::new(AttemptTimedOut::new()));
        assert!(is_timeout(&ours));
        // The chain is walked through the layer's own `GaveUp` too.
        let gave_up = crate::GaveUp::new(
            crate::GiveUpReason::MaxAttempts,
            3,
            Box::new(AttemptTimedOut::new()),
        );
        assert!(is_timeout(&gave_up));

        let reset = Wrap(Box::new(io::Error::from(io::ErrorKind::ConnectionReset)));
        assert!(!is_connect_error(&reset));
        assert_eq!(c.classify_error(&reset), Classification::Final);
        assert_eq!(
            c.classify_error(&io::Error::other("boom")),
            Classification::Final
        );
    }

    #[cfg(feature = "tower")]
    #[test]
    fn tower_elapsed_is_a_timeout() {
        let e = Wrap(Box::new(tower::timeout::error::Elapsed::new()));
        assert!(is_timeout(&e));
    }
}
