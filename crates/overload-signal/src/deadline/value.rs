//! [`RequestDeadline`]: when a request's caller stops waiting.

use std::time::Duration;

use tokio::time::Instant;

/// When the caller of a request stops waiting for its response's head, on tokio's clock.
///
/// The one name for a deadline across the workspace:
///
/// - [`DeadlineLayer`](super::DeadlineLayer) makes the deadline of each request it admits
///   the [current](super::current) deadline of the task that serves the request;
/// - `backoff-layer`'s retry layer reads it from a request's extensions, and the current
///   one, and folds the earliest into its own deadline: a call to a downstream service
///   never gets more time than the caller has left.
///
/// ```
/// use std::time::Duration;
/// use overload_signal::deadline::RequestDeadline;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let deadline = RequestDeadline::after(Duration::from_secs(2));
/// tokio::time::advance(Duration::from_millis(500)).await;
/// assert_eq!(deadline.time_left(), Duration::from_millis(1_500));
/// assert!(!deadline.has_passed());
///
/// // A caller's deadline, for a request through the retry layer.
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(deadline);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestDeadline(Instant);

/// What [`RequestDeadline::after`] gives a timeout too long to represent: about 30 years,
/// tokio's own "far future".
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

impl RequestDeadline {
    /// The deadline `instant`.
    pub const fn at(instant: Instant) -> Self {
        Self(instant)
    }

    /// The deadline `timeout` from now. A timeout too long to represent is about 30 years.
    pub fn after(timeout: Duration) -> Self {
        Self::after_from(Instant::now(), timeout)
    }

    /// The deadline `timeout` after `now`.
    pub(crate) fn after_from(now: Instant, timeout: Duration) -> Self {
        Self(
            now.checked_add(timeout)
                .or_else(|| now.checked_add(FAR_FUTURE))
                .unwrap_or(now),
        )
    }

    /// The instant itself.
    pub const fn instant(self) -> Instant {
        self.0
    }

    /// The time left until the deadline: zero once it has passed.
    pub fn time_left(self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// Whether the deadline has passed.
    pub fn has_passed(self) -> bool {
        Instant::now() >= self.0
    }

    /// The earlier of two deadlines, either of which may be absent.
    pub fn earliest(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, None) => a,
            (None, b) => b,
        }
    }
}

impl From<Instant> for RequestDeadline {
    fn from(instant: Instant) -> Self {
        Self(instant)
    }
}
