//! The combined layer against the two layers it combines, stacked: the same answers, the
//! same histogram, the same deadlines seen by the handler.

use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use overload_core::clock::{TokioWallClock, WallClock};
use tower::{Layer, Service, ServiceExt, service_fn};

use super::SignalDeadlineLayer;
use crate::deadline::time_left;
use crate::protocol::{
    GRPC_PREVIOUS_RPC_ATTEMPTS, GRPC_TIMEOUT, WireDeadline, X_ENVOY_ATTEMPT_COUNT,
    X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, X_REQUEST_ATTEMPT,
};
use crate::signal::{Rejection, RejectionKind, RejectionScope};
use crate::{DeadlineLayer, OverloadSignalLayer, StopRule};

/// The handler: rejects (a `429` marked as a limit's) when asked to, works for the
/// milliseconds asked, and answers with the time left it saw.
fn handler()
-> impl Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone {
    service_fn(|req: Request<String>| async move {
        let left = time_left().map_or("none".to_owned(), |d| format!("{}", d.as_millis()));
        if req.headers().contains_key("x-test-reject") {
            let mut response = Response::new(String::new());
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            response.extensions_mut().insert(Rejection::new(
                RejectionKind::RateLimited,
                RejectionScope::Server,
            ));
            return Ok(response);
        }
        if let Some(ms) = req.headers().get("x-test-work") {
            let ms: u64 = ms.to_str().unwrap().parse().unwrap();
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        Ok::<_, Infallible>(Response::new(left))
    })
}

fn wall() -> TokioWallClock {
    TokioWallClock::starting_at(SystemTime::UNIX_EPOCH + Duration::from_millis(1_767_225_600_000))
}

/// The requests both stacks are sent, in order: each field both layers read, alone and
/// together, from this host (trusted by default) and from elsewhere.
fn requests(wall: &TokioWallClock) -> Vec<Request<String>> {
    let mut out = Vec::new();
    let mut add = |headers: &[(&str, &str)], local: bool| {
        let mut req = Request::new(String::new());
        for (name, value) in headers {
            req.headers_mut().append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        let ip = if local {
            [127, 0, 0, 1]
        } else {
            [203, 0, 113, 5]
        };
        req.extensions_mut()
            .insert(std::net::SocketAddr::from((ip, 40_000)));
        out.push(req);
    };
    let expired = WireDeadline::new(wall.now() - Duration::from_secs(2), Duration::from_secs(1));
    let live = WireDeadline::new(
        wall.now() - Duration::from_millis(100),
        Duration::from_secs(1),
    );
    let expired = expired.to_header_value();
    let live = live.to_header_value();
    let (expired, live) = (expired.to_str().unwrap(), live.to_str().unwrap());
    let deadline = "x-request-deadline";
    let grpc = ("content-type", "application/grpc");
    add(&[("x-test-reject", "1")], true);
    add(&[], true);
    add(&[("accept", "*/*"), ("user-agent", "test")], false);
    add(&[(deadline, live)], true);
    add(&[(deadline, live)], false);
    add(&[(deadline, expired)], true);
    add(&[(deadline, expired)], false);
    add(&[(deadline, "junk")], true);
    add(&[(deadline, live), ("x-test-work", "2000")], true);
    add(
        &[
            (X_ENVOY_EXPECTED_RQ_TIMEOUT_MS.as_str(), "50"),
            ("x-test-work", "100"),
        ],
        true,
    );
    add(&[(X_ENVOY_EXPECTED_RQ_TIMEOUT_MS.as_str(), "500")], false);
    add(&[grpc, (GRPC_TIMEOUT.as_str(), "0m")], true);
    add(&[grpc, (GRPC_TIMEOUT.as_str(), "300m")], true);
    add(&[(GRPC_TIMEOUT.as_str(), "300m")], true);
    add(&[grpc, (GRPC_PREVIOUS_RPC_ATTEMPTS.as_str(), "2")], true);
    add(&[(GRPC_PREVIOUS_RPC_ATTEMPTS.as_str(), "2")], true);
    add(&[(X_ENVOY_ATTEMPT_COUNT.as_str(), "3")], true);
    add(&[(X_REQUEST_ATTEMPT.as_str(), "-1")], true);
    for _ in 0..6 {
        add(
            &[(X_REQUEST_ATTEMPT.as_str(), "2"), ("x-test-reject", "1")],
            true,
        );
        add(
            &[(X_REQUEST_ATTEMPT.as_str(), "1"), ("x-test-reject", "1")],
            false,
        );
        add(
            &[
                grpc,
                (X_REQUEST_ATTEMPT.as_str(), "1"),
                ("x-test-reject", "1"),
            ],
            true,
        );
        add(&[(X_REQUEST_ATTEMPT.as_str(), "0")], true);
    }
    // More names than the combined layer's one pass takes: it looks the fields up instead.
    let many: Vec<(String, String)> = (0..20)
        .map(|i| (format!("x-other-{i}"), "1".to_owned()))
        .collect();
    let mut many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    many.push((deadline, expired));
    add(&many, true);
    many.pop();
    many.push(("x-request-attempt", "3"));
    many.push(("x-test-reject", "1"));
    add(&many, true);
    out
}

/// Every answer of `svc` to the requests, status, headers and body, one per request, each
/// sent when the previous one has been answered.
async fn answers<S>(svc: S, wall: &TokioWallClock) -> Vec<(StatusCode, HeaderMap, String)>
where
    S: Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone,
{
    let mut out = Vec::new();
    for req in requests(wall) {
        let response = svc.clone().oneshot(req).await.unwrap();
        let (parts, body) = response.into_parts();
        out.push((parts.status, parts.headers, body));
    }
    out
}

fn layers(wall: &TokioWallClock) -> (OverloadSignalLayer, DeadlineLayer) {
    let rule = StopRule::builder()
        .retry_share(0.1)
        .min_requests(10)
        .build()
        .unwrap();
    // NOTE: a fixed caller seed, so that the two callers fall in the same classes under both
    // layers: with each layer's random keys they shared a class under one layer and not the
    // other in about one run of 128, and the stop rule then judged them apart.
    let signal = OverloadSignalLayer::builder()
        .rule(rule)
        .caller_seed(5)
        .build()
        .unwrap();
    let deadline = DeadlineLayer::builder().wall_clock(*wall).build().unwrap();
    (signal, deadline)
}

#[tokio::test(start_paused = true)]
async fn the_combined_layer_answers_as_the_two_layers_stacked() {
    let wall = wall();
    let (signal, deadline) = layers(&wall);
    let stacked = signal.layer(deadline.layer(handler()));
    let expected = answers(stacked, &wall).await;
    let stacked_window = signal.histogram().snapshot();

    let wall = self::wall();
    let (signal, deadline) = layers(&wall);
    let combined = SignalDeadlineLayer::new(&signal, &deadline).layer(handler());
    let got = answers(combined, &wall).await;

    assert_eq!(got.len(), expected.len());
    for (i, (got, expected)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(got, expected, "request {i}");
    }
    assert_eq!(signal.histogram().snapshot(), stacked_window);
    // The requests above do reach each path: expired, cancelled, live, stopped.
    let statuses: Vec<_> = expected.iter().map(|(s, _, _)| *s).collect();
    for status in [
        StatusCode::OK,
        StatusCode::GATEWAY_TIMEOUT,
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::SERVICE_UNAVAILABLE,
    ] {
        assert!(statuses.contains(&status), "{status} in {statuses:?}");
    }
    assert!(
        expected.iter().any(|(_, _, body)| body == "900"),
        "{expected:?}"
    );
    assert!(
        expected
            .iter()
            .any(|(_, h, _)| h.get("grpc-status").is_some_and(|v| v == "4"))
    );
}

/// [`handler`], its body followed by the client address the layers left in the request.
fn handler_seeing_the_client()
-> impl Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone {
    service_fn(|req: Request<String>| {
        let client = crate::signal::client_addr(req.extensions());
        let answer = handler().oneshot(req);
        async move {
            let mut response = answer.await?;
            *response.body_mut() = format!("{} {client:?}", response.body());
            Ok::<_, Infallible>(response)
        }
    })
}

/// The overload layer of [`layers`], with trusted proxies and a key of its own (each
/// optional).
fn layers_with(
    wall: &TokioWallClock,
    proxies: bool,
    key: Option<fn(&http::request::Parts) -> Option<String>>,
) -> (OverloadSignalLayer, DeadlineLayer) {
    let rule = StopRule::builder()
        .retry_share(0.1)
        .min_requests(10)
        .build()
        .unwrap();
    let mut signal = OverloadSignalLayer::builder().rule(rule).caller_seed(5);
    if proxies {
        signal = signal.trusted_proxies(
            crate::signal::TrustedProxies::new(
                crate::signal::ForwardedHeader::XForwardedFor,
                ["127.0.0.0/8".parse().unwrap()],
            )
            .unwrap(),
        );
    }
    if let Some(key) = key {
        signal = signal.key_by(key);
    }
    let deadline = DeadlineLayer::builder().wall_clock(*wall).build().unwrap();
    (signal.build().unwrap(), deadline)
}

/// The combined layer reads a request in place with the default key, and takes it apart
/// for a key of the user's own: both answer as the two layers stacked, trusted proxies
/// resolved alike (the client address left in the request for the handler).
#[tokio::test(start_paused = true)]
async fn the_combined_layer_answers_as_the_two_layers_stacked_with_proxies_and_any_key() {
    fn by_header(parts: &http::request::Parts) -> Option<String> {
        parts
            .headers
            .get("user-agent")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }
    let forwarded = |wall: &TokioWallClock| {
        let mut requests = requests(wall);
        for (i, req) in requests.iter_mut().enumerate() {
            let client = format!("198.51.100.{}", i % 3);
            req.headers_mut()
                .insert("x-forwarded-for", HeaderValue::from_str(&client).unwrap());
        }
        requests
    };
    for (proxies, key) in [
        (true, None),
        (true, Some(by_header as fn(&_) -> _)),
        (false, Some(by_header as fn(&_) -> _)),
    ] {
        let run = async |combine: bool| {
            let wall = wall();
            let (signal, deadline) = layers_with(&wall, proxies, key);
            let mut out = Vec::new();
            for req in forwarded(&wall) {
                let response = if combine {
                    SignalDeadlineLayer::new(&signal, &deadline)
                        .layer(handler_seeing_the_client())
                        .oneshot(req)
                        .await
                } else {
                    signal
                        .layer(deadline.layer(handler_seeing_the_client()))
                        .oneshot(req)
                        .await
                };
                let (parts, body) = response.unwrap().into_parts();
                out.push((parts.status, parts.headers, body));
            }
            (out, signal.histogram().snapshot())
        };
        let (expected, stacked_window) = run(false).await;
        let (got, combined_window) = run(true).await;
        assert_eq!(got.len(), expected.len());
        for (i, (got, expected)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(
                got,
                expected,
                "proxies {proxies}, key {}: request {i}",
                key.is_some()
            );
        }
        assert_eq!(combined_window, stacked_window);
        let resolved = expected
            .iter()
            .filter(|(_, _, body)| body.ends_with("Some(198.51.100.1)"))
            .count();
        // The requests from 127.0.0.1 come through a trusted proxy: their client is the
        // forwarded address; the others' is their peer.
        assert_eq!(resolved > 0, proxies, "{expected:?}");
    }
}

#[test]
fn clone_send_sync_and_debug() {
    fn assert_traits<T: Clone + Send + Sync + 'static>() {}
    assert_traits::<SignalDeadlineLayer>();
    assert_traits::<
        super::SignalDeadline<
            tower::util::BoxCloneSyncService<Request<()>, Response<()>, Infallible>,
        >,
    >();
    let layer = SignalDeadlineLayer::new(&OverloadSignalLayer::new(), &DeadlineLayer::new());
    let d = format!("{:?}", layer.layer(()));
    assert!(
        d.starts_with("SignalDeadline { inner: (), shared: SignalDeadlineState { name: "),
        "{d}"
    );
}
