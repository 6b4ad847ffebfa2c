//! The default decision rule against simulated traffic, under paused time: it stays quiet
//! with 1 % transient failures, and fires in a retry storm, including one made by clients
//! that keep to a 10 % retry budget.
//!
//! Each simulated caller sends a first try every 20 ms (50 requests per second); a rejection
//! without the stop signal is retried at once, up to 3 attempts in all, and the stop signal
//! is never retried. Randomness is seeded, so every run sends the same traffic.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use overload_signal::protocol::{self, Attempt};
use overload_signal::signal::{Rejection, RejectionKind, RejectionScope};
use overload_signal::{OverloadSignalLayer, StopRule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tower::{Service, ServiceExt, service_fn};

const FIRST_TRIES_PER_SECOND: u32 = 50;
const MAX_ATTEMPTS: u32 = 3;

/// A server whose inner stack rejects each request with probability `reject` (503, as a
/// load shedder does, marked as a limiting layer's rejection), behind the default
/// `OverloadSignalLayer`.
fn server(
    layer: &OverloadSignalLayer,
    reject: f64,
    seed: u64,
) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible> {
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
    tower::Layer::layer(
        layer,
        service_fn(move |_req: Request<()>| {
            let rejected = rng.lock().unwrap().random_bool(reject);
            async move {
                let mut r = Response::new(());
                if rejected {
                    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    r.extensions_mut().insert(Rejection::new(
                        RejectionKind::AtCapacity,
                        RejectionScope::Server,
                    ));
                }
                Ok::<_, Infallible>(r)
            }
        }),
    )
}

/// What a run of the simulation saw.
#[derive(Debug, Default)]
struct Outcome {
    first_tries: u64,
    retries: u64,
    rejections: u64,
    stop_signals: u64,
    /// Seconds into the run of the first stop signal.
    first_stop_at: Option<f64>,
}

/// A client-side retry budget as the paper and the SRE book describe it: each first try
/// earns 0.1 retry, each retry spends 1 (no floor, so it is as strict as a budget gets).
struct Budget {
    balance: f64,
}

impl Budget {
    fn withdraw(&mut self) -> bool {
        if self.balance >= 1.0 {
            self.balance -= 1.0;
            true
        } else {
            false
        }
    }
}

async fn run<S>(svc: &mut S, seconds: u32, mut budget: Option<Budget>) -> Outcome
where
    S: Service<Request<()>, Response = Response<()>, Error = Infallible>,
{
    let start = tokio::time::Instant::now();
    let mut out = Outcome::default();
    for _ in 0..seconds * FIRST_TRIES_PER_SECOND {
        out.first_tries += 1;
        if let Some(b) = budget.as_mut() {
            b.balance = (b.balance + 0.1).min(100.0);
        }
        for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 {
                if budget.as_mut().is_some_and(|b| !b.withdraw()) {
                    break;
                }
                out.retries += 1;
            }
            let mut req = Request::new(());
            Attempt::set(req.headers_mut(), attempt);
            // From callers inside the private network: the default trust counts them.
            req.extensions_mut()
                .insert(std::net::SocketAddr::from(([10, 0, 0, 7], 40_000)));
            let response = svc.ready().await.unwrap().call(req).await.unwrap();
            if protocol::is_stop_signal(response.headers()) {
                out.stop_signals += 1;
                out.first_stop_at
                    .get_or_insert(start.elapsed().as_secs_f64());
                break;
            }
            if response.status() != StatusCode::SERVICE_UNAVAILABLE {
                break;
            }
            out.rejections += 1;
        }
        tokio::time::advance(Duration::from_millis(
            1000 / u64::from(FIRST_TRIES_PER_SECOND),
        ))
        .await;
    }
    out
}

#[tokio::test(start_paused = true)]
async fn one_percent_transient_failures_never_trigger_the_stop_signal() {
    // Ten minutes of steady traffic, several seeds: 30,000 first tries each.
    for seed in 0..5 {
        let layer = OverloadSignalLayer::new();
        let mut svc = server(&layer, 0.01, seed);
        let out = run(&mut svc, 600, None).await;
        // The rule was consulted hundreds of times (every rejection) and never fired.
        assert!(out.rejections > 200, "seed {seed}: {out:?}");
        assert_eq!(out.stop_signals, 0, "seed {seed}: {out:?}");
        // And the traffic was what the test claims: about 1 % retries.
        let share = out.retries as f64 / (out.first_tries + out.retries) as f64;
        assert!(
            (0.005..0.015).contains(&share),
            "seed {seed}: share {share}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn retry_storm_triggers_the_stop_signal() {
    // The server rejects 60 % of requests; callers retry every rejection up to 3 attempts.
    let layer = OverloadSignalLayer::new();
    let mut svc = server(&layer, 0.6, 7);
    let out = run(&mut svc, 30, None).await;
    let first = out.first_stop_at.expect("the stop signal was sent");
    // Not before the window held the minimum of 200 requests (about 102 per second here:
    // 50 first tries, 30 first retries, 18 second retries), and soon after.
    let rule = StopRule::new();
    assert!(first >= 1.9, "{out:?}");
    assert!(first < 3.0, "{out:?}");
    assert_eq!(rule.min_requests(), 200);
    // Once the stop signal flows, callers stop retrying, so retries collapse.
    assert!(out.stop_signals > 100, "{out:?}");
    assert!(out.retries < out.first_tries / 4, "{out:?}");
}

#[tokio::test(start_paused = true)]
async fn full_outage_triggers_the_stop_signal_even_for_budget_keeping_clients() {
    // Everything is rejected, and callers keep to a 10 % retry budget: at most about 9 % of
    // the traffic is retries, which the default 5 % threshold still catches.
    let layer = OverloadSignalLayer::new();
    let mut svc = server(&layer, 1.0, 11);
    let out = run(&mut svc, 30, Some(Budget { balance: 0.0 })).await;
    assert!(out.first_stop_at.is_some(), "{out:?}");
    assert!(out.stop_signals > out.first_tries / 2, "{out:?}");
    let share = out.retries as f64 / (out.first_tries + out.retries) as f64;
    assert!(share < 0.1, "the budget held: {share}");
}
