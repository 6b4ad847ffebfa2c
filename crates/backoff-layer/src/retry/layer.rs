use std::sync::{Arc, OnceLock};
use std::time::Duration;

use overload_signal::ConfigError;
use tower_layer::Layer;

use super::{Config, Retry};
use crate::backoff::{Backoff, Exponential, Seeds};
use crate::budget::{Budget, RetryBudget};
use crate::classify::{Classify, DefaultClassifier};

/// Applies [`Retry`] to a service. Cheap to clone: the configuration is shared.
///
/// [`RetryLayer::new`] (or `default()`) uses every default; [`RetryLayer::builder`] changes
/// them. The defaults, with their sources, are listed on [`RetryBuilder`]; the numeric ones
/// are also associated constants of this type.
///
/// ```
/// use std::time::Duration;
/// use backoff_layer::RetryLayer;
/// use backoff_layer::backoff::FullJitter;
///
/// // Every default: 3 attempts, the article's backoff, the default retry budget.
/// let layer = RetryLayer::new();
///
/// // Customised: 5 attempts, full jitter, a 2 s timeout per attempt.
/// let layer = RetryLayer::builder()
///     .max_attempts(5)
///     .backoff(FullJitter::new())
///     .attempt_timeout(Duration::from_secs(2))
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), backoff_layer::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RetryLayer {
    config: Arc<Config>,
}

impl RetryLayer {
    /// Default max attempts, the first included: 3 (SRE book, AWS SDKs, Polly).
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

    /// Default body replay limit: 64 KiB (linkerd).
    pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

    /// Default overall deadline per request: none. The attempts, the backoff and the budget
    /// bound a request's time; a caller with a time limit of its own sets one.
    pub const DEFAULT_DEADLINE: Option<Duration> = None;

    /// Default timeout per attempt: none, as in hyper-util's client. A stack that needs one
    /// sets it here or puts a timeout layer under the retry layer.
    pub const DEFAULT_ATTEMPT_TIMEOUT: Option<Duration> = None;

    /// A layer with every default; see [`RetryBuilder`] for what they are.
    pub fn new() -> Self {
        Self::builder().finish()
    }

    /// A builder starting from the defaults.
    pub const fn builder() -> RetryBuilder {
        RetryBuilder {
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            deadline: Self::DEFAULT_DEADLINE,
            attempt_timeout: Self::DEFAULT_ATTEMPT_TIMEOUT,
            backoff: None,
            budget: None,
            classifier: None,
            body_limit: Self::DEFAULT_BODY_LIMIT,
            seeds: None,
        }
    }
}

impl Default for RetryLayer {
    /// The same as [`RetryLayer::new`]: every default.
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Retry<S> {
        Retry::new(inner, Arc::clone(&self.config))
    }
}

/// Configures a [`RetryLayer`]; made by [`RetryLayer::builder`]. Every setting has a
/// default:
///
/// | setting | default | source |
/// |---|---|---|
/// | [`max_attempts`](Self::max_attempts) | 3 (the first attempt included) | SRE book, AWS SDKs, Polly |
/// | [`deadline`](Self::deadline) | none | |
/// | [`attempt_timeout`](Self::attempt_timeout) | none | hyper-util's client |
/// | [`backoff`](Self::backoff) | [`Exponential::new()`]: 100 ms, x2, jitter 0.1, at most 15 min | the article |
/// | [`budget`](Self::budget) | [`RetryBudget::default()`]: retries at most 10% of first attempts over 10 s, plus 1 retry per second | paper, SRE book |
/// | [`classifier`](Self::classifier) | [`DefaultClassifier`]: connect errors, timeouts, 429, 502, 503, 504; idempotent methods or `Idempotency-Key` | RFC 9110, Envoy, .NET |
/// | [`body_limit`](Self::body_limit) | 64 KiB | linkerd |
/// | [`seeds`](Self::seeds) | [`Seeds::from_os()`] | |
///
/// [`build`](Self::build) checks the settings:
///
/// - `max_attempts` is at least 1 (1 turns retries off);
/// - `deadline`, if set, is greater than zero;
/// - `attempt_timeout`, if set, is greater than zero.
#[must_use = "a builder does nothing until `build` is called"]
pub struct RetryBuilder {
    max_attempts: u32,
    deadline: Option<Duration>,
    attempt_timeout: Option<Duration>,
    backoff: Option<Arc<dyn Backoff>>,
    budget: Option<Arc<dyn Budget>>,
    classifier: Option<Arc<dyn Classify>>,
    body_limit: usize,
    seeds: Option<Arc<Seeds>>,
}

impl std::fmt::Debug for RetryBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // NOTE: `Budget` is not `Debug`; it is left out.
        f.debug_struct("RetryBuilder")
            .field("max_attempts", &self.max_attempts)
            .field("deadline", &self.deadline)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("backoff", &self.backoff)
            .field("classifier", &self.classifier)
            .field("body_limit", &self.body_limit)
            .finish_non_exhaustive()
    }
}

impl RetryBuilder {
    /// The most attempts per request, the first included: `1` turns retries off. Must be at
    /// least 1. Default: 3 (SRE book, AWS SDKs, Polly).
    pub const fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// An overall deadline per request, from the call to the retry layer: no attempt starts
    /// after it, a wait that would end after it is not started (the layer gives up at once),
    /// and an attempt still running at the deadline is cut short. Must be greater than zero.
    /// Default: none.
    pub const fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// A timeout for each attempt. An attempt that runs out of time is dropped and its
    /// outcome is [`AttemptTimedOut`](crate::AttemptTimedOut), retryable by the default
    /// classifier. Must be greater than zero. Default: none, as in hyper-util's client.
    pub const fn attempt_timeout(mut self, attempt_timeout: Duration) -> Self {
        self.attempt_timeout = Some(attempt_timeout);
        self
    }

    /// The backoff strategy. Default: the article's, [`Exponential::new()`] (100 ms, x2,
    /// jitter 0.1, at most 15 min).
    pub fn backoff(mut self, backoff: impl Backoff) -> Self {
        self.backoff = Some(Arc::new(backoff));
        self
    }

    /// A backoff strategy shared with other layers (or chosen at run time, as a trait
    /// object).
    pub fn shared_backoff(mut self, backoff: Arc<dyn Backoff>) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// The retry budget; every layer built from this builder shares it. Default:
    /// [`RetryBudget::default()`] (10% of first attempts over 10 s, plus 1 retry per second,
    /// from the paper and the SRE book);
    /// [`Unlimited`](crate::budget::Unlimited) turns it off.
    pub fn budget(mut self, budget: impl Budget) -> Self {
        self.budget = Some(Arc::new(budget));
        self
    }

    /// A retry budget shared with other layers (for example one budget per downstream
    /// service, shared by every client of it).
    pub fn shared_budget(mut self, budget: Arc<dyn Budget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// What is retried. Default: [`DefaultClassifier`] (RFC 9110, Envoy, .NET).
    pub fn classifier(mut self, classifier: impl Classify) -> Self {
        self.classifier = Some(Arc::new(classifier));
        self
    }

    /// The largest request body kept for replay, in bytes; larger bodies are streamed once
    /// and never retried. `0` keeps only empty bodies replayable. Default: 64 KiB (linkerd).
    pub const fn body_limit(mut self, body_limit: usize) -> Self {
        self.body_limit = body_limit;
        self
    }

    /// Where each request's random generator gets its seed. Default: [`Seeds::from_os()`],
    /// keyed by the operating system's generator; tests pass [`Seeds::from_seed`] to make
    /// delays reproducible.
    pub fn seeds(mut self, seeds: Seeds) -> Self {
        self.seeds = Some(Arc::new(seeds));
        self
    }

    /// Checks the settings and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first setting that breaks one of the rules listed on
    /// [`RetryBuilder`].
    pub fn build(self) -> Result<RetryLayer, ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::out_of_range(
                "max_attempts",
                self.max_attempts,
                "at least 1",
            ));
        }
        for (field, value) in [
            ("deadline", self.deadline),
            ("attempt_timeout", self.attempt_timeout),
        ] {
            if let Some(zero) = value.filter(Duration::is_zero) {
                return Err(ConfigError::out_of_range(field, zero, "greater than zero"));
            }
        }
        Ok(self.finish())
    }

    /// The layer, without checks: for [`build`](Self::build) and for the defaults.
    fn finish(self) -> RetryLayer {
        RetryLayer {
            config: Arc::new(Config {
                max_attempts: self.max_attempts,
                deadline: self.deadline,
                attempt_timeout: self.attempt_timeout,
                backoff: self.backoff.unwrap_or_else(|| Arc::new(Exponential::new())),
                budget: self
                    .budget
                    .unwrap_or_else(|| Arc::new(RetryBudget::default())),
                classifier: self
                    .classifier
                    .unwrap_or_else(|| Arc::new(DefaultClassifier)),
                body_limit: self.body_limit,
                seeds: self.seeds.unwrap_or_else(|| Arc::new(Seeds::from_os())),
                metrics: OnceLock::new(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_configurations_are_refused_by_name_value_and_rule() {
        use overload_signal::ConfigErrorKind::OutOfRange;
        let refused = |b: RetryBuilder| {
            let e = b.build().unwrap_err();
            (e.field(), e.kind(), e.to_string())
        };
        assert_eq!(
            refused(RetryLayer::builder().max_attempts(0)),
            (
                "max_attempts",
                OutOfRange,
                "max_attempts must be at least 1, got 0".to_owned()
            )
        );
        assert_eq!(
            refused(RetryLayer::builder().deadline(Duration::ZERO)),
            (
                "deadline",
                OutOfRange,
                "deadline must be greater than zero, got 0ns".to_owned()
            )
        );
        assert_eq!(
            refused(RetryLayer::builder().attempt_timeout(Duration::ZERO)),
            (
                "attempt_timeout",
                OutOfRange,
                "attempt_timeout must be greater than zero, got 0ns".to_owned()
            )
        );
        assert!(RetryLayer::builder().max_attempts(1).build().is_ok());
        assert!(
            RetryLayer::builder()
                .deadline(Duration::from_nanos(1))
                .attempt_timeout(Duration::from_nanos(1))
                .build()
                .is_ok()
        );
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let layer = RetryLayer::new();
        let c = &layer.config;
        assert_eq!(c.max_attempts, 3);
        assert_eq!(c.max_attempts, RetryLayer::DEFAULT_MAX_ATTEMPTS);
        assert_eq!(c.body_limit, 64 * 1024);
        assert_eq!(c.body_limit, RetryLayer::DEFAULT_BODY_LIMIT);
        assert_eq!(c.deadline, None);
        assert_eq!(c.attempt_timeout, None);
        assert_eq!(c.backoff.max_delay(), Duration::from_secs(15 * 60));
        assert_eq!(
            format!("{:?}", c.backoff),
            format!("{:?}", Exponential::new())
        );
        assert_eq!(format!("{:?}", c.classifier), "DefaultClassifier");
        // `build()` of an untouched builder is the same as `new()`.
        let built = RetryLayer::builder().build().unwrap();
        assert_eq!(format!("{:?}", built.config), format!("{c:?}"));
    }

    fn assert_send_sync_clone<T: Send + Sync + Clone>() {}

    #[test]
    fn layer_and_service_are_send_sync_clone() {
        assert_send_sync_clone::<RetryLayer>();
        assert_send_sync_clone::<Retry<()>>();
    }
}
