//! A real `reqwest::Client` behind `backoff-layer`'s whole client stack (the `reqwest`
//! feature, issue 35), against a real axum server on 127.0.0.1: what reaches the wire, and
//! what the caller gets.
//!
//! Real time, not paused: reqwest's connections and axum's server run on the runtime's
//! I/O driver, and paused time auto-advances whenever the runtime waits on I/O, which would
//! fire the layer's timers (backoff, deadline) while a response is on its way. The waits
//! are the layer's defaults (100 ms, then 200 ms, jittered) or a 1 s `Retry-After`, so each
//! test takes at most about a second.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use backoff_layer::reqwest::Reqwest;
use backoff_layer::{GiveUpReason, RetryInfo, RetryLayer, is_overloaded, is_throttled};
use overload_signal::protocol::WireDeadline;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// What the server saw of one attempt.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    headers: HeaderMap,
    body: Bytes,
}

/// What the server answers the `n`th attempt (from 0) with.
type Script = fn(usize) -> Response;

#[derive(Clone)]
struct Server {
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Script,
}

async fn record(State(server): State<Server>, headers: HeaderMap, body: Bytes) -> Response {
    let n = {
        let mut seen = server.seen.lock().unwrap();
        seen.push(Seen {
            at: Instant::now(),
            headers,
            body,
        });
        seen.len() - 1
    };
    (server.script)(n)
}

/// An axum server on 127.0.0.1, port 0, answering by `script`; its URL and its log.
async fn serve(script: Script) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::<Mutex<Vec<Seen>>>::default();
    let app = Router::new().fallback(record).with_state(Server {
        seen: Arc::clone(&seen),
        script,
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/api"), seen)
}

fn unavailable_then_ok(n: usize) -> Response {
    if n < 2 {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    } else {
        (StatusCode::OK, "hello").into_response()
    }
}

fn attempts_on_the_wire(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .map(|s| s.headers["x-request-attempt"].to_str().unwrap().to_owned())
        .collect()
}

/// The README's example, as it is there but for the URL, run against a real server.
#[tokio::test]
async fn the_readme_example_retries_through_reqwest_middleware()
-> Result<(), Box<dyn std::error::Error>> {
    let (url, seen) = serve(unavailable_then_ok).await;
    // --- the README's example, from here ---
    use backoff_layer::reqwest::RetryMiddleware;

    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new())
        .build();
    let text = client.get(url).send().await?.text().await?;
    // --- to here ---
    assert_eq!(text, "hello");
    assert_eq!(attempts_on_the_wire(&seen.lock().unwrap()), ["0", "1", "2"]);
    Ok(())
}

/// The Tower form of the same: the layer over `Reqwest`, as the `reqwest` module's docs
/// show it.
#[tokio::test]
async fn the_tower_form_retries_through_reqwest() -> Result<(), backoff_layer::BoxError> {
    let (url, seen) = serve(unavailable_then_ok).await;
    use backoff_layer::{RetryLayer, reqwest::Reqwest};
    use tower::{Layer, ServiceExt};

    let client = RetryLayer::new().layer(Reqwest::new(reqwest::Client::new()));
    let request = http::Request::get(url).body(reqwest::Body::from(""))?;
    let response = reqwest::Response::from(client.clone().oneshot(request).await?);
    assert_eq!(response.text().await?, "hello");
    assert_eq!(attempts_on_the_wire(&seen.lock().unwrap()), ["0", "1", "2"]);
    Ok(())
}

#[tokio::test]
async fn every_attempt_carries_its_number_and_the_caller_sees_the_success() {
    let (url, seen) = serve(unavailable_then_ok).await;
    let client = RetryLayer::new().layer(Reqwest::new(reqwest::Client::new()));
    let request = http::Request::get(url)
        .body(reqwest::Body::from(""))
        .unwrap();
    let response = client.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let info = *response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts, 3);
    assert_eq!(info.gave_up, None);
    let response = reqwest::Response::from(response);
    assert_eq!(response.text().await.unwrap(), "hello");
    // `X-Request-Attempt` counts from 0: the first attempt, then the two retries.
    assert_eq!(attempts_on_the_wire(&seen.lock().unwrap()), ["0", "1", "2"]);
}

#[tokio::test]
async fn the_stop_signal_is_never_retried() {
    let (url, seen) = serve(|_| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [("x-overloaded", "stop-retrying")],
        )
            .into_response()
    })
    .await;
    let client = RetryLayer::new().layer(Reqwest::new(reqwest::Client::new()));
    let request = http::Request::get(url)
        .body(reqwest::Body::from(""))
        .unwrap();
    let err = client.oneshot(request).await.unwrap_err();
    assert!(is_overloaded(&*err), "{err:?}");
    assert_eq!(seen.lock().unwrap().len(), 1, "one attempt, no retry");
}

/// A destination that fails everything: within a second the throttle refuses most of its
/// requests locally (its window closes slots every 200 ms), and a refusal never reaches it.
#[tokio::test]
async fn the_throttle_refuses_locally_after_failures() {
    let (url, seen) = serve(|_| StatusCode::SERVICE_UNAVAILABLE.into_response()).await;
    // One attempt per request: the throttle, not the retries, is what is tested.
    let layer = RetryLayer::builder().max_attempts(1).build().unwrap();
    let client = layer.layer(Reqwest::new(reqwest::Client::new()));
    let start = Instant::now();
    let (mut sent, mut refused, mut refused_later, mut later) = (0, 0, 0, 0);
    // 100 requests a second for 2 s, one after the other.
    while start.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let second_half = start.elapsed() >= Duration::from_secs(1);
        later += usize::from(second_half);
        let request = http::Request::get(url.as_str())
            .body(reqwest::Body::from(""))
            .unwrap();
        let began = Instant::now();
        match client.clone().oneshot(request).await {
            Ok(response) => {
                assert_eq!(response.status(), 503);
                sent += 1;
            }
            Err(err) if is_throttled(&*err) => {
                // Refused locally: no round trip (a generous bound for a loaded machine).
                assert!(began.elapsed() < Duration::from_millis(50));
                refused += 1;
                refused_later += usize::from(second_half);
            }
            Err(err) => panic!("unexpected error: {err:?}"),
        }
    }
    assert_eq!(
        seen.lock().unwrap().len(),
        sent,
        "refusals never reach the wire"
    );
    assert!(
        refused_later * 2 >= later,
        "in the second second, {refused_later} of {later} refused ({sent} sent, {refused} refused in all)"
    );
}

#[tokio::test]
async fn every_attempt_carries_the_deadline_left() {
    let (url, seen) = serve(unavailable_then_ok).await;
    let layer = RetryLayer::builder()
        .deadline(Duration::from_secs(5))
        .build()
        .unwrap();
    let client = layer.layer(Reqwest::new(reqwest::Client::new()));
    let before = SystemTime::now();
    let request = http::Request::get(url)
        .body(reqwest::Body::from(""))
        .unwrap();
    assert_eq!(client.oneshot(request).await.unwrap().status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    let mut last = Duration::MAX;
    for attempt in seen.iter() {
        let wire = WireDeadline::from_headers(&attempt.headers)
            .unwrap()
            .expect("X-Request-Deadline on every attempt");
        assert!(wire.sent() >= before - Duration::from_secs(1));
        assert!(wire.timeout() <= Duration::from_secs(5));
        assert!(wire.timeout() > Duration::from_secs(3), "{wire:?}");
        assert!(wire.timeout() < last, "what is left shrinks: {wire:?}");
        last = wire.timeout();
    }
}

#[tokio::test]
async fn retry_after_is_waited_for_within_the_cap() {
    let (url, seen) = serve(|n| {
        if n == 0 {
            (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")]).into_response()
        } else {
            StatusCode::OK.into_response()
        }
    })
    .await;
    let client = RetryLayer::new().layer(Reqwest::new(reqwest::Client::new()));
    let request = http::Request::get(url.as_str())
        .body(reqwest::Body::from(""))
        .unwrap();
    assert_eq!(client.oneshot(request).await.unwrap().status(), 200);
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        let waited = seen[1].at - seen[0].at;
        assert!(waited >= Duration::from_secs(1), "waited {waited:?}");
    }

    // Above the cap (2 s here): given up on at once, the failure returned.
    let (url, seen) =
        serve(|_| (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "60")]).into_response()).await;
    let layer = RetryLayer::builder()
        .max_retry_after(Duration::from_secs(2))
        .build()
        .unwrap();
    let client = layer.layer(Reqwest::new(reqwest::Client::new()));
    let request = http::Request::get(url)
        .body(reqwest::Body::from(""))
        .unwrap();
    let response = client.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 503);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.gave_up, Some(GiveUpReason::RetryAfterTooLong));
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_streaming_body_is_replayed_byte_for_byte() {
    let (url, seen) = serve(unavailable_then_ok).await;
    let chunks: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> = ["stream", "ed ", "body"]
        .into_iter()
        .map(|c| Ok(http_body::Frame::data(Bytes::from(c))))
        .collect();
    let body = reqwest::Body::wrap(http_body_util::StreamBody::new(futures_util::stream::iter(
        chunks,
    )));
    // reqwest cannot clone it: its own retry sends it once, and reqwest-retry (0.9) fails
    // it before sending ("Request object is not cloneable").
    let probe = reqwest::Request::try_from(
        http::Request::put(url.as_str())
            .body(reqwest::Body::wrap(http_body_util::StreamBody::new(
                futures_util::stream::iter(
                    Vec::<Result<http_body::Frame<Bytes>, std::io::Error>>::new(),
                ),
            )))
            .unwrap(),
    )
    .unwrap();
    assert!(probe.try_clone().is_none());

    let client = RetryLayer::new().layer(Reqwest::new(reqwest::Client::new()));
    let request = http::Request::put(url).body(body).unwrap();
    assert_eq!(client.oneshot(request).await.unwrap().status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(attempts_on_the_wire(&seen), ["0", "1", "2"]);
    for attempt in seen.iter() {
        assert_eq!(attempt.body, "streamed body");
    }
}

#[tokio::test]
async fn connection_refused_is_retried_and_given_up_on() {
    // A port nobody listens on: bound, then closed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = RetryLayer::new().layer(Reqwest::new(reqwest::Client::new()));
    let request = http::Request::get(format!("http://{addr}/"))
        .body(reqwest::Body::from(""))
        .unwrap();
    let err = client.oneshot(request).await.unwrap_err();
    let gave_up = err
        .downcast_ref::<backoff_layer::GaveUp>()
        .unwrap_or_else(|| panic!("expected GaveUp, got {err:?}"));
    assert_eq!(gave_up.reason(), GiveUpReason::MaxAttempts);
    assert_eq!(gave_up.attempts(), 3);
}

mod through_reqwest_middleware {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use backoff_layer::reqwest::RetryMiddleware;
    use std::future::Future;
    use std::pin::Pin;

    use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Next};

    type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

    use super::*;

    fn client(layer: RetryLayer) -> ClientWithMiddleware {
        ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::from(layer))
            .build()
    }

    static RUNS: AtomicUsize = AtomicUsize::new(0);

    /// A middleware that counts its runs.
    fn counted<'a>(
        request: reqwest::Request,
        extensions: &'a mut http::Extensions,
        next: Next<'a>,
    ) -> BoxFuture<'a, reqwest_middleware::Result<reqwest::Response>> {
        RUNS.fetch_add(1, Ordering::Relaxed);
        next.run(request, extensions)
    }

    /// A middleware after ours runs once per attempt: each attempt is the rest of the chain.
    #[tokio::test]
    async fn each_attempt_runs_the_middlewares_after_it() {
        let (url, seen) = serve(unavailable_then_ok).await;
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::new())
            .with(counted)
            .build();
        let response = client.get(url).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.extensions().get::<RetryInfo>().unwrap().attempts,
            3
        );
        assert_eq!(RUNS.load(Ordering::Relaxed), 3);
        assert_eq!(attempts_on_the_wire(&seen.lock().unwrap()), ["0", "1", "2"]);
    }

    #[tokio::test]
    async fn the_stop_signal_is_an_error_the_caller_can_match() {
        let (url, seen) = serve(|_| {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [("x-overloaded", "stop-retrying")],
            )
                .into_response()
        })
        .await;
        let err = client(RetryLayer::new()).get(url).send().await.unwrap_err();
        assert!(
            matches!(err, reqwest_middleware::Error::Middleware(_)),
            "{err:?}"
        );
        assert!(is_overloaded(&err), "{err:?}");
        assert_eq!(seen.lock().unwrap().len(), 1, "one attempt, no retry");
    }

    #[tokio::test]
    async fn a_streaming_body_is_replayed() {
        let (url, seen) = serve(unavailable_then_ok).await;
        let chunks: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> = ["a ", "stream"]
            .into_iter()
            .map(|c| Ok(http_body::Frame::data(Bytes::from(c))))
            .collect();
        let body = reqwest::Body::wrap(http_body_util::StreamBody::new(
            futures_util::stream::iter(chunks),
        ));
        let response = client(RetryLayer::new())
            .put(url)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let seen = seen.lock().unwrap();
        assert_eq!(attempts_on_the_wire(&seen), ["0", "1", "2"]);
        assert!(seen.iter().all(|s| s.body == "a stream"));
    }

    /// reqwest's own error, after the layer gave up, is in the chain under the `GaveUp`.
    #[tokio::test]
    async fn errors_keep_their_kind() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", closed.local_addr().unwrap());
        drop(closed);
        let gave_up = |err: &reqwest_middleware::Error| {
            let chain = std::iter::successors(Some(err as &dyn std::error::Error), |e| e.source());
            let mut gave_up = None;
            let mut connect = false;
            for e in chain {
                gave_up = gave_up.or(e
                    .downcast_ref::<backoff_layer::GaveUp>()
                    .map(|g| (g.reason(), g.attempts())));
                connect |= e
                    .downcast_ref::<reqwest::Error>()
                    .is_some_and(reqwest::Error::is_connect);
            }
            assert!(connect, "reqwest's connect error in the chain: {err:?}");
            gave_up.unwrap_or_else(|| panic!("expected GaveUp in the chain, got {err:?}"))
        };
        let err = client(RetryLayer::new())
            .get(url.as_str())
            .send()
            .await
            .unwrap_err();
        assert_eq!(gave_up(&err), (GiveUpReason::MaxAttempts, 3));

        // POST is not retried: one attempt.
        let err = client(RetryLayer::new())
            .post(url)
            .send()
            .await
            .unwrap_err();
        assert_eq!(gave_up(&err), (GiveUpReason::NotRetryable, 1));
    }

    /// reqwest's own timeout (`ClientBuilder::timeout`) is retried through the middleware.
    #[tokio::test]
    async fn a_reqwest_timeout_is_retried() {
        // Accepts, never answers.
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", silent.local_addr().unwrap());
        let reqwest = reqwest::Client::builder()
            .timeout(Duration::from_millis(50))
            .build()
            .unwrap();
        let client = ClientBuilder::new(reqwest)
            .with(RetryMiddleware::new())
            .build();
        let err = client.get(url).send().await.unwrap_err();
        let gave_up = std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
            .find_map(|e| e.downcast_ref::<backoff_layer::GaveUp>())
            .unwrap_or_else(|| panic!("expected GaveUp in the chain, got {err:?}"));
        assert_eq!(gave_up.reason(), GiveUpReason::MaxAttempts);
        assert_eq!(gave_up.attempts(), 3);
        assert!(backoff_layer::classify::is_timeout(&err));
        drop(silent);
    }
}
