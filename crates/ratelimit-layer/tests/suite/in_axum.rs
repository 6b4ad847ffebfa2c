//! The layer in an axum `Router`, end to end on 127.0.0.1, keyed by the peer address the
//! axum 0.8 adapter copies from axum's `ConnectInfo`.

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use overload_signal::protocol::{RATELIMIT, RATELIMIT_POLICY};
use ratelimit_layer::axum_0_8::into_make_service_with_peer_addr;
use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::key::ClientIp;
use ratelimit_layer::{RateLimitLayer, TokenBucket};

#[tokio::test]
async fn axum_router_answers_429_with_the_protocol_headers() {
    // NOTE: a fake clock that never moves makes the third request's rejection certain,
    // however slow the machine.
    let layer = RateLimitLayer::builder(TokenBucket::builder(1).burst(2).build().unwrap())
        .clock(FakeClock::new())
        .key_by_client_ip(ClientIp::new())
        .admitted_headers(true)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/api", get(|| async { "hello" }))
        .layer(layer);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, into_make_service_with_peer_addr(app))
            .await
            .unwrap();
    });

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let get = || {
        client.request(
            Request::get(format!("http://{addr}/api"))
                .body(Empty::new())
                .unwrap(),
        )
    };
    for (remaining, reset) in [(1, 1), (0, 2)] {
        let res = get().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            res.headers()[RATELIMIT],
            format!("\"default\";r={remaining};t={reset}").as_str()
        );
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "hello");
    }
    let res = get().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()[http::header::RETRY_AFTER], "1");
    // One a second, bursts of 2: two over the 2 s the burst takes to refill (issue 30,
    // finding 7: it was `q=1;w=1`, under the `r` of 2 a fresh bucket shows).
    assert_eq!(res.headers()[RATELIMIT_POLICY], "\"default\";q=2;w=2");
    assert_eq!(res.headers()[RATELIMIT], "\"default\";r=0;t=2");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(body.is_empty(), "the handler did not run");

    server.abort();
}
