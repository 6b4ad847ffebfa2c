//! Which requests may be retried, and which outcomes are worth retrying.
//!
//! The retry layer asks a [`Classify`] implementation three questions: whether a request may
//! be retried at all (asked once, before the first attempt, so a request that may not be
//! retried is streamed without buffering its body), and for each attempt whether its response
//! or its error is worth another attempt.
//!
//! Three things are not the classifier's business; the layer decides them first, whatever
//! the classifier would say:
//!
//! - **the stop signal**: a *failure* (HTTP `429` or `5xx`, or their gRPC codes: see
//!   [`Outcome::is_failure`](overload_signal::protocol::Outcome::is_failure)) that carries
//!   it is never retried, spends no retry budget, counts as a failure in the client-side
//!   throttle, and reaches the caller as [`Overloaded`] (or, honoured only, as itself: see
//!   [`StopSignals`](crate::StopSignals)). The signal is any of
//!   ([`is_stop_signal`](overload_signal::protocol::is_stop_signal)): `X-Overloaded`
//!   (any value); a `grpc-retry-pushback-ms` negative or not a number; Envoy's
//!   `x-envoy-overloaded` (any value: Envoy shed the request, by a circuit breaker, its
//!   overload manager or maintenance mode); Envoy's `x-envoy-ratelimited: true` (any case:
//!   Envoy's rate limiter, which Envoy's own router never retries, and what a server of this
//!   workspace's stop signal carries through Envoy). A `503` from Envoy without them (an
//!   upstream reset, no healthy upstream) is classified as usual, and retried. Any other
//!   response (a `200`, or a `404`, that happens to carry `X-Overloaded`, say) is
//!   classified as usual;
//! - **what a retry layer below gave up on** ([`is_final`]): an error with a
//!   [`GaveUp`] or an [`Overloaded`] in its source chain, or a response whose
//!   [`RetryInfo`](crate::RetryInfo) says an inner layer gave up, is returned as it is, so
//!   nested retry layers never multiply attempts;
//! - **the deadline**: a failure that arrives after it ends the request.
//!
//! [`DefaultClassifier`] implements the workspace's defaults:
//!
//! - requests: idempotent methods (`GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`, `TRACE`), or
//!   any request carrying an `Idempotency-Key` header (RFC 9110, Envoy, .NET); and every
//!   gRPC request (`content-type: application/grpc...`): gRPC has no idempotent methods,
//!   and a gRPC client retries when its service config has a retry policy, so wrapping a
//!   gRPC client in the retry layer is the opt-in, as a service config is in gRPC;
//! - responses, in the terms of the workspace's [one
//!   classification](overload_signal::protocol#outcomes): the HTTP capacity signals (`429`,
//!   `503`, `504`) and `502`; and gRPC responses (`content-type: application/grpc...`) whose
//!   status is in their headers (trailers-only responses, the form every rejection takes)
//!   with a retryable code:
//!   by default `UNAVAILABLE` (14) and `RESOURCE_EXHAUSTED` (8) (gRPC's retry design, A6,
//!   whose example policy retries `UNAVAILABLE`, and the protocol's node-local rejection),
//!   configurable with [`DefaultClassifierBuilder::grpc_retryable_codes`] or
//!   [`RetryBuilder::grpc_retryable_codes`](crate::RetryBuilder::grpc_retryable_codes). A
//!   gRPC status sent in trailers, after response headers, is final: the response has
//!   started, and gRPC calls such a call committed;
//! - errors: connect errors and timeouts, recognised anywhere in the error's `source()` chain
//!   (see [`is_connect_error`] and [`is_timeout`]), unless [`is_final`].
//!
//! [`Overloaded`]: crate::Overloaded
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
//! struct AlsoRetry500(DefaultClassifier);
//!
//! impl Classify for AlsoRetry500 {
//!     fn may_retry(&self, method: &Method, headers: &HeaderMap) -> bool {
//!         self.0.may_retry(method, headers)
//!     }
//!     fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Classification {
//!         if status == StatusCode::INTERNAL_SERVER_ERROR {
//!             return Classification::Retryable;
//!         }
//!         self.0.classify_response(status, headers)
//!     }
//!     fn classify_error(&self, error: &(dyn Error + 'static)) -> Classification {
//!         self.0.classify_error(error)
//!     }
//! }
//!
//! let layer = RetryLayer::builder()
//!     .classifier(AlsoRetry500(DefaultClassifier::new()))
//!     .build()?;
//! # let _ = layer;
//! # Ok::<(), backoff_layer::ConfigError>(())
//! ```

use std::error::Error;
use std::fmt;

use http::{HeaderMap, Method, StatusCode};
use overload_core::ConfigError;
use overload_signal::Overloaded;
use overload_signal::protocol::{
    GRPC_RESOURCE_EXHAUSTED, GRPC_UNAVAILABLE, IDEMPOTENCY_KEY, Outcome, Protocol, is_grpc,
};

use crate::outcome::{AttemptTimedOut, GaveUp};
use crate::throttle::Throttled;

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

    /// Whether a response (which is not a failure carrying the stop signal) is worth another
    /// attempt.
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Classification;

    /// Whether an error from the inner service is worth another attempt. Not asked for an
    /// error that [`is_final`].
    fn classify_error(&self, error: &(dyn Error + 'static)) -> Classification;
}

/// The workspace's default classification; see the [module docs](self).
///
/// ```
/// use backoff_layer::classify::DefaultClassifier;
///
/// // Every default: gRPC UNAVAILABLE (14) and RESOURCE_EXHAUSTED (8) are retried.
/// let classifier = DefaultClassifier::new();
///
/// // Customised: retry UNAVAILABLE only, as gRPC's example retry policy does.
/// let classifier = DefaultClassifier::builder().grpc_retryable_codes(&[14]).build()?;
/// # let _ = classifier;
/// # Ok::<(), backoff_layer::ConfigError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DefaultClassifier {
    grpc_retryable: GrpcCodes,
}

impl DefaultClassifier {
    /// The gRPC status codes retried by default: `RESOURCE_EXHAUSTED` (8) and `UNAVAILABLE`
    /// (14), gRPC's retry design (A6) and the protocol's node-local rejection.
    pub const DEFAULT_GRPC_RETRYABLE_CODES: [u16; 2] = [GRPC_RESOURCE_EXHAUSTED, GRPC_UNAVAILABLE];

    /// The default classification; see the [module docs](self).
    pub const fn new() -> Self {
        Self {
            grpc_retryable: GrpcCodes::from_codes(&Self::DEFAULT_GRPC_RETRYABLE_CODES),
        }
    }

    /// A builder starting from the defaults.
    pub const fn builder() -> DefaultClassifierBuilder {
        DefaultClassifierBuilder {
            grpc_retryable: GrpcCodes::from_codes(&Self::DEFAULT_GRPC_RETRYABLE_CODES),
        }
    }

    /// A default classifier retrying these (checked) gRPC codes.
    pub(crate) const fn from_grpc_codes(grpc_retryable: GrpcCodes) -> Self {
        Self { grpc_retryable }
    }

    /// Whether a gRPC status `code` is retried.
    pub const fn is_grpc_retryable(&self, code: u16) -> bool {
        self.grpc_retryable.contains(code)
    }
}

impl Default for DefaultClassifier {
    /// The same as [`DefaultClassifier::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for DefaultClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DefaultClassifier")
            .field("grpc_retryable_codes", &self.grpc_retryable)
            .finish()
    }
}

impl Classify for DefaultClassifier {
    fn may_retry(&self, method: &Method, headers: &HeaderMap) -> bool {
        is_idempotent(method) || headers.contains_key(IDEMPOTENCY_KEY) || is_grpc(headers)
    }

    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Classification {
        // NOTE: the protocol's one classification (see `overload_signal::protocol`'s
        // outcomes table): HTTP capacity signals (429, 503, 504) and 502 are retried; a
        // gRPC status in the head of an answer to a gRPC call, by the configured codes.
        let outcome = Outcome::of_response(Protocol::of_headers(headers), status, headers);
        let retryable = match outcome.grpc_status() {
            Some(code) => self.is_grpc_retryable(code),
            None => outcome.is_capacity_signal() || status == StatusCode::BAD_GATEWAY,
        };
        if retryable {
            Classification::Retryable
        } else {
            Classification::Final
        }
    }

    fn classify_error(&self, error: &(dyn Error + 'static)) -> Classification {
        if !is_final(error) && (is_connect_error(error) || is_timeout(error)) {
            Classification::Retryable
        } else {
            Classification::Final
        }
    }
}

/// Configures a [`DefaultClassifier`]; made by [`DefaultClassifier::builder`].
///
/// | setting | default | source |
/// |---|---|---|
/// | [`grpc_retryable_codes`](Self::grpc_retryable_codes) | `RESOURCE_EXHAUSTED` (8), `UNAVAILABLE` (14) | gRPC's retry design (A6); the protocol's node-local rejection |
///
/// [`build`](Self::build) checks that every code is a gRPC status code other than `OK`:
/// within 1..=16.
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct DefaultClassifierBuilder {
    grpc_retryable: GrpcCodes,
}

impl DefaultClassifierBuilder {
    /// The gRPC status codes worth another attempt, replacing the defaults; an empty list
    /// retries no gRPC status (HTTP failures and errors are still retried). Each must be
    /// within 1..=16. Default: `RESOURCE_EXHAUSTED` (8) and `UNAVAILABLE` (14), from gRPC's
    /// retry design (A6) and the protocol's node-local rejection.
    pub const fn grpc_retryable_codes(mut self, codes: &[u16]) -> Self {
        self.grpc_retryable = GrpcCodes::from_codes(codes);
        self
    }

    /// Checks the settings and builds the classifier.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `grpc_retryable_codes` naming the first code outside 1..=16.
    pub fn build(self) -> Result<DefaultClassifier, ConfigError> {
        self.grpc_retryable.check()?;
        Ok(DefaultClassifier {
            grpc_retryable: self.grpc_retryable,
        })
    }
}

/// A set of gRPC status codes, one bit per code.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct GrpcCodes {
    mask: u32,
    /// The first code given that is not a non-OK gRPC status, for `build` to report.
    invalid: Option<u16>,
}

impl GrpcCodes {
    /// The largest gRPC status code (`UNAUTHENTICATED`).
    const MAX: u16 = 16;

    pub(crate) const fn from_codes(codes: &[u16]) -> Self {
        let mut mask = 0;
        let mut invalid = None;
        let mut i = 0;
        while i < codes.len() {
            let code = codes[i];
            if code == 0 || code > Self::MAX {
                if invalid.is_none() {
                    invalid = Some(code);
                }
            } else {
                mask |= 1 << code;
            }
            i += 1;
        }
        Self { mask, invalid }
    }

    const fn contains(self, code: u16) -> bool {
        code <= Self::MAX && self.mask & (1 << code) != 0
    }

    pub(crate) fn check(self) -> Result<(), ConfigError> {
        match self.invalid {
            Some(code) => Err(ConfigError::out_of_range(
                "grpc_retryable_codes",
                code,
                "a gRPC status code other than OK, within 1..=16",
            )),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for GrpcCodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries((1..=Self::MAX).filter(|&c| self.contains(c)))
            .finish()
    }
}

/// Whether `error` is final for any retry layer: a retry layer below gave up on it
/// ([`GaveUp`]), a server said to stop retrying ([`Overloaded`]), or a client-side
/// throttle refused to send it ([`Throttled`]), anywhere in its `source()` chain.
///
/// The retry layer never retries such an error, whatever its classifier says, so retry
/// layers nested in one process (a library that retries, called by an application that
/// retries) never multiply attempts. A retry policy of your own (`tower::retry::Policy`)
/// should ask it too, before [`is_timeout`] or [`is_connect_error`], which look through a
/// `GaveUp` to the error it holds.
pub fn is_final(error: &(dyn Error + 'static)) -> bool {
    chain(error).any(|e| e.is::<GaveUp>() || e.is::<Overloaded>() || e.is::<Throttled>())
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
/// With the `tonic` feature, tonic's `ConnectError` (any failure while a `Channel`
/// connects) counts too; with the `reqwest` feature, a `reqwest::Error` whose
/// `is_connect()` holds. A connect error is always safe to retry: the server never saw the
/// request.
pub fn is_connect_error(error: &(dyn Error + 'static)) -> bool {
    use std::io::ErrorKind;
    chain(error).any(|e| {
        is_tonic_connect_error(e)
            || is_reqwest_connect_error(e)
            || e.downcast_ref::<std::io::Error>().is_some_and(|io| {
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
/// [`AttemptTimedOut`], an [`std::io::Error`] of kind `TimedOut`, (with the `tower`
/// feature, on by default) `tower::timeout::error::Elapsed`, or (with the `tonic` feature)
/// tonic's `TimeoutExpired`, which a `Channel` returns when a call outlives its
/// `grpc-timeout` or the endpoint's timeout, or (with the `reqwest` feature) a
/// `reqwest::Error` whose `is_timeout()` holds.
///
/// It looks through a [`GaveUp`]: a request a retry layer gave up on after a
/// timeout is a timeout. Whether it may be retried is another question: see [`is_final`].
pub fn is_timeout(error: &(dyn Error + 'static)) -> bool {
    chain(error).any(|e| {
        e.is::<AttemptTimedOut>()
            || e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
            || is_tower_elapsed(e)
            || is_tonic_timeout(e)
            || is_reqwest_timeout(e)
    })
}

/// Whether `e` is reqwest's, and reqwest says it is a timeout (its timeout error is a type
/// of its own, not an `io::Error`).
#[cfg(feature = "reqwest")]
fn is_reqwest_timeout(e: &(dyn Error + 'static)) -> bool {
    e.downcast_ref::<::reqwest::Error>()
        .is_some_and(::reqwest::Error::is_timeout)
}

/// Whether `e` is reqwest's, and reqwest says it is a connect error.
#[cfg(feature = "reqwest")]
fn is_reqwest_connect_error(e: &(dyn Error + 'static)) -> bool {
    e.downcast_ref::<::reqwest::Error>()
        .is_some_and(::reqwest::Error::is_connect)
}

#[cfg(not(feature = "reqwest"))]
fn is_reqwest_timeout(_: &(dyn Error + 'static)) -> bool {
    false
}

#[cfg(not(feature = "reqwest"))]
fn is_reqwest_connect_error(_: &(dyn Error + 'static)) -> bool {
    false
}

#[cfg(feature = "tonic")]
fn is_tonic_timeout(e: &(dyn Error + 'static)) -> bool {
    e.is::<::tonic::TimeoutExpired>()
}

#[cfg(not(feature = "tonic"))]
fn is_tonic_timeout(_: &(dyn Error + 'static)) -> bool {
    false
}

#[cfg(feature = "tonic")]
fn is_tonic_connect_error(e: &(dyn Error + 'static)) -> bool {
    e.is::<::tonic::ConnectError>()
}

#[cfg(not(feature = "tonic"))]
fn is_tonic_connect_error(_: &(dyn Error + 'static)) -> bool {
    false
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
    use overload_signal::protocol::GRPC_RETRY_PUSHBACK_MS;
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
        let c = DefaultClassifier::new();
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
        let c = DefaultClassifier::new();
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
        let c = DefaultClassifier::new();
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
        // gRPC's rules: RESOURCE_EXHAUSTED is retryable with or without a pushback.
        assert_eq!(grpc("8", None), Classification::Retryable);
        assert_eq!(grpc("0", None), Classification::Final);
        assert_eq!(grpc("13", None), Classification::Final);
        assert_eq!(grpc("4", None), Classification::Final);
        assert_eq!(grpc("junk", None), Classification::Final);
    }

    #[test]
    fn grpc_retryable_codes_are_configurable_and_checked() {
        let only_internal = DefaultClassifier::builder()
            .grpc_retryable_codes(&[13])
            .build()
            .unwrap();
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/grpc"));
        h.insert("grpc-status", HeaderValue::from_static("13"));
        assert_eq!(
            only_internal.classify_response(StatusCode::OK, &h),
            Classification::Retryable
        );
        h.insert("grpc-status", HeaderValue::from_static("14"));
        assert_eq!(
            only_internal.classify_response(StatusCode::OK, &h),
            Classification::Final
        );
        // HTTP failures are still retried.
        assert_eq!(
            only_internal.classify_response(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new()),
            Classification::Retryable
        );
        assert_eq!(
            format!("{only_internal:?}"),
            "DefaultClassifier { grpc_retryable_codes: [13] }"
        );
        assert_eq!(
            format!("{:?}", DefaultClassifier::new()),
            "DefaultClassifier { grpc_retryable_codes: [8, 14] }"
        );
        let none = DefaultClassifier::builder()
            .grpc_retryable_codes(&[])
            .build()
            .unwrap();
        assert!(!none.is_grpc_retryable(14));

        for bad in [0u16, 17, 999] {
            let err = DefaultClassifier::builder()
                .grpc_retryable_codes(&[14, bad, 18])
                .build()
                .unwrap_err();
            assert_eq!(err.field(), "grpc_retryable_codes");
            assert_eq!(err.kind(), crate::ConfigErrorKind::OutOfRange);
            assert_eq!(
                err.to_string(),
                format!(
                    "grpc_retryable_codes must be a gRPC status code other than OK, \
                     within 1..=16, got {bad}"
                )
            );
        }
        assert_eq!(DefaultClassifier::default(), DefaultClassifier::new());
    }

    #[test]
    fn grpc_requests_may_be_retried_whatever_their_method() {
        let c = DefaultClassifier::new();
        for ct in ["application/grpc", "application/grpc+proto"] {
            let mut h = HeaderMap::new();
            h.insert("content-type", HeaderValue::from_static(ct));
            assert!(c.may_retry(&Method::POST, &h), "{ct}");
        }
        let mut web = HeaderMap::new();
        web.insert(
            "content-type",
            HeaderValue::from_static("application/grpc-web"),
        );
        assert!(!c.may_retry(&Method::POST, &web));
    }

    #[test]
    fn what_a_retry_layer_gave_up_on_is_final() {
        let c = DefaultClassifier::new();
        let gave_up = Wrap(Box::new(GaveUp::new(
            crate::GiveUpReason::MaxAttempts,
            3,
            Box::new(io::Error::from(io::ErrorKind::ConnectionRefused)),
        )));
        assert!(is_final(&gave_up));
        assert!(is_connect_error(&gave_up), "it is still a connect error");
        assert_eq!(c.classify_error(&gave_up), Classification::Final);
        let stopped = Wrap(Box::new(Overloaded::new()));
        assert!(is_final(&stopped));
        assert_eq!(c.classify_error(&stopped), Classification::Final);
        assert!(!is_final(&io::Error::from(
            io::ErrorKind::ConnectionRefused
        )));
    }

    #[test]
    fn connect_errors_and_timeouts_found_in_the_chain() {
        let c = DefaultClassifier::new();
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
        let gave_up = GaveUp::new(
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

    #[cfg(feature = "tonic")]
    #[test]
    fn tonic_timeouts_and_connect_errors_are_recognised() {
        let c = DefaultClassifier::new();
        let expired = Wrap(Box::new(::tonic::TimeoutExpired(())));
        assert!(is_timeout(&expired));
        assert_eq!(c.classify_error(&expired), Classification::Retryable);
        let connect = Wrap(Box::new(::tonic::ConnectError(Box::new(io::Error::other(
            "tls handshake",
        )))));
        assert!(is_connect_error(&connect));
        assert_eq!(c.classify_error(&connect), Classification::Retryable);
    }

    #[cfg(feature = "tower")]
    #[test]
    fn tower_elapsed_is_a_timeout() {
        let e = Wrap(Box::new(tower::timeout::error::Elapsed::new()));
        assert!(is_timeout(&e));
    }
}
