//! The response future of [`AdaptiveLimit`](super::AdaptiveLimit): [`ResponseFuture`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Response, StatusCode};
use overload_signal::protocol::grpc_status;
use overload_signal::signal::Rejection;
use pin_project_lite::pin_project;

use super::state::{AdmittedRequest, CompleteRequest, Completion};

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

    fn finish(&mut self, outcome: Completion) {
        if !self.done {
            self.done = true;
            self.state.complete(&self.admitted, outcome);
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

/// How an admitted request's response counts: [`Completion::Ignored`] when a limiting layer
/// inside this one made it (it carries a [`Rejection`]: the service never ran, and a global
/// rate limit's `429`s must not drive this limit down until it, rather than the rate limit,
/// sheds the excess), [`Completion::Overloaded`] when [`is_overload`] says so,
/// [`Completion::Served`] otherwise.
pub(super) fn outcome_of<B>(response: &Response<B>) -> Completion {
    if response.extensions().get::<Rejection>().is_some() {
        Completion::Ignored
    } else if is_overload(response) {
        Completion::Overloaded
    } else {
        Completion::Served
    }
}

/// Whether a response says that the service is overloaded: HTTP 429, 503 or 504, or gRPC
/// `DEADLINE_EXCEEDED` (4), `RESOURCE_EXHAUSTED` (8) or `UNAVAILABLE` (14) in its head.
///
/// Other failures (a 500 from a bug, a 404) are not about capacity: they neither lower the
/// limit nor count as latency samples.
pub(super) fn is_overload<B>(response: &Response<B>) -> bool {
    matches!(
        response.status(),
        StatusCode::TOO_MANY_REQUESTS
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
    ) || matches!(grpc_status(response.headers()), Some(4 | 8 | 14))
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted { future, guard } => {
                let result = ready!(future.poll(cx));
                // NOTE: an error of the inner service (no response at all) is the strongest
                // sign of trouble there is; it counts as an overload failure.
                let outcome = result.as_ref().map_or(Completion::Overloaded, outcome_of);
                guard.finish(outcome);
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
    use overload_signal::protocol::GRPC_STATUS;

    fn status(code: u16) -> Response<()> {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::from_u16(code).unwrap();
        r
    }

    fn grpc(code: &'static str) -> Response<()> {
        let mut r = Response::new(());
        r.headers_mut()
            .insert(GRPC_STATUS, http::HeaderValue::from_static(code));
        r
    }

    #[test]
    fn overload_failures_are_the_ones_about_capacity() {
        for code in [429, 503, 504] {
            assert!(is_overload(&status(code)), "{code}");
        }
        for code in [200, 204, 301, 400, 404, 500, 501, 502] {
            assert!(!is_overload(&status(code)), "{code}");
        }
        for code in ["4", "8", "14"] {
            assert!(is_overload(&grpc(code)), "grpc {code}");
        }
        for code in ["0", "2", "5", "13", "junk"] {
            assert!(!is_overload(&grpc(code)), "grpc {code}");
        }
    }

    /// Regression (issue 23, finding 3): a global rate limit's `429`s inside the adaptive
    /// limit counted as the service's overload failures, and drove the limit down until it,
    /// not the rate limit, shed the excess. A limiter's marked rejection is ignored.
    #[test]
    fn a_limiters_own_rejections_are_neither_samples_nor_failures() {
        use overload_signal::signal::{RejectionKind, RejectionScope};
        assert_eq!(outcome_of(&status(200)), Completion::Served);
        assert_eq!(outcome_of(&status(429)), Completion::Overloaded);
        for scope in [RejectionScope::Server, RejectionScope::Caller] {
            let mut limited = status(429);
            limited
                .extensions_mut()
                .insert(Rejection::new(RejectionKind::RateLimited, scope));
            assert_eq!(outcome_of(&limited), Completion::Ignored, "{scope:?}");
        }
    }
}
