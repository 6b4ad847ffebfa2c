//! [`Budget`], the contract between the retry layer and a retry budget, and [`Unlimited`].

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
