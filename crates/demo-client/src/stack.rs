//! The client stack of each strategy.
//!
//! ```text
//! retry (strategy) ─► Record ─► Timeout (per attempt) ─► Collect ─► transport
//! ```
//!
//! | strategy | retry layer | wait before a retry | attempts | budget | client-side throttle | source |
//! |---|---|---|---|---|---|---|
//! | `fixed` | [`NaiveRetry`](crate::client::NaiveRetry) | 100 ms | no limit | none | none | the article's simulation client |
//! | `exponential` | [`NaiveRetry`](crate::client::NaiveRetry) | 100 ms, x2, normal jitter 0.1, at most 15 min | no limit | none | none | the article's pseudo-code |
//! | `exponential-program` | [`NaiveRetry`](crate::client::NaiveRetry), carrying the think time | the think time just slept x2.7 (about 27 s), then x2.7 each, jitter 0.1 fed back, at most 10 min | no limit | none | none | the article's program |
//! | `full` | `backoff-layer`'s [`RetryLayer`] | 100 ms, x2, normal jitter 0.1, at most 15 min; `Retry-After` as a lower bound | 3 | retries at most 10% of requests in 10 s | per destination, `backoff-layer`'s defaults | the article, the paper, the SRE book |
//! | `full-no-throttle` | the same | the same | 3 | the same | none | `full` before the throttle |
//! | `full-reqwest` | the same as `full`, over a `reqwest::Client` | the same | 3 | the same | the same | `full` through reqwest |
//! | `reqwest-default` | none: reqwest 0.13's own retry, in the transport | none | 3 | retries at most 20 % extra load in 10 s | none | a reqwest user's setup |
//!
//! `full` also sends, with every attempt, how long it waits for it: `X-Request-Deadline`
//! with the per-attempt timeout (the retry layer's own, set to the stack's), so that a server
//! with a deadline layer drops the attempts nobody waits for any more.
//!
//! `fixed`, `exponential` and `exponential-program` are the article's clients, and know
//! nothing of the overload protocol. They retry every failure (a refused connection, a timed-out attempt, any
//! status but `2xx`) after their wait, for as long as it takes; they send no
//! `X-Request-Attempt` header (so a server counts their attempts as "unknown", never as
//! retries), and they retry a response carrying the stop signal like any other failure. The
//! waits are `backoff-layer`'s [`Fixed::new()`] and [`Exponential::new()`], each request
//! drawing its jitter from its own generator.
//!
//! `exponential` follows the article's pseudo-code (each request's backoff starts at 100 ms);
//! `exponential-program` its program, whose backoff starts from the think time the client
//! just slept (see [`CarriedDelay`]).
//!
//! `full` is everything this workspace offers: `backoff-layer`'s retry layer with its
//! defaults (it retries connect errors, timeouts, `429`, `502`, `503` and `504`), a retry
//! budget, `X-Request-Attempt` and `X-Request-Deadline` on every attempt, no retry after a
//! stop signal, and its client-side throttle: one for the whole stack, so shared by every
//! client of a run, which refuses most requests to a destination that keeps failing (at
//! once, unsent) and sends the rest as probes. `full-no-throttle` is the same without the
//! throttle.
//!
//! So `fixed vs --stack full` is what the server side achieves alone: its clients neither
//! tell the server which requests are retries nor listen when it says stop.
//!
//! Under every retry layer, [`Record`](crate::client::Record) counts each attempt and how it
//! ended (stop signals included, heeded or not), and the per-attempt timeout bounds each
//! attempt; the transport receives a [`TransportBody`], whichever retry layer is above it.

use std::sync::Arc;
use std::time::Duration;

use backoff_layer::RetryLayer;
use backoff_layer::backoff::{Exponential, Fixed, Seeds};
use backoff_layer::budget::RetryBudget;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Either;
use overload_core::clock::WallClock;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder};
use tower_service::Service;

use crate::client::{
    CarriedDelay, CollectLayer, CountingBudget, DemoBody, NaiveRetryLayer, RecordLayer,
};
use crate::record::Recorder;
use crate::strategy::Strategy;

pub use crate::client::TransportBody;

/// The whole client stack, boxed so that every strategy has the same type.
pub type DemoService = BoxCloneSyncService<Request<DemoBody>, Response<DemoBody>, BoxError>;

/// The retry layer of one strategy; see the [module docs](self).
#[derive(Debug, Clone)]
pub enum StrategyRetry {
    /// The article's clients, `fixed`, `exponential` and `exponential-program`.
    Naive(NaiveRetryLayer),
    /// `full`, `full-no-throttle` and `full-reqwest`: `backoff-layer`'s retry layer.
    Full(RetryLayer),
    /// `reqwest-default`: no retry layer; the transport (reqwest) retries on its own.
    Transport,
}

/// The retry layer of `strategy`, its jitter seeded by `seed`, its budget refusals (for
/// `full`) recorded into `recorder`; `full` sends the per-attempt `timeout` in
/// `X-Request-Deadline`, its send time read from `wall`. See the [module docs](self) for
/// each configuration.
pub fn retry_layer(
    strategy: Strategy,
    seed: u64,
    timeout: Duration,
    wall: &Arc<dyn WallClock>,
    recorder: &Recorder,
) -> StrategyRetry {
    let seeds = Seeds::from_seed(seed);
    match strategy {
        // The article's fixed interval, 100 ms.
        Strategy::Fixed => StrategyRetry::Naive(NaiveRetryLayer::new(Fixed::new(), seeds)),
        // The article's exponential backoff, its normal jitter included.
        Strategy::Exponential => {
            StrategyRetry::Naive(NaiveRetryLayer::new(Exponential::new(), seeds))
        }
        // The article's program: the backoff grows from the think time.
        Strategy::ExponentialProgram => StrategyRetry::Naive(NaiveRetryLayer::carrying_think_time(
            CarriedDelay::article_program(),
            seeds,
        )),
        Strategy::ReqwestDefault => StrategyRetry::Transport,
        Strategy::Full | Strategy::FullNoThrottle | Strategy::FullReqwest => {
            // NOTE: the retry layer's own attempt timeout is what goes on the wire; the stack's
            // tower timeout under it still ends each attempt (1 ms sooner, so it always fires
            // first and `Record` counts the timeout), as under the other strategies.
            let builder = RetryLayer::builder()
                .seeds(seeds)
                .backoff(Exponential::new())
                .budget(CountingBudget::new(
                    RetryBudget::default(),
                    recorder.clone(),
                ))
                .attempt_timeout(timeout.saturating_add(Duration::from_millis(1)))
                .wall_clock(Arc::clone(wall));
            // NOTE: `full` keeps the layer's own throttle, with its defaults.
            let built = if strategy == Strategy::FullNoThrottle {
                builder.no_throttle().build()
            } else {
                builder.build()
            };
            // NOTE: every setting above is a constant that satisfies the builder's rules
            // (max attempts >= 1, no zero timeout or deadline); the unit tests build it.
            StrategyRetry::Full(
                built.unwrap_or_else(|e| {
                    unreachable!("the demo's retry configuration is valid: {e}")
                }),
            )
        }
    }
}

/// Builds the client stack of `strategy` over `transport`, with a per-attempt `timeout`,
/// response bodies read up to `max_body` bytes (see [`CollectLayer`]), and the time of day
/// of the deadlines `full` sends read from `wall` (the system's in a real run; in a
/// simulation, one tokio's paused time moves, as the simulated server's).
pub fn client_stack<T, B>(
    transport: T,
    strategy: Strategy,
    timeout: Duration,
    max_body: usize,
    seed: u64,
    wall: &Arc<dyn WallClock>,
    recorder: &Recorder,
) -> DemoService
where
    T: Service<Request<TransportBody>, Response = Response<B>> + Clone + Send + Sync + 'static,
    T::Future: Send + 'static,
    T::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    // One attempt, the same under every retry layer.
    let attempt = ServiceBuilder::new()
        .layer(RecordLayer::new(recorder.clone()))
        .timeout(timeout)
        .layer(CollectLayer::new(max_body))
        .service(transport);
    match retry_layer(strategy, seed, timeout, wall, recorder) {
        StrategyRetry::Naive(layer) => BoxCloneSyncService::new(
            ServiceBuilder::new()
                .layer(layer)
                .map_request(|r: Request<DemoBody>| r.map(Either::Right))
                .service(attempt),
        ),
        StrategyRetry::Full(layer) => BoxCloneSyncService::new(
            ServiceBuilder::new()
                .layer(layer)
                .map_request(|r: Request<_>| r.map(Either::Left))
                .service(attempt),
        ),
        StrategyRetry::Transport => BoxCloneSyncService::new(
            ServiceBuilder::new()
                .map_request(|r: Request<DemoBody>| r.map(Either::Right))
                .service(attempt),
        ),
    }
}

/// The client stack of `strategy` over the network: hyper-util's client
/// ([`http_transport`](crate::client::http_transport)), or for `full-reqwest` a
/// `reqwest::Client` (`client::reqwest_transport`, the `reqwest` feature), keeping up to
/// `max_idle` idle connections; the other arguments as [`client_stack`]'s.
///
/// # Errors
///
/// `full-reqwest` in a build without the `reqwest` feature, or reqwest failing to build its
/// client.
pub fn network_stack(
    strategy: Strategy,
    max_idle: usize,
    timeout: Duration,
    max_body: usize,
    seed: u64,
    wall: &Arc<dyn WallClock>,
    recorder: &Recorder,
) -> Result<DemoService, BoxError> {
    if matches!(strategy, Strategy::FullReqwest | Strategy::ReqwestDefault) {
        #[cfg(feature = "reqwest")]
        return Ok(if strategy == Strategy::FullReqwest {
            client_stack(
                crate::client::reqwest_transport(max_idle)?,
                strategy,
                timeout,
                max_body,
                seed,
                wall,
                recorder,
            )
        } else {
            client_stack(
                crate::client::reqwest_default_transport(max_idle, recorder)?,
                strategy,
                timeout,
                max_body,
                seed,
                wall,
                recorder,
            )
        });
        #[cfg(not(feature = "reqwest"))]
        return Err(
            format!("{strategy} needs demo-client built with the `reqwest` feature").into(),
        );
    }
    Ok(client_stack(
        crate::client::http_transport(max_idle),
        strategy,
        timeout,
        max_body,
        seed,
        wall,
        recorder,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tower::ServiceExt;

    use crate::client::{AttemptCounter, Outcome};

    const MAX_BODY: usize = CollectLayer::DEFAULT_MAX_BODY;

    fn system() -> Arc<dyn WallClock> {
        Arc::new(overload_core::clock::SystemWallClock)
    }

    /// A server that fails the first `failures` attempts with 503, then answers 200.
    fn flaky(
        failures: u32,
    ) -> (
        impl Service<
            Request<TransportBody>,
            Response = Response<DemoBody>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static,
        Arc<AtomicU32>,
    ) {
        let seen = Arc::new(AtomicU32::new(0));
        let count = Arc::clone(&seen);
        let svc = tower::service_fn(move |_req: Request<TransportBody>| {
            let n = count.fetch_add(1, Ordering::SeqCst);
            async move {
                let status = if n < failures { 503 } else { 200 };
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(status)
                        .body(DemoBody::default())
                        .unwrap(),
                )
            }
        });
        (svc, seen)
    }

    /// The demo client stack as the tests use it: 2 s per attempt, the default body cap,
    /// seed 1.
    fn test_stack<T, B>(transport: T, strategy: Strategy, recorder: &Recorder) -> DemoService
    where
        T: Service<Request<TransportBody>, Response = Response<B>> + Clone + Send + Sync + 'static,
        T::Future: Send + 'static,
        T::Error: Into<BoxError>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        client_stack(
            transport,
            strategy,
            Duration::from_secs(2),
            MAX_BODY,
            1,
            &system(),
            recorder,
        )
    }

    fn request() -> Request<DemoBody> {
        let mut req = Request::get("http://127.0.0.1:1/api")
            .body(DemoBody::default())
            .unwrap();
        req.extensions_mut().insert(AttemptCounter::new());
        req
    }

    /// Without the `reqwest` feature, `full-reqwest` is refused with a reason, not run over
    /// hyper-util's client under reqwest's name.
    #[cfg(not(feature = "reqwest"))]
    #[tokio::test]
    async fn full_reqwest_needs_the_feature() {
        let recorder = Recorder::new();
        let made = |s| {
            network_stack(
                s,
                1,
                Duration::from_secs(2),
                MAX_BODY,
                1,
                &system(),
                &recorder,
            )
        };
        for strategy in [Strategy::FullReqwest, Strategy::ReqwestDefault] {
            let err = made(strategy).expect_err("refused");
            assert!(err.to_string().contains("`reqwest` feature"), "{err}");
            assert!(err.to_string().starts_with(strategy.name()), "{err}");
        }
        assert!(made(Strategy::Full).is_ok());
    }

    #[test]
    fn every_strategy_builds() {
        let recorder = Recorder::starting_at(tokio::time::Instant::now());
        for s in Strategy::ALL {
            let _ = retry_layer(s, 1, Duration::from_secs(2), &system(), &recorder);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_and_exponential_retry_past_three_attempts() {
        for strategy in [Strategy::Fixed, Strategy::Exponential] {
            let recorder = Recorder::new();
            let (server, seen) = flaky(5);
            let stack = test_stack(server, strategy, &recorder);
            let result = stack.oneshot(request()).await;
            assert_eq!(Outcome::of(&result), Outcome::Ok, "{strategy}");
            assert_eq!(seen.load(Ordering::SeqCst), 6, "{strategy}");
            let total = recorder.totals(0, 100);
            assert_eq!((total.attempts, total.retries), (6, 5), "{strategy}");
        }
    }

    /// Regression: `RetryLayer`'s default budget stopped the article's clients after a retry
    /// or two; they must retry for as long as the server is down.
    #[tokio::test(start_paused = true)]
    async fn fixed_retries_for_as_long_as_the_server_is_stopped() {
        use crate::client::{Abandoned, Gate, Loopback};
        let gate = Gate::new(100);
        let server = tower::service_fn(|_req: Request<DemoBody>| async {
            Ok::<_, Infallible>(Response::new(DemoBody::default()))
        });
        let recorder = Recorder::new();
        let stack = test_stack(
            Loopback::new(server, gate.clone(), Abandoned::Serve),
            Strategy::Fixed,
            &recorder,
        );
        gate.pause();
        let outcome = tokio::time::timeout(Duration::from_secs(20), stack.oneshot(request())).await;
        assert!(outcome.is_err(), "still retrying");
        // One attempt every 2.1 s: 2 s of timeout, 100 ms of backoff.
        assert_eq!(recorder.totals(0, 100).attempts, 10);
    }

    /// The `X-Request-Attempt` header of every attempt a test server saw.
    type HeaderLog = Arc<std::sync::Mutex<Vec<Option<String>>>>;

    /// A server that answers the stop signal to the first `signals` attempts, then 200, and
    /// keeps the `X-Request-Attempt` header of every attempt (`None` when absent).
    fn stopping(
        signals: usize,
    ) -> (
        impl Service<
            Request<TransportBody>,
            Response = Response<DemoBody>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static,
        HeaderLog,
    ) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let svc = tower::service_fn(move |req: Request<TransportBody>| {
            let header = req
                .headers()
                .get(overload_signal::protocol::X_REQUEST_ATTEMPT)
                .map(|v| v.to_str().unwrap().to_owned());
            let mut log = log.lock().unwrap();
            log.push(header);
            let response = if log.len() <= signals {
                overload_signal::protocol::stop_signal_response(
                    overload_signal::protocol::Protocol::Http,
                )
            } else {
                Response::new(DemoBody::default())
            };
            async move { Ok::<_, Infallible>(response) }
        });
        (svc, seen)
    }

    /// Regression: `fixed` and `exponential` were `backoff-layer`'s retry layer, so they sent
    /// `X-Request-Attempt` and stopped at the stop signal; the article's clients do neither.
    #[tokio::test(start_paused = true)]
    async fn the_articles_clients_ignore_the_stop_signal_and_send_no_attempt_header() {
        for strategy in [Strategy::Fixed, Strategy::Exponential] {
            let recorder = Recorder::new();
            let (server, seen) = stopping(4);
            let stack = test_stack(server, strategy, &recorder);
            let result = stack.oneshot(request()).await;
            assert_eq!(Outcome::of(&result), Outcome::Ok, "{strategy}");
            assert_eq!(*seen.lock().unwrap(), vec![None; 5], "{strategy}");
            let total = recorder.totals(0, 100);
            assert_eq!(
                (total.attempts, total.retries, total.stop_signals),
                (5, 4, 4),
                "{strategy}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn full_sends_the_attempt_header_and_stops_at_the_stop_signal() {
        let recorder = Recorder::new();
        let (server, seen) = stopping(1);
        let stack = test_stack(server, Strategy::Full, &recorder);
        let result = stack.oneshot(request()).await;
        assert_eq!(Outcome::of(&result), Outcome::Error);
        assert!(backoff_layer::is_overloaded(result.unwrap_err().as_ref()));
        assert_eq!(*seen.lock().unwrap(), vec![Some("0".to_owned())]);
        assert_eq!(recorder.totals(0, 100).stop_signals, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn full_numbers_its_attempts() {
        let recorder = Recorder::new();
        let (server, seen) = {
            // 503 without the stop signal twice, then 200.
            let (svc, _) = flaky(2);
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let log = Arc::clone(&seen);
            let svc = ServiceExt::map_request(svc, move |req: Request<TransportBody>| {
                log.lock().unwrap().push(
                    req.headers()[overload_signal::protocol::X_REQUEST_ATTEMPT]
                        .to_str()
                        .unwrap()
                        .to_owned(),
                );
                req
            });
            (svc, seen)
        };
        let stack = test_stack(server, Strategy::Full, &recorder);
        let result = stack.oneshot(request()).await;
        assert_eq!(Outcome::of(&result), Outcome::Ok);
        assert_eq!(*seen.lock().unwrap(), vec!["0", "1", "2"]);
    }

    /// `full` tells the server how long it waits for each attempt; the article's clients
    /// tell it nothing.
    #[tokio::test(start_paused = true)]
    async fn full_sends_the_attempt_timeout_as_its_deadline() {
        use overload_signal::protocol::{WireDeadline, X_REQUEST_DEADLINE};
        for strategy in Strategy::ALL {
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let log = Arc::clone(&seen);
            let server = tower::service_fn(move |req: Request<TransportBody>| {
                log.lock()
                    .unwrap()
                    .push(req.headers().get(X_REQUEST_DEADLINE).cloned());
                async { Ok::<_, Infallible>(Response::new(DemoBody::default())) }
            });
            let recorder = Recorder::new();
            let stack = test_stack(server, strategy, &recorder);
            stack.oneshot(request()).await.unwrap();
            let seen = seen.lock().unwrap().clone();
            match strategy {
                Strategy::Full | Strategy::FullNoThrottle | Strategy::FullReqwest => {
                    let d = WireDeadline::parse(seen[0].as_ref().expect("a deadline")).unwrap();
                    assert_eq!(d.timeout(), Duration::from_millis(2001));
                }
                Strategy::Fixed
                | Strategy::Exponential
                | Strategy::ExponentialProgram
                | Strategy::ReqwestDefault => {
                    assert_eq!(seen, [None]);
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn full_gives_up_after_three_attempts() {
        let recorder = Recorder::new();
        let (server, seen) = flaky(5);
        let stack = test_stack(server, Strategy::Full, &recorder);
        let result = stack.oneshot(request()).await;
        assert_eq!(Outcome::of(&result), Outcome::Error);
        assert_eq!(seen.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_are_per_attempt_and_classified() {
        let recorder = Recorder::new();
        let server = tower::service_fn(|_req: Request<TransportBody>| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Infallible>(Response::new(DemoBody::default()))
        });
        let stack = test_stack(server, Strategy::Full, &recorder);
        let start = tokio::time::Instant::now();
        let result = stack.oneshot(request()).await;
        assert_eq!(Outcome::of(&result), Outcome::Timeout);
        // Three attempts of 2 s plus two short backoffs: far less than one 60 s answer.
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(recorder.totals(0, 100).attempts, 3);
    }

    /// `full` against a server that fails every attempt: after the first slots of failures
    /// most requests fail at once, never sent; `full-no-throttle` sends every one.
    #[tokio::test(start_paused = true)]
    async fn full_refuses_locally_once_the_server_keeps_failing_and_full_no_throttle_does_not() {
        for (strategy, throttled) in [(Strategy::Full, true), (Strategy::FullNoThrottle, false)] {
            let recorder = Recorder::new();
            let (server, seen) = flaky(u32::MAX);
            let stack = test_stack(server, strategy, &recorder);
            let mut outcomes = Vec::new();
            for _ in 0..500 {
                let result = stack.clone().oneshot(request()).await;
                outcomes.push(Outcome::of(&result));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let refused = outcomes
                .iter()
                .filter(|o| **o == Outcome::Throttled)
                .count();
            if throttled {
                assert!(refused > 300, "{strategy}: {refused} refused");
                // Refused requests never reached the server.
                let sent = seen.load(Ordering::SeqCst) as usize;
                assert!(sent < 500 - refused + 100, "{strategy}: {sent} attempts");
            } else {
                assert_eq!(refused, 0, "{strategy}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_waits_100ms_between_attempts() {
        let recorder = Recorder::new();
        let (server, _seen) = flaky(3);
        let stack = test_stack(server, Strategy::Fixed, &recorder);
        let start = tokio::time::Instant::now();
        stack.oneshot(request()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(300));
    }

    /// Regression: `exponential` ran without the article's jitter.
    #[tokio::test(start_paused = true)]
    async fn exponential_doubles_with_the_articles_jitter() {
        let recorder = Recorder::new();
        let (server, _seen) = flaky(3);
        let stack = test_stack(server, Strategy::Exponential, &recorder);
        let start = tokio::time::Instant::now();
        stack.oneshot(request()).await.unwrap();
        // 100 + 200 + 400 ms, each moved by a normal jitter of 10% of itself: the sum has a
        // standard deviation of 46 ms; the seed fixes the draw.
        let elapsed = start.elapsed();
        assert_ne!(elapsed, Duration::from_millis(700), "no jitter");
        assert!(
            (Duration::from_millis(560)..=Duration::from_millis(840)).contains(&elapsed),
            "{elapsed:?}"
        );
    }
}
