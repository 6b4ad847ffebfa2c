//! The response future of [`OverloadSignal`](super::OverloadSignal).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use super::service::Shared;
use crate::propagation::{self, Scoped};
use crate::protocol::Protocol;

pin_project! {
    /// The response future of [`OverloadSignal`](super::OverloadSignal): runs the inner
    /// future inside a [propagation scope](crate::propagation::scope), then decides the
    /// response.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Scoped<F>,
        protocol: Protocol,
        shared: Arc<Shared>,
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn new(inner: Scoped<F>, protocol: Protocol, shared: Arc<Shared>) -> Self {
        Self {
            inner,
            protocol,
            shared,
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Default,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let result = ready!(this.inner.as_mut().poll(cx));
        let downstream_stop = propagation::stop_received(this.inner);
        Poll::Ready(result.map(|r| this.shared.respond(r, *this.protocol, downstream_stop)))
    }
}
