use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::{Config, InvalidRetryConfig, Retry};
use crate::backoff::{Backoff, Exponential, Seeds};
use crate::budget::{Budget, RetryBudget};
use crate::classify::{Classify, DefaultClassifier};

/// Applies [`Retry`] to a service. Cheap to clone: the configuration is shared.
///
/// [`RetryLayer::new`] (or `default()`) uses every default; [`RetryLayer::builder`] changes
/// them.
#[derive(Clone, Debug)]
pub struct RetryLayer {
    config: Arc<Config>,
}

impl RetryLayer {
    /// Default max attempts: 3 (SRE book, AWS SDKs, Polly).
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

    /// Default body replay limit: 64 KiB (linkerd).
    pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

    /// A layer with every default; see [`RetryBuilder`] for what they are.
    pub fn new() -> Self {
        Self::builder().finish()
    }

    /// A builder starting from the defaults.
    pub fn builder() -> RetryBuilder {
        RetryBuilder {
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            deadline: None,
            attempt_timeout: None,
            backoff: None,
            budget: None,
            classifier: None,
            body_limit: Self::DEFAULT_BODY_LIMIT,
            seeds: None,
        }
    }
}

impl Default for RetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Retry<S> {
        Retry::from_config(inner, Arc::clone(&self.config))
    }
}

/// Configures a [`RetryLayer`]. Every setting has a default:
///
/// | setting | default | source |
/// |---|---|---|
/// | [`max_attempts`](Self::max_attempts) | 3 (the first attempt included) | SRE book, AWS SDKs, Polly |
/// | [`deadline`](Self::deadline) | none | |
/// | [`attempt_timeout`](Self::attempt_timeout) | none | |
/// | [`backoff`](Self::backoff) | [`Exponential::default()`]: 100 ms, x2, jitter 0.1, at most 15 min | the article |
/// | [`budget`](Self::budget) | [`RetryBudget::default()`]: retries at most 10% of first attempts over 10 s, plus 1 retry per second | paper, SRE book |
/// | [`classifier`](Self::classifier) | [`DefaultClassifier`]: connect errors, timeouts, 429, 502, 503, 504; idempotent methods or `Idempotency-Key` | RFC 9110, Envoy, .NET |
/// | [`body_limit`](Self::body_limit) | 64 KiB | linkerd |
/// | [`seeds`](Self::seeds) | [`Seeds::from_os()`] | |
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
    /// least 1. Default is 3.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// An overall deadline per request, from the call to the retry layer: no attempt starts
    /// after it, a wait that would end after it is not started (the layer gives up at once),
    /// and an attempt still running at the deadline is cut short. Must be greater than zero.
    /// Default is none.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// A timeout for each attempt. An attempt that runs out of time is dropped and its
    /// outcome is [`AttemptTimedOut`](crate::AttemptTimedOut), retryable by the default
    /// classifier. Must be greater than zero. Default is none.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// The backoff strategy. Default is the article's [`Exponential::default()`].
    pub fn backoff(mut self, backoff: impl Backoff) -> Self {
        self.backoff = Some(Arc::new(backoff));
        self
    }

    /// A backoff strategy shared with other layers.
    pub fn shared_backoff(mut self, backoff: Arc<dyn Backoff>) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// The retry budget; every layer built from this builder shares it. Default is
    /// [`RetryBudget::default()`] (10% of first attempts over 10 s, plus 1 retry per second);
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

    /// What is retried. Default is [`DefaultClassifier`].
    pub fn classifier(mut self, classifier: impl Classify) -> Self {
        self.classifier = Some(Arc::new(classifier));
        self
    }

    /// The largest request body kept for replay, in bytes; larger bodies are streamed once
    /// and never retried. `0` keeps only empty bodies replayable. Default is 64 KiB.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Where each request's random generator gets its seed. Default is
    /// [`Seeds::from_os()`]; tests pass [`Seeds::from_seed`] to make delays reproducible.
    pub fn seeds(mut self, seeds: Seeds) -> Self {
        self.seeds = Some(Arc::new(seeds));
        self
    }

    /// Validates the configuration and builds the layer.
    ///
    /// # Errors
    ///
    /// [`InvalidRetryConfig`] lists the rules.
    pub fn build(self) -> Result<RetryLayer, InvalidRetryConfig> {
        if self.max_attempts == 0 {
            return Err(InvalidRetryConfig::ZeroMaxAttempts);
        }
        if self.deadline.is_some_and(|d| d.is_zero()) {
            return Err(InvalidRetryConfig::ZeroDeadline);
        }
        if self.attempt_timeout.is_some_and(|d| d.is_zero()) {
            return Err(InvalidRetryConfig::ZeroAttemptTimeout);
        }
        Ok(self.finish())
    }

    fn finish(self) -> RetryLayer {
        RetryLayer {
            config: Arc::new(Config {
                max_attempts: self.max_attempts,
                deadline: self.deadline,
                attempt_timeout: self.attempt_timeout,
                backoff: self
                    .backoff
                    .unwrap_or_else(|| Arc::new(Exponential::default())),
                budget: self
                    .budget
                    .unwrap_or_else(|| Arc::new(RetryBudget::default())),
                classifier: self
                    .classifier
                    .unwrap_or_else(|| Arc::new(DefaultClassifier)),
                body_limit: self.body_limit,
                seeds: self.seeds.unwrap_or_else(|| Arc::new(Seeds::from_os())),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_configurations_cannot_be_built() {
        assert_eq!(
            RetryLayer::builder().max_attempts(0).build().unwrap_err(),
            InvalidRetryConfig::ZeroMaxAttempts
        );
        assert_eq!(
            RetryLayer::builder()
                .deadline(Duration::ZERO)
                .build()
                .unwrap_err()
                .to_string(),
            "deadline must be greater than zero"
        );
        assert_eq!(
            RetryLayer::builder()
                .attempt_timeout(Duration::ZERO)
                .build()
                .unwrap_err(),
            InvalidRetryConfig::ZeroAttemptTimeout
        );
        assert!(RetryLayer::builder().max_attempts(1).build().is_ok());
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let layer = RetryLayer::new();
        let c = &layer.config;
        assert_eq!(c.max_attempts, 3);
        assert_eq!(c.body_limit, 64 * 1024);
        assert_eq!(c.deadline, None);
        assert_eq!(c.attempt_timeout, None);
        assert_eq!(c.backoff.max_delay(), Duration::from_secs(15 * 60));
    }

    fn assert_send_sync_clone<T: Send + Sync + Clone>() {}

    #[test]
    fn layer_and_service_are_send_sync_clone() {
        assert_send_sync_clone::<RetryLayer>();
        assert_send_sync_clone::<Retry<()>>();
    }
}
