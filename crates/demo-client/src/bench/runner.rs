//! One point of the curve (a system, a model, a load: started fresh, warmed up, recorded,
//! stopped) and its figures; the order of the points in a run.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tower::BoxError;

pub use super::figures::{CALIBRATION_LOAD, Figures, PointSpec, RejectionCheck};
use super::open_loop::{Arrivals, Schedule, WarmUp, run_with_warmup};
use super::outcome::{Attempt, Outcome};
use super::send::HttpSender;
use super::settle::Settle;
use super::system::{ENVOY_REJECTION_BODY, Model, Programs, Running, System};
use super::table::Results;

/// How every point of a run is measured.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The executables.
    pub programs: Programs,
    /// Where Envoy's configuration and log go.
    pub dir: PathBuf,
    /// The longest warm-up: each point sends its load until the served rate settles
    /// ([`Settle`]: the same rule for every system), at most this long, before recording.
    pub warmup: Duration,
    /// The recorded part of each point.
    pub duration: Duration,
    /// Each request's timeout; a request over it failed.
    pub timeout: Duration,
    /// The generator's in-flight cap.
    pub max_in_flight: usize,
    /// How arrivals are spaced.
    pub arrivals: Arrivals,
}

/// Measures one point: starts the system fresh (a second time on new ports if the first
/// start fails), sends the load until the served rate settles (at most `config.warmup`) and
/// for the recorded part without a pause, checks the system is still running, stops it,
/// and returns the recorded part's figures. For Envoy, the figures hold its own count of
/// the requests it blocked beside the harness's ([`Figures::envoy_check`]).
///
/// # Errors
///
/// When the system cannot start twice in a row, when a process of the system exited during
/// the point (a harness failure, not a result: the message names the system, the point
/// and the exit status), when Envoy's admin interface does not answer, or when the rate is
/// not above zero.
pub async fn run_point(config: &BenchConfig, spec: PointSpec) -> Result<Figures, BoxError> {
    let schedule = Schedule::new(spec.rate(), config.arrivals)?;
    let mut running = start_twice(config, spec).await?;
    let mut sender = HttpSender::new(running.url().clone(), config.timeout);
    if spec.system == System::Envoy {
        sender = sender.rejection_body(ENVOY_REJECTION_BODY);
    }
    // NOTE: every rejection of the point, the warm-up's included, to compare with Envoy's
    // own count, which runs from its start.
    let rejections = Arc::new(AtomicU64::new(0));
    let point = run_with_warmup(
        &schedule,
        WarmUp::Settled(Settle::new(config.warmup)),
        config.duration,
        config.max_in_flight,
        |scheduled| {
            let request = sender.send_scheduled(scheduled);
            let rejections = Arc::clone(&rejections);
            async move {
                let attempt = request.await;
                if attempt == Attempt::Ended(Outcome::Rejected) {
                    rejections.fetch_add(1, Ordering::Relaxed);
                }
                attempt
            }
        },
    )
    .await;
    if let Some(exit) = running.exited() {
        return Err(format!(
            "{} on {} at {}x: {exit} during the point",
            spec.system, spec.model, spec.load
        )
        .into());
    }
    let reported = running.envoy_blocked().await.map_err(|e| {
        format!(
            "{} on {} at {}x: Envoy's statistics: {e}",
            spec.system, spec.model, spec.load
        )
    })?;
    running.stop().await?;
    let mut figures = Figures::of(&point, config.duration, spec.rate());
    figures.envoy_check = reported.map(|reported| RejectionCheck {
        counted: rejections.load(Ordering::Relaxed),
        reported,
    });
    Ok(figures)
}

/// Starts the point's system; once more if that fails (each start takes new free ports, so
/// a port taken by another process between its choice and its bind does not lose the run).
async fn start_twice(config: &BenchConfig, spec: PointSpec) -> Result<Running, BoxError> {
    let start = || Running::start(spec.system, spec.model, &config.programs, &config.dir);
    match start().await {
        Ok(running) => Ok(running),
        Err(first) => start()
            .await
            .map_err(|again| format!("{again} (and at the first try: {first})").into()),
    }
}

/// The points of a run in the order they are measured: per model and load, `rounds` rounds
/// one after the other (at least one), every system once in each round, the order of the
/// systems rotated by one from a round to the next (the `r`-th round of the run starts at
/// system `r mod n`), so that drift in the machine's load hits each system at different
/// places, and the rounds of one point are measured close together.
pub fn plan(models: &[Model], loads: &[f64], systems: &[System], rounds: usize) -> Vec<PointSpec> {
    let mut points = Vec::new();
    let mut round = 0;
    for &model in models {
        for &load in loads {
            for _ in 0..rounds.max(1) {
                for k in 0..systems.len() {
                    let system = systems[(round + k) % systems.len()];
                    points.push(PointSpec {
                        system,
                        model,
                        load,
                    });
                }
                round += 1;
            }
        }
    }
    points
}

/// Measures a curve: with `calibrate`, first `rounds` points per model at
/// [`CALIBRATION_LOAD`] on [`System::Bare`], then the points of [`plan`] with `rounds`
/// rounds; `progress` is called after each point. Every round's point is in the results:
/// [`Results::medians`] makes one point of each system's rounds.
///
/// # Errors
///
/// At the first point whose system cannot start (twice) or exits during the point; the
/// points measured before were given to `progress` (which can write them down).
pub async fn run_curve(
    config: &BenchConfig,
    models: &[Model],
    loads: &[f64],
    systems: &[System],
    rounds: usize,
    calibrate: bool,
    mut progress: impl FnMut(&PointSpec, &Figures),
) -> Result<Results, BoxError> {
    let calibration = models.iter().filter(|_| calibrate).flat_map(|&model| {
        std::iter::repeat_n(
            PointSpec {
                system: System::Bare,
                model,
                load: CALIBRATION_LOAD,
            },
            rounds.max(1),
        )
    });
    let points: Vec<PointSpec> = calibration
        .chain(plan(models, loads, systems, rounds))
        .collect();
    let mut results = Results::new();
    for spec in points {
        let figures = run_point(config, spec).await?;
        progress(&spec, &figures);
        results.push(spec, figures);
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_rotates_the_systems_from_round_to_round() {
        let systems = [System::Bare, System::Adaptive, System::Envoy];
        let points = plan(&[Model::Mmc, Model::Article], &[1.0, 3.0], &systems, 1);
        assert_eq!(points.len(), 12);
        let order: Vec<Vec<&str>> = points
            .chunks(3)
            .map(|round| round.iter().map(|p| p.system.name()).collect())
            .collect();
        assert_eq!(
            order,
            [
                ["bare", "adaptive", "envoy"],
                ["adaptive", "envoy", "bare"],
                ["envoy", "bare", "adaptive"],
                ["bare", "adaptive", "envoy"],
            ]
        );
        assert_eq!((points[0].model, points[0].load), (Model::Mmc, 1.0));
        assert_eq!((points[11].model, points[11].load), (Model::Article, 3.0));
        assert!((points[11].rate() - 900.0).abs() < 1e-9);
    }

    #[test]
    fn rounds_of_one_point_come_together_and_keep_rotating() {
        let systems = [System::Bare, System::Adaptive, System::Envoy];
        let points = plan(&[Model::Mmc], &[3.0, 10.0], &systems, 2);
        assert_eq!(points.len(), 12);
        let order: Vec<(f64, Vec<&str>)> = points
            .chunks(3)
            .map(|round| {
                (
                    round[0].load,
                    round.iter().map(|p| p.system.name()).collect(),
                )
            })
            .collect();
        assert_eq!(
            order,
            [
                (3.0, vec!["bare", "adaptive", "envoy"]),
                (3.0, vec!["adaptive", "envoy", "bare"]),
                (10.0, vec!["envoy", "bare", "adaptive"]),
                (10.0, vec!["bare", "adaptive", "envoy"]),
            ]
        );
        assert_eq!(
            plan(&[Model::Mmc], &[3.0], &systems, 0).len(),
            3,
            "at least one round"
        );
    }
}
