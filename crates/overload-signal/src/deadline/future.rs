//! The response future of [`Deadline`](super::Deadline).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep_until};

use super::current::DeadlineScope;
use super::state::{DeadlineCaller, DeadlineState};
use crate::protocol::{Protocol, deadline_exceeded_response};

pin_project! {
    /// The response future of [`Deadline`](super::Deadline): the answer to an expired
    /// request, or the inner service's future, run with the request's deadline as the
    /// current one and cancelled when it passes.
    ///
    /// # Panics
    ///
    /// When polled again after it has returned its output, as tower's futures do (a request
    /// without any deadline: whatever the inner future does then).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The deadline had passed on arrival: the answer, at once.
        Expired { protocol: Protocol },
        // No deadline anywhere (none on the request, none in the current scope): the inner
        // future as it is, with no scope to enter on each poll and no timer. A scope of
        // `None` would hide nothing, since there is no outer deadline.
        Open {
            #[pin]
            inner: F,
        },
        Running {
            #[pin]
            inner: DeadlineScope<F>,
            // Armed at the inner future's first `Pending`, so that work that completes at
            // once costs no timer; boxed, so that the future every layer outside moves
            // stays small.
            timer: Option<Pin<Box<Sleep>>>,
            // When to cancel the work, until the timer is armed; `None` when the layer
            // lets work run to its end.
            cancel_at: Option<Instant>,
            caller: DeadlineCaller,
            protocol: Protocol,
            layer: Arc<DeadlineState>,
        },
        // Answered: expired on arrival, cancelled (the inner future dropped), or the inner
        // future's output returned. Polling again panics.
        Done,
    }
}

impl<F> ResponseFuture<F> {
    pub(super) const fn expired(protocol: Protocol) -> Self {
        Self {
            state: State::Expired { protocol },
        }
    }

    pub(crate) const fn open(inner: F) -> Self {
        Self {
            state: State::Open { inner },
        }
    }

    pub(super) fn running(
        inner: DeadlineScope<F>,
        cancel_at: Option<Instant>,
        caller: DeadlineCaller,
        protocol: Protocol,
        layer: &Arc<DeadlineState>,
    ) -> Self {
        Self {
            state: State::Running {
                inner,
                timer: None,
                cancel_at,
                caller,
                protocol,
                layer: Arc::clone(layer),
            },
        }
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
        let (protocol, caller, layer) = match this.state.as_mut().project() {
            StateProj::Expired { protocol } => {
                let protocol = *protocol;
                // NOTE: `Done` before answering: a poll after this one panics, as tower's
                // futures (and the retry layer's) do, rather than answer a second `504`.
                this.state.set(State::Done);
                return Poll::Ready(Ok(deadline_exceeded_response(protocol)));
            }
            StateProj::Open { inner } => return inner.poll(cx),
            StateProj::Running {
                inner,
                timer,
                cancel_at,
                caller,
                protocol,
                layer,
            } => {
                if let Poll::Ready(output) = inner.poll(cx) {
                    // NOTE: the finished work and its timer go now, and a further poll
                    // panics here, by our name.
                    this.state.set(State::Done);
                    return Poll::Ready(output);
                }
                if let Some(at) = cancel_at.take() {
                    *timer = Some(Box::pin(sleep_until(at)));
                }
                let Some(timer) = timer.as_mut() else {
                    return Poll::Pending;
                };
                ready!(timer.as_mut().poll(cx));
                (*protocol, *caller, Arc::clone(layer))
            }
            StateProj::Done => panic!("deadline response future polled after completion"),
        };
        // The deadline passed while the work ran: drop it now, not when our caller drops
        // this future.
        this.state.set(State::Done);
        layer.expired_running(caller);
        tracing::debug!(
            name = layer.name().as_str(),
            decision = "deadline_cancelled",
            "request cancelled at its deadline"
        );
        Poll::Ready(Ok(deadline_exceeded_response(protocol)))
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Expired { .. } => "expired",
            State::Open { .. } => "open",
            State::Running { .. } => "running",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::Ready;

    use http::Response;

    use super::ResponseFuture;

    type Inner = Ready<Result<Response<()>, Infallible>>;

    /// Every layer outside moves this future (each wrapper, tower's `Oneshot`, axum's boxed
    /// route), so it adds a few words to the inner future, not a timer: the timer is boxed
    /// when armed. It added 175 bytes with the timer inline.
    #[test]
    fn the_future_adds_a_few_words_to_the_inner_one() {
        let added = size_of::<ResponseFuture<Inner>>() - size_of::<Inner>();
        assert!(added <= 12 * size_of::<usize>(), "added {added} bytes");
    }
}
