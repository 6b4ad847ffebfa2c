//! How a [`Retry`](crate::Retry) fits the service it wraps: the request body each attempt is
//! sent with, and the form of what it returns.
//!
//! The retry layer keeps a copy of the request body for replay, so the service it wraps
//! receives a [`ReplayBody<B>`] rather than the caller's `B`. An [`Adapter`] names the body
//! the wrapped service takes instead, and shapes the outcomes for the caller:
//!
//! - [`Direct`] (the default): the wrapped service takes `ReplayBody<B>` as it is, as
//!   hyper-util's legacy `Client` and any service generic over bodies do; outcomes are the
//!   ones listed in the [crate docs](crate#outcomes).
//! - `Tonic` (with the `tonic` feature): the wrapped service takes `tonic::body::Body`, as a
//!   tonic `Channel` does, and every outcome is what a generated tonic client expects: see
//!   `Tonic`'s docs. Chosen with `RetryLayer::for_tonic`.
//!
//! The trait is sealed: these are the only adapters.

use http::{HeaderMap, Response};
use overload_signal::Overloaded;

use crate::BoxError;
use crate::body::ReplayBody;
use crate::outcome::RetryInfo;
use crate::throttle::Throttled;

mod sealed {
    // NOTE: public in a private module, so that `Adapter` can name it as a supertrait while
    // no other crate can implement it.
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}

/// How a [`Retry`](crate::Retry) fits the service it wraps; see the [module docs](self).
///
/// Its methods are called by the retry layer.
pub trait Adapter<B>: sealed::Sealed + Send + Sync + 'static {
    /// The request body each attempt is sent with.
    type Body;

    /// The body of one attempt, from the replayable body the layer made for it.
    fn attempt_body(body: ReplayBody<B>) -> Self::Body;

    /// What the caller gets for a response the layer returns; `info` is already in its
    /// extensions.
    ///
    /// # Errors
    ///
    /// An adapter may turn a response into an error (tonic's deadline, see `Tonic`).
    fn response<R>(response: Response<R>, info: RetryInfo) -> Result<Response<R>, BoxError>;

    /// What the caller gets for an error the layer returns (a [`GaveUp`](crate::GaveUp), or
    /// the inner service's error).
    fn error(error: BoxError, info: RetryInfo) -> BoxError;

    /// What the caller gets for a failure carrying the stop signal, from the headers of that
    /// failure after `attempts` attempts.
    fn stop_signal(headers: HeaderMap, attempts: u32) -> BoxError;

    /// What the caller gets for a request the client-side throttle refused (not sent).
    fn throttled(refused: Throttled) -> BoxError;
}

/// The default [`Adapter`]: the wrapped service takes [`ReplayBody<B>`] as it is, and
/// outcomes are returned as the [crate docs](crate#outcomes) list them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Direct;

impl sealed::Sealed for Direct {}

impl<B> Adapter<B> for Direct {
    type Body = ReplayBody<B>;

    #[inline]
    fn attempt_body(body: ReplayBody<B>) -> ReplayBody<B> {
        body
    }

    #[inline]
    fn response<R>(response: Response<R>, _: RetryInfo) -> Result<Response<R>, BoxError> {
        Ok(response)
    }

    #[inline]
    fn error(error: BoxError, _: RetryInfo) -> BoxError {
        error
    }

    fn stop_signal(_: HeaderMap, _: u32) -> BoxError {
        Box::new(Overloaded::new())
    }

    fn throttled(refused: Throttled) -> BoxError {
        Box::new(refused)
    }
}

#[cfg(feature = "tonic")]
pub use self::tonic::Tonic;

#[cfg(feature = "tonic")]
mod tonic {
    use std::sync::Arc;

    use ::tonic::metadata::MetadataMap;
    use ::tonic::{Code, Status};
    use http::{HeaderMap, HeaderValue, Response, StatusCode};
    use http_body::Body;
    use overload_signal::Overloaded;
    use overload_signal::protocol::{
        GRPC_MESSAGE, GRPC_PREVIOUS_RPC_ATTEMPTS, GRPC_STATUS, STOP_RETRYING, X_OVERLOADED,
        grpc_status,
    };

    use crate::BoxError;
    use crate::adapter::{Adapter, sealed};
    use crate::body::ReplayBody;
    use crate::grpc::decode_message;
    use crate::outcome::{GaveUp, GiveUpReason, RetryInfo};
    use crate::throttle::Throttled;

    /// `grpc-status-details-bin`: a status's binary details, not carried over to statuses
    /// this adapter makes.
    const GRPC_STATUS_DETAILS: &str = "grpc-status-details-bin";

    /// The [`Adapter`] for tonic (with the `tonic` feature): wraps a tonic `Channel`, or any
    /// `Service<http::Request<tonic::body::Body>>`, so that a generated client takes the
    /// retrying service as it is. Chosen with
    /// [`RetryLayer::for_tonic`](crate::RetryLayer::for_tonic).
    ///
    /// What a generated client's caller gets:
    ///
    /// | outcome | the caller gets |
    /// |---|---|
    /// | a success | `Ok(response)`; [`RetryInfo`] in `response.extensions()` |
    /// | the stop signal | `Err(status)`, `status.code() == Code::Unavailable`, the failure's metadata (`x-overloaded` always, `grpc-retry-pushback-ms` when sent); [`is_overloaded`](crate::is_overloaded)`(&status)` holds |
    /// | the deadline passed, or the next wait would pass it | `Err(status)`, `Code::DeadlineExceeded`; its source is a [`GaveUp`] |
    /// | refused by the client-side throttle (not sent) | `Err(status)`, `Code::Unavailable`, the message saying so; its source is a [`Throttled`]: [`is_throttled`](crate::is_throttled)`(&status)` holds |
    /// | any other failure | `Err(status)` as tonic makes it from the last attempt's response or error |
    ///
    /// After more than one attempt, every `Err(status)` carries gRPC's own retry metadata,
    /// `grpc-previous-rpc-attempts` (the attempts before the last; gRPC's retry design, A6,
    /// exposes it to client applications the same way): read it with
    /// [`Tonic::attempts`]. A `Status` made from an error the layer gave up on has that
    /// [`GaveUp`] in its source chain.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct Tonic;

    impl Tonic {
        /// How many attempts a call took, from a `Status` a retrying tonic client returned:
        /// 1 plus its `grpc-previous-rpc-attempts` metadata, 1 when that is absent.
        ///
        /// ```
        /// use backoff_layer::adapter::Tonic;
        ///
        /// let mut status = tonic::Status::resource_exhausted("rate limit exceeded");
        /// assert_eq!(Tonic::attempts(&status), 1);
        /// status.metadata_mut().insert("grpc-previous-rpc-attempts", "2".parse().unwrap());
        /// assert_eq!(Tonic::attempts(&status), 3);
        /// ```
        pub fn attempts(status: &Status) -> u32 {
            status
                .metadata()
                .get(GRPC_PREVIOUS_RPC_ATTEMPTS.as_str())
                .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
                .map_or(1, |previous| previous.saturating_add(1))
        }
    }

    impl sealed::Sealed for Tonic {}

    impl<B> Adapter<B> for Tonic
    where
        B: Body + Send + 'static,
        B::Error: Into<BoxError>,
    {
        type Body = ::tonic::body::Body;

        #[inline]
        fn attempt_body(body: ReplayBody<B>) -> ::tonic::body::Body {
            ::tonic::body::Body::new(body)
        }

        fn response<R>(
            mut response: Response<R>,
            info: RetryInfo,
        ) -> Result<Response<R>, BoxError> {
            if info.gave_up == Some(GiveUpReason::Deadline) {
                let (parts, _) = response.into_parts();
                let last = last_status(parts.status, &parts.headers);
                let gave_up = GaveUp::new(GiveUpReason::Deadline, info.attempts, Box::new(last));
                let metadata = metadata(parts.headers, info.attempts);
                let mut status =
                    Status::with_metadata(Code::DeadlineExceeded, gave_up.to_string(), metadata);
                status.set_source(Arc::new(gave_up));
                return Err(Box::new(status));
            }
            if info.attempts > 1 {
                response
                    .headers_mut()
                    .insert(GRPC_PREVIOUS_RPC_ATTEMPTS, previous(info.attempts));
            }
            Ok(response)
        }

        fn error(error: BoxError, info: RetryInfo) -> BoxError {
            if info.gave_up == Some(GiveUpReason::Deadline) {
                let mut status = Status::with_metadata(
                    Code::DeadlineExceeded,
                    error.to_string(),
                    metadata(HeaderMap::new(), info.attempts),
                );
                status.set_source(Arc::from(error));
                return Box::new(status);
            }
            if info.attempts <= 1 {
                // NOTE: tonic makes the same `Status` from it; nothing to add.
                return error;
            }
            let mut status = Status::from_error(error);
            status
                .metadata_mut()
                .as_mut()
                .insert(GRPC_PREVIOUS_RPC_ATTEMPTS, previous(info.attempts));
            Box::new(status)
        }

        fn stop_signal(headers: HeaderMap, attempts: u32) -> BoxError {
            let message = headers
                .get(GRPC_MESSAGE)
                .map(decode_message)
                .unwrap_or_else(|| Overloaded::new().to_string());
            let mut metadata = metadata(headers, attempts);
            if !metadata.as_ref().contains_key(X_OVERLOADED) {
                // A negative pushback alone is the signal too; say it in the one way callers
                // match on.
                metadata
                    .as_mut()
                    .insert(X_OVERLOADED, HeaderValue::from_static(STOP_RETRYING));
            }
            let mut status = Status::with_metadata(Code::Unavailable, message, metadata);
            status.set_source(Arc::new(Overloaded::new()));
            Box::new(status)
        }

        fn throttled(refused: Throttled) -> BoxError {
            // NOTE: UNAVAILABLE, as gRPC's own client-side throttling (in its RLS balancer)
            // fails a throttled call; the source tells it apart from a server's.
            let mut status = Status::unavailable(refused.to_string());
            status.set_source(Arc::new(refused));
            Box::new(status)
        }
    }

    /// `grpc-previous-rpc-attempts` after `attempts` attempts.
    fn previous(attempts: u32) -> HeaderValue {
        HeaderValue::from(attempts.saturating_sub(1))
    }

    /// A status's metadata from a response's headers: everything but the status itself, and
    /// `grpc-previous-rpc-attempts` after more than one attempt.
    fn metadata(mut headers: HeaderMap, attempts: u32) -> MetadataMap {
        headers.remove(GRPC_STATUS);
        headers.remove(GRPC_MESSAGE);
        headers.remove(GRPC_STATUS_DETAILS);
        if attempts > 1 {
            headers.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, previous(attempts));
        }
        MetadataMap::from_headers(headers)
    }

    /// The status of a failure response: its gRPC status if it has one in its headers, else
    /// the one gRPC infers from the HTTP status (`UNAVAILABLE` for 429, 502, 503 and 504).
    fn last_status(http: StatusCode, headers: &HeaderMap) -> Status {
        match grpc_status(headers) {
            Some(code) => {
                let message = headers.get(GRPC_MESSAGE).map(decode_message);
                Status::new(Code::from(i32::from(code)), message.unwrap_or_default())
            }
            None => {
                let code = match http.as_u16() {
                    429 | 502 | 503 | 504 => Code::Unavailable,
                    _ => Code::Unknown,
                };
                Status::new(code, format!("HTTP status {http}"))
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use std::error::Error as _;

        use super::*;
        use crate::AttemptTimedOut;

        type A = Tonic;
        type Body = ::tonic::body::Body;

        fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
            pairs
                .iter()
                .map(|&(k, v)| {
                    (
                        http::HeaderName::from_static(k),
                        HeaderValue::from_static(v),
                    )
                })
                .collect()
        }

        fn status(e: &BoxError) -> &Status {
            e.downcast_ref::<Status>()
                .unwrap_or_else(|| panic!("expected a Status, got {e:?}"))
        }

        #[test]
        fn the_stop_signal_is_unavailable_with_its_metadata() {
            let grpc = headers(&[
                ("content-type", "application/grpc"),
                ("grpc-status", "14"),
                ("grpc-message", "system overloaded, stop retrying"),
                ("grpc-retry-pushback-ms", "-1"),
                ("x-overloaded", "stop-retrying"),
            ]);
            let err = <A as Adapter<Body>>::stop_signal(grpc, 1);
            let s = status(&err);
            assert_eq!(s.code(), Code::Unavailable);
            assert_eq!(s.message(), "system overloaded, stop retrying");
            assert_eq!(s.metadata().get("x-overloaded").unwrap(), "stop-retrying");
            assert_eq!(s.metadata().get("grpc-retry-pushback-ms").unwrap(), "-1");
            assert!(s.metadata().get("grpc-status").is_none());
            assert!(s.metadata().get("grpc-previous-rpc-attempts").is_none());
            assert!(crate::is_overloaded(&*err));
            assert!(crate::is_overloaded(s));

            // RESOURCE_EXHAUSTED with a negative pushback, after two attempts.
            let pushback = headers(&[("grpc-status", "8"), ("grpc-retry-pushback-ms", "-5")]);
            let err = <A as Adapter<Body>>::stop_signal(pushback, 3);
            let s = status(&err);
            assert_eq!(s.code(), Code::Unavailable);
            assert_eq!(s.message(), "system overloaded: stop retrying");
            assert_eq!(s.metadata().get("x-overloaded").unwrap(), "stop-retrying");
            assert_eq!(Tonic::attempts(s), 3);

            // A plain HTTP 503 with the header, to a gRPC request.
            let http = headers(&[("x-overloaded", "yes")]);
            let err = <A as Adapter<Body>>::stop_signal(http, 1);
            assert_eq!(status(&err).code(), Code::Unavailable);
            assert_eq!(status(&err).metadata().get("x-overloaded").unwrap(), "yes");
        }

        #[test]
        fn responses_carry_the_attempts_and_a_deadline_becomes_deadline_exceeded() {
            let response = |pairs: &[(&'static str, &'static str)]| {
                let mut r = Response::new(());
                *r.headers_mut() = headers(pairs);
                r
            };
            let ok = <A as Adapter<Body>>::response(
                response(&[("grpc-status", "0")]),
                RetryInfo {
                    attempts: 1,
                    gave_up: None,
                },
            )
            .unwrap();
            assert!(!ok.headers().contains_key("grpc-previous-rpc-attempts"));
            let retried = <A as Adapter<Body>>::response(
                response(&[("grpc-status", "8")]),
                RetryInfo {
                    attempts: 3,
                    gave_up: Some(GiveUpReason::MaxAttempts),
                },
            )
            .unwrap();
            assert_eq!(retried.headers()["grpc-previous-rpc-attempts"], "2");

            let err = <A as Adapter<Body>>::response(
                response(&[
                    ("grpc-status", "8"),
                    ("grpc-message", "rate%20limit"),
                    ("grpc-retry-pushback-ms", "900"),
                ]),
                RetryInfo {
                    attempts: 2,
                    gave_up: Some(GiveUpReason::Deadline),
                },
            )
            .unwrap_err();
            let s = status(&err);
            assert_eq!(s.code(), Code::DeadlineExceeded);
            assert_eq!(s.message(), "gave up after 2 attempts: deadline would pass");
            assert_eq!(s.metadata().get("grpc-retry-pushback-ms").unwrap(), "900");
            assert_eq!(Tonic::attempts(s), 2);
            let gave_up = s.source().unwrap().downcast_ref::<GaveUp>().unwrap();
            assert_eq!(gave_up.reason(), GiveUpReason::Deadline);
            let last = gave_up.source().unwrap().downcast_ref::<Status>().unwrap();
            assert_eq!(last.code(), Code::ResourceExhausted);
            assert_eq!(last.message(), "rate limit");
        }

        #[test]
        fn errors_carry_the_attempts_and_a_deadline_becomes_deadline_exceeded() {
            let once = RetryInfo {
                attempts: 1,
                gave_up: None,
            };
            let io: BoxError = Box::new(std::io::Error::other("boom"));
            let err = <A as Adapter<Body>>::error(io, once);
            assert!(err.is::<std::io::Error>(), "left for tonic to convert");

            let info = RetryInfo {
                attempts: 3,
                gave_up: Some(GiveUpReason::MaxAttempts),
            };
            let gave_up: BoxError = Box::new(GaveUp::new(
                GiveUpReason::MaxAttempts,
                3,
                Box::new(::tonic::ConnectError(Box::new(std::io::Error::other(
                    "refused",
                )))),
            ));
            let err = <A as Adapter<Body>>::error(gave_up, info);
            let s = status(&err);
            // tonic's own mapping of a connect error, with the attempts added.
            assert_eq!(s.code(), Code::Unavailable);
            assert_eq!(Tonic::attempts(s), 3);
            assert!(crate::classify::is_final(&*err));

            let info = RetryInfo {
                attempts: 1,
                gave_up: Some(GiveUpReason::Deadline),
            };
            let gave_up: BoxError = Box::new(GaveUp::new(
                GiveUpReason::Deadline,
                1,
                Box::new(AttemptTimedOut::new()),
            ));
            let err = <A as Adapter<Body>>::error(gave_up, info);
            let s = status(&err);
            assert_eq!(s.code(), Code::DeadlineExceeded);
            assert_eq!(Tonic::attempts(s), 1);
            assert!(crate::classify::is_timeout(&*err));
        }

        #[test]
        fn a_refusal_is_unavailable_and_says_it_was_not_sent() {
            let err = <A as Adapter<Body>>::throttled(Throttled::new(0.9));
            let s = status(&err);
            assert_eq!(s.code(), Code::Unavailable);
            assert!(
                s.message().starts_with("request not sent"),
                "{}",
                s.message()
            );
            assert!(crate::is_throttled(s));
            assert!(crate::is_throttled(&*err));
            assert!(!crate::is_overloaded(&*err));
            assert!(crate::classify::is_final(&*err));
        }

        #[test]
        fn attempts_of_a_status_from_elsewhere() {
            let mut s = Status::unavailable("x");
            assert_eq!(Tonic::attempts(&s), 1);
            s.metadata_mut()
                .insert("grpc-previous-rpc-attempts", "junk".parse().unwrap());
            assert_eq!(Tonic::attempts(&s), 1);
            s.metadata_mut()
                .insert("grpc-previous-rpc-attempts", "4294967295".parse().unwrap());
            assert_eq!(Tonic::attempts(&s), u32::MAX);
        }
    }
}
