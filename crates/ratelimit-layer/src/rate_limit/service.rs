//! The middleware: [`RateLimit`], and where it decides: here ([`Local`]) or possibly
//! elsewhere ([`Remote`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::future::admit;
#[cfg(feature = "redis")]
use super::future::{AwaitingDecision, RemoteResponseFuture};
use super::future::{ResponseFuture, respond};
#[cfg(feature = "redis")]
use super::remote_decision::RemoteStart;
use super::state::RateLimitState;
use crate::algorithm::Decision;
use overload_signal::protocol::Criticality;

/// A [`RateLimit`] (or [`RateLimitLayer`](crate::RateLimitLayer)) whose limit is decided in
/// `call`, in this process: every limit but one kept in Redis. The default.
///
/// The inner service is called from `call` or never: any service fits, `Clone` or not (a
/// `tower::util::BoxService` included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Local {}

/// A [`RateLimit`] (or [`RateLimitLayer`](crate::RateLimitLayer)) whose limit may be
/// decided elsewhere, after a round trip: a limit kept in Redis
/// ([`RateLimitBuilder::redis`](crate::RateLimitBuilder::redis)). Only with the feature
/// `redis`.
///
/// The decision comes after `call` has returned, so the response future takes the service
/// that `poll_ready` made ready and leaves a clone in its place (tower's `mem::replace`
/// pattern, as `tower::buffer` and `tower::filter::AsyncFilter` call their inner service
/// later): the inner service must be `Clone`, as axum's routes and tonic's services are. A
/// `RateLimitLayer<Local>` converts into a `RateLimitLayer<Remote>` (`From`), for a program
/// that chooses between a local limit and one in Redis at run time and keeps either in one
/// type.
#[cfg(feature = "redis")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Remote {}

/// Rejects requests above a rate before they reach the inner service; see the
/// [crate docs](crate).
///
/// Built by [`RateLimitLayer`](crate::RateLimitLayer); clones share the same limits. The
/// wrapped service is reached with `get_ref`, `get_mut` and `into_inner`.
///
/// Its second parameter says where the limit is decided: [`Local`] (the default) in
/// `call`, for any inner service; `Remote` (feature `redis`) possibly in Redis, after
/// `call` has returned, which needs a `Clone` inner service.
pub struct RateLimit<S, M = Local> {
    inner: S,
    state: Arc<RateLimitState>,
    mode: PhantomData<fn() -> M>,
}

impl<S, M> RateLimit<S, M> {
    pub(crate) const fn new(inner: S, state: Arc<RateLimitState>) -> Self {
        Self {
            inner,
            state,
            mode: PhantomData,
        }
    }

    overload_core::define_inner_service_accessors!();
}

impl<S: Clone, M> Clone for RateLimit<S, M> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), Arc::clone(&self.state))
    }
}

impl<S: fmt::Debug, M> fmt::Debug for RateLimit<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("state", &self.state)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, Local>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    /// Delegates to the inner service.
    ///
    /// The limit is decided in `call`, where the request is visible; this layer needs no
    /// capacity of its own. As with every short-circuiting `tower-http` layer, a rejected
    /// request leaves the readiness the inner service reserved for the next `call` on this
    /// instance (or releases it when the instance is dropped, as axum and hyper do per
    /// request).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        call_local(&self.state, &mut self.inner, request)
    }
}

/// What a [`Local`] limit with `state` does with `request` in front of `inner`: decides it
/// and calls `inner` if it is admitted. Also the call of each limit of a
/// [`LimitsLayer`](crate::limits_file::LimitsLayer).
#[inline]
pub(crate) fn call_local<S, ReqBody, ResBody>(
    state: &Arc<RateLimitState>,
    inner: &mut S,
    request: Request<ReqBody>,
) -> ResponseFuture<S::Future, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    state.on_request();
    let state = &**state;
    let level = Criticality::of(request.extensions());
    if let Some((cost, decided)) = state.decide_unread(level) {
        // NOTE: a limit that reads nothing of the request decides it whole: taking it
        // apart and putting it back together would copy it twice. The admitted path in
        // one expression, so that the inner service's future is built where it stays.
        if let (Decision::Allow, status, _) = decided {
            let fields = admit(state, status, level);
            return ResponseFuture::admitted(inner.call(request), fields);
        }
        let (parts, body) = request.into_parts();
        return respond(state, inner, parts, body, cost, Some(decided));
    }
    let (parts, body) = request.into_parts();
    let cost = state.cost(&parts);
    let decided = state.decide(&parts, cost);
    respond(state, inner, parts, body, cost, decided)
}

#[cfg(feature = "redis")]
impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, Remote>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = RemoteResponseFuture<S::Future, ResBody, S, ReqBody>;

    /// Delegates to the inner service, as a [`Local`] limit does.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        self.state.on_request();
        // NOTE: only without a remote decider (`unread_cost` is `None` with one): a
        // `RateLimitLayer<Local>` converted to `Remote`, Redis not configured.
        let level = Criticality::of(request.extensions());
        if let Some((cost, decided)) = self.state.decide_unread(level) {
            // NOTE: as for a `Local` limit: decided whole, the admitted path in one
            // expression.
            if let (Decision::Allow, status, _) = decided {
                let fields = admit(&self.state, status, level);
                return RemoteResponseFuture::admitted(self.inner.call(request), fields);
            }
            let (parts, body) = request.into_parts();
            return RemoteResponseFuture::decided(respond(
                &self.state,
                &mut self.inner,
                parts,
                body,
                cost,
                Some(decided),
            ));
        }
        let (parts, body) = request.into_parts();
        let state = &self.state;
        let cost = state.cost(&parts);
        let decided = match state.remote.as_ref().map(|r| r.start(&parts, cost)) {
            Some(RemoteStart::Pending(decision)) => {
                // NOTE: the decision comes later, so the future takes the service that was
                // made ready and leaves an unpolled clone here (tower's `mem::replace`
                // pattern): the next `call` on this instance comes after its own
                // `poll_ready`.
                let clone = self.inner.clone();
                let service = std::mem::replace(&mut self.inner, clone);
                return RemoteResponseFuture::deciding(AwaitingDecision {
                    decision,
                    service,
                    parts,
                    body,
                    cost,
                    state: Arc::clone(state),
                });
            }
            Some(RemoteStart::Decided(decision, status, class)) => {
                Some((decision, Some(status), class))
            }
            Some(RemoteStart::Local) | None => state.decide(&parts, cost),
        };
        if let Some((Decision::Allow, status, _)) = decided {
            // NOTE: the admitted path in one expression, so that the inner service's future
            // is built where it stays rather than moved through each wrapper in turn (every
            // move copies it, the request it may hold included).
            let fields = admit(state, status, level);
            return RemoteResponseFuture::admitted(
                self.inner.call(Request::from_parts(parts, body)),
                fields,
            );
        }
        RemoteResponseFuture::decided(respond(state, &mut self.inner, parts, body, cost, decided))
    }
}
