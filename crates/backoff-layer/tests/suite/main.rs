//! backoff-layer's integration tests, one test binary: each file of this directory is a
//! module (`cargo test -p backoff-layer --test suite retry::` runs one file's tests), so the
//! layer, tokio and hyper are compiled and linked once for all of them instead of once per
//! file. Every test here runs on its own runtime under paused time, or (`e2e`) against its
//! own server on a free port of 127.0.0.1, so the files' tests run side by side as safely as
//! one file's did.
//!
//! `metrics.rs` stays a binary of its own: it installs a process-wide metrics recorder, which
//! would also count what the tests here record.

#[path = "../support/mod.rs"]
mod support;

mod criticality;
mod deadline;
mod default_deadline;
mod e2e;
mod edges;
mod outcomes;
mod retry;
mod retry_multiplication;
mod telemetry;
mod throttle;
mod throttle_levels;
mod traces;
