//! The retry layer: [`RetryLayer`] and [`Retry`].
//!
//! See the [crate docs](crate) for the behaviour, defaults, outcomes and metrics.

pub mod future;
mod layer;
mod metrics;
mod service;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use layer::{RetryBuilder, RetryLayer};
pub use service::Retry;

use self::metrics::Metrics;
use crate::backoff::{Backoff, Seeds};
use crate::budget::Budget;
use crate::classify::Classify;

/// Everything a [`Retry`] needs, shared by all its clones and requests.
pub(crate) struct Config {
    pub(crate) max_attempts: u32,
    pub(crate) deadline: Option<Duration>,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) max_retry_after: Duration,
    pub(crate) backoff: Arc<dyn Backoff>,
    pub(crate) budget: Arc<dyn Budget>,
    pub(crate) classifier: Arc<dyn Classify>,
    pub(crate) body_limit: usize,
    pub(crate) seeds: Arc<Seeds>,
    /// Registered on the first request; read through [`Config::metrics`].
    metrics: OnceLock<Metrics>,
}

impl Config {
    /// The layer's metric handles.
    ///
    /// Registered with the recorder installed when the layer serves its first request, then
    /// kept: each request costs one atomic load here instead of a registry lookup per
    /// metric. Registering on first use rather than when the layer is built lets an
    /// application build its clients before it installs its recorder.
    // NOTE: a recorder installed after the first request never sees this layer's metrics;
    // the `metrics` facade has the same rule for any handle kept.
    pub(crate) fn metrics(&self) -> &Metrics {
        self.metrics.get_or_init(Metrics::register)
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // NOTE: `Budget` is not `Debug`; it is left out.
        f.debug_struct("Config")
            .field("max_attempts", &self.max_attempts)
            .field("deadline", &self.deadline)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("max_retry_after", &self.max_retry_after)
            .field("backoff", &self.backoff)
            .field("classifier", &self.classifier)
            .field("body_limit", &self.body_limit)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use http::{Request, Response};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use tower::{Layer, Service, ServiceExt, service_fn};

    use crate::RetryLayer;

    fn requests_total(snapshotter: &Snapshotter) -> Option<u64> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find_map(|(key, _, _, value)| match value {
                DebugValue::Counter(n) if key.key().name() == super::metrics::REQUESTS => Some(n),
                _ => None,
            })
    }

    async fn send(layer: &RetryLayer) {
        let service = layer.layer(service_fn(|_: Request<_>| async {
            Ok::<_, Infallible>(Response::new(()))
        }));
        let request = Request::get("http://example.test/").body(String::new());
        service.oneshot(request.unwrap()).await.unwrap();
    }

    /// The handles are registered on the first request, with the recorder of that moment,
    /// and kept: no registry lookup per request.
    #[tokio::test(start_paused = true)]
    async fn metric_handles_are_registered_on_the_first_request_and_kept() {
        // Built before any recorder exists, as an application may do.
        let layer = RetryLayer::new();

        let first = DebuggingRecorder::new();
        let first_snapshot = first.snapshotter();
        let guard = metrics::set_default_local_recorder(&first);
        send(&layer).await;
        send(&layer).await;
        drop(guard);
        assert_eq!(requests_total(&first_snapshot), Some(2));

        // A recorder installed after the first request does not see the kept handles.
        let second = DebuggingRecorder::new();
        let second_snapshot = second.snapshotter();
        let _guard = metrics::set_default_local_recorder(&second);
        send(&layer).await;
        // (The debugging recorder reports a counter's increments since its last snapshot.)
        assert_eq!(requests_total(&first_snapshot), Some(1));
        assert_eq!(requests_total(&second_snapshot), None);

        // A layer built anew registers with the recorder of its own first request.
        send(&RetryLayer::new()).await;
        assert_eq!(requests_total(&second_snapshot), Some(1));
    }

    /// An inner service that counts its clones.
    struct CountClones(Arc<AtomicUsize>);

    impl Clone for CountClones {
        fn clone(&self) -> Self {
            self.0.fetch_add(1, Ordering::Relaxed);
            Self(Arc::clone(&self.0))
        }
    }

    impl<B> Service<Request<B>> for CountClones {
        type Response = Response<()>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response<()>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<B>) -> Self::Future {
            std::future::ready(Ok(Response::new(())))
        }
    }

    /// A request that may not be retried (a `POST` without `Idempotency-Key`, or any request
    /// with retries off) costs no clone of the inner service; one that may be retried costs
    /// one, kept for its retries.
    #[tokio::test]
    async fn the_inner_service_is_cloned_only_for_a_request_that_may_be_retried() {
        let clones = Arc::new(AtomicUsize::new(0));
        let mut retry = RetryLayer::new().layer(CountClones(Arc::clone(&clones)));
        let mut send = async |method: http::Method| {
            let request = Request::builder()
                .method(method)
                .uri("http://example.test/");
            let request = request.body(String::new()).unwrap();
            ServiceExt::<Request<String>>::ready(&mut retry)
                .await
                .unwrap();
            retry.call(request).await.unwrap();
        };
        send(http::Method::POST).await;
        assert_eq!(clones.load(Ordering::Relaxed), 0);
        send(http::Method::GET).await;
        assert_eq!(clones.load(Ordering::Relaxed), 1);

        let mut once = RetryLayer::builder()
            .max_attempts(1)
            .build()
            .unwrap()
            .layer(CountClones(Arc::clone(&clones)));
        let request = Request::get("http://example.test/").body(String::new());
        ServiceExt::<Request<String>>::ready(&mut once)
            .await
            .unwrap();
        once.call(request.unwrap()).await.unwrap();
        assert_eq!(
            clones.load(Ordering::Relaxed),
            1,
            "max_attempts(1) never retries"
        );
    }
}
