//! The one trait the retry layer knows, [`Backoff`], and the delay sequence of a strategy.

use std::fmt;
use std::time::Duration;

use rand::RngCore;

/// A backoff strategy: the delay before each retry of one request.
///
/// Implementations are shared by every request of a client (the retry layer holds them in an
/// `Arc`), so they must be immutable or internally synchronised; per-request state is passed
/// in. They must not panic for any `retry` (up to `u32::MAX`) nor any `previous` delay.
pub trait Backoff: fmt::Debug + Send + Sync + 'static {
    /// The delay before retry number `retry` of a request: `0` before the first retry (the
    /// second attempt), `1` before the second, and so on.
    ///
    /// `previous` is what this strategy returned for the previous retry of the same request
    /// (`None` before the first retry); `rng` is the request's own generator.
    fn next_delay(&self, retry: u32, previous: Option<Duration>, rng: &mut dyn RngCore)
    -> Duration;

    /// The largest delay this strategy means to wait.
    ///
    /// It bounds the strategy's own waits only: a server's `Retry-After` or
    /// `grpc-retry-pushback-ms` hint may lengthen a wait beyond it, up to the retry layer's
    /// `max_retry_after`. [`Exponential`](super::Exponential)'s jitter may take a single
    /// delay slightly above it.
    fn max_delay(&self) -> Duration;

    /// The infinite sequence of delays one request would see, drawn from `rng`.
    fn delays<R: RngCore>(&self, rng: R) -> Delays<'_, Self, R>
    where
        Self: Sized,
    {
        delays(self, rng)
    }
}

/// The infinite sequence of delays of `backoff` for one request whose generator is `rng`.
///
/// Works on trait objects too (`&dyn Backoff`).
pub fn delays<B: Backoff + ?Sized, R: RngCore>(backoff: &B, rng: R) -> Delays<'_, B, R> {
    Delays {
        backoff,
        rng,
        retry: 0,
        previous: None,
    }
}

/// The iterator returned by [`delays`]; never ends.
#[derive(Debug)]
pub struct Delays<'a, B: ?Sized, R> {
    backoff: &'a B,
    rng: R,
    retry: u32,
    previous: Option<Duration>,
}

impl<B: Backoff + ?Sized, R: RngCore> Iterator for Delays<'_, B, R> {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self
            .backoff
            .next_delay(self.retry, self.previous, &mut self.rng);
        self.retry = self.retry.saturating_add(1);
        self.previous = Some(d);
        Some(d)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}
