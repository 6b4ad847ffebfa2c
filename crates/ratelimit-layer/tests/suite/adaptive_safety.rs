//! The adaptive limit where a production server meets it first (issue 23, finding 3): a
//! fresh process, health checks, a probe whose requests an outer timeout drops, and a panic
//! while a window closes. Paused tokio time.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use http::request::Parts;
use http::{Request, Response, StatusCode};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use ratelimit_layer::AdaptiveLimitLayer;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tower::{Layer, ServiceExt, service_fn};

/// A handler that takes `ms` milliseconds (read at each call).
fn taking(
    ms: Arc<AtomicU64>,
) -> impl tower::Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    service_fn(move |_: Request<()>| {
        let ms = ms.load(Ordering::Relaxed);
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, Infallible>(Response::new(()))
        }
    })
}

/// The trial: a fresh layer with every default in front of a 100 ms handler, 40
/// requests at once and 40 more every 100 ms. Before the fix, 380 of the first 400 were
/// answered `503` while the limit sat at 3 for about 2.5 s. It starts at 20 and grows from
/// its first window: the first three batches lose their second half, then the limit has
/// grown past the demand.
#[tokio::test(start_paused = true)]
async fn a_fresh_limit_takes_a_burst_above_its_initial_limit_within_half_a_second() {
    let layer = AdaptiveLimitLayer::new();
    let service = layer.layer(taking(Arc::new(AtomicU64::new(100))));
    let mut batches = Vec::new();
    for _ in 0..10 {
        let mut batch = JoinSet::new();
        for _ in 0..40 {
            batch.spawn(service.clone().oneshot(Request::new(())));
        }
        batches.push(batch);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut rejected_per_batch = Vec::new();
    for mut batch in batches {
        let mut rejected = 0;
        while let Some(done) = batch.join_next().await {
            let status = done.unwrap().unwrap().status();
            assert!(status == StatusCode::OK || status == StatusCode::SERVICE_UNAVAILABLE);
            rejected += usize::from(status == StatusCode::SERVICE_UNAVAILABLE);
        }
        rejected_per_batch.push(rejected);
    }
    let rejected: usize = rejected_per_batch.iter().sum();
    eprintln!("rejected per batch of 40: {rejected_per_batch:?}");
    assert!(rejected <= 100, "{rejected} of 400: {rejected_per_batch:?}");
    assert!(
        rejected_per_batch[6..].iter().all(|&r| r == 0),
        "{rejected_per_batch:?}"
    );
    assert!(layer.status().limit >= 40, "{:?}", layer.status());
}

/// A seeded baseline tracks from the first request: the same burst, nothing rejected
/// after the first window (the limit grows by the tolerance and `sqrt(L)` per window).
#[tokio::test(start_paused = true)]
async fn a_seeded_baseline_needs_no_first_measurement() {
    let layer = AdaptiveLimitLayer::builder()
        .baseline(Duration::from_millis(100))
        .initial_limit(40)
        .build()
        .unwrap();
    let service = layer.layer(taking(Arc::new(AtomicU64::new(100))));
    let mut all = JoinSet::new();
    for _ in 0..10 {
        for _ in 0..40 {
            all.spawn(service.clone().oneshot(Request::new(())));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while let Some(done) = all.join_next().await {
        assert_eq!(done.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(layer.status().baseline, Some(Duration::from_millis(100)));
}

/// Health checks bypass the limit: answered while the limit is full, holding no slot.
#[tokio::test(start_paused = true)]
async fn exempt_routes_are_never_rejected_and_hold_no_slot() {
    let release = Arc::new(Notify::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = AdaptiveLimitLayer::builder()
        .initial_limit(3)
        .exempt(|parts: &Parts| parts.uri.path() == "/healthz")
        .build()
        .unwrap();
    let (r, c) = (Arc::clone(&release), Arc::clone(&calls));
    let service = layer.layer(service_fn(move |req: Request<()>| {
        let release = Arc::clone(&r);
        c.fetch_add(1, Ordering::SeqCst);
        async move {
            if req.uri().path() == "/api" {
                release.notified().await;
            }
            Ok::<_, Infallible>(Response::new(()))
        }
    }));
    let get = |path: &str| Request::get(path).body(()).unwrap();
    let mut held = JoinSet::new();
    for _ in 0..3 {
        held.spawn(service.clone().oneshot(get("/api")));
    }
    tokio::task::yield_now().await;
    assert_eq!(layer.status().in_flight, 3);
    let full = service.clone().oneshot(get("/api")).await.unwrap();
    assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
    for _ in 0..20 {
        let health = service.clone().oneshot(get("/healthz")).await.unwrap();
        assert_eq!(health.status(), StatusCode::OK);
    }
    assert_eq!(layer.status().in_flight, 3, "health checks hold no slot");
    assert_eq!(calls.load(Ordering::SeqCst), 23);
    release.notify_waiters();
    while let Some(done) = held.join_next().await {
        assert_eq!(done.unwrap().unwrap().status(), StatusCode::OK);
    }
}

/// A probe whose requests an outer timeout drops: none completes, so before the fix the
/// probe never ended and the limit stayed at its probe level for good. It ends at its
/// deadline (5 s), and the limit before it comes back.
#[tokio::test(start_paused = true)]
async fn a_probe_whose_requests_never_complete_ends_at_its_deadline() {
    let latency = Arc::new(AtomicU64::new(10));
    let layer = AdaptiveLimitLayer::builder()
        .baseline(Duration::from_millis(10))
        .initial_limit(40)
        .min_samples(10)
        .probe_samples(10)
        .build()
        .unwrap();
    let service = layer.layer(taking(Arc::clone(&latency)));
    // The service becomes ten times slower; a 50 ms timeout above drops every request,
    // whose running time (over the baseline's tolerance) brings the limit down to its floor,
    // where a probe starts.
    latency.store(100, Ordering::Relaxed);
    let mut probe_started = None;
    for i in 0..2_000u32 {
        let service = service.clone();
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(Duration::from_millis(50), service.oneshot(Request::new(())))
                    .await;
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        if layer.status().probing {
            probe_started = Some(i);
            break;
        }
    }
    let started = probe_started.expect("a probe started");
    let probing = layer.status();
    assert_eq!(probing.limit, 3, "{probing:?} after {started} requests");
    // The probe's requests are all dropped: it cannot complete. The load goes on.
    let deadline = AdaptiveLimitLayer::DEFAULT_PROBE_TIMEOUT;
    let mut ended_after = None;
    for step in 0..1_400u32 {
        let service = service.clone();
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(Duration::from_millis(50), service.oneshot(Request::new(())))
                    .await;
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        if !layer.status().probing {
            ended_after = Some(Duration::from_millis(5 * u64::from(step + 1)));
            break;
        }
    }
    let ended_after = ended_after.expect("the probe ended");
    assert!(
        ended_after >= deadline && ended_after <= deadline + Duration::from_secs(1),
        "ended after {ended_after:?}"
    );
    assert_eq!(layer.status().baseline, Some(Duration::from_millis(10)));
}

/// Regression (issue 23, finding 3): a panic while a window closed (here, a metrics recorder
/// that panics once) poisoned the controller's lock, and every later window gave up on it:
/// the limit froze for the life of the process. The next window closes as usual.
#[test]
fn a_panic_while_a_window_closes_does_not_freeze_the_limit() {
    let recorder = PanicsOnce::default();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let latency = Arc::new(AtomicU64::new(10));
        let layer = AdaptiveLimitLayer::builder()
            .min_samples(10)
            .probe_samples(10)
            .initial_limit(50)
            .build()
            .unwrap();
        let service = layer.layer(taking(Arc::clone(&latency)));
        // The first window closes at the tenth request: the recorder panics then.
        let mut panicked = 0;
        for _ in 0..10 {
            let done = tokio::spawn(service.clone().oneshot(Request::new(()))).await;
            panicked += usize::from(done.is_err_and(|e| e.is_panic()));
        }
        assert_eq!(
            panicked, 1,
            "the recorder panicked once, in the window's close"
        );
        assert!(recorder.panicked.load(Ordering::Relaxed));
        // The service slows down tenfold: the next window must halve the limit.
        latency.store(100, Ordering::Relaxed);
        for _ in 0..20 {
            service.clone().oneshot(Request::new(())).await.unwrap();
        }
        let limit = layer.status().limit;
        assert!(limit < 50, "the limit moved on: {limit}");
    });
}

/// A recorder whose adaptive-limit gauge panics the second time it is set (the first set
/// is at the layer's first request, outside any lock; the second as a window closes).
#[derive(Default)]
struct PanicsOnce {
    sets: Arc<AtomicUsize>,
    panicked: Arc<AtomicBool>,
}

struct PanickingGauge {
    sets: Arc<AtomicUsize>,
    panicked: Arc<AtomicBool>,
}

impl metrics::GaugeFn for PanickingGauge {
    fn increment(&self, _: f64) {}
    fn decrement(&self, _: f64) {}
    fn set(&self, _: f64) {
        if self.sets.fetch_add(1, Ordering::Relaxed) == 1 {
            self.panicked.store(true, Ordering::Relaxed);
            panic!("a recorder that panics");
        }
    }
}

impl Recorder for PanicsOnce {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        if key.name() == "ratelimit_layer_adaptive_limit" {
            Gauge::from_arc(Arc::new(PanickingGauge {
                sets: Arc::clone(&self.sets),
                panicked: Arc::clone(&self.panicked),
            }))
        } else {
            Gauge::noop()
        }
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
