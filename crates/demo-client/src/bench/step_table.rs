//! The step runs' results: a Markdown table of the convergence times, a CSV of the served
//! rate against time, and a plot of it.

use std::fmt::Write as _;
use std::time::Duration;

use super::step::{BAND, BUCKET, PhaseFigures, StepPlan, StepRun};
use super::system::{Model, System};
use crate::plot::{self, Line, Panel};

/// The colours of the systems' lines, in the order of [`System::ALL`] (as the curve's plot).
const COLORS: [&str; 7] = [
    "#7f7f7f", "#1f77b4", "#2ca02c", "#d62728", "#ff7f0e", "#9467bd", "#8c564b",
];

/// One Markdown table per model: a row per system, for each phase (the start at 0.8x, the
/// step up to 3x, the step down to 0.8x) its steady served rate, its noise, its time to
/// converge within 5 % (`never` when it did not) and, where the noise is over 5 %, within
/// its noise in brackets; `*` after a system the generator limited.
pub fn markdown(runs: &[StepRun], plan: &StepPlan) -> String {
    let mut out = String::new();
    for model in Model::ALL {
        let of_model: Vec<&StepRun> = sorted(runs)
            .into_iter()
            .filter(|r| r.model == model)
            .collect();
        if of_model.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "### {model} (capacity {:.0} req/s): 0.8x, 3x, 0.8x for {} s each\n",
            model.capacity(),
            plan.phase().as_secs_f64()
        );
        out.push_str("| system | start (0.8x): steady of offered req/s, noise, converged | step up (3x) | step down (0.8x) |\n");
        out.push_str("|---|---|---|---|\n");
        for run in of_model {
            let _ = writeln!(
                out,
                "| {}{} | {} | {} | {} |",
                run.system,
                if run.generator_limited() { " *" } else { "" },
                cell(&run.phases[0], model),
                cell(&run.phases[1], model),
                cell(&run.phases[2], model),
            );
        }
    }
    if !out.is_empty() {
        let _ = write!(
            out,
            "\nEach cell: the steady served rate (the mean of the phase's last {} s) and the offered rate, the noise (the largest \
             deviation of a {} s window inside that part), the time from the phase's start until every \
             {} s window stays within {:.0} % of the steady rate (resolution: the {} ms bucket, and a \
             window hides a short deviation), and in brackets the time to stay within the noise when it is \
             over {:.0} %.\n",
            plan.steady().as_secs_f64(),
            plan.window().as_secs_f64(),
            plan.window().as_secs_f64(),
            100.0 * BAND,
            BUCKET.as_millis(),
            100.0 * BAND,
        );
        if runs.iter().any(StepRun::generator_limited) {
            out.push_str("`*`: the generator limited the run (arrivals dropped at its in-flight cap, or sent late).\n");
        }
    }
    out
}

fn cell(f: &PhaseFigures, model: Model) -> String {
    let mut s = format!(
        "{:.0} of {:.0} req/s, {:.0} %, {}",
        f.steady,
        f.load * model.capacity(),
        100.0 * f.noise,
        time(f.converged)
    );
    if f.noise > BAND {
        let _ = write!(
            s,
            " ({} within {:.0} %)",
            time(f.converged_within_noise),
            100.0 * f.noise
        );
    }
    s
}

fn time(t: Option<Duration>) -> String {
    t.map_or_else(
        || "never".to_owned(),
        |t| format!("{:.1} s", t.as_secs_f64()),
    )
}

fn sorted(runs: &[StepRun]) -> Vec<&StepRun> {
    let rank = |s: System| System::ALL.iter().position(|&x| x == s);
    let mut sorted: Vec<&StepRun> = runs.iter().collect();
    sorted.sort_by_key(|r| (r.model != Model::Mmc, rank(r.system)));
    sorted
}

/// The summary, one line per system and phase (a header first): the steady rate, the
/// noise (a share), the times to converge in milliseconds (empty: never).
pub fn summary_csv(runs: &[StepRun]) -> String {
    let mut out = String::from(
        "model,system,phase,load,steady_rate,noise,converged_ms,converged_within_noise_ms,rejected,failed,dropped,late\n",
    );
    for run in sorted(runs) {
        for (name, f) in ["start", "up", "down"].iter().zip(&run.phases) {
            let ms =
                |t: Option<Duration>| t.map_or_else(String::new, |t| t.as_millis().to_string());
            let t = &run.timeline;
            let _ = writeln!(
                out,
                "{},{},{name},{},{:.1},{:.4},{},{},{},{},{},{}",
                run.model,
                run.system,
                f.load,
                f.steady,
                f.noise,
                ms(f.converged),
                ms(f.converged_within_noise),
                t.rejected(),
                t.failed(),
                t.dropped(),
                t.late(),
            );
        }
    }
    out
}

/// The served rate against time, one line per system and bucket of the three phases (a
/// header first): the bucket's start in milliseconds and its served rate, requests a second.
pub fn timeline_csv(runs: &[StepRun], plan: &StepPlan) -> String {
    let mut out = String::from("model,system,t_ms,served_rate\n");
    let end = 3 * (plan.phase().as_millis() / BUCKET.as_millis()) as usize;
    for run in sorted(runs) {
        for k in 0..end {
            let count = run.timeline.served().get(k).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "{},{},{},{:.0}",
                run.model,
                run.system,
                k as u128 * BUCKET.as_millis(),
                count as f64 / BUCKET.as_secs_f64()
            );
        }
    }
    out
}

/// The plot of `model`'s runs, `None` when none was: the served rate against time (each
/// point the mean of the window that starts there, as convergence reads it), one line per
/// system, the 3x phase shaded.
pub fn svg(runs: &[StepRun], plan: &StepPlan, model: Model) -> Option<String> {
    let end = plan.phase() * 3;
    let lines: Vec<Line> = sorted(runs)
        .into_iter()
        .filter(|r| r.model == model)
        .map(|run| {
            let color = System::ALL
                .iter()
                .position(|&x| x == run.system)
                .map_or("black", |i| COLORS[i]);
            Line {
                label: run.system.name().to_owned(),
                color: color.to_owned(),
                points: run
                    .timeline
                    .windowed(plan.window(), end)
                    .into_iter()
                    .enumerate()
                    .map(|(k, rate)| (k as f64 * BUCKET.as_secs_f64(), rate))
                    .collect(),
            }
        })
        .collect();
    if lines.is_empty() {
        return None;
    }
    let phase = plan.phase().as_secs_f64();
    let panel = Panel {
        title: format!(
            "{model}: served rate, 0.8x / 3x / 0.8x of {:.0} req/s ({} s moving window, starting at each point)",
            model.capacity(),
            plan.window().as_secs_f64()
        ),
        x_label: "seconds from the start of the load".to_owned(),
        y_label: "served req/s".to_owned(),
        lines,
        shade: Some((phase, 2.0 * phase, "3x".to_owned())),
        ..Panel::default()
    };
    Some(plot::render(&[panel]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::step::Timeline;

    fn run(system: System, model: Model, counts: Vec<u64>, plan: &StepPlan) -> StepRun {
        StepRun::of(system, model, Timeline::from_counts(counts), plan)
    }

    #[test]
    fn the_table_states_each_phase_and_never_and_the_files_hold_every_bucket() {
        let plan = StepPlan::new(
            Duration::from_secs(2),
            Duration::from_millis(500),
            Duration::from_secs(1),
        )
        .unwrap();
        // adaptive: 16, then 20 after 300 ms of 10, then 16 after 600 ms of 24.
        let mut ours = vec![16; 20];
        ours.extend((0..20).map(|i| if i < 3 { 10 } else { 20 }));
        ours.extend((0..20).map(|i| if i < 6 { 24 } else { 16 }));
        // bare: fine at 0.8x, then a sawtooth at 3x that never settles, back at the end.
        let mut bare = vec![16; 20];
        bare.extend((0..20).map(|i| if (i / 5) % 2 == 0 { 30 } else { 5 }));
        bare.extend(vec![16; 20]);
        let runs = vec![
            run(System::Adaptive, Model::Mmc, ours, &plan),
            run(System::Bare, Model::Mmc, bare, &plan),
        ];
        let table = markdown(&runs, &plan);
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(
            rows[1..],
            [
                "| bare | 160 of 160 req/s, 0 %, 0.0 s | 175 of 600 req/s, 71 %, never (0.0 s within 71 %) | 160 of 160 req/s, 0 %, 0.0 s |",
                "| adaptive | 160 of 160 req/s, 0 %, 0.0 s | 200 of 600 req/s, 0 %, 0.3 s | 160 of 160 req/s, 0 %, 0.6 s |",
            ],
            "{table}"
        );
        assert!(table.contains("### mmc (capacity 200 req/s): 0.8x, 3x, 0.8x for 2 s each"));
        let summary = summary_csv(&runs);
        assert_eq!(summary.lines().count(), 1 + 6);
        assert!(
            summary.contains("\nmmc,bare,up,3,175.0,0.7143,,0,"),
            "{summary}"
        );
        assert!(
            summary.contains("\nmmc,adaptive,down,0.8,160.0,0.0000,600,600,"),
            "{summary}"
        );
        let timeline = timeline_csv(&runs, &plan);
        assert_eq!(timeline.lines().count(), 1 + 2 * 60);
        assert!(timeline.contains("\nmmc,adaptive,3000,200\n"), "{timeline}");
        let svg = svg(&runs, &plan, Model::Mmc).expect("mmc was run");
        assert!(svg.contains(">bare<") && svg.contains(">adaptive<") && svg.contains(">3x<"));
        assert!(super::svg(&runs, &plan, Model::Article).is_none());
    }
}
