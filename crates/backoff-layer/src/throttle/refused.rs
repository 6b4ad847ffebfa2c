//! [`Throttled`]: what a caller gets for a request the throttle refused, and how to
//! recognise it.

use std::error::Error;
use std::fmt;

/// The retry layer's client-side throttle refused the request: its destination has been
/// failing, so the request was **not sent**, and it failed at once.
///
/// Refused requests are a share of the requests to a failing destination (at most
/// [`Throttle::DEFAULT_MAX_PROBABILITY`](super::Throttle::DEFAULT_MAX_PROBABILITY), 90 %, by
/// default); the rest still go, as probes, so the throttle sees the destination come back.
/// It is final for every retry layer: none retries it (another attempt now would most likely
/// be refused too), and it is never counted as an outcome of the destination.
///
/// Match it with `err.is::<Throttled>()`, or with [`is_throttled`] anywhere in a source
/// chain (a tonic `Status` made by `RetryLayer::for_tonic` is `UNAVAILABLE` with a
/// `Throttled` as its source):
///
/// ```
/// use backoff_layer::{BoxError, Throttled, is_throttled};
///
/// # fn handle(err: BoxError) {
/// if let Some(throttled) = err.downcast_ref::<Throttled>() {
///     // not sent: degrade, serve from a cache, or fail fast upstream
///     let _share_refused = throttled.probability();
/// }
/// # let _ = is_throttled(&*err);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throttled {
    probability: f64,
}

impl Throttled {
    pub(crate) const fn new(probability: f64) -> Self {
        Self { probability }
    }

    /// The destination's refusal probability when the request was refused (within 0..=1).
    pub const fn probability(&self) -> f64 {
        self.probability
    }
}

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request not sent: client-side throttling refuses {:.0} % of the requests to a \
             destination that keeps failing",
            self.probability * 100.0
        )
    }
}

impl Error for Throttled {}

/// Whether `error`, or an error in its `source()` chain, is a [`Throttled`]: the request was
/// refused by a client-side throttle and never sent.
pub fn is_throttled(error: &(dyn Error + 'static)) -> bool {
    std::iter::successors(Some(error), |&e| e.source()).any(|e| e.is::<Throttled>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(Throttled);

    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapped")
        }
    }

    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn it_says_what_happened_and_is_found_in_a_chain() {
        let t = Throttled::new(0.9);
        assert_eq!(
            t.to_string(),
            "request not sent: client-side throttling refuses 90 % of the requests to a \
             destination that keeps failing"
        );
        assert!(is_throttled(&t));
        assert!(is_throttled(&Wrapper(t)));
        assert!(!is_throttled(&std::io::Error::other("x")));
        let boxed: crate::BoxError = Box::new(t);
        assert!(boxed.is::<Throttled>());
    }
}
