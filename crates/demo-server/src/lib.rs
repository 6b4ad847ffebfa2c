//! The demo backend: the article's and the paper's latency models behind the full overload stack.
//!
//! This crate is being built and exports nothing yet. See the workspace README for the plan.
