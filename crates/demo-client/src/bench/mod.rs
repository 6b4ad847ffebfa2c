//! The goodput benchmark (`demo-client bench`): an open-loop load ([`open_loop`]) of HTTP
//! requests ([`send`]), what each request ended as ([`outcome`]), the systems under test
//! started fresh for each point ([`system`]), a point's figures and the order of the points
//! ([`runner`]), and the table and CSV ([`table`]), with the medians of several rounds
//! ([`medians`]); recovery after a step of the load
//! ([`step`], `demo-client bench --step`) and its table, CSVs and plot ([`step_table`]).
//!
//! An open loop sends requests at instants fixed in advance, whatever the answers: a system
//! that answers slowly cannot slow the offered load down, as it does a closed loop of
//! clients that each wait for their answer (the demo's `run`). Latencies are measured from
//! the instant a request was *scheduled*, so a generator that falls behind charges its own
//! delay to the point instead of hiding it (coordinated omission).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use demo_client::bench::open_loop::{Arrivals, Schedule, run};
//! use demo_client::bench::outcome::Outcome;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 100 requests a second for 2 seconds, at most 64 in flight.
//! let schedule = Schedule::new(100.0, Arrivals::Fixed)?;
//! let point = run(&schedule, Duration::from_secs(2), 64, || async {
//!     tokio::time::sleep(Duration::from_millis(20)).await;
//!     Outcome::Served
//! })
//! .await;
//! assert_eq!(point.served(), 200);
//! assert_eq!(point.served_quantile(0.99), Some(Duration::from_millis(20)));
//! # Ok(())
//! # }
//! ```

pub mod cpu;
pub mod figures;
pub mod limits;
pub mod medians;
pub mod open_loop;
pub mod outcome;
pub mod runner;
pub mod send;
pub mod settle;
pub mod step;
pub mod step_table;
pub mod system;
pub mod table;
