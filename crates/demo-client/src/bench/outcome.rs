//! What one benchmark request ended as, and the figures of a point.

use std::time::Duration;

use http::{HeaderMap, StatusCode};
use overload_signal::protocol::is_stop_signal;

/// How one request of the benchmark ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A `2xx` answer: the request was served.
    Served,
    /// The system refused it at once: `429`, `503` (ours carry `Retry-After`; the peers'
    /// and Envoy's do not, and the bare model never answers `503` unless paused), or any
    /// answer carrying the stop signal.
    Rejected,
    /// Anything else: a timeout, a connection error, `504`, any other status.
    Failed,
}

impl Outcome {
    /// The outcome of an answer with `status` and `headers`.
    pub fn of_response(status: StatusCode, headers: &HeaderMap) -> Self {
        if is_stop_signal(headers) {
            Outcome::Rejected
        } else if status.is_success() {
            Outcome::Served
        } else if status == StatusCode::TOO_MANY_REQUESTS
            || status == StatusCode::SERVICE_UNAVAILABLE
        {
            Outcome::Rejected
        } else {
            Outcome::Failed
        }
    }
}

/// The figures of one point of the curve: counts by outcome, the latency of every served
/// request (from its scheduled instant), and the arrivals the generator could not send.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Point {
    pub(crate) served: Vec<Duration>,
    pub(crate) rejected: u64,
    pub(crate) failed: u64,
    pub(crate) dropped: u64,
    pub(crate) late: u64,
    pub(crate) served_in_window: u64,
}

impl Point {
    /// Requests served.
    pub fn served(&self) -> u64 {
        self.served.len() as u64
    }

    /// Answers served within the recorded window, whenever their request arrived (the
    /// warm-up's included, those of the recorded arrivals answered after its end left
    /// out): the served rate of the window is this over its duration.
    pub fn served_in_window(&self) -> u64 {
        self.served_in_window
    }

    /// Requests the system rejected.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// Requests that failed (timeouts, connection errors, other statuses).
    pub fn failed(&self) -> u64 {
        self.failed
    }

    /// Arrivals never sent because the generator's in-flight cap was full: the point is
    /// limited by the generator, not by the system, when this is not zero.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Requests sent more than [`LATE_AFTER`](super::open_loop::LATE_AFTER) (5 ms) after
    /// their scheduled instant: the generator fell behind (their latency still counts from
    /// the schedule).
    pub fn late(&self) -> u64 {
        self.late
    }

    /// Arrivals scheduled: every outcome, and those dropped.
    pub fn offered(&self) -> u64 {
        self.served() + self.rejected + self.failed + self.dropped
    }

    /// The `q` quantile (within `0..=1`) of the served requests' latency, by the nearest
    /// rank; `None` when nothing was served or `q` is outside `0..=1`.
    pub fn served_quantile(&self, q: f64) -> Option<Duration> {
        if self.served.is_empty() || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let mut sorted = self.served.clone();
        sorted.sort_unstable();
        // Nearest rank: the smallest value with at least q of the samples at or below it.
        let rank = (q * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.clamp(1, sorted.len()) - 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use overload_signal::protocol::Protocol;

    #[test]
    fn answers_are_classified_as_served_rejected_or_failed() {
        let none = HeaderMap::new();
        assert_eq!(Outcome::of_response(StatusCode::OK, &none), Outcome::Served);
        assert_eq!(
            Outcome::of_response(StatusCode::TOO_MANY_REQUESTS, &none),
            Outcome::Rejected
        );
        // A peer's or Envoy's 503 carries no Retry-After: still a rejection.
        assert_eq!(
            Outcome::of_response(StatusCode::SERVICE_UNAVAILABLE, &none),
            Outcome::Rejected
        );
        let stop = overload_signal::protocol::stop_signal_response::<String>(Protocol::Http);
        assert_eq!(
            Outcome::of_response(stop.status(), stop.headers()),
            Outcome::Rejected
        );
        for failed in [
            StatusCode::GATEWAY_TIMEOUT,
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::BAD_GATEWAY,
            StatusCode::NOT_FOUND,
        ] {
            assert_eq!(Outcome::of_response(failed, &none), Outcome::Failed);
        }
    }

    #[test]
    fn served_quantiles_take_the_nearest_rank() {
        let point = Point {
            served: (1..=1000).rev().map(Duration::from_millis).collect(),
            ..Point::default()
        };
        assert_eq!(point.served_quantile(0.5), Some(Duration::from_millis(500)));
        assert_eq!(
            point.served_quantile(0.99),
            Some(Duration::from_millis(990))
        );
        assert_eq!(
            point.served_quantile(0.999),
            Some(Duration::from_millis(999))
        );
        assert_eq!(
            point.served_quantile(1.0),
            Some(Duration::from_millis(1000))
        );
        assert_eq!(point.served_quantile(0.0), Some(Duration::from_millis(1)));
        assert_eq!(point.served_quantile(1.5), None);
        assert_eq!(point.served_quantile(f64::NAN), None);
        assert_eq!(Point::default().served_quantile(0.5), None);
    }
}
