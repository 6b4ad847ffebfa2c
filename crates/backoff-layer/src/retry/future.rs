//! The response future of [`Retry`](crate::Retry).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::request::Parts;
use http::{HeaderMap, Request, Response};
use overload_signal::propagation::{self, Downstream};
use overload_signal::protocol::{Attempt, Criticality, Outcome, Protocol};
use pin_project_lite::pin_project;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::time::{Instant, Sleep, sleep_until};
use tower_service::Service;

use super::config::RetryConfig;
use super::deadline::{OnWire, Timing, attempt_window};
use super::destinations::SeriesIndex;
use super::hint::{ServerHint, server_hint};
use super::level::set_level;
use super::stop::{StopSignals, remove_stop_signal};
use super::trace::{self, WaitCause};
use crate::BoxError;
use crate::adapter::Adapter;
use crate::body::{BodySource, ReplayBody};
use crate::classify::{Classification, is_final};
use crate::outcome::{AttemptTimedOut, GaveUp, GiveUpReason, RetryInfo};
use crate::throttle::{self, ThrottleTicket};

pin_project! {
    /// The response future of [`Retry`](crate::Retry): one request, all its attempts and the
    /// waits between them.
    pub struct ResponseFuture<S, B, A>
    where
        A: Adapter<B>,
        S: Service<Request<<A as Adapter<B>>::Body>>,
    {
        #[pin]
        state: State<S::Future>,
        // Armed during an attempt when a per-attempt timeout or a deadline is set, during
        // every backoff wait, and, with a deadline, while waiting for the inner service to be
        // ready for the next attempt.
        #[pin]
        timer: Option<Sleep>,
        timer_is_deadline: bool,
        // When the first attempt must end, until its timer is armed: at the attempt's first
        // `Pending`, so that an attempt that completes at once (an in-process service, a
        // cache) costs no timer. The instant itself was fixed when the request was called.
        first_end: Option<Instant>,
        // A clone of the inner service for the retries; `None` when the request may not be
        // retried.
        service: Option<S>,
        retry: RetryState<B>,
        adapter: PhantomData<fn() -> A>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The caller's deadline had passed before the first attempt: nothing was sent.
        NotSent,
        // An attempt is in flight.
        Called { #[pin] future: F, span: tracing::Span },
        // Waiting out the backoff before the next attempt.
        Waiting,
        // Waiting for the inner service to be ready for the next attempt.
        Polling,
        // The throttle refused the request: nothing was sent, this is the output.
        Refused { error: Option<BoxError> },
        // The output was returned.
        Done,
    }
}

/// What `Retry::call` decided for a request it sent, kept by its future for the retries.
#[derive(Clone, Debug)]
pub(crate) struct Sent {
    /// The deadline and how each attempt carries it.
    pub(crate) timing: Timing,
    /// Where the throttle counts the attempts' outcomes.
    pub(crate) ticket: Option<ThrottleTicket>,
    /// The level every attempt carries in `X-Request-Criticality` (`None`: no header).
    pub(crate) level: Option<Criticality>,
    /// Where the request's and its attempts' outcomes are counted.
    pub(crate) series: SeriesIndex,
    /// The request's span (see `trace`).
    pub(crate) span: tracing::Span,
}

/// Per-request bookkeeping, apart from the pinned parts.
struct RetryState<B> {
    config: Arc<RetryConfig>,
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
    /// The earliest of the layer's deadline and the caller's.
    deadline: Option<Instant>,
    /// How each attempt carries its time left on the wire.
    wire: OnWire,
    /// The previous delay the backoff strategy returned.
    previous_delay: Option<Duration>,
    /// Attempts sent when the backoff last started over (a server's pushback starts it over,
    /// as gRPC's retry design, A6, says): the backoff counts retries from there.
    backoff_origin: u32,
    /// The request's own generator, made at its first retry.
    rng: Option<SmallRng>,
    /// Where the throttle counts this request's outcomes; `None` without a throttle (or for
    /// a destination it has no room for).
    ticket: Option<ThrottleTicket>,
    /// The level every attempt carries in `X-Request-Criticality` (`None`: no header); the
    /// budget sheds retries by it (absent: `critical`).
    level: Option<Criticality>,
    /// Where the outcomes are counted, and whether the last attempt's was a success.
    series: SeriesIndex,
    success: bool,
    /// The request's span, parent of the attempts' (see `trace`).
    span: tracing::Span,
}

/// What to do with an attempt's outcome.
enum Next<R> {
    Return(Result<R, BoxError>),
    /// Send the next attempt at this instant.
    Retry(Instant),
}

/// What the layer makes of an attempt's outcome, before it decides whether a retry is
/// possible.
enum AttemptVerdict {
    /// A failure carrying the stop signal.
    Stop,
    /// Final by the classifier: returned as it is (with its `RetryInfo`); a success when
    /// it is an answer that is not a failure.
    Final(bool),
    /// Final because a retry layer below already gave up on it: returned untouched.
    GivenUpBelow,
    /// Given up on now, for this reason.
    GiveUp(GiveUpReason),
    /// Retryable, with the server's hint for the wait, if any.
    Retryable(Option<ServerHint>),
}

impl<S, B, A> ResponseFuture<S, B, A>
where
    A: Adapter<B>,
    S: Service<Request<A::Body>>,
{
    /// The future of a request whose first attempt is `future`. `retry` holds the request's
    /// parts and a clone of the inner service when the request may be retried.
    #[inline]
    pub(crate) fn new(
        future: S::Future,
        span: tracing::Span,
        config: Arc<RetryConfig>,
        retry: Option<(Parts, S)>,
        body: BodySource<B>,
        sent: Sent,
    ) -> Self {
        let Sent {
            timing,
            ticket,
            level,
            series,
            span: request_span,
        } = sent;
        let (template, service) = retry.unzip();
        let (first_end, timer_is_deadline) = match timing.window {
            Some((at, is_deadline)) => (Some(at), is_deadline),
            None => (None, false),
        };
        // NOTE: `attempts` starts at 1: the first attempt was sent by `Retry::call`.
        let retry = RetryState {
            config,
            template,
            body,
            next_body: None,
            attempts: 1,
            deadline: timing.deadline,
            wire: timing.wire,
            previous_delay: None,
            backoff_origin: 0,
            rng: None,
            ticket,
            level,
            series,
            success: false,
            span: request_span,
        };
        Self {
            state: State::Called { future, span },
            timer: None,
            timer_is_deadline,
            first_end,
            service,
            retry,
            adapter: PhantomData,
        }
    }

    /// The future of a request whose caller's deadline had passed before it reached the
    /// layer: it ends with [`GiveUpReason::Deadline`] and nothing is sent.
    pub(crate) fn not_sent(
        config: Arc<RetryConfig>,
        span: tracing::Span,
        series: SeriesIndex,
    ) -> Self {
        Self::unsent(State::NotSent, config, span, series)
    }

    /// The future of a request the throttle refused: it resolves at once to `error`.
    #[cold]
    pub(crate) fn refused(config: Arc<RetryConfig>, error: BoxError, series: SeriesIndex) -> Self {
        let state = State::Refused { error: Some(error) };
        Self::unsent(state, config, tracing::Span::none(), series)
    }

    /// A future that sends nothing and ends in `state`.
    fn unsent(
        state: State<S::Future>,
        config: Arc<RetryConfig>,
        span: tracing::Span,
        series: SeriesIndex,
    ) -> Self {
        let retry = RetryState {
            config,
            template: None,
            body: BodySource::Streamed,
            next_body: None,
            attempts: 0,
            deadline: None,
            wire: OnWire::Nothing,
            previous_delay: None,
            backoff_origin: 0,
            rng: None,
            ticket: None,
            level: None,
            series,
            success: false,
            span,
        };
        Self {
            state,
            timer: None,
            timer_is_deadline: false,
            first_end: None,
            service: None,
            retry,
            adapter: PhantomData,
        }
    }
}

impl<B> RetryState<B> {
    fn needs_attempt_timer(&self) -> bool {
        self.deadline.is_some() || self.config.attempt_timeout.is_some()
    }

    fn deadline_passed(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Tells the throttle how an attempt ended: `outcome` for an answer (`None` for an
    /// error, read from `error`).
    #[inline]
    fn observe(&self, outcome: Option<Outcome>, error: Option<&BoxError>) {
        if let (Some(ticket), Some(throttle)) = (self.ticket, &self.config.throttle) {
            let counted = match (outcome, error) {
                (Some(outcome), _) => Some(throttle::of_outcome(outcome)),
                (None, Some(e)) => throttle::of_error(&**e),
                (None, None) => None,
            };
            throttle.record(ticket, counted);
        }
    }

    /// Decides what an attempt's outcome calls for.
    fn next<A: Adapter<B>, ResBody>(
        &mut self,
        outcome: Result<Response<ResBody>, BoxError>,
    ) -> Next<Response<ResBody>> {
        let classifier = &*self.config.classifier;
        let verdict = match &outcome {
            Ok(response) => {
                let (status, headers) = (response.status(), response.headers());
                // NOTE: the stop signal counts on failures only (the protocol's `Outcome`):
                // a success is a success whatever its headers (any proxy may add
                // `X-Overloaded`).
                let answer = Outcome::of_response(Protocol::of_headers(headers), status, headers);
                self.observe(Some(answer), None);
                if answer.is_stop_signal() {
                    AttemptVerdict::Stop
                } else if answer.is_failure() && self.deadline_passed() {
                    AttemptVerdict::GiveUp(GiveUpReason::Deadline)
                } else if classifier.classify_response(status, headers) == Classification::Final {
                    AttemptVerdict::Final(!answer.is_failure())
                } else if gave_up_below(response) {
                    AttemptVerdict::GivenUpBelow
                } else {
                    AttemptVerdict::Retryable(server_hint(headers))
                }
            }
            Err(e) => {
                self.observe(None, Some(e));
                if is_final(&**e) {
                    AttemptVerdict::GivenUpBelow
                } else if self.deadline_passed() {
                    AttemptVerdict::GiveUp(GiveUpReason::Deadline)
                } else if classifier.classify_error(&**e) == Classification::Final {
                    AttemptVerdict::Final(false)
                } else {
                    AttemptVerdict::Retryable(None)
                }
            }
        };
        self.success = matches!(verdict, AttemptVerdict::Final(true));
        self.config.destinations.attempt(self.series, self.success);
        let hint = match verdict {
            AttemptVerdict::Stop => return Next::Return(self.stop_signal::<A, _>(outcome)),
            AttemptVerdict::Final(_) => return Next::Return(self.finish::<A, _>(outcome, None)),
            AttemptVerdict::GivenUpBelow => {
                trace::record_request(&self.span, &outcome, self.attempts, None);
                self.config.destinations.request(self.series, false);
                return Next::Return(outcome);
            }
            AttemptVerdict::GiveUp(reason) => {
                return Next::Return(self.finish::<A, _>(outcome, Some(reason)));
            }
            AttemptVerdict::Retryable(hint) => hint,
        };
        // NOTE: cloned only on the retry path; the happy path touches the shared count once
        // per request (in `Retry::call`).
        let config = Arc::clone(&self.config);

        let give_up =
            |this: &mut Self, reason| Next::Return(this.finish::<A, _>(outcome, Some(reason)));
        if self.template.is_none() {
            return give_up(self, GiveUpReason::NotRetryable);
        }
        if self.attempts >= config.max_attempts {
            return give_up(self, GiveUpReason::MaxAttempts);
        }
        if hint.is_some_and(|h| h.wait > config.max_retry_after) {
            return give_up(self, GiveUpReason::RetryAfterTooLong);
        }
        let Some(body) = self.body.replay() else {
            return give_up(self, GiveUpReason::BodyNotReplayable);
        };

        let retry = self.attempts - 1 - self.backoff_origin;
        let rng = self
            .rng
            .get_or_insert_with(|| SmallRng::seed_from_u64(config.seeds.next_seed()));
        let backoff = config.backoff.next_delay(retry, self.previous_delay, rng);
        self.previous_delay = Some(backoff);
        // A server's hint is a lower bound on the wait, whatever the strategy's own maximum:
        // the server knows when it can take the request again. `max_retry_after` (checked
        // above) is what bounds it.
        let delay = match hint {
            None => backoff,
            Some(ServerHint { wait, pushback }) => {
                if pushback {
                    // NOTE: gRPC's retry design (A6): after a pushback the backoff starts
                    // over, from its first delay.
                    self.backoff_origin = self.attempts;
                    self.previous_delay = None;
                }
                backoff.max(wait)
            }
        };
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
        if !config.budget.withdraw_at(self.level.unwrap_or_default()) {
            trace::budget_refused(&self.span, self.attempts);
            return give_up(self, GiveUpReason::BudgetExhausted);
        }

        self.next_body = Some(body);
        config.metrics().retry_delay.record(delay.as_secs_f64());
        let cause = WaitCause::of(backoff, hint.map(|h| (h.wait, h.pushback)));
        trace::wait(&self.span, delay, cause, self.attempts);
        drop(give_up); // the outcome it holds is not returned: the retry replaces it
        Next::Retry(at)
    }

    /// The request of the next attempt (number `self.attempts`, counting from 0), starting
    /// `now` if a timer is needed, and when it must end.
    fn next_request(
        &mut self,
        now: Option<Instant>,
    ) -> (Request<ReplayBody<B>>, Option<(Instant, bool)>) {
        let (Some(template), Some(body)) = (self.template.as_ref(), self.next_body.take()) else {
            unreachable!("a retry is decided only with a template and a body");
        };
        let mut parts = template.clone();
        Attempt::set(&mut parts.headers, self.attempts);
        set_level(&mut parts.headers, self.level);
        let window = now.and_then(|now| {
            attempt_window(
                &self.config,
                self.deadline,
                self.wire,
                now,
                &mut parts.headers,
            )
        });
        (Request::from_parts(parts, body), window)
    }

    /// The output for a failure carrying the stop signal: never retried, whatever the
    /// classifier says. Passed up (the default), a server layer above us is told, so it can
    /// answer its own caller with the signal too; honoured only, the failure is returned
    /// without the signal, and the scope is marked as a call given up on.
    fn stop_signal<A: Adapter<B>, ResBody>(
        &self,
        outcome: Result<Response<ResBody>, BoxError>,
    ) -> Result<Response<ResBody>, BoxError> {
        self.config.stop_signal_seen();
        self.config.destinations.request(self.series, false);
        let policy = self.config.stop_signal_policy;
        trace::stop_signal(&self.span, &outcome, self.attempts, policy);
        match policy {
            StopSignals::PassUp => {
                propagation::mark_downstream(Downstream::StopSignal);
                let headers = match outcome {
                    Ok(response) => response.into_parts().0.headers,
                    Err(_) => HeaderMap::new(),
                };
                Err(A::stop_signal(headers, self.attempts))
            }
            StopSignals::HonourOnly => {
                // NOTE: never the stop-signal mark: the overload layer above would answer
                // our caller with the signal whatever the handler returns.
                propagation::mark_downstream(Downstream::GaveUp);
                let info = RetryInfo {
                    attempts: self.attempts,
                    gave_up: Some(GiveUpReason::StopSignal),
                };
                match outcome {
                    Ok(mut response) => {
                        remove_stop_signal(response.headers_mut());
                        response.extensions_mut().insert(info);
                        A::response(response, info)
                    }
                    Err(e) => Err(A::error(e, info)),
                }
            }
        }
    }

    /// The final output: responses carry a [`RetryInfo`]; a retryable error given up on is
    /// wrapped in [`GaveUp`]; then the adapter shapes it.
    fn finish<A: Adapter<B>, ResBody>(
        &self,
        outcome: Result<Response<ResBody>, BoxError>,
        gave_up: Option<GiveUpReason>,
    ) -> Result<Response<ResBody>, BoxError> {
        // NOTE: an answer reaches here without a reason only as a final verdict, whose
        // success `next` has just noted.
        let success = gave_up.is_none() && outcome.is_ok() && self.success;
        self.config.destinations.request(self.series, success);
        if let Some(reason) = gave_up {
            if let Some(counter) = self.config.metrics().gave_up(reason) {
                counter.increment(1);
            }
            trace::gave_up(&self.span, self.attempts, reason);
            // NOTE: a server layer above (the overload layer) answers the caller from these
            // marks when this error reaches it, instead of letting it reset the connection.
            propagation::mark_downstream(match reason {
                GiveUpReason::Deadline => Downstream::DeadlineExceeded,
                // NOTE: a spent retry budget is the paper's retry storm: the tier above is
                // told to stop, so that retries do not multiply from tier to tier.
                GiveUpReason::BudgetExhausted => Downstream::StopSignal,
                _ => Downstream::GaveUp,
            });
        }
        trace::record_request(&self.span, &outcome, self.attempts, gave_up);
        let info = RetryInfo {
            attempts: self.attempts,
            gave_up,
        };
        match outcome {
            Ok(mut response) => {
                response.extensions_mut().insert(info);
                A::response(response, info)
            }
            Err(e) => {
                let e = match gave_up {
                    Some(reason) => Box::new(GaveUp::new(reason, self.attempts, e)),
                    None => e,
                };
                Err(A::error(e, info))
            }
        }
    }
}

/// Whether a retry layer below this one gave up on this response.
fn gave_up_below<ResBody>(response: &Response<ResBody>) -> bool {
    response
        .extensions()
        .get::<RetryInfo>()
        .is_some_and(|info| info.gave_up.is_some())
}

impl<S, B, A, ResBody> Future for ResponseFuture<S, B, A>
where
    A: Adapter<B>,
    S: Service<Request<A::Body>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<ResBody>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::NotSent => {
                    this.state.set(State::Done);
                    let not_sent: BoxError = Box::new(AttemptTimedOut::already_passed());
                    return Poll::Ready(
                        this.retry
                            .finish::<A, _>(Err(not_sent), Some(GiveUpReason::Deadline)),
                    );
                }
                StateProj::Called { future, span } => {
                    let polled = {
                        let _entered = span.enter();
                        future.poll(cx)
                    };
                    let outcome = match polled {
                        Poll::Ready(outcome) => outcome.map_err(Into::into),
                        Poll::Pending => {
                            if let Some(at) = this.first_end.take() {
                                this.timer.set(Some(sleep_until(at)));
                            }
                            let Some(timer) = this.timer.as_mut().as_pin_mut() else {
                                return Poll::Pending;
                            };
                            ready!(timer.poll(cx));
                            this.timer.set(None);
                            let timed_out: Result<Response<ResBody>, BoxError> =
                                Err(Box::new(AttemptTimedOut::new()));
                            if *this.timer_is_deadline {
                                trace::record_outcome(span, &timed_out);
                                this.retry.observe(None, timed_out.as_ref().err());
                                let retry = &this.retry;
                                retry.config.destinations.attempt(retry.series, false);
                                this.state.set(State::Done);
                                return Poll::Ready(
                                    this.retry
                                        .finish::<A, _>(timed_out, Some(GiveUpReason::Deadline)),
                                );
                            }
                            tracing::debug!(attempt = this.retry.attempts - 1, "attempt timed out");
                            timed_out
                        }
                    };
                    trace::record_outcome(span, &outcome);
                    match this.retry.next::<A, _>(outcome) {
                        Next::Return(output) => {
                            this.state.set(State::Done);
                            this.timer.set(None);
                            return Poll::Ready(output);
                        }
                        Next::Retry(at) => {
                            *this.first_end = None;
                            match this.timer.as_mut().as_pin_mut() {
                                Some(timer) => timer.reset(at),
                                None => this.timer.set(Some(sleep_until(at))),
                            }
                            *this.timer_is_deadline = false;
                            this.state.set(State::Waiting);
                        }
                    }
                }
                StateProj::Waiting => {
                    if let Some(timer) = this.timer.as_mut().as_pin_mut() {
                        ready!(timer.poll(cx));
                    }
                    // The deadline guards the wait for readiness: an inner service that stays
                    // not ready (a concurrency limit, a full buffer, a pool) must not let it
                    // pass unseen.
                    match (this.retry.deadline, this.timer.as_mut().as_pin_mut()) {
                        (Some(deadline), Some(timer)) => timer.reset(deadline),
                        (Some(deadline), None) => this.timer.set(Some(sleep_until(deadline))),
                        (None, _) => this.timer.set(None),
                    }
                    *this.timer_is_deadline = true;
                    this.state.set(State::Polling);
                }
                StateProj::Polling => {
                    // NOTE: in this state the timer, if armed, is the deadline.
                    if let Some(timer) = this.timer.as_mut().as_pin_mut() {
                        if timer.poll(cx).is_ready() {
                            this.state.set(State::Done);
                            this.timer.set(None);
                            let not_sent: BoxError = Box::new(AttemptTimedOut::not_sent());
                            return Poll::Ready(
                                this.retry
                                    .finish::<A, _>(Err(not_sent), Some(GiveUpReason::Deadline)),
                            );
                        }
                    }
                    let Some(service) = this.service.as_mut() else {
                        unreachable!("a retry is decided only with a service to send it");
                    };
                    if let Err(e) = ready!(service.poll_ready(cx)) {
                        this.state.set(State::Done);
                        this.timer.set(None);
                        return Poll::Ready(this.retry.finish::<A, _>(Err(e.into()), None));
                    }
                    let now = this.retry.needs_attempt_timer().then(Instant::now);
                    let (request, window) = this.retry.next_request(now);
                    let attempt = this.retry.attempts;
                    this.retry.attempts += 1;
                    let metrics = this.retry.config.metrics();
                    metrics.attempts.increment(1);
                    metrics.retries.increment(1);
                    let span = trace::retry_span(&this.retry.span, &this.retry.template, attempt);
                    let future = {
                        let _entered = span.enter();
                        service.call(request.map(A::attempt_body))
                    };
                    match (window, this.timer.as_mut().as_pin_mut()) {
                        (Some((at, _)), Some(timer)) => timer.reset(at),
                        (Some((at, _)), None) => this.timer.set(Some(sleep_until(at))),
                        (None, _) => this.timer.set(None),
                    }
                    *this.timer_is_deadline = window.is_some_and(|(_, is_deadline)| is_deadline);
                    this.state.set(State::Called { future, span });
                }
                StateProj::Refused { error } => {
                    let Some(error) = error.take() else {
                        unreachable!("the refused state holds its error until it is returned");
                    };
                    // NOTE: marked here, not in `call`: the future is polled inside the
                    // server's scope, the call is made before it.
                    propagation::mark_downstream(Downstream::Throttled);
                    this.state.set(State::Done);
                    return Poll::Ready(Err(error));
                }
                StateProj::Done => panic!("retry response future polled after completion"),
            }
        }
    }
}

impl<S, B, A> fmt::Debug for ResponseFuture<S, B, A>
where
    A: Adapter<B>,
    S: Service<Request<A::Body>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempts", &self.retry.attempts)
            .field("may_retry", &self.retry.template.is_some())
            .finish_non_exhaustive()
    }
}
