//! The article's latency model: flat up to a knee, then exponential in the concurrency.

use std::time::Duration;

use super::error::InvalidModel;

/// The article's simulated server: a request takes `base` while at most `knee` requests are
/// inside, then `base * growth^((c - knee) / step)` for a concurrency `c`, re-evaluated every
/// `tick` from the current concurrency, and never more than `max_delay`.
///
/// Defaults (the article's simulation server, except the cap): `base` 100 ms, `knee` 30,
/// `growth` 1.05, `step` 15, `tick` 50 ms. The exponent is a real number: `c = 45` gives
/// 105 ms and `c = 951` 2.000 s (1999.97 ms).
///
/// `max_delay` defaults to 60 s. The original simulation computed the delay in a 64-bit
/// integer of nanoseconds, which overflowed to a negative duration at high concurrency; here
/// the delay is computed in floating point and clamped to `max_delay` (an infinite or
/// oversized value becomes `max_delay`), so no concurrency can overflow it. A minute is far
/// above any sensible client timeout, so the cap does not change what clients see.
///
/// # Re-evaluation
///
/// A request does one unit of work. Every `tick` it reads the current concurrency, computes
/// the delay `D` above, and completes `tick / D` of its work, so its remaining wait follows
/// the current delay: a request that is half done when the concurrency jumps needs half of
/// the new delay to finish. At constant concurrency a request takes exactly `D`.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use demo_server::model::ArticleModel;
///
/// let model = ArticleModel::default();
/// assert_eq!(model.delay(30), Duration::from_millis(100));
/// assert_eq!(model.delay(1_000_000), Duration::from_secs(60));
///
/// let steep = ArticleModel::builder().knee(10).growth(2.0).build()?;
/// assert_eq!(steep.delay(40), Duration::from_millis(400));
/// # Ok::<(), demo_server::model::InvalidModel>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArticleModel {
    base: Duration,
    knee: usize,
    growth: f64,
    step: usize,
    tick: Duration,
    max_delay: Duration,
}

impl ArticleModel {
    /// A builder starting from the defaults.
    pub fn builder() -> ArticleModelBuilder {
        ArticleModelBuilder {
            model: Self::default(),
        }
    }

    /// The delay at `concurrency` requests inside (counting the one asking).
    pub fn delay(&self, concurrency: usize) -> Duration {
        self.delay_with_knee(concurrency, self.knee)
    }

    /// The delay at `concurrency` requests inside, with `knee` in place of this model's
    /// (the model's capacity changed at run time).
    pub(crate) fn delay_with_knee(&self, concurrency: usize, knee: usize) -> Duration {
        if concurrency <= knee {
            return self.base;
        }
        let exponent = (concurrency - knee) as f64 / self.step as f64;
        let secs = self.base.as_secs_f64() * self.growth.powf(exponent);
        // NOTE: `secs` is never negative (base >= 0, growth >= 1); infinity and values past
        // what a `Duration` holds fail the conversion and become the cap, so no concurrency can
        // overflow or panic here.
        Duration::try_from_secs_f64(secs).map_or(self.max_delay, |d| d.min(self.max_delay))
    }

    /// The delay at or below the knee.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The concurrency up to which the delay is [`base`](Self::base).
    pub fn knee(&self) -> usize {
        self.knee
    }

    /// The factor by which the delay grows every [`step`](Self::step) requests above the knee.
    pub fn growth(&self) -> f64 {
        self.growth
    }

    /// How many requests above the knee multiply the delay by [`growth`](Self::growth).
    pub fn step(&self) -> usize {
        self.step
    }

    /// How often a request re-evaluates its delay.
    pub fn tick(&self) -> Duration {
        self.tick
    }

    /// The largest delay.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }
}

impl Default for ArticleModel {
    /// The article's model; see [`ArticleModel`] for the values.
    fn default() -> Self {
        Self {
            base: Duration::from_millis(100),
            knee: 30,
            growth: 1.05,
            step: 15,
            tick: Duration::from_millis(50),
            max_delay: Duration::from_secs(60),
        }
    }
}

/// Builds an [`ArticleModel`]; every setter starts from the defaults.
#[derive(Clone, Debug)]
pub struct ArticleModelBuilder {
    model: ArticleModel,
}

impl ArticleModelBuilder {
    /// The delay at or below the knee. Default 100 ms.
    pub fn base(mut self, base: Duration) -> Self {
        self.model.base = base;
        self
    }

    /// The concurrency up to which the delay is flat. Default 30.
    pub fn knee(mut self, knee: usize) -> Self {
        self.model.knee = knee;
        self
    }

    /// The growth factor per `step` requests above the knee. Default 1.05.
    pub fn growth(mut self, growth: f64) -> Self {
        self.model.growth = growth;
        self
    }

    /// Requests above the knee per growth factor. Default 15.
    pub fn step(mut self, step: usize) -> Self {
        self.model.step = step;
        self
    }

    /// How often a request re-evaluates its delay. Default 50 ms.
    pub fn tick(mut self, tick: Duration) -> Self {
        self.model.tick = tick;
        self
    }

    /// The cap on the delay. Default 60 s.
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.model.max_delay = max_delay;
        self
    }

    /// Checks the parameters.
    ///
    /// # Errors
    ///
    /// [`InvalidModel`] when `base`, `step` or `tick` is zero, `growth` is not a finite
    /// number at least 1, or `max_delay` is below `base`.
    pub fn build(self) -> Result<ArticleModel, InvalidModel> {
        let m = self.model;
        if m.base.is_zero() {
            return Err(InvalidModel::new("article base delay must not be zero"));
        }
        if m.step == 0 {
            return Err(InvalidModel::new("article step must not be zero"));
        }
        if m.tick.is_zero() {
            return Err(InvalidModel::new("article tick must not be zero"));
        }
        if !m.growth.is_finite() || m.growth < 1.0 {
            return Err(InvalidModel::new(
                "article growth must be a finite number of at least 1",
            ));
        }
        if m.max_delay < m.base {
            return Err(InvalidModel::new(
                "article max delay must not be below the base delay",
            ));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1e3
    }

    #[test]
    fn flat_up_to_the_knee() {
        let m = ArticleModel::default();
        for c in [0, 1, 29, 30] {
            assert_eq!(m.delay(c), Duration::from_millis(100), "c = {c}");
        }
    }

    #[test]
    fn grows_above_the_knee() {
        let m = ArticleModel::default();
        // 100 ms * 1.05^1 = 105 ms.
        assert!((ms(m.delay(45)) - 105.0).abs() < 1e-6, "{:?}", m.delay(45));
        // 100 ms * 1.05^(921/15) = 100 ms * 1.05^61.4 = 1999.97 ms.
        let at_951 = ms(m.delay(951));
        assert!((at_951 - 1999.97).abs() < 0.01, "{at_951}");
        assert!(m.delay(31) > m.delay(30));
    }

    #[test]
    fn never_overflows() {
        // Regression: the article's simulation overflowed to a negative delay here.
        let m = ArticleModel::default();
        assert_eq!(m.delay(1_000_000), Duration::from_secs(60));
        assert_eq!(m.delay(usize::MAX), Duration::from_secs(60));
        let huge = ArticleModel::builder()
            .max_delay(Duration::MAX)
            .build()
            .unwrap();
        assert_eq!(huge.delay(usize::MAX), Duration::MAX);
    }

    #[test]
    fn monotonic_in_concurrency() {
        let m = ArticleModel::default();
        let mut last = Duration::ZERO;
        for c in (0..20_000).step_by(7) {
            let d = m.delay(c);
            assert!(d >= last, "c = {c}");
            last = d;
        }
    }

    #[test]
    fn invalid_parameters_are_refused() {
        let cases = [
            ArticleModel::builder().base(Duration::ZERO),
            ArticleModel::builder().step(0),
            ArticleModel::builder().tick(Duration::ZERO),
            ArticleModel::builder().growth(0.5),
            ArticleModel::builder().growth(f64::NAN),
            ArticleModel::builder().growth(f64::INFINITY),
            ArticleModel::builder().max_delay(Duration::from_millis(99)),
        ];
        for b in cases {
            let err = b.clone().build().unwrap_err();
            assert!(err.to_string().starts_with("article "), "{err} for {b:?}");
        }
        assert_eq!(
            ArticleModel::builder().build().unwrap(),
            ArticleModel::default()
        );
    }
}
