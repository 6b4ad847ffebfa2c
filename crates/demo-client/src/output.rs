//! What a scenario writes: the CSV of every second and the SVG plot of every run.

use std::io::{self, Write};
use std::time::Duration;

use crate::plot::{self, Line, Panel, Scale};
use crate::record::Second;
use crate::report::{Phases, RunReport, percentile};

/// One finished run: its series, its phases and its figures.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// Where the pause fell.
    pub phases: Phases,
    /// One row per second, `phases.end()` rows.
    pub seconds: Vec<Second>,
    /// How long each request still waiting at the end of the run had waited.
    pub unfinished: Vec<Duration>,
    /// The figures computed from the rows.
    pub report: RunReport,
}

impl RunRecord {
    /// Computes the report of `seconds` (padded or cut to `phases.end()` rows) and
    /// `unfinished` (see [`RunReport::compute`]).
    pub fn new(
        label: impl Into<String>,
        mut seconds: Vec<Second>,
        unfinished: Vec<Duration>,
        phases: Phases,
    ) -> Self {
        seconds.resize_with(phases.end(), Second::default);
        let report = RunReport::compute(label, &seconds, &unfinished, phases);
        Self {
            phases,
            seconds,
            unfinished,
            report,
        }
    }
}

/// The CSV header written by [`write_csv`].
pub const CSV_HEADER: &str = "run,second,phase,requests,ok,failed,errors,timeouts,attempts,\
retries,rejected,budget_refusals,stop_signals,refused,throttled,p50_ms,p99_ms,\
p99_outcome_ms,server_concurrency";

/// Writes every second of every run as CSV, one row per (run, second), seconds counted from
/// the start of each run. `p50_ms` and `p99_ms` are of the requests that succeeded in the
/// second, `p99_outcome_ms` of every request that ended in it (successes and failures).
/// Empty cells mean "no value" (no request to take a percentile of, concurrency not
/// sampled).
pub fn write_csv<W: Write>(mut out: W, runs: &[RunRecord]) -> io::Result<()> {
    writeln!(out, "{CSV_HEADER}")?;
    for run in runs {
        let label = csv_field(&run.report.label);
        for (s, row) in run.seconds.iter().enumerate() {
            let mut latencies = row.latencies.clone();
            latencies.sort_unstable();
            let mut outcomes = latencies.clone();
            outcomes.extend_from_slice(&row.failure_latencies);
            outcomes.sort_unstable();
            let ms = |values: &[Duration], q| {
                percentile(values, q)
                    .map(|d| format!("{:.1}", d.as_secs_f64() * 1000.0))
                    .unwrap_or_default()
            };
            writeln!(
                out,
                "{label},{s},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                run.phases.phase_of(s),
                row.requests,
                row.ok,
                row.failed,
                row.errors,
                row.timeouts,
                row.attempts,
                row.retries,
                row.rejected,
                row.budget_refusals,
                row.stop_signals,
                row.refused,
                row.throttled,
                ms(&latencies, 0.5),
                ms(&latencies, 0.99),
                ms(&outcomes, 0.99),
                row.server_concurrency
                    .map(|c| c.to_string())
                    .unwrap_or_default(),
            )?;
        }
    }
    out.flush()
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

/// The plot of a scenario: one panel per run, successful requests (green), failed requests
/// (orange) and timed-out attempts (red) per second over time, and, in a run whose
/// client-side throttle refused any, the requests it refused (purple, part of the failed
/// ones); the pause shaded in grey. Every panel has the same y scale, so the runs compare at
/// a glance.
pub fn outage_svg(runs: &[RunRecord]) -> String {
    let top = runs
        .iter()
        .flat_map(|run| &run.seconds)
        .map(|row| row.ok.max(row.failed).max(row.timeouts))
        .max()
        .unwrap_or(0);
    let panels: Vec<Panel> = runs
        .iter()
        .map(|run| {
            let series = |f: fn(&Second) -> u64| -> Vec<(f64, f64)> {
                run.seconds
                    .iter()
                    .enumerate()
                    .map(|(s, row)| (s as f64, f(row) as f64))
                    .collect()
            };
            let r = &run.report;
            let recovery = r.recovery.map_or_else(
                || "did not recover".to_owned(),
                |s| format!("recovered {s} s after resume"),
            );
            let amplification = r
                .amplification
                .map_or_else(String::new, |a| format!(", amplification {a:.2}"));
            Panel {
                title: format!("{}: {recovery}{amplification}", r.label),
                x_label: "seconds since start".to_owned(),
                y_label: "requests per second".to_owned(),
                lines: vec![
                    Line {
                        label: "OK".to_owned(),
                        color: "#2ca02c".to_owned(),
                        points: series(|r| r.ok),
                    },
                    Line {
                        label: "failed".to_owned(),
                        color: "#ff7f0e".to_owned(),
                        points: series(|r| r.failed),
                    },
                    Line {
                        label: "timed out".to_owned(),
                        color: "#d62728".to_owned(),
                        points: series(|r| r.timeouts),
                    },
                ]
                .into_iter()
                .chain((r.throttled > 0).then(|| Line {
                    label: "refused locally".to_owned(),
                    color: "#9467bd".to_owned(),
                    points: series(|r| r.throttled),
                }))
                .collect(),
                shade: Some((
                    run.phases.pause_at as f64,
                    run.phases.resume_at() as f64,
                    "paused".to_owned(),
                )),
                scale: Scale::Linear,
                y_max: Some(top as f64),
            }
        })
        .collect();
    plot::render(&panels)
}

/// The article's figure: the delay before each retry for its two parameter sets (blue:
/// 100 ms, x2.7, jitter 0.1, at most 10 min; green: 1 s, x1.5, jitter 0.1, at most 5 min),
/// `retries` retries each, jitter drawn from generators seeded by `seed`; one panel in
/// linear scale and one in log scale.
pub fn delays_svg(retries: u32, seed: u64) -> String {
    use backoff_layer::backoff::{Backoff, Exponential, Seeds};

    let curve = |label: &str, color: &str, backoff: Exponential| {
        let points = backoff
            .delays(Seeds::from_seed(seed).rng())
            .take(retries as usize)
            .enumerate()
            .map(|(i, d)| ((i + 1) as f64, d.as_secs_f64()))
            .collect();
        Line {
            label: label.to_owned(),
            color: color.to_owned(),
            points,
        }
    };
    let lines = vec![
        curve(
            "100 ms, x2.7, jitter 0.1, max 10 min",
            "#1f77b4",
            Exponential::article_blue(),
        ),
        curve(
            "1 s, x1.5, jitter 0.1, max 5 min",
            "#2ca02c",
            Exponential::article_green(),
        ),
    ];
    let panel = |scale, name: &str| Panel {
        title: format!("Delay before each retry ({name} scale)"),
        x_label: "retry number".to_owned(),
        y_label: "delay (seconds)".to_owned(),
        lines: lines.clone(),
        shade: None,
        scale,
        y_max: None,
    };
    plot::render(&[panel(Scale::Linear, "linear"), panel(Scale::Log, "log")])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const PHASES: Phases = Phases {
        pause_at: 3,
        pause_for: 2,
        observe_for: 5,
    };

    fn run(label: &str) -> RunRecord {
        let seconds = (0..7)
            .map(|s| Second {
                ok: 10,
                timeouts: u64::from(s == 4),
                failed: u64::from(s == 4),
                failure_latencies: if s == 4 {
                    vec![Duration::from_secs(4)]
                } else {
                    Vec::new()
                },
                attempts: 11,
                latencies: vec![Duration::from_millis(100), Duration::from_millis(300)],
                server_concurrency: (s == 6).then_some(12),
                ..Second::default()
            })
            .collect();
        RunRecord::new(label, seconds, Vec::new(), PHASES)
    }

    #[test]
    fn csv_has_one_row_per_second_and_run() {
        let mut out = Vec::new();
        write_csv(&mut out, &[run("a"), run("b, \"quoted\"")]).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + 2 * PHASES.end());
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(
            lines[1],
            "a,0,steady,0,10,0,0,0,11,0,0,0,0,0,0,100.0,300.0,300.0,"
        );
        assert_eq!(
            lines[5],
            "a,4,paused,0,10,1,0,1,11,0,0,0,0,0,0,100.0,300.0,4000.0,"
        );
        assert!(lines[7].ends_with(",12"), "{}", lines[7]);
        assert!(lines[11].starts_with("\"b, \"\"quoted\"\"\",0,steady"));
        let columns = CSV_HEADER.split(',').count();
        for line in &lines[1..PHASES.end() + 1] {
            assert_eq!(line.split(',').count(), columns, "{line}");
        }
    }

    #[test]
    fn record_pads_to_the_run_length() {
        let r = RunRecord::new("short", vec![Second::default()], Vec::new(), PHASES);
        assert_eq!(r.seconds.len(), PHASES.end());
    }

    #[test]
    fn delays_figure_has_both_curves_in_both_scales() {
        let svg = delays_svg(12, 1);
        assert_eq!(svg.matches("<path").count(), 4);
        assert!(svg.contains("x2.7") && svg.contains("x1.5"));
        assert!(svg.contains("log scale") && svg.contains("linear scale"));
        // Seeded: the same figure twice.
        assert_eq!(svg, delays_svg(12, 1));
    }

    #[test]
    fn svg_has_a_panel_per_run() {
        let svg = outage_svg(&[run("fixed"), run("full")]);
        assert_eq!(svg.matches("paused").count(), 2);
        assert!(svg.contains("fixed: "));
        assert!(svg.contains("full: "));
        assert_eq!(svg.matches("<path").count(), 6);
    }

    #[test]
    fn a_run_that_refused_requests_locally_shows_them() {
        let mut throttled = run("full");
        throttled.seconds[4].throttled = 7;
        throttled.seconds[4].failed = 8;
        let throttled = RunRecord::new("full", throttled.seconds, Vec::new(), PHASES);
        assert_eq!(throttled.report.throttled, 7);
        let svg = outage_svg(&[run("fixed"), throttled]);
        assert_eq!(svg.matches("<path").count(), 7);
        assert_eq!(svg.matches("refused locally").count(), 1);
    }

    #[test]
    fn every_panel_has_the_same_y_scale() {
        let mut busy = run("busy");
        busy.seconds[2].ok = 1000;
        let svg = outage_svg(&[run("quiet"), busy]);
        // The quiet run peaks at 10 but is drawn on the busy run's 0..1000 axis: both
        // panels label the same top tick.
        assert_eq!(svg.matches(">1000<").count(), 2, "{svg}");
    }
}
