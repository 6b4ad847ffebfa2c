//! A limit changed while the layer serves: a [`LiveTokenBucket`] in a keyed layer, its
//! handle lowering and raising the rate, every key's state carried over.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use ratelimit_layer::algorithm::LiveTokenBucket;
use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::key::ClientIp;
use ratelimit_layer::{RateLimitLayer, TokenBucket};
use tower::{Layer, ServiceExt, service_fn};

fn from(peer: &str) -> Request<()> {
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req
}

#[tokio::test]
async fn a_keyed_layer_takes_a_new_rate_without_forgetting_its_keys() {
    let clock = FakeClock::new();
    let bucket = TokenBucket::builder(10).burst(10).build().unwrap();
    let (live, handle) = LiveTokenBucket::new(bucket, clock.clone());
    let layer = RateLimitLayer::builder(live)
        .clock(clock.clone())
        .key_by_client_ip(ClientIp::new())
        .build()
        .unwrap();
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(()))
    }));
    let admitted = |peer: &'static str, n: usize| {
        let svc = svc.clone();
        async move {
            let mut ok = 0;
            for _ in 0..n {
                if svc.clone().oneshot(from(peer)).await.unwrap().status() == StatusCode::OK {
                    ok += 1;
                }
            }
            ok
        }
    };
    // Client a takes its whole burst, client b half of it.
    assert_eq!(admitted("192.0.2.1:1", 20).await, 10);
    assert_eq!(admitted("192.0.2.2:1", 5).await, 5);
    // The rate falls to 1 per second: a's 10 units in use stay in use, b's 5 too. No burst.
    handle.set_rate(1).unwrap();
    assert_eq!(admitted("192.0.2.1:1", 20).await, 0);
    assert_eq!(admitted("192.0.2.2:1", 20).await, 5);
    // 1 s later, one unit each is back (at the old rate it would have been 10).
    clock.advance(Duration::from_secs(1));
    assert_eq!(admitted("192.0.2.1:1", 20).await, 1);
    assert_eq!(admitted("192.0.2.2:1", 20).await, 1);
    // The rate rises to 100 per second: the 10 units in use come back in 100 ms.
    handle.set_rate(100).unwrap();
    clock.advance(Duration::from_millis(100));
    assert_eq!(admitted("192.0.2.1:1", 20).await, 10);
    // A client never seen gets the new limit's burst.
    assert_eq!(admitted("192.0.2.3:1", 20).await, 10);
}

/// The fields and the `413` check follow a change: `RateLimit-Policy` on an admitted
/// response and on a rejection says the parameters in force, and a request heavier than a
/// lowered burst is answered `413` (never to be admitted), not `429`.
#[tokio::test]
async fn the_policy_and_the_capacity_follow_a_change() {
    let clock = FakeClock::new();
    let bucket = TokenBucket::builder(10).burst(10).build().unwrap();
    let (live, handle) = LiveTokenBucket::new(bucket, clock.clone());
    let layer = RateLimitLayer::builder(live)
        .clock(clock.clone())
        .name("api")
        .cost_by(|parts| parts.uri.path().len().try_into().unwrap_or(u32::MAX))
        .admitted_headers(true)
        .build()
        .unwrap();
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(()))
    }));
    let send = |path: &'static str| {
        let svc = svc.clone();
        async move {
            let response = svc
                .oneshot(Request::get(path).body(()).unwrap())
                .await
                .unwrap();
            let policy = response
                .headers()
                .get("ratelimit-policy")
                .map(|v| v.to_str().unwrap().to_owned());
            (response.status(), policy)
        }
    };
    // A cost of 8 (the path's length) within the burst of 10.
    assert_eq!(
        send("/eight__").await,
        (StatusCode::OK, Some(r#""api";q=10;w=1"#.to_owned()))
    );
    clock.advance(Duration::from_secs(1));
    // 1 per second, bursts of 5: a cost of 8 can never pass, so 413 (before the fix, the
    // capacity of the build, 10, made it a 429 to retry), with the new policy.
    handle.set(TokenBucket::builder(1).burst(5).build().unwrap());
    let now = Some(r#""api";q=5;w=5"#.to_owned());
    assert_eq!(
        send("/eight__").await,
        (StatusCode::PAYLOAD_TOO_LARGE, now.clone())
    );
    // A cost of 2: admitted, the fields saying the new limit.
    assert_eq!(send("/2").await, (StatusCode::OK, now.clone()));
    // A cost of 4 with 3 left: rejected, the same.
    assert_eq!(send("/4__").await, (StatusCode::TOO_MANY_REQUESTS, now));
}
