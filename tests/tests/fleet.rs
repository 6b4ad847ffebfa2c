//! The outage experiment in the paper's topology, short: three `demo-server` processes on
//! 127.0.0.1 behind a real HAProxy (Debian's package; the test fails, never skips, without
//! it), one of them stopped with SIGSTOP for 16 s and resumed, through the same code as
//! `demo-client fleet --quick`.

use demo_client::fleet::{BalancerSettings, FleetBalancer, find_haproxy};
use integration_tests::fleet::quick_pair;

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
    let haproxy = find_haproxy(None).expect("haproxy is installed (scripts/test installs it)");
    let settings = BalancerSettings::default();
    let balancer = FleetBalancer::HaProxy {
        program: &haproxy,
        settings: &settings,
    };
    let runs = quick_pair(balancer, &dir).await;
    let table = &runs.table;

    runs.assert_each_run(|record| {
        let r = &record.run.report;
        let servers = record.balancer.requests_per_server();
        assert_eq!(servers.len(), 3, "{table}");
        // The balancer's view: every server took requests.
        for (name, requests) in &servers {
            assert!(*requests > 0, "{}: {name} took none\n{table}", r.label);
        }
    });

    runs.assert_bare_fleet_stays_down();
    runs.assert_protected_fleet_holds();
    std::fs::remove_dir_all(&dir).ok();
}
