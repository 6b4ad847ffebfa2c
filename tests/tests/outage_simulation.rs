//! The article's result, checked deterministically: the outage experiment in virtual time
//! (`demo-client simulate`) on a scaled-down timing, with the demo server's model and
//! middleware, the real client layers and seeded randomness.
//!
//! - `fixed` retries against a bare server: the server does not recover within the
//!   observation;
//! - `full` against the full server stack: it recovers within a few seconds of resume, and the
//!   clients sent at most 1.1 times their normal load during the pause;
//! - `exponential` against a bare server: it recovers, but more slowly than `full`: minutes
//!   after resume here, once its clients' doubling waits have thinned their retries enough
//!   for the abandoned requests to drain, so its run observes for four minutes;
//! - `fixed` against the full server stack: the server side alone brings it back within a
//!   few seconds, though its clients (the article's: no attempt header, deaf to the stop
//!   signal, never giving up) keep retrying the limiter's `429`s;
//! - `full` against the bare server: the client stack alone brings it back within 2 s, its
//!   throttle refusing most requests of the pause locally; without the throttle
//!   (`full-no-throttle`, the client stack before issue 21) the server never comes back.

use std::num::NonZeroUsize;
use std::sync::OnceLock;
use std::time::Duration;

use demo_client::client::Abandoned;
use demo_client::drive::Progress;
use demo_client::experiment::{RunSpec, ServerStack, Timing};
use demo_client::load::LoadConfig;
use demo_client::output::RunRecord;
use demo_client::simulate::{SimulatedRun, simulate_run};
use demo_client::strategy::Strategy;

const SEED: u64 = 42;

/// The article's load (1000 clients, 10 s think time, 2 s timeout) with shorter phases: 6 s
/// of steady state, a 10 s pause, 30 s of observation.
fn run(strategy: Strategy, stack: ServerStack, seed: u64) -> RunRecord {
    run_observing(strategy, stack, seed, Duration::from_secs(30))
}

/// [`run`], observing for `observe` after resume.
fn run_observing(
    strategy: Strategy,
    stack: ServerStack,
    seed: u64,
    observe: Duration,
) -> RunRecord {
    let timing = Timing::new(Duration::from_secs(6), Duration::from_secs(10), observe).unwrap();
    run_timed(strategy, stack, seed, timing)
}

/// [`run`], with the phases of `timing`.
fn run_timed(strategy: Strategy, stack: ServerStack, seed: u64, timing: Timing) -> RunRecord {
    let load = LoadConfig::new(
        NonZeroUsize::new(1000).unwrap(),
        Duration::from_secs(10),
        "http://127.0.0.1:8070/api".parse().unwrap(),
        seed,
    )
    .unwrap();
    let run = SimulatedRun {
        timing,
        load,
        timeout: Duration::from_secs(2),
        max_body: 1 << 20,
        // The article's server, as `scenario` and `simulate` run it by default.
        abandoned: Abandoned::Serve,
        backlog: 4096,
    };
    simulate_run(RunSpec { strategy, stack }, &run, &mut Progress::new(false)).unwrap()
}

fn fixed() -> &'static RunRecord {
    static RUN: OnceLock<RunRecord> = OnceLock::new();
    RUN.get_or_init(|| run(Strategy::Fixed, ServerStack::None, SEED))
}

fn exponential() -> &'static RunRecord {
    static RUN: OnceLock<RunRecord> = OnceLock::new();
    // NOTE: four minutes of observation: the article's exponential client needs about two to
    // bring the server back in this model (it stays down for the first 30 s, like fixed).
    RUN.get_or_init(|| {
        run_observing(
            Strategy::Exponential,
            ServerStack::None,
            SEED,
            Duration::from_secs(240),
        )
    })
}

fn full() -> &'static RunRecord {
    static RUN: OnceLock<RunRecord> = OnceLock::new();
    RUN.get_or_init(|| run(Strategy::Full, ServerStack::Full, SEED))
}

/// `full` against the bare server, with the article's timing (`simulate`'s default): the
/// issue's figures are of a 20 s pause, which a server without protection does not survive
/// (a 10 s pause it does, without the throttle too).
fn full_against_none() -> &'static RunRecord {
    static RUN: OnceLock<RunRecord> = OnceLock::new();
    RUN.get_or_init(|| run_timed(Strategy::Full, ServerStack::None, SEED, Timing::DEFAULT))
}

fn fixed_against_full() -> &'static RunRecord {
    static RUN: OnceLock<RunRecord> = OnceLock::new();
    RUN.get_or_init(|| run(Strategy::Fixed, ServerStack::Full, SEED))
}

#[test]
fn every_run_reaches_the_articles_baseline() {
    // 1000 clients with a 10 s mean think time offer about 100 requests per second.
    for r in [
        fixed(),
        exponential(),
        full(),
        fixed_against_full(),
        full_against_none(),
    ] {
        let b = r.report.baseline;
        assert!(
            (80.0..=120.0).contains(&b),
            "{}: baseline {b}",
            r.report.label
        );
    }
}

#[test]
fn fixed_retries_keep_a_bare_server_down() {
    let r = &fixed().report;
    assert_eq!(r.recovery, None, "fixed recovered");
    // Retrying every 100 ms after each timeout multiplies the load during the pause.
    let amplification = r.amplification.unwrap();
    assert!(amplification > 1.5, "amplification {amplification}");
    // And after resume the server is drowning: most requests time out.
    let (timeouts, ok) = (r.after_resume.timeouts, r.after_resume.ok);
    assert!(
        timeouts > ok,
        "{timeouts} timeouts, {ok} successes after resume"
    );
}

#[test]
fn the_full_stack_recovers_within_seconds_without_amplification() {
    let r = &full().report;
    let recovery = r.recovery.expect("the full stack recovers");
    assert!(recovery <= 3, "recovered after {recovery} s");
    let amplification = r.amplification.unwrap();
    assert!(amplification <= 1.1, "amplification {amplification}");
}

#[test]
fn the_server_side_alone_brings_the_server_back_from_fixed_clients() {
    // Naive clients against the protected server: the limiter turns the burst into cheap
    // 429s, so the model never collapses, though the clients keep retrying.
    let r = &fixed_against_full().report;
    let recovery = r
        .recovery
        .expect("the full stack recovers from fixed clients");
    assert!(recovery <= 3, "recovered after {recovery} s");
    let peak = r.peak_concurrency.unwrap();
    assert!(peak < 100, "peak concurrency {peak}");
    // The clients are the article's: answered 429 by the limiter, they retry every 100 ms
    // and never give up; their only failures are requests still waiting when the run ends.
    let rejected = r.after_resume.rejected;
    assert!(rejected > 1000, "{rejected} attempts rejected after resume");
    assert!(
        r.failed == r.unfinished && r.failed < r.requests / 100,
        "{} failed, {} of them still waiting at the end, of {} requests",
        r.failed,
        r.unfinished,
        r.requests
    );
}

/// Issue 21: the client stack alone lets the article's server (no protection, abandoned
/// work served to the end) rise. Regression: without the throttle it never did (81.9 % of
/// a default run's requests failed).
#[test]
fn the_client_stack_alone_brings_the_bare_server_back() {
    let r = &full_against_none().report;
    let recovery = r.recovery.expect("full vs --stack none recovers");
    assert!(recovery <= 2, "recovered after {recovery} s");
    // The pause is 20 s of 95: its requests fail (refused at once, or timed out before the
    // throttle started); few others do. The bar: at most 25 %.
    let failed = r.failed_share().unwrap();
    assert!(failed <= 0.25, "{:.1} % failed", failed * 100.0);
    // The throttle refused most of the pause's requests locally, so the clients sent far
    // fewer attempts than their load while the server was stopped...
    assert!(r.throttled > 500, "{} refused locally", r.throttled);
    let amplification = r.amplification.unwrap();
    assert!(amplification < 0.5, "amplification {amplification}");
    // ...and the server's model stayed under the concurrency (951) past which a request
    // takes longer than the clients' timeout.
    let peak = r.peak_concurrency.unwrap();
    assert!(peak < 951, "peak concurrency {peak}");
    // Nothing is refused once it is back: none in the last 10 s.
    let record = full_against_none();
    let end = record.phases.end();
    let tail = &record.seconds[end - 10..end];
    assert_eq!(tail.iter().map(|s| s.throttled).sum::<u64>(), 0);

    // The same clients without the throttle: the server never comes back.
    let without = run_timed(
        Strategy::FullNoThrottle,
        ServerStack::None,
        SEED,
        Timing::DEFAULT,
    )
    .report;
    assert_eq!(without.recovery, None, "never: {:?}", without.recovery);
    let failed = without.failed_share().unwrap();
    assert!(failed > 0.5, "{:.1} % failed", failed * 100.0);
}

#[test]
fn failures_are_counted_not_hidden() {
    // The full stack gives up on requests (3 attempts, a budget, the stop signal): they are
    // failures, and its table says so...
    let f = &full().report;
    assert!(
        f.failed > 10 * f.unfinished,
        "full: {} failed, {} of them still waiting at the end",
        f.failed,
        f.unfinished
    );
    // ...while fixed clients never give up: their failures are requests still waiting.
    let x = &fixed().report;
    assert!(
        x.unfinished > 100 && x.failed == x.unfinished,
        "fixed: {} failed, {} of them still waiting at the end",
        x.failed,
        x.unfinished
    );
    // Every request the clients started is a success or a failure.
    for record in [full(), fixed()] {
        let r = &record.report;
        let ok: u64 = record.seconds.iter().map(|s| s.ok).sum();
        assert_eq!(ok + r.failed, r.requests, "{}", r.label);
    }
}

#[test]
fn exponential_backoff_recovers_but_more_slowly_than_the_full_stack() {
    let e = &exponential().report;
    let f = &full().report;
    let slow = e.recovery.expect("exponential backoff recovers");
    let fast = f.recovery.expect("the full stack recovers");
    assert!(slow > fast, "exponential {slow} s, full {fast} s");
    // Not a near tie: the article's exponential client needs well over the 30 s that
    // `fixed` is observed for.
    assert!(slow >= 30, "exponential {slow} s");
}

#[test]
fn the_same_seed_gives_the_same_figures() {
    // NOTE: what a 429 turns into (a budget refusal or a stop signal) can differ by a few
    // per run: demo-server's pause watcher uses an unbiased `tokio::select!`, whose random
    // branch order is the one thing a seed does not fix. Every figure and the successes,
    // errors, timeouts and attempts of every second are the same.
    let again = run(Strategy::Full, ServerStack::Full, SEED);
    assert_eq!(figures(&again), figures(full()));
    assert_eq!(counts(&again), counts(full()));
    let other = run(Strategy::Full, ServerStack::Full, SEED + 1);
    assert_ne!(counts(&other), counts(full()), "the seed changes the run");
}

type Figures = (
    f64,
    Option<usize>,
    Option<f64>,
    Option<u64>,
    Option<Duration>,
    Option<Duration>,
);

fn figures(r: &RunRecord) -> Figures {
    let r = &r.report;
    (
        r.baseline,
        r.recovery,
        r.amplification,
        r.peak_concurrency,
        r.p50,
        r.p99,
    )
}

fn counts(r: &RunRecord) -> Vec<(u64, u64, u64, u64)> {
    r.seconds
        .iter()
        .map(|s| (s.ok, s.errors, s.timeouts, s.attempts))
        .collect()
}
