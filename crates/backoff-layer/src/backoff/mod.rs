//! Backoff strategies: how long to wait before each retry.
//!
//! Every strategy implements [`Backoff`], the one trait the retry layer knows. A strategy is
//! immutable configuration shared by every request; what changes from one retry to the next
//! (the retry number, the previous delay, the random generator) is passed in, so a strategy
//! never holds per-request state and two requests never share a jitter sequence.
//!
//! | strategy | delay before retry `n` (`n = 0` for the first retry) | defaults | source |
//! |---|---|---|---|
//! | [`Fixed`] | `T` | `T` = 100 ms | the article's simulation client |
//! | [`Exponential`] | `d = min(MinDelay * Factor^n, MaxDelay)`, plus a normal variate with sigma `d * Jitter`, never below zero | 100 ms, 15 min, x2, jitter 0.1 | the article |
//! | [`FullJitter`] | `U(0, min(cap, base * 2^n))` | base 100 ms, cap 20 s | AWS's "Exponential Backoff and Jitter"; values of the AWS SDKs |
//! | [`EqualJitter`] | `t/2 + U(0, t/2)` with `t = min(cap, base * 2^n)` | base 500 ms, cap 20 s | the same article; values of the AWS SDKs for throttling errors |
//! | [`Decorrelated`] | `min(cap, U(base, prev * 3))`, `prev` starting at `base` | base 100 ms, cap 20 s | the same article; [`FullJitter`]'s values |
//! | [`Ethernet`] | `slot * U{0 .. 2^min(n + 1, 10) - 1}` | slot 100 ms | IEEE 802.3 binary exponential backoff |
//!
//! # Construction
//!
//! Every strategy follows the workspace's convention: `new()` gives the defaults above (each
//! is also an associated constant, `Exponential::DEFAULT_FACTOR`), and
//! `builder()` returns a builder with one named setter per setting whose `build()` checks
//! the settings and returns a [`ConfigError`](crate::ConfigError) naming the setting, the
//! value and the rule. The two strategies with a single setting take it in a named
//! constructor instead ([`Fixed::every`], [`Ethernet::with_slot`]), which reads better than a
//! builder of one.
//!
//! ```
//! use std::time::Duration;
//! use backoff_layer::backoff::{Exponential, Fixed};
//!
//! let article = Exponential::new(); // 100 ms, x2, jitter 0.1, at most 15 min
//! let gentle = Exponential::builder()
//!     .min_delay(Duration::from_millis(50))
//!     .max_delay(Duration::from_secs(5))
//!     .factor(1.5)
//!     .jitter(0.2)
//!     .build()?;
//! let every_250_ms = Fixed::every(Duration::from_millis(250))?;
//!
//! // A swapped factor and jitter is caught by name:
//! let err = Exponential::builder().factor(0.1).jitter(2.0).build().unwrap_err();
//! assert_eq!(err.to_string(), "factor must be at least 1, got 0.1");
//! # let _ = (article, gentle, every_250_ms);
//! # Ok::<(), backoff_layer::ConfigError>(())
//! ```
//!
//! No strategy overflows or panics at any retry number (`u32::MAX` included).
//!
//! # Randomness
//!
//! A strategy draws from the generator it is given. The retry layer gives each request its own
//! generator, seeded from a shared [`Seeds`] source, so that the jitter of two requests is
//! independent (which is the whole point of jitter). Tests inject [`Seeds::from_seed`] to make
//! the seeds, and therefore every delay, reproducible.
//!
//! # Computing a delay sequence without a service
//!
//! [`delays`] (or [`Backoff::delays`]) turns a strategy and a generator into the infinite
//! sequence of delays a request would see, for plots and simulations:
//!
//! ```
//! use std::time::Duration;
//! use backoff_layer::backoff::{Backoff, Exponential, Fixed, Seeds};
//!
//! let article = Exponential::new();
//! let first: Vec<Duration> = article.delays(Seeds::from_seed(7).rng()).take(5).collect();
//! assert_eq!(first.len(), 5);
//!
//! let fixed = Fixed::new(); // 100 ms
//! assert!(fixed.delays(Seeds::from_seed(7).rng()).take(3).all(|d| d == Duration::from_millis(100)));
//! ```
//!
//! # Writing your own
//!
//! ```
//! use std::time::Duration;
//! use backoff_layer::backoff::Backoff;
//! use rand::RngCore;
//!
//! /// Linear backoff: 1 s, 2 s, 3 s, ... at most 10 s.
//! #[derive(Debug)]
//! struct Linear;
//!
//! impl Backoff for Linear {
//!     fn next_delay(&self, retry: u32, _previous: Option<Duration>, _rng: &mut dyn RngCore) -> Duration {
//!         Duration::from_secs(u64::from(retry) + 1).min(self.max_delay())
//!     }
//!     fn max_delay(&self) -> Duration {
//!         Duration::from_secs(10)
//!     }
//! }
//! ```

mod decorrelated;
mod ethernet;
mod exponential;
mod fixed;
mod jitter;
mod rules;
mod seeds;
mod strategy;
#[cfg(test)]
mod tests;

pub use decorrelated::{Decorrelated, DecorrelatedBuilder};
pub use ethernet::Ethernet;
pub use exponential::{Exponential, ExponentialBuilder};
pub use fixed::Fixed;
pub use jitter::{EqualJitter, EqualJitterBuilder, FullJitter, FullJitterBuilder};
pub use seeds::Seeds;
pub use strategy::{Backoff, Delays, delays};
