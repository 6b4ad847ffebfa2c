//! The pieces of the demo client stack, one concern per module.
//!
//! From the application down, one attempt goes through:
//!
//! ```text
//! retry (strategy) ─► Record ─► tower Timeout (per attempt) ─► Collect ─► transport
//! ```
//!
//! - [`naive`]: [`NaiveRetry`], the retry layer of the article's clients (`fixed` and
//!   `exponential`): every failure retried after the strategy's wait, without end, no
//!   attempt header, no regard for the stop signal; `full` uses `backoff-layer`'s instead;
//! - [`attempts`]: [`Record`] counts every attempt, retry, rejection, stop signal, timeout
//!   and refused connection into a [`Recorder`](crate::record::Recorder); [`Outcome`]
//!   classifies how a whole request ended;
//! - [`transport`]: the timeout bounds one attempt, body included, because [`Collect`] sits
//!   under it and reads the whole body (up to a cap) before the attempt counts as answered;
//!   the transport is a hyper-util legacy client ([`http_transport`]);
//! - [`loopback`]: in the simulation, the transport is [`Loopback`] instead, an in-process
//!   hop to a server that can be stopped like a process ([`Gate`]) and that keeps working on a
//!   request after its client gave up, or not ([`Abandoned`]);
//! - [`budget`]: [`CountingBudget`] wraps a retry budget to count its refusals;
//! - `reqwest_transport` (the `reqwest` feature): the same stack over a `reqwest::Client`,
//!   a peer of [`http_transport`] for the experiment's rows through reqwest; and
//!   `reqwest_default_transport`, a `reqwest::Client` retrying with reqwest's own policy.

pub mod attempts;
pub mod budget;
pub mod loopback;
pub mod naive;
#[cfg(feature = "reqwest")]
pub mod reqwest_transport;
pub mod transport;

pub use attempts::{
    AttemptCounter, Outcome, Record, RecordFuture, RecordLayer, is_refused, is_timeout,
};
pub use budget::CountingBudget;
pub use loopback::{Abandoned, Gate, Loopback, LoopbackFuture};
pub use naive::{CarriedDelay, NaiveRetry, NaiveRetryFuture, NaiveRetryLayer, ThinkTime};
#[cfg(feature = "reqwest")]
pub use reqwest_transport::{ReqwestDefault, reqwest_default_transport, reqwest_transport};
pub use transport::{
    BodyTooLong, Collect, CollectFuture, CollectLayer, DemoBody, HttpTransport, TransportBody,
    http_transport,
};
