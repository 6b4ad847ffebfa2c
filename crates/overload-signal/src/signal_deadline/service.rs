use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Extensions, HeaderMap, Request, Response};
use overload_core::clock::{Clock, TokioClock};
use tower_service::Service;

use crate::deadline::{self, Arrival, DeadlineState};
use crate::propagation;
use crate::protocol::{Criticality, Protocol, RequestFields};
use crate::signal::callers::Caller;
use crate::signal::levels::CriticalitySettings;
use crate::signal::{self, SignalState, TrustedProxies};
use crate::trust::Trust;
use crate::{DeadlineLayer, OverloadSignalLayer};

/// What every service of a [`SignalDeadlineLayer`](super::SignalDeadlineLayer) shares: the
/// two layers' state and settings, in one allocation, so that a clone of the service is a
/// clone of its inner service and one reference count.
pub(crate) struct SignalDeadlineState<C: Clock> {
    signal: Arc<SignalState<C>>,
    proxies: Option<TrustedProxies>,
    /// Whose attempt counters count.
    signal_trust: Trust,
    deadline: Arc<DeadlineState>,
    /// Whose deadlines' send times are believed.
    deadline_trust: Trust,
    /// The levels the overload layer resolves, if any.
    criticality: Option<Arc<CriticalitySettings>>,
}

impl<C: Clock> SignalDeadlineState<C> {
    pub(super) fn new(signal_layer: &OverloadSignalLayer<C>, deadline: &DeadlineLayer) -> Self {
        let (signal, proxies, signal_trust) = signal_layer.service_parts();
        let (deadline, deadline_trust) = deadline.service_parts();
        Self {
            criticality: signal_layer.criticality_settings(),
            signal,
            proxies,
            signal_trust,
            deadline,
            deadline_trust,
        }
    }
}

impl<C: Clock> SignalDeadlineState<C> {
    /// What both layers read of a request, with its `parts` when it was taken apart (which
    /// it must be when the overload layer's key reads them): its protocol, its caller as the
    /// overload layer recorded it, its deadline, and its level (resolved when the overload
    /// layer resolves levels, else read from its extensions).
    #[inline(always)]
    fn arrive(
        &self,
        headers: &HeaderMap,
        extensions: &Extensions,
        parts: Option<&Parts>,
    ) -> Arrived {
        // NOTE: one pass over the header names finds which of the protocol's fields the
        // request carries; both readers below look up only those.
        let fields = RequestFields::of(headers);
        let protocol = if fields.may_have(RequestFields::CONTENT_TYPE) {
            Protocol::of_headers(headers)
        } else {
            Protocol::Http
        };
        // NOTE: the overload layer's part first, as when it wraps the deadline layer: it
        // records every request, the expired ones included.
        let trust = &self.signal_trust;
        let caller = self
            .signal
            .record_head(headers, extensions, parts, protocol, fields, || {
                trust.trusts(headers, extensions)
            });
        let arrival =
            self.deadline
                .arrive(headers, extensions, protocol, fields, &self.deadline_trust);
        // NOTE: the level from the same pass over the header names: no lookup of
        // `X-Request-Criticality` unless the request carries a header of that length.
        let (level, resolved) = match &self.criticality {
            Some(criticality) => {
                let level = criticality.resolve(headers, extensions, fields);
                (level, true)
            }
            None => (Criticality::of(extensions), false),
        };
        Arrived {
            protocol,
            caller,
            arrival,
            level,
            resolved,
        }
    }
}

/// What [`SignalDeadlineState::arrive`] read of a request.
#[derive(Clone, Copy)]
struct Arrived {
    protocol: Protocol,
    caller: Caller,
    arrival: Arrival,
    /// The request's level.
    level: Criticality,
    /// Whether the overload layer resolved it (and so sets it in the request and serves the
    /// request in it).
    resolved: bool,
}

impl<C: Clock> fmt::Debug for SignalDeadlineState<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignalDeadlineState")
            .field("name", self.signal.name())
            .field("histogram", &self.signal.histogram)
            .field("rule", &**self.signal.rule.load())
            .field("trusted_proxies", &self.proxies)
            .field("trust", &self.signal_trust)
            .field("deadline", &self.deadline)
            .field("deadline_trust", &self.deadline_trust)
            .finish()
    }
}

/// Server middleware: [`OverloadSignal`](crate::OverloadSignal) around
/// [`Deadline`](crate::Deadline), as one service. Made by
/// [`SignalDeadlineLayer`](super::SignalDeadlineLayer); see the
/// [module docs](crate::signal_deadline).
///
/// Its response future is the overload layer's around the deadline layer's, as the two
/// layers stacked make it.
pub struct SignalDeadline<S, C: Clock = TokioClock> {
    inner: S,
    shared: Arc<SignalDeadlineState<C>>,
}

impl<S, C: Clock> SignalDeadline<S, C> {
    pub(super) const fn from_shared(inner: S, shared: Arc<SignalDeadlineState<C>>) -> Self {
        Self { inner, shared }
    }

    overload_core::define_inner_service_accessors!();
}

impl<S: Clone, C: Clock> Clone for SignalDeadline<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, C: Clock> fmt::Debug for SignalDeadline<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignalDeadline")
            .field("inner", &self.inner)
            .field("shared", &self.shared)
            .finish()
    }
}

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for SignalDeadline<S, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: 'static,
    C: Clock,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = signal::future::ResponseFuture<deadline::future::ResponseFuture<S::Future>, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // No capacity of our own: readiness is the inner service's.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        if shared.signal.key_reads_parts() {
            return self.call_apart(request);
        }
        // NOTE: the default caller key reads the extensions only: the request is read where
        // it is, not taken apart and put together again (each a copy of its head).
        if let Some(proxies) = &shared.proxies {
            // NOTE: before the caller is identified, and left in the request for the layers
            // inside, as the overload layer does.
            if let Some(client) = proxies.resolved(request.headers(), request.extensions()) {
                request.extensions_mut().insert(client);
            }
        }
        let arrived = shared.arrive(request.headers(), request.extensions(), None);
        if arrived.resolved {
            arrived.level.set_in(request.extensions_mut());
        }
        self.dispatch(request, arrived)
    }
}

impl<S, C: Clock> SignalDeadline<S, C> {
    /// [`call`](Service::call) for a caller key of the user's own, which reads the request's
    /// [`Parts`](http::request::Parts).
    #[inline(never)]
    fn call_apart<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
    ) -> <Self as Service<Request<ReqBody>>>::Future
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        S::Error: 'static,
        ResBody: Default,
    {
        let shared = &*self.shared;
        let (mut parts, body) = request.into_parts();
        if let Some(proxies) = &shared.proxies {
            proxies.resolve(&mut parts);
        }
        let arrived = shared.arrive(&parts.headers, &parts.extensions, Some(&parts));
        if arrived.resolved {
            arrived.level.set_in(&mut parts.extensions);
        }
        self.dispatch(Request::from_parts(parts, body), arrived)
    }

    /// The response future of a request the two layers have read.
    #[inline(always)]
    fn dispatch<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
        arrived: Arrived,
    ) -> <Self as Service<Request<ReqBody>>>::Future
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        S::Error: 'static,
        ResBody: Default,
    {
        let shared = &*self.shared;
        let Arrived {
            protocol,
            caller,
            arrival,
            level,
            resolved,
        } = arrived;
        let scoped_level = resolved.then_some(level);
        if let Arrival::Open = arrival {
            // NOTE: the common case, in one expression, so that the inner service's future
            // is built where it stays rather than moved through each wrapper in turn
            // (every move copies it, the request it may hold included).
            let inner = &mut self.inner;
            return signal::future::ResponseFuture::new(
                propagation::scope_at(
                    deadline::future::ResponseFuture::open(if resolved {
                        propagation::call_at(level, || inner.call(request))
                    } else {
                        inner.call(request)
                    }),
                    scoped_level,
                ),
                protocol,
                caller,
                level,
                Arc::clone(&shared.signal),
            );
        }
        let inner = if resolved {
            propagation::call_at(level, || {
                deadline::call_arrived(
                    &shared.deadline,
                    &mut self.inner,
                    request,
                    arrival,
                    protocol,
                )
            })
        } else {
            deadline::call_arrived(
                &shared.deadline,
                &mut self.inner,
                request,
                arrival,
                protocol,
            )
        };
        signal::future::ResponseFuture::new(
            propagation::scope_at(inner, scoped_level),
            protocol,
            caller,
            level,
            Arc::clone(&shared.signal),
        )
    }
}
