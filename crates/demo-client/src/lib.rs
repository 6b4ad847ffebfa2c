//! The demo load generator and the pause-and-resume outage experiment.
//!
//! This crate is being built and exports nothing yet. See the workspace README for the plan.
