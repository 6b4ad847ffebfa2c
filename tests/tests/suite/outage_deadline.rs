//! The outage experiment against the deadline layer alone (issue 22), in virtual time and
//! deterministic: `full` clients, which send their per-attempt timeout as
//! `X-Request-Deadline`, against `demo-server --stack deadline`: no rate limit, no adaptive
//! limit, nothing configured but the deadline layer in front of the article's model.
//!
//! At resume the server reads thousands of requests queued while it was stopped, most of
//! them for attempts their clients abandoned seconds ago. The bare server works on every one
//! of them (the scenario's `fixed vs --stack none` passed 31 794 requests inside); the
//! deadline layer answers each expired one `504` at the cost of a header read, so the model
//! only ever holds work someone waits for, and the server is back within 2 s.

use std::num::NonZeroUsize;
use std::time::Duration;

use demo_client::client::Abandoned;
use demo_client::drive::Progress;
use demo_client::experiment::{RunSpec, ServerStack, Timing};
use demo_client::load::LoadConfig;
use demo_client::simulate::{SimulatedRun, simulate_run};
use demo_client::strategy::Strategy;

#[test]
fn the_deadline_layer_alone_brings_the_server_back_within_two_seconds() {
    // The article's load (1000 clients, 10 s think time, 2 s timeout), 6 s of steady state,
    // a 10 s pause, 30 s of observation, the article's server (abandoned work served).
    let load = LoadConfig::new(
        NonZeroUsize::new(1000).unwrap(),
        Duration::from_secs(10),
        "http://127.0.0.1:8070/api".parse().unwrap(),
        42,
    )
    .unwrap();
    let run = SimulatedRun {
        timing: Timing::new(
            Duration::from_secs(6),
            Duration::from_secs(10),
            Duration::from_secs(30),
        )
        .unwrap(),
        load,
        timeout: Duration::from_secs(2),
        max_body: 1 << 20,
        abandoned: Abandoned::Serve,
        backlog: 4096,
    };
    let spec = RunSpec {
        strategy: Strategy::Full,
        stack: ServerStack::Deadline,
    };
    let record = simulate_run(spec, &run, &mut Progress::new(false)).unwrap();
    let r = &record.report;
    eprintln!("{r:?}");
    assert!(
        (80.0..=120.0).contains(&r.baseline),
        "baseline {}",
        r.baseline
    );
    let recovery = r
        .recovery
        .expect("the deadline layer brings the server back");
    assert!(recovery <= 2, "recovered after {recovery} s");
    // The expired backlog never entered the model: it stayed far from the 951 requests at
    // which the article's model takes longer than the clients wait.
    let peak = r.peak_concurrency.unwrap();
    assert!(peak < 400, "peak concurrency {peak}");
    // Successes after resume came within the clients' timeout.
    let p99 = r.p99.expect("successes after resume");
    assert!(p99 < Duration::from_secs(2), "p99 of successes {p99:?}");
}
