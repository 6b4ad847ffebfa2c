//! Retry budgets: the share of retries a client may add to its load.
//!
//! A budget is consulted by the retry layer: every first attempt is a
//! [`deposit`](Budget::deposit), every retry must first succeed at a
//! [`withdraw`](Budget::withdraw). A refused withdrawal ends the request with its last
//! outcome instead of retrying.
//!
//! Max attempts bound the retries of *one* request; they do nothing for a fleet whose
//! dependency is failing: with 3 attempts per request, a failing service sees 3 times its
//! normal load, and 3 tiers that each retry 3 times multiply that to 27 times. A budget
//! bounds the retries of *all* requests together: with [`RetryBudget`]'s default of 10%,
//! a failing dependency sees at most about 1.1 times its normal load from this client.
//!
//! # Examples
//!
//! The defaults (10% of first attempts over 10 seconds, plus 1 retry per second):
//!
//! ```
//! use backoff_layer::budget::{Budget, RetryBudget};
//!
//! let budget = RetryBudget::new();
//! for _ in 0..100 {
//!     budget.deposit(); // 100 first attempts earn 10 retries, plus the floor of 10
//! }
//! let allowed = (0..100).filter(|_| budget.withdraw()).count();
//! assert_eq!(allowed, 20);
//! ```
//!
//! A customised budget, on the coarse clock:
//!
//! ```
//! use std::time::Duration;
//! use backoff_layer::budget::{Budget, RetryBudget};
//! use overload_core::clock::CoarseClock;
//!
//! let budget = RetryBudget::builder()
//!     .ratio(0.6)
//!     .window(Duration::from_secs(30))
//!     .slots(30)
//!     .min_retries_per_sec(0)
//!     .clock(CoarseClock::new())
//!     .build()?;
//! for _ in 0..10 {
//!     budget.deposit();
//! }
//! // Exactly 60% of 10 first attempts: 6 retries, not one more.
//! assert_eq!((0..10).filter(|_| budget.withdraw()).count(), 6);
//!
//! // Invalid configuration cannot be built, and the error names the setting.
//! let err = RetryBudget::builder().ratio(f64::NAN).build().unwrap_err();
//! assert_eq!(err.field(), "ratio");
//! assert_eq!(err.to_string(), "ratio must be a finite number, got NaN");
//! # Ok::<(), backoff_layer::ConfigError>(())
//! ```
//!
//! # Metrics
//!
//! [`RetryBudget`] records, through the [`metrics`] facade (this crate never installs a
//! recorder), two counters labelled with the budget's [name](RetryBudgetBuilder::name):
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `backoff_layer_budget_retries_allowed_total` | counter | `name` | withdrawals that succeeded: retries the budget let through |
//! | `backoff_layer_budget_retries_refused_total` | counter | `name`, `criticality` | withdrawals that were refused: retries the budget stopped, by the level of the request (`sheddable`, `sheddable-plus`, `critical`, `critical-plus`; [`withdraw`](Budget::withdraw) without a level counts as `critical`) |
//!
//! First attempts are not counted here: they happen on every request, and the retry layer's
//! own request metrics already count them.
//!
//! The counters are registered on the budget's first deposit (its first request), with the
//! recorder installed then, and kept: a recorder installed after the budget (or the layer
//! that made it) is built, and before its first request, sees them, at zero until a retry.
//!
//! # Whose name
//!
//! A retry layer built without a budget of yours makes its own [`RetryBudget`], named after
//! the layer ([`RetryBuilder::name`](crate::RetryBuilder::name)): each layer's budget
//! reports under that layer's name. A budget you build and pass to
//! [`budget`](crate::RetryBuilder::budget) or
//! [`shared_budget`](crate::RetryBuilder::shared_budget) has the name you give it with
//! [`RetryBudgetBuilder::name`] (`"default"` otherwise), whichever layers share it: it is
//! one budget, so one series per counter, and its refusals are logged once, not once per
//! layer. Name a shared budget after the downstream it protects.
//!
//! # Logs
//!
//! A [`RetryBudget`] that starts refusing retries logs it once, at `WARN`, with the field
//! `name` (its name), and once more, at `INFO` with `lasted_ms`, when it has refused none
//! for a whole window (10 s by default; every refusal has then left the window), not once
//! per refusal. The end is noticed by the budget's next deposit or withdrawal, that is the
//! next request: a client that stops sending during a refusing episode logs its end when it
//! sends again, with `lasted_ms` measured up to the last refusal all the same. No task
//! runs for it.

mod contract;
mod retry_budget;
mod telemetry;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

pub use contract::{Budget, Unlimited};
pub use retry_budget::{RetryBudget, RetryBudgetBuilder};
