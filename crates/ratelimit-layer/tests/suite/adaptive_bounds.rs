//! The adaptive limit's bounds changed while the layer serves.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use ratelimit_layer::{AdaptiveLimitLayer, ConfigErrorKind};
use tokio::sync::Notify;
use tower::{Layer, ServiceExt, service_fn};

#[tokio::test(start_paused = true)]
async fn new_bounds_clamp_the_limit_at_once_and_for_every_clone() {
    let release = Arc::new(Notify::new());
    let layer = AdaptiveLimitLayer::builder()
        .initial_limit(10)
        .build()
        .unwrap();
    let held = Arc::clone(&release);
    let service = layer.layer(service_fn(move |_: Request<()>| {
        let held = Arc::clone(&held);
        async move {
            held.notified().await;
            Ok::<_, Infallible>(Response::new(()))
        }
    }));
    // A clone of the layer changes the one limit: the maximum falls below the limit in
    // force, which falls with it.
    layer.clone().set_bounds(1, 4).unwrap();
    assert_eq!(layer.status().limit, 4);
    let mut pending = Vec::new();
    for _ in 0..4 {
        pending.push(tokio::spawn(service.clone().oneshot(Request::new(()))));
    }
    tokio::task::yield_now().await;
    assert_eq!(layer.status().in_flight, 4);
    let rejected = service.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(rejected.status(), StatusCode::SERVICE_UNAVAILABLE);

    // The minimum rises above the limit: it rises with it, and two more are admitted.
    layer.set_bounds(6, 100).unwrap();
    assert_eq!(layer.status().limit, 6);
    for _ in 0..2 {
        pending.push(tokio::spawn(service.clone().oneshot(Request::new(()))));
    }
    tokio::task::yield_now().await;
    assert_eq!(layer.status().in_flight, 6);
    let rejected = service.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(rejected.status(), StatusCode::SERVICE_UNAVAILABLE);

    // Invalid bounds are refused by name and change nothing.
    let err = layer.set_bounds(0, 5).unwrap_err();
    assert_eq!(
        (err.field(), err.kind()),
        ("min_limit", ConfigErrorKind::OutOfRange)
    );
    let err = layer.set_bounds(7, 6).unwrap_err();
    assert_eq!(
        (err.field(), err.kind()),
        ("max_limit", ConfigErrorKind::Conflict)
    );
    assert_eq!(layer.status().limit, 6);

    release.notify_waiters();
    for p in pending {
        assert_eq!(p.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(layer.status().in_flight, 0);
}
