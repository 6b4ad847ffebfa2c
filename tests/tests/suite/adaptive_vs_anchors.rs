//! Issue 15's figures in virtual time: the adaptive limit, with no capacity configured,
//! against tower-acc's Vegas and Gradient2 on the same model and the same seeded load at
//! three times the model's capacity (`integration_tests::compare`; the full tables come
//! from `cargo run --release -p integration-tests --example adaptive_compare`).

use std::time::Duration;

use demo_server::model::{LatencyModel, MmcModel};
use integration_tests::compare::{Contender, Load, Outcome, run, unloaded};

const SEED: u64 = 15;

fn load(capacity: f64, halve_at: Option<u64>) -> Load {
    Load {
        rate: 3.0 * capacity,
        seconds: 30,
        warmup: 5,
        halve_at,
        seed: SEED,
    }
}

fn all(latency: LatencyModel, load: Load) -> [Outcome; 3] {
    [Contender::Adaptive, Contender::Vegas, Contender::Gradient2].map(|c| run(latency, c, load))
}

/// Goodput at least 90 % of capacity and admitted p99 at most twice the unloaded p99.
fn meets_the_issue(o: &Outcome, capacity: f64, bound: Duration) -> bool {
    o.before.goodput >= 0.9 * capacity && o.before.p99 <= bound
}

#[test]
fn mmc_at_three_times_capacity_beats_both_anchors() {
    let capacity = 200.0;
    let latency: LatencyModel = MmcModel::builder().seed(SEED).build().unwrap().into();
    let bound = 2 * unloaded(latency, capacity, SEED).p99;
    let [adaptive, vegas, gradient2] = all(latency, load(capacity, None));
    let show = format!("{adaptive:?}\n{vegas:?}\n{gradient2:?}").replace("limits", "");
    assert!(meets_the_issue(&adaptive, capacity, bound), "{show}");
    // Vegas keeps its limit under the 10 workers (goodput lost); Gradient2 lets a queue
    // build (latency lost). The adaptive limit loses neither.
    assert!(!meets_the_issue(&vegas, capacity, bound), "{show}");
    assert!(!meets_the_issue(&gradient2, capacity, bound), "{show}");
    assert!(adaptive.before.goodput >= vegas.before.goodput, "{show}");
    assert!(
        adaptive.before.goodput >= 0.99 * gradient2.before.goodput,
        "{show}"
    );
    assert!(adaptive.before.p99 <= gradient2.before.p99, "{show}");
}

#[test]
fn article_at_three_times_capacity_meets_the_issue_and_sits_between_the_anchors() {
    let capacity = 300.0;
    let latency = LatencyModel::default();
    let bound = 2 * unloaded(latency, capacity, SEED).p99;
    let [adaptive, vegas, gradient2] = all(latency, load(capacity, None));
    let show = format!("{adaptive:?}\n{vegas:?}\n{gradient2:?}");
    assert!(meets_the_issue(&adaptive, capacity, bound), "{show}");
    // The article's model stays fast well past its knee: Gradient2 (limit 200) never
    // rejects, Vegas holds the latency lower at a much lower goodput.
    assert!(
        adaptive.before.goodput >= 1.4 * vegas.before.goodput,
        "{show}"
    );
    assert!(adaptive.before.p99 <= gradient2.before.p99, "{show}");
}

#[test]
fn capacity_halved_the_limit_settles_within_ten_seconds() {
    for (name, latency, capacity) in [
        ("article", LatencyModel::default(), 300.0),
        (
            "mmc",
            MmcModel::builder().seed(SEED).build().unwrap().into(),
            200.0,
        ),
    ] {
        let bound = 2 * unloaded(latency, capacity, SEED).p99;
        let o = run(latency, Contender::Adaptive, load(capacity, Some(15)));
        let after = o.after.unwrap();
        let s = Duration::from_secs;
        let show = format!("{name}: {after:?}, limits {:?}", o.limits);
        // From 10 s after the halving: at least 90 % of the new capacity, p99 in bound.
        assert!(after.goodput >= 0.9 * capacity / 2.0, "{show}");
        assert!(after.p99 <= bound, "{show}");
        // The limit came down, and stays within 25 % of where it settled.
        let settled = o.mean_limit(s(25), s(30));
        assert!(settled < 0.95 * o.mean_limit(s(5), s(15)), "{show}");
        for (t, limit) in o.limits.iter().filter(|(t, _)| *t >= s(25)) {
            assert!(
                (*limit as f64 - settled).abs() <= 0.25 * settled + 2.0,
                "{show}: {limit} at {t:?} vs {settled}"
            );
        }
    }
}
