//! The response future of [`RateLimit`](crate::RateLimit): [`ResponseFuture`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::request::Parts;
use http::{HeaderValue, Request, Response};
use overload_signal::protocol::{RATELIMIT, RATELIMIT_POLICY};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::layer::remote::RemoteDecision;
use crate::layer::respond;
use crate::layer::shared::Shared;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): the inner service's future
    /// for an admitted request (adding the `RateLimit` fields if configured), a ready
    /// rejection, or, with a limit kept in Redis, the decision under way before either.
    ///
    /// Its parameters are the inner service's future `F`, the response body `B`, and the
    /// inner service `S` with its request body `R`, which a decision under way holds until
    /// it calls the service.
    pub struct ResponseFuture<F, B, S, R> {
        #[pin]
        kind: Kind<F, B, S, R>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B, S, R> {
        Admitted {
            #[pin]
            future: F,
            fields: Option<(HeaderValue, HeaderValue)>,
        },
        Rejected {
            response: Option<Response<B>>,
        },
        // NOTE: boxed so that a local limit's future stays as small as it was: this state
        // holds the request and a service, and exists only for a limit kept elsewhere.
        Deciding {
            state: Option<Box<Deciding<S, R>>>,
        },
    }
}

/// A request whose limit is being decided elsewhere, with what it needs afterwards.
pub(crate) struct Deciding<S, R> {
    pub(crate) decision: RemoteDecision,
    /// The inner service, made ready by the `poll_ready` that preceded the `call`.
    pub(crate) service: S,
    pub(crate) parts: Parts,
    pub(crate) body: R,
    pub(crate) cost: u32,
    pub(crate) shared: Arc<Shared>,
}

impl<F, B, S, R> ResponseFuture<F, B, S, R> {
    pub(crate) fn admitted(future: F, fields: Option<(HeaderValue, HeaderValue)>) -> Self {
        Self {
            kind: Kind::Admitted { future, fields },
        }
    }

    pub(crate) fn rejected(response: Response<B>) -> Self {
        Self {
            kind: Kind::Rejected {
                response: Some(response),
            },
        }
    }

    pub(crate) fn deciding(state: Deciding<S, R>) -> Self {
        Self {
            kind: Kind::Deciding {
                state: Some(Box::new(state)),
            },
        }
    }
}

impl<B, S, R, E> Future for ResponseFuture<S::Future, B, S, R>
where
    S: Service<Request<R>, Response = Response<B>, Error = E>,
    B: Default,
{
    type Output = Result<Response<B>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project().kind.project() {
                KindProj::Admitted { future, fields } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some((policy, status)) = fields.take() {
                        // NOTE: appended, not inserted: an inner limiter's fields stay, and
                        // the client sees every policy that applies (the draft's list form).
                        let headers = response.headers_mut();
                        headers.append(RATELIMIT_POLICY, policy);
                        headers.append(RATELIMIT, status);
                    }
                    return Poll::Ready(Ok(response));
                }
                KindProj::Rejected { response } => {
                    return Poll::Ready(Ok(response
                        .take()
                        .expect("rate limit response future polled after completion")));
                }
                KindProj::Deciding { state } => {
                    let pending = state
                        .as_mut()
                        .expect("rate limit response future polled after completion");
                    let outcome = ready!(pending.decision.poll(cx));
                    let Deciding {
                        mut service,
                        parts,
                        body,
                        cost,
                        shared,
                        ..
                    } = *state.take().expect("checked above");
                    let decided = match outcome {
                        Ok((decision, status, class)) => Some((decision, Some(status), class)),
                        // The remote could not answer in time: the local share decides.
                        Err(_) => shared.decide(&parts, cost),
                    };
                    let next = respond(&shared, &mut service, parts, body, decided);
                    self.set(next);
                }
            }
        }
    }
}

impl<F, B, S, R> fmt::Debug for ResponseFuture<F, B, S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Admitted { .. } => "admitted",
            Kind::Rejected { .. } => "rejected",
            Kind::Deciding { .. } => "deciding",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
