//! Deadlines from Envoy (issue 32, item 3), across crates, under paused time: a server
//! behind `overload-signal`'s `DeadlineLayer` reads Envoy's `x-envoy-expected-rq-timeout-ms`
//! (what is left of Envoy's route timeout, or its per-try timeout, on this attempt) as the
//! request's deadline from arrival, and a handler that calls a downstream service through
//! `backoff-layer`'s retry layer, with no deadline code of its own, passes on what is left
//! of it: `X-Request-Deadline` on an HTTP call, `grpc-timeout` on a gRPC one.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backoff_layer::{ReplayBody, RetryLayer};
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::Empty;
use overload_signal::DeadlineLayer;
use overload_signal::protocol::WireDeadline;
use tower::{Layer, ServiceExt, service_fn};

const MS: Duration = Duration::from_millis(1);

/// What the handler spends before its downstream call.
const WORK: Duration = Duration::from_millis(300);

/// A tier: the deadline layer, a handler that works for [`WORK`] and then calls the
/// downstream (a gRPC call when `grpc`) through a retry layer with its defaults. Returns
/// the headers the downstream saw.
async fn tier(envoy_timeout_ms: &'static str, grpc: bool) -> HeaderMap {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let downstream =
        RetryLayer::new().layer(service_fn(move |req: Request<ReplayBody<Empty<Bytes>>>| {
            log.lock().unwrap().push(req.headers().clone());
            async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) }
        }));
    let handler = service_fn(move |_req: Request<Empty<Bytes>>| {
        let downstream = downstream.clone();
        async move {
            tokio::time::sleep(WORK).await;
            let mut call = Request::get("http://downstream.test/");
            if grpc {
                call = call.header("content-type", "application/grpc");
            }
            let response = downstream
                .oneshot(call.body(Empty::new()).unwrap())
                .await
                .expect("the downstream answers");
            Ok::<_, Infallible>(Response::new(response.status().to_string()))
        }
    });
    let request = Request::get("http://tier.test/")
        .header("x-envoy-expected-rq-timeout-ms", envoy_timeout_ms)
        .body(Empty::new())
        .unwrap();
    let response = DeadlineLayer::new()
        .layer(handler)
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.body(), "200 OK");
    let mut seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "one attempt");
    seen.remove(0)
}

/// Envoy gives the tier 1 s; the handler spends 300 ms, so its HTTP downstream call says
/// 700 ms (not the retry layer's default 15 s).
#[tokio::test(start_paused = true)]
async fn an_http_downstream_call_carries_what_is_left_of_envoys_deadline() {
    let headers = tier("1000", false).await;
    let wire = WireDeadline::from_headers(&headers)
        .expect("well-formed")
        .expect("X-Request-Deadline on the downstream call");
    assert_eq!(wire.timeout(), 1000 * MS - WORK);
}

/// The same for a gRPC downstream call: `grpc-timeout` says 700 ms.
#[tokio::test(start_paused = true)]
async fn a_grpc_downstream_call_carries_what_is_left_of_envoys_deadline() {
    let headers = tier("1000", true).await;
    assert_eq!(
        headers.get("grpc-timeout").map(|v| v.to_str().unwrap()),
        Some("700000u")
    );
}
