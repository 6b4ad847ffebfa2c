//! The demo backend: the article's and the paper's latency models behind the full overload stack.

pub mod app;
pub mod downstream;
pub mod model;
