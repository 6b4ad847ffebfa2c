use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use overload_core::clock::{Clock, TokioClock};
use overload_core::telemetry::LayerName;

use super::future::ResponseFuture;
use super::levels::CriticalitySettings;
use super::proxies::TrustedProxies;
use super::rule::StopRule;
use super::state::{SignalSettings, SignalState};
use super::trust::Trust;
use crate::histogram::AttemptHistogram;
use crate::propagation;
use crate::protocol::{Criticality, Protocol, RequestFields};

/// Server middleware that records attempt counters and answers with the stop signal when
/// the fleet is drowning in retries or a downstream call received it.
///
/// Made by [`OverloadSignalLayer`](super::OverloadSignalLayer), whose builder sets the
/// histogram and the rule; see the [module docs](crate::signal) for what it does to each
/// response. `C` is the histogram's clock.
pub struct OverloadSignal<S, C: Clock = TokioClock> {
    inner: S,
    state: Arc<SignalState<C>>,
    proxies: Option<TrustedProxies>,
    trust: Trust,
    /// The levels it resolves, if any.
    criticality: Option<Arc<CriticalitySettings>>,
}

impl<S> OverloadSignal<S> {
    /// Wraps `inner` with a histogram and a rule of its own, with every default of
    /// [`OverloadSignalLayer::new`](super::OverloadSignalLayer::new) (10 seconds in 10
    /// buckets; retry pressure above 5 % with at least 200 requests, sustained; callers keyed
    /// by their network; the counters of callers on private networks count).
    ///
    /// Prefer [`OverloadSignalLayer`](super::OverloadSignalLayer): the services one layer
    /// makes share one histogram, so they judge the whole server's traffic.
    pub fn new(inner: S) -> Self {
        Self::from_state(
            inner,
            Arc::new(SignalState::new(SignalSettings::new())),
            None,
            Trust::default(),
            None,
        )
    }
}

impl<S, C: Clock> OverloadSignal<S, C> {
    pub(super) fn from_state(
        inner: S,
        state: Arc<SignalState<C>>,
        proxies: Option<TrustedProxies>,
        trust: Trust,
        criticality: Option<Arc<CriticalitySettings>>,
    ) -> Self {
        Self {
            inner,
            state,
            proxies,
            trust,
            criticality,
        }
    }

    overload_core::define_inner_service_accessors!();

    /// The histogram this middleware records into.
    pub fn histogram(&self) -> &AttemptHistogram<C> {
        &self.state.histogram
    }

    /// The rule this middleware decides with.
    pub fn rule(&self) -> StopRule {
        **self.state.rule.load()
    }

    /// The name of the layer this middleware belongs to (`"default"` for
    /// [`OverloadSignal::new`]): the `name` label of its metrics and the `name` field of its
    /// logs.
    pub fn name(&self) -> &LayerName {
        self.state.name()
    }
}

impl<S: Clone, C: Clock> Clone for OverloadSignal<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            state: Arc::clone(&self.state),
            proxies: self.proxies.clone(),
            trust: self.trust.clone(),
            criticality: self.criticality.clone(),
        }
    }
}

impl<S: fmt::Debug, C: Clock> fmt::Debug for OverloadSignal<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadSignal")
            .field("inner", &self.inner)
            .field("name", self.state.name())
            .field("histogram", &self.state.histogram)
            .field("rule", &self.rule())
            .field("trusted_proxies", &self.proxies)
            .field("trust", &self.trust)
            .finish()
    }
}

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for OverloadSignal<S, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: 'static,
    C: Clock,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // No capacity of our own: readiness is the inner service's.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        if let Some(proxies) = &self.proxies {
            // NOTE: before the caller is identified, and left in the request for the layers
            // inside (a per-client limit): one resolution, one setting, for the whole stack.
            proxies.resolve(&mut parts);
        }
        let protocol = Protocol::of_headers(&parts.headers);
        // NOTE: recorded before the inner stack runs, so rejected requests count too: a
        // storm of rejected retries is exactly what the histogram must see.
        let trust = &self.trust;
        let caller = self.state.record(&parts, protocol, || {
            trust.trusts(&parts.headers, &parts.extensions)
        });
        let (level, resolved) = match &self.criticality {
            Some(criticality) => {
                let level =
                    criticality.resolve(&parts.headers, &parts.extensions, RequestFields::ALL);
                level.set_in(&mut parts.extensions);
                (level, Some(level))
            }
            None => (Criticality::of(&parts.extensions), None),
        };
        let request = Request::from_parts(parts, body);
        let inner = match resolved {
            Some(level) => propagation::call_at(level, || self.inner.call(request)),
            None => self.inner.call(request),
        };
        let inner = propagation::scope_at(inner, resolved);
        ResponseFuture::new(inner, protocol, caller, level, Arc::clone(&self.state))
    }
}
