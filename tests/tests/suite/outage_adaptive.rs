//! Issue 15's outage figures in virtual time: the outage experiment (`demo-client simulate`,
//! the same scaled-down timing as `outage_simulation.rs`) against `--stack adaptive`, the
//! overload layer in front of the adaptive limit, with no rate configured. It recovers like
//! the hand-tuned stack: `full` clients within 2 s of resume, naive `fixed` ones within 3 s.

use std::num::NonZeroUsize;
use std::time::Duration;

use demo_client::client::Abandoned;
use demo_client::drive::Progress;
use demo_client::experiment::{RunSpec, ServerStack, Timing};
use demo_client::load::LoadConfig;
use demo_client::output::RunRecord;
use demo_client::simulate::{SimulatedRun, simulate_run};
use demo_client::strategy::Strategy;

const SEED: u64 = 42;

/// The article's load (1000 clients, 10 s think time, 2 s timeout): 10 s of steady state, a
/// 10 s pause, 30 s of observation.
///
/// The steady state is longer than `outage_simulation.rs`'s 6 s: the adaptive limit starts
/// at its initial limit (20) and measures its first baseline there, turning away what the
/// start's burst brings over it, and the article's `fixed` clients retry those every 100 ms
/// until their backlog drains. With 6 s, the baseline (the steady state after its first
/// third) could include that catch-up and ask more of the recovered server than its clients
/// send. (The figures that set this length, 194 successes in second 2 against about 95 in
/// the others at seed 42, were measured when the limit started at its minimum of 3.)
fn run(strategy: Strategy) -> RunRecord {
    let load = LoadConfig::new(
        NonZeroUsize::new(1000).unwrap(),
        Duration::from_secs(10),
        "http://127.0.0.1:8070/api".parse().unwrap(),
        SEED,
    )
    .unwrap();
    let run = SimulatedRun {
        timing: Timing::new(
            Duration::from_secs(10),
            Duration::from_secs(10),
            Duration::from_secs(30),
        )
        .unwrap(),
        load,
        timeout: Duration::from_secs(2),
        max_body: 1 << 20,
        // The article's server, as `scenario` and `simulate` run it by default.
        abandoned: Abandoned::Serve,
        backlog: 4096,
    };
    let spec = RunSpec {
        strategy,
        stack: ServerStack::Adaptive,
    };
    simulate_run(spec, &run, &mut Progress::new(false)).unwrap()
}

#[test]
fn full_clients_against_the_adaptive_stack_recover_within_two_seconds() {
    let r = run(Strategy::Full).report;
    assert!((80.0..=120.0).contains(&r.baseline), "{r:?}");
    let recovery = r.recovery.expect("full vs adaptive recovers");
    assert!(recovery <= 2, "recovered after {recovery} s: {r:?}");
}

#[test]
fn fixed_clients_against_the_adaptive_stack_recover_within_three_seconds() {
    let r = run(Strategy::Fixed).report;
    assert!((80.0..=120.0).contains(&r.baseline), "{r:?}");
    let recovery = r.recovery.expect("fixed vs adaptive recovers");
    assert!(recovery <= 3, "recovered after {recovery} s: {r:?}");
}
