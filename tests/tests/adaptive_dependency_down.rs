//! The adaptive limit and a dependency that is down (issue 30, finding 4): an axum router
//! under `OverloadProtectionLayer::new(AdaptiveLimitLayer)`, one route whose dependency is
//! down and one that never uses it. In process, under paused tokio time.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use backoff_layer::{ReplayBody, RetryLayer, is_overloaded};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{Empty, Full};
use overload_signal::protocol::{Protocol, is_stop_signal, stop_signal_response};
use ratelimit_layer::{AdaptiveLimitLayer, OverloadProtectionLayer};
use tokio::sync::Semaphore;
use tower::{Layer, ServiceExt, service_fn};

/// How `/dep`'s dependency being down shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Down {
    /// The handler answers `503` at once (its connection pool to the dependency is empty).
    Answers503,
    /// The handler passes on the dependency's stop signal.
    PassesTheStopSignal,
    /// The handler calls the dependency through `backoff-layer`'s retry layer; the
    /// dependency answers `503`, which the retry layer retries, then gives up on (or its
    /// throttle refuses to send): the propagation marks are raised, and the handler answers
    /// `503`.
    RetriedThen503,
    /// The same, and the dependency answers with the stop signal: the retry layer returns
    /// `Overloaded` and marks it; the handler answers with the stop signal.
    RetriedStopSignal,
}

/// `/ok`: 50 ms on one of 20 workers (400 a second at most), never touching the dependency.
/// `/dep`: 2 ms of work, then the dependency, which is down as `down` says.
fn app(down: Down, adaptive: AdaptiveLimitLayer) -> Router {
    let workers = Arc::new(Semaphore::new(20));
    let ok = move || {
        let workers = Arc::clone(&workers);
        async move {
            let _worker = workers.acquire().await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            "ok"
        }
    };
    let dependency = service_fn(move |_: Request<ReplayBody<Empty<Bytes>>>| async move {
        let response = if down == Down::RetriedStopSignal {
            stop_signal_response::<Full<Bytes>>(Protocol::Http)
        } else {
            let mut response = http::Response::new(Full::new(Bytes::from_static(b"down\n")));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
        };
        Ok::<_, Infallible>(response)
    });
    let client = RetryLayer::new().layer(dependency);
    let dep = move || {
        let client = client.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            match down {
                Down::Answers503 => {
                    (StatusCode::SERVICE_UNAVAILABLE, "dependency down\n").into_response()
                }
                Down::PassesTheStopSignal => stop_signal_response::<Body>(Protocol::Http),
                Down::RetriedThen503 | Down::RetriedStopSignal => {
                    let request = Request::get("http://dependency/")
                        .body(Empty::new())
                        .unwrap();
                    let call = client.oneshot(request);
                    match call.await {
                        Ok(response) if response.status().is_success() => "ok".into_response(),
                        Err(e) if is_overloaded(&*e) => {
                            stop_signal_response::<Body>(Protocol::Http)
                        }
                        Ok(_) | Err(_) => {
                            (StatusCode::SERVICE_UNAVAILABLE, "dependency down\n").into_response()
                        }
                    }
                }
            }
        }
    };
    Router::new()
        .route("/ok", get(ok))
        .route("/dep", get(dep))
        .layer(OverloadProtectionLayer::new(adaptive))
}

/// What the run saw once warmed up.
#[derive(Debug, Default)]
struct Seen {
    ok_sent: u64,
    ok_rejected: u64,
    dep: [u64; 2],
    /// The limit, each second.
    limits: Vec<usize>,
}

/// `/ok` at 200 a second (half of what its workers serve) and `/dep` at 400 a second, for 5 s
/// to warm up and 30 s measured.
async fn run(down: Down) -> Seen {
    const OK_RATE: u64 = 200;
    const WARM_UP: u64 = 5;
    const SECONDS: u64 = 30;
    let adaptive = AdaptiveLimitLayer::builder().seed(7).build().unwrap();
    let app = app(down, adaptive.clone());
    let ok_rejected = Arc::new(AtomicU64::new(0));
    let dep = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let mut seen = Seen::default();
    let peer: SocketAddr = ([192, 0, 2, 1], 40_000).into();
    let request = |path: &str| {
        let mut request = Request::get(path).body(Body::empty()).unwrap();
        request.extensions_mut().insert(peer);
        request
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1) / OK_RATE as u32);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..OK_RATE * (WARM_UP + SECONDS) {
        tick.tick().await;
        let measured = i >= OK_RATE * WARM_UP;
        if measured && i % OK_RATE == 0 {
            seen.limits.push(adaptive.status().limit);
        }
        let call = app.clone().oneshot(request("/ok"));
        let ok_rejected = Arc::clone(&ok_rejected);
        seen.ok_sent += u64::from(measured);
        tasks.spawn(async move {
            let response = call.await.unwrap();
            match response.status() {
                StatusCode::OK => {}
                StatusCode::SERVICE_UNAVAILABLE if measured => {
                    ok_rejected.fetch_add(1, Ordering::Relaxed);
                }
                StatusCode::SERVICE_UNAVAILABLE => {}
                other => panic!("/ok answered {other}"),
            }
        });
        for _ in 0..2 {
            let call = app.clone().oneshot(request("/dep"));
            let dep = Arc::clone(&dep);
            tasks.spawn(async move {
                let response = call.await.unwrap();
                // What `/dep` answered: the dependency's trouble, or the stop signal.
                let stop = is_stop_signal(response.headers());
                dep[usize::from(stop)].fetch_add(1, Ordering::Relaxed);
            });
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    seen.ok_rejected = ok_rejected.load(Ordering::Relaxed);
    seen.dep = [0, 1].map(|i| dep[i].load(Ordering::Relaxed));
    seen
}

/// Regression (issue 30, finding 4): the adaptive limit treated its handler's `503`s (and
/// the stop signal it passed on, and what a retry layer inside returned after giving up)
/// as its own overload: with a route whose dependency is down, the limit backed off by 0.9
/// at every window in which more than 10 % of the outcomes were those, and the healthy
/// route, which never uses that dependency, was shed with it. Before the fix, here, the
/// limit swung between 9 and 16 (under what `/ok`'s bursts need, held up only by `/ok`'s
/// own completions) and `/ok` lost 14 of its 6000 requests (36 behind the retry layer).
///
/// Now the handler's `503` is a latency sample, as any response (latency alone, as Envoy's
/// adaptive concurrency filter), and the stop signal, or anything after a downstream call
/// the retry layer marked, is left out: at half its capacity, `/ok` loses nothing, and the
/// limit stays where `/ok` needs it (29 to 42 here).
#[tokio::test(start_paused = true)]
async fn a_dependency_that_is_down_does_not_shed_the_routes_that_never_use_it() {
    for down in [
        Down::Answers503,
        Down::PassesTheStopSignal,
        Down::RetriedThen503,
        Down::RetriedStopSignal,
    ] {
        let seen = run(down).await;
        eprintln!("{down:?}: {seen:?}");
        assert_eq!(seen.ok_rejected, 0, "{down:?}: {seen:?}");
        // `/ok` keeps 10 in flight; the limit never fell near its floor (3).
        let lowest = seen.limits.iter().min().copied().unwrap_or_default();
        assert!(lowest >= 15, "{down:?}: {seen:?}");
        // And `/dep` did answer as its dependency made it.
        let stops = matches!(down, Down::PassesTheStopSignal | Down::RetriedStopSignal);
        assert!(seen.dep[usize::from(stops)] > 0, "{down:?}: {seen:?}");
    }
}
