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

    /// As [`of_response`](Self::of_response), for a system whose deliberate rejections are
    /// told apart by their body: with `rejection_body` given, a `503` without the stop
    /// signal is a rejection only when its body is exactly that text (Envoy's adaptive
    /// concurrency filter answers `reached concurrency limit`; its other `503`s, such as
    /// `upstream connect error or disconnect/reset before headers` or `no healthy
    /// upstream`, are failures of the path to the server, not shed load).
    pub fn of_answer(
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        rejection_body: Option<&[u8]>,
    ) -> Self {
        let outcome = Self::of_response(status, headers);
        match rejection_body {
            Some(expected)
                if outcome == Outcome::Rejected
                    && status == StatusCode::SERVICE_UNAVAILABLE
                    && !is_stop_signal(headers)
                    && body.trim_ascii() != expected =>
            {
                Outcome::Failed
            }
            _ => outcome,
        }
    }
}

/// What became of one scheduled arrival: an [`Outcome`] from the system, or not sent at all
/// because the generator itself could not (no file descriptor or local port left for its
/// connection: `EMFILE`, `ENFILE`, `EADDRNOTAVAIL`), which counts as a drop by the generator,
/// not as the system's failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attempt {
    /// The request went out and ended so.
    Ended(Outcome),
    /// The generator could not send it.
    NotSent,
}

impl From<Outcome> for Attempt {
    fn from(outcome: Outcome) -> Self {
        Attempt::Ended(outcome)
    }
}

/// The figures of one point of the curve: counts by outcome, the latency of every served
/// request (from its scheduled instant), and the arrivals the generator could not send.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Point {
    pub(crate) served: Vec<Duration>,
    pub(crate) rejected: u64,
    pub(crate) failed: u64,
    pub(crate) dropped: u64,
    pub(crate) late: u64,
    pub(crate) served_in_window: u64,
    /// The delay from each recorded arrival's scheduled instant to its task's first poll.
    pub(crate) lags: Vec<Duration>,
    /// The load sent before the recorded window.
    pub(crate) warmup: Duration,
    /// Whether the warm-up ended because the served rate was stable (else at its cap).
    pub(crate) settled: bool,
    /// The generator's CPU share over the recorded window, when it could be read.
    pub(crate) generator_cpu: Option<f64>,
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

    /// The `q` quantile (within `0..=1`) of the generator's lag: from each recorded
    /// arrival's scheduled instant to the first poll of its task, when the request really
    /// starts; `None` when nothing was sent or `q` is outside `0..=1`.
    pub fn lag_quantile(&self, q: f64) -> Option<Duration> {
        nearest_rank(&self.lags, q)
    }

    /// The load sent before the recorded window (not recorded).
    pub fn warmup(&self) -> Duration {
        self.warmup
    }

    /// Whether the warm-up ended because the served rate had settled; `false` when it
    /// ended at its cap (or was fixed), so the window may hold part of a ramp.
    pub fn settled(&self) -> bool {
        self.settled
    }

    /// The generator process's CPU time over the recorded window as a share (0 to 1) of
    /// the machine's (wall time x cores); `None` where it cannot be read (Linux only:
    /// `/proc/self/stat`).
    pub fn generator_cpu(&self) -> Option<f64> {
        self.generator_cpu
    }

    /// Arrivals scheduled: every outcome, and those dropped.
    pub fn offered(&self) -> u64 {
        self.served() + self.rejected + self.failed + self.dropped
    }

    /// The `q` quantile (within `0..=1`) of the served requests' latency, by the nearest
    /// rank; `None` when nothing was served or `q` is outside `0..=1`.
    pub fn served_quantile(&self, q: f64) -> Option<Duration> {
        nearest_rank(&self.served, q)
    }
}

fn nearest_rank(samples: &[Duration], q: f64) -> Option<Duration> {
    if samples.is_empty() || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    // Nearest rank: the smallest value with at least q of the samples at or below it.
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
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

    /// Review S2: Envoy answers `503` for its filter's shedding and for upstream failures
    /// alike; only the filter's (body `reached concurrency limit`) is a rejection.
    #[test]
    fn envoys_upstream_503s_are_failures_and_its_filters_are_rejections() {
        let none = HeaderMap::new();
        let filter = Some(&b"reached concurrency limit"[..]);
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            Outcome::of_answer(unavailable, &none, b"reached concurrency limit", filter),
            Outcome::Rejected
        );
        for body in [
            &b"upstream connect error or disconnect/reset before headers. reset reason: overflow"[..],
            b"no healthy upstream",
            b"",
        ] {
            assert_eq!(
                Outcome::of_answer(unavailable, &none, body, filter),
                Outcome::Failed
            );
        }
        // Without a body to require, every 503 stays a rejection (the peers' have none).
        assert_eq!(
            Outcome::of_answer(unavailable, &none, b"no healthy upstream", None),
            Outcome::Rejected
        );
        assert_eq!(
            Outcome::of_answer(StatusCode::OK, &none, b"ok", filter),
            Outcome::Served
        );
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
