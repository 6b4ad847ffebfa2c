//! The decision rule: when a rejection becomes the stop signal.

use crate::histogram::AttemptSnapshot;
use overload_core::ConfigError;

/// When a rejected request is answered with the stop signal instead of the plain rejection.
///
/// The rule fires when the window holds **at least [`min_requests`](StopRule::min_requests)**
/// requests **and** its [retry pressure](AttemptSnapshot::retry_pressure) is **strictly
/// above [`retry_share`](StopRule::retry_share)**. The retry pressure is the share of the
/// window's requests that were retries, or that the layer answered with the stop signal
/// (each of those stands for the retry it held back); with
/// [`sustain(false)`](StopRuleBuilder::sustain) it is the plain
/// [retry share](AttemptSnapshot::retry_share). The
/// [`OverloadSignalLayer`](crate::OverloadSignalLayer) applies the rule to the whole
/// server's window, plain and with each caller class's weight bounded, or to one caller's
/// class (see [`signal`](crate::signal#trust-what-callers-can-and-cannot-do)).
///
/// # Defaults and why
///
/// - **Retry pressure above 5 %** ([`StopRule::DEFAULT_RETRY_SHARE`]). Steady traffic with a
///   failure rate `p` whose failures are retried has a retry share of about `p` (each
///   failure adds one retry, a second retry only `p²`): about 1 % for 1 % transient failures,
///   five times below the threshold. At the other end, clients that keep to the usual 10 %
///   retry budget (the paper, the SRE book) cannot push the share above about 9 %
///   (10 retries per 100 first tries) however badly the server fails; a threshold at or above
///   10 % would never fire for them, and the stop signal would only ever reach clients
///   without a budget. Half the budget is the middle ground: the fleet has spent half its
///   retry allowance on this server, which transient failures do not do.
/// - **At least 200 requests in the window** ([`StopRule::DEFAULT_MIN_REQUESTS`]), 20 per
///   second over the default 10-second window. A share needs enough requests to mean
///   something: with 1 % failures and 200 requests the expected number of retries is 2, and
///   the chance of more than 10 (over 5 %) is below 1 in 100,000; with 100 requests it would
///   be 1 in 1,700. A server with less traffic than that is not the victim of a retry storm
///   that this rule could help with, and still has its rate limiter and its clients' budgets.
/// - **Sustained** ([`StopRule::DEFAULT_SUSTAIN`]). Callers obey the stop signal: they stop
///   retrying, so with retries alone the share falls back under the threshold as their
///   retries leave the window, the signal lapses while the server is as overloaded as before,
///   their retries come back until the share passes the threshold again, and so on; in a
///   sustained overload the retries settle at about the threshold, and every tier above
///   retries during the lapses too. Counting each stop signal sent to a first try as the retry
///   it held back keeps the pressure where the storm put it for as long as the server keeps
///   rejecting more than the threshold of its traffic; once rejections fall below it (or stop
///   for a whole window), so does the pressure, and the signal lapses. It never starts the
///   signal: only retries do, and transient failures at 1 % keep the pressure at 1 %.
///
/// # Deep call chains
///
/// The rule bounds the retries of a server's *own* callers. A tier further up retries the
/// middle tier, and its retries reach the bottom tier as *first* tries, which the bottom
/// tier cannot tell apart; each tier's retries add up. They are only sent while the signal is
/// not flowing, which a sustained rule keeps short: in the workspace's three-tier test (10 %
/// client budgets at every tier, the bottom tier admitting 40 % of the offered load) the
/// bottom tier receives at most 1.10 times the offered load with the defaults (see
/// `BENCHMARKS.md` for the runs), against about 1.38 times with budgets alone. Without
/// `sustain`, the same chain measured 1.11 to 1.14 times with the default threshold, and
/// needed a threshold of 2 % over 100 requests, too close to ordinary failure rates, to
/// reach 1.07 times.
///
/// ```
/// use overload_signal::{AttemptSnapshot, StopRule};
///
/// let rule = StopRule::new();
/// assert_eq!(rule.retry_share(), 0.05);
/// assert_eq!(rule.min_requests(), 200);
///
/// // Counts per class: attempt 0, 1, 2, 3+, unknown, malformed.
/// let storm = AttemptSnapshot::from_counts([300, 200, 100, 0, 0, 0]);
/// assert!(rule.should_stop(&storm));
/// let transient = AttemptSnapshot::from_counts([990, 10, 0, 0, 0, 0]);
/// assert!(!rule.should_stop(&transient));
/// let too_few = AttemptSnapshot::from_counts([50, 50, 0, 0, 0, 0]);
/// assert!(!rule.should_stop(&too_few));
///
/// // Sustained: callers obeyed and stopped retrying, but 600 of the window's 1000 first
/// // tries were answered with the stop signal, so it keeps flowing.
/// let obeyed = AttemptSnapshot::from_counts([1000, 0, 0, 0, 0, 0]).with_stopped(600);
/// assert!(rule.should_stop(&obeyed));
/// let paper = StopRule::builder().sustain(false).build()?;
/// assert!(!paper.should_stop(&obeyed));
///
/// // Stricter: a quarter of the traffic must be retries, over at least 1000 requests.
/// let strict = StopRule::builder()
///     .retry_share(0.25)
///     .min_requests(1000)
///     .build()?;
/// assert!(!strict.should_stop(&storm));
///
/// // Settings are checked by name.
/// let err = StopRule::builder().retry_share(1.5).build().unwrap_err();
/// assert_eq!(err.field(), "retry_share");
/// assert_eq!(err.to_string(), "retry_share must be within 0..1 (the rule fires strictly above it), got 1.5");
/// # Ok::<(), overload_core::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StopRule {
    retry_share: f64,
    min_requests: u64,
    sustain: bool,
}

impl StopRule {
    /// The default retry-share threshold: 0.05 (5 %), half the usual 10 % client retry
    /// budget. See [`StopRule`] for the reasoning.
    pub const DEFAULT_RETRY_SHARE: f64 = 0.05;

    /// The default minimum number of requests in the window: 200 (20 per second over the
    /// default 10-second window). See [`StopRule`] for the reasoning.
    pub const DEFAULT_MIN_REQUESTS: u64 = 200;

    /// Whether the rule is sustained by default: `true`. See [`StopRule`] for the reasoning.
    pub const DEFAULT_SUSTAIN: bool = true;

    /// The default rule: retry share above [5 %](StopRule::DEFAULT_RETRY_SHARE) with at
    /// least [200 requests](StopRule::DEFAULT_MIN_REQUESTS) in the window.
    pub const fn new() -> Self {
        Self {
            retry_share: Self::DEFAULT_RETRY_SHARE,
            min_requests: Self::DEFAULT_MIN_REQUESTS,
            sustain: Self::DEFAULT_SUSTAIN,
        }
    }

    /// A builder that starts from the defaults.
    pub const fn builder() -> StopRuleBuilder {
        StopRuleBuilder { rule: Self::new() }
    }

    /// A builder that starts from this rule's settings: to change one of them, e.g. the
    /// threshold of the rule a layer is using
    /// ([`OverloadSignalLayer::set_rule`](crate::OverloadSignalLayer::set_rule)).
    ///
    /// ```
    /// use overload_signal::StopRule;
    ///
    /// let strict = StopRule::builder().min_requests(1000).build()?;
    /// let raised = strict.to_builder().retry_share(0.10).build()?;
    /// assert_eq!((raised.retry_share(), raised.min_requests()), (0.10, 1000));
    /// # Ok::<(), overload_core::ConfigError>(())
    /// ```
    pub const fn to_builder(self) -> StopRuleBuilder {
        StopRuleBuilder { rule: self }
    }

    /// The retry-share threshold: the rule fires strictly above it.
    pub const fn retry_share(&self) -> f64 {
        self.retry_share
    }

    /// The fewest requests the window must hold for the rule to fire.
    pub const fn min_requests(&self) -> u64 {
        self.min_requests
    }

    /// Whether requests the layer answered with the stop signal count as retries
    /// ([`AttemptSnapshot::retry_pressure`]) rather than not at all
    /// ([`AttemptSnapshot::retry_share`]).
    pub const fn sustain(&self) -> bool {
        self.sustain
    }

    /// Whether a rejection seen with this window should become the stop signal: at least
    /// [`min_requests`](Self::min_requests) requests, and a
    /// [retry pressure](AttemptSnapshot::retry_pressure) (a
    /// [retry share](AttemptSnapshot::retry_share) if the rule is not
    /// [sustained](Self::sustain)) strictly above [`retry_share`](Self::retry_share).
    pub fn should_stop(&self, window: &AttemptSnapshot) -> bool {
        self.fires(window.total(), self.judged_share(window))
    }

    /// The figure of `window` the rule compares with its threshold: the retry pressure when
    /// it is sustained, the retry share otherwise; `None` for an empty window.
    pub(crate) fn judged_share(&self, window: &AttemptSnapshot) -> Option<f64> {
        if self.sustain {
            window.retry_pressure()
        } else {
            window.retry_share()
        }
    }

    /// The rule on bare figures: `requests` in the window, and the share of them that count
    /// (`None` for an empty window).
    pub(crate) fn fires(&self, requests: u64, share: Option<f64>) -> bool {
        requests >= self.min_requests && share.is_some_and(|share| share > self.retry_share)
    }
}

impl Default for StopRule {
    /// The same as [`StopRule::new`]: retry share above 5 %, at least 200 requests.
    fn default() -> Self {
        Self::new()
    }
}

/// Builds a [`StopRule`]; every setting starts at its default.
#[derive(Clone, Copy, Debug)]
pub struct StopRuleBuilder {
    rule: StopRule,
}

impl StopRuleBuilder {
    /// The retry-share threshold; the rule fires strictly above it. Default: 0.05 (5 %),
    /// half the usual 10 % client retry budget (the paper, the SRE book).
    ///
    /// Must be a finite number within `0..1`: at 1 or above the rule could never fire, as
    /// the share is at most 1.
    pub const fn retry_share(mut self, retry_share: f64) -> Self {
        self.rule.retry_share = retry_share;
        self
    }

    /// The fewest requests the window must hold for the rule to fire. Default: 200 (20 per
    /// second over the default 10-second window), enough for a 5 % share not to be noise.
    ///
    /// Must be at least 1.
    pub const fn min_requests(mut self, min_requests: u64) -> Self {
        self.rule.min_requests = min_requests;
        self
    }

    /// Whether a request that was not a retry, and that the layer answered with the stop
    /// signal, counts as a retry: the retry the signal held back
    /// ([`AttemptSnapshot::retry_pressure`]). Default: `true`, so that once a retry storm is
    /// detected the signal lasts while the server keeps rejecting more than the threshold of
    /// its traffic, instead of lapsing as soon as its callers obey it (see [`StopRule`]).
    ///
    /// With `false`, only retries count ([`AttemptSnapshot::retry_share`]), as in the paper:
    /// the signal lapses once obeying callers have let their retries leave the window, and
    /// comes back when their retries have filled it again.
    pub const fn sustain(mut self, sustain: bool) -> Self {
        self.rule.sustain = sustain;
        self
    }

    /// Builds the rule.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting when `retry_share` is not a finite number within
    /// `0..1`, or `min_requests` is 0.
    pub fn build(self) -> Result<StopRule, ConfigError> {
        let share = self.rule.retry_share;
        if !share.is_finite() {
            return Err(ConfigError::not_finite("retry_share", share));
        }
        if !(0.0..1.0).contains(&share) {
            return Err(ConfigError::out_of_range(
                "retry_share",
                share,
                "within 0..1 (the rule fires strictly above it)",
            ));
        }
        if self.rule.min_requests == 0 {
            return Err(ConfigError::out_of_range(
                "min_requests",
                0u64,
                "at least 1",
            ));
        }
        Ok(self.rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use overload_core::ConfigErrorKind;

    fn snap(first: u64, retries: u64, unknown: u64) -> AttemptSnapshot {
        AttemptSnapshot::from_counts([first, retries, 0, 0, unknown, 0])
    }

    fn rule(share: f64, min: u64) -> StopRule {
        StopRule::builder()
            .retry_share(share)
            .min_requests(min)
            .build()
            .unwrap()
    }

    #[test]
    fn invalid_rules_are_refused_by_name() {
        for share in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let e = StopRule::builder().retry_share(share).build().unwrap_err();
            assert_eq!(
                (e.field(), e.kind()),
                ("retry_share", ConfigErrorKind::NotFinite)
            );
            assert_eq!(
                e.to_string(),
                format!("retry_share must be a finite number, got {share}")
            );
        }
        for share in [-0.01, 1.0, 1.5] {
            let e = StopRule::builder().retry_share(share).build().unwrap_err();
            assert_eq!(
                (e.field(), e.kind()),
                ("retry_share", ConfigErrorKind::OutOfRange)
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "retry_share must be within 0..1 (the rule fires strictly above it), got {share:?}"
                )
            );
        }
        let e = StopRule::builder().min_requests(0).build().unwrap_err();
        assert_eq!(e.field(), "min_requests");
        assert_eq!(e.to_string(), "min_requests must be at least 1, got 0");
        assert_eq!(rule(0.0, 1).min_requests(), 1);
        assert_eq!(rule(0.999, u64::MAX).min_requests(), u64::MAX);
    }

    #[test]
    fn fires_strictly_above_the_share_and_at_the_minimum() {
        let rule = rule(0.1, 100);
        // Exactly 10 %: not above.
        assert!(!rule.should_stop(&snap(90, 10, 0)));
        // Just above, with exactly the minimum.
        assert!(rule.should_stop(&snap(89, 11, 0)));
        // Same share, one request short of the minimum.
        assert!(!rule.should_stop(&snap(88, 11, 0)));
        // Empty window.
        assert!(!rule.should_stop(&AttemptSnapshot::default()));
    }

    #[test]
    fn unknown_counters_count_towards_the_minimum_but_dilute_the_share() {
        let rule = rule(0.1, 100);
        // 20 retries of 100: fires.
        assert!(rule.should_stop(&snap(80, 20, 0)));
        // Same retries, 150 requests without a counter: 20 of 250 = 8 %, quiet.
        assert!(!rule.should_stop(&snap(80, 20, 150)));
    }

    #[test]
    fn zero_threshold_fires_on_any_retry() {
        let rule = rule(0.0, 1);
        assert!(!rule.should_stop(&snap(5, 0, 0)));
        assert!(rule.should_stop(&snap(5, 1, 0)));
    }

    #[test]
    fn sustained_rules_count_what_the_signal_held_back() {
        let sustained = rule(0.05, 100);
        let paper = StopRule::builder()
            .retry_share(0.05)
            .min_requests(100)
            .sustain(false)
            .build()
            .unwrap();
        assert!(sustained.sustain() && !paper.sustain());
        // Retries alone: the same verdicts.
        for retries in [0, 5, 6, 50] {
            let window = snap(100 - retries, retries, 0);
            assert_eq!(sustained.should_stop(&window), paper.should_stop(&window));
        }
        // Retries that obeyed: stop signals sent to first tries keep the pressure up.
        let window = snap(100, 2, 0).with_stopped(4);
        assert!(sustained.should_stop(&window));
        assert!(!paper.should_stop(&window));
        // Never above the requests: 10 retries and 100 stopped first tries of 100.
        assert_eq!(
            snap(90, 10, 0).with_stopped(100).retry_pressure(),
            Some(1.0)
        );
        // Without any request, nothing.
        assert!(!sustained.should_stop(&AttemptSnapshot::default().with_stopped(500)));
    }

    #[test]
    fn defaults() {
        let rule = StopRule::new();
        assert!(rule.sustain());
        assert_eq!(rule, StopRule::default());
        assert_eq!(rule, StopRule::builder().build().unwrap());
        assert_eq!(rule, self::rule(0.05, 200));
        // A storm of unbounded retries (3 attempts, everything rejected): 2/3 retries.
        assert!(rule.should_stop(&AttemptSnapshot::from_counts([100, 100, 100, 0, 0, 0])));
        // Budget-keeping clients in a full outage: 10 retries per 100 first tries.
        assert!(rule.should_stop(&snap(1000, 100, 0)));
        // 1 % transient failures, each retried once.
        assert!(!rule.should_stop(&snap(1000, 10, 0)));
        // Low traffic: 199 requests, all retries.
        assert!(!rule.should_stop(&snap(0, 199, 0)));
    }
}
