//! The typed "stop retrying" outcome.

use std::fmt;

/// The system is overloaded: a server answered with the stop signal, so the request must not
/// be retried, by this client or by any tier above it.
///
/// Client middleware (such as `backoff-layer`'s retry) returns this as its error, boxed, so
/// callers can match it with `err.is::<Overloaded>()` or `downcast_ref::<Overloaded>()`.
/// A server that gets it back from a downstream call should answer its own caller with the
/// stop signal (see [`propagation`](crate::propagation)).
///
/// ```
/// use overload_signal::Overloaded;
///
/// let err: Box<dyn std::error::Error + Send + Sync> = Box::new(Overloaded::new());
/// assert!(err.is::<Overloaded>());
/// assert_eq!(err.to_string(), "system overloaded: stop retrying");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overloaded {
    _priv: (),
}

impl Overloaded {
    /// A new `Overloaded` error.
    pub const fn new() -> Self {
        Self { _priv: () }
    }
}

impl fmt::Display for Overloaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("system overloaded: stop retrying")
    }
}

impl std::error::Error for Overloaded {}

/// Whether `err`, or any error in its `source()` chain, is [`Overloaded`].
///
/// Layers box errors (`tower::BoxError`), and some wrap them further; this looks through
/// both.
pub fn is_overloaded(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if e.is::<Overloaded>() {
            return true;
        }
        cur = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(Box<dyn std::error::Error + Send + Sync>);
    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "wrapped: {}", self.0)
        }
    }
    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.0)
        }
    }

    #[test]
    fn found_through_source_chain() {
        let e = Wrapper(Box::new(Wrapper(Box::new(Overloaded::new()))));
        assert!(is_overloaded(&e));
        let other = Wrapper(Box::new(std::io::Error::other("boom")));
        assert!(!is_overloaded(&other));
    }
}
