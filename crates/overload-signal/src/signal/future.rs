//! The response future of [`OverloadSignal`](super::OverloadSignal).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use super::callers::Caller;
use super::state::SignalState;
use crate::error::is_overloaded;
use crate::propagation::{self, Marks, Scoped};
use crate::protocol::{Criticality, Protocol};
use overload_core::clock::{Clock, TokioClock};

pin_project! {
    /// The response future of [`OverloadSignal`](super::OverloadSignal): runs the inner
    /// future inside a [propagation scope](crate::propagation::scope), then decides the
    /// response. `C` is the histogram's clock.
    pub struct ResponseFuture<F, C: Clock = TokioClock> {
        #[pin]
        inner: Scoped<F>,
        protocol: Protocol,
        caller: Caller,
        level: Criticality,
        state: Arc<SignalState<C>>,
    }
}

impl<F, C: Clock> ResponseFuture<F, C> {
    #[inline]
    pub(crate) fn new(
        inner: Scoped<F>,
        protocol: Protocol,
        caller: Caller,
        level: Criticality,
        state: Arc<SignalState<C>>,
    ) -> Self {
        Self {
            inner,
            protocol,
            caller,
            level,
            state,
        }
    }
}

impl<F, C: Clock> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("protocol", &self.protocol)
            .field("level", &self.level)
            .finish_non_exhaustive()
    }
}

impl<F, C, B, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    C: Clock,
    B: Default,
    E: 'static,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let mut result = ready!(this.inner.as_mut().poll(cx));
        let marks = propagation::take_marks(this.inner);
        match &mut result {
            Ok(response) => {
                this.state.respond(
                    response,
                    *this.protocol,
                    marks.stop_signal(),
                    *this.caller,
                    *this.level,
                );
            }
            // NOTE: an error after a downstream call was marked: a proxy's retry layer gave
            // up, was throttled or was told to stop. Answered, never passed on as an error,
            // which would reset the caller's connection. So is an `Overloaded` error that
            // reached here unmarked (a retry layer behind a `Buffer`, whose task is outside
            // the scope, or a service of your own that returns it).
            Err(error) if !marks.is_empty() || is_overloaded_error(error) => {
                let marks = if marks.is_empty() {
                    Marks::stop()
                } else {
                    marks
                };
                result = Ok(this.state.answer_error(*this.protocol, marks));
            }
            Err(_) => {}
        }
        Poll::Ready(result)
    }
}

/// Whether an inner service's error is, or holds in its `source()` chain, an
/// [`Overloaded`](crate::Overloaded): the error itself, or a `tower::BoxError` (the error
/// type of every layer that boxes, the retry layer's included).
fn is_overloaded_error<E: 'static>(error: &E) -> bool {
    let any = error as &dyn std::any::Any;
    if any.is::<crate::Overloaded>() {
        return true;
    }
    any.downcast_ref::<Box<dyn std::error::Error + Send + Sync>>()
        .is_some_and(|boxed| is_overloaded(&**boxed))
}
