//! The response future of [`AdaptiveLimit`](super::AdaptiveLimit): [`ResponseFuture`].

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use overload_signal::Overloaded;
use overload_signal::propagation::{self, Downstream};
use overload_signal::protocol::{Outcome, Protocol};
use overload_signal::signal::Rejection;
use pin_project_lite::pin_project;

use super::state::{AdmittedRequest, CompleteRequest, Completion};

/// tower's boxed error, the one error type a classifier can look into without knowing the
/// inner service's.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// The response future of [`AdaptiveLimit`](super::AdaptiveLimit): the inner
    /// service's future for an admitted request, which measures it when it completes; the
    /// inner service's future alone for an exempt one; or a ready rejection.
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Admitted {
            #[pin]
            future: F,
            guard: AdmissionGuard,
        },
        Exempt {
            #[pin]
            future: F,
        },
        // Boxed: every layer outside moves this future, so it stays the inner future's
        // size and a few words.
        Rejected {
            response: Option<Box<Response<B>>>,
        },
    }
}

/// Holds an admitted request's slot; gives it back when the request completes or its
/// future is dropped, whichever comes first.
pub(super) struct AdmissionGuard {
    state: Arc<dyn CompleteRequest>,
    admitted: AdmittedRequest,
    done: bool,
}

impl AdmissionGuard {
    pub(super) fn new(state: Arc<dyn CompleteRequest>, admitted: AdmittedRequest) -> Self {
        Self {
            state,
            admitted,
            done: false,
        }
    }

    fn finish(&mut self, completion: Completion) {
        if !self.done {
            self.done = true;
            self.state.complete(&self.admitted, completion);
        }
    }
}

impl Drop for AdmissionGuard {
    fn drop(&mut self) {
        if !self.done {
            // NOTE: dropped before completing (the client went away, a timeout above fired):
            // the slot is given back; `complete` decides whether the time it ran is a sample.
            self.state.complete(&self.admitted, Completion::Dropped);
        }
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(super) fn admitted(future: F, guard: AdmissionGuard) -> Self {
        Self {
            state: State::Admitted { future, guard },
        }
    }

    pub(super) fn exempt(future: F) -> Self {
        Self {
            state: State::Exempt { future },
        }
    }

    pub(super) fn rejected(response: Response<B>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(Box::new(response)),
            },
        }
    }
}

/// How an admitted request's response counts, as the workspace's outcome table says (the
/// "adaptive limit" column of `overload_signal::protocol`'s "Outcomes"): left out
/// ([`Completion::LeftOut`]) when a limiting layer inside this one made it (it carries a
/// [`Rejection`]: the service never ran, and a global rate limit's `429`s must not drive this
/// limit down until it, rather than the rate limit, sheds the excess) or when it is the stop
/// signal (passed on from a downstream: a measure of the downstream, not of this service);
/// else a latency sample ([`Completion::Served`]), whatever its status: a handler's `503`
/// because its dependency is down is served as fast as the service serves anything, and
/// counting it as this service's overload would shed the routes that never use that
/// dependency (Envoy's adaptive concurrency filter uses latency alone, too).
pub(super) fn completion_of<B>(response: &Response<B>) -> Completion {
    if response.extensions().get::<Rejection>().is_some() {
        return Completion::LeftOut;
    }
    let headers = response.headers();
    let outcome = Outcome::of_response(Protocol::of_headers(headers), response.status(), headers);
    if outcome.is_stop_signal() {
        Completion::LeftOut
    } else {
        Completion::Served
    }
}

/// How an error of the inner service (no response at all) counts: left out when it is the
/// stop signal (an [`Overloaded`](overload_signal::Overloaded) in a `tower::BoxError`'s
/// chain, or one alone), an overload failure otherwise: a timeout or a load shedder inside,
/// the strongest sign of trouble there is.
pub(super) fn completion_of_error<E: 'static>(error: &E) -> Completion {
    let error: &dyn Any = error;
    let stop = if let Some(boxed) = error.downcast_ref::<BoxError>() {
        Outcome::of_error(&**boxed).is_stop_signal()
    } else {
        error.is::<Overloaded>()
    };
    if stop {
        Completion::LeftOut
    } else {
        Completion::Overloaded
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: 'static,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted { future, guard } => {
                let result = ready!(future.poll(cx));
                // NOTE: read now, while the overload layer's propagation scope is still the
                // one being polled: a request during which a downstream call was marked (a
                // stop signal received, a call throttled or given up on) measures that
                // downstream, not this service, whatever it answers. A call that ran out of
                // its deadline is different: the time is what a queueing service shows (its
                // downstream calls inherit what is left of its requests' deadlines), so the
                // request's time is a latency sample, never a failure. Outside any scope
                // there are no marks.
                let marks = propagation::in_scope_marks();
                let completion = if marks.stop_signal()
                    || marks.contains(Downstream::Throttled)
                    || marks.contains(Downstream::GaveUp)
                {
                    Completion::LeftOut
                } else if marks.contains(Downstream::DeadlineExceeded) {
                    Completion::Served
                } else {
                    match &result {
                        Ok(response) => completion_of(response),
                        Err(error) => completion_of_error(error),
                    }
                };
                guard.finish(completion);
                Poll::Ready(result)
            }
            StateProj::Exempt { future } => future.poll(cx),
            StateProj::Rejected { response } => Poll::Ready(Ok(*response
                .take()
                .expect("adaptive limit response future polled after completion"))),
        }
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Admitted { .. } => "admitted",
            State::Exempt { .. } => "exempt",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl fmt::Debug for AdmissionGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionGuard")
            .field("admitted", &self.admitted)
            .field("done", &self.done)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, StatusCode};
    use overload_signal::protocol::{GRPC_STATUS, X_OVERLOADED, stop_signal_response};
    use overload_signal::signal::{RejectionKind, RejectionScope};

    fn status(code: u16) -> Response<()> {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::from_u16(code).unwrap();
        r
    }

    fn grpc(code: &'static str) -> Response<()> {
        let mut r = Response::new(());
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        r.headers_mut()
            .insert(GRPC_STATUS, HeaderValue::from_static(code));
        r
    }

    /// Regression (issue 30, finding 4): a handler's `429`, `503` and `504` (and their gRPC
    /// codes) were this limit's overload failures, so a dependency that was down walked the
    /// limit to its floor and shed every route. Every response the service made is a
    /// latency sample, whatever its status.
    #[test]
    fn every_response_the_service_made_is_a_latency_sample() {
        for code in [200, 204, 301, 400, 404, 429, 500, 501, 502, 503, 504] {
            assert_eq!(completion_of(&status(code)), Completion::Served, "{code}");
        }
        for code in ["0", "2", "4", "8", "13", "14", "junk"] {
            assert_eq!(
                completion_of(&grpc(code)),
                Completion::Served,
                "grpc {code}"
            );
        }
    }

    /// The stop signal passed on from a downstream says how that downstream is doing, not
    /// this service: left out, over HTTP and gRPC, whatever the status it rides on.
    #[test]
    fn the_stop_signal_is_left_out() {
        for protocol in [Protocol::Http, Protocol::Grpc, Protocol::GrpcWeb] {
            let stop = stop_signal_response::<()>(protocol);
            assert_eq!(completion_of(&stop), Completion::LeftOut, "{protocol:?}");
        }
        let mut gateway = status(502);
        gateway
            .headers_mut()
            .insert(X_OVERLOADED, HeaderValue::from_static("stop-retrying"));
        assert_eq!(completion_of(&gateway), Completion::LeftOut);
        // The header on a success is not the signal (any proxy may add a header).
        let mut ok = status(200);
        ok.headers_mut()
            .insert(X_OVERLOADED, HeaderValue::from_static("stop-retrying"));
        assert_eq!(completion_of(&ok), Completion::Served);
    }

    /// Regression (issue 23, finding 3): a global rate limit's `429`s inside the adaptive
    /// limit counted as the service's overload failures, and drove the limit down until it,
    /// not the rate limit, shed the excess. A limiter's marked rejection is left out.
    #[test]
    fn a_limiters_own_rejections_are_neither_samples_nor_failures() {
        assert_eq!(completion_of(&status(200)), Completion::Served);
        for scope in [RejectionScope::Server, RejectionScope::Caller] {
            let mut limited = status(429);
            limited
                .extensions_mut()
                .insert(Rejection::new(RejectionKind::RateLimited, scope));
            assert_eq!(completion_of(&limited), Completion::LeftOut, "{scope:?}");
        }
    }

    /// An error of the inner service is an overload failure, unless it is the stop signal
    /// (`Overloaded`, alone or in a boxed error's chain).
    #[test]
    fn errors_are_overload_failures_but_the_stop_signal() {
        let timeout: BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(completion_of_error(&timeout), Completion::Overloaded);
        assert_eq!(
            completion_of_error(&std::io::Error::other("reset")),
            Completion::Overloaded
        );
        let stop: BoxError = Box::new(Overloaded::new());
        assert_eq!(completion_of_error(&stop), Completion::LeftOut);
        assert_eq!(completion_of_error(&Overloaded::new()), Completion::LeftOut);
    }
}
