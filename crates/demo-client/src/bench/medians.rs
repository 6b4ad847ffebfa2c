//! Several rounds of a curve (`demo-client bench --rounds N`) made into one point per system,
//! model and load: the median of each figure over the rounds, and how far the rounds spread.
//!
//! One 6 s point of the M/M/10 model serves about 1 200 answers of exponential service
//! times, a count with a standard error near 3 %: a system serving 99 % of the capacity
//! on average reads under 97 % in about one point of four, and its median of three rounds
//! in about one of seven (two rounds of three under it). The spread table shows every
//! point's range of rounds beside the medians, so the median hides nothing.

use std::fmt::Write as _;
use std::time::Duration;

use super::figures::{Figures, PointSpec, RejectionCheck};
use super::table::{Results, table_order};

/// How one system's rounds at one point spread.
#[derive(Clone, Debug, PartialEq)]
pub struct Spread {
    /// The point.
    pub spec: PointSpec,
    /// Rounds measured.
    pub rounds: usize,
    /// The lowest and the highest goodput of the rounds, requests a second.
    pub goodput: (f64, f64),
    /// The lowest and the highest served p99 of the rounds that served anything.
    pub served_p99: Option<(Duration, Duration)>,
    /// Rounds the generator limited ([`Figures::generator_limited`]).
    pub limited: usize,
    /// Rounds whose warm-up reached its cap unsettled.
    pub unsettled: usize,
}

impl Results {
    /// One point per system, model and load, in the order each was first measured: the
    /// median of each figure over its rounds (each figure on its own, so the median
    /// goodput and the median p99 may come from different rounds; of an even number of
    /// rounds, the mean of the two middle ones), the rounds' Envoy checks added up, and a
    /// point settled only if every round was. With one round a point, the points as they
    /// are. The [`Spread`]s say how far each point's rounds were apart, sorted as the table
    /// is: by model, load, then system in the order of
    /// [`System::ALL`](super::system::System::ALL).
    pub fn medians(&self) -> (Results, Vec<Spread>) {
        let mut groups: Vec<(PointSpec, Vec<&Figures>)> = Vec::new();
        for (spec, figures) in self.points() {
            // NOTE: the same load is the same value from the same list: exact.
            match groups.iter_mut().find(|(s, _)| {
                s.system == spec.system
                    && s.model == spec.model
                    && s.load.total_cmp(&spec.load).is_eq()
            }) {
                Some((_, rounds)) => rounds.push(figures),
                None => groups.push((*spec, vec![figures])),
            }
        }
        let mut medians = Results::new();
        let mut spreads = Vec::new();
        for (spec, rounds) in groups {
            medians.push(spec, median_figures(&rounds));
            let goodputs: Vec<f64> = rounds.iter().map(|f| f.goodput).collect();
            let p99s: Vec<Duration> = rounds.iter().filter_map(|f| f.served_p99).collect();
            spreads.push(Spread {
                spec,
                rounds: rounds.len(),
                goodput: (
                    goodputs.iter().copied().fold(f64::INFINITY, f64::min),
                    goodputs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                ),
                served_p99: p99s
                    .iter()
                    .min()
                    .zip(p99s.iter().max())
                    .map(|(a, b)| (*a, *b)),
                limited: rounds.iter().filter(|f| f.generator_limited()).count(),
                unsettled: rounds.iter().filter(|f| !f.settled).count(),
            });
        }
        spreads.sort_by(|a, b| table_order(&a.spec, &b.spec));
        (medians, spreads)
    }
}

/// The spread of each point's rounds as a Markdown table (one row per point, in the order
/// given): rounds, goodput and served p99 as lowest to highest, and the rounds the
/// generator limited or whose warm-up reached its cap.
pub fn spread_markdown(spreads: &[Spread]) -> String {
    let mut out = String::from(
        "| model | load | system | rounds | goodput req/s, lowest to highest | served p99 ms, lowest to highest | rounds limited by the generator, unsettled |\n|---|---|---|---|---|---|---|\n",
    );
    for s in spreads {
        let p99 = s.served_p99.map_or_else(
            || "-".to_owned(),
            |(low, high)| format!("{:.1} to {:.1}", ms(low), ms(high)),
        );
        let _ = writeln!(
            out,
            "| {} | {}x | {} | {} | {:.0} to {:.0} | {p99} | {}, {} |",
            s.spec.model,
            s.spec.load,
            s.spec.system,
            s.rounds,
            s.goodput.0,
            s.goodput.1,
            s.limited,
            s.unsettled,
        );
    }
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median_figures(rounds: &[&Figures]) -> Figures {
    let f64s = |get: &dyn Fn(&Figures) -> f64| median(rounds.iter().map(|f| get(f)).collect());
    let counts = |get: &dyn Fn(&Figures) -> u64| {
        // NOTE: counts are far below 2^53: exact as f64.
        median(rounds.iter().map(|f| get(f) as f64).collect()).round() as u64
    };
    let durations = |get: &dyn Fn(&Figures) -> Option<Duration>| {
        let some: Vec<f64> = rounds
            .iter()
            .filter_map(|f| get(f))
            .map(|d| d.as_secs_f64())
            .collect();
        (!some.is_empty()).then(|| Duration::from_secs_f64(median(some)))
    };
    let cpus: Vec<f64> = rounds.iter().filter_map(|f| f.generator_cpu).collect();
    let checks: Vec<RejectionCheck> = rounds.iter().filter_map(|f| f.envoy_check).collect();
    Figures {
        offered_rate: f64s(&|f| f.offered_rate),
        goodput: f64s(&|f| f.goodput),
        served_p50: durations(&|f| f.served_p50),
        served_p99: durations(&|f| f.served_p99),
        served_p999: durations(&|f| f.served_p999),
        served: counts(&|f| f.served),
        rejected: counts(&|f| f.rejected),
        failed: counts(&|f| f.failed),
        dropped: counts(&|f| f.dropped),
        late: counts(&|f| f.late),
        lag_p99: durations(&|f| f.lag_p99),
        generator_cpu: (!cpus.is_empty()).then(|| median(cpus)),
        warmup: durations(&|f| Some(f.warmup)).unwrap_or_default(),
        settled: rounds.iter().all(|f| f.settled),
        envoy_check: (!checks.is_empty()).then(|| RejectionCheck {
            counted: checks.iter().map(|c| c.counted).sum(),
            reported: checks.iter().map(|c| c.reported).sum(),
        }),
    }
}

/// The median of `values`: the middle one, or the mean of the two middle ones; 0 when empty.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::system::{Model, System};

    fn figures(goodput: f64, p99_ms: u64, dropped: u64, settled: bool) -> Figures {
        let p = Some(Duration::from_millis(p99_ms));
        Figures {
            offered_rate: 600.0,
            goodput,
            served_p50: p.map(|d| d / 2),
            served_p99: p,
            served_p999: p,
            served: goodput as u64 * 6,
            rejected: 2400,
            failed: 0,
            dropped,
            late: 0,
            lag_p99: Some(Duration::from_millis(2)),
            generator_cpu: Some(0.1),
            warmup: Duration::from_secs(6),
            settled,
            envoy_check: None,
        }
    }

    fn at(system: System, load: f64) -> PointSpec {
        PointSpec {
            system,
            model: Model::Mmc,
            load,
        }
    }

    #[test]
    fn each_figure_is_the_median_of_its_rounds_and_the_spread_shows_them_all() {
        let mut results = Results::new();
        results.push(at(System::Adaptive, 3.0), figures(188.0, 290, 0, true));
        results.push(at(System::TowerShed, 3.0), figures(195.0, 230, 0, true));
        results.push(at(System::Adaptive, 3.0), figures(198.0, 260, 0, true));
        results.push(at(System::TowerShed, 3.0), figures(190.0, 240, 3, true));
        results.push(at(System::Adaptive, 3.0), figures(196.0, 300, 0, false));
        results.push(at(System::Adaptive, 10.0), figures(194.0, 263, 0, true));
        results.push(at(System::Bare, 10.0), figures(0.0, 2000, 0, true));
        let (medians, spreads) = results.medians();
        let points = medians.points();
        assert_eq!(points.len(), 4);
        let (spec, adaptive) = &points[0];
        assert_eq!(*spec, at(System::Adaptive, 3.0));
        assert!((adaptive.goodput - 196.0).abs() < 1e-9, "{adaptive:?}");
        assert_eq!(
            adaptive.served_p99,
            Some(Duration::from_millis(290)),
            "the p99's own median, not the median goodput's round's"
        );
        assert!(!adaptive.settled, "one round unsettled: not settled");
        let (_, shed) = &points[1];
        assert!(
            (shed.goodput - 192.5).abs() < 1e-9,
            "two rounds: the mean of both"
        );
        assert_eq!(shed.served_p99, Some(Duration::from_millis(235)));
        assert_eq!(shed.dropped, 2, "1.5 rounded");
        assert_eq!(
            points[2].1,
            figures(194.0, 263, 0, true),
            "one round: as measured"
        );

        let order: Vec<(f64, &str)> = spreads
            .iter()
            .map(|s| (s.spec.load, s.spec.system.name()))
            .collect();
        assert_eq!(
            order,
            [
                (3.0, "adaptive"),
                (3.0, "tower-shed"),
                (10.0, "bare"),
                (10.0, "adaptive")
            ],
            "sorted as the table is"
        );
        assert_eq!(spreads[0].rounds, 3);
        assert_eq!(spreads[0].goodput, (188.0, 198.0));
        assert_eq!(
            spreads[0].served_p99,
            Some((Duration::from_millis(260), Duration::from_millis(300)))
        );
        assert_eq!((spreads[0].limited, spreads[0].unsettled), (0, 1));
        assert_eq!((spreads[1].limited, spreads[1].unsettled), (1, 0));
        let table = spread_markdown(&spreads);
        assert!(
            table.contains("| mmc | 3x | adaptive | 3 | 188 to 198 | 260.0 to 300.0 | 0, 1 |"),
            "{table}"
        );
        assert!(
            table.contains("| mmc | 3x | tower-shed | 2 | 190 to 195 | 230.0 to 240.0 | 1, 0 |")
        );
    }

    #[test]
    fn envoys_checks_add_up_over_the_rounds() {
        let mut results = Results::new();
        for (counted, reported) in [(100, 100), (50, 52)] {
            let mut f = figures(180.0, 250, 0, true);
            f.envoy_check = Some(RejectionCheck { counted, reported });
            results.push(at(System::Envoy, 3.0), f);
        }
        let (medians, _) = results.medians();
        assert_eq!(
            medians.points()[0].1.envoy_check,
            Some(RejectionCheck {
                counted: 150,
                reported: 152
            })
        );
    }

    #[test]
    fn the_median_of_an_odd_and_an_even_count() {
        assert!((median(vec![3.0, 1.0, 2.0]) - 2.0).abs() < f64::EPSILON);
        assert!((median(vec![4.0, 1.0, 2.0, 3.0]) - 2.5).abs() < f64::EPSILON);
        assert!((median(vec![7.0]) - 7.0).abs() < f64::EPSILON);
        assert!(median(Vec::new()).abs() < f64::EPSILON);
    }
}
