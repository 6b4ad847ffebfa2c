//! A retry budget that counts its refusals.

use backoff_layer::budget::Budget;

use crate::record::{Event, Recorder};

/// A retry budget that records every refusal of the budget it wraps as
/// [`Event::BudgetRefusal`].
#[derive(Debug, Clone)]
pub struct CountingBudget<B> {
    inner: B,
    recorder: Recorder,
}

impl<B> CountingBudget<B> {
    /// Wraps `budget`, recording into `recorder`.
    pub const fn new(budget: B, recorder: Recorder) -> Self {
        Self {
            inner: budget,
            recorder,
        }
    }

    overload_core::define_inner_service_accessors!(B);
}

impl<B: Budget> Budget for CountingBudget<B> {
    fn deposit(&self) {
        self.inner.deposit();
    }

    fn withdraw(&self) -> bool {
        let allowed = self.inner.withdraw();
        if !allowed {
            self.recorder.record(Event::BudgetRefusal);
        }
        allowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn counting_budget_counts_refusals_only() {
        struct Alternate(AtomicU32);
        impl Budget for Alternate {
            fn deposit(&self) {}
            fn withdraw(&self) -> bool {
                self.0.fetch_add(1, Ordering::Relaxed) % 2 == 0
            }
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let recorder = Recorder::new();
        let budget = CountingBudget::new(Alternate(AtomicU32::new(0)), recorder.clone());
        budget.deposit();
        let allowed = (0..4).filter(|_| budget.withdraw()).count();
        assert_eq!(allowed, 2);
        assert_eq!(recorder.totals(0, 1).budget_refusals, 2);
    }
}
