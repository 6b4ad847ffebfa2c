//! The client-side throttle over the wire (issue 21): one hyper-util client behind
//! `RetryLayer::new()`, two servers on 127.0.0.1, one failing and one healthy.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backoff_layer::{ReplayBody, RetryLayer, Throttled, is_throttled};
use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use integration_tests::TestServer;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{BoxError, Layer, ServiceExt};

type Stack = BoxCloneService<Request<Empty<Bytes>>, Response<hyper::body::Incoming>, BoxError>;

/// A server that answers every request with `status`, and counts them.
async fn server(status: u16) -> (TestServer, Arc<AtomicU64>) {
    let count = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&count);
    let server = TestServer::start(move |_req: Request<hyper::body::Incoming>| {
        seen.fetch_add(1, Ordering::Relaxed);
        async move {
            let mut r = Response::new(Full::new(Bytes::from_static(b"body")));
            *r.status_mut() = StatusCode::from_u16(status).unwrap();
            r
        }
    })
    .await
    .unwrap();
    (server, count)
}

/// How the requests to one destination ended.
#[derive(Debug, Default, Clone, Copy)]
struct Ended {
    ok: u64,
    failed: u64,
    refused: u64,
}

/// `per_second` requests a second to `url` for `for_`, each in its own task; waits for them.
async fn drive(stack: &Stack, url: Uri, per_second: u32, for_: Duration) -> Ended {
    let mut tasks = tokio::task::JoinSet::new();
    let gap = Duration::from_secs(1) / per_second;
    let start = Instant::now();
    let mut next = start;
    while next < start + for_ {
        tokio::time::sleep_until(next).await;
        next += gap;
        let (stack, url) = (stack.clone(), url.clone());
        tasks.spawn(async move {
            let began = Instant::now();
            let result = stack
                .oneshot(Request::get(url).body(Empty::new()).unwrap())
                .await;
            (result, began.elapsed())
        });
    }
    let mut ended = Ended::default();
    while let Some(done) = tasks.join_next().await {
        match done.unwrap() {
            (Ok(r), _) if r.status() == StatusCode::OK => ended.ok += 1,
            (Ok(_), _) => ended.failed += 1,
            (Err(e), took) if is_throttled(&*e) => {
                assert!(e.is::<Throttled>(), "{e}");
                // Refused locally: no round trip (a generous bound for a loaded machine).
                assert!(took < Duration::from_millis(50), "a refusal took {took:?}");
                ended.refused += 1;
            }
            (Err(e), _) => panic!("unexpected error: {e}"),
        }
    }
    ended
}

/// One client stack, two destinations: the failing one has most of its requests refused
/// locally, the healthy one never has one refused, and sees every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_destination_never_throttles_a_healthy_one_behind_the_same_stack() {
    let (failing, failing_seen) = server(503).await;
    let (healthy, healthy_seen) = server(200).await;
    let hyper: Client<HttpConnector, ReplayBody<Empty<Bytes>>> =
        Client::builder(TokioExecutor::new()).build_http();
    let stack: Stack = BoxCloneService::new(RetryLayer::new().layer(hyper).map_err(Into::into));
    let for_ = Duration::from_secs(5);
    let (bad, good) = tokio::join!(
        drive(&stack, failing.url("/api"), 100, for_),
        drive(&stack, healthy.url("/api"), 100, for_),
    );
    assert_eq!(good.refused, 0, "{good:?}");
    assert_eq!(good.failed, 0, "{good:?}");
    assert_eq!(healthy_seen.load(Ordering::Relaxed), good.ok);
    assert_eq!(good.ok, 500);
    // The failing one: throttled within its first second, then nine in ten refused.
    let total = bad.failed + bad.refused;
    assert_eq!(total, 500, "{bad:?}");
    assert!(
        bad.refused as f64 >= 0.6 * total as f64,
        "{bad:?}: refused too few"
    );
    // Each request sent was tried up to 3 times, within the budget.
    let sent = failing_seen.load(Ordering::Relaxed);
    assert!(sent < 3 * bad.failed + 1, "{sent} attempts for {bad:?}");
}

/// Regression (issue 30, finding 3): the throttle counted every `5xx` as a failure and kept
/// one state per scheme and authority: with `/bad` answering `500` (a bug, not overload) to
/// 60 % of a host's traffic, about a fifth of the host's `/good` requests were refused
/// locally, never sent. A `500` is an answer, not a capacity signal: nothing is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_answering_500_never_throttles_its_host() {
    let host = TestServer::start(|req: Request<hyper::body::Incoming>| async move {
        let bad = req.uri().path() == "/bad";
        let mut r = Response::new(Full::new(Bytes::from_static(b"body")));
        if bad {
            *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        }
        r
    })
    .await
    .unwrap();
    let hyper: Client<HttpConnector, ReplayBody<Empty<Bytes>>> =
        Client::builder(TokioExecutor::new()).build_http();
    let stack: Stack = BoxCloneService::new(RetryLayer::new().layer(hyper).map_err(Into::into));
    let for_ = Duration::from_secs(5);
    let (bad, good) = tokio::join!(
        drive(&stack, host.url("/bad"), 150, for_),
        drive(&stack, host.url("/good"), 100, for_),
    );
    assert_eq!(good.refused, 0, "{good:?}");
    assert_eq!(good.ok, 500, "{good:?}");
    assert_eq!(bad.refused, 0, "a bug is not overload: {bad:?}");
    assert!((750..=751).contains(&bad.failed), "{bad:?}");
}

/// Issue 30, finding 3: every tonic channel behind one layer shared one throttle state (a
/// generated client's requests carry no authority at the layer), so a failing server
/// throttled the calls to a healthy one (49 of the healthy channel's 400 calls refused, in
/// a run of this test with clients built with `new`). Built `with_origin`, as the throttle's
/// docs say, each client's requests carry their channel's origin, and each channel is a
/// destination of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tonic_channels_behind_one_layer_are_two_destinations() {
    use backoff_layer::Retry;
    use backoff_layer::adapter::Tonic;
    use tonic::transport::{Channel, Server};
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    // A gRPC server that answers every call `UNAVAILABLE`, trailers-only.
    let failing = TestServer::start(|_req: Request<hyper::body::Incoming>| async move {
        let mut r = Response::new(Full::new(Bytes::new()));
        let h = r.headers_mut();
        h.insert(
            "content-type",
            http::HeaderValue::from_static("application/grpc"),
        );
        h.insert("grpc-status", http::HeaderValue::from_static("14"));
        r
    })
    .await
    .unwrap();
    // A healthy one: tonic's health service.
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let healthy = listener.local_addr().unwrap();
    let server = tokio::spawn(
        Server::builder()
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let channel = |url: String| async move {
        Channel::from_shared(url)
            .unwrap()
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap()
    };
    let layer = RetryLayer::new().for_tonic();
    let (bad_origin, good_origin) = (failing.url("/").to_string(), format!("http://{healthy}/"));
    let bad: HealthClient<Retry<Channel, Tonic>> = HealthClient::with_origin(
        layer.layer(channel(bad_origin.clone()).await),
        bad_origin.parse().unwrap(),
    );
    let good: HealthClient<Retry<Channel, Tonic>> = HealthClient::with_origin(
        layer.layer(channel(good_origin.clone()).await),
        good_origin.parse().unwrap(),
    );

    async fn drive_grpc(
        client: HealthClient<Retry<Channel, Tonic>>,
        per_second: u32,
        for_: Duration,
    ) -> Ended {
        let mut tasks = tokio::task::JoinSet::new();
        let gap = Duration::from_secs(1) / per_second;
        let start = Instant::now();
        let mut next = start;
        while next < start + for_ {
            tokio::time::sleep_until(next).await;
            next += gap;
            let mut client = client.clone();
            tasks.spawn(async move { client.check(HealthCheckRequest::default()).await });
        }
        let mut ended = Ended::default();
        while let Some(done) = tasks.join_next().await {
            match done.unwrap() {
                Ok(_) => ended.ok += 1,
                Err(status) if is_throttled(&status) => ended.refused += 1,
                Err(_) => ended.failed += 1,
            }
        }
        ended
    }

    let for_ = Duration::from_secs(4);
    let (bad, good) = tokio::join!(drive_grpc(bad, 100, for_), drive_grpc(good, 100, for_),);
    server.abort();
    assert_eq!(good.refused, 0, "{good:?}");
    assert_eq!(good.ok, 400, "{good:?}");
    assert!(
        bad.refused > 100,
        "the failing channel is throttled: {bad:?}"
    );
}
