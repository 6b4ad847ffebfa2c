//! The client-side throttle sheds from the bottom, inside the retry layer under paused time:
//! a downstream fails for 20 s while a client sends it `sheddable` and `critical` requests,
//! one of each every 10 ms; the layer's own ticker decides every 200 ms of virtual time.

use crate::support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use backoff_layer::backoff::Seeds;
use backoff_layer::{BoxError, ReplayBody, RetryLayer, is_throttled};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use overload_signal::protocol::Criticality::{self, Critical, Sheddable};
use support::MS;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt, service_fn};

type Client = BoxCloneService<Request<Empty<Bytes>>, Response<Empty<Bytes>>, BoxError>;

/// A downstream answering `503` while `down` is set, `200` otherwise, behind a retry layer
/// that does not retry (each request is one attempt: the throttle's decision alone).
fn client(down: &Arc<AtomicBool>) -> Client {
    let down = Arc::clone(down);
    let layer = RetryLayer::builder()
        .max_attempts(1)
        .seeds(Seeds::from_seed(33))
        .build()
        .unwrap();
    BoxCloneService::new(
        layer.layer(service_fn(move |_: Request<ReplayBody<Empty<Bytes>>>| {
            let status = if down.load(Ordering::Relaxed) {
                503
            } else {
                200
            };
            async move {
                let mut response = Response::new(Empty::new());
                *response.status_mut() = StatusCode::from_u16(status).unwrap();
                Ok::<_, Infallible>(response)
            }
        })),
    )
}

/// One request of `level`: `true` if the throttle refused it.
async fn refused(client: &Client, level: Criticality) -> bool {
    let mut request = Request::get("http://flaky.test/api")
        .body(Empty::new())
        .unwrap();
    request.extensions_mut().insert(level);
    match client.clone().oneshot(request).await {
        Ok(_) => false,
        Err(e) => {
            assert!(is_throttled(&*e), "{e}");
            true
        }
    }
}

/// Refusals per level in one slot of 200 ms.
#[derive(Clone, Copy, Debug, Default)]
struct Step {
    at_ms: u64,
    sheddable: (u32, u32),
    critical: (u32, u32),
}

impl Step {
    fn rate(counts: (u32, u32)) -> f64 {
        f64::from(counts.0) / f64::from(counts.1)
    }
}

/// Sends one `sheddable` and one `critical` request every 10 ms, from 5 ms after a slot
/// began (the ticker decides at whole slots), for `slots` slots; the refusals of each slot.
async fn drive(client: &Client, slots: u64) -> Vec<Step> {
    let start = Instant::now();
    let mut steps = Vec::new();
    for slot in 0..slots {
        let mut step = Step {
            at_ms: u64::try_from((Instant::now() - start).as_millis()).unwrap(),
            ..Step::default()
        };
        tokio::time::sleep(5 * MS).await;
        for i in 0..20 {
            if i > 0 {
                tokio::time::sleep(10 * MS).await;
            }
            // NOTE: the critical request first, so a refusal of it cannot be blamed on a
            // sheddable one sent before it in the same instant.
            let c = refused(client, Critical).await;
            let s = refused(client, Sheddable).await;
            step.critical = (step.critical.0 + u32::from(c), step.critical.1 + 1);
            step.sheddable = (step.sheddable.0 + u32::from(s), step.sheddable.1 + 1);
        }
        // The last request went at 195 ms: every request of the step saw one decision.
        // Back to the next slot's start.
        let next = start + Duration::from_millis(200 * (slot + 1));
        tokio::time::sleep_until(next).await;
        steps.push(step);
    }
    steps
}

/// In an outage, `sheddable` requests are refused locally before `critical` ones: in every
/// slot while the throttle refuses anything, the `sheddable` refusal rate is higher, and no
/// `critical` request is refused in a slot in which a `sheddable` one was let through. The
/// throttle still sends what its rule decides: about one request in ten, as probes.
#[tokio::test(start_paused = true)]
async fn in_an_outage_sheddable_requests_are_refused_before_critical_ones() {
    let down = Arc::new(AtomicBool::new(true));
    let client = client(&down);
    // NOTE: the first request starts the ticker: one to another destination now, so the
    // ticks fall on whole slots from here, 5 ms before each slot's first request.
    let mut warm_up = Request::get("http://other.test/")
        .body(Empty::new())
        .unwrap();
    warm_up.extensions_mut().insert(Critical);
    client.clone().oneshot(warm_up).await.unwrap();
    // 20 s of outage: 100 slots.
    let steps = drive(&client, 100).await;
    let first = steps
        .iter()
        .position(|s| s.sheddable.0 + s.critical.0 > 0)
        .expect("the throttle refuses within the outage");
    assert!(
        steps[first].at_ms <= 1_000,
        "it reacts within a second: {:?}",
        steps[first]
    );
    let mut critical_refused = 0;
    for step in &steps[first..] {
        let (s, c) = (Step::rate(step.sheddable), Step::rate(step.critical));
        assert!(s > c, "sheddable refused more in every step: {step:?}");
        assert!(
            step.critical.0 == 0 || step.sheddable.0 == step.sheddable.1,
            "critical refused while sheddable was let through: {step:?}"
        );
        critical_refused += step.critical.0;
    }
    // At 90 % with half the requests sheddable, critical is refused too (80 %): the
    // throttle does not send more than its rule says because of the levels.
    let (refused, offered) = steps[first + 5..].iter().fold((0, 0), |(r, o), s| {
        (
            r + s.sheddable.0 + s.critical.0,
            o + s.sheddable.1 + s.critical.1,
        )
    });
    let share = f64::from(refused) / f64::from(offered);
    assert!((0.85..=0.93).contains(&share), "refused {share}");
    assert!(critical_refused > 0);

    // The destination comes back: the probes (critical ones) see it, and within a second
    // neither level is refused.
    down.store(false, Ordering::Relaxed);
    let steps = drive(&client, 10).await;
    for step in &steps {
        assert!(
            Step::rate(step.sheddable) >= Step::rate(step.critical),
            "{step:?}"
        );
        assert!(
            step.critical.0 == 0 || step.sheddable.0 == step.sheddable.1,
            "{step:?}"
        );
    }
    let reopened = steps
        .iter()
        .position(|s| s.sheddable.0 + s.critical.0 == 0)
        .expect("reopens");
    assert!(steps[reopened].at_ms <= 1_000, "{steps:?}");
}

/// A client sending one level only is throttled as before, whichever the level: the same
/// refusals, request by request, as the default level (the same seeds, the same draws).
#[tokio::test(start_paused = true)]
async fn one_level_is_throttled_exactly_as_the_default() {
    let mut runs = Vec::new();
    for level in [
        None,
        Some(Sheddable),
        Some(Critical),
        Some(Criticality::CriticalPlus),
    ] {
        let down = Arc::new(AtomicBool::new(true));
        let client = client(&down);
        let start = Instant::now();
        let mut decisions = Vec::new();
        for i in 0..1_500u32 {
            if i == 1_000 {
                down.store(false, Ordering::Relaxed);
            }
            let mut request = Request::get("http://flaky.test/api")
                .body(Empty::new())
                .unwrap();
            if let Some(level) = level {
                request.extensions_mut().insert(level);
            }
            let refused = match client.clone().oneshot(request).await {
                Ok(_) => false,
                Err(e) => is_throttled(&*e),
            };
            decisions.push(refused);
            tokio::time::sleep_until(start + Duration::from_millis(u64::from(i) * 10 + 5)).await;
        }
        assert!(decisions.iter().any(|&r| r), "{level:?}: throttled at all");
        runs.push((level, decisions));
    }
    let (_, reference) = &runs[0];
    for (level, decisions) in &runs[1..] {
        assert_eq!(decisions, reference, "{level:?}");
    }
}
