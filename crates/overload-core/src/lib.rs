//! Infrastructure shared by the layers of [tower-overload]: `overload-signal`,
//! `backoff-layer` and `ratelimit-layer`.
//!
//! Nothing here is about the wire: the protocol (header names, the attempt counter, the stop
//! signal) lives in `overload-signal`. This crate holds what the layers are built on, apart
//! from it, so that a change to either is not a change to the other:
//!
//! - [`clock`]: the one clock abstraction. Layer code reads time only through
//!   [`clock::Clock`]: [`clock::TokioClock`] by default, which follows tokio's paused time
//!   in tests; [`clock::CoarseClock`] where a clock read is most of a request's cost;
//!   `clock::FakeClock` (feature `test-util`) for tests without a runtime; and the time of
//!   day a deadline on the wire needs, through [`clock::WallClock`].
//! - [`window`]: the one time-slotted lock-free window ("count per slot over the last N
//!   seconds"), under the attempt histogram, the retry budget and the adaptive limit's
//!   sampler, model-checked with loom.
//! - [`ConfigError`]: the configuration error of every builder of the three layers, which
//!   names the setting, the value and the rule.
//! - [`telemetry`]: the layers' names, their metric handles (registered on the first
//!   request and kept), their state changes logged once, and a ticker that keeps gauges true
//!   while no request comes.
//! - [`sync`]: the atomics of the lock-free code (loom's under `cfg(loom)`).
//!
//! Users of the layers rarely name this crate: each layer crate re-exports what its API
//! takes (`ConfigError`, the `clock` module).
//!
//! [tower-overload]: https://github.com/retry-storm/tower-overload
//!
//! # Example
//!
//! A retry budget in miniature on the window: deposits in counter 0, withdrawals taken
//! only while they stay under half the deposits of the last 10 seconds.
//!
//! ```
//! use overload_core::window::Window;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), overload_core::ConfigError> {
//! let window: Window<1> = Window::builder().build()?;
//! let slot = window.slot_now();
//! window.add(slot, 0, 4);
//! let allow = |c: &overload_core::window::Counts<1>| (c.taken() + 1) * 2 <= c.added(0);
//! assert!(window.try_take(slot, allow));
//! assert!(window.try_take(slot, allow));
//! assert!(!window.try_take(slot, allow));
//! # Ok(())
//! # }
//! ```
//!
//! # Feature flags
//!
//! - `test-util` (off by default): `clock::FakeClock`, a clock that moves only when told
//!   to, for tests of code that takes a [`clock::Clock`].
//!
//! Model tests of the lock-free code run under [loom](https://docs.rs/loom) with
//! `RUSTFLAGS="--cfg loom"`; that `cfg` is not a feature and changes nothing in a normal
//! build.

pub mod clock;
mod config_error;
mod macros;
pub mod sync;
pub mod telemetry;
pub mod window;

pub use config_error::{ConfigError, ConfigErrorKind};

// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}
