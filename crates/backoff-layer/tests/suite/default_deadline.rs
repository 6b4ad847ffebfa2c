//! Defaults that cannot hang (issue 20): `RetryLayer::new()` ends a request at 15 s (Envoy's
//! default route timeout) when no response head has come, never cuts a response body, and
//! never tells a gRPC server that deadline.

use crate::support;

use std::convert::Infallible;
use std::error::Error as _;

use backoff_layer::{AttemptTimedOut, GiveUpReason, ReplayBody, RetryLayer};
use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use support::{Mock, SECOND, gave_up, get, status};
use tokio::time::Instant;
use tower::{Layer, ServiceExt, service_fn};

/// A downstream that accepts the request and never answers: the default deadline ends the
/// request at 15 s, with the deadline outcome.
#[tokio::test(start_paused = true)]
async fn a_downstream_that_never_answers_fails_at_15_seconds() {
    let never = service_fn(|_: Request<ReplayBody<Empty<Bytes>>>| {
        std::future::pending::<Result<Response<Empty<Bytes>>, Infallible>>()
    });
    let start = Instant::now();
    let err = RetryLayer::new()
        .layer(never)
        .oneshot(get())
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), 15 * SECOND);
    assert_eq!(start.elapsed(), RetryLayer::DEFAULT_DEADLINE);
    let g = gave_up(&err);
    assert_eq!(g.reason(), GiveUpReason::Deadline);
    assert_eq!(g.attempts(), 1);
    assert!(g.source().unwrap().is::<AttemptTimedOut>());
}

/// `no_deadline()` opts out: the same request is still waiting an hour later.
#[tokio::test(start_paused = true)]
async fn no_deadline_waits_for_as_long_as_the_downstream() {
    let never = service_fn(|_: Request<ReplayBody<Empty<Bytes>>>| {
        std::future::pending::<Result<Response<Empty<Bytes>>, Infallible>>()
    });
    let service = RetryLayer::builder()
        .no_deadline()
        .build()
        .unwrap()
        .layer(never);
    let waited = tokio::time::timeout(3600 * SECOND, service.oneshot(get())).await;
    assert!(waited.is_err(), "still waiting after an hour");
}

/// The deadline bounds the wait for the response's head: a body that streams for a minute
/// after a head that came at once is delivered whole.
#[tokio::test(start_paused = true)]
async fn the_default_deadline_never_cuts_a_streaming_body() {
    let streaming = service_fn(|_: Request<ReplayBody<Empty<Bytes>>>| async {
        // A frame every 10 s for 60 s, as a long server-streaming call sends.
        let frames = futures_util::stream::unfold(0u8, |n| async move {
            if n == 6 {
                return None;
            }
            tokio::time::sleep(10 * SECOND).await;
            Some((
                Ok::<_, Infallible>(Frame::data(Bytes::from(vec![n]))),
                n + 1,
            ))
        });
        Ok::<_, Infallible>(Response::new(StreamBody::new(frames)))
    });
    let start = Instant::now();
    let response = RetryLayer::new()
        .layer(streaming)
        .oneshot(get())
        .await
        .unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], [0, 1, 2, 3, 4, 5]);
    assert_eq!(start.elapsed(), 60 * SECOND);
}

/// A unary gRPC call, as tonic sends it.
fn grpc_call() -> Request<Full<Bytes>> {
    Request::post("http://example.test/grpc.health.v1.Health/Check")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x03\x0a\x01x")))
        .unwrap()
}

/// The `grpc-timeout` the first attempt carried under `layer`.
async fn grpc_timeout(layer: RetryLayer) -> Option<String> {
    let mock = Mock::new(vec![status(200)]);
    layer
        .layer(mock.clone())
        .oneshot(grpc_call())
        .await
        .unwrap();
    let seen = mock.seen();
    seen[0]
        .headers
        .get("grpc-timeout")
        .map(|v| v.to_str().unwrap().to_owned())
}

/// The default deadline is never written on the wire (a server would end a long
/// server-streaming call at 15 s); a deadline set explicitly is, and so is a per-attempt
/// timeout.
#[tokio::test(start_paused = true)]
async fn only_an_explicit_deadline_is_sent_as_grpc_timeout() {
    assert_eq!(grpc_timeout(RetryLayer::new()).await, None);
    let explicit = RetryLayer::builder().deadline(10 * SECOND).build().unwrap();
    assert_eq!(grpc_timeout(explicit).await.as_deref(), Some("10000000u"));
    // A per-attempt timeout under the default deadline: the timeout alone, even when it
    // is longer than the default deadline (which still ends the attempt at 15 s).
    let timeout = RetryLayer::builder()
        .attempt_timeout(20 * SECOND)
        .build()
        .unwrap();
    assert_eq!(grpc_timeout(timeout).await.as_deref(), Some("20000000u"));
    let off = RetryLayer::builder().no_deadline().build().unwrap();
    assert_eq!(grpc_timeout(off).await, None);
}
