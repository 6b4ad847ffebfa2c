//! The spike experiment (`demo-client spike`): steady `critical` traffic at half the server's
//! capacity, then, after a warm-up, a `sheddable` spike at ten times the capacity; what each
//! level's requests became during the spike, with and without their level on the wire.
//!
//! Two open-loop streams ([`drive`]) go to one server, or to the top of three chained
//! `demo-server` processes ([`tiers`]): `critical` at [`SpikePlan::steady`] for the whole
//! run, `sheddable` at [`SpikePlan::spike_rate`] from the end of the warm-up for
//! [`SpikePlan::spike`]. Each row ([`RowSpec`]) is one server stack, one topology and one
//! [`Awareness`]: **class-blind** sends no `X-Request-Criticality`, so every request is the
//! server's default level (`critical`) and the limits cannot tell the spike from the steady
//! traffic, exactly as a server before criticality; **criticality-aware** sends each
//! request's level. The generator knows which stream each request belongs to in both rows,
//! so both give figures per level ([`figures`]): the success rate and the p99 of the served
//! requests during the spike, and the p99 of the `critical` requests before it (unloaded).
//! [`table`] writes the CSV, the Markdown table and the plot; [`simulated`] runs a one-tier
//! row in virtual time, in process.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use demo_client::bench::open_loop::Arrivals;
//! use demo_client::bench::outcome::{Attempt, Outcome};
//! use demo_client::spike::{SpikePlan, drive};
//! use overload_signal::protocol::Criticality;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A server of 20 req/s that serves critical requests and sheds the rest.
//! let plan = SpikePlan::new(20.0)?
//!     .warmup(Duration::from_secs(2))?
//!     .spike(Duration::from_secs(1))?
//!     .spacing(Arrivals::Fixed);
//! let samples = drive(&plan, |level, _scheduled| async move {
//!     if level == Criticality::Critical {
//!         Attempt::Ended(Outcome::Served)
//!     } else {
//!         Attempt::Ended(Outcome::Rejected)
//!     }
//! })
//! .await;
//! // 10 req/s critical for 3 s, 200 req/s sheddable for 1 s.
//! assert_eq!(samples.len(), 30 + 200);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use overload_signal::protocol::Criticality;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::bench::open_loop::{Arrivals, Schedule};
use crate::bench::outcome::{Attempt, Outcome};
use crate::bench::system::System;

pub mod figures;
pub mod simulated;
pub mod table;
pub mod tiers;

/// The level of the steady traffic: `critical`, the protocol's default for serving traffic.
pub const STEADY_LEVEL: Criticality = Criticality::Critical;

/// The level of the spike: `sheddable`.
pub const SPIKE_LEVEL: Criticality = Criticality::Sheddable;

/// The part of the warm-up the unloaded p99 leaves out: its first second, while the
/// generator opens its connections.
pub const UNLOADED_SKIP: Duration = Duration::from_secs(1);

/// A spike plan that cannot work; the message names the setting, its value and the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidSpikePlan(String);

impl fmt::Display for InvalidSpikePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidSpikePlan {}

/// The figures of a spike run: the server's capacity, the two rates as shares of it, and
/// the phases.
#[derive(Clone, Debug, PartialEq)]
pub struct SpikePlan {
    capacity: f64,
    steady_share: f64,
    spike_factor: f64,
    warmup: Duration,
    spike: Duration,
    timeout: Duration,
    max_in_flight: usize,
    arrivals: Arrivals,
}

fn positive(what: &str, value: f64) -> Result<f64, InvalidSpikePlan> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(InvalidSpikePlan(format!(
            "{what} must be a finite number above zero, got {value}"
        )))
    }
}

impl SpikePlan {
    /// The issue's plan against a server of `capacity` requests a second: `critical` at half
    /// of it throughout, a `sheddable` spike at ten times it for 30 s after a 10 s warm-up;
    /// each request given 2 s from its scheduled instant; at most 8 192 requests in flight;
    /// each stream's arrivals a Poisson process (seed 1).
    ///
    /// # Errors
    ///
    /// When `capacity` is not a finite number above zero.
    pub fn new(capacity: f64) -> Result<Self, InvalidSpikePlan> {
        Ok(Self {
            capacity: positive("the capacity", capacity)?,
            steady_share: 0.5,
            spike_factor: 10.0,
            warmup: Duration::from_secs(10),
            spike: Duration::from_secs(30),
            timeout: Duration::from_secs(2),
            max_in_flight: 8192,
            arrivals: Arrivals::Poisson { seed: 1 },
        })
    }

    /// How each stream's arrivals are spaced. Default: Poisson processes drawn from seed 1
    /// (the spike's stream from the next seed). Evenly spaced streams lock in phase with a
    /// token bucket's refills (at 2 000 and 100 req/s every `critical` arrival comes with
    /// `sheddable` ones at the same instant, just after a token went to them), which skews
    /// the class-blind figures; Poisson arrivals share the tokens by chance, as real
    /// clients do.
    #[must_use]
    pub fn spacing(mut self, arrivals: Arrivals) -> Self {
        self.arrivals = arrivals;
        self
    }

    /// The steady `critical` rate as a share of the capacity. Default 0.5.
    ///
    /// # Errors
    ///
    /// When `share` is not a finite number above zero.
    pub fn steady_share(mut self, share: f64) -> Result<Self, InvalidSpikePlan> {
        self.steady_share = positive("the steady share", share)?;
        Ok(self)
    }

    /// The `sheddable` spike's rate as a multiple of the capacity. Default 10.
    ///
    /// # Errors
    ///
    /// When `factor` is not a finite number above zero.
    pub fn spike_factor(mut self, factor: f64) -> Result<Self, InvalidSpikePlan> {
        self.spike_factor = positive("the spike factor", factor)?;
        Ok(self)
    }

    /// How long the steady traffic runs alone before the spike. Default 10 s.
    ///
    /// # Errors
    ///
    /// When it is under 2 s: the unloaded p99 leaves out the first second
    /// ([`UNLOADED_SKIP`]) and needs one more.
    pub fn warmup(mut self, warmup: Duration) -> Result<Self, InvalidSpikePlan> {
        if warmup < UNLOADED_SKIP + Duration::from_secs(1) {
            return Err(InvalidSpikePlan(format!(
                "the warm-up must last at least 2s, got {warmup:?}"
            )));
        }
        self.warmup = warmup;
        Ok(self)
    }

    /// How long the spike lasts. Default 30 s.
    ///
    /// # Errors
    ///
    /// When it is under 1 s.
    pub fn spike(mut self, spike: Duration) -> Result<Self, InvalidSpikePlan> {
        if spike < Duration::from_secs(1) {
            return Err(InvalidSpikePlan(format!(
                "the spike must last at least 1s, got {spike:?}"
            )));
        }
        self.spike = spike;
        Ok(self)
    }

    /// Each request's time from its scheduled instant; unanswered by then, it failed.
    /// Default 2 s.
    ///
    /// # Errors
    ///
    /// When it is zero.
    pub fn timeout(mut self, timeout: Duration) -> Result<Self, InvalidSpikePlan> {
        if timeout.is_zero() {
            return Err(InvalidSpikePlan(
                "the timeout must be above zero".to_owned(),
            ));
        }
        self.timeout = timeout;
        Ok(self)
    }

    /// The generator's cap on requests in flight: an arrival over it is not sent and
    /// counts as dropped. Default 8 192.
    ///
    /// # Errors
    ///
    /// When it is zero.
    pub fn max_in_flight(mut self, max: usize) -> Result<Self, InvalidSpikePlan> {
        if max == 0 {
            return Err(InvalidSpikePlan(
                "the in-flight cap must be above zero".to_owned(),
            ));
        }
        self.max_in_flight = max;
        Ok(self)
    }

    /// The server's capacity, requests a second.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The steady `critical` rate, requests a second.
    pub fn steady(&self) -> f64 {
        self.capacity * self.steady_share
    }

    /// The `sheddable` rate during the spike, requests a second.
    pub fn spike_rate(&self) -> f64 {
        self.capacity * self.spike_factor
    }

    /// The warm-up before the spike.
    pub fn warmup_len(&self) -> Duration {
        self.warmup
    }

    /// The spike's length.
    pub fn spike_len(&self) -> Duration {
        self.spike
    }

    /// Each request's timeout.
    pub fn timeout_len(&self) -> Duration {
        self.timeout
    }

    /// The whole run: the warm-up and the spike.
    pub fn total(&self) -> Duration {
        self.warmup + self.spike
    }

    /// Every arrival of the run, in order: its offset from the start and its level.
    pub fn arrivals(&self) -> Vec<(Duration, Criticality)> {
        let spike_spacing = match self.arrivals {
            Arrivals::Fixed => Arrivals::Fixed,
            Arrivals::Poisson { seed } => Arrivals::Poisson {
                seed: seed.wrapping_add(1),
            },
        };
        let steady = Schedule::new(self.steady(), self.arrivals).expect("validated rate");
        let spike = Schedule::new(self.spike_rate(), spike_spacing).expect("validated rate");
        let mut all: Vec<_> = steady
            .offsets(self.total())
            .map(|at| (at, STEADY_LEVEL))
            .chain(
                spike
                    .offsets(self.spike)
                    .map(|at| (self.warmup + at, SPIKE_LEVEL)),
            )
            .collect();
        // NOTE: stable, so at one instant the steady arrival goes first, in every run.
        all.sort_by_key(|&(at, _)| at);
        all
    }
}

/// Whether the generator puts each request's level on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Awareness {
    /// No `X-Request-Criticality`: every request is the server's default level,
    /// `critical`, as before the servers knew levels.
    ClassBlind,
    /// Each request carries its level in `X-Request-Criticality`.
    Aware,
}

impl Awareness {
    /// Both, in the order of the table.
    pub const ALL: [Awareness; 2] = [Awareness::ClassBlind, Awareness::Aware];

    /// The name in the table and the CSV.
    pub const fn name(self) -> &'static str {
        match self {
            Awareness::ClassBlind => "class-blind",
            Awareness::Aware => "criticality-aware",
        }
    }
}

impl fmt::Display for Awareness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One row: the server stack, how many tiers, and whether the levels are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowSpec {
    /// The server stack of every tier: [`System::Full`] or [`System::Adaptive`].
    pub system: System,
    /// Servers chained: 1, or 3 (the client calls the top one).
    pub tiers: usize,
    /// Whether the generator sends the levels.
    pub awareness: Awareness,
}

impl RowSpec {
    /// Every row for `systems` and `tiers`, class-blind before aware for each.
    pub fn all(systems: &[System], tiers: &[usize]) -> Vec<RowSpec> {
        let mut rows = Vec::new();
        for &tiers in tiers {
            for &system in systems {
                for awareness in Awareness::ALL {
                    rows.push(RowSpec {
                        system,
                        tiers,
                        awareness,
                    });
                }
            }
        }
        rows
    }

    /// The row's label, such as `full, 3 tiers, class-blind`.
    pub fn label(&self) -> String {
        let tiers = if self.tiers == 1 {
            "1 tier".to_owned()
        } else {
            format!("{} tiers", self.tiers)
        };
        format!("{}, {tiers}, {}", self.system, self.awareness)
    }
}

/// What became of one arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The stream it belongs to (sent on the wire only when the row is aware).
    pub level: Criticality,
    /// Its scheduled instant, from the start of the run.
    pub offset: Duration,
    /// How it ended; `None` when the generator did not send it (its in-flight cap was
    /// full, or it had no descriptor or port left).
    pub outcome: Option<Outcome>,
    /// From its scheduled instant to its end.
    pub latency: Duration,
    /// From its scheduled instant to the first poll of its task, when the request really
    /// started: the generator's own delay (zero for an arrival not sent).
    pub lag: Duration,
}

/// Sends every arrival of `plan` ([`SpikePlan::arrivals`]) at its instant, never waiting for
/// earlier answers: `send(level, scheduled)` in a task of its own, at most
/// [`SpikePlan::max_in_flight`] at once (an arrival over the cap is not sent). Returns, once
/// every request has ended, one [`Sample`] per arrival in the order of the schedule.
///
/// Bound the time each request may take inside `send` (the real sender gives each the
/// plan's timeout from its scheduled instant).
pub async fn drive<F, Fut>(plan: &SpikePlan, mut send: F) -> Vec<Sample>
where
    F: FnMut(Criticality, Instant) -> Fut,
    Fut: Future<Output = Attempt> + Send + 'static,
{
    let arrivals = plan.arrivals();
    let samples: Arc<Mutex<Vec<Option<Sample>>>> = Arc::new(Mutex::new(vec![None; arrivals.len()]));
    let in_flight = Arc::new(Semaphore::new(plan.max_in_flight));
    let mut tasks = JoinSet::new();
    let start = Instant::now();
    for (index, (offset, level)) in arrivals.into_iter().enumerate() {
        let scheduled = start + offset;
        tokio::time::sleep_until(scheduled).await;
        let not_sent = Sample {
            level,
            offset,
            outcome: None,
            latency: Duration::ZERO,
            lag: Duration::ZERO,
        };
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            samples.lock().expect("not poisoned")[index] = Some(not_sent);
            continue;
        };
        let request = send(level, scheduled);
        let samples = Arc::clone(&samples);
        tasks.spawn(async move {
            // NOTE: measured at the task's first poll: with every core busy a runtime can
            // hold a spawned task for milliseconds, and that delay is the generator's.
            let lag = Instant::now().saturating_duration_since(scheduled);
            let attempt = request.await;
            let latency = Instant::now().saturating_duration_since(scheduled);
            drop(permit);
            let sample = match attempt {
                Attempt::Ended(outcome) => Sample {
                    outcome: Some(outcome),
                    latency,
                    lag,
                    ..not_sent
                },
                Attempt::NotSent => not_sent,
            };
            samples.lock().expect("not poisoned")[index] = Some(sample);
        });
        // NOTE: reap finished tasks as we go: a spike sends tens of thousands.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let samples = std::mem::take(&mut *samples.lock().expect("not poisoned"));
    samples
        .into_iter()
        .map(|sample| sample.expect("every arrival ends in a sample"))
        .collect()
}

#[cfg(test)]
mod tests;
