use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use overload_core::telemetry::LayerName;
use tokio::time::Instant;
use tower_service::Service;

use super::current;
use super::future::ResponseFuture;
use super::state::{Arrival, DeadlineCaller, DeadlineSettings, DeadlineState};
use super::value::RequestDeadline;
use crate::protocol::{Protocol, RequestFields};
use crate::signal::trust::Trust;

/// Server middleware that drops work nobody waits for: a request whose caller's deadline
/// has passed is answered at once (`504`, gRPC `DEADLINE_EXCEEDED`) without calling the
/// inner service, and one still running at its deadline is cancelled.
///
/// Made by [`DeadlineLayer`](super::DeadlineLayer); see the [module docs](crate::deadline).
pub struct Deadline<S> {
    inner: S,
    state: Arc<DeadlineState>,
    trust: Trust,
}

impl<S> Deadline<S> {
    /// Wraps `inner` with every default of [`DeadlineLayer::new`](super::DeadlineLayer::new).
    pub fn new(inner: S) -> Self {
        Self::from_state(
            inner,
            Arc::new(DeadlineState::new(DeadlineSettings::new())),
            Trust::default(),
        )
    }

    pub(super) const fn from_state(inner: S, state: Arc<DeadlineState>, trust: Trust) -> Self {
        Self {
            inner,
            state,
            trust,
        }
    }

    overload_core::define_inner_service_accessors!();

    /// The name of the layer this middleware belongs to.
    pub fn name(&self) -> &LayerName {
        self.state.name()
    }
}

impl<S: Clone> Clone for Deadline<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            state: Arc::clone(&self.state),
            trust: self.trust.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Deadline<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deadline")
            .field("inner", &self.inner)
            .field("state", &self.state)
            .field("trust", &self.trust)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Deadline<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // No capacity of our own: readiness is the inner service's. An expired request then
        // leaves the inner service ready and unused, which Tower allows.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // NOTE: read in place, not through `into_parts`: the request is moved once, into
        // the inner service.
        let protocol = Protocol::of_headers(request.headers());
        let arrival = self.state.arrive(
            request.headers(),
            request.extensions(),
            protocol,
            RequestFields::ALL,
            &self.trust,
        );
        call_arrived(&self.state, &mut self.inner, request, arrival, protocol)
    }
}

/// The deadline layer's answer to a request that has arrived (`arrival`, of `protocol`):
/// `inner` called in the request's deadline scope, or not called at all. What
/// [`Deadline`] does once it has read the request, and the combined layer
/// ([`SignalDeadline`](crate::signal_deadline::SignalDeadline)) too.
#[inline]
pub(crate) fn call_arrived<S, ReqBody, ResBody>(
    state: &Arc<DeadlineState>,
    inner: &mut S,
    request: Request<ReqBody>,
    arrival: Arrival,
    protocol: Protocol,
) -> ResponseFuture<S::Future>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    match arrival {
        Arrival::Expired { queued, caller } => expired(state, queued, caller, protocol),
        // NOTE: `Open` means no deadline on the request and none in the current scope,
        // so the inner service runs outside any scope of ours: one of `None` would hide
        // nothing, and cost a task-local swap on every poll.
        Arrival::Open => ResponseFuture::open(inner.call(request)),
        Arrival::Live {
            deadline,
            cancel_at,
            caller,
        } => call_live(state, inner, request, deadline, cancel_at, caller, protocol),
    }
}

// NOTE: the paths of requests with a deadline are out of line, so that the hot path of a
// server whose requests carry none holds none of their code.
#[inline(never)]
fn call_live<S, ReqBody, ResBody>(
    state: &Arc<DeadlineState>,
    inner: &mut S,
    request: Request<ReqBody>,
    deadline: RequestDeadline,
    cancel_at: Instant,
    caller: DeadlineCaller,
    protocol: Protocol,
) -> ResponseFuture<S::Future>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    // NOTE: not in the request's extensions: inserting one allocates, and the task-local
    // is what handlers and the retry layer read: during the inner service's `call` (a
    // retry layer right under this one reads it there) and while its future runs.
    let future = current::call_with(Some(deadline), || inner.call(request));
    let cancel_at = state.cancel_at_deadline.then_some(cancel_at);
    ResponseFuture::running(
        current::enter(Some(deadline), future),
        cancel_at,
        caller,
        protocol,
        state,
    )
}

#[cold]
#[inline(never)]
fn expired<F>(
    state: &DeadlineState,
    queued: Duration,
    caller: DeadlineCaller,
    protocol: Protocol,
) -> ResponseFuture<F> {
    state.expired_on_arrival(queued, caller);
    tracing::debug!(
        name = state.name().as_str(),
        decision = "deadline_expired",
        queued_ms = u64::try_from(queued.as_millis()).unwrap_or(u64::MAX),
        "request expired before it was served"
    );
    ResponseFuture::expired(protocol)
}
