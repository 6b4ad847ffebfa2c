//! The response futures of [`RateLimit`](crate::RateLimit): [`ResponseFuture`] for a limit
//! decided in `call`, and, with a limit kept in Redis (feature `redis`),
//! `RemoteResponseFuture`, which awaits the decision first; and how a decided request gets
//! its future (`respond`).

use std::fmt;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::request::Parts;
use http::{HeaderValue, Request, Response};
use overload_signal::protocol::{Criticality, Protocol, RATELIMIT, RATELIMIT_POLICY};
use overload_signal::signal::{Rejection, RejectionKind, RejectionScope};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::response::{exceeds_capacity, missing_key, rejection};
use super::state::RateLimitState;
use crate::algorithm::{Decision, QuotaStatus};
use crate::keyed::KeyClass;

#[cfg(feature = "redis")]
pub use remote::RemoteResponseFuture;

pin_project! {
    /// The response future of a [`RateLimit`](crate::RateLimit) decided in `call`: the
    /// inner service's future for an admitted request (adding the `RateLimit` fields if
    /// configured), or a ready rejection.
    ///
    /// Its parameters are the inner service's future `F` and the response body `B`.
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        // NOTE: the fields and the rejection boxed: every layer outside moves this future,
        // so it stays the inner future's size and a few words.
        Admitted {
            #[pin]
            future: F,
            fields: AdmittedFields,
        },
        Rejected {
            response: Option<Box<Response<B>>>,
        },
    }
}

impl<F, B> ResponseFuture<F, B> {
    /// An admitted request: the inner service's future, and the `RateLimit-Policy` and
    /// `RateLimit` fields to add to its response, if the layer adds them to admitted
    /// responses.
    #[inline]
    pub(crate) const fn admitted(
        future: F,
        fields: Option<Box<(HeaderValue, HeaderValue)>>,
    ) -> Self {
        Self {
            state: State::Admitted {
                future,
                fields: AdmittedFields::new(fields),
            },
        }
    }

    /// A request answered by the layer: a rejection, or a request without a key that the
    /// missing-key policy refuses.
    pub(crate) fn answered(response: Response<B>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(Box::new(response)),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted { future, fields } => {
                // NOTE: without fields to add (the default), the inner future's answer is
                // ours as it is: returned straight, the response is not moved out and back.
                if fields.is_none() {
                    return future.poll(cx);
                }
                let mut response = ready!(future.poll(cx))?;
                add_admitted_fields(&mut response, fields);
                Poll::Ready(Ok(response))
            }
            StateProj::Rejected { response } => Poll::Ready(Ok(*response
                .take()
                .expect("rate limit response future polled after completion"))),
        }
    }
}

/// The `RateLimit-Policy` and `RateLimit` fields to add to an admitted request's response,
/// if the layer adds them: what an admitted future holds beside the inner one.
///
/// NOTE: the same as the `Option` it holds, but for its drop: the `Option`'s is out of line
/// (it drops two header values and frees the box), so every admitted future would call it,
/// fields or not; this one checks inline and calls out of line only when there are fields.
pub(crate) struct AdmittedFields(ManuallyDrop<Option<Box<(HeaderValue, HeaderValue)>>>);

impl AdmittedFields {
    #[inline]
    const fn new(fields: Option<Box<(HeaderValue, HeaderValue)>>) -> Self {
        Self(ManuallyDrop::new(fields))
    }

    #[inline]
    fn is_none(&self) -> bool {
        self.0.is_none()
    }

    #[inline]
    fn take(&mut self) -> Option<Box<(HeaderValue, HeaderValue)>> {
        self.0.take()
    }
}

impl Drop for AdmittedFields {
    #[inline]
    fn drop(&mut self) {
        if let Some(fields) = self.take() {
            drop_fields(fields);
        }
    }
}

/// Drops fields an admitted future held and never added (its response never came).
#[cold]
#[inline(never)]
fn drop_fields(fields: Box<(HeaderValue, HeaderValue)>) {
    drop(fields);
}

/// Adds the `RateLimit-Policy` and `RateLimit` fields of an admitted request to its
/// response, if there are any (taken: a second call adds none).
#[inline]
pub(crate) fn add_admitted_fields<B>(response: &mut Response<B>, fields: &mut AdmittedFields) {
    if let Some((policy, status)) = fields.take().map(|fields| *fields) {
        // NOTE: appended, not inserted: an inner limiter's fields stay, and the client sees
        // every policy that applies (the draft's list form).
        let headers = response.headers_mut();
        headers.append(RATELIMIT_POLICY, policy);
        headers.append(RATELIMIT, status);
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

/// The answer to a request of `cost` once its limit is decided, with the metrics counted;
/// `decided` is `None` for a request without a key that the missing-key policy rejects.
///
/// NOTE: the admitted path is all that is inline; building a rejection, or the `RateLimit`
/// fields of an admitted response, is out of line, so that a server's hot path carries
/// none of that code.
#[inline]
pub(crate) fn respond<S, ReqBody, ResBody>(
    state: &RateLimitState,
    inner: &mut S,
    parts: Parts,
    body: ReqBody,
    cost: u32,
    decided: Option<(Decision, Option<QuotaStatus>, KeyClass)>,
) -> ResponseFuture<S::Future, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    let level = Criticality::of(&parts.extensions);
    match decided {
        Some((Decision::Allow, status, _)) => {
            let fields = admit(state, status, level);
            ResponseFuture::admitted(inner.call(Request::from_parts(parts, body)), fields)
        }
        Some((Decision::Reject { retry_after }, status, class)) => {
            ResponseFuture::answered(refuse(state, &parts, Some((retry_after, status, class))))
        }
        // NOTE: above the advertised limit's capacity, no wait would let the request in. Only
        // the local share of a limit kept in Redis, deciding while Redis is away, has a
        // capacity below it: a request between the two waits for Redis.
        Some((Decision::OverCapacity { .. }, status, class)) => {
            let advertised = state.advertised();
            if u64::from(cost) > advertised.capacity {
                ResponseFuture::answered(too_heavy(state, &parts, class))
            } else {
                let retry_after = advertised.window;
                ResponseFuture::answered(refuse(state, &parts, Some((retry_after, status, class))))
            }
        }
        None => ResponseFuture::answered(refuse(state, &parts, None)),
    }
}

/// Counts an admitted request, and returns the `RateLimit-Policy` and `RateLimit` fields
/// to add to its response, if the layer adds them (`status`: the quota's, when read).
#[inline]
pub(crate) fn admit(
    state: &RateLimitState,
    status: Option<QuotaStatus>,
    level: Criticality,
) -> Option<Box<(HeaderValue, HeaderValue)>> {
    state.count_admitted(level);
    // NOTE: `decide` reads the status for admissions when the fields are wanted; a request
    // admitted without a limit (no key, `MissingKey::Bypass`) has none, and no field
    // describes it.
    match status {
        Some(status) if state.admitted_headers => Some(admitted_fields(state, status)),
        _ => None,
    }
}

/// The `RateLimit-Policy` and `RateLimit` fields of an admitted response.
#[inline(never)]
fn admitted_fields(state: &RateLimitState, status: QuotaStatus) -> Box<(HeaderValue, HeaderValue)> {
    let advertised = state.advertised();
    Box::new((
        advertised.header.clone(),
        advertised.policy.status(status.remaining, status.reset),
    ))
}

/// The answer to a request the layer refuses: over the limit, to be retried after the
/// duration given, or without a key that the missing-key policy rejects (`refused` is
/// `None`).
#[inline(never)]
fn refuse<B: Default>(
    state: &RateLimitState,
    parts: &Parts,
    refused: Option<(Duration, Option<QuotaStatus>, KeyClass)>,
) -> Response<B> {
    let protocol = Protocol::of_headers(&parts.headers);
    let level = Criticality::of(&parts.extensions);
    let Some((retry_after, status, class)) = refused else {
        tracing::debug!(
            name = %state.name(),
            decision = RejectionKind::MissingKey.as_str(),
            criticality = level.as_str(),
            "request rejected: no key"
        );
        let mut response = missing_key(protocol);
        response.extensions_mut().insert(
            Rejection::new(RejectionKind::MissingKey, RejectionScope::Server)
                .with_layer(state.name().clone()),
        );
        return response;
    };
    // NOTE: `decide` reads the status for every rejection; a missing one (never expected) is
    // reported as a full window.
    let status = status.unwrap_or_else(|| QuotaStatus {
        remaining: 0,
        reset: state.advertised().window,
    });
    state.rejected(class, level, retry_after);
    rejection(state, protocol, retry_after, status, class)
}

/// The answer to a request whose cost exceeds the limit's capacity: `413` (gRPC
/// `INVALID_ARGUMENT`), counted as a rejection but no episode of the limit engaged: the
/// limit is not what refuses it, its own weight is.
#[cold]
#[inline(never)]
fn too_heavy<B: Default>(state: &RateLimitState, parts: &Parts, class: KeyClass) -> Response<B> {
    let level = Criticality::of(&parts.extensions);
    state.metrics.get().rejected(class, level).increment(1);
    tracing::debug!(
        name = %state.name(),
        key_class = class.as_str(),
        criticality = level.as_str(),
        capacity = state.advertised().capacity,
        decision = RejectionKind::ExceedsCapacity.as_str(),
        "request cost exceeds the limit's capacity"
    );
    exceeds_capacity(state, Protocol::of_headers(&parts.headers))
}

#[cfg(feature = "redis")]
mod remote {
    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, ready};

    use http::request::Parts;
    use http::{HeaderValue, Request, Response};
    use pin_project_lite::pin_project;
    use tower_service::Service;

    use crate::rate_limit::future::{AdmittedFields, ResponseFuture, add_admitted_fields, respond};
    use crate::rate_limit::remote_decision::RemoteDecision;
    use crate::rate_limit::state::RateLimitState;

    pin_project! {
        /// The response future of a [`RateLimit`](crate::RateLimit) whose limit may be
        /// decided elsewhere ([`Remote`](crate::Remote), a limit kept in Redis): the
        /// decision under way, then a [`ResponseFuture`].
        ///
        /// Its parameters are the inner service's future `F`, the response body `B`, and the
        /// inner service `S` with its request body `R`, which a decision under way holds
        /// until it calls the service.
        pub struct RemoteResponseFuture<F, B, S, R> {
            #[pin]
            state: RemoteFutureState<F, B, S, R>,
        }
    }

    pin_project! {
        #[project = RemoteFutureStateProj]
        enum RemoteFutureState<F, B, S, R> {
            // NOTE: boxed, so that a request decided at once (Redis away, a free request)
            // does not carry the request and a service in its future.
            Deciding {
                awaiting: Option<Box<AwaitingDecision<S, R>>>,
            },
            // NOTE: an admitted request decided in `call` (no remote decider, or a free
            // request), one level down: its future is polled without going through a
            // `ResponseFuture` as well.
            Admitted {
                #[pin]
                future: F,
                fields: AdmittedFields,
            },
            Decided {
                #[pin]
                future: ResponseFuture<F, B>,
            },
        }
    }

    /// A request whose limit is being decided elsewhere, with what it needs afterwards.
    pub(crate) struct AwaitingDecision<S, R> {
        pub(crate) decision: RemoteDecision,
        /// The inner service, made ready by the `poll_ready` that preceded the `call`.
        pub(crate) service: S,
        pub(crate) parts: Parts,
        pub(crate) body: R,
        pub(crate) cost: u32,
        pub(crate) state: Arc<RateLimitState>,
    }

    impl<F, B, S, R> RemoteResponseFuture<F, B, S, R> {
        pub(crate) fn deciding(awaiting: AwaitingDecision<S, R>) -> Self {
            Self {
                state: RemoteFutureState::Deciding {
                    awaiting: Some(Box::new(awaiting)),
                },
            }
        }

        /// A request admitted in `call`: the inner service's future, and the fields to add
        /// to its response (see [`ResponseFuture::admitted`]).
        #[inline]
        pub(crate) const fn admitted(
            future: F,
            fields: Option<Box<(HeaderValue, HeaderValue)>>,
        ) -> Self {
            Self {
                state: RemoteFutureState::Admitted {
                    future,
                    fields: AdmittedFields::new(fields),
                },
            }
        }

        pub(crate) const fn decided(future: ResponseFuture<F, B>) -> Self {
            Self {
                state: RemoteFutureState::Decided { future },
            }
        }
    }

    impl<B, S, R, E> Future for RemoteResponseFuture<S::Future, B, S, R>
    where
        S: Service<Request<R>, Response = Response<B>, Error = E>,
        B: Default,
    {
        type Output = Result<Response<B>, E>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            loop {
                match self.as_mut().project().state.project() {
                    RemoteFutureStateProj::Admitted { future, fields } => {
                        // NOTE: as in `ResponseFuture`: nothing to add, nothing moved.
                        if fields.is_none() {
                            return future.poll(cx);
                        }
                        let mut response = ready!(future.poll(cx))?;
                        add_admitted_fields(&mut response, fields);
                        return Poll::Ready(Ok(response));
                    }
                    RemoteFutureStateProj::Decided { future } => return future.poll(cx),
                    RemoteFutureStateProj::Deciding { awaiting } => {
                        let pending = awaiting
                            .as_mut()
                            .expect("rate limit response future polled after completion");
                        let outcome = ready!(pending.decision.poll(cx));
                        let AwaitingDecision {
                            mut service,
                            parts,
                            body,
                            cost,
                            state,
                            ..
                        } = *awaiting.take().expect("checked above");
                        let decided = match outcome {
                            Ok((decision, status, class)) => Some((decision, Some(status), class)),
                            // The remote could not answer in time: the local share decides.
                            Err(_) => state.decide(&parts, cost),
                        };
                        let answer = respond(&state, &mut service, parts, body, cost, decided);
                        self.set(Self::decided(answer));
                    }
                }
            }
        }
    }

    impl<F, B, S, R> fmt::Debug for RemoteResponseFuture<F, B, S, R> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let mut d = f.debug_struct("RemoteResponseFuture");
            match &self.state {
                RemoteFutureState::Deciding { .. } => d.field("state", &"deciding"),
                RemoteFutureState::Admitted { .. } => d.field("state", &"admitted"),
                RemoteFutureState::Decided { future } => d.field("state", future),
            };
            d.finish()
        }
    }
}

#[cfg(feature = "redis")]
pub(crate) use remote::AwaitingDecision;

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::Ready;

    use http::Response;

    use super::ResponseFuture;

    type Inner = Ready<Result<Response<()>, Infallible>>;

    /// Every layer outside moves this future, so a rejection and the `RateLimit` fields are
    /// boxed: it adds a few words to the inner future. It added 127 bytes with them inline.
    #[test]
    fn the_future_adds_a_few_words_to_the_inner_one() {
        let added = size_of::<ResponseFuture<Inner, ()>>() - size_of::<Inner>();
        assert!(added <= 4 * size_of::<usize>(), "added {added} bytes");
    }
}
