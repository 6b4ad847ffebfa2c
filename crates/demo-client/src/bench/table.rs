//! The run's results as a Markdown table and a CSV.

use std::fmt::Write as _;
use std::time::Duration;

use super::figures::{CALIBRATION_LOAD, Figures, PointSpec};
use super::system::{Model, System};
use crate::plot::{self, Line, Panel, Scale};

/// Every measured point, and the table and CSV made of them.
#[derive(Clone, Debug, Default)]
pub struct Results {
    points: Vec<(PointSpec, Figures)>,
}

impl Results {
    /// No points yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a measured point.
    pub fn push(&mut self, spec: PointSpec, figures: Figures) {
        self.points.push((spec, figures));
    }

    /// The points, in the order they were measured.
    pub fn points(&self) -> &[(PointSpec, Figures)] {
        &self.points
    }

    /// The points sorted for the table: by model (mmc first), load, then system in the
    /// order of [`System::ALL`].
    fn sorted(&self) -> Vec<&(PointSpec, Figures)> {
        let mut sorted: Vec<_> = self.points.iter().collect();
        sorted.sort_by(|(a, _), (b, _)| table_order(a, b));
        sorted
    }

    /// One Markdown table per model, one row per load and system: offered rate, goodput
    /// (and its share of the model's capacity), the served requests' p50 / p99 / p99.9 in
    /// milliseconds, the rejected and failed shares, the warm-up the point needed (`cap`
    /// when its served rate had not settled by the cap), the generator's lag p99 and CPU
    /// share; `*` after the goodput of a point the generator limited. Empty when there are
    /// no points.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let mut current: Option<Model> = None;
        for (spec, f) in self.sorted() {
            if current != Some(spec.model) {
                if current.is_some() {
                    out.push('\n');
                }
                current = Some(spec.model);
                let _ = writeln!(
                    out,
                    "### {} (capacity {:.0} req/s)\n",
                    spec.model,
                    spec.model.capacity()
                );
                out.push_str("| load | system | offered req/s | goodput req/s | served p50 / p99 / p99.9 ms | rejected | failed | warm-up s | generator lag p99 ms, CPU |\n");
                out.push_str("|---|---|---|---|---|---|---|---|---|\n");
            }
            let _ = writeln!(
                out,
                "| {}x | {} | {:.0} | {:.0} ({:.0} %){} | {} / {} / {} | {:.1} % | {:.1} % | {} | {}, {} |",
                spec.load,
                spec.system,
                f.offered_rate,
                f.goodput,
                100.0 * f.goodput_share(spec.model.capacity()),
                if f.generator_limited() { " *" } else { "" },
                ms(f.served_p50),
                ms(f.served_p99),
                ms(f.served_p999),
                100.0 * f.rejected_share(),
                100.0 * f.failed_share(),
                warmup(f),
                ms(f.lag_p99),
                cpu(f.generator_cpu),
            );
        }
        if self.points.iter().any(|(_, f)| f.generator_limited()) {
            out.push_str(
                "\n`*`: the generator limited the point (arrivals dropped at its in-flight cap, over 2 % started 5 ms late or more, or over half the machine's CPU used by the generator).\n",
            );
        }
        if self.points.iter().any(|(_, f)| !f.settled) {
            out.push_str(
                "\n`cap`: the served rate had not settled (three 2 s windows within 10 %) when the warm-up reached its cap: the point may hold part of the system's start-up.\n",
            );
        }
        out
    }

    /// One line per point (a header first), every figure: latencies in milliseconds,
    /// shares from 0 to 1, an empty field for a latency with nothing served.
    pub fn csv(&self) -> String {
        let mut out = String::from(CSV_HEADER);
        for (spec, f) in self.sorted() {
            out.push_str(&csv_line(spec, f));
        }
        out
    }
}

/// The order of the table's rows: by model (mmc first), load, then system in the order of
/// [`System::ALL`].
pub(crate) fn table_order(a: &PointSpec, b: &PointSpec) -> std::cmp::Ordering {
    let rank_model = |m: Model| Model::ALL.iter().position(|&x| x == m);
    let rank_system = |s: System| System::ALL.iter().position(|&x| x == s);
    rank_model(a.model)
        .cmp(&rank_model(b.model))
        .then(a.load.total_cmp(&b.load))
        .then(rank_system(a.system).cmp(&rank_system(b.system)))
}

/// The first line of [`Results::csv`].
pub const CSV_HEADER: &str = "model,load,system,offered_rate,goodput,goodput_share,served,rejected,failed,dropped,late,served_p50_ms,served_p99_ms,served_p999_ms,rejected_share,failed_share,generator_limited,warmup_s,settled,lag_p99_ms,generator_cpu\n";

/// One point's line of [`Results::csv`], its newline included: a run can write each point
/// as it is measured, and lose none of them if a later point fails.
pub fn csv_line(spec: &PointSpec, f: &Figures) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{},{},{},{:.1},{:.1},{:.4},{},{},{},{},{},{},{},{},{:.4},{:.4},{},{:.3},{},{},{}",
        spec.model,
        spec.load,
        spec.system,
        f.offered_rate,
        f.goodput,
        f.goodput_share(spec.model.capacity()),
        f.served,
        f.rejected,
        f.failed,
        f.dropped,
        f.late,
        ms_field(f.served_p50),
        ms_field(f.served_p99),
        ms_field(f.served_p999),
        f.rejected_share(),
        f.failed_share(),
        f.generator_limited(),
        f.warmup.as_secs_f64(),
        f.settled,
        ms_field(f.lag_p99),
        f.generator_cpu
            .map_or_else(String::new, |c| format!("{c:.4}")),
    );
    out
}

/// The colours of the systems' lines, in the order of [`System::ALL`].
const COLORS: [&str; 7] = [
    "#7f7f7f", "#1f77b4", "#2ca02c", "#d62728", "#ff7f0e", "#9467bd", "#8c564b",
];

impl Results {
    /// The plot of `model`'s points, `None` when none was measured: two panels against the
    /// offered load (log10 of its multiple of the capacity: 0 is 1x, 1 is 10x, 2 is 100x),
    /// goodput in requests a second and the served requests' p99 in milliseconds (log
    /// scale), one line per system measured.
    pub fn svg(&self, model: Model) -> Option<String> {
        let sorted = self.sorted();
        let of_model: Vec<_> = sorted.iter().filter(|(s, _)| s.model == model).collect();
        if of_model.is_empty() {
            return None;
        }
        let line = |system: System, y: &dyn Fn(&Figures) -> Option<f64>| {
            let points: Vec<(f64, f64)> = of_model
                .iter()
                .filter(|(s, _)| s.system == system)
                .filter_map(|(s, f)| Some((s.load.log10(), y(f)?)))
                .collect();
            let color = System::ALL
                .iter()
                .position(|&x| x == system)
                .map_or("black", |i| COLORS[i]);
            (!points.is_empty()).then(|| Line {
                label: system.name().to_owned(),
                color: color.to_owned(),
                points,
            })
        };
        let lines = |y: &dyn Fn(&Figures) -> Option<f64>| -> Vec<Line> {
            System::ALL.iter().filter_map(|&s| line(s, y)).collect()
        };
        let x_label =
            "offered load: log10 of its multiple of the capacity (0 = 1x, 1 = 10x, 2 = 100x)";
        let panels = [
            Panel {
                title: format!("{model}: goodput (capacity {:.0} req/s)", model.capacity()),
                x_label: x_label.to_owned(),
                y_label: "served req/s".to_owned(),
                lines: lines(&|f| Some(f.goodput)),
                ..Panel::default()
            },
            Panel {
                title: format!("{model}: served p99"),
                x_label: x_label.to_owned(),
                y_label: "ms".to_owned(),
                lines: lines(&|f| f.served_p99.map(|d| d.as_secs_f64() * 1e3)),
                scale: Scale::Log,
                ..Panel::default()
            },
        ];
        Some(plot::render(&panels))
    }
}

impl Results {
    /// The issue's criteria for `model`, one line per load of 3x or more where `adaptive`
    /// was measured: its goodput at least 97 % of the capacity; its served p99 at most 1.5x
    /// the unloaded served p99 (the calibration point's, bare at 0.5x; said when there is
    /// none); and the other systems of the same load with more goodput at an equal or lower
    /// served p99 and a failed share no larger than ours, the goodput more by over
    /// [`WIN_MARGIN`] ("a peer wins"; those within it are listed apart; served latency is
    /// cut off at the timeout, so a system that lets requests time out must not win by
    /// it), or `none`. Points the generator limited are not judged: a peer's is never a
    /// winner, and our line says so when ours is.
    pub fn criteria(&self, model: Model) -> Vec<String> {
        let of_model = || self.points.iter().filter(move |(s, _)| s.model == model);
        let unloaded = of_model()
            .find(|(s, _)| s.system == System::Bare && s.load.total_cmp(&CALIBRATION_LOAD).is_eq())
            .and_then(|(_, f)| f.served_p99);
        let yes = |b: bool| if b { "yes" } else { "no" };
        let mut lines = Vec::new();
        for (spec, ours) in self.sorted() {
            if spec.model != model || spec.system != System::Adaptive || spec.load < 3.0 {
                continue;
            }
            let share = ours.goodput_share(model.capacity());
            let latency = match (ours.served_p99, unloaded) {
                (Some(p99), Some(base)) => format!(
                    "served p99 {} ms, at most 1.5x the unloaded {} ms: {}",
                    ms(Some(p99)),
                    ms(Some(base)),
                    yes(p99.as_secs_f64() <= 1.5 * base.as_secs_f64())
                ),
                (None, _) => "nothing served".to_owned(),
                (Some(p99), None) => format!(
                    "served p99 {} ms (no calibration point to judge it against)",
                    ms(Some(p99))
                ),
            };
            let better: Vec<&(PointSpec, Figures)> = of_model()
                .filter(|(s, _)| {
                    // NOTE: the same load is the same value from the same list: exact.
                    s.load.total_cmp(&spec.load).is_eq() && s.system != System::Adaptive
                })
                .filter(|(_, f)| {
                    !f.generator_limited()
                        && f.failed_share() <= ours.failed_share()
                        && f.goodput > ours.goodput
                        && match (f.served_p99, ours.served_p99) {
                            (Some(theirs), Some(mine)) => theirs <= mine,
                            (Some(_), None) => true,
                            (None, _) => false,
                        }
                })
                .collect();
            let named = |points: Vec<&&(PointSpec, Figures)>| -> String {
                if points.is_empty() {
                    return "none".to_owned();
                }
                let names: Vec<String> = points
                    .iter()
                    .map(|(s, f)| {
                        format!(
                            "{} ({:.0} req/s at {} ms, {:.1} % failed)",
                            s.system,
                            f.goodput,
                            ms(f.served_p99),
                            100.0 * f.failed_share()
                        )
                    })
                    .collect();
                names.join(", ")
            };
            let beyond = |f: &Figures| f.goodput > ours.goodput * (1.0 + WIN_MARGIN);
            let winners = named(better.iter().filter(|(_, f)| beyond(f)).collect());
            let ties: Vec<_> = better.iter().filter(|(_, f)| !beyond(f)).collect();
            let ties = if ties.is_empty() {
                String::new()
            } else {
                format!(
                    "; more goodput, but within the {:.0} % noise margin: {}",
                    100.0 * WIN_MARGIN,
                    named(ties)
                )
            };
            let caveat = if ours.generator_limited() {
                " (* the generator limited this point: not a verdict)"
            } else if !ours.settled {
                " (the warm-up reached its cap unsettled: not a verdict)"
            } else {
                ""
            };
            lines.push(format!(
                "{model} {}x{caveat}: adaptive goodput {:.0} % of capacity (at least 97 %): {}; {latency}; a peer with more goodput (by over {:.0} %) at an equal or lower served p99 and no larger failed share: {winners}{ties}",
                spec.load,
                100.0 * share,
                yes(share >= 0.97),
                100.0 * WIN_MARGIN,
            ));
        }
        lines
    }
}

/// How much more goodput a peer needs than ours to "win" a criterion: 5 %. One point is one
/// sample: a 6 s point at mmc's capacity serves about 1 200 answers of exponential service
/// times, a count with a standard error near 3 %, so two points differ by about 4 % by
/// chance alone; smaller differences are printed as within the margin, not as wins.
/// With several rounds (`--rounds`), the criteria judge each system's medians
/// ([`Results::medians`]), whose noise is smaller; the margin stays.
pub const WIN_MARGIN: f64 = 0.05;

/// A progress line for one measured point.
pub fn progress_line(spec: &PointSpec, f: &Figures) -> String {
    format!(
        "{} {}x {}: warm-up {}s, offered {:.0}/s, served {:.0}/s, served p99 {} ms, rejected {:.1} %, failed {:.1} %, generator lag p99 {} ms, CPU {}{}{}",
        spec.model,
        spec.load,
        spec.system,
        warmup(f),
        f.offered_rate,
        f.goodput,
        ms(f.served_p99),
        100.0 * f.rejected_share(),
        100.0 * f.failed_share(),
        ms(f.lag_p99),
        cpu(f.generator_cpu),
        if f.generator_limited() {
            " (generator-limited)"
        } else {
            ""
        },
        f.envoy_check.map_or_else(String::new, |check| format!(
            "; Envoy blocked {}, counted {}{}",
            check.reported,
            check.counted,
            if check.agrees() {
                ""
            } else {
                " (DISAGREE: the rejected share is not Envoy's)"
            }
        )),
    )
}

/// The warm-up in seconds, `cap` after it when the served rate had not settled.
fn warmup(f: &Figures) -> String {
    let seconds = f.warmup.as_secs_f64();
    if f.settled {
        format!("{seconds:.0}")
    } else {
        format!("{seconds:.0} cap")
    }
}

fn cpu(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_owned(), |c| format!("{:.0} %", 100.0 * c))
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_owned(),
        |d| format!("{:.1}", d.as_secs_f64() * 1e3),
    )
}

fn ms_field(d: Option<Duration>) -> String {
    d.map_or_else(String::new, |d| format!("{:.3}", d.as_secs_f64() * 1e3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(goodput: f64, p99_ms: Option<u64>, rejected: u64, dropped: u64) -> Figures {
        let p = p99_ms.map(Duration::from_millis);
        Figures {
            offered_rate: 600.0,
            goodput,
            served_p50: p.map(|d| d / 2),
            served_p99: p,
            served_p999: p,
            served: 200,
            rejected,
            failed: 0,
            dropped,
            late: 0,
            lag_p99: Some(Duration::from_millis(2)),
            generator_cpu: Some(0.1),
            warmup: Duration::from_secs(6),
            settled: true,
            envoy_check: None,
        }
    }

    #[test]
    fn the_table_groups_by_model_and_sorts_by_load_then_system() {
        let mut results = Results::new();
        let spec = |system, model, load| PointSpec {
            system,
            model,
            load,
        };
        results.push(
            spec(System::Adaptive, Model::Mmc, 3.0),
            figures(200.0, Some(80), 400, 0),
        );
        results.push(
            spec(System::Bare, Model::Mmc, 3.0),
            figures(50.0, None, 0, 7),
        );
        results.push(
            spec(System::Bare, Model::Article, 1.0),
            figures(300.0, Some(100), 0, 0),
        );
        results.push(
            spec(System::Bare, Model::Mmc, 1.0),
            figures(199.0, Some(120), 0, 0),
        );
        assert_eq!(
            results.markdown(),
            "\
### mmc (capacity 200 req/s)

| load | system | offered req/s | goodput req/s | served p50 / p99 / p99.9 ms | rejected | failed | warm-up s | generator lag p99 ms, CPU |
|---|---|---|---|---|---|---|---|---|
| 1x | bare | 600 | 199 (100 %) | 60.0 / 120.0 / 120.0 | 0.0 % | 0.0 % | 6 | 2.0, 10 % |
| 3x | bare | 600 | 50 (25 %) * | - / - / - | 0.0 % | 0.0 % | 6 | 2.0, 10 % |
| 3x | adaptive | 600 | 200 (100 %) | 40.0 / 80.0 / 80.0 | 66.7 % | 0.0 % | 6 | 2.0, 10 % |

### article (capacity 300 req/s)

| load | system | offered req/s | goodput req/s | served p50 / p99 / p99.9 ms | rejected | failed | warm-up s | generator lag p99 ms, CPU |
|---|---|---|---|---|---|---|---|---|
| 1x | bare | 600 | 300 (100 %) | 50.0 / 100.0 / 100.0 | 0.0 % | 0.0 % | 6 | 2.0, 10 % |

`*`: the generator limited the point (arrivals dropped at its in-flight cap, over 2 % started 5 ms late or more, or over half the machine's CPU used by the generator).
"
        );
        let csv = results.csv();
        let lines: Vec<_> = csv.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(lines[0].starts_with("model,load,system,offered_rate,goodput"));
        assert_eq!(
            lines[2],
            "mmc,3,bare,600.0,50.0,0.2500,200,0,0,7,0,,,,0.0000,0.0000,true,6.000,true,2.000,0.1000"
        );
        assert_eq!(results.points().len(), 4);
    }

    #[test]
    fn the_plot_has_a_line_per_system_with_a_point_per_load() {
        let mut results = Results::new();
        for (load, goodput) in [(1.0, 200.0), (10.0, 190.0)] {
            for system in [System::Bare, System::Adaptive] {
                let spec = PointSpec {
                    system,
                    model: Model::Mmc,
                    load,
                };
                results.push(spec, figures(goodput, Some(80), 0, 0));
            }
        }
        results.push(
            PointSpec {
                system: System::Bare,
                model: Model::Article,
                load: 1.0,
            },
            figures(300.0, Some(100), 0, 0),
        );
        let svg = results.svg(Model::Mmc).expect("mmc was measured");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(
            svg.contains("goodput") && svg.contains("served p99"),
            "{svg}"
        );
        assert!(
            svg.contains(">bare<") && svg.contains(">adaptive<"),
            "{svg}"
        );
        assert!(!svg.contains(">envoy<"), "only the systems measured");
        assert_eq!(
            svg.matches(r#"stroke-width="1.6""#).count(),
            4,
            "a line per system in each of the two panels"
        );
        assert!(results.svg(Model::Article).is_some());
        assert!(Results::new().svg(Model::Mmc).is_none());
    }

    #[test]
    fn the_criteria_judge_adaptive_at_3x_and_over_and_name_a_peer_that_wins() {
        let mut results = Results::new();
        let mut at = |system, load, goodput, p99| {
            let spec = PointSpec {
                system,
                model: Model::Mmc,
                load,
            };
            results.push(spec, figures(goodput, Some(p99), 0, 0));
        };
        at(System::Bare, 0.5, 100.0, 200);
        at(System::Adaptive, 1.0, 200.0, 250);
        at(System::Adaptive, 3.0, 196.0, 280);
        at(System::TowerShed, 3.0, 199.0, 250);
        at(System::TowerResilience, 3.0, 206.0, 270);
        at(System::Bare, 3.0, 50.0, 2000);
        at(System::Adaptive, 10.0, 190.0, 320);
        at(System::Envoy, 10.0, 185.0, 200);
        assert_eq!(
            results.criteria(Model::Mmc),
            vec![
                "mmc 3x: adaptive goodput 98 % of capacity (at least 97 %): yes; served p99 280.0 ms, at most 1.5x the unloaded 200.0 ms: yes; a peer with more goodput (by over 5 %) at an equal or lower served p99 and no larger failed share: tower-resilience (206 req/s at 270.0 ms, 0.0 % failed); more goodput, but within the 5 % noise margin: tower-shed (199 req/s at 250.0 ms, 0.0 % failed)".to_owned(),
                "mmc 10x: adaptive goodput 95 % of capacity (at least 97 %): no; served p99 320.0 ms, at most 1.5x the unloaded 200.0 ms: no; a peer with more goodput (by over 5 %) at an equal or lower served p99 and no larger failed share: none".to_owned(),
            ]
        );
        assert!(results.criteria(Model::Article).is_empty());
    }

    /// Review S4: served latency is cut off at the timeout, so a peer that lets 40 % of its
    /// requests time out can show more goodput at a lower served p99; it must not "win",
    /// nor may a point the generator limited.
    #[test]
    fn a_peer_with_more_failures_or_a_generator_limited_point_does_not_win() {
        let mut results = Results::new();
        let spec = |system| PointSpec {
            system,
            model: Model::Mmc,
            load: 3.0,
        };
        results.push(spec(System::Adaptive), figures(190.0, Some(280), 400, 0));
        let mut timing_out = figures(199.0, Some(250), 0, 0);
        timing_out.failed = 200;
        results.push(spec(System::TowerShed), timing_out);
        results.push(spec(System::Envoy), figures(199.0, Some(250), 0, 3));
        let lines = results.criteria(Model::Mmc);
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].ends_with("no larger failed share: none"),
            "{}",
            lines[0]
        );
        // Ours limited by the generator: said on its line.
        let mut limited = Results::new();
        limited.push(spec(System::Adaptive), figures(190.0, Some(280), 400, 5));
        assert!(limited.criteria(Model::Mmc)[0].contains("not a verdict"));
    }
}
