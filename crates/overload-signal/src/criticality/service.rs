use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use tower_service::Service;

use super::current::{CriticalityScope, call_with, enter};
use crate::protocol::RequestFields;
use crate::signal::levels::CriticalitySettings;

/// Server middleware: sets each request's [`Criticality`](crate::protocol::Criticality) in
/// its extensions and runs the inner service in it. Made by
/// [`CriticalityLayer`](super::CriticalityLayer); see the [module docs](crate::criticality).
pub struct CriticalityService<S> {
    inner: S,
    settings: Arc<CriticalitySettings>,
}

impl<S> CriticalityService<S> {
    pub(super) const fn new(inner: S, settings: Arc<CriticalitySettings>) -> Self {
        Self { inner, settings }
    }

    overload_core::define_inner_service_accessors!();
}

impl<S: Clone> Clone for CriticalityService<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for CriticalityService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CriticalityService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<Request<B>> for CriticalityService<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = CriticalityScope<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let level = self.settings.resolve(
            request.headers(),
            request.extensions(),
            RequestFields::of(request.headers()),
        );
        level.set_in(request.extensions_mut());
        let future = call_with(Some(level), || self.inner.call(request));
        enter(Some(level), future)
    }
}
