//! The deadline layer's behaviour, under paused tokio time, with tower-test's mock service
//! where the inner service's calls matter.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use http::{HeaderValue, Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use overload_core::clock::TokioWallClock;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt, service_fn};

use super::*;
use crate::protocol::{GRPC_STATUS, GRPC_TIMEOUT, WireDeadline, X_REQUEST_DEADLINE};

const MS: Duration = Duration::from_millis(1);

/// A request carrying `X-Request-Deadline`: sent `ago` before now on the test's wall clock,
/// with `timeout`, by a caller on this host (whose send times the default trust believes).
fn sent(wall: &TokioWallClock, ago: Duration, timeout: Duration) -> Request<String> {
    use overload_core::clock::WallClock;
    let mut req = from_this_host(Request::new(String::new()));
    WireDeadline::new(wall.now() - ago, timeout).set(req.headers_mut());
    req
}

/// `req`, from a caller on this host: its peer address is 127.0.0.1.
fn from_this_host(mut req: Request<String>) -> Request<String> {
    req.extensions_mut()
        .insert(std::net::SocketAddr::from(([127, 0, 0, 1], 40_000)));
    req
}

fn grpc(timeout: &'static str) -> Request<String> {
    let mut req = Request::new(String::new());
    req.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    req.headers_mut()
        .insert(GRPC_TIMEOUT, HeaderValue::from_static(timeout));
    req
}

/// A wall clock on a whole millisecond (the field's resolution), moved by paused time.
fn wall() -> TokioWallClock {
    TokioWallClock::starting_at(SystemTime::UNIX_EPOCH + Duration::from_millis(1_767_225_600_000))
}

/// A layer reading a wall clock that tokio's paused time moves, with `allowance`.
fn layer(wall: TokioWallClock, allowance: Duration) -> DeadlineLayer {
    DeadlineLayer::builder()
        .wall_clock(wall)
        .skew_allowance(allowance)
        .build()
        .unwrap()
}

/// A service that counts its calls, takes `work`, and answers with the time left it saw.
fn worker(
    work: Duration,
) -> (
    impl Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone,
    Arc<AtomicUsize>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let svc = service_fn(move |_req: Request<String>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let left = time_left().map_or("none".to_owned(), |d| format!("{}", d.as_millis()));
            tokio::time::sleep(work).await;
            Ok::<_, Infallible>(Response::new(left))
        }
    });
    (svc, calls)
}

#[tokio::test(start_paused = true)]
async fn a_request_that_queued_past_its_deadline_is_answered_at_once_without_the_handler() {
    let wall = wall();
    let (svc, calls) = worker(Duration::ZERO);
    let svc = layer(wall, 250 * MS).layer(svc);
    let start = Instant::now();
    // Sent 3 s ago with a 2 s timeout: expired by 1 s, more than the allowance.
    let response = svc
        .clone()
        .oneshot(sent(&wall, 3000 * MS, 2000 * MS))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(response.body(), "");
    assert_eq!(start.elapsed(), Duration::ZERO, "at once");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler never ran");
    // Expired by less than the allowance: served (a clock ahead by that much is no reason
    // to drop it), with the time until its work would be cancelled.
    let response = svc
        .clone()
        .oneshot(sent(&wall, 2200 * MS, 2000 * MS))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.body(), "50");
    // Queued 500 ms of its 2 s: served, with 1.5 s left.
    let response = svc.oneshot(sent(&wall, 500 * MS, 2000 * MS)).await.unwrap();
    assert_eq!(response.body(), "1500");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn work_still_running_at_its_deadline_is_cancelled_unless_the_user_opts_out() {
    let wall = wall();
    // The handler takes 5 s; the caller waits 1 s, sent just now.
    let (svc, _) = worker(5000 * MS);
    let dropped = Arc::new(AtomicUsize::new(0));
    struct OnDrop(Arc<AtomicUsize>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let guard = Arc::clone(&dropped);
    let svc = svc.map_future(move |f| {
        let guard = OnDrop(Arc::clone(&guard));
        async move {
            let _guard = guard;
            f.await
        }
    });
    let start = Instant::now();
    let response = layer(wall, 250 * MS)
        .layer(svc.clone())
        .oneshot(sent(&wall, Duration::ZERO, 1000 * MS))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        start.elapsed(),
        1250 * MS,
        "the deadline plus the skew allowance"
    );
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the work was dropped");

    let keep_going = DeadlineLayer::builder()
        .wall_clock(wall)
        .cancel_at_deadline(false)
        .build()
        .unwrap();
    assert!(!keep_going.cancel_at_deadline());
    let start = Instant::now();
    let response = keep_going
        .layer(svc)
        .oneshot(sent(&wall, Duration::ZERO, 1000 * MS))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), 5000 * MS, "ran to its end");
}

#[tokio::test(start_paused = true)]
async fn a_send_time_from_the_future_beyond_the_allowance_falls_back_to_the_timeout() {
    let wall = wall();
    let ahead = |by: Duration| {
        let mut req = Request::new(String::new());
        use overload_core::clock::WallClock;
        WireDeadline::new(wall.now() + by, 1000 * MS).set(req.headers_mut());
        req
    };
    let (svc, _) = worker(Duration::ZERO);
    let svc = layer(wall, 250 * MS).layer(svc);
    // Within the allowance: as if sent now.
    let r = svc.clone().oneshot(ahead(200 * MS)).await.unwrap();
    assert_eq!(r.body(), "1000");
    // Far ahead: the sender's clock is wrong; the timeout counts from arrival, never more.
    let r = svc.oneshot(ahead(60_000 * MS)).await.unwrap();
    assert_eq!(r.body(), "1000");
}

#[tokio::test(start_paused = true)]
async fn grpc_reads_grpc_timeout_from_arrival_and_answers_deadline_exceeded() {
    let (svc, calls) = worker(3000 * MS);
    let svc = DeadlineLayer::new().layer(svc);
    let start = Instant::now();
    let r = svc.clone().oneshot(grpc("1S")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[GRPC_STATUS], "4");
    assert_eq!(
        start.elapsed(),
        1000 * MS,
        "no allowance: no send time to doubt"
    );
    let r = svc.clone().oneshot(grpc("0m")).await.unwrap();
    assert_eq!(r.headers()[GRPC_STATUS], "4");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a zero timeout never runs");
    // An HTTP request's grpc-timeout means nothing.
    let mut http = grpc("1m");
    http.headers_mut().remove("content-type");
    let r = svc.oneshot(http).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.body(), "none");
}

#[tokio::test(start_paused = true)]
async fn grpc_web_reads_grpc_timeout_and_answers_in_its_own_content_type() {
    let (svc, calls) = worker(3000 * MS);
    let svc = DeadlineLayer::new().layer(svc);
    for (content_type, answer) in [
        ("application/grpc-web+proto", "application/grpc-web+proto"),
        (
            "application/grpc-web-text",
            "application/grpc-web-text+proto",
        ),
    ] {
        let mut req = grpc("1S");
        req.headers_mut()
            .insert("content-type", HeaderValue::from_static(content_type));
        let start = Instant::now();
        let r = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{content_type}");
        assert_eq!(r.headers()[GRPC_STATUS], "4", "{content_type}");
        assert_eq!(r.headers()["content-type"], answer);
        assert_eq!(start.elapsed(), 1000 * MS, "cancelled at its grpc-timeout");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn malformed_fields_are_ignored_and_counted_never_an_error() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let (svc, calls) = worker(Duration::ZERO);
    let svc = DeadlineLayer::builder()
        .name("api")
        .build()
        .unwrap()
        .layer(svc);
    for junk in [
        "t=1, timeout=-1",
        "timeout=5",
        "",
        "t=99999999999999999999, timeout=1",
        // Issue 30, finding 7: a send time no clock can read.
        "t=999999999999999, timeout=1",
    ] {
        let mut req = Request::new(String::new());
        req.headers_mut()
            .insert(X_REQUEST_DEADLINE, HeaderValue::from_static(junk));
        let r = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(
            (r.status(), r.body().as_str()),
            (StatusCode::OK, "none"),
            "{junk:?}"
        );
    }
    let r = svc.oneshot(grpc("1.5S")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    let malformed = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, ..)| key.key().name() == crate::metric_names::DEADLINE_MALFORMED)
        .map(|(key, _, _, value)| {
            let labels: Vec<_> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (labels, value)
        });
    assert_eq!(
        malformed,
        Some((
            vec![("name".to_owned(), "api".to_owned())],
            DebugValue::Counter(6)
        ))
    );
}

#[tokio::test(start_paused = true)]
async fn expired_requests_are_counted_with_the_time_they_queued() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let wall = wall();
    let (svc, _) = worker(5000 * MS);
    let svc = layer(wall, Duration::ZERO).layer(svc);
    for ago in [3000, 4000] {
        let r = svc
            .clone()
            .oneshot(sent(&wall, ago * MS, 2000 * MS))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    }
    let r = svc
        .oneshot(sent(&wall, Duration::ZERO, 1000 * MS))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    let mut seen = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let when = key
            .key()
            .labels()
            .find(|l| l.key() == "when")
            .map(|l| l.value().to_owned());
        seen.insert((key.key().name().to_owned(), when), value);
    }
    let mut take = |name: &str, when: Option<&str>| {
        seen.remove(&(name.to_owned(), when.map(str::to_owned)))
            .unwrap_or_else(|| panic!("{name} {when:?} registered"))
    };
    let expired = crate::metric_names::DEADLINE_EXPIRED;
    assert_eq!(take(expired, Some("arrival")), DebugValue::Counter(2));
    assert_eq!(take(expired, Some("running")), DebugValue::Counter(1));
    let DebugValue::Histogram(queued) = take(crate::metric_names::DEADLINE_EXPIRED_QUEUED, None)
    else {
        panic!("a histogram");
    };
    let queued: Vec<f64> = queued.into_iter().map(|v| v.into_inner()).collect();
    assert_eq!(queued, [3.0, 4.0]);
    assert_eq!(
        take(crate::metric_names::DEADLINE_SKEWED, None),
        DebugValue::Counter(0),
        "registered at zero"
    );
}

#[tokio::test(start_paused = true)]
async fn the_current_deadline_of_an_outer_request_bounds_an_inner_one() {
    // An in-process tier: a handler behind one deadline layer calls a service behind
    // another with a request of its own, carrying a later deadline of its own.
    let wall = wall();
    let (inner, _) = worker(Duration::ZERO);
    let inner = layer(wall, Duration::ZERO).layer(inner);
    let outer = service_fn(move |_req: Request<String>| {
        let inner = inner.clone();
        async move {
            inner
                .oneshot(sent(&wall, Duration::ZERO, 10_000 * MS))
                .await
        }
    });
    let r = layer(wall, Duration::ZERO)
        .layer(outer)
        .oneshot(sent(&wall, Duration::ZERO, 700 * MS))
        .await
        .unwrap();
    assert_eq!(r.body(), "700", "the outer caller's 700 ms, not 10 s");
}

#[tokio::test(start_paused = true)]
async fn a_deadline_in_the_extensions_is_honoured() {
    let (svc, calls) = worker(Duration::ZERO);
    let svc = DeadlineLayer::new().layer(svc);
    let mut req = Request::new(String::new());
    req.extensions_mut()
        .insert(RequestDeadline::after(300 * MS));
    assert_eq!(svc.clone().oneshot(req).await.unwrap().body(), "300");
    let mut late = Request::new(String::new());
    late.extensions_mut()
        .insert(RequestDeadline::at(Instant::now()));
    let r = svc.oneshot(late).await.unwrap();
    assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn invalid_settings_are_refused_by_name() {
    let err = DeadlineLayer::builder()
        .skew_allowance(Duration::from_secs(61))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "skew_allowance");
    assert_eq!(
        err.to_string(),
        "skew_allowance must be at most 60s, got 61s"
    );
    let err = DeadlineLayer::builder().name("").build().unwrap_err();
    assert_eq!(err.field(), "name");
    let ok = DeadlineLayer::builder()
        .skew_allowance(Duration::from_secs(60))
        .build()
        .unwrap();
    assert_eq!(ok.skew_allowance(), DeadlineLayer::MAX_SKEW_ALLOWANCE);
    let defaults = DeadlineLayer::new();
    assert_eq!(defaults.skew_allowance(), Duration::from_millis(250));
    assert_eq!(
        defaults.skew_allowance(),
        DeadlineLayer::DEFAULT_SKEW_ALLOWANCE
    );
    assert!(defaults.cancel_at_deadline());
    assert_eq!(defaults.name().as_str(), "default");
}

#[test]
fn layer_and_service_are_send_sync_clone() {
    fn assert_traits<T: Clone + Send + Sync + 'static>() {}
    assert_traits::<DeadlineLayer>();
    assert_traits::<Deadline<()>>();
}

#[tokio::test(start_paused = true)]
async fn the_inner_services_call_sees_the_deadline_too() {
    // A proxy: a service whose `call` reads the deadline before any future runs, as a
    // retry layer right under the deadline layer does.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let inner = tower::util::MapRequest::new(
        service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }),
        move |req: Request<String>| {
            log.lock().unwrap().push(time_left());
            req
        },
    );
    let svc = DeadlineLayer::new().layer(inner);
    let mut req = Request::new(String::new());
    req.extensions_mut()
        .insert(RequestDeadline::after(Duration::from_millis(700)));
    svc.clone().oneshot(req).await.unwrap();
    svc.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [Some(Duration::from_millis(700)), None]
    );
}

/// Regression (issue 30, finding 7): a request admitted inside the skew allowance (its
/// deadline passed, on this server's clock, by less than the allowance) ran with
/// `time_left() == 0`, so every downstream call it made through the retry layer failed at
/// once. It now runs with the time until its work would be cancelled, never more than its
/// caller's timeout; a zero timeout, which leaves nothing to give, is expired on arrival.
#[tokio::test(start_paused = true)]
async fn a_request_admitted_inside_the_skew_allowance_runs_with_time_left() {
    let wall = wall();
    let (svc, calls) = worker(Duration::ZERO);
    let svc = layer(wall, 250 * MS).layer(svc);
    let call = |ago: u32, timeout: u32| {
        let svc = svc.clone();
        async move {
            let r = svc
                .oneshot(sent(&wall, ago * MS, timeout * MS))
                .await
                .unwrap();
            (r.status(), r.into_body())
        }
    };
    let served = |left: &str| (StatusCode::OK, left.to_owned());
    // 200 ms past a 2 s deadline: 50 ms until the work is cancelled, and the handler has
    // them to pass on.
    assert_eq!(call(2200, 2000).await, served("50"));
    // At the deadline: the whole allowance.
    assert_eq!(call(2000, 2000).await, served("250"));
    // 150 ms into a 100 ms timeout: 200 ms until the cancellation, but never more than the
    // caller gave.
    assert_eq!(call(150, 100).await, served("100"));
    // Before the deadline, as the clocks place it: what the caller has left, no more.
    assert_eq!(call(1999, 2000).await, served("1"));
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    // A zero timeout is expired on arrival, sent now or within the allowance's past or
    // future: the handler could only fail.
    for ago in [0, 100] {
        assert_eq!(call(ago, 0).await.0, StatusCode::GATEWAY_TIMEOUT, "{ago}");
    }
    let mut future = Request::new(String::new());
    use overload_core::clock::WallClock;
    WireDeadline::new(wall.now() + 100 * MS, Duration::ZERO).set(future.headers_mut());
    let r = svc.clone().oneshot(future).await.unwrap();
    assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(calls.load(Ordering::SeqCst), 4, "no handler ran");

    // The work is still cancelled where it was: at the deadline plus the allowance.
    let (slow, _) = worker(5000 * MS);
    let start = Instant::now();
    let r = layer(wall, 250 * MS)
        .layer(slow)
        .oneshot(sent(&wall, 2200 * MS, 2000 * MS))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(start.elapsed(), 50 * MS);
}

/// Regression (issue 30, finding 7): the future of a request expired on arrival answered a
/// fresh `504` on every poll after its first answer. A poll after the output panics now,
/// as tower's futures and the retry layer's do, whichever way the future ended.
#[tokio::test(start_paused = true)]
async fn a_future_polled_after_its_answer_panics() {
    use std::future::Future;
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    let wall = wall();
    let mut cx = Context::from_waker(Waker::noop());
    for (ago, status) in [
        (3000 * MS, StatusCode::GATEWAY_TIMEOUT), // expired on arrival
        (Duration::ZERO, StatusCode::OK),         // run to its end
    ] {
        let (svc, _) = worker(Duration::ZERO);
        let mut svc = layer(wall, Duration::ZERO).layer(svc);
        svc.ready().await.unwrap();
        let mut future = pin!(svc.call(sent(&wall, ago, 2000 * MS)));
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(r)) => assert_eq!(r.status(), status),
            other => panic!("answered at once: {other:?}"),
        }
        let again = catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx)));
        let panic = again.expect_err("a second output");
        let message = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str));
        assert_eq!(
            message,
            Some("deadline response future polled after completion"),
            "{status}"
        );
    }
}

/// A wall clock whose reader loses the CPU around each reading, as a thread preempted on a
/// loaded host does: it sleeps before and after reading the system's time of day.
struct PreemptedWallClock;

/// How long [`PreemptedWallClock`]'s reader is away, each side of the reading.
const PREEMPTED: Duration = Duration::from_millis(50);

impl overload_core::clock::WallClock for PreemptedWallClock {
    // NOTE: blocks the test's own thread on purpose: the pause is the point.
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> SystemTime {
        std::thread::sleep(PREEMPTED);
        let now = SystemTime::now();
        std::thread::sleep(PREEMPTED);
        now
    }
}

/// Regression (issue 30, finding 7): the layer read the wall clock (for the time queued)
/// before tokio's (for the deadline), so time passing between the two reads (a preempted
/// thread) moved the deadline later by that much, and a tier told its downstream more than
/// its caller had left: `deadline_tiers` saw 3 ms under load. It reads tokio's clock first
/// now, so such a pause only ever shortens the deadline.
#[tokio::test]
async fn a_pause_between_the_clock_reads_never_moves_the_deadline_later() {
    let svc = DeadlineLayer::builder()
        .wall_clock(PreemptedWallClock)
        .skew_allowance(Duration::ZERO)
        .build()
        .unwrap()
        .layer(service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(current().map(RequestDeadline::instant)))
        }));
    // The caller: sent 100 ms ago, waits a second. The wall clock is read before tokio's,
    // so on tokio's clock the send time is at most `before - 100 ms` (truncated to the
    // millisecond: earlier still), and the caller's deadline at most `before + 900 ms`.
    let sent_at = SystemTime::now();
    let before = Instant::now();
    let mut req = from_this_host(Request::new(String::new()));
    WireDeadline::new(sent_at - 100 * MS, 1000 * MS).set(req.headers_mut());
    let placed = svc
        .oneshot(req)
        .await
        .unwrap()
        .into_body()
        .expect("a deadline");
    let callers = before + 900 * MS;
    assert!(
        placed <= callers,
        "the layer placed the deadline {:?} after the caller's",
        placed - callers
    );
}

/// Every counter of `snapshotter`, by name and `reason` label (`""` without one). One
/// snapshot: the debugging recorder resets what a snapshot reads.
fn counters(
    snapshotter: &metrics_util::debugging::Snapshotter,
) -> std::collections::BTreeMap<(String, String), u64> {
    let mut found = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let reason = key
            .key()
            .labels()
            .find(|l| l.key() == "reason")
            .map_or_else(String::new, |l| l.value().to_owned());
        if let DebugValue::Counter(n) = value {
            found.insert((key.key().name().to_owned(), reason), n);
        }
    }
    found
}

/// The counter `name` with `reason` in `counters`.
fn counter(
    counters: &std::collections::BTreeMap<(String, String), u64>,
    name: &str,
    reason: &str,
) -> Option<u64> {
    counters.get(&(name.to_owned(), reason.to_owned())).copied()
}

/// `req` from `peer`.
fn from(peer: &str, mut req: Request<String>) -> Request<String> {
    req.extensions_mut()
        .insert(peer.parse::<std::net::SocketAddr>().unwrap());
    req
}

/// Finding 1 of issue 31: "anyone drives the deadline alerts". One `curl` a minute with
/// `X-Request-Deadline: t=<next year>` counted as clock skew, logged a `WARN` episode and
/// fed `overload_signal_deadline_skewed_total`, on which `TowerOverloadClockSkew` fired:
/// on-call paged forever. And `t=0` put a 56-year sample into the queued-time histogram.
/// Now a caller on the Internet (not trusted by default) has its deadline counted from
/// arrival: never skew, never a sample, never a log line; its own request still gets its
/// `timeout`.
#[tokio::test(start_paused = true)]
async fn an_internet_caller_cannot_fake_clock_skew_or_queue_time() {
    use overload_core::clock::WallClock;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    crate::test_logs::anchor_interest();
    let logs = Arc::new(crate::test_logs::LogCapture::default());
    let _logs = tracing::subscriber::set_default(Arc::clone(&logs));
    tracing::callsite::rebuild_interest_cache();
    let wall = wall();
    let (svc, calls) = worker(Duration::ZERO);
    let svc = layer(wall, DeadlineLayer::DEFAULT_SKEW_ALLOWANCE).layer(svc);
    let next_year = wall.now() + Duration::from_secs(365 * 24 * 3600);
    // One request a minute for 20 minutes, each with a send time next year, and one with
    // `t=0` (the Unix epoch), from 203.0.113.9.
    for _ in 0..20 {
        let mut req = from("203.0.113.9:5000", Request::new(String::new()));
        WireDeadline::new(next_year, 2000 * MS).set(req.headers_mut());
        let r = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        // The deadline counted from arrival: the caller's 2 s.
        assert_eq!(r.into_body(), "2000");
        let mut req = from("203.0.113.9:5000", Request::new(String::new()));
        req.headers_mut().insert(
            X_REQUEST_DEADLINE,
            HeaderValue::from_static("t=0, timeout=2000"),
        );
        let r = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(
            (r.status(), r.into_body()),
            (StatusCode::OK, "2000".to_owned())
        );
        tokio::time::advance(Duration::from_secs(60)).await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 40);
    let mut queued_samples = None;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if key.key().name() == crate::metric_names::DEADLINE_EXPIRED_QUEUED {
            queued_samples = Some(value);
        }
    }
    // Nothing expired, so no queued-time sample either.
    assert_eq!(queued_samples, Some(DebugValue::Histogram(Vec::new())));
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut req = from("203.0.113.9:5000", Request::new(String::new()));
    WireDeadline::new(next_year, 2000 * MS).set(req.headers_mut());
    svc.clone().oneshot(req).await.unwrap();
    let c = counters(&snapshotter);
    let (skewed, requests, callers) = (
        crate::metric_names::DEADLINE_SKEWED,
        crate::metric_names::DEADLINE_REQUESTS,
        crate::metric_names::DEADLINE_CALLERS,
    );
    // Read after a first snapshot reset them: the requests since, one.
    assert_eq!(counter(&c, skewed, ""), Some(0));
    assert_eq!(counter(&c, requests, ""), Some(1));
    assert_eq!(counter(&c, callers, "skewed"), Some(0));
    assert_eq!(counter(&c, callers, "expired"), Some(0));
    let skew_logs = logs.with_message("clock skew");
    assert!(skew_logs.is_empty(), "{skew_logs:?}");
}

/// The same fields from a trusted caller (a private address) are believed, and show what
/// they show: skew, counted as coming from one caller; and `t=0` is a clock an hour or more
/// behind ([`DeadlineLayer::MAX_QUEUED`]), counted as skew too, never as a queue of years.
#[tokio::test(start_paused = true)]
async fn a_trusted_callers_skew_is_counted_once_a_minute_per_caller() {
    use overload_core::clock::WallClock;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    crate::test_logs::anchor_interest();
    let logs = Arc::new(crate::test_logs::LogCapture::default());
    let _logs = tracing::subscriber::set_default(Arc::clone(&logs));
    tracing::callsite::rebuild_interest_cache();
    let wall = wall();
    let (svc, _) = worker(Duration::ZERO);
    let svc = layer(wall, DeadlineLayer::DEFAULT_SKEW_ALLOWANCE).layer(svc);
    // One host (10.0.0.7) sends 30 skewed requests a minute for 3 minutes (5 s ahead of
    // this server's clock), with a `t=0` among them each minute.
    for _ in 0..3 {
        let ahead = wall.now() + Duration::from_secs(5);
        for i in 0..30 {
            let mut req = from("10.0.0.7:5000", Request::new(String::new()));
            if i == 0 {
                req.headers_mut().insert(
                    X_REQUEST_DEADLINE,
                    HeaderValue::from_static("t=0, timeout=2000"),
                );
            } else {
                WireDeadline::new(ahead, 2000 * MS).set(req.headers_mut());
            }
            let r = svc.clone().oneshot(req).await.unwrap();
            assert_eq!(
                (r.status(), r.into_body()),
                (StatusCode::OK, "2000".to_owned())
            );
        }
        tokio::time::advance(Duration::from_secs(60)).await;
    }
    let callers = crate::metric_names::DEADLINE_CALLERS;
    let c = counters(&snapshotter);
    assert_eq!(
        counter(&c, crate::metric_names::DEADLINE_SKEWED, ""),
        Some(90)
    );
    // One caller: one caller-minute per minute, whatever it sends.
    assert_eq!(counter(&c, callers, "skewed"), Some(3), "{c:?}");
    assert_eq!(counter(&c, callers, "expired"), Some(0), "{c:?}");
    // The next minute, the same network from another address, and two more networks:
    // three callers in that minute.
    for peer in ["10.0.0.8:1", "10.0.1.7:1", "10.0.2.7:1"] {
        let mut req = from(peer, Request::new(String::new()));
        WireDeadline::new(wall.now() + Duration::from_secs(5), 2000 * MS).set(req.headers_mut());
        svc.clone().oneshot(req).await.unwrap();
    }
    let c = counters(&snapshotter);
    // (Since the last snapshot.) 10.0.0.8 is 10.0.0.7's network: the same caller. The two
    // others may share a class with it (1 in 128 each, with the layer's random key).
    let seen = counter(&c, callers, "skewed").unwrap();
    assert!((2..=3).contains(&seen), "{c:?}");
    // Each minute's burst is an episode (a minute is longer than the 10 s quiet period that
    // ends one), logged once when it begins, as before: four.
    assert_eq!(logs.with_message("clock skew: requests").len(), 4);
}

/// Expired requests are counted per caller too, and only a trusted caller's begin the
/// logged episode: anyone can send `timeout=0`.
#[tokio::test(start_paused = true)]
async fn expired_requests_are_counted_per_caller_and_logged_for_trusted_ones() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    crate::test_logs::anchor_interest();
    let logs = Arc::new(crate::test_logs::LogCapture::default());
    let _logs = tracing::subscriber::set_default(Arc::clone(&logs));
    tracing::callsite::rebuild_interest_cache();
    let wall = wall();
    let (svc, calls) = worker(Duration::ZERO);
    let svc = layer(wall, Duration::ZERO).layer(svc);
    for _ in 0..50 {
        let mut req = from("198.51.100.9:1", Request::new(String::new()));
        req.headers_mut().insert(
            X_REQUEST_DEADLINE,
            HeaderValue::from_static("t=1, timeout=0"),
        );
        let r = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let callers = crate::metric_names::DEADLINE_CALLERS;
    let c = counters(&snapshotter);
    assert_eq!(counter(&c, callers, "expired"), Some(1), "{c:?}");
    assert!(logs.with_message("dropping expired requests").is_empty());
    // A trusted caller whose request queued past its deadline: the episode begins.
    let r = svc
        .clone()
        .oneshot(sent(&wall, 3000 * MS, 2000 * MS))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(logs.with_message("dropping expired requests").len(), 1);
    // Another caller's first expired request of the minute (unless its network hashed to
    // the first one's class: 1 in 128 with the layer's random key).
    let c = counters(&snapshotter);
    assert!(counter(&c, callers, "expired").unwrap() <= 1, "{c:?}");
}

/// The trust setting: `Trust::everyone()` believes an Internet caller's send time (what
/// the layer did before), `Trust::nobody()` not even this host's.
#[tokio::test(start_paused = true)]
async fn the_trust_setting_decides_whose_send_times_count() {
    let wall = wall();
    let (svc, _) = worker(Duration::ZERO);
    let believing = DeadlineLayer::builder()
        .wall_clock(wall)
        .skew_allowance(Duration::ZERO)
        .trust(crate::Trust::everyone())
        .build()
        .unwrap();
    assert_eq!(
        format!("{:?}", believing.trust()),
        "Some(Trust::everyone())"
    );
    let queued = |trust: crate::Trust, peer: &'static str| {
        let svc = svc.clone();
        async move {
            let layer = DeadlineLayer::builder()
                .wall_clock(wall)
                .skew_allowance(Duration::ZERO)
                .build()
                .unwrap()
                .with_trust(trust);
            let mut req = sent(&wall, 500 * MS, 2000 * MS);
            req.extensions_mut()
                .insert(peer.parse::<std::net::SocketAddr>().unwrap());
            layer.layer(svc).oneshot(req).await.unwrap().into_body()
        }
    };
    assert_eq!(
        queued(crate::Trust::everyone(), "203.0.113.9:1").await,
        "1500"
    );
    assert_eq!(
        queued(crate::Trust::default(), "203.0.113.9:1").await,
        "2000"
    );
    assert_eq!(queued(crate::Trust::default(), "127.0.0.1:1").await, "1500");
    assert_eq!(queued(crate::Trust::nobody(), "127.0.0.1:1").await, "2000");
}

/// Envoy's deadline header, spelled out, so that these tests read the wire as Envoy writes it.
const ENVOY_TIMEOUT: &str = "x-envoy-expected-rq-timeout-ms";

/// A request as Envoy forwards it: `x-envoy-expected-rq-timeout-ms: <ms>`, from a sidecar on
/// this host.
fn via_envoy(ms: &'static str) -> Request<String> {
    let mut req = from_this_host(Request::new(String::new()));
    req.headers_mut()
        .insert(ENVOY_TIMEOUT, HeaderValue::from_static(ms));
    req
}

/// A server with one worker (a thread pool of one, say), inside the deadline layer: a
/// request waits in its queue until the worker is free, then the handler runs for `work`.
/// Counts the handler's runs.
fn one_worker(
    work: Duration,
) -> (
    impl Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone,
    Arc<AtomicUsize>,
) {
    let pool = Arc::new(tokio::sync::Semaphore::new(1));
    let (handler, calls) = worker(work);
    let svc = service_fn(move |req: Request<String>| {
        let (pool, handler) = (Arc::clone(&pool), handler.clone());
        async move {
            let _worker = pool.acquire_owned().await.expect("never closed");
            handler.oneshot(req).await
        }
    });
    (svc, calls)
}

/// Issue 32, item 3: Envoy's `x-envoy-expected-rq-timeout-ms` alone, on an HTTP request, is
/// the request's deadline, counted from arrival at the layer (no send time: no skew
/// allowance either). A request that waits past it in the server's queue is answered `504`
/// at the deadline and its handler never runs; one within it runs, and sees what is left.
#[tokio::test(start_paused = true)]
async fn envoys_expected_timeout_alone_is_the_deadline_from_arrival() {
    let (svc, calls) = one_worker(3000 * MS);
    let svc = DeadlineLayer::new().layer(svc);
    let start = Instant::now();
    // The worker is busy for 3 s with a request Envoy gives 5 s (polled first: it takes
    // the worker); the second, given 1 s, waits behind it: answered at its deadline, never
    // run.
    let (busy, queued) = tokio::join!(svc.clone().oneshot(via_envoy("5000")), async {
        let r = svc.clone().oneshot(via_envoy("1000")).await.unwrap();
        (r, start.elapsed())
    });
    let (r, answered_after) = queued;
    assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(r.body(), "");
    assert_eq!(
        answered_after,
        1000 * MS,
        "at Envoy's deadline, no allowance"
    );
    let r = busy.unwrap();
    assert_eq!((r.status(), r.body().as_str()), (StatusCode::OK, "5000"));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the queued request never ran"
    );

    // Within it: the handler runs, and sees what is left of it.
    let (svc, calls) = worker(Duration::ZERO);
    let svc = DeadlineLayer::new().layer(svc);
    let r = svc.oneshot(via_envoy("1500")).await.unwrap();
    assert_eq!((r.status(), r.body().as_str()), (StatusCode::OK, "1500"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The same on gRPC (Envoy sets the header on every request it forwards): the answer is
/// `DEADLINE_EXCEEDED`; and a caller on the Internet is believed too, as for `grpc-timeout`:
/// a relative timeout needs no clock, and can only shorten the caller's own request.
#[tokio::test(start_paused = true)]
async fn envoys_expected_timeout_on_grpc_answers_deadline_exceeded_from_anyone() {
    let (svc, calls) = worker(3000 * MS);
    let svc = DeadlineLayer::new().layer(svc);
    let mut req = from("203.0.113.9:5000", Request::new(String::new()));
    req.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    req.headers_mut()
        .insert(ENVOY_TIMEOUT, HeaderValue::from_static("800"));
    let start = Instant::now();
    let r = svc.oneshot(req).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[GRPC_STATUS], "4");
    assert_eq!(start.elapsed(), 800 * MS);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Junk in Envoy's header is no deadline (and counted as malformed), never an error: only
/// 1 to 15 ASCII digits are read, and several lines only when they agree. A zero, which
/// Envoy never sends (it means "no timeout" in Envoy's own timeout headers), is no deadline
/// either, and not junk.
#[tokio::test(start_paused = true)]
async fn junk_in_envoys_expected_timeout_is_absent() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let (svc, calls) = worker(Duration::ZERO);
    let svc = DeadlineLayer::new().layer(svc);
    let junk = [
        "",
        " ",
        "-1",
        "+5",
        "1.5",
        "1e3",
        "0x10",
        "5ms",
        "5 ",
        "5, 6",
        "1000000000000000",
        "99999999999999999999",
    ];
    for value in junk {
        let r = svc.clone().oneshot(via_envoy(value)).await.unwrap();
        assert_eq!(
            (r.status(), r.body().as_str()),
            (StatusCode::OK, "none"),
            "{value:?}"
        );
    }
    let mut bytes = from_this_host(Request::new(String::new()));
    bytes
        .headers_mut()
        .insert(ENVOY_TIMEOUT, HeaderValue::from_bytes(b"1\xff").unwrap());
    assert_eq!(svc.clone().oneshot(bytes).await.unwrap().body(), "none");
    // Lines that disagree are junk; lines that agree are one value.
    let lines = |values: [&'static str; 2]| {
        let mut req = from_this_host(Request::new(String::new()));
        for v in values {
            req.headers_mut()
                .append(ENVOY_TIMEOUT, HeaderValue::from_static(v));
        }
        req
    };
    let r = svc.clone().oneshot(lines(["1000", "2000"])).await.unwrap();
    assert_eq!(r.body(), "none");
    let r = svc.clone().oneshot(lines(["1000", "01000"])).await.unwrap();
    assert_eq!(r.body(), "1000");
    // The largest value read: 15 digits of milliseconds (Envoy's own timeouts are at most
    // 10 000 years, 15 digits too).
    let r = svc
        .clone()
        .oneshot(via_envoy("999999999999999"))
        .await
        .unwrap();
    assert_eq!(r.body(), "999999999999999");
    let r = svc.clone().oneshot(via_envoy("0")).await.unwrap();
    assert_eq!((r.status(), r.body().as_str()), (StatusCode::OK, "none"));
    assert_eq!(calls.load(Ordering::SeqCst), junk.len() + 5);
    let malformed = counters(&snapshotter)
        .get(&(
            crate::metric_names::DEADLINE_MALFORMED.to_owned(),
            String::new(),
        ))
        .copied();
    assert_eq!(malformed, Some(junk.len() as u64 + 2));
}

/// Issue 32, item 3: several deadlines on one request: the earliest of those the layer
/// believes wins, whichever header it came in (each is a tier that stops waiting then).
#[tokio::test(start_paused = true)]
async fn the_earliest_of_several_deadlines_wins() {
    let wall = wall();
    let (svc, calls) = worker(Duration::ZERO);
    let svc = layer(wall, 250 * MS).layer(svc);
    let call = |mut req: Request<String>, envoy: Option<&'static str>| {
        let svc = svc.clone();
        if let Some(ms) = envoy {
            req.headers_mut()
                .insert(ENVOY_TIMEOUT, HeaderValue::from_static(ms));
        }
        async move {
            let r = svc.oneshot(req).await.unwrap();
            (r.status(), r.into_body())
        }
    };
    let served = |left: &str| (StatusCode::OK, left.to_owned());
    // A trusted caller's X-Request-Deadline: queued 500 ms of 2 s, 1.5 s left.
    let ours = || sent(&wall, 500 * MS, 2000 * MS);
    assert_eq!(call(ours(), Some("1000")).await, served("1000"));
    assert_eq!(call(ours(), Some("3000")).await, served("1500"));
    // Our header says it has expired: Envoy's later deadline does not revive it.
    let expired = sent(&wall, 3000 * MS, 2000 * MS);
    assert_eq!(
        call(expired, Some("5000")).await.0,
        StatusCode::GATEWAY_TIMEOUT
    );
    // An untrusted caller's X-Request-Deadline counts from arrival: 2 s, against Envoy's.
    let mut untrusted = sent(&wall, 500 * MS, 2000 * MS);
    untrusted
        .extensions_mut()
        .insert("203.0.113.9:1".parse::<std::net::SocketAddr>().unwrap());
    assert_eq!(call(untrusted, Some("2500")).await, served("2000"));
    // gRPC: grpc-timeout against Envoy's, either way round.
    assert_eq!(call(grpc("800m"), Some("1000")).await.1, "800");
    assert_eq!(call(grpc("2S"), Some("1000")).await.1, "1000");
    // A deadline in the extensions (an outer layer's) against Envoy's.
    let mut outer = Request::new(String::new());
    outer
        .extensions_mut()
        .insert(RequestDeadline::after(300 * MS));
    assert_eq!(call(outer, Some("1000")).await, served("300"));
    // Junk in one header leaves the others: our 1.5 s.
    assert_eq!(call(ours(), Some("1s")).await, served("1500"));
    assert_eq!(calls.load(Ordering::SeqCst), 7);
}

/// Issue 32, item 3: a handler behind the layer passes what is left of Envoy's deadline on:
/// the current deadline (what `backoff-layer`'s retry layer reads for each downstream call)
/// is Envoy's, counted from arrival, minus the time the handler has spent.
#[tokio::test(start_paused = true)]
async fn a_handler_passes_what_is_left_of_envoys_deadline_downstream() {
    let svc = DeadlineLayer::new().layer(service_fn(|_req: Request<String>| async {
        tokio::time::sleep(300 * MS).await;
        let downstream = scope(None, async { time_left() }).await;
        Ok::<_, Infallible>(Response::new(format!("{downstream:?}")))
    }));
    let r = svc.oneshot(via_envoy("1000")).await.unwrap();
    assert_eq!(r.body(), &format!("{:?}", Some(700 * MS)));
}
