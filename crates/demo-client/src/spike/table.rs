//! The spike's outputs: a Markdown table, CSVs and an SVG plot of its rows.

use std::fmt::Write as _;
use std::time::Duration;

use overload_signal::protocol::Criticality;

use super::SpikePlan;
use super::figures::{LevelFigures, RowFigures};
use crate::plot::{self, Line, Panel};

/// The header of [`csv`].
pub const CSV_HEADER: &str = "row,system,tiers,awareness,level,offered,served,rejected,failed,dropped,late,\
success_rate,p99_ms,unloaded_p99_ms,bottom_sheddable,bottom_sheddable_plus,bottom_critical,bottom_critical_plus";

/// The header of [`timeline_csv`].
pub const TIMELINE_HEADER: &str = "row,second,critical_served,sheddable_served";

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(String::new, |d| format!("{:.1}", d.as_secs_f64() * 1000.0))
}

fn level_line(row: &RowFigures, f: &LevelFigures) -> String {
    let bottom = row.bottom_levels.map_or_else(
        || ",,,".to_owned(),
        |b| format!("{},{},{},{}", b[0], b[1], b[2], b[3]),
    );
    format!(
        "\"{}\",{},{},{},{},{},{},{},{},{},{},{},{},{},{bottom}",
        row.spec.label(),
        row.spec.system,
        row.spec.tiers,
        row.spec.awareness,
        f.level.as_str(),
        f.offered,
        f.served,
        f.rejected,
        f.failed,
        f.dropped,
        f.late,
        f.success_rate()
            .map_or_else(String::new, |r| format!("{r:.4}")),
        ms(f.p99),
        ms(f.unloaded_p99),
    )
}

/// One CSV line per row and level, under [`CSV_HEADER`]: the counts during the spike, the
/// success rate (`0..=1`), the p99s in milliseconds (empty where there is none), and the
/// bottom tier's handler levels (empty where not read).
pub fn csv(rows: &[RowFigures]) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    for row in rows {
        for f in &row.levels {
            out.push_str(&level_line(row, f));
            out.push('\n');
        }
    }
    out
}

/// The served requests per second of each row, under [`TIMELINE_HEADER`].
pub fn timeline_csv(rows: &[RowFigures]) -> String {
    let mut out = format!("{TIMELINE_HEADER}\n");
    for row in rows {
        for (second, [critical, sheddable]) in row.served_per_second.iter().enumerate() {
            let _ = writeln!(
                out,
                "\"{}\",{second},{critical},{sheddable}",
                row.spec.label()
            );
        }
    }
    out
}

fn percent(rate: Option<f64>) -> String {
    rate.map_or_else(|| "-".to_owned(), |r| format!("{:.2} %", r * 100.0))
}

fn millis(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_owned(),
        |d| format!("{:.0} ms", d.as_secs_f64() * 1000.0),
    )
}

/// The Markdown table: per row and level, the success rate and the served p99 during the
/// spike, the unloaded p99 and their ratio, the counts, and how many `/api` requests the
/// bottom tier's handler (the only one's, with one tier) ran at each level over the run.
pub fn markdown(plan: &SpikePlan, rows: &[RowFigures]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "`critical` at {:.0} req/s throughout; `sheddable` at {:.0} req/s for {:?} after {:?} \
         (capacity {:.0} req/s); timeout {:?}. Figures of the requests scheduled during the \
         spike, as the client (the top tier's caller) saw them; unloaded p99: the warm-up's \
         served `critical` requests, its first second left out.\n",
        plan.steady(),
        plan.spike_rate(),
        plan.spike_len(),
        plan.warmup_len(),
        plan.capacity(),
        plan.timeout_len(),
    );
    out.push_str(
        "| row | level | success | p99 (spike) | p99 (unloaded) | ratio | offered | rejected | failed | dropped | bottom tier ran (s / s+ / c / c+) |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    let (mut late, mut sent) = (0, 0);
    for row in rows {
        for f in &row.levels {
            late += f.late;
            sent += f.offered - f.dropped;
        }
        let bottom = row.bottom_levels.map_or_else(
            || "not read".to_owned(),
            |b| format!("{} / {} / {} / {}", b[0], b[1], b[2], b[3]),
        );
        for f in &row.levels {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {bottom} |",
                row.spec.label(),
                f.level.as_str(),
                percent(f.success_rate()),
                millis(f.p99),
                millis(f.unloaded_p99),
                f.p99_ratio()
                    .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x")),
                f.offered,
                f.rejected,
                f.failed,
                f.dropped,
            );
        }
    }
    let _ = writeln!(
        out,
        "\nThe generator sent {late} of the spike's {sent} requests more than {:?} after \
         their scheduled instant (their latency counts from the schedule).",
        crate::bench::open_loop::LATE_AFTER
    );
    out
}

/// The plot: one panel per row, the served requests per second of each level against the
/// second they were scheduled in, the spike shaded, one y scale for every panel.
pub fn svg(plan: &SpikePlan, rows: &[RowFigures]) -> String {
    let y_max = rows
        .iter()
        .flat_map(|r| r.served_per_second.iter().flatten())
        .copied()
        .max()
        .unwrap_or(1) as f64;
    let start = plan.warmup_len().as_secs_f64();
    let end = plan.total().as_secs_f64();
    let panels: Vec<Panel> = rows
        .iter()
        .map(|row| {
            let line = |stream: usize, level: Criticality, color: &str| Line {
                label: format!("{} served", level.as_str()),
                color: color.to_owned(),
                points: row
                    .served_per_second
                    .iter()
                    .enumerate()
                    .map(|(s, counts)| (s as f64 + 0.5, counts[stream] as f64))
                    .collect(),
            };
            Panel {
                title: row.spec.label(),
                x_label: "second of the run (by scheduled instant)".to_owned(),
                y_label: "served req/s".to_owned(),
                lines: vec![
                    line(0, super::STEADY_LEVEL, "#1f77b4"),
                    line(1, super::SPIKE_LEVEL, "#ff7f0e"),
                ],
                shade: Some((start, end, "sheddable spike".to_owned())),
                y_max: Some(y_max),
                ..Panel::default()
            }
        })
        .collect();
    plot::render(&panels)
}
