//! The quick fleet experiment and the assertions every balancer shares: three `demo-server`
//! processes on 127.0.0.1 behind a balancer of our own, one of them stopped with SIGSTOP and
//! resumed, through the same code as `demo-client fleet --quick`. Each test keeps its own
//! assertions on the balancer's view (`fleet.rs`: HAProxy, `fleet_envoy.rs`: Envoy).

use std::ffi::OsString;
use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Duration;

use demo_client::cli::FLEET_QUICK;
use demo_client::drive::Progress;
use demo_client::experiment::{RunSpec, ServerStack};
use demo_client::fleet::{FleetBalancer, FleetRecord, FleetRun, SurvivorTable, fleet_run};
use demo_client::strategy::Strategy;

/// One server's capacity in the default model (M/M/10, 50 ms mean service): 200 req/s.
pub const CAPACITY: f64 = 200.0;

/// The two quick runs behind one balancer: the bare fleet (`fixed vs --stack none`) and the
/// protected one (`full vs --stack full`), with the survivors' table that every assertion
/// message carries.
#[derive(Debug)]
pub struct QuickPair {
    /// `fixed vs --stack none`.
    pub fixed: FleetRecord,
    /// `full vs --stack full`.
    pub full: FleetRecord,
    /// The survivors' table of both runs, for assertion messages.
    pub table: String,
}

/// One quick run of `spec` behind `balancer`, its files in `dir`: the default load, 20000
/// clients thinking 44 s on average (about 455 req/s, 76 % of the fleet's capacity and
/// 114 % of two servers'), a 2 s client timeout. Panics (the test fails) when the run fails
/// or takes more than 60 s.
pub async fn quick(balancer: FleetBalancer<'_>, spec: RunSpec, dir: &Path) -> FleetRecord {
    let server = crate::workspace_binary("demo-server");
    let args: Vec<OsString> = ["--model", "mmc", "--trusted-proxy", "127.0.0.1"]
        .map(OsString::from)
        .to_vec();
    let run = FleetRun {
        timing: FLEET_QUICK,
        clients: NonZeroUsize::new(20_000).unwrap(),
        think_time: Duration::from_secs(44),
        timeout: Duration::from_secs(2),
        max_body: 1 << 20,
        seed: 1,
        server: &server,
        server_args: &args,
        balancer,
        capacity: CAPACITY,
        dir,
    };
    // NOTE: a run of about half a minute plus the processes' startup; the bound keeps a
    // broken run from hanging CI.
    tokio::time::timeout(
        Duration::from_secs(60),
        fleet_run(spec, &run, &mut Progress::new(false)),
    )
    .await
    .expect("the run ends by itself")
    .expect("the run succeeds")
}

/// The bare fleet's run, then the protected fleet's, behind `balancer`, their files in `dir`.
pub async fn quick_pair(balancer: FleetBalancer<'_>, dir: &Path) -> QuickPair {
    let fixed = quick(
        balancer,
        RunSpec {
            strategy: Strategy::Fixed,
            stack: ServerStack::None,
        },
        dir,
    )
    .await;
    let full = quick(
        balancer,
        RunSpec {
            strategy: Strategy::Full,
            stack: ServerStack::Full,
        },
        dir,
    )
    .await;
    let table = SurvivorTable(&[fixed.clone(), full.clone()]).to_string();
    QuickPair { fixed, full, table }
}

impl QuickPair {
    /// Each run's shared assertions (a baseline of about 455 requests per second, more than
    /// 300; two survivors), then `balancer_view`'s own on the run: what the balancer saw.
    pub fn assert_each_run(&self, balancer_view: impl Fn(&FleetRecord)) {
        let table = &self.table;
        for record in [&self.fixed, &self.full] {
            let r = &record.run.report;
            assert!(
                r.baseline > 300.0,
                "{}: baseline {}\n{table}",
                r.label,
                r.baseline
            );
            assert_eq!(record.survivors.len(), 2, "{table}");
            balancer_view(record);
        }
    }

    /// The bare fleet collapses during the outage and stays down after it: no recovery,
    /// every second after the return below a tenth of the baseline, and more than ten times
    /// as many timeouts as successes after the return.
    pub fn assert_bare_fleet_stays_down(&self) {
        let table = &self.table;
        let phases = FLEET_QUICK.phases();
        let f = &self.fixed.run.report;
        assert_eq!(f.recovery, None, "fixed recovered: {f:?}\n{table}");
        let after = &self.fixed.run.seconds[phases.resume_at()..phases.end()];
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
    }

    /// The protected fleet: survivors at 90 % of their capacity or more, the rest turned
    /// away at once (the 99th percentile of every outcome under 1 s), back within 2 s of
    /// the return.
    pub fn assert_protected_fleet_holds(&self) {
        let table = &self.table;
        let g = &self.full.run.report;
        for s in &self.full.survivors {
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
        // ...at once: every outcome, failures included, within a second at the 99th
        // percentile.
        let p99 = g.p99_outcome.expect("outcomes");
        assert!(
            p99 < Duration::from_secs(1),
            "full: p99 of every outcome {p99:?}\n{table}"
        );
        let recovery = g.recovery.expect("the protected fleet recovered");
        assert!(recovery <= 2, "full: back after {recovery} s\n{table}");
    }
}
