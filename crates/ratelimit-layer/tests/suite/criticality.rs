//! Shedding from the bottom through the layer: the request's `Criticality` (from its
//! extensions), the share held back from the lower levels while a higher one is active,
//! the answer to a request refused for it, keyed limits, and the `criticality` label.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use overload_signal::criticality::Reserves;
use overload_signal::protocol::Criticality::{self, Critical, Sheddable, SheddablePlus};
use overload_signal::protocol::{RATELIMIT, RATELIMIT_POLICY};
use overload_signal::signal::{Rejection, RejectionKind};
use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::{FixedWindow, Limiter, RateLimitLayer, SlidingWindow, TokenBucket};
use tower::{Layer, Service, ServiceExt, service_fn};

fn service()
-> impl Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone {
    service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) })
}

/// A request of `level` (`None`: no `Criticality` in its extensions), with header `key`.
fn request(level: Option<Criticality>, key: &str) -> Request<String> {
    let mut request = Request::builder()
        .header("x-api-key", key)
        .body(String::new())
        .unwrap();
    if let Some(level) = level {
        request.extensions_mut().insert(level);
    }
    request
}

async fn status<S>(svc: &S, level: Criticality) -> StatusCode
where
    S: Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone,
{
    svc.clone()
        .oneshot(request(Some(level), "a"))
        .await
        .unwrap()
        .status()
}

/// Through the layer, for each algorithm: ten sheddable requests every millisecond beside
/// one critical request every 100 ms (10 a second, a tenth of the rate): no critical request
/// is refused, the flood is.
async fn flood<L: Limiter>(limiter: L) {
    let clock = FakeClock::new();
    let svc = RateLimitLayer::builder(limiter)
        .clock(clock.clone())
        .build()
        .unwrap()
        .layer(service());
    let (mut shed_ok, mut shed_refused) = (0, 0);
    for ms in 0..3_000u64 {
        for _ in 0..10 {
            match status(&svc, Sheddable).await {
                StatusCode::OK => shed_ok += 1,
                StatusCode::TOO_MANY_REQUESTS => shed_refused += 1,
                other => panic!("{other}"),
            }
        }
        if ms % 100 == 0 {
            assert_eq!(status(&svc, Critical).await, StatusCode::OK, "at {ms} ms");
        }
        clock.advance(Duration::from_millis(1));
    }
    assert!(
        shed_ok > 0 && shed_refused > 25_000,
        "{shed_ok} {shed_refused}"
    );
}

#[tokio::test]
async fn a_sheddable_flood_never_refuses_critical_requests_under_the_rate() {
    flood(TokenBucket::new(100).unwrap()).await;
    flood(FixedWindow::new(100).unwrap()).await;
    flood(SlidingWindow::new(100).unwrap()).await;
}

#[tokio::test]
async fn a_request_without_a_level_is_critical() {
    let svc = RateLimitLayer::builder(TokenBucket::new(10).unwrap())
        .clock(FakeClock::new())
        .build()
        .unwrap()
        .layer(service());
    // Sheddable seen; then requests without a level take the bucket down to zero, past the
    // sheddable share (5), as critical ones do.
    assert_eq!(status(&svc, Sheddable).await, StatusCode::OK);
    for _ in 0..9 {
        let response = svc.clone().oneshot(request(None, "a")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn a_refusal_for_the_share_is_a_rate_limit_rejection_with_an_honest_retry_after() {
    let clock = FakeClock::new();
    // 1 per second, bursts of 4: sheddable may not take the last 2 while critical is seen.
    let svc = RateLimitLayer::builder(TokenBucket::builder(1).burst(4).build().unwrap())
        .clock(clock.clone())
        .name("api")
        .build()
        .unwrap()
        .layer(service());
    assert_eq!(status(&svc, Critical).await, StatusCode::OK);
    assert_eq!(status(&svc, Sheddable).await, StatusCode::OK);
    // 2 left: a sheddable request would leave 1.
    let response = svc
        .clone()
        .oneshot(request(Some(Sheddable), "a"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");
    assert_eq!(response.headers()[RATELIMIT_POLICY], "\"api\";q=4;w=4");
    assert_eq!(response.headers()[RATELIMIT], "\"api\";r=2;t=2");
    let marker = response.extensions().get::<Rejection>().unwrap();
    assert_eq!(marker.kind(), RejectionKind::RateLimited);
    assert_eq!(marker.retry_after(), Some(Duration::from_secs(1)));
    // Just before the time it gave: still refused; at it: admitted.
    clock.advance(Duration::from_millis(999));
    assert_eq!(status(&svc, Sheddable).await, StatusCode::TOO_MANY_REQUESTS);
    clock.advance(Duration::from_millis(1));
    assert_eq!(status(&svc, Sheddable).await, StatusCode::OK);
    // Critical still has its 2.
    assert_eq!(status(&svc, Critical).await, StatusCode::OK);
    assert_eq!(status(&svc, Critical).await, StatusCode::OK);
    assert_eq!(status(&svc, Critical).await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_cost_the_share_leaves_no_room_for_waits_for_the_higher_levels_to_go_quiet() {
    let clock = FakeClock::new();
    // 10 per second, bursts of 10, each request costing 6: sheddable (5 held back) never
    // passes while critical is active.
    let svc = RateLimitLayer::builder(TokenBucket::new(10).unwrap())
        .clock(clock.clone())
        .cost(6)
        .build()
        .unwrap()
        .layer(service());
    assert_eq!(status(&svc, Critical).await, StatusCode::OK);
    clock.advance(Duration::from_secs(1));
    let response = svc
        .clone()
        .oneshot(request(Some(Sheddable), "a"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    // Not "0" nor the bucket's refill time: the window of RecentLevels.
    assert_eq!(response.headers()[http::header::RETRY_AFTER], "10");
    // Critical gone quiet for the window: admitted.
    clock.advance(Duration::from_secs(10));
    assert_eq!(status(&svc, Sheddable).await, StatusCode::OK);
}

/// One level's traffic, and any traffic with `Reserves::none()`, is decided as without
/// criticality: the same answers, request by request.
#[tokio::test]
async fn one_level_or_no_reserves_is_decided_as_before() {
    async fn answers(reserves: Option<Reserves>, levels: &[Option<Criticality>]) -> Vec<u16> {
        let clock = FakeClock::new();
        let mut builder =
            RateLimitLayer::builder(TokenBucket::builder(5).burst(3).build().unwrap())
                .clock(clock.clone());
        if let Some(reserves) = reserves {
            builder = builder.reserves(reserves);
        }
        let svc = builder.build().unwrap().layer(service());
        let mut out = Vec::new();
        for (i, level) in levels.iter().enumerate() {
            let response = svc.clone().oneshot(request(*level, "a")).await.unwrap();
            out.push(response.status().as_u16());
            clock.advance(Duration::from_millis(if i % 7 == 0 { 400 } else { 30 }));
        }
        out
    }
    let sheddable = vec![Some(Sheddable); 200];
    let blind = answers(Some(Reserves::none()), &sheddable).await;
    assert!(blind.contains(&200) && blind.contains(&429));
    assert_eq!(answers(None, &sheddable).await, blind);
    assert_eq!(answers(None, &[None; 200]).await, blind);
    let mixed: Vec<_> = (0..200)
        .map(|i| Some([Sheddable, Critical, SheddablePlus][i % 3]))
        .collect();
    assert_eq!(answers(Some(Reserves::none()), &mixed).await, blind);
    assert_ne!(
        answers(None, &mixed).await,
        blind,
        "the default reserves shed"
    );
}

#[tokio::test]
async fn a_keyed_limit_holds_back_on_every_key_while_a_higher_level_is_active_on_any() {
    let clock = FakeClock::new();
    let svc = RateLimitLayer::builder(TokenBucket::new(10).unwrap())
        .clock(clock.clone())
        .key_by_header(http::HeaderName::from_static("x-api-key"))
        .build()
        .unwrap()
        .layer(service());
    let send = |level, key: &'static str| {
        let svc = svc.clone();
        async move {
            svc.oneshot(request(Some(level), key))
                .await
                .unwrap()
                .status()
        }
    };
    // Sheddable alone takes key b's whole bucket.
    for _ in 0..10 {
        assert_eq!(send(Sheddable, "b").await, StatusCode::OK);
    }
    assert_eq!(send(Sheddable, "b").await, StatusCode::TOO_MANY_REQUESTS);
    // Critical on key a: sheddable on key c now stops at 5 left.
    assert_eq!(send(Critical, "a").await, StatusCode::OK);
    for _ in 0..5 {
        assert_eq!(send(Sheddable, "c").await, StatusCode::OK);
    }
    assert_eq!(send(Sheddable, "c").await, StatusCode::TOO_MANY_REQUESTS);
    // Each key's own bucket: critical on key c takes the 5 left.
    for _ in 0..5 {
        assert_eq!(send(Critical, "c").await, StatusCode::OK);
    }
    assert_eq!(send(Critical, "c").await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn the_request_counters_carry_the_criticality() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // NOTE: the test runtime is single-threaded, so the thread-local recorder sees every
    // request.
    let _guard = metrics::set_default_local_recorder(&recorder);
    let clock = FakeClock::new();
    let svc = RateLimitLayer::builder(TokenBucket::new(4).unwrap())
        .clock(clock.clone())
        .name("api")
        .build()
        .unwrap()
        .layer(service());
    // Critical takes 1 of 4; sheddable then 1 (down to its held-back 2) and is refused
    // twice; critical takes the last 2, then is refused once.
    assert_eq!(status(&svc, Critical).await, StatusCode::OK);
    for _ in 0..3 {
        status(&svc, Sheddable).await;
    }
    for _ in 0..3 {
        status(&svc, Critical).await;
    }
    // NOTE: past the first tick, which adds the admissions counted per core.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut admitted = Vec::new();
    let mut rejected = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let label = |name| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        };
        let DebugValue::Counter(n) = value else {
            continue;
        };
        match key.name() {
            "ratelimit_layer_requests_admitted_total" => {
                admitted.push((label("criticality").unwrap(), n));
            }
            "ratelimit_layer_requests_rejected_total"
                if label("key_class").unwrap() == "global" =>
            {
                rejected.push((label("criticality").unwrap(), n));
            }
            _ => {}
        }
    }
    admitted.sort();
    rejected.sort();
    let every = |counts: [u64; 4]| {
        let mut v: Vec<_> = Criticality::ALL
            .iter()
            .zip(counts)
            .map(|(level, n)| (level.as_str().to_owned(), n))
            .collect();
        v.sort();
        v
    };
    // ALL is sheddable, sheddable-plus, critical, critical-plus.
    assert_eq!(admitted, every([1, 0, 3, 0]));
    assert_eq!(rejected, every([2, 0, 1, 0]));
}
