//! A point to measure ([`PointSpec`]) and its figures ([`Figures`]): the leaf that the runner,
//! which makes them, and the table, which prints them, both use.

use std::time::Duration;

use super::outcome::Point;
use super::system::{Model, System};

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

/// The load of the calibration point: half the capacity, on the bare server, whose served
/// p99 is the unloaded served p99 the other points are judged against.
pub const CALIBRATION_LOAD: f64 = 0.5;

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
    /// Requests served.
    pub served: u64,
    /// Requests rejected.
    pub rejected: u64,
    /// Requests failed.
    pub failed: u64,
    /// Arrivals the generator could not send (its in-flight cap was full).
    pub dropped: u64,
    /// Requests whose task first ran more than 5 ms after their scheduled instant
    /// ([`super::open_loop::LATE_AFTER`]).
    pub late: u64,
    /// The 99th percentile of the generator's lag, from scheduled instant to the request's
    /// start (`None` when nothing was sent).
    pub lag_p99: Option<Duration>,
    /// The generator process's CPU time over the recorded window, as a share (0 to 1) of
    /// the machine's; `None` where it cannot be read (Linux only) or over less than 1 s.
    pub generator_cpu: Option<f64>,
    /// The load sent before the recorded window.
    pub warmup: Duration,
    /// Whether the warm-up ended because the served rate settled (not at its cap).
    pub settled: bool,
    /// For [`System::Envoy`]: the rejections this harness counted over the whole point
    /// (warm-up included) beside the count Envoy's admin interface reports for its adaptive
    /// concurrency filter; `None` for the other systems.
    pub envoy_check: Option<RejectionCheck>,
}

/// The rejections of one point counted twice: by the harness (each `503` whose body is the
/// filter's, [`super::system::ENVOY_REJECTION_BODY`]) and by Envoy itself (its
/// [`super::system::ENVOY_BLOCKED_STAT`] counter), over the whole point, warm-up included.
/// They agree when the harness classifies Envoy's answers as Envoy does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RejectionCheck {
    /// Rejections the harness counted.
    pub counted: u64,
    /// Requests Envoy reports it blocked.
    pub reported: u64,
}

impl RejectionCheck {
    /// Whether the two counts agree: within 1 % of the larger, or 2 requests (a request
    /// whose `503` arrived after its timeout is blocked by Envoy but failed here).
    pub fn agrees(&self) -> bool {
        let larger = self.counted.max(self.reported);
        self.counted.abs_diff(self.reported) <= (larger / 100).max(2)
    }
}

/// The generator's CPU share (of the whole machine) over which a point counts as limited
/// by the generator: 0.5, half the machine. The generator shares the machine with the
/// system under test; past half of it, it takes more than it leaves.
pub const GENERATOR_CPU_LIMIT: f64 = 0.5;

/// The share of arrivals that may start late ([`super::open_loop::LATE_AFTER`]) before the
/// point counts as limited by the generator: 2 %.
pub const LATE_SHARE_LIMIT: f64 = 0.02;

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
            lag_p99: point.lag_quantile(0.99),
            generator_cpu: point.generator_cpu(),
            warmup: point.warmup(),
            settled: point.settled(),
            envoy_check: None,
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

    /// Whether the generator, not the system, limited the point: an arrival dropped, more
    /// than [`LATE_SHARE_LIMIT`] (2 %) of the arrivals started late, or the generator used
    /// more than [`GENERATOR_CPU_LIMIT`] (half) of the machine's CPU.
    pub fn generator_limited(&self) -> bool {
        self.dropped > 0
            || share(self.late, self.offered()) > LATE_SHARE_LIMIT
            || self
                .generator_cpu
                .is_some_and(|cpu| cpu > GENERATOR_CPU_LIMIT)
    }
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
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
            ..Point::default()
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

    /// Review M2: a generator that used more than half the machine's CPU limited the point.
    #[test]
    fn a_generator_short_of_cpu_marks_the_point() {
        let mut busy = point(&[10; 100], 0, 0, 0, 0);
        busy.generator_cpu = Some(0.4);
        assert!(!Figures::of(&busy, Duration::from_secs(1), 100.0).generator_limited());
        busy.generator_cpu = Some(0.6);
        let figures = Figures::of(&busy, Duration::from_secs(1), 100.0);
        assert!(figures.generator_limited());
        assert_eq!(figures.generator_cpu, Some(0.6));
    }

    #[test]
    fn two_counts_of_envoys_rejections_agree_within_a_percent_or_two_requests() {
        let check = |counted, reported| RejectionCheck { counted, reported }.agrees();
        assert!(check(0, 0) && check(5_000, 5_000));
        assert!(check(0, 2) && check(2, 0), "two requests of slack");
        assert!(!check(0, 3) && !check(3, 0));
        assert!(
            check(9_900, 10_000) && check(10_000, 9_900),
            "1 % of the larger"
        );
        assert!(!check(9_899, 10_000) && !check(10_000, 9_899));
        assert_eq!(
            Figures::of(&point(&[10], 1, 0, 0, 0), Duration::from_secs(1), 2.0).envoy_check,
            None,
            "the figures of a point hold no check until the runner adds Envoy's"
        );
    }
}
