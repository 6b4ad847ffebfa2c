//! Shedding from the bottom with a limit kept in Redis: the held-back share passed to the
//! script (one round trip), and the same rule in the local fallback while Redis is away.

mod redis_support;

use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics_util::debugging::DebuggingRecorder;
use overload_signal::protocol::Criticality::{self, Critical, Sheddable};
use ratelimit_layer::RateLimitLayer;
use ratelimit_layer::redis::testing::RedisServer;
use redis_support::{GENEROUS, Svc, header, hourly, ok, read, store};
use tower::{Layer, ServiceExt};

async fn send(svc: &Svc, level: Criticality) -> Response<String> {
    let mut request = Request::new(());
    request.extensions_mut().insert(level);
    svc.clone().oneshot(request).await.unwrap()
}

#[tokio::test]
async fn the_fleet_limit_holds_back_from_the_lower_levels_in_redis() {
    let server = RedisServer::start();
    // One an hour, bursts of 10: nothing comes back during the test. Sheddable may not take
    // the last 5 while critical is active.
    let svc = Svc::new(
        RateLimitLayer::builder(hourly(10))
            .redis(store(&server).await)
            .budget(GENEROUS)
            .build()
            .unwrap()
            .layer(ok()),
    );
    assert_eq!(send(&svc, Critical).await.status(), StatusCode::OK);
    for n in 0..4 {
        assert_eq!(send(&svc, Sheddable).await.status(), StatusCode::OK, "{n}");
    }
    let refused = send(&svc, Sheddable).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // One unit back, an hour per unit: the wait of a sheddable request, not of a critical one.
    let retry_after: u64 = header(&refused, &http::header::RETRY_AFTER)
        .parse()
        .unwrap();
    assert!((3_590..=3_600).contains(&retry_after), "{retry_after}");
    // Critical takes the 5 left, then is refused.
    for n in 0..5 {
        assert_eq!(send(&svc, Critical).await.status(), StatusCode::OK, "{n}");
    }
    assert_eq!(
        send(&svc, Critical).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // In Redis: 10 units taken in all (the TAT 10 hours ahead), nothing for the refusals.
    assert_eq!(server.command("EXISTS ratelimit:default:tb:g"), ":1");
}

#[tokio::test]
async fn the_local_fallback_holds_back_as_redis_does() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // NOTE: the test runtime is single-threaded, so the thread-local recorder sees every
    // request.
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let mut server = RedisServer::start();
    // A local share of a third: 10 of a burst of 30.
    let svc = Svc::new(
        RateLimitLayer::builder(hourly(30))
            .redis(store(&server).await)
            .local_share(1.0 / 3.0)
            .budget(Duration::from_millis(200))
            .build()
            .unwrap()
            .layer(ok()),
    );
    assert_eq!(send(&svc, Critical).await.status(), StatusCode::OK);
    server.stop();
    // Redis away: the local share (10) decides; critical has been seen, so sheddable stops
    // at 5 left of it.
    let mut admitted = 0;
    for _ in 0..10 {
        if send(&svc, Sheddable).await.status() == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5, "sheddable leaves half the local share");
    // Every one of them decided locally.
    assert_eq!(read(&snapshotter).fallbacks.iter().sum::<u64>(), 10);
    for n in 0..5 {
        assert_eq!(send(&svc, Critical).await.status(), StatusCode::OK, "{n}");
    }
    assert_eq!(
        send(&svc, Critical).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}
