//! The paper's M/M/c server: c workers, exponential service times, one FIFO queue.

use std::num::NonZeroUsize;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp1};

use super::error::InvalidModel;

/// The paper's server: `workers` threads take requests from one unbounded FIFO queue and
/// serve each for an exponentially distributed time with mean `mean_service`. A request's
/// response time is its wait in the queue plus its service time. Poisson arrivals make it an
/// M/M/c queue, whose mean response time is given by the Erlang C formula.
///
/// Defaults (the paper's): 10 workers, mean service time 50 ms, so the server saturates at
/// 200 req/s.
///
/// # Randomness
///
/// Request `n` (counted from 0 in the order requests enter the model) draws its service time
/// from a generator seeded with `seed` and `n`, so runs with the same seed and the same
/// arrival order get the same service times, and no two requests share a generator state.
/// The seed is random unless set with [`MmcModelBuilder::seed`].
///
/// Service times are rounded to the nearest millisecond, the resolution of tokio's timer:
/// the timer rounds a sleep up to the next millisecond, which would otherwise lengthen every
/// service by half a millisecond on average and bias the queue near saturation.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use demo_server::model::MmcModel;
///
/// let paper = MmcModel::builder().seed(7).build()?;
/// assert_eq!(paper.workers().get(), 10);
/// assert_eq!(paper.mean_service(), Duration::from_millis(50));
/// assert_eq!(paper.capacity(), 200.0);
/// # Ok::<(), demo_server::model::InvalidModel>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmcModel {
    workers: NonZeroUsize,
    mean_service: Duration,
    seed: u64,
}

impl MmcModel {
    /// A builder starting from the defaults.
    pub fn builder() -> MmcModelBuilder {
        MmcModelBuilder {
            workers: NonZeroUsize::new(10).expect("10 is not zero"),
            mean_service: Duration::from_millis(50),
            seed: None,
        }
    }

    /// The number of workers (`c`).
    pub fn workers(&self) -> NonZeroUsize {
        self.workers
    }

    /// The mean service time (`1 / mu`).
    pub fn mean_service(&self) -> Duration {
        self.mean_service
    }

    /// The seed of the service times.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The most requests per second the workers can serve: `c / mean_service`.
    pub fn capacity(&self) -> f64 {
        self.workers.get() as f64 / self.mean_service.as_secs_f64()
    }

    /// The service time of request number `n`, rounded to the millisecond.
    pub fn service_time(&self, n: u64) -> Duration {
        // NOTE: mixing the sequence number through a SplitMix-style constant keeps the seeds of
        // consecutive requests far apart, so their generators are unrelated.
        let mut rng = SmallRng::seed_from_u64(self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let unit: f64 = Exp1.sample(&mut rng);
        let millis = (unit * self.mean_service.as_secs_f64() * 1e3).round();
        // NOTE: `unit` is finite and non-negative, and a mean of at most a day keeps
        // `millis` far below u64::MAX; the conversion saturates anyway.
        Duration::from_millis(millis as u64)
    }
}

impl Default for MmcModel {
    /// The paper's server (10 workers, 50 ms) with a random seed.
    fn default() -> Self {
        Self::builder()
            .build()
            .expect("the default parameters are valid")
    }
}

/// Builds an [`MmcModel`]; every setter starts from the defaults.
#[derive(Clone, Debug)]
pub struct MmcModelBuilder {
    workers: NonZeroUsize,
    mean_service: Duration,
    seed: Option<u64>,
}

impl MmcModelBuilder {
    /// The number of workers. Default 10.
    pub fn workers(mut self, workers: NonZeroUsize) -> Self {
        self.workers = workers;
        self
    }

    /// The mean service time. Default 50 ms.
    pub fn mean_service(mut self, mean: Duration) -> Self {
        self.mean_service = mean;
        self
    }

    /// The seed of the service times. Default: a random seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks the parameters.
    ///
    /// # Errors
    ///
    /// [`InvalidModel`] when the mean service time is zero or longer than one day.
    pub fn build(self) -> Result<MmcModel, InvalidModel> {
        if self.mean_service.is_zero() {
            return Err(InvalidModel::new("mmc mean service time must not be zero"));
        }
        if self.mean_service > Duration::from_secs(86_400) {
            return Err(InvalidModel::new(
                "mmc mean service time must be at most one day",
            ));
        }
        Ok(MmcModel {
            workers: self.workers,
            mean_service: self.mean_service,
            seed: self.seed.unwrap_or_else(rand::random),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_times_are_exponential_with_the_mean() {
        let m = MmcModel::builder().seed(1).build().unwrap();
        let n = 200_000;
        let times: Vec<f64> = (0..n).map(|i| m.service_time(i).as_secs_f64()).collect();
        let mean = times.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.05).abs() < 0.05 * 0.01, "mean {mean}");
        // Exponential: P(X > mean) = e^-1.
        let above = times.iter().filter(|&&t| t > 0.05).count() as f64 / n as f64;
        assert!(
            (above - (-1f64).exp()).abs() < 0.01,
            "share above mean {above}"
        );
    }

    #[test]
    fn same_seed_same_times_different_requests_differ() {
        let a = MmcModel::builder().seed(42).build().unwrap();
        let b = MmcModel::builder().seed(42).build().unwrap();
        let c = MmcModel::builder().seed(43).build().unwrap();
        let sa: Vec<_> = (0..100).map(|i| a.service_time(i)).collect();
        let sb: Vec<_> = (0..100).map(|i| b.service_time(i)).collect();
        let sc: Vec<_> = (0..100).map(|i| c.service_time(i)).collect();
        assert_eq!(sa, sb);
        assert_ne!(sa, sc);
        let distinct: std::collections::HashSet<_> = sa.iter().collect();
        assert!(distinct.len() > 50, "{} distinct of 100", distinct.len());
    }

    #[test]
    fn invalid_parameters_are_refused() {
        let zero = MmcModel::builder().mean_service(Duration::ZERO).build();
        assert_eq!(
            zero.unwrap_err().to_string(),
            "mmc mean service time must not be zero"
        );
        let long = MmcModel::builder()
            .mean_service(Duration::from_secs(86_401))
            .build();
        assert!(long.is_err());
    }
}
