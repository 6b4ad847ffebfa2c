//! The adaptive limit against tower-acc's Vegas and Gradient2, in virtual time: the same
//! model, the same seeded Poisson load at three times the model's capacity, 60 s; then the
//! same with the capacity halved at 30 s. Prints the tables of `BENCHMARKS.md`.
//!
//! ```text
//! cargo run --release -p integration-tests --example adaptive_compare
//! ```
//!
//! Deterministic: the same figures on every machine (virtual time, seeded arrivals and
//! service times).

use std::time::Duration;

use demo_server::model::{LatencyModel, MmcModel};
use integration_tests::compare::{Contender, Figures, Load, run, unloaded};

const SEED: u64 = 15;

fn main() {
    let models = [
        (
            "article (knee 30, 100 ms: capacity 300 req/s)",
            LatencyModel::default(),
            300.0,
        ),
        (
            "mmc (10 workers, 50 ms: capacity 200 req/s)",
            MmcModel::builder().seed(SEED).build().unwrap().into(),
            200.0,
        ),
    ];
    for (name, latency, capacity) in models {
        let idle = unloaded(latency, capacity, SEED);
        println!("\n## {name}");
        println!(
            "unloaded (bare, {} req/s): p50 {:.0} ms, p99 {:.0} ms; the bound on admitted p99 is {:.0} ms",
            capacity / 10.0,
            ms(idle.p50),
            ms(idle.p99),
            2.0 * ms(idle.p99)
        );
        let steady = Load {
            rate: 3.0 * capacity,
            seconds: 60,
            warmup: 5,
            halve_at: None,
            seed: SEED,
        };
        println!(
            "\n3x capacity ({} req/s) for 60 s, figures from 5 s on:\n",
            steady.rate
        );
        header();
        for contender in Contender::ALL {
            let o = run(latency, contender, steady);
            row(
                contender,
                &o.before,
                capacity,
                o.mean_limit(secs(5), secs(60)),
            );
        }
        let halved = Load {
            halve_at: Some(30),
            ..steady
        };
        println!(
            "\nthe same, capacity halved at 30 s; figures from 40 s on (settled within 10 s), against half the capacity:\n"
        );
        header();
        for contender in Contender::ALL {
            let o = run(latency, contender, halved);
            let after = o.after.expect("halved");
            row(
                contender,
                &after,
                capacity / 2.0,
                o.mean_limit(secs(40), secs(60)),
            );
            if contender == Contender::Adaptive {
                let trace: Vec<String> = [25, 29, 31, 33, 35, 40, 50, 59]
                    .iter()
                    .map(|&t| format!("{t}s: {:.0}", o.mean_limit(secs(t), secs(t + 1))))
                    .collect();
                println!("|   | limit over time: {} | | | | |", trace.join(", "));
            }
        }
    }
}

fn header() {
    println!(
        "| contender | goodput (req/s) | of capacity | admitted p50 | admitted p99 | rejected | mean limit |"
    );
    println!("|---|---|---|---|---|---|---|");
}

fn row(contender: Contender, f: &Figures, capacity: f64, limit: f64) {
    println!(
        "| {} | {:.0} | {:.0} % | {:.0} ms | {:.0} ms | {:.0} % | {} |",
        contender.name(),
        f.goodput,
        100.0 * f.goodput / capacity,
        ms(f.p50),
        ms(f.p99),
        100.0 * f.rejected,
        if contender == Contender::None {
            "-".to_owned()
        } else {
            format!("{limit:.0}")
        }
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
