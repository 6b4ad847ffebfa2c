//! The response future of [`AdaptiveLimit`](super::AdaptiveLimit): [`ResponseFuture`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Response, StatusCode};
use overload_signal::protocol::grpc_status;
use overload_signal::signal::RejectionScope;
use pin_project_lite::pin_project;

use super::state::{AdmittedRequest, CompleteRequest};

pin_project! {
    /// The response future of [`AdaptiveLimit`](super::AdaptiveLimit): the inner
    /// service's future for an admitted request, which measures it when it completes, or a
    /// ready rejection.
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
        Rejected {
            response: Option<Response<B>>,
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

    fn finish(&mut self, failed: bool) {
        if !self.done {
            self.done = true;
            self.state.complete(&self.admitted, Some(failed));
        }
    }
}

impl Drop for AdmissionGuard {
    fn drop(&mut self) {
        if !self.done {
            // NOTE: dropped before completing (the client went away, a timeout above fired):
            // the slot is given back; `complete` decides whether the time it ran is a sample.
            self.state.complete(&self.admitted, None);
        }
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(super) fn admitted(future: F, guard: AdmissionGuard) -> Self {
        Self {
            state: State::Admitted { future, guard },
        }
    }

    pub(super) fn rejected(response: Response<B>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }
}

/// Whether a response says that the service is overloaded: HTTP 429, 503 or 504, or gRPC
/// `DEADLINE_EXCEEDED` (4), `RESOURCE_EXHAUSTED` (8) or `UNAVAILABLE` (14) in its head.
///
/// Other failures (a 500 from a bug, a 404) are not about capacity: they neither lower the
/// limit nor count as latency samples; nor does a rejection marked
/// [`RejectionScope::Caller`] (a keyed limit inside this one turning away one caller over
/// its own quota), so that a single client cannot drive the limit down for everyone.
pub(super) fn is_overload<B>(response: &Response<B>) -> bool {
    if response.extensions().get::<RejectionScope>() == Some(&RejectionScope::Caller) {
        return false;
    }
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
                let failed = result.as_ref().map_or(true, is_overload);
                guard.finish(failed);
                Poll::Ready(result)
            }
            StateProj::Rejected { response } => Poll::Ready(Ok(response
                .take()
                .expect("adaptive limit response future polled after completion"))),
        }
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Admitted { .. } => "admitted",
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
}
