//! [`LimitsService`], the middleware of a [`LimitsLayer`](super::LimitsLayer).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::routes::LimitsState;
use crate::rate_limit::future::ResponseFuture;
use crate::rate_limit::service::call_local;

/// Limits each request by its entry of the limits file; built by
/// [`LimitsLayer`](super::LimitsLayer), whose docs say how. Clones share the limits.
///
/// The wrapped service is reached with `get_ref`, `get_mut` and `into_inner`.
pub struct LimitsService<S> {
    inner: S,
    shared: Arc<LimitsState>,
}

impl<S> LimitsService<S> {
    pub(super) const fn new(inner: S, shared: Arc<LimitsState>) -> Self {
        Self { inner, shared }
    }

    overload_core::define_inner_service_accessors!();
}

impl<S: Clone> Clone for LimitsService<S> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), Arc::clone(&self.shared))
    }
}

impl<S: fmt::Debug> fmt::Debug for LimitsService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitsService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for LimitsService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    /// Delegates to the inner service, as a [`RateLimit`](crate::RateLimit) does: the limit
    /// is decided in `call`.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // NOTE: one atomic load for the table; the entry's limit decides as a `RateLimit`
        // with its state would.
        let routes = self.shared.table.routes.load();
        let entry = routes.entry_for(&request);
        call_local(&entry.layer.state, &mut self.inner, request)
    }
}
