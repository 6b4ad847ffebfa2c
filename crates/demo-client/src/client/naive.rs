//! The article's clients: [`NaiveRetry`] retries every failure after its strategy's wait,
//! for as long as it takes, and knows nothing of the overload protocol.
//!
//! This is what the article's simulation clients do, and what many clients in the wild do:
//!
//! - **any failure is retried**: an error from the service below (a refused connection, a
//!   timed-out attempt, a reset) and any response whose status is not `2xx` (`429`, `500`,
//!   `503`, `404`, ...);
//! - **without end**: there is no attempt limit, no retry budget and no deadline; only a
//!   per-attempt timeout below it, and the caller dropping the request (the end of a run),
//!   bound a request;
//! - **deaf to the server**: it sends no `X-Request-Attempt` header, retries a response that
//!   carries the stop signal (`X-Overloaded`) like any other failure, and ignores
//!   `Retry-After`;
//! - **the strategy's waits, exactly**: the wait before retry `n` is
//!   [`Backoff::next_delay`] of the strategy it is given (`backoff-layer`'s [`Fixed`] for the
//!   article's fixed interval, [`Exponential`] for its exponential client), drawn from a
//!   generator of the request's own, seeded from a shared [`Seeds`] source at the request's
//!   first retry.
//!
//! It exists for the outage experiment, to show what such clients do to a server, with and
//! without protection; `backoff-layer`'s `RetryLayer` is the client to use.
//!
//! # The article's program
//!
//! The article's pseudo-code starts each request's backoff at `MinDelay` (100 ms), which
//! [`Exponential`] follows. Its program does not: each client keeps one `delay` variable for
//! its think time and its backoff, so after a failure it multiplies **the think time it just
//! slept** (10 s on average) by the factor, and feeds the jitter back:
//! `delay = min(delay * Factor, MaxDelay); delay += normal(0, delay * Jitter)`.
//! [`NaiveRetryLayer::carrying_think_time`] with [`CarriedDelay`] is that client: it reads the
//! think time from the request's [`ThinkTime`] extension (the load generator sets it). With
//! the program's factor of 2.7, a first retry waits about 27 s, so during a 20 s outage each
//! client sends about one attempt.
//!
//! # Replay
//!
//! Every attempt is a clone of the caller's request: method, URI, version, headers,
//! extensions and body. So the body type must be [`Clone`] and hold the whole body; in the
//! demo every request body is empty (a `GET` with a [`DemoBody`](super::DemoBody) of no bytes),
//! so a clone costs the head only. Extensions are cloned too, which is how an
//! [`AttemptCounter`](super::AttemptCounter) (shared behind an `Arc`) sees every attempt.
//!
//! [`Fixed`]: backoff_layer::backoff::Fixed
//! [`Exponential`]: backoff_layer::backoff::Exponential

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use backoff_layer::backoff::{Backoff, Seeds};
use http::{Request, Response};
use pin_project_lite::pin_project;
use rand::rngs::SmallRng;
use tokio::time::Sleep;
use tower::BoxError;
use tower_layer::Layer;
use tower_service::Service;

/// Makes [`NaiveRetry`] services; see the [module docs](self).
///
/// Cheap to clone: the configuration is shared behind an [`Arc`], the seed source included,
/// so every service of one layer draws its requests' seeds from one sequence.
#[derive(Clone)]
pub struct NaiveRetryLayer {
    config: Arc<Config>,
}

struct Config {
    backoff: Box<dyn Backoff>,
    seeds: Seeds,
    /// Whether a request's first wait starts from its [`ThinkTime`] (the article's program).
    carry_think_time: bool,
}

/// The think time a client slept before sending a request, in the request's extensions:
/// what the article's program starts its backoff from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkTime(pub Duration);

/// The article's program's backoff: each delay grows from the previous one, **jitter
/// included**, `delay = min(previous * factor, max); delay += normal(0, delay * jitter)`,
/// never below zero; the first from the request's think time when the layer carries it
/// ([`NaiveRetryLayer::carrying_think_time`]), else from 100 ms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CarriedDelay {
    factor: f64,
    max: Duration,
    jitter: f64,
}

impl CarriedDelay {
    /// The program's parameters, the article's blue curve: factor 2.7, jitter 0.1, at most
    /// 10 minutes.
    pub const fn article_program() -> Self {
        Self {
            factor: 2.7,
            max: Duration::from_secs(600),
            jitter: 0.1,
        }
    }

    /// The delay that a wait of `previous` grows into, before jitter.
    fn grown(&self, previous: Duration) -> Duration {
        let grown = previous.as_secs_f64() * self.factor;
        Duration::from_secs_f64(grown.min(self.max.as_secs_f64()))
    }
}

impl Backoff for CarriedDelay {
    fn next_delay(
        &self,
        _retry: u32,
        previous: Option<Duration>,
        rng: &mut dyn rand::RngCore,
    ) -> Duration {
        let delay = self.grown(previous.unwrap_or(Duration::from_millis(100)));
        let noise: f64 = rand_distr::Distribution::sample(&rand_distr::StandardNormal, rng);
        let jittered = delay.as_secs_f64() * (1.0 + noise * self.jitter);
        Duration::from_secs_f64(jittered.clamp(0.0, self.max.as_secs_f64() * 2.0))
    }

    fn max_delay(&self) -> Duration {
        self.max
    }
}

impl NaiveRetryLayer {
    /// Waits `backoff`'s delays between attempts, each request's drawn from a generator
    /// seeded by `seeds` ([`Seeds::from_seed`] for a reproducible run).
    pub fn new(backoff: impl Backoff, seeds: Seeds) -> Self {
        Self {
            config: Arc::new(Config {
                backoff: Box::new(backoff),
                seeds,
                carry_think_time: false,
            }),
        }
    }

    /// The same, with each request's first wait grown from its [`ThinkTime`] extension (as
    /// `previous`), as the article's program does; see the [module
    /// docs](self#the-articles-program). A request without one starts from `None`.
    pub fn carrying_think_time(backoff: impl Backoff, seeds: Seeds) -> Self {
        Self {
            config: Arc::new(Config {
                backoff: Box::new(backoff),
                seeds,
                carry_think_time: true,
            }),
        }
    }
}

impl fmt::Debug for NaiveRetryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NaiveRetryLayer")
            .field("backoff", &self.config.backoff)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for NaiveRetryLayer {
    type Service = NaiveRetry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        NaiveRetry {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// Retries every failed request to the inner service, without end and without telling the
/// server; see the [module docs](self). Made by [`NaiveRetryLayer`].
///
/// The response is the first `2xx` response. The only error it returns is a readiness error
/// of the inner service (`poll_ready` failing), which means the service cannot take any
/// attempt: no attempt was sent, so there is nothing to retry.
pub struct NaiveRetry<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> NaiveRetry<S> {
    overload_core::define_inner_service_accessors!();
}

impl<S: Clone> Clone for NaiveRetry<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for NaiveRetry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NaiveRetry")
            .field("inner", &self.inner)
            .field("backoff", &self.config.backoff)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for NaiveRetry<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    ReqBody: Clone,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = NaiveRetryFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // NOTE: `self.inner` was made ready by `poll_ready` and sends the first attempt; the
        // clone, not ready, goes with the future and is polled ready before each retry, as
        // tower's readiness contract requires.
        let service = self.inner.clone();
        let previous = if self.config.carry_think_time {
            request.extensions().get::<ThinkTime>().map(|t| t.0)
        } else {
            None
        };
        let future = self.inner.call(request.clone());
        NaiveRetryFuture {
            state: State::Called { future },
            service,
            request,
            config: Arc::clone(&self.config),
            retries: 0,
            previous,
            rng: None,
        }
    }
}

pin_project! {
    /// The response future of [`NaiveRetry`]: one request, all its attempts and the waits
    /// between them.
    pub struct NaiveRetryFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S::Future>,
        // A clone of the inner service, for the retries.
        service: S,
        // The caller's request, cloned for every attempt.
        request: Request<B>,
        config: Arc<Config>,
        // Retries sent so far.
        retries: u32,
        // The previous delay the strategy returned.
        previous: Option<Duration>,
        // The request's own generator, made at its first retry.
        rng: Option<SmallRng>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // An attempt is in flight.
        Called { #[pin] future: F },
        // Waiting out the strategy's delay before the next attempt.
        Waiting { #[pin] sleep: Sleep },
        // Waiting for the inner service to be ready for the next attempt.
        Polling,
        // The response was returned.
        Done,
    }
}

impl<S, B> fmt::Debug for NaiveRetryFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NaiveRetryFuture")
            .field("retries", &self.retries)
            .field("previous", &self.previous)
            .finish_non_exhaustive()
    }
}

impl<S, B, ResBody> Future for NaiveRetryFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    B: Clone,
{
    type Output = Result<Response<ResBody>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future } => {
                    // Any error and any status but 2xx is a failure, retried; the stop
                    // signal and `Retry-After` mean nothing to this client.
                    if let Ok(response) = ready!(future.poll(cx))
                        && response.status().is_success()
                    {
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(response));
                    }
                    let config = &**this.config;
                    let rng = this.rng.get_or_insert_with(|| config.seeds.rng());
                    let delay = config
                        .backoff
                        .next_delay(*this.retries, *this.previous, rng);
                    *this.previous = Some(delay);
                    this.state.set(State::Waiting {
                        sleep: tokio::time::sleep(delay),
                    });
                }
                StateProj::Waiting { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(State::Polling);
                }
                StateProj::Polling => {
                    if let Err(e) = ready!(this.service.poll_ready(cx)) {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(e.into()));
                    }
                    *this.retries = this.retries.saturating_add(1);
                    let future = this.service.call(this.request.clone());
                    this.state.set(State::Called { future });
                }
                StateProj::Done => {
                    return Poll::Ready(Err("naive retry future polled after completion".into()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use backoff_layer::backoff::{Exponential, Fixed};
    use bytes::Bytes;
    use http::StatusCode;
    use http::header::HeaderValue;
    use http_body_util::Full;
    use overload_signal::protocol::{self, Protocol};
    use tokio::time::Instant;
    use tower::ServiceExt;

    type Body = Full<Bytes>;

    /// What the server saw of one attempt.
    #[derive(Debug, Clone)]
    struct Seen {
        at: Duration,
        request: Request<Body>,
    }

    /// Every attempt a test server saw.
    type SeenLog = Arc<Mutex<Vec<Seen>>>;

    /// A server that answers the attempts with `answers`, in order (then 200), and keeps
    /// every attempt it saw with the time it arrived.
    fn server(
        answers: Vec<Result<Response<Body>, BoxError>>,
    ) -> (
        impl Service<Request<Body>, Response = Response<Body>, Error = BoxError, Future: Send>
        + Clone
        + Send
        + 'static,
        SeenLog,
    ) {
        let start = Instant::now();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let answers = Arc::new(Mutex::new(answers.into_iter()));
        let svc = tower::service_fn(move |request: Request<Body>| {
            let mut log = log.lock().unwrap();
            log.push(Seen {
                at: start.elapsed(),
                request,
            });
            let answer = answers
                .lock()
                .unwrap()
                .next()
                .unwrap_or_else(|| Ok(Response::new(Body::default())));
            async move { answer }
        });
        (svc, seen)
    }

    fn status(status: StatusCode) -> Result<Response<Body>, BoxError> {
        Ok(Response::builder()
            .status(status)
            .body(Body::default())
            .unwrap())
    }

    /// `n` plain `503 Service Unavailable` answers.
    fn unavailable(n: usize) -> Vec<Result<Response<Body>, BoxError>> {
        (0..n)
            .map(|_| status(StatusCode::SERVICE_UNAVAILABLE))
            .collect()
    }

    fn stop_signal() -> Result<Response<Body>, BoxError> {
        Ok(protocol::stop_signal_response(Protocol::Http))
    }

    fn rate_limited() -> Result<Response<Body>, BoxError> {
        Ok(Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header(http::header::RETRY_AFTER, "30")
            .body(Body::default())
            .unwrap())
    }

    fn fixed() -> NaiveRetryLayer {
        NaiveRetryLayer::new(Fixed::new(), Seeds::from_seed(1))
    }

    fn get() -> Request<Body> {
        Request::get("http://127.0.0.1:1/api")
            .body(Body::default())
            .unwrap()
    }

    fn arrivals(seen: &Mutex<Vec<Seen>>) -> Vec<Duration> {
        seen.lock().unwrap().iter().map(|s| s.at).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_stop_signal_and_a_429_are_retried_after_the_interval() {
        let stop = stop_signal().unwrap();
        assert!(protocol::is_stop_signal(stop.headers()));
        assert_eq!(stop.status(), StatusCode::SERVICE_UNAVAILABLE);
        let (svc, seen) = server(vec![stop_signal(), rate_limited(), stop_signal()]);
        let response = fixed().layer(svc).oneshot(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        // 100 ms after each failure, Retry-After: 30 ignored.
        let ms = Duration::from_millis;
        assert_eq!(arrivals(&seen), vec![ms(0), ms(100), ms(200), ms(300)]);
    }

    #[tokio::test(start_paused = true)]
    async fn no_attempt_header_is_sent() {
        let (svc, seen) = server(unavailable(4));
        fixed().layer(svc).oneshot(get()).await.unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 5);
        for s in seen.iter() {
            assert!(
                !s.request
                    .headers()
                    .contains_key(protocol::X_REQUEST_ATTEMPT),
                "{:?}",
                s.request.headers()
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn every_failure_is_retried_past_three_attempts() {
        let refused: Result<Response<Body>, BoxError> = Err(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        let timed_out: Result<Response<Body>, BoxError> =
            Err(Box::new(tower::timeout::error::Elapsed::new()));
        let answers = vec![
            refused,
            timed_out,
            status(StatusCode::INTERNAL_SERVER_ERROR),
            status(StatusCode::NOT_FOUND),
            status(StatusCode::BAD_GATEWAY),
            status(StatusCode::MOVED_PERMANENTLY),
            rate_limited(),
            stop_signal(),
        ];
        let failures = answers.len();
        let (svc, seen) = server(answers);
        let response = fixed().layer(svc).oneshot(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(seen.lock().unwrap().len(), failures + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn it_never_gives_up_on_its_own() {
        let down = tower::service_fn(|_req: Request<Body>| async {
            Err::<Response<Body>, BoxError>("connection refused".into())
        });
        let calls = Arc::new(Mutex::new(0u32));
        let count = Arc::clone(&calls);
        let down = down.map_request(move |req| {
            *count.lock().unwrap() += 1;
            req
        });
        let minute = Duration::from_millis(59_950);
        let result = tokio::time::timeout(minute, fixed().layer(down).oneshot(get())).await;
        assert!(result.is_err(), "still retrying after a minute");
        // One attempt at 0 ms and one every 100 ms after it, the last at 59.9 s.
        assert_eq!(*calls.lock().unwrap(), 600);
    }

    #[tokio::test(start_paused = true)]
    async fn every_attempt_replays_the_whole_request() {
        let (svc, seen) = server(unavailable(2));
        let mut request = Request::put("http://127.0.0.1:1/api?x=1")
            .header("x-trace", "abc")
            .body(Full::new(Bytes::from_static(b"the whole body")))
            .unwrap();
        request.extensions_mut().insert(7u8);
        fixed().layer(svc).oneshot(request).await.unwrap();
        let requests: Vec<Request<Body>> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.request.clone())
            .collect();
        assert_eq!(requests.len(), 3);
        for r in requests {
            assert_eq!(r.method(), http::Method::PUT);
            assert_eq!(r.uri(), "http://127.0.0.1:1/api?x=1");
            assert_eq!(r.headers().len(), 1);
            assert_eq!(r.headers()["x-trace"], HeaderValue::from_static("abc"));
            assert_eq!(r.extensions().get::<u8>(), Some(&7));
            let bytes = http_body_util::BodyExt::collect(r.into_body())
                .await
                .unwrap()
                .to_bytes();
            assert_eq!(&bytes[..], b"the whole body");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn exponential_waits_are_the_articles_delays_for_the_requests_seed() {
        let (svc, seen) = server(unavailable(6));
        let layer = NaiveRetryLayer::new(Exponential::new(), Seeds::from_seed(9));
        layer.layer(svc).oneshot(get()).await.unwrap();
        // The first request takes the first seed of the source: the same sequence as the
        // strategy's own, drawn from that seed.
        let expected: Vec<Duration> = Exponential::new()
            .delays(Seeds::from_seed(9).rng())
            .take(6)
            .collect();
        let at = arrivals(&seen);
        let waits: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(waits.len(), expected.len());
        for (wait, delay) in waits.iter().zip(&expected) {
            // NOTE: tokio's timer rounds a deadline up to the next millisecond.
            assert!(
                *delay <= *wait && *wait <= *delay + Duration::from_millis(1),
                "waited {wait:?} for a delay of {delay:?}; waits {waits:?}, delays {expected:?}"
            );
        }
        // The article's jitter: not the bare doubling.
        assert_ne!(waits[2], Duration::from_millis(400), "{waits:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn two_requests_draw_different_jitter() {
        let layer = NaiveRetryLayer::new(Exponential::new(), Seeds::from_seed(3));
        let mut waits = Vec::new();
        for _ in 0..2 {
            let (svc, seen) = server(unavailable(3));
            layer.layer(svc).oneshot(get()).await.unwrap();
            let at = arrivals(&seen);
            waits.push(at.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>());
        }
        assert_ne!(waits[0], waits[1]);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_wait_for_readiness_and_a_readiness_error_ends_the_request() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut svc = fixed().layer(mock);
        handle.allow(1);
        ready(&mut svc).await;
        let response = tokio::spawn(svc.call(get()));
        let (_, send) = handle.next_request().await.unwrap();
        send.send_response(
            Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .body(Body::default())
                .unwrap(),
        );
        // The retry waits for readiness: nothing is sent while the mock allows nothing.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!response.is_finished());
        handle.allow(1);
        let (_, send) = handle.next_request().await.unwrap();
        send.send_error("connection reset");
        // A service that fails its readiness cannot take the next retry: the error ends it.
        handle.send_error("the service is gone");
        let err = response.await.unwrap().unwrap_err();
        assert_eq!(err.to_string(), "the service is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn the_articles_program_grows_its_first_wait_from_the_think_time() {
        let (svc, seen) = server(unavailable(2));
        let layer = NaiveRetryLayer::carrying_think_time(
            CarriedDelay::article_program(),
            Seeds::from_seed(4),
        );
        let mut request = get();
        request
            .extensions_mut()
            .insert(ThinkTime(Duration::from_secs(10)));
        layer.layer(svc).oneshot(request).await.unwrap();
        let at = arrivals(&seen);
        let waits: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        // 10 s x 2.7 = 27 s, moved by its normal jitter (sd 2.7 s); then that wait, jitter
        // included, x 2.7 again: the draws of the request's own generator.
        let program = CarriedDelay::article_program();
        let mut rng = Seeds::from_seed(4).rng();
        let first = program.next_delay(0, Some(Duration::from_secs(10)), &mut rng);
        let second = program.next_delay(1, Some(first), &mut rng);
        for (wait, delay) in waits.iter().zip([first, second]) {
            // NOTE: tokio's timer rounds a deadline up to the next millisecond.
            assert!(
                delay <= *wait && *wait <= delay + Duration::from_millis(1),
                "waited {wait:?} for {delay:?}"
            );
        }
        assert!(
            (Duration::from_secs(13)..=Duration::from_secs(41)).contains(&first),
            "27 s within 5 standard deviations: {first:?}"
        );
        let growth = second.as_secs_f64() / first.as_secs_f64();
        assert!(
            (1.35..=4.05).contains(&growth),
            "grown from the previous wait: {growth}"
        );
        // Without the extension, or from the plain layer, it starts from 100 ms.
        let (svc, seen) = server(unavailable(1));
        let plain = NaiveRetryLayer::new(CarriedDelay::article_program(), Seeds::from_seed(4));
        let mut request = get();
        request
            .extensions_mut()
            .insert(ThinkTime(Duration::from_secs(10)));
        plain.layer(svc).oneshot(request).await.unwrap();
        let at = arrivals(&seen);
        assert!(at[1] - at[0] < Duration::from_millis(500), "{at:?}");
    }

    async fn ready<S: Service<Request<Body>>>(svc: &mut S)
    where
        S::Error: fmt::Debug,
    {
        std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    }
}
