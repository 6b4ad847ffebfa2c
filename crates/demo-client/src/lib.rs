//! The demo load generator and the pause-and-resume outage experiment.
//!
//! The experiment (from the article *Exponential backoff, or how not to crash a server*):
//! many clients send requests to a server; the server is paused for a while (SIGSTOP) and
//! resumed (SIGCONT). The article's clients, which retry every failure without end and know
//! nothing of the overload protocol, keep it down after resume when they retry at a fixed
//! interval, and let it up slowly when they back off exponentially; clients with this
//! workspace's full stack (backoff with jitter, a retry budget, the attempt header, and
//! respect for the stop signal) let it up at once.
//!
//! - [`cli`]: the command line of the `demo-client` binary;
//! - [`duration`]: command-line durations such as `500ms`, `2s`, `1m`;
//! - [`strategy`] and [`stack`]: the retry strategies compared, and their client stacks;
//! - [`client`]: the stack's pieces (the article's retry layer, attempt recording, body
//!   collection, the simulation's in-process hop and listen queue, a counting retry budget);
//! - [`load`]: the load generator;
//! - [`experiment`], [`drive`], [`scenario`], [`simulate`], [`server`], [`process`]: the
//!   outage experiment, against real processes or in virtual time;
//! - [`fleet`]: the same experiment in the paper's topology, three servers behind HAProxy;
//! - [`envoy`]: an Envoy of our own in front of servers, with a mesh's retry policy;
//! - [`record`]: the per-second recorder;
//! - [`report`]: the figures of a run (baseline, recovery time, amplification, latency);
//! - [`output`]: the CSV and the SVG plots;
//! - [`plot`]: the dependency-free SVG plotter;
//! - [`bench`](mod@bench): the goodput benchmark's open-loop load and outcome classification;
//! - [`spike`]: the spike experiment, `critical` traffic through a `sheddable` spike, with
//!   and without the levels on the wire, against one server or three chained.
//!
//! # Feature flags
//!
//! This crate has no optional features.

pub mod bench;
pub mod cli;
pub mod client;
pub mod drive;
pub mod envoy;
pub mod experiment;
pub mod fleet;
pub mod load;
pub mod output;
pub mod plot;
pub mod process;
pub mod record;
pub mod report;
pub mod scenario;
pub mod server;
pub mod simulate;
pub mod spike;
pub mod stack;
pub mod strategy;

// NOTE: one parser for both command lines; it lives in demo-server, which this crate
// already depends on.
pub use demo_server::duration;
