//! The client-side throttle inside the retry layer (issue 21), under paused time: the
//! layer's own ticker closes the window's slots every 200 ms of virtual time.
//!
//! A downstream serves requests at 100 per second (one every 10 ms); what it answers
//! depends on the request's destination and on the test's switch.

use crate::support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use backoff_layer::backoff::Seeds;
use backoff_layer::throttle::Throttle;
use backoff_layer::{BoxError, ReplayBody, RetryLayer, Throttled, is_throttled};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use overload_signal::protocol::Attempt;
use support::{Logs, MS};
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt, service_fn};
use tracing::Level;

type Req = Request<ReplayBody<Empty<Bytes>>>;
type Client = BoxCloneService<Request<Empty<Bytes>>, Response<Empty<Bytes>>, BoxError>;

/// What the downstream saw: first attempts and retries, per destination.
#[derive(Clone, Default)]
struct Seen {
    bad_first: Arc<AtomicU64>,
    bad_retries: Arc<AtomicU64>,
    good: Arc<AtomicU64>,
}

/// A downstream: `http://good.test` answers 200; `http://bad.test` answers 503 while `down`
/// is set, 200 otherwise.
fn downstream(layer: &RetryLayer, down: &Arc<AtomicBool>, seen: &Seen) -> Client {
    let (down, seen) = (Arc::clone(down), seen.clone());
    BoxCloneService::new(layer.layer(service_fn(move |r: Req| {
        let bad = r.uri().host() == Some("bad.test");
        let status = if bad {
            let counter = if Attempt::from_request(&r).is_retry() {
                &seen.bad_retries
            } else {
                &seen.bad_first
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if down.load(Ordering::Relaxed) {
                503
            } else {
                200
            }
        } else {
            seen.good.fetch_add(1, Ordering::Relaxed);
            200
        };
        async move {
            let mut response = Response::new(Empty::new());
            *response.status_mut() = StatusCode::from_u16(status).unwrap();
            Ok::<_, Infallible>(response)
        }
    })))
}

fn get(host: &str) -> Request<Empty<Bytes>> {
    Request::get(format!("http://{host}/api"))
        .body(Empty::new())
        .unwrap()
}

/// The default layer, seeded.
fn layer() -> RetryLayer {
    RetryLayer::builder()
        .seeds(Seeds::from_seed(21))
        .build()
        .unwrap()
}

/// How the requests of one period ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Ended {
    ok: u64,
    /// Ended in a failure response or an error other than a refusal.
    failed: u64,
    refused: u64,
}

/// Sends one request to `host` every 10 ms for `for_`, each in its own task (so a request
/// in backoff does not hold the others back), and waits for them all.
async fn drive(client: &Client, host: &'static str, for_: Duration) -> Ended {
    let mut tasks = tokio::task::JoinSet::new();
    let end = Instant::now() + for_;
    while Instant::now() < end {
        let client = client.clone();
        tasks.spawn(async move {
            let start = Instant::now();
            let outcome = client.oneshot(get(host)).await;
            (outcome, start.elapsed())
        });
        tokio::time::sleep(10 * MS).await;
    }
    let mut ended = Ended::default();
    while let Some(done) = tasks.join_next().await {
        match done.unwrap() {
            (Ok(r), _) if r.status() == StatusCode::OK => ended.ok += 1,
            (Ok(_), _) => ended.failed += 1,
            (Err(e), elapsed) if is_throttled(&*e) => {
                assert!(e.is::<Throttled>(), "returned as it is: {e}");
                assert_eq!(elapsed, Duration::ZERO, "a refusal fails at once");
                ended.refused += 1;
            }
            (Err(_), _) => ended.failed += 1,
        }
    }
    ended
}

/// The first rule: a request refused is never sent, and fails at once with a
/// typed error; about nine in ten are refused once a destination keeps failing.
#[tokio::test(start_paused = true)]
async fn a_failing_destination_is_refused_locally_and_the_refused_are_never_sent() {
    let down = Arc::new(AtomicBool::new(true));
    let seen = Seen::default();
    let client = downstream(&layer(), &down, &seen);
    let ended = drive(&client, "bad.test", Duration::from_secs(10)).await;
    let total = ended.ok + ended.failed + ended.refused;
    assert_eq!(total, 1_000);
    assert_eq!(ended.ok, 0);
    // The first request's retries cannot be refused (retries are the budget's): every
    // request that was not refused was sent, and every one sent failed.
    assert_eq!(seen.bad_first.load(Ordering::Relaxed), ended.failed);
    let refused = ended.refused as f64 / total as f64;
    assert!((0.8..=0.9).contains(&refused), "refused {refused}");
}

/// Refused requests make no deposit: the retries of a throttled destination shrink with
/// what is sent, within the budget's 10 % and its floor of one a second.
#[tokio::test(start_paused = true)]
async fn the_budget_still_governs_retries_and_refusals_earn_none() {
    let down = Arc::new(AtomicBool::new(true));
    let seen = Seen::default();
    let client = downstream(&layer(), &down, &seen);
    let _ = drive(&client, "bad.test", Duration::from_secs(30)).await;
    let first = seen.bad_first.load(Ordering::Relaxed);
    let retries = seen.bad_retries.load(Ordering::Relaxed);
    // Without the throttle: 3 000 first attempts, so up to 330 retries in 30 s.
    assert!(first < 500, "{first} first attempts sent");
    assert!(
        retries as f64 <= 0.1 * first as f64 + 3.0 * 10.0 + 10.0,
        "{retries} retries for {first} first attempts"
    );
}

/// The scope: one client stack, two destinations, one failing: no request to the
/// healthy one is ever refused.
#[tokio::test(start_paused = true)]
async fn a_failing_destination_never_throttles_a_healthy_one_behind_the_same_stack() {
    let down = Arc::new(AtomicBool::new(true));
    let seen = Seen::default();
    let client = downstream(&layer(), &down, &seen);
    let (bad, good) = tokio::join!(
        drive(&client, "bad.test", Duration::from_secs(20)),
        drive(&client, "good.test", Duration::from_secs(20)),
    );
    assert!(bad.refused > 1_500, "{bad:?}");
    assert_eq!(
        good,
        Ended {
            ok: 2_000,
            failed: 0,
            refused: 0
        }
    );
    assert_eq!(seen.good.load(Ordering::Relaxed), 2_000);
}

/// Recovery: once the destination answers again, the throttle lets every request through
/// within a second.
#[tokio::test(start_paused = true)]
async fn it_reopens_within_a_second_of_recovery() {
    let down = Arc::new(AtomicBool::new(true));
    let seen = Seen::default();
    let client = downstream(&layer(), &down, &seen);
    let _ = drive(&client, "bad.test", Duration::from_secs(10)).await;
    down.store(false, Ordering::Relaxed);
    let first_second = drive(&client, "bad.test", Duration::from_secs(1)).await;
    assert!(first_second.refused < 100, "{first_second:?}");
    let after = drive(&client, "bad.test", Duration::from_secs(10)).await;
    assert_eq!(
        after,
        Ended {
            ok: 1_000,
            failed: 0,
            refused: 0
        }
    );
}

/// A healthy destination, for a minute at 100 requests a second: nothing refused.
#[tokio::test(start_paused = true)]
async fn a_healthy_destination_sees_every_request() {
    let down = Arc::new(AtomicBool::new(false));
    let seen = Seen::default();
    let client = downstream(&layer(), &down, &seen);
    let ended = drive(&client, "bad.test", Duration::from_secs(60)).await;
    assert_eq!(
        ended,
        Ended {
            ok: 6_000,
            failed: 0,
            refused: 0
        }
    );
}

/// The switch: without a throttle every request is sent, however its destination fails.
#[tokio::test(start_paused = true)]
async fn no_throttle_sends_every_request() {
    let down = Arc::new(AtomicBool::new(true));
    let seen = Seen::default();
    let layer = RetryLayer::builder()
        .seeds(Seeds::from_seed(21))
        .no_throttle()
        .build()
        .unwrap();
    let client = downstream(&layer, &down, &seen);
    let ended = drive(&client, "bad.test", Duration::from_secs(10)).await;
    assert_eq!(ended.refused, 0);
    assert_eq!(seen.bad_first.load(Ordering::Relaxed), 1_000);
}

/// A throttle shared by two layers sees both layers' load, and refuses for both.
#[tokio::test(start_paused = true)]
async fn a_shared_throttle_sees_every_layers_load() {
    let down = Arc::new(AtomicBool::new(true));
    let seen = Seen::default();
    let throttle = Throttle::builder().name("inventory").build().unwrap();
    let with = |name: &str| {
        RetryLayer::builder()
            .name(name)
            .throttle(throttle.clone())
            .seeds(Seeds::from_seed(21))
            .build()
            .unwrap()
    };
    let (reads, writes) = (
        downstream(&with("reads"), &down, &seen),
        downstream(&with("writes"), &down, &seen),
    );
    let _ = drive(&reads, "bad.test", Duration::from_secs(5)).await;
    // The other layer has sent nothing yet, and is refused all the same.
    let ended = drive(&writes, "bad.test", Duration::from_secs(5)).await;
    assert!(ended.refused > 350, "{ended:?}");
    assert!(throttle.probability(&"http://bad.test/".parse().unwrap()) > 0.5);
}

/// Attempts that time out under the layer are failures: a downstream that never answers
/// is throttled too.
#[tokio::test(start_paused = true)]
async fn timeouts_count_as_failures() {
    let layer = RetryLayer::builder()
        .seeds(Seeds::from_seed(21))
        .attempt_timeout(Duration::from_millis(500))
        .max_attempts(1)
        .build()
        .unwrap();
    let client: Client = BoxCloneService::new(layer.layer(service_fn(|_: Req| async {
        std::future::pending::<Result<Response<Empty<Bytes>>, Infallible>>().await
    })));
    let ended = drive(&client, "bad.test", Duration::from_secs(10)).await;
    assert!(ended.refused > 700, "{ended:?}");
    assert_eq!(ended.ok, 0);
}

/// What a retry layer below refused is final above: returned as it is, never retried, and
/// never counted as a failure of the destination by the layer above's throttle.
#[tokio::test(start_paused = true)]
async fn a_refusal_below_is_final_above() {
    let down = Arc::new(AtomicBool::new(true));
    let seen = Seen::default();
    let inner = downstream(&layer(), &down, &seen);
    let outer = RetryLayer::builder()
        .name("outer")
        .seeds(Seeds::from_seed(1))
        .build()
        .unwrap();
    let outer_retries = Arc::new(AtomicU64::new(0));
    let client: Client = BoxCloneService::new(outer.layer(service_fn({
        let inner = inner.clone();
        let retries = Arc::clone(&outer_retries);
        move |r: Req| {
            if Attempt::from_request(&r).is_retry() {
                retries.fetch_add(1, Ordering::Relaxed);
            }
            let inner = inner.clone();
            let (parts, _) = r.into_parts();
            async move {
                inner
                    .oneshot(Request::from_parts(parts, Empty::new()))
                    .await
            }
        }
    })));
    let ended = drive(&client, "bad.test", Duration::from_secs(10)).await;
    assert!(ended.refused > 500, "{ended:?}");
    // The outer layer retried nothing: neither the refusals (final) nor the 503s the inner
    // layer gave up on.
    assert_eq!(outer_retries.load(Ordering::Relaxed), 0);
}

/// One `WARN` when a destination's throttling begins, with its name and destination, and
/// one `INFO` when it ends, whatever the number of refusals.
#[tokio::test(start_paused = true)]
async fn throttling_logs_once_when_it_begins_and_once_when_it_ends() {
    let (logs, _guard) = Logs::capture();
    let down = Arc::new(AtomicBool::new(true));
    let seen = Seen::default();
    let layer = RetryLayer::builder()
        .name("search")
        .seeds(Seeds::from_seed(21))
        .build()
        .unwrap();
    let client = downstream(&layer, &down, &seen);
    let ended = drive(&client, "bad.test", Duration::from_secs(10)).await;
    assert!(ended.refused > 500);
    let warnings: Vec<_> = logs
        .at(Level::WARN)
        .into_iter()
        .filter(|l| l.message.contains("client-side throttling"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert_eq!(warnings[0].fields["name"], "search");
    assert_eq!(warnings[0].fields["destination"], "http://bad.test:80");
    down.store(false, Ordering::Relaxed);
    let _ = drive(&client, "bad.test", Duration::from_secs(3)).await;
    let ended: Vec<_> = logs
        .at(Level::INFO)
        .into_iter()
        .filter(|l| l.message.contains("client-side throttling ended"))
        .collect();
    assert_eq!(ended.len(), 1, "{ended:#?}");
    assert_eq!(ended[0].fields["destination"], "http://bad.test:80");
    let lasted: u64 = ended[0].fields["lasted_ms"].parse().unwrap();
    assert!((9_000..=11_000).contains(&lasted), "{lasted}");
}
