//! The peers of issue 34's benchmark (`Stack::Peer`) in front of the model, through
//! `app()` in process: each sheds what is over its limit with `503`, at once, counted as a
//! rejection.

use std::num::NonZeroUsize;
use std::time::Duration;

use axum::body::Body;
use demo_server::app::{AppConfig, Stack, StatsSnapshot, app};
use demo_server::model::{LatencyModel, Model};
use demo_server::peers::{InvalidPeer, Peer};
use http::{Request, StatusCode};
use tower::ServiceExt;

fn get() -> Request<Body> {
    let mut request = Request::get("/api").body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(std::net::SocketAddr::from(([127, 0, 0, 1], 40_000)));
    request
}

/// Sends `n` requests at once to the article's model (100 ms each below its knee) behind
/// `peer`; returns the statuses in the order they were sent, the time each took and the
/// server's counts.
async fn burst(peer: Peer, n: usize) -> (Vec<StatusCode>, Vec<Duration>, StatsSnapshot) {
    let config = AppConfig::new(Model::new(LatencyModel::default())).stack(Stack::Peer(peer));
    let stats = config.stats().clone();
    let router = app(config);
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let router = router.clone();
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                let response = router.oneshot(get()).await.unwrap();
                (response.status(), started.elapsed())
            })
        })
        .collect();
    let mut statuses = Vec::new();
    let mut took = Vec::new();
    for task in tasks {
        let (status, elapsed) = task.await.unwrap();
        statuses.push(status);
        took.push(elapsed);
    }
    (statuses, took, stats.snapshot())
}

#[tokio::test(start_paused = true)]
async fn tower_shed_serves_up_to_its_concurrency_and_sheds_the_rest_at_once() {
    let peer = Peer::tower_shed(NonZeroUsize::new(3).unwrap());
    let (statuses, took, stats) = burst(peer, 5).await;
    let served = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let shed = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!((served, shed), (3, 2), "{statuses:?}");
    for (status, took) in statuses.iter().zip(&took) {
        if *status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(*took, Duration::ZERO, "a shed request waits for nothing");
        } else {
            assert_eq!(*took, Duration::from_millis(100));
        }
    }
    assert_eq!(
        stats,
        StatsSnapshot {
            served: 3,
            rejected: 2,
            ..StatsSnapshot::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn tower_resilience_sheds_above_its_vegas_limit() {
    // Vegas starts at a limit of 10 (tower-resilience's default).
    let (statuses, _, stats) = burst(Peer::tower_resilience(), 12).await;
    let served = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(served, 10, "{statuses:?}");
    assert_eq!(
        stats,
        StatsSnapshot {
            served: 10,
            rejected: 2,
            ..StatsSnapshot::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn little_sheds_what_its_first_queue_cannot_hold() {
    // little-loadshedder starts with a concurrency of 1 and a queue of 1: of a burst of 5
    // arriving together (paused time, one thread: the order is fixed), one request runs,
    // one waits, the three others are shed at once; its concurrency grows later, with the
    // latency it sees (review N3: the split is determined, so it is pinned).
    let peer = Peer::little(Duration::from_millis(200)).unwrap();
    let (statuses, _, stats) = burst(peer, 5).await;
    let served = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(served, 2, "{statuses:?}");
    assert_eq!(
        (stats.served, stats.rejected, stats.failed),
        (2, 3, 0),
        "{stats}"
    );
}

#[test]
fn little_refuses_a_zero_target() {
    let e: InvalidPeer = Peer::little(Duration::ZERO).unwrap_err();
    assert_eq!(
        e.to_string(),
        "little's target latency must be above zero, got 0ns"
    );
}

#[test]
fn peers_are_named_as_the_command_line_names_them() {
    let n = NonZeroUsize::new(10).unwrap();
    assert_eq!(Stack::Peer(Peer::tower_shed(n)).name(), "tower-shed");
    assert_eq!(
        Stack::Peer(Peer::tower_resilience()).name(),
        "tower-resilience"
    );
    let little = Peer::little(Duration::from_millis(100)).unwrap();
    assert_eq!(Stack::Peer(little).name(), "little");
}
