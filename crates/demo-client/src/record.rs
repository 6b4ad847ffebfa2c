//! The per-second recorder: what the clients saw, one row per second of the run.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// What happened in one second of a run, as seen by the clients.
///
/// "Request" means a logical request of a client, whatever number of attempts it took;
/// "attempt" means one HTTP exchange sent to the server.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Second {
    /// Logical requests started.
    pub requests: u64,
    /// Requests that ended in a successful (2xx) response.
    pub ok: u64,
    /// Requests that ended without a success, for any reason: an error status, a stop
    /// signal, a retry the budget refused, a refused connection, a last attempt that timed
    /// out (the client gave up).
    pub failed: u64,
    /// The part of [`failed`](Self::failed) that did not end in a timeout.
    pub errors: u64,
    /// Attempts that timed out, each one, whether it was retried or not (a client that
    /// retries without end never ends its request, but every one of its attempts counts).
    pub timeouts: u64,
    /// Attempts sent to the server, first tries and retries.
    pub attempts: u64,
    /// Retries sent (attempts after the first of their request).
    pub retries: u64,
    /// Retries the retry budget refused.
    pub budget_refusals: u64,
    /// Responses that carried the "stop retrying" signal.
    pub stop_signals: u64,
    /// Attempts answered `429 Too Many Requests` or `503 Service Unavailable` without the
    /// stop signal: rejected by a rate limit or by the adaptive limit.
    pub rejected: u64,
    /// Attempts whose connection was refused (nothing listening).
    pub refused: u64,
    /// Requests the client-side throttle refused: never sent, failed at once (part of
    /// [`failed`](Self::failed)).
    pub throttled: u64,
    /// End-to-end latencies (from the start of the request, retries included) of the
    /// requests that succeeded in this second.
    pub latencies: Vec<Duration>,
    /// Times to outcome (from the start of the request, retries included) of the requests
    /// that failed in this second.
    pub failure_latencies: Vec<Duration>,
    /// The highest number of concurrent requests the server reported during this second,
    /// when it was sampled.
    pub server_concurrency: Option<u64>,
}

impl Second {
    /// Adds `other` into `self`, for merging the recordings of several clients.
    pub fn merge(&mut self, other: &Second) {
        self.requests += other.requests;
        self.ok += other.ok;
        self.failed += other.failed;
        self.errors += other.errors;
        self.timeouts += other.timeouts;
        self.attempts += other.attempts;
        self.retries += other.retries;
        self.budget_refusals += other.budget_refusals;
        self.stop_signals += other.stop_signals;
        self.rejected += other.rejected;
        self.refused += other.refused;
        self.throttled += other.throttled;
        self.latencies.extend_from_slice(&other.latencies);
        self.failure_latencies
            .extend_from_slice(&other.failure_latencies);
        self.server_concurrency = match (self.server_concurrency, other.server_concurrency) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// One event the load generator records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A client started a logical request.
    Request,
    /// An attempt was sent; `retry` is true for every attempt after the first.
    Attempt {
        /// Whether this attempt is a retry.
        retry: bool,
    },
    /// A request succeeded after `latency`, retries included.
    Ok {
        /// End-to-end latency of the request.
        latency: Duration,
    },
    /// A request ended without a success after `latency`, retries included.
    Failed {
        /// Time from the start of the request to its failure.
        latency: Duration,
        /// Whether its last attempt timed out.
        timed_out: bool,
    },
    /// An attempt timed out.
    Timeout,
    /// An attempt was answered `429` or `503` without the stop signal.
    Rejected,
    /// An attempt's connection was refused.
    Refused,
    /// The retry budget refused a retry.
    BudgetRefusal,
    /// A response carried the stop signal.
    StopSignal,
    /// The client-side throttle refused a request (it is also [`Event::Failed`]).
    Throttled,
    /// The server reported this many requests in flight.
    ServerConcurrency(u64),
}

/// Records [`Event`]s into one [`Second`] per second since the recorder was created.
///
/// Cheap to clone (the rows are shared behind an [`Arc`]); every clone records into the same
/// series. Time comes from [`tokio::time`], so a recorder works the same under a paused clock.
#[derive(Debug, Clone)]
pub struct Recorder {
    start: Instant,
    seconds: Arc<Mutex<Vec<Second>>>,
}

impl Recorder {
    /// A recorder whose second 0 starts now.
    pub fn new() -> Self {
        Self::starting_at(Instant::now())
    }

    /// A recorder whose second 0 starts at `start`.
    pub fn starting_at(start: Instant) -> Self {
        Self {
            start,
            seconds: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// When second 0 started.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Records `event` in the current second.
    pub fn record(&self, event: Event) {
        self.record_at(Instant::now(), event);
    }

    /// Records `event` in the second `at` falls into (second 0 if `at` is before the start).
    pub fn record_at(&self, at: Instant, event: Event) {
        let index = usize::try_from(at.saturating_duration_since(self.start).as_secs())
            .unwrap_or(usize::MAX);
        // NOTE: the lock is never held across an await, and a panic while holding it cannot
        // leave a row half-updated in a way that matters for counters, so poisoning is ignored.
        let mut seconds = self.seconds.lock().unwrap_or_else(PoisonError::into_inner);
        if seconds.len() <= index {
            seconds.resize_with(index + 1, Second::default);
        }
        let row = &mut seconds[index];
        match event {
            Event::Request => row.requests += 1,
            Event::Attempt { retry } => {
                row.attempts += 1;
                if retry {
                    row.retries += 1;
                }
            }
            Event::Ok { latency } => {
                row.ok += 1;
                row.latencies.push(latency);
            }
            Event::Failed { latency, timed_out } => {
                row.failed += 1;
                if !timed_out {
                    row.errors += 1;
                }
                row.failure_latencies.push(latency);
            }
            Event::Timeout => row.timeouts += 1,
            Event::Rejected => row.rejected += 1,
            Event::Refused => row.refused += 1,
            Event::BudgetRefusal => row.budget_refusals += 1,
            Event::StopSignal => row.stop_signals += 1,
            Event::Throttled => row.throttled += 1,
            Event::ServerConcurrency(c) => {
                row.server_concurrency = Some(row.server_concurrency.map_or(c, |m| m.max(c)));
            }
        }
    }

    /// A copy of every second recorded so far, including the current, incomplete one.
    pub fn snapshot(&self) -> Vec<Second> {
        self.seconds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The complete seconds `[0, until)`, padded with empty rows if nothing was recorded in
    /// some of them.
    pub fn seconds_until(&self, until: usize) -> Vec<Second> {
        let mut rows = self.snapshot();
        rows.resize_with(until, Second::default);
        rows
    }

    /// Sums of the seconds `[from, to)` (clamped to what was recorded).
    pub fn totals(&self, from: usize, to: usize) -> Second {
        let seconds = self.seconds.lock().unwrap_or_else(PoisonError::into_inner);
        let mut total = Second::default();
        let to = to.min(seconds.len());
        for row in seconds.get(from.min(to)..to).unwrap_or_default() {
            total.merge(row);
        }
        total
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn events_land_in_their_second() {
        let recorder = Recorder::new();
        recorder.record(Event::Request);
        recorder.record(Event::Attempt { retry: false });
        tokio::time::advance(Duration::from_millis(1500)).await;
        recorder.record(Event::Attempt { retry: true });
        recorder.record(Event::Ok {
            latency: Duration::from_millis(1500),
        });
        recorder.record(Event::ServerConcurrency(7));
        recorder.record(Event::ServerConcurrency(3));
        tokio::time::advance(Duration::from_secs(2)).await;
        recorder.record(Event::Timeout);
        recorder.record(Event::Failed {
            latency: Duration::from_secs(3),
            timed_out: false,
        });
        recorder.record(Event::Failed {
            latency: Duration::from_secs(6),
            timed_out: true,
        });
        recorder.record(Event::BudgetRefusal);
        recorder.record(Event::StopSignal);
        recorder.record(Event::Rejected);
        recorder.record(Event::Refused);
        recorder.record(Event::Throttled);

        let rows = recorder.snapshot();
        assert_eq!(rows.len(), 4);
        assert_eq!(
            (rows[0].requests, rows[0].attempts, rows[0].retries),
            (1, 1, 0)
        );
        assert_eq!((rows[1].attempts, rows[1].retries, rows[1].ok), (1, 1, 1));
        assert_eq!(rows[1].latencies, vec![Duration::from_millis(1500)]);
        assert_eq!(rows[1].server_concurrency, Some(7));
        assert_eq!(rows[2], Second::default());
        assert_eq!(
            (
                rows[3].timeouts,
                rows[3].failed,
                rows[3].errors,
                rows[3].budget_refusals,
                rows[3].stop_signals,
                rows[3].rejected,
                rows[3].refused,
                rows[3].throttled,
            ),
            (1, 2, 1, 1, 1, 1, 1, 1)
        );
        assert_eq!(
            rows[3].failure_latencies,
            vec![Duration::from_secs(3), Duration::from_secs(6)]
        );

        let total = recorder.totals(0, 10);
        assert_eq!(
            (total.attempts, total.retries, total.ok, total.timeouts),
            (2, 1, 1, 1)
        );
        assert_eq!(recorder.seconds_until(6).len(), 6);
        assert_eq!(recorder.totals(5, 3), Second::default());
    }

    #[test]
    fn merge_keeps_the_highest_concurrency() {
        let mut a = Second {
            ok: 1,
            server_concurrency: Some(4),
            ..Second::default()
        };
        let b = Second {
            ok: 2,
            server_concurrency: Some(9),
            latencies: vec![Duration::from_millis(3)],
            ..Second::default()
        };
        a.merge(&b);
        assert_eq!(a.ok, 3);
        assert_eq!(a.server_concurrency, Some(9));
        assert_eq!(a.latencies.len(), 1);
        a.merge(&Second::default());
        assert_eq!(a.server_concurrency, Some(9));
    }
}
