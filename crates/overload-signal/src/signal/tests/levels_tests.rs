//! Levels and the stop signal (issue 33): counted per level, and a higher level not told to
//! stop while a lower level's rejections are still passed plainly.

use super::*;
use crate::criticality::{self, CriticalityLayer};
use crate::protocol::Criticality::{self, Critical, CriticalPlus, Sheddable, SheddablePlus};
use crate::protocol::X_REQUEST_CRITICALITY;

/// A retry (attempt 1) of `level`, as an outer `CriticalityLayer` leaves it.
fn retry_of(level: Criticality) -> Request<Body> {
    let mut req = request(Some(1));
    req.extensions_mut().insert(level);
    req
}

/// Whether `svc` answers a retry of `level` with the stop signal (else the plain `429`).
async fn stopped<S>(svc: &mut S, level: Criticality) -> bool
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    let response = one(svc, retry_of(level)).await;
    let stop = protocol::is_stop_signal(response.headers());
    assert!(
        stop || response.status() == StatusCode::TOO_MANY_REQUESTS,
        "{response:?}"
    );
    stop
}

/// All traffic of one level: the stop signal from the fifth request on, as before levels,
/// whatever the level.
#[tokio::test(start_paused = true)]
async fn one_level_alone_is_judged_as_before() {
    for level in Criticality::ALL {
        let mut svc = tower::Layer::layer(&layer_with(rule(0.1, 5)), answering(http_429));
        let mut got = Vec::new();
        for _ in 0..8 {
            got.push(stopped(&mut svc, level).await);
        }
        assert_eq!(
            got,
            [false, false, false, false, true, true, true, true],
            "{level}"
        );
    }
}

/// The SRE rule for the stop signal: while a lower level's rejections are passed plainly
/// (the last one within the window), a higher level's are passed plainly too; the lowest
/// level is told to stop first, and the higher ones once no lower rejection has been passed
/// for a window.
#[tokio::test(start_paused = true)]
async fn a_higher_level_is_not_told_to_stop_while_a_lower_one_is_merely_rejected() {
    let mut svc = tower::Layer::layer(&layer_with(rule(0.1, 5)), answering(http_429));
    // Under the rule's minimum: sheddable rejections pass plainly.
    for _ in 0..4 {
        assert!(!stopped(&mut svc, Sheddable).await);
    }
    // The rule fires: sheddable is told to stop, the levels above are not (yet).
    assert!(stopped(&mut svc, Sheddable).await);
    for level in [SheddablePlus, Critical, CriticalPlus] {
        assert!(!stopped(&mut svc, level).await, "{level}");
    }
    // A storm of sheddable retries goes on, every one told to stop; a plain rejection of
    // sheddable-plus a little later holds back critical's stop signal, not its own.
    tokio::time::advance(Duration::from_secs(5)).await;
    for _ in 0..5 {
        assert!(stopped(&mut svc, Sheddable).await);
    }
    assert!(
        !stopped(&mut svc, SheddablePlus).await,
        "sheddable passed 5 s ago"
    );
    for second in 6..=10 {
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..5 {
            assert!(stopped(&mut svc, Sheddable).await);
        }
        assert!(!stopped(&mut svc, Critical).await, "second {second}");
    }
    // A window after the last plain sheddable rejection: sheddable-plus is told to stop,
    // critical not while sheddable-plus's plain rejection of second 5 is in the window.
    tokio::time::advance(Duration::from_secs(1)).await;
    for _ in 0..5 {
        assert!(stopped(&mut svc, Sheddable).await);
    }
    assert!(stopped(&mut svc, SheddablePlus).await);
    assert!(!stopped(&mut svc, Critical).await);
    // The stop signal climbs one level per window: critical-plus waits for critical's
    // plain rejection of second 11 to leave the window.
    tokio::time::advance(Duration::from_secs(5)).await;
    for _ in 0..5 {
        assert!(stopped(&mut svc, Sheddable).await);
    }
    for level in [SheddablePlus, Critical] {
        assert!(stopped(&mut svc, level).await, "{level}");
    }
    assert!(!stopped(&mut svc, CriticalPlus).await);
    tokio::time::advance(Duration::from_secs(6)).await;
    for _ in 0..5 {
        assert!(stopped(&mut svc, Sheddable).await);
    }
    for level in Criticality::ALL {
        assert!(stopped(&mut svc, level).await, "{level}");
    }
}

/// A caller-scoped rejection judges the caller's own retries: another caller's plain
/// rejection of a lower level does not hold its stop signal back (or a caller could shield
/// its own storm with a trickle of sheddable requests).
#[tokio::test(start_paused = true)]
async fn caller_scoped_stop_signals_ignore_other_levels() {
    fn caller_429() -> Response<Body> {
        caller_scoped(http_429())
    }
    let mut svc = tower::Layer::layer(&layer_with(rule(0.1, 5)), answering(caller_429));
    for _ in 0..4 {
        assert!(!stopped(&mut svc, Sheddable).await);
    }
    assert!(stopped(&mut svc, CriticalPlus).await);
}

/// Both counters carry the rejected request's level.
#[test]
fn decisions_are_counted_per_level() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let mut svc = tower::Layer::layer(&layer_with(rule(0.1, 5)), answering(http_429));
            for _ in 0..4 {
                stopped(&mut svc, Sheddable).await;
            }
            for _ in 0..3 {
                stopped(&mut svc, Sheddable).await;
            }
            stopped(&mut svc, Critical).await;
            // No level in the request: the default, critical.
            one(&mut svc, request(Some(1))).await;
        });
    });
    let values = metric_values(&recorder);
    let count = |metric, level: Criticality| match find_labelled(
        &values,
        metric,
        &[("scope", "server"), ("criticality", level.as_str())],
    ) {
        DebugValue::Counter(n) => *n,
        other => panic!("{other:?}"),
    };
    assert_eq!(count(metric_names::REJECTIONS_PASSED, Sheddable), 4);
    assert_eq!(count(metric_names::STOP_SIGNALS, Sheddable), 3);
    assert_eq!(count(metric_names::REJECTIONS_PASSED, Critical), 2);
    assert_eq!(count(metric_names::STOP_SIGNALS, Critical), 0);
    assert_eq!(count(metric_names::STOP_SIGNALS, SheddablePlus), 0);
}

/// With criticality settings, the overload layer resolves the level itself: header,
/// trust cap, default; puts it in the request and runs the inner service in it.
#[tokio::test(start_paused = true)]
async fn the_layer_resolves_levels_when_given_the_settings() {
    let levels = CriticalityLayer::builder()
        .trust(Trust::nobody())
        .build()
        .unwrap();
    let layer = OverloadSignalLayer::new().with_criticality(levels);
    assert!(layer.criticality().is_some());
    // The handler answers with its request's level, and the current one on its first
    // poll and after an await (the scope's on every poll), and what a call it makes carries.
    let mut svc = tower::Layer::layer(
        &layer,
        service_fn(|req: Request<Body>| async move {
            let level = Some(Criticality::of(req.extensions()));
            let first = criticality::current();
            tokio::task::yield_now().await;
            let seen = (
                level,
                first,
                criticality::current(),
                criticality::outgoing(Some(CriticalPlus)),
            );
            let mut response = Response::new(Body::default());
            response.extensions_mut().insert(seen);
            Ok::<_, Infallible>(response)
        }),
    );
    let with = |value: &'static str| {
        let mut req = request(None);
        req.headers_mut()
            .insert(X_REQUEST_CRITICALITY, HeaderValue::from_static(value));
        req
    };
    type Seen = (
        Option<Criticality>,
        Option<Criticality>,
        Option<Criticality>,
        Option<Criticality>,
    );
    let seen = |r: Response<Body>| r.extensions().get::<Seen>().copied().unwrap();
    let all = |level| (Some(level), Some(level), Some(level), Some(level));
    assert_eq!(seen(one(&mut svc, with("sheddable")).await), all(Sheddable));
    assert_eq!(
        seen(one(&mut svc, with("critical-plus")).await),
        all(Critical),
        "capped: nobody is trusted"
    );
    assert_eq!(
        seen(one(&mut svc, with("urgent")).await),
        all(Critical),
        "junk"
    );
    assert_eq!(
        seen(one(&mut svc, request(None)).await),
        all(Critical),
        "none"
    );
    assert_eq!(criticality::current(), None, "nothing left behind");
    // An enclosing scope of a lower level is never raised: the request keeps its level in
    // its extensions, and runs in the lower one.
    let inside = criticality::scope(Sheddable, one(&mut svc, with("critical"))).await;
    let low = Some(Sheddable);
    assert_eq!(seen(inside), (Some(Critical), low, low, low));
}
