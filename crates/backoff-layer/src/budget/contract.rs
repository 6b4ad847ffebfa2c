//! [`Budget`], the contract between the retry layer and a retry budget, and [`Unlimited`].

use overload_signal::protocol::Criticality;

/// A retry budget shared by every clone of a client.
///
/// Implementations must be cheap (they are called on every request) and safe to call from
/// many threads at once.
///
/// The retry layer calls the `_at` methods with each request's [`Criticality`] (the level it
/// carries on the wire; `critical` when it carries none). Their defaults ignore the level and
/// call [`deposit`](Self::deposit) and [`withdraw`](Self::withdraw), so a budget written
/// before levels existed works unchanged; [`RetryBudget`](super::RetryBudget) sheds lower
/// levels' retries first.
pub trait Budget: Send + Sync + 'static {
    /// Records a request's first attempt, which earns retry allowance.
    fn deposit(&self);

    /// Tries to spend one retry; `true` if the retry may go ahead.
    fn withdraw(&self) -> bool;

    /// Records the first attempt of a request of `level`. Default: [`deposit`](Self::deposit).
    fn deposit_at(&self, level: Criticality) {
        let _ = level;
        self.deposit();
    }

    /// Tries to spend one retry for a request of `level`. Default:
    /// [`withdraw`](Self::withdraw).
    fn withdraw_at(&self, level: Criticality) -> bool {
        let _ = level;
        self.withdraw()
    }
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
