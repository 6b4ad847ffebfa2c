use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use http_body::Body;
use overload_signal::protocol::{Attempt, GRPC_PREVIOUS_RPC_ATTEMPTS, X_ENVOY_ATTEMPT_COUNT};
use tower_service::Service;

use super::config::RetryConfig;
use super::deadline::Timing;
use super::future::{ResponseFuture, Sent};
use super::level::{outgoing_level, set_level};
use super::trace;
use crate::BoxError;
use crate::adapter::{Adapter, Direct};
use crate::body::{BodySource, ReplayBody};
use crate::throttle::Target;

/// Retries requests to the inner service; see the [crate docs](crate).
///
/// Made by [`RetryLayer`](crate::RetryLayer). Clones share the configuration, the budget and
/// the seed source. `A` is the [`Adapter`]: how it fits the inner service
/// ([`Direct`] by default; `Tonic` for a tonic `Channel`).
pub struct Retry<S, A = Direct> {
    inner: S,
    config: Arc<RetryConfig>,
    adapter: PhantomData<fn() -> A>,
}

impl<S: Clone, A> Clone for Retry<S, A> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
            adapter: PhantomData,
        }
    }
}

impl<S: fmt::Debug, A> fmt::Debug for Retry<S, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .field("adapter", &std::any::type_name::<A>())
            .finish()
    }
}

impl<S, A> Retry<S, A> {
    pub(crate) const fn new(inner: S, config: Arc<RetryConfig>) -> Self {
        Self {
            inner,
            config,
            adapter: PhantomData,
        }
    }

    overload_core::define_inner_service_accessors!();
}

impl<S, A, ReqBody, ResBody> Service<Request<ReqBody>> for Retry<S, A>
where
    A: Adapter<ReqBody>,
    S: Service<Request<A::Body>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    ReqBody: Body,
    ReqBody::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = ResponseFuture<S, ReqBody, A>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let config = Arc::clone(&self.config);
        let (mut parts, body) = request.into_parts();
        let span = trace::request_span(&parts);
        // The level every attempt carries on the wire, and the one the throttle and the
        // budget shed by (absent: `critical`, the protocol's default).
        let on_wire = outgoing_level(&mut parts);
        let level = on_wire.unwrap_or_default();
        // Where the request's effective outcome and its attempts' actual ones are counted.
        let series = config.destinations.index(&parts.uri);
        // The client-side throttle decides first: a refused request is never sent, earns
        // nothing in the budget and fails at once.
        let ticket = match &config.throttle {
            Some(throttle) => match throttle.admit_at(Target::of(&parts), level) {
                Ok(ticket) => ticket,
                Err(refused) => {
                    trace::throttle_refused(&span);
                    config.destinations.request(series, false);
                    let refused = A::throttled(refused);
                    return ResponseFuture::refused(config, refused, series);
                }
            },
            None => None,
        };
        let may_retry =
            config.max_attempts > 1 && config.classifier.may_retry(&parts.method, &parts.headers);

        // What a retry needs, taken only when a retry is possible at all: the request's parts,
        // to rebuild each retry from, and a clone of the inner service to send it with.
        // NOTE: the parts are cloned before the attempt header is set (each retry sets its
        // own): a header map without it is cheaper to clone, and costs no allocation when the
        // request carries no other header. For the same reason, and so that each attempt
        // compares its own time left with the caller's, `grpc-timeout` is set after it.
        // NOTE: `self.inner` was made ready by `poll_ready` and serves the first attempt;
        // the clone, not ready, waits in the future and is polled ready before each retry.
        // NOTE: the attempt counters of proxies and of other gRPC clients count the
        // caller's attempts at this tier, not ours at the next (a gateway forwarding its
        // request's headers carries them): a server reads the largest counter it is sent,
        // so they must not reach it. Removed before the parts are cloned, for every attempt.
        strip_foreign_counters(&mut parts.headers);
        let retry = may_retry.then(|| (parts.clone(), self.inner.clone()));
        let (body, source) = if may_retry {
            ReplayBody::first_of(body, config.body_limit)
        } else {
            (ReplayBody::streamed(body), BodySource::Streamed)
        };
        // The layer's deadline folded with the caller's, and the first attempt's share of it
        // on the wire (see `deadline`).
        // NOTE: before the attempt header is set: a request without headers is then seen not
        // to be gRPC without a lookup.
        let timing = Timing::first(&config, &mut parts);
        if timing.passed {
            // No attempt after the deadline: the caller's had passed already.
            config.metrics().requests.increment(1);
            config.end_quiet_episodes();
            return ResponseFuture::not_sent(config, span, series);
        }
        Attempt::set(&mut parts.headers, 0);
        set_level(&mut parts.headers, on_wire);

        config.budget.deposit_at(level);
        let metrics = config.metrics();
        metrics.requests.increment(1);
        metrics.attempts.increment(1);
        config.end_quiet_episodes();
        let attempt_span = trace::first_attempt_span(&span, &parts);
        let future = {
            let _entered = attempt_span.enter();
            tracing::trace!("sending first attempt");
            self.inner
                .call(Request::from_parts(parts, A::attempt_body(body)))
        };
        let sent = Sent {
            timing,
            ticket,
            level: on_wire,
            series,
            span,
        };
        ResponseFuture::new(future, attempt_span, config, retry, source, sent)
    }
}

/// Removes `x-envoy-attempt-count` and `grpc-previous-rpc-attempts` from a request about to
/// be sent: this layer's `X-Request-Attempt` is the counter of its attempts.
#[inline]
fn strip_foreign_counters(headers: &mut http::HeaderMap) {
    // NOTE: no look-up at all on a request without headers; two otherwise, no allocation.
    if !headers.is_empty() {
        headers.remove(X_ENVOY_ATTEMPT_COUNT);
        headers.remove(GRPC_PREVIOUS_RPC_ATTEMPTS);
    }
}
