//! ratelimit-layer's integration tests, one test binary: each file of this directory is a
//! module (`cargo test -p ratelimit-layer --test suite layer::` runs one file's tests), so the
//! layer, tokio, axum and tonic are compiled and linked once for all of them instead of once
//! per file. The tests here run under paused time or a fake clock, or against their own
//! server on a free port of 127.0.0.1; each installs its metrics recorder and log capture for
//! its own thread only, so the files' tests run side by side as safely as one file's did.
//!
//! Binaries of their own, beside this one: `no_alloc.rs` (a counting global allocator, no
//! harness threads), `memory.rs` (a flood of a million keys, which would take a core from
//! the tests beside it), `readme_setups.rs` (four seconds of real traffic from 71 clients,
//! whose rates the tests count), and the Redis tests (`redis*.rs`: real `redis-server`
//! instances; one installs a global recorder, one the process's rustls provider).

#[path = "../support/mod.rs"]
mod support;

mod adaptive;
mod adaptive_bounds;
mod adaptive_criticality;
mod adaptive_held;
mod adaptive_safety;
mod behind_a_balancer;
mod criticality;
mod decided_whole;
mod in_axum;
mod in_tonic;
mod layer;
mod limits_layer;
mod live_limits;
mod peer_addr;
mod properties;
mod traces;
