//! One point of the curve (a system, a model, a load: started fresh, warmed up, recorded,
//! stopped) and its figures; the order of the points in a run.

use std::path::PathBuf;
use std::time::Duration;

use tower::BoxError;

use super::open_loop::{Arrivals, Schedule, run_after_warmup};
use super::outcome::Point;
use super::send::HttpSender;
use super::system::{Model, Programs, Running, System};
use super::table::Results;

/// The figures of one point, as the table prints them.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    /// The arrivals' rate, requests per second.
    pub offered_rate: f64,
    /// Answers served per second within the recorded window.
    pub goodput: f64,
    /// Served requests' latency: median, 99th and 99.9th percentiles (`None` when nothing
    /// was served).
    pub served_p50: Option<Duration>,
    /// The 99th percentile of the served requests' latency.
    pub served_p99: Option<Duration>,
    /// The 99.9th percentile of the served requests' latency (indicative under about a
    /// thousand served requests: it rests on the top one or two).
    pub served_p999: Option<Duration>,
    /// Requests served, rejected and failed; arrivals dropped and sent late by the generator.
    pub served: u64,
    /// Requests rejected.
    pub rejected: u64,
    /// Requests failed.
    pub failed: u64,
    /// Arrivals the generator could not send (its in-flight cap was full).
    pub dropped: u64,
    /// Requests the generator sent more than 5 ms late ([`super::open_loop::LATE_AFTER`]).
    pub late: u64,
}

impl Figures {
    /// The figures of `point`, recorded for `duration` at `offered_rate` requests a second.
    ///
    /// Goodput counts the answers served within the recorded window (whenever their
    /// request arrived: [`Point::served_in_window`]) over its duration, so that it cannot
    /// exceed what the system served in that time; the latencies and shares are those of
    /// the arrivals of the recorded window, answered whenever.
    pub fn of(point: &Point, duration: Duration, offered_rate: f64) -> Self {
        let seconds = duration.as_secs_f64();
        Self {
            offered_rate,
            goodput: if seconds > 0.0 {
                point.served_in_window() as f64 / seconds
            } else {
                0.0
            },
            served_p50: point.served_quantile(0.5),
            served_p99: point.served_quantile(0.99),
            served_p999: point.served_quantile(0.999),
            served: point.served(),
            rejected: point.rejected(),
            failed: point.failed(),
            dropped: point.dropped(),
            late: point.late(),
        }
    }

    /// Arrivals of the recorded part: every outcome and the drops.
    pub fn offered(&self) -> u64 {
        self.served + self.rejected + self.failed + self.dropped
    }

    /// The share (0 to 1) of the arrivals rejected; 0 when there were none.
    pub fn rejected_share(&self) -> f64 {
        share(self.rejected, self.offered())
    }

    /// The share (0 to 1) of the arrivals that failed; 0 when there were none.
    pub fn failed_share(&self) -> f64 {
        share(self.failed, self.offered())
    }

    /// Goodput as a share of `capacity` requests a second.
    pub fn goodput_share(&self, capacity: f64) -> f64 {
        self.goodput / capacity
    }

    /// Whether the generator, not the system, limited the point: an arrival dropped, or
    /// more than 2 % of the arrivals sent late.
    pub fn generator_limited(&self) -> bool {
        self.dropped > 0 || share(self.late, self.offered()) > 0.02
    }
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// How every point of a run is measured.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The executables.
    pub programs: Programs,
    /// Where Envoy's configuration and log go.
    pub dir: PathBuf,
    /// Load sent before recording, not recorded.
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

/// A point to measure: a system, a model, a load (a multiple of the model's capacity).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PointSpec {
    /// The system.
    pub system: System,
    /// The model.
    pub model: Model,
    /// The offered load, as a multiple of the model's capacity.
    pub load: f64,
}

impl PointSpec {
    /// Requests per second offered.
    pub fn rate(&self) -> f64 {
        self.model.capacity() * self.load
    }
}

/// Measures one point: starts the system fresh, sends the load for the warm-up and the
/// recorded part without a pause, stops the system, and returns the recorded part's figures.
///
/// # Errors
///
/// When the system cannot start or the rate is not above zero.
pub async fn run_point(config: &BenchConfig, spec: PointSpec) -> Result<Figures, BoxError> {
    let schedule = Schedule::new(spec.rate(), config.arrivals)?;
    let running = Running::start(spec.system, spec.model, &config.programs, &config.dir).await?;
    let sender = HttpSender::new(running.url().clone(), config.timeout);
    let point = run_after_warmup(
        &schedule,
        config.warmup,
        config.duration,
        config.max_in_flight,
        || sender.send(),
    )
    .await;
    running.stop().await?;
    Ok(Figures::of(&point, config.duration, spec.rate()))
}

/// The points of a run in the order they are measured: one round per model and load, every
/// system once in each round, the order of the systems rotated by one from a round to the
/// next (round `r` starts at system `r mod n`), so that drift in the machine's load hits
/// each system at different places.
pub fn plan(models: &[Model], loads: &[f64], systems: &[System]) -> Vec<PointSpec> {
    let mut points = Vec::new();
    let mut round = 0;
    for &model in models {
        for &load in loads {
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
    points
}

/// The load of the calibration point: half the capacity, on the bare server, whose served
/// p99 is the unloaded served p99 the other points are judged against.
pub const CALIBRATION_LOAD: f64 = 0.5;

/// Measures a curve: with `calibrate`, first one point per model at [`CALIBRATION_LOAD`] on
/// [`System::Bare`], then the points of [`plan`]; `progress` is called after each point.
///
/// # Errors
///
/// At the first point whose system cannot start (the points measured before are lost: a
/// harness that fails is not a result).
pub async fn run_curve(
    config: &BenchConfig,
    models: &[Model],
    loads: &[f64],
    systems: &[System],
    calibrate: bool,
    mut progress: impl FnMut(&PointSpec, &Figures),
) -> Result<Results, BoxError> {
    let calibration = models.iter().filter(|_| calibrate).map(|&model| PointSpec {
        system: System::Bare,
        model,
        load: CALIBRATION_LOAD,
    });
    let points: Vec<PointSpec> = calibration.chain(plan(models, loads, systems)).collect();
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

    fn point(served_ms: &[u64], rejected: u64, failed: u64, dropped: u64, late: u64) -> Point {
        Point {
            served: served_ms
                .iter()
                .copied()
                .map(Duration::from_millis)
                .collect(),
            rejected,
            failed,
            dropped,
            late,
            served_in_window: served_ms.len() as u64,
        }
    }

    #[test]
    fn figures_count_served_alone_in_goodput_and_latency() {
        // 2 s recorded: 400 served (50 ms each but one 900 ms), 500 rejected, 100 failed.
        let mut served = vec![50; 399];
        served.push(900);
        let figures = Figures::of(
            &point(&served, 500, 100, 0, 0),
            Duration::from_secs(2),
            500.0,
        );
        assert!((figures.goodput - 200.0).abs() < 1e-9, "{figures:?}");
        assert!((figures.goodput_share(200.0) - 1.0).abs() < 1e-9);
        assert_eq!(figures.served_p50, Some(Duration::from_millis(50)));
        assert_eq!(figures.served_p99, Some(Duration::from_millis(50)));
        assert_eq!(figures.served_p999, Some(Duration::from_millis(900)));
        assert_eq!(figures.offered(), 1000);
        assert!((figures.rejected_share() - 0.5).abs() < 1e-9);
        assert!((figures.failed_share() - 0.1).abs() < 1e-9);
        assert!(!figures.generator_limited());
    }

    #[test]
    fn goodput_is_what_was_served_within_the_window() {
        // 300 recorded arrivals served, 100 of them after the window's end: 200 in 1 s.
        let mut late_answers = point(&[50; 300], 0, 0, 0, 0);
        late_answers.served_in_window = 200;
        let figures = Figures::of(&late_answers, Duration::from_secs(1), 300.0);
        assert!((figures.goodput - 200.0).abs() < 1e-9, "{figures:?}");
        assert_eq!(figures.served, 300);
    }

    #[test]
    fn a_point_with_nothing_served_has_no_latency_and_zero_goodput() {
        let figures = Figures::of(&point(&[], 0, 10, 0, 0), Duration::from_secs(1), 10.0);
        assert!(figures.goodput.abs() < f64::EPSILON, "{figures:?}");
        assert_eq!(figures.served_p99, None);
        assert!((figures.failed_share() - 1.0).abs() < 1e-9);
        let empty = Figures::of(&Point::default(), Duration::from_secs(1), 10.0);
        assert!(empty.rejected_share().abs() + empty.failed_share().abs() < f64::EPSILON);
    }

    #[test]
    fn drops_and_late_sends_mark_the_generator_as_the_limit() {
        let dropped = Figures::of(&point(&[10], 0, 0, 1, 0), Duration::from_secs(1), 2.0);
        assert!(dropped.generator_limited());
        // 2 late of 100 is within the 2 %; 3 is not.
        let served = vec![10; 100];
        let two = Figures::of(&point(&served, 0, 0, 0, 2), Duration::from_secs(1), 100.0);
        assert!(!two.generator_limited());
        let three = Figures::of(&point(&served, 0, 0, 0, 3), Duration::from_secs(1), 100.0);
        assert!(three.generator_limited());
    }

    #[test]
    fn the_plan_rotates_the_systems_from_round_to_round() {
        let systems = [System::Bare, System::Adaptive, System::Envoy];
        let points = plan(&[Model::Mmc, Model::Article], &[1.0, 3.0], &systems);
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
}
