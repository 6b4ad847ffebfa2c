//! Cheap server-side rejection above a rate, as a Tower layer.
//!
//! This crate is being built and exports nothing yet. See the workspace README for the plan.
