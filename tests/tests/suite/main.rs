//! Cross-crate tests that are quick and have no real-time window to hold, one test binary:
//! each file of this directory is a module (`cargo test -p integration-tests --test suite
//! readme_stack::` runs one file's tests), so the workspace's crates, tokio, axum, hyper and
//! tonic are linked once for all of them instead of once per file. Each test here runs in
//! virtual time, with a clock that never moves, or against its own servers on free ports of
//! 127.0.0.1 with no timing tighter than a second, and none installs anything process-wide,
//! so the files' tests run side by side as safely as one file's did.
//!
//! The other files of `tests/` stay binaries of their own: they run real traffic for seconds
//! and count rates, hold deadlines of a few hundred milliseconds, start other programs
//! (Redis, Envoy, HAProxy, Prometheus, `demo-server`), or install a process-wide recorder;
//! run side by side, they would disturb each other's measurements.

mod adaptive_vs_anchors;
mod client_edges;
mod deadline_envoy;
mod foreign_stop_signals;
mod outage_adaptive;
mod outage_deadline;
mod overload_paths;
mod protocol_over_the_wire;
mod readme_stack;
mod server_protection;
