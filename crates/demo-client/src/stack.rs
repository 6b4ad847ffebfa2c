//! The client stack of each strategy, built from `backoff-layer`.
//!
//! ```text
//! Retry (strategy) ─► Record ─► Timeout (per attempt) ─► Collect ─► transport
//! ```
//!
//! | strategy | backoff | attempts | budget | source |
//! |---|---|---|---|---|
//! | `fixed` | 100 ms between attempts | no limit | none | the article's simulation client |
//! | `exponential` | 100 ms, x2, normal jitter 0.1, at most 15 min | no limit | none | the article's exponential client |
//! | `full` | 100 ms, x2, jitter 0.1, at most 15 min | 3 | 10% of requests in 10 s | the article, the paper, the SRE book |
//!
//! Every strategy sends `X-Request-Attempt` and never retries a response that carries the
//! stop signal: that is how `backoff-layer`'s retry works. Against a server without the
//! overload layer (`--stack none`) neither changes anything, which is the point of the
//! comparison: `fixed` and `exponential` differ from `full` by what they do on their own
//! (the attempt limit, the budget; `exponential` has the article's jitter too), and `full` is
//! meant to meet a server that speaks the protocol.

use std::time::Duration;

use backoff_layer::backoff::{Exponential, Fixed, Seeds};
use backoff_layer::budget::{RetryBudget, Unlimited};
use backoff_layer::{ReplayBody, RetryLayer};
use http::{Request, Response};
use http_body::Body;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder};
use tower_service::Service;

use crate::client::{CollectLayer, CountingBudget, DemoBody, RecordLayer};
use crate::record::Recorder;
use crate::strategy::Strategy;

/// The whole client stack, boxed so that every strategy has the same type.
pub type DemoService = BoxCloneSyncService<Request<DemoBody>, Response<DemoBody>, BoxError>;

/// The request body the transport under the retry layer receives.
pub type TransportBody = ReplayBody<DemoBody>;

/// The retry layer of `strategy`, its jitter seeded by `seed`, its budget refusals (for
/// `full`) recorded into `recorder`. See the [module docs](self) for each configuration.
pub fn retry_layer(strategy: Strategy, seed: u64, recorder: &Recorder) -> RetryLayer {
    let builder = RetryLayer::builder().seeds(Seeds::from_seed(seed));
    let built = match strategy {
        // NOTE: `RetryLayer`'s default budget is a `RetryBudget`; the article's clients have
        // none, so it is turned off explicitly.
        Strategy::Fixed => builder
            // The article's fixed interval, 100 ms.
            .backoff(Fixed::new())
            .budget(Unlimited)
            .max_attempts(u32::MAX)
            .build(),
        Strategy::Exponential => builder
            .backoff(Exponential::new())
            .budget(Unlimited)
            .max_attempts(u32::MAX)
            .build(),
        Strategy::Full => builder
            .backoff(Exponential::new())
            .budget(CountingBudget::new(
                RetryBudget::default(),
                recorder.clone(),
            ))
            .build(),
    };
    // NOTE: every configuration above is a constant that satisfies the builder's rules
    // (max attempts >= 1, no zero timeout or deadline); the unit tests build each one.
    built.unwrap_or_else(|e| unreachable!("the demo's retry configurations are valid: {e}"))
}

/// Builds the client stack of `strategy` over `transport`, with a per-attempt `timeout`,
/// response bodies read up to `max_body` bytes (see [`CollectLayer`]).
pub fn client_stack<T, B>(
    transport: T,
    strategy: Strategy,
    timeout: Duration,
    max_body: usize,
    seed: u64,
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
    let service = ServiceBuilder::new()
        .layer(retry_layer(strategy, seed, recorder))
        .layer(RecordLayer::new(recorder.clone()))
        .timeout(timeout)
        .layer(CollectLayer::new(max_body))
        .service(transport);
    BoxCloneSyncService::new(service)
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

    fn request() -> Request<DemoBody> {
        let mut req = Request::get("http://127.0.0.1:1/api")
            .body(DemoBody::default())
            .unwrap();
        req.extensions_mut().insert(AttemptCounter::new());
        req
    }

    #[test]
    fn every_strategy_builds() {
        let recorder = Recorder::starting_at(tokio::time::Instant::now());
        for s in Strategy::ALL {
            let _ = retry_layer(s, 1, &recorder);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_and_exponential_retry_past_three_attempts() {
        for strategy in [Strategy::Fixed, Strategy::Exponential] {
            let recorder = Recorder::new();
            let (server, seen) = flaky(5);
            let stack = client_stack(
                server,
                strategy,
                Duration::from_secs(2),
                MAX_BODY,
                1,
                &recorder,
            );
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
        let stack = client_stack(
            Loopback::new(server, gate.clone(), Abandoned::Serve),
            Strategy::Fixed,
            Duration::from_secs(2),
            MAX_BODY,
            1,
            &recorder,
        );
        gate.pause();
        let outcome = tokio::time::timeout(Duration::from_secs(20), stack.oneshot(request())).await;
        assert!(outcome.is_err(), "still retrying");
        // One attempt every 2.1 s: 2 s of timeout, 100 ms of backoff.
        assert_eq!(recorder.totals(0, 100).attempts, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn full_gives_up_after_three_attempts() {
        let recorder = Recorder::new();
        let (server, seen) = flaky(5);
        let stack = client_stack(
            server,
            Strategy::Full,
            Duration::from_secs(2),
            MAX_BODY,
            1,
            &recorder,
        );
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
        let stack = client_stack(
            server,
            Strategy::Full,
            Duration::from_secs(2),
            MAX_BODY,
            1,
            &recorder,
        );
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

    #[tokio::test(start_paused = true)]
    async fn fixed_waits_100ms_between_attempts() {
        let recorder = Recorder::new();
        let (server, _seen) = flaky(3);
        let stack = client_stack(
            server,
            Strategy::Fixed,
            Duration::from_secs(2),
            MAX_BODY,
            1,
            &recorder,
        );
        let start = tokio::time::Instant::now();
        stack.oneshot(request()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(300));
    }

    /// Regression: `exponential` ran without the article's jitter.
    #[tokio::test(start_paused = true)]
    async fn exponential_doubles_with_the_articles_jitter() {
        let recorder = Recorder::new();
        let (server, _seen) = flaky(3);
        let stack = client_stack(
            server,
            Strategy::Exponential,
            Duration::from_secs(2),
            MAX_BODY,
            1,
            &recorder,
        );
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
