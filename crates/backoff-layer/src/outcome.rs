//! Typed outcomes of the retry layer: what callers match on.
//!
//! Kept apart from the layer itself so that [`classify`](crate::classify), which recognises
//! [`AttemptTimedOut`], and the layer, which asks the classifier, do not import each other.

use std::fmt;

use crate::BoxError;

/// Why the retry layer stopped retrying while the last attempt's outcome was still a
/// retryable failure.
///
/// Callers see it in [`RetryInfo::gave_up`] when the last attempt was a response, and in
/// [`GaveUp::reason`] when it was an error. Each reason is counted in the metric
/// `backoff_layer_gave_up_total` with the label `reason` set to [`GiveUpReason::as_str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUpReason {
    /// The maximum number of attempts was reached.
    MaxAttempts,
    /// The retry budget refused the retry: the client is already retrying too much.
    BudgetExhausted,
    /// The next attempt could not start (after its backoff) before the overall deadline (the
    /// layer's, or the caller's when it is earlier), the deadline cut an attempt short, or
    /// the caller's deadline had passed before the request reached the layer (no attempt
    /// was sent).
    Deadline,
    /// The request body was streamed without a copy (over the replay limit, or its size was
    /// unknown and turned out too large), so it cannot be sent again.
    BodyNotReplayable,
    /// The request may not be retried: its method is not idempotent and it carries no
    /// `Idempotency-Key` (by the default classifier), or retries are off (max attempts 1).
    NotRetryable,
    /// The server asked for a wait (`Retry-After` or `grpc-retry-pushback-ms`) longer than
    /// [`max_retry_after`](crate::RetryBuilder::max_retry_after): the layer gives up at once
    /// rather than park the request that long.
    RetryAfterTooLong,
    /// The failure carried the stop signal and the layer honours it without passing it up
    /// ([`StopSignals::HonourOnly`](crate::StopSignals::HonourOnly)): not retried, and
    /// returned with the signal taken out. Not counted in `backoff_layer_gave_up_total`:
    /// every stop signal is counted once, in `backoff_layer_stop_signals_total`, whatever
    /// the setting.
    StopSignal,
}

impl GiveUpReason {
    /// The reason as the metric label value: `max_attempts`, `budget`, `deadline`,
    /// `body_not_replayable`, `not_retryable` or `retry_after_too_long` (and
    /// `stop_signal`, never a label: see [`GiveUpReason::StopSignal`]).
    pub const fn as_str(self) -> &'static str {
        match self {
            GiveUpReason::MaxAttempts => "max_attempts",
            GiveUpReason::BudgetExhausted => "budget",
            GiveUpReason::Deadline => "deadline",
            GiveUpReason::BodyNotReplayable => "body_not_replayable",
            GiveUpReason::NotRetryable => "not_retryable",
            GiveUpReason::RetryAfterTooLong => "retry_after_too_long",
            GiveUpReason::StopSignal => "stop_signal",
        }
    }
}

impl fmt::Display for GiveUpReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GiveUpReason::MaxAttempts => "maximum attempts reached",
            GiveUpReason::BudgetExhausted => "retry budget exhausted",
            GiveUpReason::Deadline => "deadline would pass",
            GiveUpReason::BodyNotReplayable => "request body cannot be replayed",
            GiveUpReason::NotRetryable => "request may not be retried",
            GiveUpReason::RetryAfterTooLong => "server asked for a wait over max_retry_after",
            GiveUpReason::StopSignal => "downstream said stop retrying",
        })
    }
}

/// Added to the extensions of every response the retry layer returns.
///
/// ```
/// use backoff_layer::{GiveUpReason, RetryInfo};
/// # let response = http::Response::new(());
/// # let mut response = response;
/// # response.extensions_mut().insert(RetryInfo { attempts: 3, gave_up: Some(GiveUpReason::MaxAttempts) });
/// if let Some(info) = response.extensions().get::<RetryInfo>() {
///     if info.gave_up == Some(GiveUpReason::BudgetExhausted) {
///         // the last response was a retryable failure, and the budget said no more
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RetryInfo {
    /// How many attempts were sent, the one that produced this response included (`1` when
    /// there was no retry).
    pub attempts: u32,
    /// `Some(reason)` when this response is a retryable failure (by the classifier) that was
    /// not retried, and why; `None` when it is final (a success, or a failure not worth a
    /// retry).
    pub gave_up: Option<GiveUpReason>,
}

/// The retry layer gave up while the last attempt's outcome was a retryable error.
///
/// The last attempt's error is the [`source`](std::error::Error::source); it is
/// [`AttemptTimedOut`] when the last attempt ran out of time, or when the deadline passed
/// while the layer waited for the inner service to be ready for the next attempt.
///
/// A `GaveUp` is final for every retry layer above the one that returned it: a retry layer
/// never retries an error with a `GaveUp` (or an [`Overloaded`](crate::Overloaded)) in its
/// source chain, so nested retry layers do not multiply attempts.
///
/// ```
/// use backoff_layer::{GaveUp, GiveUpReason};
/// # fn handle(err: Box<dyn std::error::Error + Send + Sync>) {
/// if let Some(gave_up) = err.downcast_ref::<GaveUp>() {
///     match gave_up.reason() {
///         GiveUpReason::BudgetExhausted => { /* shed load */ }
///         _ => { /* ... */ }
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct GaveUp {
    reason: GiveUpReason,
    attempts: u32,
    source: BoxError,
}

impl GaveUp {
    pub(crate) fn new(reason: GiveUpReason, attempts: u32, source: BoxError) -> Self {
        Self {
            reason,
            attempts,
            source,
        }
    }

    /// Why the layer stopped.
    pub const fn reason(&self) -> GiveUpReason {
        self.reason
    }

    /// How many attempts were sent.
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The last attempt's error.
    pub fn into_source(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gave up after {} attempt{}: {}",
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.reason
        )
    }
}

impl std::error::Error for GaveUp {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// An attempt did not complete within the per-attempt timeout or before the deadline, or
/// the deadline passed before the next attempt could be sent (the inner service was not
/// ready for it, or the caller's deadline had passed before the request reached the layer).
///
/// The default classifier treats it as retryable. When it is the final outcome it is the
/// source of a [`GaveUp`], or returned as is if a custom classifier calls it final.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttemptTimedOut {
    kind: TimedOut,
}

/// What ran out of time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum TimedOut {
    /// An attempt in flight.
    #[default]
    Attempt,
    /// The deadline passed while the next attempt waited for the inner service to be ready.
    NotSent,
    /// The caller's deadline had passed before the request reached the layer.
    AlreadyPassed,
}

impl AttemptTimedOut {
    /// A new `AttemptTimedOut`.
    pub const fn new() -> Self {
        Self {
            kind: TimedOut::Attempt,
        }
    }

    /// The deadline passed before the next attempt could be sent.
    pub(crate) const fn not_sent() -> Self {
        Self {
            kind: TimedOut::NotSent,
        }
    }

    /// The caller's deadline had passed before the first attempt: nothing was sent.
    pub(crate) const fn already_passed() -> Self {
        Self {
            kind: TimedOut::AlreadyPassed,
        }
    }
}

impl fmt::Display for AttemptTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            TimedOut::Attempt => "attempt timed out",
            TimedOut::NotSent => "deadline passed while waiting for the inner service to be ready",
            TimedOut::AlreadyPassed => {
                "the caller's deadline had passed before the request was sent"
            }
        })
    }
}

impl std::error::Error for AttemptTimedOut {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn gave_up_exposes_the_last_error() {
        let e = GaveUp::new(
            GiveUpReason::MaxAttempts,
            3,
            Box::new(AttemptTimedOut::new()),
        );
        assert_eq!(
            e.to_string(),
            "gave up after 3 attempts: maximum attempts reached"
        );
        assert!(e.source().unwrap().is::<AttemptTimedOut>());
        let one = GaveUp::new(GiveUpReason::BudgetExhausted, 1, "x".into());
        assert_eq!(
            one.to_string(),
            "gave up after 1 attempt: retry budget exhausted"
        );
    }
}
