//! Retry budgets: the share of retries a client may add to its load.
//!
//! A budget is consulted by the retry layer: every first attempt is a
//! [`deposit`](Budget::deposit), every retry must first succeed at a
//! [`withdraw`](Budget::withdraw). A refused withdrawal ends the request with its last
//! outcome instead of retrying.

/// A retry budget shared by every clone of a client.
///
/// Implementations must be cheap (they are called on every request) and safe to call from
/// many threads at once.
pub trait Budget: Send + Sync + 'static {
    /// Records a request's first attempt, which earns retry allowance.
    fn deposit(&self);

    /// Tries to spend one retry; `true` if the retry may go ahead.
    fn withdraw(&self) -> bool;
}

/// No budget: every retry is allowed. Max attempts and the deadline still bound retries.
///
/// Useful in tests and for clients that are the only caller of a service they own; in a
/// fleet it lets a failing dependency see up to max-attempts times its normal load.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unlimited;

impl Budget for Unlimited {
    fn deposit(&self) {}

    fn withdraw(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_always_allows() {
        let b = Unlimited;
        for _ in 0..1000 {
            assert!(b.withdraw());
        }
        b.deposit();
        assert!(b.withdraw());
    }
}
