//! Clock skew between a client and a server (issue 22), on 127.0.0.1: the client's retry
//! layer sends `X-Request-Deadline` (a send time on its clock, and a timeout); the server's
//! `DeadlineLayer` reads the send time on a clock that is ahead of the client's, or behind,
//! by a set amount (a `TokioWallClock` started that far from the system's time). The
//! default skew allowance is 250 ms:
//!
//! - **within the allowance**, either way, the server serves: a request is dropped only once
//!   its deadline has passed by more than the allowance, so a clock 200 ms ahead serves
//!   even a request with 100 ms left (and gives its handler the time until its work would
//!   be cancelled, never more than the 100 ms its caller gave); a clock behind
//!   never gives a request more than its timeout, counted from arrival;
//! - **beyond it, ahead**: the server cannot tell skew from queueing, and every request
//!   looks older by the skew: one with less time left than the skew minus the allowance is
//!   answered `504` at once, its handler never run (a 1 s request, 2 s ahead); one with
//!   more is served with the skew taken from its time (a 3 s request, 2 s ahead: 1 s left);
//! - **beyond it, behind**: the send time lies in the server's future, so the server knows
//!   the clocks disagree and counts the timeout from arrival, as gRPC does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::routing::get;
use backoff_layer::{ReplayBody, RetryLayer};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use overload_core::clock::TokioWallClock;
use overload_signal::DeadlineLayer;
use overload_signal::axum_0_8::into_make_service_with_peer_addr;
use overload_signal::deadline::{self, RequestDeadline};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::{Layer, ServiceExt};

/// How the server's clock stands against the client's.
#[derive(Clone, Copy, Debug)]
enum Skew {
    Ahead(Duration),
    Behind(Duration),
}

struct Server {
    url: String,
    handled: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A server whose deadline layer (default allowance) reads a clock off by `skew`; its
/// handler answers with the time left it was given, in whole milliseconds.
async fn server(skew: Skew) -> Server {
    let start = match skew {
        Skew::Ahead(by) => SystemTime::now() + by,
        Skew::Behind(by) => SystemTime::now() - by,
    };
    let layer = DeadlineLayer::builder()
        .wall_clock(TokioWallClock::starting_at(start))
        .build()
        .unwrap();
    assert_eq!(layer.skew_allowance(), Duration::from_millis(250));
    let handled = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&handled);
    let router = Router::new()
        .route(
            "/api",
            get(move || {
                count.fetch_add(1, Ordering::SeqCst);
                async {
                    let left = deadline::time_left().expect("a deadline");
                    left.as_millis().to_string()
                }
            }),
        )
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, into_make_service_with_peer_addr(router))
            .await
            .unwrap();
    });
    Server { url, handled, task }
}

/// One attempt (no retry) with a caller's deadline `timeout` from now; the status and the
/// time left the handler was given.
async fn call(server: &Server, timeout: Duration) -> (StatusCode, Option<Duration>) {
    let client = RetryLayer::builder()
        .max_attempts(1)
        .build()
        .unwrap()
        .layer(Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Empty<Bytes>>>());
    let mut request = Request::get(&server.url).body(Empty::new()).unwrap();
    request
        .extensions_mut()
        .insert(RequestDeadline::after(timeout));
    let response = client.oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let left = std::str::from_utf8(&body)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis);
    (status, left)
}

const MS: Duration = Duration::from_millis(1);

/// What the deadline layer wrote since the last snapshot (a snapshot drains the
/// recorder), by name and `when` label (the expired counter's). The test runs on one thread
/// (tokio's current-thread runtime), server tasks included, so a thread-local recorder sees
/// them.
fn drain(snapshotter: &Snapshotter) -> BTreeMap<(String, Option<String>), DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let when = key
                .key()
                .labels()
                .find(|l| l.key() == "when")
                .map(|l| l.value().to_owned());
            ((key.key().name().to_owned(), when), value)
        })
        .collect()
}

fn key(name: &str, when: Option<&str>) -> (String, Option<String>) {
    (name.to_owned(), when.map(str::to_owned))
}

/// `left` is `expected`, to within what the round trip on a loaded machine takes.
fn about(left: Option<Duration>, expected: Duration) -> bool {
    left.is_some_and(|left| left <= expected && left + 150 * MS >= expected)
}

#[tokio::test]
async fn a_server_ahead_within_the_allowance_still_serves() {
    let server = server(Skew::Ahead(200 * MS)).await;
    // A second: served, the skew taken from its time.
    let (status, left) = call(&server, 1000 * MS).await;
    assert_eq!(status, StatusCode::OK);
    assert!(about(left, 800 * MS), "{left:?}");
    // 100 ms, less than the skew: still served, as work its caller waits for, with the
    // time until its work would be cancelled (150 ms, less the round trip), but never more
    // than the caller gave (issue 30, finding 7: it used to run with nothing left).
    let (status, left) = call(&server, 100 * MS).await;
    assert_eq!(status, StatusCode::OK);
    assert!(about(left, 100 * MS), "{left:?}");
    assert_eq!(server.handled.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_server_behind_within_the_allowance_still_serves_and_never_gives_more_time() {
    let server = server(Skew::Behind(200 * MS)).await;
    let (status, left) = call(&server, 1000 * MS).await;
    assert_eq!(status, StatusCode::OK);
    // Not 1.2 s: a send time in the future counts as now.
    assert!(about(left, 1000 * MS), "{left:?}");
}

#[tokio::test]
async fn a_server_ahead_beyond_the_allowance_drops_what_has_less_time_than_the_skew() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let server = server(Skew::Ahead(2000 * MS)).await;
    // 1 s to go, but the request looks 2 s old: answered 504 at once, never handled.
    let (status, _) = call(&server, 1000 * MS).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(server.handled.load(Ordering::SeqCst), 0);
    // Counted as expired on arrival, with the skew as its time queued.
    let mut metrics = drain(&snapshotter);
    assert_eq!(
        metrics.remove(&key(
            "overload_signal_deadline_expired_total",
            Some("arrival")
        )),
        Some(DebugValue::Counter(1))
    );
    let Some(DebugValue::Histogram(queued)) = metrics.remove(&key(
        "overload_signal_deadline_expired_queued_seconds",
        None,
    )) else {
        panic!("the queued time is recorded");
    };
    let queued = queued[0].into_inner();
    assert!((2.0..2.2).contains(&queued), "{queued}");
    // 3 s to go: served, with the 2 s of skew taken from it.
    let (status, left) = call(&server, 3000 * MS).await;
    assert_eq!(status, StatusCode::OK);
    assert!(about(left, 1000 * MS), "{left:?}");
}

#[tokio::test]
async fn a_server_behind_beyond_the_allowance_counts_the_timeout_from_arrival() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let far = server(Skew::Behind(2000 * MS)).await;
    let (status, left) = call(&far, 1000 * MS).await;
    assert_eq!(status, StatusCode::OK);
    assert!(about(left, 1000 * MS), "{left:?}");
    // The layer says the clocks disagree: counted as skewed (and logged once).
    let skewed = "overload_signal_deadline_skewed_total";
    assert_eq!(
        drain(&snapshotter).remove(&key(skewed, None)),
        Some(DebugValue::Counter(1))
    );

    // Within the allowance the same request is not skewed (the two layers share the name
    // `default`, and so the series).
    let near = server(Skew::Behind(200 * MS)).await;
    let (status, _) = call(&near, 1000 * MS).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        drain(&snapshotter).remove(&key(skewed, None)),
        Some(DebugValue::Counter(0))
    );
}
