//! The response future of [`Retry`](crate::Retry).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

use http::request::Parts;
use http::{Request, Response};
use overload_signal::protocol::{self, Attempt, GrpcPushback};
use overload_signal::{Overloaded, propagation};
use pin_project_lite::pin_project;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::time::{Instant, Sleep, sleep_until};
use tower_service::Service;

use super::Config;
use crate::BoxError;
use crate::body::{BodySource, ReplayBody};
use crate::classify::Classification;
use crate::outcome::{AttemptTimedOut, GaveUp, GiveUpReason, RetryInfo};

pin_project! {
    /// The response future of [`Retry`](crate::Retry): one request, all its attempts and the
    /// waits between them.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<ReplayBody<B>>>,
    {
        #[pin]
        state: State<S::Future>,
        // Armed during an attempt when a per-attempt timeout or a deadline is set, and during
        // every backoff wait.
        #[pin]
        timer: Option<Sleep>,
        timer_is_deadline: bool,
        // A clone of the inner service for the retries; `None` when the request may not be
        // retried.
        service: Option<S>,
        retry: RetryState<B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // An attempt is in flight.
        Called { #[pin] future: F, span: tracing::Span },
        // Waiting out the backoff before the next attempt.
        Waiting,
        // Waiting for the inner service to be ready for the next attempt.
        Polling,
        // The output was returned.
        Done,
    }
}

/// Per-request bookkeeping, apart from the pinned parts.
struct RetryState<B> {
    config: Arc<Config>,
    /// The request's parts, to rebuild each retry; `None` when the request may not be
    /// retried.
    template: Option<Parts>,
    body: BodySource<B>,
    /// The next attempt's body, from the decision to retry until the attempt is sent.
    // NOTE: the next request is built only when it is sent, so that the future does not
    // carry a whole request (over 250 bytes) through every move.
    next_body: Option<ReplayBody<B>>,
    /// Attempts sent so far.
    attempts: u32,
    deadline: Option<Instant>,
    /// The previous delay the backoff strategy returned.
    previous_delay: Option<Duration>,
    /// The request's own generator, made at its first retry.
    rng: Option<SmallRng>,
}

/// What to do with an attempt's outcome.
enum Next<R> {
    Return(Result<R, BoxError>),
    /// Send the next attempt at this instant.
    Retry(Instant),
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>>,
{
    /// The future of a request whose first attempt is `future`. `retry` holds the request's
    /// parts and a clone of the inner service when the request may be retried.
    #[inline]
    pub(crate) fn new(
        future: S::Future,
        span: tracing::Span,
        config: Arc<Config>,
        retry: Option<(Parts, S)>,
        body: BodySource<B>,
    ) -> Self {
        let (template, service) = retry.unzip();
        let needs_now = config.deadline.is_some() || config.attempt_timeout.is_some();
        let now = needs_now.then(Instant::now);
        let deadline = config.deadline.zip(now).map(|(d, now)| now + d);
        // NOTE: `attempts` starts at 1: the first attempt was sent by `Retry::call`.
        let retry = RetryState {
            config,
            template,
            body,
            next_body: None,
            attempts: 1,
            deadline,
            previous_delay: None,
            rng: None,
        };
        let (timer, timer_is_deadline) = match now {
            Some(now) => {
                let (at, is_deadline) = retry.attempt_timer(now);
                (Some(sleep_until(at)), is_deadline)
            }
            None => (None, false),
        };
        Self {
            state: State::Called { future, span },
            timer,
            timer_is_deadline,
            service,
            retry,
        }
    }
}

impl<B> RetryState<B> {
    /// When the attempt starting `now` must end, and whether that is the deadline.
    fn attempt_timer(&self, now: Instant) -> (Instant, bool) {
        let timeout = self.config.attempt_timeout.map(|t| now + t);
        match (timeout, self.deadline) {
            (Some(t), Some(d)) if d <= t => (d, true),
            (Some(t), _) => (t, false),
            (None, Some(d)) => (d, true),
            (None, None) => unreachable!("a timer is armed only with a timeout or a deadline"),
        }
    }

    fn needs_attempt_timer(&self) -> bool {
        self.deadline.is_some() || self.config.attempt_timeout.is_some()
    }

    /// Decides what an attempt's outcome calls for.
    fn next<ResBody>(
        &mut self,
        outcome: Result<Response<ResBody>, BoxError>,
    ) -> Next<Response<ResBody>> {
        let classifier = &*self.config.classifier;
        let (classification, hint) = match &outcome {
            Ok(response) => {
                if protocol::is_stop_signal(response.headers()) {
                    // Never retried, whatever the classifier says; and tell a server layer
                    // above us, so it can answer its own caller with the signal too.
                    self.config.metrics().stop_signals.increment(1);
                    propagation::mark_stop_received();
                    tracing::debug!(attempts = self.attempts, "stop signal received");
                    return Next::Return(Err(Box::new(Overloaded::new())));
                }
                let c = classifier.classify_response(response.status(), response.headers());
                let hint = if c == Classification::Retryable {
                    server_hint(response.headers())
                } else {
                    None
                };
                (c, hint)
            }
            Err(e) => (classifier.classify_error(&**e), None),
        };
        if classification == Classification::Final {
            return Next::Return(self.finish(outcome, None));
        }
        // NOTE: cloned only on the retry path; the happy path touches the shared count once
        // per request (in `Retry::call`).
        let config = Arc::clone(&self.config);

        let give_up = |this: &mut Self, reason| Next::Return(this.finish(outcome, Some(reason)));
        if self.template.is_none() {
            return give_up(self, GiveUpReason::NotRetryable);
        }
        if self.attempts >= config.max_attempts {
            return give_up(self, GiveUpReason::MaxAttempts);
        }
        let Some(body) = self.body.replay() else {
            return give_up(self, GiveUpReason::BodyNotReplayable);
        };

        let retry = self.attempts - 1;
        let rng = self
            .rng
            .get_or_insert_with(|| SmallRng::seed_from_u64(config.seeds.next_seed()));
        let backoff = config.backoff.next_delay(retry, self.previous_delay, rng);
        self.previous_delay = Some(backoff);
        // A server's hint is a lower bound, capped by the strategy's maximum.
        let delay = hint.map_or(backoff, |h| backoff.max(h.min(config.backoff.max_delay())));
        let now = Instant::now();
        let at = now.checked_add(delay);
        if let Some(deadline) = self.deadline {
            if at.is_none_or(|at| at >= deadline) {
                return give_up(self, GiveUpReason::Deadline);
            }
        }
        let Some(at) = at else {
            return give_up(self, GiveUpReason::Deadline);
        };
        if !config.budget.withdraw() {
            return give_up(self, GiveUpReason::BudgetExhausted);
        }

        self.next_body = Some(body);
        config.metrics().retry_delay.record(delay.as_secs_f64());
        tracing::debug!(
            attempt = self.attempts,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "retrying after a retryable failure"
        );
        drop(give_up); // the outcome it holds is not returned: the retry replaces it
        Next::Retry(at)
    }

    /// The request of the next attempt (number `self.attempts`, counting from 0).
    fn next_request(&mut self) -> Request<ReplayBody<B>> {
        let (Some(template), Some(body)) = (self.template.as_ref(), self.next_body.take()) else {
            unreachable!("a retry is decided only with a template and a body");
        };
        let mut parts = template.clone();
        Attempt::set(&mut parts.headers, self.attempts);
        Request::from_parts(parts, body)
    }

    /// The final output: responses carry a [`RetryInfo`]; a retryable error given up on is
    /// wrapped in [`GaveUp`].
    fn finish<ResBody>(
        &self,
        outcome: Result<Response<ResBody>, BoxError>,
        gave_up: Option<GiveUpReason>,
    ) -> Result<Response<ResBody>, BoxError> {
        if let Some(reason) = gave_up {
            self.config.metrics().gave_up(reason).increment(1);
            tracing::debug!(attempts = self.attempts, %reason, "giving up");
        }
        match outcome {
            Ok(mut response) => {
                response.extensions_mut().insert(RetryInfo {
                    attempts: self.attempts,
                    gave_up,
                });
                Ok(response)
            }
            Err(e) => match gave_up {
                Some(reason) => Err(Box::new(GaveUp::new(reason, self.attempts, e))),
                None => Err(e),
            },
        }
    }
}

/// A server's `Retry-After` or (non-negative) `grpc-retry-pushback-ms`, whichever is longer.
fn server_hint(headers: &http::HeaderMap) -> Option<Duration> {
    let retry_after = protocol::retry_after(headers, SystemTime::now());
    let pushback = match protocol::grpc_pushback(headers) {
        Some(GrpcPushback::Delay(d)) => Some(d),
        _ => None,
    };
    retry_after.max(pushback)
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<ResBody>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future, span } => {
                    let polled = {
                        let _entered = span.enter();
                        future.poll(cx)
                    };
                    let outcome = match polled {
                        Poll::Ready(outcome) => outcome.map_err(Into::into),
                        Poll::Pending => {
                            let Some(timer) = this.timer.as_mut().as_pin_mut() else {
                                return Poll::Pending;
                            };
                            ready!(timer.poll(cx));
                            this.timer.set(None);
                            let timed_out: BoxError = Box::new(AttemptTimedOut::new());
                            if *this.timer_is_deadline {
                                this.state.set(State::Done);
                                return Poll::Ready(
                                    this.retry
                                        .finish(Err(timed_out), Some(GiveUpReason::Deadline)),
                                );
                            }
                            tracing::debug!(attempt = this.retry.attempts - 1, "attempt timed out");
                            Err(timed_out)
                        }
                    };
                    match this.retry.next(outcome) {
                        Next::Return(output) => {
                            this.state.set(State::Done);
                            this.timer.set(None);
                            return Poll::Ready(output);
                        }
                        Next::Retry(at) => {
                            match this.timer.as_mut().as_pin_mut() {
                                Some(timer) => timer.reset(at),
                                None => this.timer.set(Some(sleep_until(at))),
                            }
                            this.state.set(State::Waiting);
                        }
                    }
                }
                StateProj::Waiting => {
                    if let Some(timer) = this.timer.as_mut().as_pin_mut() {
                        ready!(timer.poll(cx));
                    }
                    this.state.set(State::Polling);
                }
                StateProj::Polling => {
                    let Some(service) = this.service.as_mut() else {
                        unreachable!("a retry is decided only with a service to send it");
                    };
                    if let Err(e) = ready!(service.poll_ready(cx)) {
                        this.state.set(State::Done);
                        this.timer.set(None);
                        return Poll::Ready(Err(e.into()));
                    }
                    let request = this.retry.next_request();
                    let attempt = this.retry.attempts;
                    this.retry.attempts += 1;
                    let metrics = this.retry.config.metrics();
                    metrics.attempts.increment(1);
                    metrics.retries.increment(1);
                    let span = tracing::debug_span!("attempt", attempt);
                    let future = {
                        let _entered = span.enter();
                        service.call(request)
                    };
                    if this.retry.needs_attempt_timer() {
                        let (at, is_deadline) = this.retry.attempt_timer(Instant::now());
                        *this.timer_is_deadline = is_deadline;
                        match this.timer.as_mut().as_pin_mut() {
                            Some(timer) => timer.reset(at),
                            None => this.timer.set(Some(sleep_until(at))),
                        }
                    } else {
                        this.timer.set(None);
                    }
                    this.state.set(State::Called { future, span });
                }
                StateProj::Done => panic!("retry response future polled after completion"),
            }
        }
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempts", &self.retry.attempts)
            .field("may_retry", &self.retry.template.is_some())
            .finish_non_exhaustive()
    }
}
