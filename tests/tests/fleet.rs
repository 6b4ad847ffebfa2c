//! The outage experiment in the paper's topology, short: three `demo-server` processes on
//! 127.0.0.1 behind a real HAProxy (Debian's package; the test fails, never skips, without
//! it), one of them stopped with SIGSTOP for 16 s and resumed, through the same code as
//! `demo-client fleet --quick`.

use std::ffi::OsString;
use std::num::NonZeroUsize;
use std::time::Duration;

use demo_client::cli::FLEET_QUICK;
use demo_client::drive::Progress;
use demo_client::experiment::{RunSpec, ServerStack};
use demo_client::fleet::{
    BalancerSettings, FleetBalancer, FleetRecord, FleetRun, find_haproxy, fleet_run,
};
use demo_client::strategy::Strategy;

/// One server's capacity in the default model (M/M/10, 50 ms mean service): 200 req/s.
const CAPACITY: f64 = 200.0;

async fn quick(spec: RunSpec, dir: &std::path::Path) -> FleetRecord {
    let server = integration_tests::workspace_binary("demo-server");
    let haproxy = find_haproxy(None).expect("haproxy is installed (scripts/test installs it)");
    let args: Vec<OsString> = ["--model", "mmc", "--trusted-proxy", "127.0.0.1"]
        .map(OsString::from)
        .to_vec();
    let balancer = BalancerSettings::default();
    let run = FleetRun {
        timing: FLEET_QUICK,
        clients: NonZeroUsize::new(20_000).unwrap(),
        think_time: Duration::from_secs(44),
        timeout: Duration::from_secs(2),
        max_body: 1 << 20,
        seed: 1,
        server: &server,
        server_args: &args,
        balancer: FleetBalancer::HaProxy {
            program: &haproxy,
            settings: &balancer,
        },
        capacity: CAPACITY,
        dir,
    };
    // NOTE: a run of 28 s plus the processes' startup; the bound keeps a broken run from
    // hanging CI.
    tokio::time::timeout(
        Duration::from_secs(60),
        fleet_run(spec, &run, &mut Progress::new(false)),
    )
    .await
    .expect("the run ends by itself")
    .expect("the run succeeds")
}

/// The default load: 20000 clients thinking 44 s on average, about 455 req/s, 76 % of the
/// fleet's capacity and 114 % of two servers'.
///
/// `fixed vs --stack none`: the survivors' queues grow until answers take longer than the
/// clients' 2 s timeout (about 12 s into the outage); from then every attempt times out
/// and comes back 100 ms later, successes fall to nothing, and the fleet stays down after
/// the server returns: its third of the storm is more than it can serve too.
///
/// `full vs --stack full`: the survivors serve close to their rate limit (183 req/s, 92 % of
/// their capacity) and turn the rest away at once; the fleet is back within 2 s of the
/// return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_server_of_three_brings_the_bare_fleet_down_and_not_the_protected_one() {
    let dir = std::env::temp_dir().join(format!("fleet-test-{}", std::process::id()));
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
        // About 455 requests per second.
        assert!(
            r.baseline > 300.0,
            "{}: baseline {}\n{table}",
            r.label,
            r.baseline
        );
        assert_eq!(record.survivors.len(), 2, "{table}");
        let servers = record.balancer.requests_per_server();
        assert_eq!(servers.len(), 3, "{table}");
        // The balancer's view: every server took requests.
        for (name, requests) in &servers {
            assert!(*requests > 0, "{}: {name} took none\n{table}", r.label);
        }
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
        // Turned away: rejected, or (once retries arrive) told to stop.
        assert!(
            s.rejected_per_s.unwrap_or(0.0) > 0.0 || s.stop_signals.unwrap_or(0) > 0,
            "full: {} turned nothing away\n{table}",
            s.name
        );
    }
    // ...at once: every outcome, failures included, within a second at the 99th percentile.
    let p99 = g.p99_outcome.expect("outcomes");
    assert!(
        p99 < Duration::from_secs(1),
        "full: p99 of every outcome {p99:?}\n{table}"
    );
    let recovery = g.recovery.expect("the protected fleet recovered");
    assert!(recovery <= 2, "full: back after {recovery} s\n{table}");
    std::fs::remove_dir_all(&dir).ok();
}
