//! The protocol's messages survive a real hyper server and client on 127.0.0.1: header names,
//! values and statuses arrive as the protocol module wrote them, over HTTP/1 and HTTP/2.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use integration_tests::TestServer;
use overload_signal::protocol::{
    self, Attempt, GrpcPushback, Protocol, RateLimitPolicy, RateLimitStatus,
};

/// Echoes the parsed attempt counter back in a header, and answers `/stop`, `/limit` and
/// `/grpc-stop` with the protocol's rejections.
async fn start() -> TestServer {
    TestServer::start(|req: Request<hyper::body::Incoming>| async move {
        let attempt = Attempt::from_request(&req);
        let mut response = match req.uri().path() {
            "/stop" => protocol::stop_signal_response(Protocol::Http),
            "/grpc-stop" => protocol::stop_signal_response(Protocol::Grpc),
            "/limit" => {
                let policy = RateLimitPolicy::new("default", 100, Duration::from_secs(1)).unwrap();
                let mut r = protocol::too_many_requests_response(
                    Protocol::Http,
                    Duration::from_millis(1500),
                );
                r.headers_mut()
                    .insert(protocol::RATELIMIT_POLICY, policy.to_header_value());
                r.headers_mut().insert(
                    protocol::RATELIMIT,
                    policy.status(0, Duration::from_millis(1500)),
                );
                r
            }
            _ => http::Response::new(Full::new(Bytes::from_static(b"ok"))),
        };
        response
            .headers_mut()
            .insert("x-seen-attempt", attempt.to_string().parse().unwrap());
        response
    })
    .await
    .unwrap()
}

fn client(http2: bool) -> Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build_http()
}

#[tokio::test]
async fn attempt_counter_arrives_as_sent() {
    let server = start().await;
    for http2 in [false, true] {
        let client = client(http2);
        for (sent, seen) in [
            (Some("0"), "0"),
            (Some("2"), "2"),
            (Some("-1"), "malformed"),
            (Some("99999999999"), "1000000"),
            (None, "unknown"),
        ] {
            let mut req = Request::get(server.url("/")).body(Empty::new()).unwrap();
            if let Some(v) = sent {
                req.headers_mut()
                    .insert(protocol::X_REQUEST_ATTEMPT, v.parse().unwrap());
            }
            let resp = client.request(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            assert_eq!(
                resp.headers()["x-seen-attempt"],
                seen,
                "sent {sent:?}, h2={http2}"
            );
        }
    }
}

#[tokio::test]
async fn stop_signal_is_recognised_by_a_client() {
    let server = start().await;
    for http2 in [false, true] {
        let client = client(http2);
        let resp = client
            .request(
                Request::get(server.url("/stop"))
                    .body(Empty::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(protocol::is_stop_signal(resp.headers()));

        let resp = client
            .request(
                Request::get(server.url("/grpc-stop"))
                    .body(Empty::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(protocol::grpc_status(resp.headers()), Some(14));
        assert_eq!(
            protocol::grpc_pushback(resp.headers()),
            Some(GrpcPushback::Stop)
        );
        assert!(protocol::is_stop_signal(resp.headers()));

        let resp = client
            .request(Request::get(server.url("/")).body(Empty::new()).unwrap())
            .await
            .unwrap();
        assert!(!protocol::is_stop_signal(resp.headers()));
    }
}

#[tokio::test]
async fn rate_limit_rejection_carries_its_fields() {
    let server = start().await;
    let resp = client(false)
        .request(
            Request::get(server.url("/limit"))
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!protocol::is_stop_signal(resp.headers()));
    assert_eq!(
        protocol::retry_after(resp.headers(), SystemTime::now()),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        resp.headers()[protocol::RATELIMIT_POLICY],
        "\"default\";q=100;w=1"
    );
    let status = RateLimitStatus::parse(&resp.headers()[protocol::RATELIMIT]).unwrap();
    assert_eq!(status.name(), "default");
    assert_eq!(status.remaining(), 0);
    assert_eq!(status.reset(), Some(Duration::from_secs(2)));
}
