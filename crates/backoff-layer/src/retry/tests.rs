//! The layer's metric handles and its clones of the inner service.

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
            DebugValue::Counter(n) if key.key().name() == super::telemetry::REQUESTS => Some(n),
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

/// A layer makes its own throttle, named after it, unless given one (which keeps its own
/// name and is shared) or told to have none; both is refused.
#[test]
fn the_throttle_can_be_given_shared_or_turned_off() {
    let debug = |layer: &RetryLayer| format!("{layer:?}");
    let own = RetryLayer::builder().name("reads").build().unwrap();
    assert!(
        debug(&own).contains("throttle: Some(Throttle { name: \"reads\""),
        "{own:?}"
    );
    let off = RetryLayer::builder().no_throttle().build().unwrap();
    assert!(debug(&off).contains("throttle: None"), "{off:?}");
    let mine = crate::throttle::Throttle::builder()
        .name("inventory")
        .build()
        .unwrap();
    let given = RetryLayer::builder()
        .name("reads")
        .throttle(mine.clone())
        .build()
        .unwrap();
    assert!(
        debug(&given).contains("throttle: Some(Throttle { name: \"inventory\""),
        "{given:?}"
    );
    // Regression (issue 30, review item D3): the last of `throttle` and `no_throttle` won
    // silently; so did the last of `deadline` and `no_deadline`.
    let both = RetryLayer::builder()
        .no_throttle()
        .throttle(mine.clone())
        .build()
        .unwrap_err();
    assert_eq!(both.field(), "throttle");
    assert_eq!(both.kind(), crate::ConfigErrorKind::Conflict);
    assert_eq!(
        both.to_string(),
        "throttle and no_throttle were both called: keep one"
    );
    let both = RetryLayer::builder()
        .throttle(mine)
        .no_throttle()
        .build()
        .unwrap_err();
    assert_eq!(both.field(), "throttle");
    let both = RetryLayer::builder()
        .deadline(std::time::Duration::from_secs(1))
        .no_deadline()
        .build()
        .unwrap_err();
    assert_eq!(both.field(), "deadline");
}
