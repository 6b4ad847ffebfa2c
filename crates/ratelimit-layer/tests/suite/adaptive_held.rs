//! The adaptive limit and requests that take long, or never end (issue 30, finding 5):
//! released from the limit after their bound, counted once, and bounded in number by the
//! maximum limit. Paused tokio time.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use ratelimit_layer::AdaptiveLimitLayer;
use tokio::sync::{Notify, Semaphore};
use tower::{Layer, Service, ServiceExt, service_fn};

/// SplitMix64: the service times' generator, seeded per request so the runs repeat.
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// An exponential service time of mean 50 ms for request `n` of run `seed`, to the
/// millisecond.
fn service_time(seed: u64, n: u64) -> Duration {
    let u =
        (splitmix(n ^ seed.wrapping_mul(0x1234_5678_9ABC_DEF1)) >> 11) as f64 / (1u64 << 53) as f64;
    Duration::from_millis((-(1.0 - u).ln() * 50.0).round() as u64)
}

/// A small service: `/api` takes an exponential 50 ms on one of two workers (FIFO), so it
/// serves 40 a second; `/hang` never answers and holds no worker (an upload whose body
/// trickles in, a long poll, a call to a dependency that never answers).
fn small_service(
    seed: u64,
) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send> + Clone {
    let workers = Arc::new(Semaphore::new(2));
    let n = Arc::new(AtomicU64::new(0));
    service_fn(move |request: Request<()>| {
        let workers = Arc::clone(&workers);
        let took = service_time(seed, n.fetch_add(1, Ordering::Relaxed));
        let hang = request.uri().path() == "/hang";
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            let _worker = workers.acquire().await.unwrap();
            tokio::time::sleep(took).await;
            Ok::<_, Infallible>(Response::new(()))
        }
    })
}

/// How the requests that never end arrive.
#[derive(Clone, Copy, Debug)]
enum Arrival {
    AtOnce,
    OverASecond,
}

/// What the `/api` route saw after the requests that never end arrived.
#[derive(Debug)]
struct Figures {
    /// `/api` rejections per second from the arrival on, of 20 a second.
    per_second: Vec<u64>,
    /// The limit when they arrived.
    limit_before: usize,
    /// `/hang` requests admitted (the others were rejected at once), and released.
    hung: u64,
    released: usize,
}

impl Figures {
    fn rejected(&self) -> u64 {
        self.per_second.iter().sum()
    }
}

/// `/api` requests a second: half of what the small service serves.
const RATE: u64 = 20;
/// How long the load goes on after the requests that never end arrive.
const SECONDS: u64 = 60;

/// 20 `/api` requests a second (half of what the service serves, one in flight on
/// average), for 10 s to measure the baseline; then 20 `/hang` requests arrive, and the
/// same load goes on for 60 s.
async fn twenty_never_ending(seed: u64, arrival: Arrival) -> Figures {
    let layer = AdaptiveLimitLayer::builder().seed(3).build().unwrap();
    let service = layer.layer(small_service(seed));
    let hung = Arc::new(AtomicU64::new(0));
    let per_second = Arc::new(std::sync::Mutex::new(vec![0; SECONDS as usize]));
    let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE as u32);
    let mut limit_before = 0;
    let hang = |service: &ratelimit_layer::AdaptiveLimit<_>| {
        let mut call = Box::pin(
            service
                .clone()
                .oneshot(Request::get("/hang").body(()).unwrap()),
        );
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        // Admitted (pending for ever) or rejected (ready at once).
        if call.as_mut().poll(&mut cx).is_pending() {
            hung.fetch_add(1, Ordering::Relaxed);
            drop(tokio::spawn(call));
        }
    };
    for i in 0..RATE * (10 + SECONDS) {
        tick.tick().await;
        let since = i.checked_sub(10 * RATE);
        match (arrival, since) {
            (Arrival::AtOnce, Some(0)) => {
                limit_before = layer.status().limit;
                for _ in 0..20 {
                    hang(&service);
                }
            }
            // One every 50 ms, with the 20 a second of `/api` in between.
            (Arrival::OverASecond, Some(s)) if s < RATE => {
                if s == 0 {
                    limit_before = layer.status().limit;
                }
                hang(&service);
            }
            _ => {}
        }
        let api = service
            .clone()
            .oneshot(Request::get("/api").body(()).unwrap());
        let per_second = Arc::clone(&per_second);
        tokio::spawn(async move {
            let status = api.await.unwrap().status();
            if let Some(since) = since {
                assert!(
                    status == StatusCode::OK || status == StatusCode::SERVICE_UNAVAILABLE,
                    "{status}"
                );
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    per_second.lock().unwrap()[(since / RATE) as usize] += 1;
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let per_second = per_second.lock().unwrap().clone();
    Figures {
        per_second,
        limit_before,
        hung: hung.load(Ordering::Relaxed),
        released: layer.status().released,
    }
}

/// Regression (issue 30, finding 5): requests that never complete pinned the adaptive
/// limit. Its windows closed only when requests completed, so 20 requests that never ended
/// (here on a small service whose limit sits near its initial 20) took every slot, nothing
/// completed any more, and every other request got `503`, for good: before the fix, 1200
/// of 1200 `/api` requests in the minute after they arrived at once (seed 0), 1182 when they
/// arrived over a second.
///
/// Now a window whose limit is held full while nothing completes closes on the layer's tick
/// (if the requests completed before show the service fine with the limit in use, the limit
/// grows), and the requests held past their bound (1 s here: ten times the target latency,
/// at its floor) are released, between one and two bounds after they were admitted.
///
/// The issue asks for at most 1 % of `/api` rejected. That holds when the window closed
/// on time has samples to grow the limit on; when the 20 take every slot right after a
/// window closed, nothing can be learnt until they are released, and `/api` is rejected
/// until then: over 40 seeds, at once, 18 runs lose at most 4 requests of 1200 and 22 lose
/// 29 to 41 (2.4 to 3.4 %); over a second, 28 runs lose at most 8 and 12 lose 9 to 37 (at
/// most 3.1 %). What is asserted is what the release guarantees, for 12 seeds: `/api` is
/// rejected only until twice the bound and a tick after the last arrival (its first three
/// seconds: at most 2.1 s of 20 a second, 42 requests), and after that no more than the
/// limit's own noise at this low a rate (1 %); every admitted `/hang` request is released.
#[tokio::test(start_paused = true)]
async fn requests_that_never_complete_do_not_pin_the_limit() {
    let mut totals = Vec::new();
    for seed in 0..12 {
        for arrival in [Arrival::AtOnce, Arrival::OverASecond] {
            let figures = twenty_never_ending(seed, arrival).await;
            let pinned: u64 = figures.per_second[..3].iter().sum();
            let after: u64 = figures.per_second[3..].iter().sum();
            assert!(
                figures.limit_before <= 20,
                "seed {seed}, {arrival:?}: the finding's case is a limit the 20 fill: {figures:?}"
            );
            assert!(
                pinned <= 42,
                "seed {seed}, {arrival:?}: {pinned} rejected before the release: {figures:?}"
            );
            assert!(
                after * 100 <= RATE * (SECONDS - 3),
                "seed {seed}, {arrival:?}: {after} rejected after the release: {figures:?}"
            );
            assert_eq!(
                figures.released as u64, figures.hung,
                "seed {seed}, {arrival:?}: every admitted request that never ends is released"
            );
            totals.push((seed, arrival, figures.rejected()));
        }
    }
    eprintln!("/api rejected of 1200, by seed and arrival: {totals:?}");
}

/// A request in flight past its bound is released once: its slot comes back, it is counted
/// in the `held` metric and in `Status::released`, and its completion, later, counts
/// nothing (no slot given back twice).
#[tokio::test(start_paused = true)]
async fn a_held_request_is_released_once_and_its_completion_counts_nothing() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let release = Arc::new(Notify::new());
    let r = Arc::clone(&release);
    let layer = AdaptiveLimitLayer::builder()
        .initial_limit(3)
        .release_after(Duration::from_secs(2))
        .build()
        .unwrap();
    let service = layer.layer(service_fn(move |_: Request<()>| {
        let release = Arc::clone(&r);
        async move {
            release.notified().await;
            Ok::<_, Infallible>(Response::new(()))
        }
    }));
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tokio::spawn(service.clone().oneshot(Request::new(()))));
    }
    tokio::task::yield_now().await;
    assert_eq!(layer.status().in_flight, 3);
    let full = service.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Not before the bound (2 s), at the latest twice the bound and a tick after.
    tokio::time::sleep(Duration::from_millis(1_950)).await;
    assert_eq!(layer.status().in_flight, 3, "{:?}", layer.status());
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let status = layer.status();
    assert_eq!((status.in_flight, status.released), (0, 3), "{status:?}");
    // Three slots again, for new requests.
    for _ in 0..3 {
        held.push(tokio::spawn(service.clone().oneshot(Request::new(()))));
    }
    tokio::task::yield_now().await;
    assert_eq!(layer.status().in_flight, 3);
    // All six complete: the three released count nothing more, the three others give their
    // slots back.
    release.notify_waiters();
    for h in held {
        assert_eq!(h.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let status = layer.status();
    assert_eq!((status.in_flight, status.released), (0, 0), "{status:?}");
    let held_total = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, ..)| key.key().name() == "ratelimit_layer_adaptive_held_total")
        .map(|(.., value)| value);
    assert_eq!(held_total, Some(DebugValue::Counter(3)));
}

/// Released requests still run: with those in flight they never exceed the maximum limit,
/// so a service that never answers holds at most `max_limit` requests, however long the
/// load lasts.
#[tokio::test(start_paused = true)]
async fn released_requests_count_toward_the_maximum_limit() {
    let layer = AdaptiveLimitLayer::builder()
        .initial_limit(4)
        .max_limit(10)
        .release_after(Duration::from_secs(1))
        .build()
        .unwrap();
    let called = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&called);
    let service = layer.layer(service_fn(move |_: Request<()>| {
        c.fetch_add(1, Ordering::Relaxed);
        std::future::pending::<Result<Response<()>, Infallible>>()
    }));
    let mut admitted = 0;
    for _ in 0..600 {
        let mut call = Box::pin(service.clone().oneshot(Request::new(())));
        let waker = std::task::Waker::noop();
        if call
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_pending()
        {
            admitted += 1;
            tokio::spawn(call);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = layer.status();
    assert_eq!(admitted, 10, "{status:?}");
    assert_eq!(called.load(Ordering::Relaxed), 10);
    assert_eq!(status.in_flight + status.released, 10, "{status:?}");
}

/// The slow tail of a healthy service is not released: a request of 900 ms among requests
/// of 50 ms (eighteen times their latency, under the 1 s floor of the bound) keeps its slot
/// to the end, and the limit counts it as a sample when it completes.
#[tokio::test(start_paused = true)]
async fn a_slow_request_under_the_bound_is_not_released() {
    let layer = AdaptiveLimitLayer::builder()
        .baseline(Duration::from_millis(50))
        .build()
        .unwrap();
    let n = Arc::new(AtomicU64::new(0));
    let service = layer.layer(service_fn(move |_: Request<()>| {
        let slow = n.fetch_add(1, Ordering::Relaxed) % 100 == 7;
        async move {
            let ms = if slow { 900 } else { 50 };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, Infallible>(Response::new(()))
        }
    }));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..1_000 {
        tasks.spawn(service.clone().oneshot(Request::new(())));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(layer.status().released, 0);
    }
    while let Some(done) = tasks.join_next().await {
        assert_eq!(done.unwrap().unwrap().status(), StatusCode::OK);
    }
    let status = layer.status();
    assert_eq!((status.in_flight, status.released), (0, 0), "{status:?}");
}
